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
# What may follow the closing phrase on its line: punctuation and chat-template tokens ("<|im_end|>",
# "<|im_start|>user"),
# nothing that could be a second answer ("... I hope it is correct. Or 43" is not credited as 42).
_HOPE_TAIL = re.compile(r"(?:[\s.!]|<\|[a-z_]*+\|>(?:user|assistant|system)?|</s>)*+", re.IGNORECASE)
# What may stand between boxes that form one list answer ("\boxed{1}, \boxed{2}", "$\boxed{-2}$ and
# $\boxed{1}$", "\boxed{1} \quad \text{and} \quad \boxed{2}"): on one line, nothing but commas,
# "and" / "or", spacing and math delimiters.
_BOX_GLUE = re.compile(
    r"(?:[ \t,;~$]|\\[,;:! ()\[\]]|\\q?quad(?![a-zA-Z])|\\text\s*\{[ \t]*(?:and|or)?[ \t]*\}|(?<![a-zA-Z])(?:and|or)(?![a-zA-Z]))*+"
)


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


def _boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every complete, non-empty ``\\boxed{...}`` / ``\\fbox{...}``, in
    order of their start (``end``: the position after the closing brace)."""
    starts = [(m.start(), m.end() - 1) for m in _BOX_START.finditer(text)]
    if not starts:
        return []
    pairs = _brace_pairs(text)
    found: list[tuple[int, int, str]] = []
    for start, open_pos in starts:
        close = pairs.get(open_pos)
        if close is not None and text[open_pos + 1 : close].strip():
            found.append((start, close + 1, text[open_pos + 1 : close].strip()))
    return found


def _last_boxed(text: str, boxes: list[tuple[int, int, str]]) -> str:
    """The last box's content, joined with the boxes right before it that form one list with it
    (only :data:`_BOX_GLUE` between them): "\\boxed{1}, \\boxed{2}" gives "1, 2"."""
    i = len(boxes) - 1
    while i > 0 and boxes[i - 1][1] <= boxes[i][0] and _BOX_GLUE.fullmatch(text, boxes[i - 1][1], boxes[i][0]):
        i -= 1
    return ", ".join(content for _, _, content in boxes[i:])


def find_boxed(text: str) -> list[str]:
    """The contents of every complete ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, in order.

    Nested braces are kept (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); unclosed or empty
    boxes are skipped. Occurrences are ordered by where they start, so for
    ``\\boxed{\\boxed{5}}`` the inner ``5`` comes last. Linear time.
    """
    return [content for _, _, content in _boxes(text)]


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
    inner = value[m.end() :]
    hope = _HOPE.search(inner)
    if hope:
        if not _HOPE_TAIL.fullmatch(inner, hope.end()):
            return value  # more text after it: a sentence, not an answer (the word guard decides)
        inner = inner[: hope.start()]
    value = inner.strip()
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
       wins, line or box, whichever the response gives later. Boxes in a row on one line, with
       only commas, "and" / "or" or spacing between them, are one list answer: ``\\boxed{1},
       \\boxed{2}`` gives ``1, 2`` (compared as a whole, so it is never credited as 1 or as 2).
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
            return _last_boxed(response, boxes)
        line_boxes = _boxes(value)
        value = _last_boxed(value, line_boxes) if line_boxes else _unphrase(value)
        if value:
            return value
    if boxes:
        return _last_boxed(response, boxes)
    return None
