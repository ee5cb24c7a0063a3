"""`slides`: the gold decks pass every layout check in a real Chromium, and a deck broken in
one way scores lower on exactly that check (one test per check)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from envhub.envs.builtin.slides.env import SLIDES_DIR, slide_path
from envhub.envs.builtin.slides.layout import CHECKS
from envhub.envs.builtin.slides.render import SlideRenderer
from envhub.envs.environment import RunContext, Task, Verdict
from envhub.envs.loader import load_env
from envhub.envs.runner.memory_sandbox import MemorySandbox
from tests.support import require_browser

pytestmark = pytest.mark.browser

LOADED = load_env("slides")
ENV = LOADED.env
TASKS = {t.id: t for t in ENV.load_tasks()}
GOLD = LOADED.folder / "data" / "solutions"


def ctx(tmp_path: Path) -> RunContext:
    async def open_sandbox(spec):  # kind = "none": the runner's in-process file store
        return MemorySandbox()
    return RunContext(run_id="test-slides", sandbox_kind="none", open_sandbox=open_sandbox,
                      scratch=tmp_path)


async def grade(task: Task, deck: list[str], tmp_path: Path) -> Verdict:
    sandbox = await ENV.setup(task, ctx(tmp_path))
    for number, html in enumerate(deck, 1):
        await sandbox.write_file(slide_path(number), html.encode())
    return await ENV.verify(task, sandbox, ctx(tmp_path))


def gold_deck(task_id: str) -> list[str]:
    files = sorted((GOLD / task_id).glob("slide*.html"), key=lambda p: int(p.stem[5:]))
    return [p.read_text() for p in files]


@pytest.mark.slow
def test_oracle_solves_every_task(tmp_path):
    require_browser()

    async def main() -> None:
        assert len(TASKS) >= 4
        for task in TASKS.values():
            sandbox = await ENV.setup(task, ctx(tmp_path))
            await ENV.solve(task, sandbox, ctx(tmp_path))
            verdict = await ENV.verify(task, sandbox, ctx(tmp_path))
            assert verdict.resolved and verdict.outcome == 1.0, (task.id, verdict.info)
            assert verdict.info["checks"] == dict.fromkeys(CHECKS, 1.0)
            assert verdict.signals == []
            empty = await ENV.verify(task, await ENV.setup(task, ctx(tmp_path)), ctx(tmp_path))
            assert empty.outcome == 0.0 and not empty.resolved  # no slides: nothing passes
    asyncio.run(main())


def _insert(html: str, fragment: str) -> str:
    return html.replace("</body>", fragment + "\n</body>")


# check -> how the gold deck of quarterly-update (3 slides) is broken for it
BREAKAGES: dict[str, Callable[[list[str]], list[str]]] = {
    # a box (no text) wider than the slide
    "overflow": lambda d: [_insert(d[0], '<div style="width:1500px;height:40px;'
                                         'background:#ccc"></div>'), *d[1:]],
    # text in a box too small for it, which hides the rest
    "clipped": lambda d: [d[0], _insert(d[1], '<div style="height:30px;overflow:hidden">'
                          '<p>A long note that wraps onto several lines and is cut off by '
                          'the box around it, so half of it is never seen</p></div>'), d[2]],
    # a paragraph positioned on top of the title
    "overlap": lambda d: [_insert(d[0], '<p style="position:absolute;top:70px;left:90px">'
                                        'Drawn over the title</p>'), *d[1:]],
    # one paragraph in 10px type
    "min_font": lambda d: [d[0], d[1], _insert(d[2], '<p style="font-size:10px">'
                                                     'Fine print</p>')],
    # one slide more than asked for
    "slide_count": lambda d: [*d, d[2]],
    # a required phrase reworded
    "required_content": lambda d: [d[0], d[1].replace("3 new offices", "three new sites"),
                                   d[2]],
}


@pytest.mark.parametrize("check", CHECKS)
def test_broken_layout_scores_lower_on_its_check(check, tmp_path):
    require_browser()
    assert set(BREAKAGES) == set(CHECKS)
    task = TASKS["quarterly-update"]
    gold = asyncio.run(grade(task, gold_deck(task.id), tmp_path))
    broken = asyncio.run(grade(task, BREAKAGES[check](gold_deck(task.id)), tmp_path))
    assert gold.info["checks"][check] == 1.0
    assert broken.info["checks"][check] < 1.0, broken.info
    assert broken.outcome < gold.outcome and not broken.resolved
    # only that check moved: each breakage is specific
    others = {c: s for c, s in broken.info["checks"].items() if c != check}
    assert others == dict.fromkeys(others, 1.0), broken.info["details"]
    # and it is a process signal worth what the check lost
    [signal] = broken.signals
    assert signal.name == f"layout_{check}"
    assert signal.value == pytest.approx(1.0 - broken.info["checks"][check])
    assert broken.info["details"][check]  # the report says what is wrong


def test_scripts_and_network_do_not_run_while_grading(tmp_path):
    """JavaScript is off (a script moving the title off the slide changes nothing) and
    requests are refused at once (an image on an unreachable host neither loads nor hangs)."""
    require_browser()
    task = TASKS["square-poster"]
    [html] = gold_deck(task.id)
    sneaky = _insert(html, "<script>document.querySelector('h1').style.marginLeft='5000px'"
                           "</script><img src='http://192.0.2.1/x.png' width=10 height=10>")
    verdict = asyncio.run(grade(task, [sneaky], tmp_path))
    assert verdict.resolved, verdict.info


def test_a_slide_that_cannot_render_fails_its_checks_without_error(tmp_path):
    require_browser()

    async def main() -> None:
        async with SlideRenderer() as renderer:
            huge = await renderer.measure("<p>" + "x" * (300 << 10), 1280, 720)
            plain = await renderer.measure("just text, no tags", 1280, 720)
        assert huge.error and "KiB" in huge.error
        assert plain.error is None and plain.text == "just text, no tags"
    asyncio.run(main())
    task = TASKS["onboarding"]
    verdict = asyncio.run(grade(task, ["<p>" + "x" * (300 << 10), gold_deck(task.id)[1]],
                                tmp_path))
    assert verdict.info["checks"]["overflow"] == 0.5 and not verdict.resolved


def test_tools_write_slides_and_report_the_layout(tmp_path):
    require_browser()
    task = TASKS["square-poster"]

    async def main() -> None:
        sandbox = await ENV.setup(task, ctx(tmp_path))
        call = lambda name, args: ENV.call_tool(task, name, args, sandbox, {})  # noqa: E731
        for bad in ('{"number": 0, "html": "<p>x</p>"}', '{"number": 1}', "[1]", "{oops"):
            result = await call("write_slide", bad)
            assert result.is_error, bad
            assert any(w in result.content for w in ("number", "html", "JSON")), bad
        ok = await call("write_slide", '{"number": 1, "html": "<p style=\\"font-size:8px\\">'
                                       'hi</p>"}')
        assert not ok.is_error
        assert (await sandbox.read_file(f"{SLIDES_DIR}/slide1.html")).startswith(b"<p")
        report = (await call("check_slides", "{}")).content
        assert re.search(r"min_font: 0\.00 .*8px", report), report
        assert "required_content: 0.00" in report
    asyncio.run(main())
