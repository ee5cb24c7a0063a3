"""`slides` grades what the rendered slide shows, not what its CSS claims: decks that put every
required phrase in the HTML but show none of it (issue 25, class 3) score 0, while honest
styling (a gradient, a shadow, a scaled or faded title that stays legible) still passes.

Each cheat below but the last passed every check of the old grader (computed styles and
innerText): all six checks at 1.0 (the last lost only its overlap check). Now a required phrase
counts only where its own glyphs change the screenshot (inside the slide, not covered, not
clipped, not faded, not the colour of what lies under it) at an on-screen size of at least the
brief's minimum, and the outcome is the share of phrases shown times the mean of the layout
checks. A slide that hangs the grader's browser scores 0 with ungradable_output."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from envhub.envs.builtin.slides.layout import CHECKS
from envhub.envs.environment import UNGRADABLE
from tests.envs.browser_boxes import Boxes, require_kind
from tests.envs.test_slides import LOADED, TASKS, gold_deck, grade, grade_in

pytestmark = pytest.mark.browser

TASK = TASKS["quarterly-update"]  # 3 slides, 1280x720, min font 18px
PHRASES = "Q3 Update. Revenue up 12%. 3 new offices. Next quarter."
PAGE = ('<!doctype html><html><head><meta charset="utf-8"><style>html, body {{ margin: 0; '
        'width: 1280px; height: 720px; font-family: sans-serif; }}</style></head>'
        '<body{body}>{content}</body></html>')


def deck(content: str, body: str = ' style="background:#fff"') -> list[str]:
    """The cheat on slide 1, then two empty slides (the brief asks for three)."""
    return [PAGE.format(body=body, content=content)] + [PAGE.format(body="", content="")] * 2


CHEATS: dict[str, list[str]] = {
    # the filed cheat: one near-white div shrunk to 2% holding every phrase in 60px type
    "scale_0.02_near_white": deck(
        f'<div style="transform:scale(0.02);transform-origin:0 0;color:#fdfdfd;'
        f'font-size:60px;width:1280px">{PHRASES}</div>'),
    # legible text with an opaque box (no text of its own) laid over it
    "covered_by_opaque_box": deck(
        f'<p style="font-size:40px;margin:0;padding:100px">{PHRASES}</p>'
        f'<div style="position:absolute;left:0;top:0;width:1280px;height:720px;'
        f'background:#fff"></div>'),
    # huge type, cut away by clip-path (not overflow, which the old check read)
    "clip_path_inset_50": deck(
        f'<p style="font-size:48px;margin:0;padding:100px;clip-path:inset(50%)">{PHRASES}</p>'),
    # text the exact colour of the gradient it sits on
    "colour_of_background_gradient": deck(
        f'<p style="font-size:40px;margin:0;padding:100px;color:#2a5d9f">{PHRASES}</p>',
        body=' style="background:linear-gradient(90deg,#2a5d9f,#2a5d9f)"'),
    # an ancestor at opacity 0.01 (the old check read only the text's own element)
    "ancestor_opacity_0.01": deck(
        f'<div style="opacity:0.01"><p style="font-size:40px;margin:0;padding:100px">'
        f'{PHRASES}</p></div>'),
    # glyphs painted transparent while `color` still says black
    "transparent_text_fill": deck(
        f'<p style="font-size:40px;margin:0;padding:100px;-webkit-text-fill-color:transparent">'
        f'{PHRASES}</p>'),
    # zoom shrinks the text on screen while the computed font size stays large
    "zoom_0.02": deck(f'<div style="zoom:0.02"><p style="font-size:60px">{PHRASES}</p></div>'),
    # the phrases painted transparent under other, visible text: that text's ink is not theirs
    "under_other_text": deck(
        f'<p style="font-size:40px;margin:0;padding:100px;-webkit-text-fill-color:transparent">'
        f'{PHRASES}</p><p style="position:absolute;left:0;top:0;margin:0;padding:100px;'
        f'font-size:40px">{"Lorem ipsum dolor sit amet " * 3}</p>'),
}


@pytest.mark.parametrize("name", CHEATS)
def test_a_deck_that_hides_its_phrases_scores_zero(name, tmp_path):
    require_kind("local")
    verdict = grade_in("local", TASK, CHEATS[name], tmp_path)
    assert verdict.env_failure is None
    assert verdict.outcome == 0.0 and not verdict.resolved, (name, verdict.info)
    assert verdict.info["checks"]["required_content"] == 0.0, verdict.info
    details = verdict.info["details"]["required_content"]
    assert len(details) == 4 and all("not shown" in d for d in details), details
    assert any(s.name == "layout_required_content" and s.value == 1.0
               for s in verdict.signals)


@pytest.mark.docker
def test_the_filed_cheat_scores_zero_in_docker_too(tmp_path):
    """The docker sandbox (Debian's Chromium in the browser image) judges alike: the filed cheat
    and a covered deck score 0, the gold deck still 1."""
    require_kind("docker")
    for name in ("scale_0.02_near_white", "covered_by_opaque_box"):
        verdict = grade_in("docker", TASK, CHEATS[name], tmp_path)
        assert verdict.outcome == 0.0 and verdict.env_failure is None, (name, verdict.info)
    gold = grade_in("docker", TASK, gold_deck(TASK.id), tmp_path)
    assert gold.resolved and gold.outcome == 1.0, gold.info


def _restyle(html: str, css: str) -> str:
    return html.replace("</style>", css + "\n</style>")


# honest decorations the new checks must not punish: the gold deck of quarterly-update with
HONEST = {
    "gradient_and_shadow": "body { background: linear-gradient(135deg, #f7f9fc, #dde7f3); } "
                           "h1, h2 { text-shadow: 2px 2px 4px rgba(0,0,0,.3); }",
    "scaled_and_faded": "h1, h2 { transform: scale(0.8); transform-origin: 0 0; } "
                        "p { opacity: 0.7; }",
    "light_on_dark": "body { background: #1d2733; color: #f7f9fc; } h2 { color: #9cc3f5; }",
}


@pytest.mark.parametrize("name", HONEST)
def test_honest_styling_still_passes(name, tmp_path):
    require_kind("local")
    styled = [_restyle(html, HONEST[name]) for html in gold_deck(TASK.id)]
    verdict = grade_in("local", TASK, styled, tmp_path)
    assert verdict.resolved and verdict.outcome == 1.0, verdict.info
    assert verdict.info["checks"] == dict.fromkeys(CHECKS, 1.0)


# render.js with its first screenshot refused, as Chromium refused one in a loaded CI run
# ("Protocol error (Page.captureScreenshot): Unable to capture screenshot")
SHOT = "async function shot(page, clip) {"
REFUSED = ("let refused = false;\n" + SHOT + "\n  if (!refused) { refused = true; throw new "
           "Error('Protocol error (Page.captureScreenshot): Unable to capture screenshot'); }")


class FirstScreenshotFails:
    """A real sandbox whose render.js, as the grader writes it, refuses its first screenshot:
    the fault is injected into what runs in the sandbox, nothing of ours is replaced."""

    def __init__(self, box):
        self.box = box

    def __getattr__(self, name):
        return getattr(self.box, name)

    async def write_file(self, path, data, *args, **kwargs):
        if path.endswith("render.js"):
            assert SHOT.encode() in data, "render.js changed: update the fault"
            data = data.replace(SHOT.encode(), REFUSED.encode())
        return await self.box.write_file(path, data, *args, **kwargs)


def test_a_screenshot_the_grader_fails_once_is_retried_not_blamed_on_the_deck(tmp_path):
    """The grader's browser failing once on an honest deck (a refused screenshot, which a loaded
    machine gave) is retried in a fresh sandbox and graded from there: 1.0, with the retry
    counted, not 0 with ungradable_output."""
    require_kind("local")
    styled = [_restyle(html, HONEST["gradient_and_shadow"]) for html in gold_deck(TASK.id)]

    async def main():
        boxes = Boxes(LOADED, "local", tmp_path)
        opened = 0

        async def open_flaky(spec):
            nonlocal opened
            opened += 1
            box = await boxes.open(spec)
            return FirstScreenshotFails(box) if opened == 2 else box  # 1: the agent's

        ctx = dataclasses.replace(boxes.ctx, open_sandbox=open_flaky)
        try:
            return await grade(TASK, styled, ctx)
        finally:
            await boxes.close()

    verdict = asyncio.run(main())
    assert verdict.env_failure is None and not verdict.signals, verdict
    assert verdict.resolved and verdict.outcome == 1.0, verdict.info
    assert verdict.info["grader_retries"] == 1
    [failure] = verdict.info["grader_failures"]
    assert "Unable to capture screenshot" in failure, failure


def test_a_phrase_partly_covered_is_not_shown_but_the_rest_counts(tmp_path):
    """One phrase of four hidden under an opaque box: required_content 0.75, the outcome
    scaled by it (not the old mean of six checks), and the detail names the phrase."""
    require_kind("local")
    gold = gold_deck(TASK.id)
    # slide 2 shows "Revenue up 12%" as the first item of its list
    cover = ('<span style="position:absolute;left:0;top:0;right:0;bottom:0;'
             'background:#f7f9fc"></span>')
    [before, after] = gold[1].split("<li>Revenue up 12%")
    hidden = before + '<li style="position:relative">Revenue up 12%' + cover + after
    verdict = grade_in("local", TASK, [gold[0], hidden, gold[2]], tmp_path)
    assert verdict.info["checks"]["required_content"] == 0.75, verdict.info
    assert verdict.outcome == pytest.approx(0.75), verdict.info
    assert verdict.info["details"]["required_content"] == [
        "'Revenue up 12%' not shown: no glyphs on screen (covered, clipped, faded or the "
        "colour of its background)"], verdict.info


# a slide that keeps the grader's browser painting for minutes: stacked full-slide layers, each
# blurring what lies under it (about 210 KiB, under the 256 KiB a slide may hold)
HANGS = "<body>" + ('<div style="position:absolute;inset:0;backdrop-filter:blur(120px) '
                    'saturate(3);filter:blur(60px);background:rgba(255,0,0,.01)">Q3 Update'
                    '</div>') * 1500 + "</body>"


def test_a_slide_that_hangs_the_browser_scores_zero_not_env_failure(tmp_path):
    """The slide runs past its deadline while a blank slide of the grader's renders: the deck
    is what broke the browser, so 0 with ungradable_output (never env_failure, which training
    would drop), and the grading is bounded by the deadline, not the runner's."""
    require_kind("local")
    gold = gold_deck(TASK.id)
    started = time.monotonic()
    verdict = grade_in("local", TASK, [gold[0], HANGS, gold[2]], tmp_path)
    assert verdict.env_failure is None, verdict
    assert verdict.outcome == 0.0 and not verdict.resolved
    assert [s.name for s in verdict.signals] == [UNGRADABLE], verdict
    why = verdict.info["ungradable"]  # its deadline, or under load the renderer crashing first
    assert "slide 2" in why and ("timed out" in why or "crashed" in why), why
    assert verdict.info["grader_retries"] == 1  # it hung in the retry's fresh sandbox too
    assert time.monotonic() - started < 150  # two renders to their deadline, and the control


def test_a_browser_that_fails_on_its_own_is_env_failure_not_zero(tmp_path, monkeypatch):
    """The other side of the blame: a Chromium that cannot start fails the gold deck and the
    grader's blank slide alike, so it is the infrastructure (env_failure), never a 0."""
    require_kind("local")
    broken = tmp_path / "browser" / "chromium"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\necho 'this Chromium is broken' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("ENVHUB_CHROMIUM", str(broken))
    verdict = grade_in("local", TASK, gold_deck(TASK.id), tmp_path)
    assert verdict.env_failure and "a blank slide fails too" in verdict.env_failure, verdict
    assert not verdict.signals
