"""The README and docs/ pages: every relative link and #anchor resolves, the front page stays short and
links every page, and every documented `reasonrl` command names options its stage has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from clihelp import run_cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
FILES = [README, *PAGES]

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def _prose(text: str) -> str:
    """The text a link can live in: fenced blocks and inline code removed."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def github_slug(heading: str) -> str:
    """GitHub's heading anchor: the rendered text lowercased, every character but letters, digits,
    '_', '-' and ' ' dropped, each space made '-' (duplicates get -1, -2, ...: see `anchors`)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = _INLINE_CODE.sub(lambda m: m.group(2), text)  # code renders as its content
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"(\*\*|__|\*|_(?=\W)|(?<=\W)_|~~)", "", text)  # emphasis markers
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in _HEADING.finditer(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = github_slug(m.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[str]:
    return _LINK.findall(_prose(path.read_text(encoding="utf-8")))


def broken_links(paths: list[Path]) -> list[str]:
    """'file: target (why)' for each relative link whose file is missing or whose #anchor no heading has."""
    problems = []
    for path in paths:
        for target in links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                problems.append(f"{path.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{path.name}: {target} (no heading #{anchor} in {dest.name})")
    return problems


def test_github_slugs() -> None:
    assert github_slug("`--algo`: a table, not eight trainers") == "--algo-a-table-not-eight-trainers"
    assert github_slug("Evaluating on DAPO's AIME file") == "evaluating-on-dapos-aime-file"
    assert github_slug("Integer answers (DAPO §3.5)") == "integer-answers-dapo-35"
    assert github_slug("Metrics (`metrics.jsonl`, one line per step)") == "metrics-metricsjsonl-one-line-per-step"
    assert github_slug("**Bold** and [a link](x.md)") == "bold-and-a-link"


def test_the_checker_finds_broken_links(tmp_path) -> None:
    (tmp_path / "a.md").write_text("# A page\n\n## Same\n\n## Same\n\n[ok](b.md#b-title) [ok](#same-1) [ok](#a-page) [http](https://x.org/#y)\n"
                                   "[gone](missing.md) [bad](b.md#nope) [bad](#same-2) `[code](missing.md)`\n\n```\n[fenced](missing.md)\n```\n")
    (tmp_path / "b.md").write_text("# B title\n\n![img](missing.png)\n")
    assert sorted(broken_links([tmp_path / "a.md", tmp_path / "b.md"])) == [
        "a.md: #same-2 (no heading #same-2 in a.md)",
        "a.md: b.md#nope (no heading #nope in b.md)",
        "a.md: missing.md (no such file)",
        "b.md: missing.png (no such file)",
    ]


def test_every_link_and_anchor_resolves() -> None:
    assert PAGES, "docs/*.md is empty"
    assert broken_links(FILES) == []


def test_the_front_page_is_short_and_links_every_page() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < 200, f"README.md has {lines} lines: move reference material into docs/"
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(README) if t.partition("#")[0]}
    unlinked = [p.relative_to(ROOT).as_posix() for p in PAGES if p.resolve() not in linked]
    assert unlinked == [], f"README.md does not link {unlinked}"


def _commands() -> list[tuple[str, list[str]]]:
    """(where, args after `reasonrl`) for each command in a ```bash block or an inline code span."""
    out = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        spans = []
        for m in _FENCE.finditer(text):
            if m.group(0).startswith(("```bash", "```sh")):
                spans += m.group(0).replace("\\\n", " ").splitlines()[1:-1]
        spans += [m.group(2) for m in _INLINE_CODE.finditer(_FENCE.sub("", text))]
        for span in spans:
            try:
                words = shlex.split(span, comments=True)
            except ValueError:
                continue
            for i, w in enumerate(words):
                is_cli = w == "reasonrl" or w.endswith("/bin/reasonrl")
                is_module = w == "reasonrl.cli" and i > 0 and words[i - 1] in ("-m", "--module")
                if (is_cli or is_module) and i + 1 < len(words):
                    args = []
                    for a in words[i + 1:]:
                        if a in ("&&", "||", "|", ";", ">", ">>"):
                            break
                        args.append(a)
                    out.append((f"{path.name}: {span.strip()}", args))
                    break
    return out


