"""Final-answer extraction from a model response (DAPO's ``Answer:`` line, or ``\\boxed{}``).

The DAPO prompt template asks for the answer on the last line, as ``Answer: $Answer``. Models
trained on other data often write ``\\boxed{...}`` instead (Qwen-Math, most instruct models), or
Minerva's ``Final Answer: The final answer is X. I hope it is correct.``. When a response holds
several answers, the last one wins, line or box, whichever comes later (the model's final word).
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
# Minerva's phrasing on the answer line (lm-eval's minerva_math reads the text between "The final
# answer is" and ". I hope it is correct"; the closing phrase may be missing): "The final answer is
# 17. I hope it is correct." and the plain "The answer is 17" give 17.
_PHRASE = re.compile(r"(?:the\s++)?(?:final\s++)?answer\s++is\b[ \t]*+:?", re.IGNORECASE)
_HOPE = re.compile(r"\s*+\.?\s*+I hope it is correct\b", re.IGNORECASE)


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


def _boxes(text: str) -> list[tuple[int, str]]:
    """(start, content) of every complete, non-empty ``\\boxed{...}`` / ``\\fbox{...}``, in order."""
    starts = [(m.start(), m.end() - 1) for m in _BOX_START.finditer(text)]
    if not starts:
        return []
    pairs = _brace_pairs(text)
    found: list[tuple[int, str]] = []
    for start, open_pos in starts:
        close = pairs.get(open_pos)
        if close is not None and text[open_pos + 1 : close].strip():
            found.append((start, text[open_pos + 1 : close].strip()))
    return found


def find_boxed(text: str) -> list[str]:
    """The contents of every complete ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, in order.

    Nested braces are kept (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); unclosed or empty
    boxes are skipped. Occurrences are ordered by where they start, so for
    ``\\boxed{\\boxed{5}}`` the inner ``5`` comes last. Linear time.
    """
    return [content for _, content in _boxes(text)]


def _clean(value: str) -> str:
    value = value.strip()
    for _ in range(3):
        stripped = _EDGE_MARKUP.sub("", value).strip()
        if stripped == value:
            break
        value = stripped
    return value


def _unphrase(value: str) -> str:
    """``value`` without Minerva's "The final answer is ... I hope it is correct." around it."""
    m = _PHRASE.match(value)
    if not m:
        return value
    value = value[m.end() :]
    hope = _HOPE.search(value)
    if hope:
        value = value[: hope.start()]
    value = value.strip()
    if value.endswith(".") and not value.endswith("..."):
        value = value[:-1].rstrip()
    return _clean(value)


def extract_answer(response: str) -> str | None:
    """The response's final answer as a string, or None when it gives none.

    1. The last line containing ``Answer: X`` (DAPO's template; the keyword is matched without
       case, anywhere in the line, with markdown around it: ``**Final Answer:** X``). ``X`` is the
       rest of that line; empty ones are skipped. If ``X`` holds a ``\\boxed{...}``, the (last)
       box content is returned; if it is Minerva's ``The final answer is X. I hope it is
       correct.`` (or ``The answer is X``), ``X`` is what lies between the phrases.
    2. The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), with balanced, possibly
       nested braces, when it comes after that line (or there is none): the last final answer
       wins, line or box, whichever the response gives later.
    3. Otherwise None.

    >>> extract_answer("so we get 7.\\nAnswer: 25")
    '25'
    >>> extract_answer("thus $\\\\boxed{\\\\frac{1}{2}}$.")
    '\\\\frac{1}{2}'
    >>> extract_answer("Final Answer: The final answer is 17. I hope it is correct.")
    '17'
    >>> extract_answer("no final answer here") is None
    True
    """
    if not response:
        return None
    boxes = _boxes(response)
    for m in reversed(list(_ANSWER.finditer(response))):
        value = _clean(m.group("rest"))
        if not value:
            continue
        if boxes and boxes[-1][0] >= m.end():  # a box after the answer line: the later one wins
            return boxes[-1][1]
        boxed = find_boxed(value)
        value = boxed[-1] if boxed else _unphrase(value)
        if value:
            return value
    if boxes:
        return boxes[-1][1]
    return None
