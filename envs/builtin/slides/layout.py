"""Layout checks over rendered slides, each a score in [0, 1] (1 = no problem).

Per slide (score = share of slides without the problem): `overflow` (the content is larger
than the slide or a box sticks out of it), `clipped` (text cut by a clipping box or placed
off the slide), `overlap` (two text blocks drawn over each other), `min_font` (text smaller
than the brief's minimum). Per deck: `slide_count` (the number of slides asked for) and
`required_content` (share of the brief's required phrases found in the deck's visible text).
A slide that cannot be rendered fails every per-slide check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from envhub.envs.builtin.slides.render import Measurement

CHECKS = ("overflow", "clipped", "overlap", "min_font", "slide_count", "required_content")
MAX_DETAILS = 5  # problems listed per check (the score counts them all)


@dataclass
class Brief:
    """What a task asks for (its row in data/tasks.jsonl)."""

    slide_count: int
    width: int = 1280
    height: int = 720
    min_font_px: float = 18.0
    required: list[str] = field(default_factory=list)  # phrases the deck must show


@dataclass
class LayoutReport:
    scores: dict[str, float]  # check -> [0, 1]
    details: dict[str, list[str]]  # check -> what failed, for people and for the agent

    @property
    def outcome(self) -> float:
        return sum(self.scores.values()) / len(self.scores)

    @property
    def passed(self) -> bool:
        return all(score == 1.0 for score in self.scores.values())

    def summary(self) -> str:
        lines = [f"{check}: {self.scores[check]:.2f}" + (
            "  (" + "; ".join(self.details[check]) + ")" if self.details[check] else "")
            for check in CHECKS]
        return "\n".join(lines)


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def slide_problems(m: Measurement, brief: Brief) -> dict[str, list[str]]:
    """check -> problems of one slide (empty lists: the slide passes)."""
    if m.error:
        return {check: [m.error] for check in CHECKS[:4]}
    texts: list[dict[str, Any]] = m.texts
    return {
        "overflow": list(m.overflow),
        "clipped": [f"{t['el']} {t['text'][:30]!r}: {', '.join(t['problems'])}"
                    for t in texts if t["problems"]],
        "overlap": [f"{o['a']} and {o['b']} ({o['area_px']} px²)" for o in m.overlaps],
        "min_font": [f"{t['el']} {t['text'][:30]!r} at {t['font_px']:g}px"
                     for t in texts if t["font_px"] < brief.min_font_px],
    }


def score_deck(slides: list[Measurement], brief: Brief) -> LayoutReport:
    scores: dict[str, float] = {}
    details: dict[str, list[str]] = {check: [] for check in CHECKS}
    per_slide = [slide_problems(m, brief) for m in slides]
    for check in CHECKS[:4]:
        bad = [i for i, problems in enumerate(per_slide) if problems[check]]
        scores[check] = 1.0 - len(bad) / len(slides) if slides else 0.0
        details[check] = [f"slide {i + 1}: {p}" for i in bad for p in per_slide[i][check]]
    n, want = len(slides), brief.slide_count
    scores["slide_count"] = max(0.0, 1.0 - abs(n - want) / want)
    if n != want:
        details["slide_count"] = [f"{n} slides, the brief asks for {want}"]
    deck_text = _normalise(" ".join(m.text for m in slides))
    missing = [p for p in brief.required if _normalise(p) not in deck_text]
    scores["required_content"] = (1.0 - len(missing) / len(brief.required)
                                  if brief.required else 1.0)
    details["required_content"] = [f"missing {p!r}" for p in missing]
    return LayoutReport(scores, {k: v[:MAX_DETAILS] for k, v in details.items()})
