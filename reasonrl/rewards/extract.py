"""Final-answer extraction from a model response (DAPO's ``Answer:`` line, else ``\\boxed{}``).

The DAPO prompt template asks for the answer on the last line, as ``Answer: $Answer``. Models
trained on other data often write ``\\boxed{...}`` instead, so that is the fallback. When a
response holds several answers, the last one wins (the model's final word).
"""

from __future__ import annotations

import re

__all__ = ["extract_answer", "find_boxed"]

# The last "answer:" of the response, the keyword matched without case and with markdown around it
# ("Answer: 42", "**Final Answer:** 42", "**Answer: 42**", "## Answer: 42", "> *Answer*: 42"); the
# rest of that line is the answer. Possessive quantifiers keep the scan linear-time.
_ANSWER = re.compile(r"\banswer[ \t*_]*+:(?P<rest>[^\n]*+)", re.IGNORECASE)
# Markdown bold/italic markers around the answer itself: "**42**", "__42__".
_EDGE_MARKUP = re.compile(r"^(?:\*+|_{2,})|(?:\*+|_{2,})$")
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*+\{")


def _brace_pairs(text: str) -> dict[int, int]:
    """Position of each "{" → position of its matching "}", in one pass (escaped braces ``\\{`` and
    ``\\}`` do not count; unclosed groups have no entry). Linear time, whatever the nesting."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def find_boxed(text: str) -> list[str]:
    """The contents of every complete ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, in order.

    Nested braces are kept (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); unclosed or empty
    boxes are skipped. Occurrences are ordered by where they start, so for
    ``\\boxed{\\boxed{5}}`` the inner ``5`` comes last. Linear time.
    """
    starts = [m.end() - 1 for m in _BOX_START.finditer(text)]
    if not starts:
        return []
    pairs = _brace_pairs(text)
    found: list[str] = []
    for open_pos in starts:
        close = pairs.get(open_pos)
        if close is not None and text[open_pos + 1 : close].strip():
            found.append(text[open_pos + 1 : close].strip())
    return found


def _clean(value: str) -> str:
    value = value.strip()
    for _ in range(3):
        stripped = _EDGE_MARKUP.sub("", value).strip()
        if stripped == value:
            break
        value = stripped
    return value


def extract_answer(response: str) -> str | None:
    """The response's final answer as a string, or None when it gives none.

    1. The last line containing ``Answer: X`` (DAPO's template; the keyword is matched without
       case, anywhere in the line, with markdown around it: ``**Final Answer:** X``). ``X`` is the
       rest of that line; empty ones are skipped. If ``X`` holds a ``\\boxed{...}``, the (last)
       box content is returned.
    2. Otherwise the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), with balanced,
       possibly nested braces.
    3. Otherwise None.

    >>> extract_answer("so we get 7.\\nAnswer: 25")
    '25'
    >>> extract_answer("thus $\\\\boxed{\\\\frac{1}{2}}$.")
    '\\\\frac{1}{2}'
    >>> extract_answer("no final answer here") is None
    True
    """
    if not response:
        return None
    for m in reversed(list(_ANSWER.finditer(response))):
        value = _clean(m.group("rest"))
        if not value:
            continue
        boxed = find_boxed(value)
        if boxed:
            value = boxed[-1]
        return value
    boxed = find_boxed(response)
    if boxed:
        return boxed[-1]
    return None
