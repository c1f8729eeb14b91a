"""A small LaTeX-to-sympy converter for final answers, and the normalisation both parsers share.

Only the answer shapes the integer transformation needs are understood: integers, decimals,
``\\frac`` (also the shorthand ``\\frac43``, ``\\frac 59``, ``\\frac9{19}``), ``\\sqrt`` and
``\\sqrt[n]``, ``\\pi``, ``+ - * / ^``, ``\\cdot``/``\\times``, brackets and implicit products.
Letters raise :class:`VariableError`; anything else raises :class:`LatexError`. The result is an
exact sympy number (sympy canonicalises ``\\sqrt{12}`` to ``2*sqrt(3)`` on construction).

This converter extracts the parts of an answer; the rebuilt answer is then checked against an
independent parse (``latex2sympy2_extended``, installed with math-verify), so a bug here can make
a row be refused, never kept wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy

from reasonrl.answers import braced, strip_answer


class LatexError(ValueError):
    """The answer is not in the subset this converter reads."""


class VariableError(LatexError):
    """The answer contains a letter (a variable, a Greek letter, a word)."""


class FunctionError(LatexError):
    """The answer applies a function this converter does not evaluate (sin, log, binom, ...)."""


class TooLargeError(LatexError):
    """A number too large to be an answer (``2^{4096^{2}}``, a 5000-digit literal)."""


class ComplexValueError(LatexError):
    """The answer is not a real number (the square root of a negative number)."""


# ---------------------------------------------------------------------------------------------
# Normalisation shared by both parsers
# ---------------------------------------------------------------------------------------------

_UNIT_WORD = r"[a-zA-Z]{2,}\.?(?:\s+[a-zA-Z]+\.?){0,2}"
_TRAILING_MARKERS = [
    # (pattern at the end of the answer, marker)
    (re.compile(r"\s*\^\s*\{?\s*\\circ\s*\}?\s*$"), "degrees"),
    (re.compile(r"\s*°\s*$"), "degrees"),
    (re.compile(r"\s*\\?%\s*$"), "percent"),
    (re.compile(r"\s*\\(?:text|mbox|mathrm|textrm)\s*\{\s*~?\s*(?P<u>[^{}]*)\}\s*(?:\^\s*\{?\s*[23]\s*\}?)?\s*$"), "units"),
    (re.compile(r"(?<=[\d}])\s+(?P<u>" + _UNIT_WORD + r")\s*(?:\^\s*\{?\s*[23]\s*\}?)?\s*$"), "units"),
]
_DEGREE_WORDS = re.compile(r"^\s*(?:degrees?|deg)\s*$", re.I)
_PERCENT_WORDS = re.compile(r"^\s*(?:percent|per\s*cent)\s*$", re.I)


@dataclass(frozen=True)
class Normalised:
    """An answer reduced to its mathematical core, with what was removed around it."""

    core: str
    marker: str | None = None  # "degrees", "percent", "units" (units/currency) or None
    unit: str = ""  # the unit text that was removed, when marker == "units"


def _read_arg(s: str, i: int) -> tuple[str, int]:
    """One TeX macro argument starting at ``s[i]``: a braced group or a single token."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise LatexError("missing argument")
    if s[i] == "{":
        group = braced(s, i)
        if group is None:
            raise LatexError("unbalanced braces")
        return group
    if s[i] == "\\":
        m = re.match(r"\\[a-zA-Z]+", s[i:])
        if m:
            return m.group(0), i + len(m.group(0))
        return s[i : i + 2], i + 2
    return s[i], i + 1


def brace_arguments(s: str) -> str:
    """Rewrite ``\\frac43`` / ``\\frac 59`` / ``\\frac{270}7`` / ``\\sqrt2`` with braced arguments."""
    out: list[str] = []
    i = 0
    while i < len(s):
        m = re.match(r"\\(frac|sqrt)(?![a-zA-Z])", s[i:])
        if not m:
            out.append(s[i])
            i += 1
            continue
        name = m.group(1)
        i += len(m.group(0))
        if name == "frac":
            a, i = _read_arg(s, i)
            b, i = _read_arg(s, i)
            out.append("\\frac{" + brace_arguments(a) + "}{" + brace_arguments(b) + "}")
        else:
            index = ""
            j = i
            while j < len(s) and s[j] == " ":
                j += 1
            if j < len(s) and s[j] == "[":
                k = s.find("]", j)
                if k < 0:
                    raise LatexError("unbalanced [")
                index = "[" + s[j + 1 : k].strip() + "]"
                i = k + 1
            a, i = _read_arg(s, i)
            out.append("\\sqrt" + index + "{" + brace_arguments(a) + "}")
    return "".join(out)


