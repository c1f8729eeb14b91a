"""Final-answer extraction from a model response (DAPO's ``Answer:`` line, else ``\\boxed{}``).

The DAPO prompt template asks for the answer on the last line, as ``Answer: $Answer``. Models
trained on other data often write ``\\boxed{...}`` instead, so that is the fallback. When a
response holds several answers, the last one wins (the model's final word).
"""

from __future__ import annotations

import re

__all__ = ["extract_answer", "find_boxed"]

# A line whose content starts with "Answer:", allowing markdown decoration before and around the
# keyword: "Answer: 42", "**Answer:** 42", "**Answer: 42**", "## Answer: 42", "> *Answer*: 42".
_ANSWER_LINE = re.compile(
    r"^[ \t>#*_\-]*answer[ \t]*[*_]*[ \t]*:(?P<rest>.*)$",
    re.IGNORECASE | re.MULTILINE,
)
# Markdown bold/italic markers around the answer itself: "**42**", "__42__".
_EDGE_MARKUP = re.compile(r"^(?:\*+|_{2,})|(?:\*+|_{2,})$")
_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _balanced_group(text: str, open_pos: int) -> str | None:
    """The text inside the brace group that opens at ``text[open_pos] == "{"``.

    Escaped braces (``\\{``, ``\\}``) do not count. None when the group is never closed (a
    truncated response).
    """
    depth = 0
    i = open_pos
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # skip the escaped character: "\{" and "\}" are literal braces
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_pos + 1 : i]
        i += 1
    return None


def find_boxed(text: str) -> list[str]:
    """The contents of every complete ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, in order.

    Nested braces are kept (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); unclosed or empty
    boxes are skipped. Occurrences are ordered by where they start, so for
    ``\\boxed{\\boxed{5}}`` the inner ``5`` comes last.
    """
    found: list[str] = []
    for m in _BOX_START.finditer(text):
        inner = _balanced_group(text, m.end() - 1)
        if inner is not None and inner.strip():
            found.append(inner.strip())
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

    1. The last line of the form ``Answer: X`` (DAPO's template; the keyword is matched without
       case, markdown bold/headers/quotes around it are allowed). Lines whose ``X`` is empty are
       skipped. If ``X`` itself holds a ``\\boxed{...}``, the (last) box content is returned.
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
    for m in reversed(list(_ANSWER_LINE.finditer(response))):
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
