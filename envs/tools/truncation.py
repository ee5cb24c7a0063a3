"""Cutting long outputs the way mini-swe-agent does: keep the head and the tail."""

from __future__ import annotations

HEAD_CHARS = 5000
TAIL_CHARS = 5000


def cut_middle(text: str, head: int = HEAD_CHARS, tail: int = TAIL_CHARS) -> str:
    """`text` unchanged if it fits in head + tail chars, else head, a marker line saying how
    many characters were cut, and tail."""
    if len(text) <= head + tail:
        return text
    cut = len(text) - head - tail
    return (f"{text[:head]}\n[... {cut} characters cut from the middle of the output; "
            f"redirect to a file and view parts of it to see them ...]\n{text[-tail:]}")