def normalise(answer: object) -> Normalised:
    """Reduce a final answer to its core: no ``$``/``\\boxed``, no spacing macros, no trailing unit.

    ``"90^\\circ"`` -> core ``90``, marker ``degrees``; ``"25\\%"`` -> ``25``, ``percent``;
    ``"5\\text{ cm}"`` / ``"\\$36"`` -> ``5`` / ``36``, ``units``; ``"10,\\!080"`` -> ``10080``;
    ``"\\dfrac{1}{2}"`` -> ``\\frac{1}{2}``; ``"1\\frac{4}{5}"`` (a mixed number) -> ``(1+\\frac{4}{5})``.
    """
    if isinstance(answer, bool):
        return Normalised(str(answer))
    if isinstance(answer, float) and answer.is_integer():
        return Normalised(str(int(answer)))
    s = str(answer)
    s = re.sub(r",\\!\s*", ",", s)  # MATH's thousands separator "10,\!080"
    s = strip_answer(s)
    s = s.replace("−", "-").replace("–", "-")
    s = re.sub(r"\\(?:dfrac|tfrac|cfrac)(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\displaystyle|\\textstyle", "", s)
    s = re.sub(r"\\(?:cdot|times)(?![a-zA-Z])", "*", s)
    s = re.sub(r"(\d)\s*(?:\\,|\{,\})\s*(?=\d{3}(?!\d))", r"\1,", s)  # 1\,000 / 1{,}000
    s = re.sub(r"\\[,;:]|\\quad|\\qquad|~", " ", s)
    s = re.sub(r"\s+", " ", s).strip()
    marker: str | None = None
    unit = ""
    if s.startswith("\\$") or (s.startswith("$") and len(s) > 1):
        s = s[2:].strip() if s.startswith("\\$") else s[1:].strip()
        marker, unit = "units", "$"
    for _ in range(3):
        for pat, kind in _TRAILING_MARKERS:
            m = pat.search(s)
            if not m or m.start() == 0:
                continue
            found = m.groupdict().get("u") if "u" in pat.groupindex else None
            if kind == "units" and found is not None:
                if _DEGREE_WORDS.match(found):
                    kind = "degrees"
                elif _PERCENT_WORDS.match(found):
                    kind = "percent"
                elif not re.search(r"[a-zA-Z]", found):
                    continue
            s = s[: m.start()].strip()
            marker, unit = kind, (found or "").strip()
            break
        else:
            break
    s = s.strip().rstrip(".").strip()
    # Thousands separators: "1,000", "11,111,111,100" (only when every group has 3 digits).
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    elif re.fullmatch(r"[-+]?\d{1,3}(?: \d{3})+", s):
        s = s.replace(" ", "")
    try:
        s = brace_arguments(s)
    except LatexError:
        pass
    m = re.fullmatch(r"(-?)(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}", s)
    if m:  # a mixed number, as MATH writes them: 1\frac{4}{5} = 1 + 4/5
        s = f"{m.group(1)}({m.group(2)}+\\frac{{{m.group(3)}}}{{{m.group(4)}}})"
    return Normalised(s, marker, unit)


# ---------------------------------------------------------------------------------------------
# The converter
# ---------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?|\.\d+)|(?P<cmd>\\[a-zA-Z]+)|(?P<op>[-+*/^(){}\[\]])|(?P<letter>[a-zA-Z])|(?P<other>\S))"
)
_IGNORED_CMDS = {"\\left", "\\right", "\\big", "\\Big", "\\bigl", "\\bigr", "\\Bigl", "\\Bigr"}
_OPEN = {"(": ")", "{": "}", "[": "]"}


