"""Layout checks over rendered slides, each a score in [0, 1] (1 = no problem).

Per slide (score = share of slides without the problem): `overflow` (the content is larger
than the slide or a box sticks out of it), `clipped` (text cut by a clipping box or placed
off the slide), `overlap` (two text blocks drawn over each other), `min_font` (text smaller
than the brief's minimum). Per deck: `slide_count` (the number of slides asked for) and
`required_content` (share of the brief's required phrases the rendered deck shows).

Sizes are what the screen shows (computed size times every scale and zoom above the text), and
a phrase counts as shown only where the page draws it (see `shown`): text the HTML holds but the
render hides (shrunk, covered, clipped, faded, off the slide, the colour of its background) does
not count. The outcome is the share of phrases shown times the mean of the other checks, so a
deck that shows none of the brief scores 0 however clean its empty layout is.
A slide that cannot be rendered fails every per-slide check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from envhub.envs.builtin.slides.render import Measurement

CHECKS = ("overflow", "clipped", "overlap", "min_font", "slide_count", "required_content")
MAX_DETAILS = 5  # problems listed per check (the score counts them all)
# A phrase's glyphs change at least this share of (characters x font size^2) pixels on screen;
# honest text in the gold decks changes 0.10 to 0.20 of it (bold headings the most).
MIN_INK = 0.03
MIN_OPACITY = 0.25  # the product of the opacities above the text
NO_INK = "no glyphs on screen (covered, clipped, faded or the colour of its background)"


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
        """Share of required phrases shown times the mean of the layout checks."""
        layout = [score for check, score in self.scores.items() if check != "required_content"]
        return self.scores["required_content"] * sum(layout) / len(layout)

    @property
    def passed(self) -> bool:
        return all(score == 1.0 for score in self.scores.values())

    def summary(self) -> str:
        lines = [f"{check}: {self.scores[check]:.2f}" + (
            "  (" + "; ".join(self.details[check]) + ")" if self.details[check] else "")
            for check in CHECKS]
        return "\n".join(lines)


def _num(value: Any) -> float:
    """A number measure.js reported; anything else (null for NaN: a slide whose form fields
    shadow the DOM's own properties) counts as 0, so it fails its check instead of grading."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else 0.0


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
        "min_font": [f"{t['el']} {t['text'][:30]!r} at {_num(t['font_px']):g}px"
                     for t in texts if _num(t["font_px"]) < brief.min_font_px],
    }


def score_deck(slides: list[Measurement], brief: Brief) -> LayoutReport:
    """Every check of `slides`, measured with the brief's required phrases (render_deck's
    `phrases`: a measurement without them cannot say what the deck shows)."""
    for m in slides:
        if not m.error and len(m.phrases) != len(brief.required):
            raise ValueError(f"slides measured for {len(m.phrases)} phrases, the brief has "
                             f"{len(brief.required)}: pass brief.required to render_deck")
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
    missing = [why for i, phrase in enumerate(brief.required)
               if (why := unshown(i, phrase, slides, brief))]
    scores["required_content"] = (1.0 - len(missing) / len(brief.required)
                                  if brief.required else 1.0)
    details["required_content"] = missing
    return LayoutReport(scores, {k: v[:MAX_DETAILS] for k, v in details.items()})


def unshown(index: int, phrase: str, slides: list[Measurement], brief: Brief) -> str | None:
    """None when some slide shows the brief's `index`th phrase, else why not (the first place
    it is written, or that it is written nowhere)."""
    places = [(int(_num(p["chars"])), f) for m in slides if not m.error
              for p in [m.phrases[index]] for f in p["found"]]
    reasons = [why_not(chars, f, brief.min_font_px) for chars, f in places]
    if any(not r for r in reasons):
        return None
    return f"{phrase!r} not shown: {'; '.join(reasons[0])}" if reasons else f"missing {phrase!r}"


def why_not(chars: int, place: dict[str, Any], min_font: float) -> list[str]:
    """What keeps one place a phrase is written from showing it (empty: shown). Geometry
    (off the slide, cut by a clipping box, drawn over other text), the on-screen font size
    (stops scale(), zoom), the accumulated opacity, and the pixels its glyphs change in the
    screenshot (stops covering, clip-path, masks, filters, colour of the background)."""
    reasons = list(place["problems"])
    font, opacity = _num(place["font_px"]), _num(place["opacity"])
    if font < min_font:
        reasons.append(f"{font:g}px on screen (the brief's minimum is {min_font:g}px)")
    if opacity < MIN_OPACITY:
        reasons.append(f"faded to opacity {opacity:g}")
    ink, need = _num(place.get("ink_px")), MIN_INK * chars * max(font, min_font) ** 2
    if ink < need:
        reasons.append(NO_INK if ink == 0 else
                       f"its glyphs change {ink:.0f} pixels on screen, {need:.0f} expected")
    return reasons
