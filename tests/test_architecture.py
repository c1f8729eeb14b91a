"""The house rules, checked on the source: no import circles, no private names taken across modules,
every package listed for the wheel, one module per CLI command in reasonrl/stages/."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "reasonrl"
SETUP = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
# Packages kept outside reasonrl/ (stages/ as reasonrl.recipes, data/ as reasonrl.bundled).
MAPPED = {pkg: ROOT / folder for pkg, folder in SETUP.get("package-dir", {}).items()}


def _module_name(path: Path) -> str:
    for pkg, folder in MAPPED.items():
        if path.is_relative_to(folder):
            parts = [*pkg.split("."), *path.relative_to(folder).with_suffix("").parts]
            break
    else:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> list[Path]:
    return [*PKG.rglob("*.py"), *(p for folder in MAPPED.values() for p in folder.rglob("*.py"))]


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _sources()}


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for each import in ``path``, wherever it stands: at
    module level, or inside a function, a class or an ``if`` (an ast walk of every node)."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def test_no_import_cycles() -> None:
    """No circle in the graph of every import, function-level ones included (a lazy import inside
    a function still ties the two modules together)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for mod, names in _imports(path):
            if not mod.startswith("reasonrl"):
                continue
            for n in names:  # `from reasonrl import algos` imports the submodule
                if f"{mod}.{n}" in mods:
                    deps.add(f"{mod}.{n}")
            if mod in mods:
                deps.add(mod)
        # importing a.b.c runs a/__init__ and a/b/__init__ first
        for d in list(deps):
            parts = d.split(".")
            deps.update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in mods)
        graph[name] = deps - {name}
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            # a package's __init__ re-exporting its own submodules is not a circle
            if len(comp) > 1 and not all(c == min(comp, key=len) or c.startswith(min(comp, key=len) + ".") for c in comp):
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"import circles: {cycles}"


def test_no_private_names_across_modules() -> None:
    bad = []
    for name, path in _modules().items():
        for mod, names in _imports(path):
            if mod.startswith("reasonrl") and mod != name:
                bad += [f"{name} takes {mod}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_every_package_ships() -> None:
    tree = {_module_name(p.parent / "__init__.py") for p in _sources()}
    assert tree == set(SETUP["packages"]), "pyproject [tool.setuptools] packages must list every package (reasonrl/ and package-dir)"
    assert all((p.parent / "__init__.py").is_file() for p in _sources()), "every folder of a package needs an __init__.py"


def test_one_stage_module_per_command() -> None:
    from clihelp import run_cli

    run_cli("--help")  # registers the commands
    from reasonrl import cli

    commands = {c.name for c in cli.app.registered_commands if not c.hidden} | {g.name for g in cli.app.registered_groups}
    modules = {p.stem.replace("_", "-") for p in (PKG / "stages").glob("*.py")} - {"--init--", "options"}
    assert commands == modules, (commands, modules)
