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
# Units that may follow an integer without changing it ("540 dollars", "12 cm", "90^\\circ").
# A unit is a separate word of two or more letters; constants and multipliers ("3pi", "5x",
# "2 thousand", "1 million") are not units, so those answers are not read as integers.
_NOT_UNITS = r"(?:pi|million|millions|billion|billions|thousand|thousands|hundred|hundreds|dozen|dozens|trillion|times|squared|cubed|sqrt|i|e)\b"
_WORD = r"(?!" + _NOT_UNITS + r")[a-zA-Z]{2,}\.?"
_UNIT = (r"(?:\s+" + _WORD + r"(?:\s+" + _WORD + r"){0,2}|\s*(?:\\%|%|\^\\circ|\^\{\\circ\}|°)"
         r"|\s*\\(?:text|mbox|mathrm)\s*\{\s*+(?!" + _NOT_UNITS + r")[a-zA-Z. ]*\})")
_INT_RE = re.compile(
    r"^(?:\\?\$)?(?P<sign>[-+−]?)\s*(?:\\?\$)?(?P<num>[0-9]{1,3}(?:(?:,|\{,\}|\\,|\\!|\s)+[0-9]{3})+|[0-9]+)(?:\.0*)?(?:" + _UNIT + r")?$"
)


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
    if isinstance(text, float):
        return int(text) if text.is_integer() else None
    s = strip_answer(str(text))
    if not s:
        return None
    m = _INT_RE.match(s)
    if not m:
        return None
    digits = re.sub(r"[^\d]", "", m.group("num"))
    value = int(digits)
    return -value if m.group("sign") in ("-", "−") else value
