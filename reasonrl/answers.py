"""Integer answers: the one parser shared by the reward and the data transformation.

DAPO's reward is a rule because every answer is an integer; "025", "3,000", "$540$",
"540 dollars", "27.0" and "\\boxed{540}" are all the integer they spell.
"""

from __future__ import annotations

import re

_WRAPPERS = [
    (re.compile(r"^\\boxed\s*\{(.*)\}$", re.S), 1),
    (re.compile(r"^\\fbox\s*\{(.*)\}$", re.S), 1),
    (re.compile(r"^\\text(?:bf|rm)?\s*\{(.*)\}$", re.S), 1),
    (re.compile(r"^\\mathbf\s*\{(.*)\}$", re.S), 1),
]
# Units that may follow an integer without changing it ("540 dollars", "12 cm", "90^\\circ",
# "5\\text{ cm}", "864 \\mbox{ inches}^2"): a closed list, never arbitrary words, so that
# "42 and above" or "3 or more" are not read as 42 and 3 (a reward-hacking surface).
UNIT_WORDS = frozenset("""
dollar dollars cent cents euro euros yen rupee rupees
mm cm m km in inch inches ft foot feet yd yard yards mile miles meter meters metre metres
millimeter millimeters centimeter centimeters kilometer kilometers
mg g kg gram grams kilogram kilograms lb lbs pound pounds oz ounce ounces ton tons
ml l liter liters litre litres gallon gallons quart quarts pint pints cup cups
s sec secs second seconds min mins minute minutes h hr hrs hour hours day days week weeks month months year years
deg degree degrees radian radians percent mph kph units unit points point
""".split())
_MODIFIERS = ("square", "sq", "cubic", "per")
_UNIT_WORD = r"(?i:(?:" + "|".join(sorted(UNIT_WORDS | set(_MODIFIERS), key=len, reverse=True)) + r")\.?)(?![a-zA-Z])"
_POWER = r"(?:\^\{?[23]\}?)?"
_PHRASE = _UNIT_WORD + r"(?:\s+" + _UNIT_WORD + r"){0,2}" + _POWER
#: A degree mark after a number: ``90^\circ``, ``90^{\circ}``, ``90°`` (a unit, not a power).
DEGREE_MARK = r"(?:\^\s*(?:\\circ|\{\s*\\circ\s*\})|°)"
_UNIT = (r"(?:\s*" + _PHRASE + r"|\s*(?:\\%|%|" + DEGREE_MARK + r")"
         r"|\s*\\(?:text|mbox|mathrm)\s*\{\s*" + _PHRASE + r"\s*\}" + _POWER + r")")
_INT_RE = re.compile(
    r"^(?:\\?\$)?(?P<sign>[-+−]?)\s*(?:\\?\$)?(?P<num>[0-9]{1,3}(?:(?:,|\{,\}|\\,|\\!|\s)+[0-9]{3})+|[0-9]+)(?:\.0*)?(?:" + _UNIT + r")?$"
)


#: Longer digit strings are not read as integers (they go to math-verify, under its time limit).
MAX_DIGITS = 4000


def strip_answer(text: str) -> str:
    """Remove math delimiters, \\boxed{}, trailing punctuation and surrounding blanks."""
    s = text.strip()
    for _ in range(4):
        before = s
        s = s.strip().rstrip(".").strip()
        if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
            s = s.strip("$").strip()
        if s.startswith("\\(") and s.endswith("\\)"):
            s = s[2:-2].strip()
        if s.startswith("\\[") and s.endswith("\\]"):
            s = s[2:-2].strip()
        for pat, grp in _WRAPPERS:
            m = pat.match(s)
            if m:
                s = m.group(grp).strip()
        s = s.replace("\\!", "").replace("\\ ", " ").replace("\\left", "").replace("\\right", "")
        if s == before:
            break
    return s


def parse_integer(text: str | int | float | None) -> int | None:
    """The integer ``text`` spells, or None when it is not (just) an integer.

    >>> parse_integer("025"), parse_integer("3,000"), parse_integer("$540$"), parse_integer("27.0")
    (25, 3000, 540, 27)
    >>> parse_integer("540 dollars"), parse_integer("1/2"), parse_integer("2.5")
    (540, None, None)
    """
    if text is None:
        return None
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text
    if isinstance(text, float):  # beyond 2**53 a float is not an exact integer (1e23 reads as 99999999999999991611392)
        return int(text) if text.is_integer() and abs(text) <= 2**53 else None
    s = strip_answer(str(text))
    if not s:
        return None
    m = _INT_RE.match(s)
    if not m:
        return None
    digits = re.sub(r"[^\d]", "", m.group("num")).lstrip("0") or "0"
    if len(digits) > MAX_DIGITS:  # (Python refuses int() of > 4300 digits; no answer is that long)
        return None
    value = int(digits)
    return -value if m.group("sign") in ("-", "−") else value


def braced(s: str, i: int) -> tuple[str, int] | None:
    """The group opened by ``s[i] == "{"``: (its content, the index after its "}"); None when unclosed."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return s[i + 1 : j], j + 1
    return None
