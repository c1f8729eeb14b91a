"""Rewrite math problems so that every answer is an integer (DAPO section 3.5).

"If the original answer is of the form (a + sqrt(b)) / c, the problem is rewritten so that the
expected answer is a + b + c." :func:`integerize` applies one rule per answer shape; each rule has
one fixed sentence (per sign pattern) appended to the problem, and computes the integer from the
parts of the answer. Every rewrite is verified: the answer rebuilt from the parts must equal the
original answer under sympy, the original parsed by an independent parser (latex2sympy2_extended);
otherwise the row is refused with reason ``verification_failed``.

Rules (``IntegerProblem.rule``):

=====================  ==========================================  ===================================
rule                   original answer                             new answer
=====================  ==========================================  ===================================
integer                ``025``, ``1,000``, ``-3``, ``27.0``,        the integer; problem text unchanged
                       ``\\boxed{12}``, ``x = 5``
integer_expression     ``\\sqrt{16}``, ``2^{10}``, ``\\frac{6}{3}``    the integer it equals
degrees                ``90^\\circ``, ``90°``, ``90\\text{ degrees}``  90
percent                ``25\\%``                                    25
units                  ``5\\text{ cm}``, ``\\$36``, ``540 dollars``    the number
fraction               ``\\frac{6}{8}`` = 3/4 (m/n, lowest terms)     m + n = 7; negative: -m/n, m + n
sqrt                   ``a\\sqrt{b}``, b square-free                  a + b (``\\sqrt{12}`` = 2√3 -> 5)
sqrt_over              ``\\frac{a\\sqrt{b}}{c}``, gcd(a, c) = 1       a + b + c
sqrt_sum               ``\\frac{a + \\sqrt{b}}{c}``                    a + b + c
                       ``\\frac{a + b\\sqrt{c}}{d}``, gcd(a,b,d) = 1   a + b + c + d (d = 1: a + b + c)
pi_multiple            ``k\\pi``                                      k
pi_fraction            ``\\frac{m}{n}\\pi``                            m + n
=====================  ==========================================  ===================================

Signs: a negative fraction, radical or pi fraction is written ``-(form)`` with positive parts
and the sentence names the minus sign (``-\\frac{m}{n}``); the integer is the sum of the positive
parts. In ``(a ± b√c)/d`` the sentence shows the signs (``\\frac{a-b\\sqrt{c}}{d}``,
``\\frac{b\\sqrt{c}-a}{d}``), the letters stay positive.

Refused (``Refusal.reason``): ``empty``, ``multiple_answers`` (``1,-2``, a list), ``tuple``,
``interval``, ``set``, ``matrix``, ``infinity``, ``plus_minus``, ``equation`` (an equation or
inequality that is not ``x = number``), ``base`` (``52_8``), ``complex``, ``text``, ``variable``,
``decimal`` (``2.5``, ``4.5e33``: decimals in these data sets are mostly rounded values, and the
exact fraction of a rounded value would be a wrong target), ``too_large`` (an integer expression
with more than 15 digits, like ``2^{1009}``), ``unsupported_form`` (``18+2\\pi``, cube roots,
nested radicals, sums of different radicals), ``unparseable``, ``verification_failed``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

import sympy

from reasonrl.data.latex import (
    ComplexValueError,
    FunctionError,
    LatexError,
    Normalised,
    TooLargeError,
    VariableError,
    independent_parse,
    normalise,
    to_sympy,
)

#: A hook that may rephrase the appended sentence: ``rewriter(problem, rule, sentence) -> sentence``.
#: The integer answer never depends on it.
Rewriter = Callable[[str, str, str], str]

RULES = (
    "integer", "integer_expression", "degrees", "percent", "units", "fraction", "sqrt", "sqrt_over",
    "sqrt_sum", "pi_multiple", "pi_fraction",
)
REASONS = (
    "empty", "multiple_answers", "tuple", "interval", "set", "matrix", "infinity", "plus_minus", "equation",
    "base", "complex", "text", "variable", "decimal", "too_large", "unsupported_form", "unparseable",
    "verification_failed",
)
MAX_INTEGER_DIGITS = 15  # an integer *expression* (2^{10}) must evaluate below 10**15
MAX_LITERAL_DIGITS = 1000  # an integer written out is kept up to this many digits


@dataclass(frozen=True)
class IntegerProblem:
    """A problem whose expected answer is an integer."""

    problem: str  # the rewritten text: the original, then one sentence (unchanged for rule "integer")
    answer: int
    rule: str  # one of RULES
    sentence: str = ""  # the appended sentence ("" when the text is unchanged)
    form: str = ""  # the original answer in its canonical form, e.g. "\\frac{3}{4}" or "2\\sqrt{3}"
    parts: tuple[tuple[str, int], ...] = ()  # the letters of the form and their values


@dataclass(frozen=True)
class Refusal:
    """Why an answer could not be turned into an integer (``reason`` is one of REASONS)."""

    reason: str
    detail: str = ""


_POS = "positive integers"
_SQFREE = "is not divisible by the square of any prime"


def _sentence(form: str, conditions: str, target: str) -> str:
    return f"The answer can be written as ${form}$, where {conditions}; find ${target}$."


_FIXED = {
    "degrees": "The answer is a whole number of degrees; give that number, without the degree symbol.",
    "percent": "The answer is a whole-number percentage; give that number, without the percent sign.",
    "units": "Give the answer as a number, without units.",
    "integer_expression": "Give the answer as an integer written out in decimal digits.",
    "pi_multiple": "The answer can be written as $k\\pi$ for an integer $k$; find $k$.",
}


# ---------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------

def _top_level_commas(s: str) -> int:
    depth = 0
    n = 0
    for ch in s:
        if ch in "{":
            depth += 1
        elif ch in "}":
            depth -= 1
        elif ch == "," and depth == 0:
            n += 1
    return n


def _classify_refusal(core: str, problem: str, had_text: bool) -> Refusal | None:
    """A refusal for answers that are not single real numbers, decided on the text."""
    s = core
    if not s:
        return Refusal("empty")
    if re.search(r"\\begin\s*\{\s*(?:[pbvBV]?matrix|array|smallmatrix)", s):
        return Refusal("matrix")
    if "\\infty" in s or "∞" in s or re.search(r"\binfinity\b", s, re.I):
        return Refusal("infinity")
    if re.search(r"\\pm(?![a-zA-Z])|\\mp(?![a-zA-Z])|±|∓", s):
        return Refusal("plus_minus")
    if re.search(r"\\cup(?![a-zA-Z])|\\cap(?![a-zA-Z])|\\in(?![a-zA-Z])|∪", s):
        return Refusal("interval")
    if "\\{" in s or "\\}" in s or "\\emptyset" in s or "\\varnothing" in s:
        return Refusal("set")
    if re.search(r"\d\s*_\s*\{?\s*\d", s):
        return Refusal("base")
    if re.search(r"=|<|>|\\le|\\ge|\\neq|\\ne(?![a-zA-Z])|\\approx|\\sim|\\equiv|≤|≥", s):
        return Refusal("equation")
    commas = _top_level_commas(s)
    if commas:
        opens, closes = s[:1], s[-1:]
        if opens in "([" and closes in ")]" and opens and closes:
            if commas == 1 and (opens + closes in ("(]", "[)", "[]") or re.search(r"\binterval", problem, re.I)):
                return Refusal("interval")
            return Refusal("tuple")
        return Refusal("multiple_answers")
    if re.fullmatch(r"\(\s*[A-E]\s*\)", s) or (had_text and re.fullmatch(r"[A-Za-z ]+", s)):
        return Refusal("text")
    if re.search(r"\\(?:text|mbox|textbf|textit|mathrm|operatorname)\s*\{", s):
        return Refusal("text")
    if re.search(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}", s):
        return Refusal("text")
    if re.fullmatch(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+", s):
        return Refusal("decimal")
    letters = re.sub(r"\\[a-zA-Z]+", "", s)
    found = set(re.findall(r"[a-zA-Z]", letters))
    if found == {"i"}:
        return Refusal("complex")
    if re.search(r"(?<![\d.])\d*\.\d+", s) and not re.fullmatch(r"[-+]?\d+\.0*", s):
        return Refusal("decimal")
    return None


def _squarefree(n: int) -> bool:
    return n >= 2 and all(e == 1 for e in sympy.factorint(n).values())


def _radical_parts(value: sympy.Expr) -> tuple[sympy.Rational, sympy.Rational, int] | None:
    """(p, q, c) with value = p + q*sqrt(c), c square-free >= 2, q != 0; None for other shapes."""
    expr = sympy.expand(sympy.radsimp(value))
    p = sympy.Rational(0)
    q = sympy.Rational(0)
    c: int | None = None
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        if not coeff.is_Rational:
            return None
        if rest == 1:
            p += coeff
            continue
        if not (rest.is_Pow and rest.base.is_Integer and rest.exp == sympy.Rational(1, 2)):
            return None
        radicand = int(rest.base)
        if radicand > 10**12:  # keep factoring cheap; no answer has such a radicand
            return None
        if c is not None and radicand != c:
            return None
        c = radicand
        q += coeff
    if c is None or q == 0 or not _squarefree(c):
        return None
    return p, q, c


@dataclass(frozen=True)
class _Shape:
    rule: str
    form: str  # LaTeX of the canonical form with the numbers filled in
    sentence: str
    parts: tuple[tuple[str, int], ...]
    answer: int
    rebuilt: sympy.Expr  # the original value rebuilt from the parts
    roles: dict[str, int]  # the parts by role (num/den, coef/radicand/den, rational, k, n)

    @property
    def total(self) -> int:
        """The integer the sentence asks for, recomputed from the parts."""
        if self.rule in ("pi_multiple",) or self.rule in _FIXED:
            return next(iter(self.roles.values()))
        return sum(value for _, value in self.parts)


def _coef(n: int) -> str:
    """A coefficient in front of a radical or pi: "" for 1."""
    return "" if n == 1 else str(n)


def _m_over_n(rule: str, value: sympy.Rational, form: Callable[[str, int, int], str], written: str, unit: Any = 1) -> _Shape:
    """A reduced fraction ±m/n (times ``unit``), answered m + n; ``form(sign, m, n)`` writes it as the
    problem shows it, ``written`` (with ``{sign}``) as the sentence names it."""
    neg = value < 0
    m, n = abs(value.p), value.q
    sign = "-" if neg else ""
    return _Shape(rule, form(sign, m, n), _sentence(written.format(sign=sign), f"$m$ and $n$ are relatively prime {_POS}", "m+n"),
                  (("m", m), ("n", n)), m + n, (-1 if neg else 1) * sympy.Integer(m) / sympy.Integer(n) * unit, {"num": m, "den": n})


def _fraction_shape(value: sympy.Rational) -> _Shape:
    return _m_over_n("fraction", value, lambda sign, m, n: f"{sign}\\frac{{{m}}}{{{n}}}", "{sign}\\frac{{m}}{{n}}")


def _pi_shape(k: sympy.Rational) -> _Shape:
    if k.is_Integer:
        return _Shape("pi_multiple", f"{'-' if k == -1 else _coef(int(k))}\\pi", _FIXED["pi_multiple"], (("k", int(k)),), int(k), sympy.Integer(k) * sympy.pi, {"k": int(k)})
    return _m_over_n("pi_fraction", k, lambda sign, m, n: f"{sign}\\frac{{{_coef(m)}\\pi}}{{{n}}}", "{sign}\\frac{{m}}{{n}}\\pi", sympy.pi)


def _sqrt_shape(p: sympy.Rational, q: sympy.Rational, c: int) -> _Shape:
    if p == 0:
        neg = q < 0
        a, den = abs(q.p), q.q
        sign = "-" if neg else ""
        s = -1 if neg else 1
        if den == 1:
            return _Shape(
                "sqrt", f"{sign}{_coef(a)}\\sqrt{{{c}}}",
                _sentence(f"{sign}a\\sqrt{{b}}", f"$a$ and $b$ are {_POS} and $b$ {_SQFREE}", "a+b"),
                (("a", a), ("b", c)), a + c, s * sympy.Integer(a) * sympy.sqrt(sympy.Integer(c), evaluate=False),
                {"coef": a, "radicand": c},
            )
        return _Shape(
            "sqrt_over", f"{sign}\\frac{{{_coef(a)}\\sqrt{{{c}}}}}{{{den}}}",
            _sentence(
                f"{sign}\\frac{{a\\sqrt{{b}}}}{{c}}",
                f"$a$, $b$ and $c$ are {_POS}, $a$ and $c$ are relatively prime, and $b$ {_SQFREE}", "a+b+c",
            ),
            (("a", a), ("b", c), ("c", den)), a + c + den,
            s * sympy.Integer(a) * sympy.sqrt(sympy.Integer(c), evaluate=False) / sympy.Integer(den),
            {"coef": a, "radicand": c, "den": den},
        )
    d = math.lcm(int(p.q), int(q.q))
    A, B = int(p * d), int(q * d)
    a, b = abs(A), abs(B)
    # The letters in order of appearance: the rational part, the coefficient (omitted when 1),
    # the radicand, the denominator (omitted when 1).
    letters = iter("abcd")
    la = next(letters)
    lb = next(letters) if b != 1 else ""
    lc = next(letters)
    ld = next(letters) if d != 1 else ""
    rad = f"{lb}\\sqrt{{{lc}}}"
    radv = (f"{b}" if b != 1 else "") + f"\\sqrt{{{c}}}"
    if A > 0 and B > 0:
        num, numv, outer = f"{la}+{rad}", f"{a}+{radv}", ""
    elif A > 0 > B:
        num, numv, outer = f"{la}-{rad}", f"{a}-{radv}", ""
    elif B > 0 > A:
        num, numv, outer = f"{rad}-{la}", f"{radv}-{a}", ""
    else:
        num, numv, outer = f"{la}+{rad}", f"{a}+{radv}", "-"
    if d != 1:
        form = f"{outer}\\frac{{{num}}}{{{ld}}}"
        formv = f"{outer}\\frac{{{numv}}}{{{d}}}"
    else:
        form = f"{outer}({num})" if outer else num
        formv = f"{outer}({numv})" if outer else numv
    names = [x for x in (la, lb, lc, ld) if x]
    listed = ", ".join(f"${x}$" for x in names[:-1]) + f" and ${names[-1]}$"
    cond = f"{listed} are {_POS}"
    if d != 1 and b != 1:
        cond += f", $\\gcd({la},{lb},{ld})=1$,"
    cond += f" and ${lc}$ {_SQFREE}"
    target = "+".join(names)
    values = {la: a, lc: c}
    if lb:
        values[lb] = b
    if ld:
        values[ld] = d
    parts = tuple((x, values[x]) for x in names)
    rebuilt = (sympy.Integer(A) + sympy.Integer(B) * sympy.sqrt(sympy.Integer(c), evaluate=False)) / sympy.Integer(d)
    roles = {"rational": a, "coef": b, "radicand": c, "den": d}
    return _Shape("sqrt_sum", formv, _sentence(form, cond, target), parts, sum(values.values()), rebuilt, roles)


def _check_parts(shape: _Shape) -> bool:
    """The canonical-form conditions the sentence states, checked on the extracted parts."""
    v = shape.roles
    if any(x <= 0 for k, x in v.items() if k not in ("k", "n")) or shape.answer != shape.total:
        return False
    if shape.rule in ("fraction", "pi_fraction"):
        return v["num"] > 0 and v["den"] > 1 and math.gcd(v["num"], v["den"]) == 1
    if shape.rule in ("sqrt", "sqrt_over", "sqrt_sum") and not _squarefree(v["radicand"]):
        return False
    if shape.rule == "sqrt_over":
        return v["den"] > 1 and math.gcd(v["coef"], v["den"]) == 1
    if shape.rule == "sqrt_sum" and v["den"] > 1 and v["coef"] > 1:
        return math.gcd(v["rational"], v["coef"], v["den"]) == 1
    return True


def _equal(rebuilt: sympy.Expr, original: sympy.Expr) -> bool:
    try:
        if original.free_symbols:
            return False
        diff = sympy.simplify(sympy.radsimp(rebuilt - original))
        return bool(diff == 0)
    except Exception:  # noqa: BLE001 - sympy failures mean "not verified"
        return False


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def _unwrap_answer(answer: object) -> object:
    if isinstance(answer, (list, tuple)):
        if len(answer) == 1:
            return _unwrap_answer(answer[0])
        return Refusal("multiple_answers" if answer else "empty")
    return answer


_LABEL = re.compile(r"^(?:[a-zA-Z](?:_\{?[a-zA-Z0-9]+\}?)?|\\[a-zA-Z]+(?:_\{?[a-zA-Z0-9]+\}?)?)\s*=\s*(?P<rhs>[^=]+)$")


def integerize(problem: str, answer: object, *, rewriter: Rewriter | None = None) -> IntegerProblem | Refusal:
    """Turn ``(problem, answer)`` into a problem with an integer answer, or say why not.

    ``answer`` is the original final answer: LaTeX text, a number, or a one-element list.
    ``rewriter(problem, rule, sentence) -> sentence`` may rephrase the appended sentence (an LLM,
    for instance); the integer is always computed by the rules here.
    """
    ans = _unwrap_answer(answer)
    if isinstance(ans, Refusal):
        return ans
    if ans is None or isinstance(ans, bool):
        return Refusal("empty")
    if isinstance(ans, int):
        return IntegerProblem(problem, int(ans), "integer")
    if isinstance(ans, float):
        if ans.is_integer() and abs(ans) <= 2**53:
            return IntegerProblem(problem, int(ans), "integer")
        if ans.is_integer():  # 1e23 is not exactly an integer: int(1e23) = 99999999999999991611392
            return Refusal("too_large", f"{ans!r} is a float beyond 2**53, not an exact integer: store the answer as an integer or a string")
        return Refusal("decimal", repr(ans))
    raw = str(ans)
    try:
        norm = normalise(raw)
    except LatexError as e:  # pragma: no cover - normalise is defensive
        return Refusal("unparseable", str(e))
    label = _LABEL.match(norm.core)
    if label:  # "x = 5", "k=1": the value after the label
        norm = Normalised(label.group("rhs").strip(), norm.marker, norm.unit)
    core = norm.core

    if re.fullmatch(r"[-+]?\d+(?:\.0*)?", core):
        if len(core) > MAX_LITERAL_DIGITS:
            return Refusal("too_large", raw[:80])
        value = int(core.split(".")[0])
        if norm.marker is None:
            return IntegerProblem(problem, value, "integer")
        return _finish(problem, _Shape(norm.marker, str(value), _FIXED[norm.marker], (("n", value),), value, sympy.Integer(value), {"n": value}), core, rewriter, exact=True)

    refusal = _classify_refusal(core, problem, had_text="\\text" in raw or "\\mbox" in raw)
    if refusal:
        return Refusal(refusal.reason, raw)
    if re.search(r"[a-zA-Z]", re.sub(r"\\[a-zA-Z]+", "", core)):
        return Refusal("variable", raw)
    try:
        value = to_sympy(core)
    except VariableError:
        return Refusal("variable", raw)
    except FunctionError:
        return Refusal("unsupported_form", raw)
    except ComplexValueError:
        return Refusal("complex", raw)
    except TooLargeError:
        return Refusal("too_large", raw)
    except LatexError:
        return Refusal("unparseable", raw)
    except Exception:  # noqa: BLE001 - sympy errors on odd input are just "unparseable"
        return Refusal("unparseable", raw)
    if value.free_symbols or value.is_real is not True:
        return Refusal("complex" if value.is_real is False else "unparseable", raw)

    shape: _Shape | None = None
    if value.is_Integer:
        n = int(value)
        if abs(n) >= 10**MAX_INTEGER_DIGITS:
            return Refusal("too_large", raw)
        rule = norm.marker or "integer_expression"
        shape = _Shape(rule, str(n), _FIXED[rule], (("n", n),), n, sympy.Integer(n), {"n": n})
    elif value.is_Rational:
        shape = _fraction_shape(value)
    else:
        k = sympy.simplify(value / sympy.pi)
        if k.is_Rational and k != 0:
            shape = _pi_shape(k)
        else:
            parts = _radical_parts(value)
            if parts is not None:
                shape = _sqrt_shape(*parts)
    if shape is None:
        return Refusal("unsupported_form", raw)
    return _finish(problem, shape, core, rewriter, exact=False)


def _finish(problem: str, shape: _Shape, core: str, rewriter: Rewriter | None, *, exact: bool) -> IntegerProblem | Refusal:
    if not _check_parts(shape):
        return Refusal("verification_failed", f"parts {shape.parts} break the form {shape.form}")
    if not exact:
        original = independent_parse(core)
        if original is None or not _equal(shape.rebuilt, original):
            return Refusal("verification_failed", f"{core} != {shape.form}")
    sentence = shape.sentence
    if rewriter is not None:
        new = rewriter(problem, shape.rule, sentence)
        if isinstance(new, str) and new.strip():
            sentence = new.strip()
    text = f"{problem.rstrip()}\n\n{sentence}"
    return IntegerProblem(text, shape.answer, shape.rule, sentence, shape.form, shape.parts)


def to_integer_answer(problem: str, answer: object, *, rewriter: Rewriter | None = None) -> IntegerProblem | None:
    """:func:`integerize`, with None for an answer it refuses."""
    out = integerize(problem, answer, rewriter=rewriter)
    return out if isinstance(out, IntegerProblem) else None