def _tokens(s: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    s = s.strip()
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        kind = m.lastgroup or "other"
        text = m.group(kind)
        if kind == "cmd" and text in _IGNORED_CMDS:
            continue
        out.append((kind, text))
    return out


class _Parser:
    def __init__(self, s: str):
        self.toks = _tokens(s)
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise LatexError("unexpected end")
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok[1] != text:
            raise LatexError(f"expected {text!r}, got {tok[1]!r}")

    def parse(self) -> sympy.Expr:
        if not self.toks:
            raise LatexError("empty")
        value = self.expr()
        if self.peek() is not None:
            raise LatexError(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return value

    def expr(self) -> sympy.Expr:
        value = self.term()
        while (tok := self.peek()) is not None and tok[1] in "+-" and tok[0] == "op":
            self.take()
            rhs = self.term()
            value = value + rhs if tok[1] == "+" else value - rhs
        return value

    def _starts_factor(self, tok: tuple[str, str] | None) -> bool:
        if tok is None:
            return False
        kind, text = tok
        return kind in ("num", "cmd", "letter") or (kind == "op" and text in "({")

    def term(self) -> sympy.Expr:
        value = self.unary()
        while True:
            tok = self.peek()
            if tok is not None and tok[0] == "op" and tok[1] in "*/":
                self.take()
                rhs = self.unary()
                if tok[1] == "*":
                    value = value * rhs
                else:
                    if rhs == 0:
                        raise LatexError("division by zero")
                    value = value / rhs
            elif self._starts_factor(tok):
                if tok[0] == "num" and self.toks[self.i - 1][0] == "num":
                    raise LatexError("two numbers in a row")
                value = value * self.power()
            else:
                return value

    def unary(self) -> sympy.Expr:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] in "+-":
            self.take()
            value = self.unary()
            return -value if tok[1] == "-" else value
        return self.power()

    def power(self) -> sympy.Expr:
        base = self.atom()
        tok = self.peek()
        if tok is not None and tok == ("op", "^"):
            self.take()
            nxt = self.peek()
            if nxt is not None and nxt[0] == "num" and len(nxt[1]) > 1 and "." not in nxt[1]:
                # x^23 in TeX is x^2 followed by 3: split the digits
                self.take()
                self.toks.insert(self.i, ("num", nxt[1][1:]))
                exponent: sympy.Expr = sympy.Integer(nxt[1][0])
            elif nxt is not None and nxt[0] == "op" and nxt[1] in "+-":
                exponent = self.unary()
            else:
                exponent = self.atom()
            if base == 0 and exponent.is_negative:
                raise LatexError("division by zero")
            if not (exponent.is_Rational and abs(exponent) <= 4096 and exponent.q <= 12):
                raise LatexError("unsupported exponent")
            if base.is_Rational and base != 0 and abs(exponent) * max(abs(base.p), base.q).bit_length() > 1 << 16:
                raise TooLargeError("power too large")
            if not exponent.is_Integer and base.is_negative:
                raise ComplexValueError("fractional power of a negative number")
            return sympy.Pow(base, exponent)
        return base

    def group(self) -> sympy.Expr:
        tok = self.take()
        if tok != ("op", "{"):
            raise LatexError("expected {")
        value = self.expr()
        self.expect("}")
        return value

    def atom(self) -> sympy.Expr:
        kind, text = self.take()
        if kind == "num":
            if len(text) > 1000:
                raise TooLargeError("number too long")
            if "." in text:
                return sympy.Rational(text if not text.endswith(".") else text[:-1])
            return sympy.Integer(text)
        if kind == "letter":
            raise VariableError(f"variable {text!r}")
        if kind == "op" and text in _OPEN:
            value = self.expr()
            self.expect(_OPEN[text])
            return value
        if kind == "cmd":
            if text == "\\pi":
                return sympy.pi
            if text == "\\frac":
                num = self.group()
                den = self.group()
                if den == 0:
                    raise LatexError("division by zero")
                return num / den
            if text == "\\sqrt":
                index: sympy.Expr = sympy.Integer(2)
                if self.peek() == ("op", "["):
                    self.take()
                    index = self.expr()
                    self.expect("]")
                    if not (index.is_Integer and 2 <= index <= 12):
                        raise LatexError("unsupported root index")
                radicand = self.group()
                if radicand.is_negative:
                    raise ComplexValueError("root of a negative number")
                return sympy.root(radicand, index)
            if text in _GREEK:
                raise VariableError(f"variable {text}")
            if text in _FUNCTIONS:
                raise FunctionError(f"function {text}")
            raise LatexError(f"command {text}")
        raise LatexError(f"unexpected {text!r}")


# Commands that name a variable (Greek letters) or a function the converter does not evaluate.
_GREEK = {
    "\\alpha", "\\beta", "\\gamma", "\\delta", "\\epsilon", "\\varepsilon", "\\zeta", "\\eta", "\\theta",
    "\\vartheta", "\\iota", "\\kappa", "\\lambda", "\\mu", "\\nu", "\\xi", "\\rho", "\\sigma", "\\tau",
    "\\upsilon", "\\phi", "\\varphi", "\\chi", "\\psi", "\\omega", "\\Gamma", "\\Delta", "\\Theta",
    "\\Lambda", "\\Sigma", "\\Phi", "\\Psi", "\\Omega",
}
_FUNCTIONS = {
    "\\sin", "\\cos", "\\tan", "\\cot", "\\sec", "\\csc", "\\log", "\\ln", "\\exp", "\\arcsin", "\\arccos",
    "\\arctan", "\\binom", "\\lfloor", "\\rfloor", "\\lceil", "\\rceil", "\\max", "\\min", "\\operatorname",
}


def to_sympy(core: str) -> sympy.Expr:
    """Parse a normalised answer core into an exact sympy number (see the module docstring)."""
    return _Parser(core).parse()


def independent_parse(core: str) -> sympy.Expr | None:
    """The same core parsed by ``latex2sympy2_extended`` (None when it is not installed or fails)."""
    try:
        from latex2sympy2_extended import latex2sympy
    except ImportError:  # pragma: no cover - math-verify is a dependency
        return None
    try:
        value = latex2sympy(core)
    except Exception:  # noqa: BLE001 - any parser failure just means "no independent parse"
        return None
    return value if isinstance(value, sympy.Basic) else None