COMMANDS = _commands()


def test_commands_are_found() -> None:
    stages = {args[0] for _, args in COMMANDS}
    assert {"prepare-data", "pretrain-value", "rollout", "train", "eval", "report", "main-job"} <= stages


@pytest.mark.parametrize("where,args", COMMANDS, ids=[w[:90] for w, _ in COMMANDS])
def test_documented_command_parses(where: str, args: list[str]) -> None:
    """The stage exists and knows every option given (`--set key=value` as `--key value`); its recipe exists.

    `--help` goes right after the command, so click parses every option (an unknown one is an
    error) and then prints the help instead of running the stage."""
    head = args[:2] if args[0] == "eval" else args[:1]
    rest: list[str] = []
    train: list[str] = []  # `ablate --set key=value`: a train key (checked by `train --help`)
    i = len(head)
    while i < len(args):
        a, nxt = args[i], (args[i + 1] if i + 1 < len(args) else "")
        if a == "--set" and "=" in nxt:
            key, value = nxt.split("=", 1)
            (train if head == ["ablate"] else rest).extend(["--" + key.split(".")[-1].replace("_", "-"), value])  # algo.eps_high=0.3 -> --eps-high 0.3
            i += 2
            continue
        if a in ("--config", "-c"):
            assert (ROOT / nxt).is_file(), f"{where}: no recipe {nxt}"
        rest.append(a)
        i += 1
    result = run_cli(*head, "--help", *rest)
    assert result.exit_code == 0 and "No such" not in result.output, f"{where}\n{result.output}"
    if train:
        result = run_cli("train", "--help", *train)
        assert result.exit_code == 0 and "No such" not in result.output, f"{where}\n{result.output}"


def test_the_performance_table_is_the_committed_results() -> None:
    """docs/performance.md's step-against-TRL table is `bench/vs_trl.py --table bench/results`: the
    figures shown are the committed JSONs', every regime measured is shown."""
    import subprocess
    import sys

    table = subprocess.run([sys.executable, str(ROOT / "bench" / "vs_trl.py"), "--table", str(ROOT / "bench" / "results")],
                           capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert len(table.splitlines()) > 2, "bench/results/ holds no <regime>.json"
    assert table in (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")



def _code_map() -> str:
    text = (ROOT / "docs" / "development.md").read_text()
    start = text.index("\n## Code map")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _off_the_map(cmap: str, package: Path) -> tuple[set[str], set[str]]:
    """(modules of ``package`` the map does not name as `dir/module.py`, names on the map that are no module)."""
    modules = {p.relative_to(package).as_posix() for p in package.rglob("*.py") if p.name != "__init__.py"}
    named = {n for n in re.findall(r"`([a-z_/]+\.py)`", cmap) if not n.startswith("tests/")}
    return modules - named, named - modules


def test_the_code_map_names_every_module() -> None:
    """docs/development.md's code map names every module of reasonrl/ (as `package/module.py`), and
    no module that no longer exists: a new module is placed on the map when it lands."""
    missing, extra = _off_the_map(_code_map(), ROOT / "reasonrl")
    assert not missing, f"missing from the code map: {sorted(missing)}"
    assert not extra, f"the code map names modules that do not exist: {sorted(extra)}"


def test_the_code_map_check_finds_a_missing_and_a_stale_module() -> None:
    cmap = _code_map().replace("`train/micro.py`", "the micro-batch planner") + " `train/gone.py`"
    assert _off_the_map(cmap, ROOT / "reasonrl") == ({"train/micro.py"}, {"train/gone.py"})
