"""One line per finding for `concise`: what breaks, then the fix in a few words.

Derived from the finding itself, so every rule (and every rule added later) gets it: a message is
written as "what is wrong: why it breaks. How to fix it."; the short form keeps the first clause and
the fix (the fix's own title when it has one, else the message's last sentence, without its
parenthesised detail). `full` and `fsdplint rule CODE` keep the whole text.
"""

from __future__ import annotations

_OPEN, _CLOSE = "([{", ")]}"


def _top_level(text: str):
    """(index, char) of the characters outside brackets, quotes and backticks."""
    depth, quote = 0, None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in "`\"" or (ch == "'" and (i == 0 or not text[i - 1].isalnum())):
            quote = ch
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(depth - 1, 0)
        elif depth == 0:
            yield i, ch


def sentences(text: str) -> list[str]:
    """Sentences split at a top-level `. ` followed by a capital or a backtick."""
    out, start = [], 0
    for i, ch in _top_level(text):
        if ch == "." and text[i + 1:i + 2] == " " and (text[i + 2:i + 3].isupper() or text[i + 2:i + 3] == "`"):
            out.append(text[start:i + 1].strip())
            start = i + 2
    if text[start:].strip():
        out.append(text[start:].strip())
    return out


def _first_clause(sentence: str) -> str:
    for i, ch in _top_level(sentence):
        if ch in ":;" and sentence[i + 1:i + 2] == " ":
            return sentence[:i].rstrip()
    return sentence.rstrip(".")


def _drop_asides(text: str, before: str, at_end: bool) -> str:
    """`text` without the ` (...)` groups followed by one of `before` (or ending it, with `at_end`);
    a call's own parentheses (no space before them) stay."""
    keep, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "(" and i > 0 and text[i - 1] == " ":
            end = _matching(text, i)
            if end is not None and ((at_end and end + 1 == len(text)) or text[end + 1:end + 2] in tuple(before)):
                if keep and keep[-1] == " ":
                    keep.pop()
                i = end + 1
                continue
        keep.append(ch)
        i += 1
    return "".join(keep)


def _few_words(sentence: str) -> str:
    """A fix sentence without its asides: a ` (...)` group ending a clause, what follows ` — ` or `: `."""
    text = _drop_asides(sentence, ",.;:", at_end=True)
    dash = text.find(" \u2014 ")
    if dash > 0:
        text = text[:dash]
    return _first_clause(text).rstrip(" .,") or sentence


def _matching(text: str, start: int):
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j
    return None


def _condition(message: str) -> tuple[str, str]:
    """(message, its trailing ` (when ...)` condition): when a finding holds (a branch, a launch's flags)
    is part of what it says, so the short form keeps it."""
    if message.endswith(")"):
        start = message.rfind(" (when ")
        if start > 0 and _matching(message, start + 1) == len(message) - 1:
            return message[:start].rstrip(), message[start + 1:]
    return message, ""


def short_message(message: str, fix_title: str | None = None) -> str:
    first, sep, rest = message.partition("\n")
    if sep:  # a traceback asked for with -v follows the first line; it is kept whole
        return short_message(first, fix_title) + "\n" + rest
    message, cond = _condition(" ".join(message.split()))
    text = _short(message, fix_title)
    return f"{text} {cond}" if cond else text


def _short(message: str, fix_title: str | None) -> str:
    parts = sentences(message)
    if not parts:
        return message
    # Asides inside the first clause go; a trailing `(line 35)` that says where stays.
    what = _drop_asides(_first_clause(parts[0]), ",;", at_end=False)
    how = fix_title.rstrip(" .") if fix_title else (_few_words(parts[-1]) if len(parts) > 1 else "")
    if how and how.lower() not in what.lower():
        return f"{what}. {how}" + ("" if how.endswith(("?", "!")) else ".")
    return f"{what}."
