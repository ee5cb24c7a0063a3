"""Language mixing: a second writing system inside one answer (a process signal of the agent)."""

from __future__ import annotations

import re
import unicodedata

_CODE_RE = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)
_SCRIPT_GROUPS = {
    "CJK": "cjk", "HIRAGANA": "cjk", "KATAKANA": "cjk", "HANGUL": "hangul", "LATIN": "latin",
    "CYRILLIC": "cyrillic", "GREEK": "greek", "ARABIC": "arabic", "HEBREW": "hebrew",
    "DEVANAGARI": "devanagari", "THAI": "thai",
}


def scripts_of(text: str) -> dict[str, int]:
    """Letter counts per writing system, ignoring code spans (identifiers are not language)."""
    counts: dict[str, int] = {}
    for ch in _CODE_RE.sub(" ", text):
        if not ch.isalpha():
            continue
        first = unicodedata.name(ch, "").split(" ")[0]
        script = _SCRIPT_GROUPS.get(first, "other")
        counts[script] = counts.get(script, 0) + 1
    return counts


def mixes_languages(text: str, min_letters: int = 4, min_share: float = 0.1) -> bool:
    """True when a second writing system holds at least `min_letters` letters and `min_share`
    of all letters: the model switched language mid-answer (e.g. English with Chinese)."""
    counts = scripts_of(text)
    total = sum(counts.values())
    if len(counts) < 2 or total == 0:
        return False
    minority = sorted(counts.values(), reverse=True)[1]
    return minority >= min_letters and minority / total >= min_share
