"""`slides`: the gold decks pass every layout check in a real Chromium inside a sandbox (local
bubblewrap and docker, with the same scores), a deck broken in one way scores lower on exactly
that check (one test per check), and a slide reaches neither host files nor the network."""

from __future__ import annotations

import asyncio
import re
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envhub.envs.browser.sandbox import paths_in
from envhub.envs.builtin.slides.env import SLIDES_DIR, brief_of, slide_path
from envhub.envs.builtin.slides.layout import CHECKS, score_deck
from envhub.envs.builtin.slides.render import render_deck
from envhub.envs.environment import EnvFailure, RunContext, Task, Verdict
from envhub.envs.loader import load_env
from envhub.envs.sandbox.errors import SandboxUnavailable
from envhub.envs.sandbox.kinds import PLAIN, check_supported
from tests.envs.browser_boxes import KINDS, Boxes, require_kind

pytestmark = pytest.mark.browser

LOADED = load_env("slides")
ENV = LOADED.env
TASKS = {t.id: t for t in ENV.load_tasks()}
GOLD = LOADED.folder / "data" / "solutions"


async def grade(task: Task, deck: list[str], ctx: RunContext) -> Verdict:
    sandbox = await ENV.setup(task, ctx)
    for number, html in enumerate(deck, 1):
        await sandbox.write_file(slide_path(number), html.encode())
    return await ENV.verify(task, sandbox, ctx)


def grade_in(kind: str, task: Task, deck: list[str], tmp_path: Path) -> Verdict:
    async def main() -> Verdict:
        boxes = Boxes(LOADED, kind, tmp_path)
        try:
            return await grade(task, deck, boxes.ctx)
        finally:
            await boxes.close()
    return asyncio.run(main())


def gold_deck(task_id: str) -> list[str]:
    files = sorted((GOLD / task_id).glob("slide*.html"), key=lambda p: int(p.stem[5:]))
    return [p.read_text() for p in files]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_oracle_solves_every_task(kind, tmp_path):
    require_kind(kind)

    async def main() -> None:
        boxes = Boxes(LOADED, kind, tmp_path)
        try:
            assert len(TASKS) >= 4
            for task in TASKS.values():
                sandbox = await ENV.setup(task, boxes.ctx)
                assert sandbox.kind == kind
                await ENV.solve(task, sandbox, boxes.ctx)
                verdict = await ENV.verify(task, sandbox, boxes.ctx)
                assert verdict.resolved and verdict.outcome == 1.0, (task.id, verdict.info)
                assert verdict.info["checks"] == dict.fromkeys(CHECKS, 1.0)
                assert verdict.signals == []
                empty = await ENV.verify(task, await ENV.setup(task, boxes.ctx), boxes.ctx)
                assert empty.outcome == 0.0 and not empty.resolved  # no slides: nothing passes
        finally:
            await boxes.close()
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
    require_kind("local")
    assert set(BREAKAGES) == set(CHECKS)
    task = TASKS["quarterly-update"]
    gold = grade_in("local", task, gold_deck(task.id), tmp_path)
    broken = grade_in("local", task, BREAKAGES[check](gold_deck(task.id)), tmp_path)
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
    require_kind("local")
    task = TASKS["square-poster"]
    [html] = gold_deck(task.id)
    sneaky = _insert(html, "<script>document.querySelector('h1').style.marginLeft='5000px'"
                           "</script><img src='http://192.0.2.1/x.png' width=10 height=10>")
    verdict = grade_in("local", task, [sneaky], tmp_path)
    assert verdict.resolved, verdict.info


def test_a_slide_that_cannot_render_fails_its_checks_without_error(tmp_path):
    require_kind("local")
    task = TASKS["onboarding"]

    async def main() -> None:
        boxes = Boxes(LOADED, "local", tmp_path)
        try:
            sandbox = await ENV.setup(task, boxes.ctx)
            deck = await render_deck(sandbox, ["<p>" + "x" * (300 << 10), "just text, no tags"],
                                     1280, 720)
        finally:
            await boxes.close()
        huge, plain = deck.slides
        assert huge.error and "KiB" in huge.error
        assert plain.error is None and plain.text == "just text, no tags"
    asyncio.run(main())
    verdict = grade_in("local", task, ["<p>" + "x" * (300 << 10), gold_deck(task.id)[1]],
                       tmp_path)
    assert verdict.info["checks"]["overflow"] == 0.5 and not verdict.resolved


def test_tools_write_slides_and_report_the_layout(tmp_path):
    require_kind("local")
    task = TASKS["square-poster"]

    async def main() -> None:
        boxes = Boxes(LOADED, "local", tmp_path)
        try:
            await calls(boxes.ctx)
        finally:
            await boxes.close()

    async def calls(ctx: RunContext) -> None:
        sandbox = await ENV.setup(task, ctx)
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


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.bwrap
def test_docker_and_local_sandboxes_score_alike(tmp_path):
    """The same decks (gold and each breakage) get the same report in both kinds: the docker
    image has Debian's Chromium and the host's fonts."""
    require_kind("local")
    require_kind("docker")
    task = TASKS["quarterly-update"]
    brief = brief_of(task.data)
    decks = {"gold": gold_deck(task.id),
             **{check: breakage(gold_deck(task.id)) for check, breakage in BREAKAGES.items()}}

    async def reports(kind: str) -> dict[str, object]:
        boxes = Boxes(LOADED, kind, tmp_path)
        try:
            sandbox = await ENV.setup(task, boxes.ctx)
            out = {}
            for name, deck in decks.items():
                report = score_deck((await render_deck(sandbox, deck, brief.width,
                                                       brief.height, brief.required)).slides,
                                    brief)
                out[name] = (report.scores, report.details)
            return out
        finally:
            await boxes.close()
    local, docker = asyncio.run(reports("local")), asyncio.run(reports("docker"))
    assert local["gold"][0] == dict.fromkeys(CHECKS, 1.0)  # type: ignore[index]
    assert docker == local


SQUARE = ('<svg xmlns="http://www.w3.org/2000/svg" width="400" height="400">'
          '<rect width="400" height="400" fill="red"/></svg>')


class Recorder(BaseHTTPRequestHandler):
    """Answers everything (a big image, a page, a style sheet shrinking all text) and records
    the paths asked for: a slide that reached it would show it in the layout."""

    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.hits.append(self.path)
        kind, body = (("image/svg+xml", SQUARE) if self.path.endswith(".svg") else
                      ("text/css", "p { font-size: 5px }") if self.path.endswith(".css") else
                      ("text/html", "<p>SERVED-PAGE</p>"))
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("kind", KINDS)
def test_a_slide_reaches_neither_host_files_nor_the_network(kind, tmp_path):
    """Host files (a big image and a secret in /var/tmp, which local sandboxes see, and
    /etc/passwd) and a server on the host's loopback: nothing is requested, nothing shows."""
    require_kind(kind)
    task = TASKS["square-poster"]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    Recorder.hits = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with tempfile.TemporaryDirectory(dir="/var/tmp") as host:
        (Path(host) / "big.svg").write_text(SQUARE)
        (Path(host) / "secret.txt").write_text("HOST-SECRET")
        [html] = gold_deck(task.id)
        sneaky = _insert(html, f"""
<link rel="stylesheet" href="{url}/style.css">
<img src="file:///etc/passwd" style="position:absolute;left:0;top:0">
<img src="file://{host}/big.svg" style="position:absolute;left:1000px;top:0">
<img src="{url}/big.svg" style="position:absolute;left:1000px;top:500px">
<iframe src="{url}/page" style="position:absolute;left:0;top:0;border:0"></iframe>
<iframe src="file://{host}/secret.txt" style="position:absolute;left:0;top:0;border:0">
</iframe><object data="file://{host}/secret.txt" type="text/plain"
  style="position:absolute;left:0;top:0;width:50px;height:50px"></object>
<div style="position:absolute;left:0;top:0;width:20px;height:20px;
  background:url({url}/bg.svg)"></div>""")
        try:
            verdict = grade_in(kind, task, [sneaky], tmp_path)
            fetch = (f"require('http').get('{url}/probe', (r) => r.pipe(process.stdout))"
                     ".on('error', (e) => console.log(e.code))")
            seen = asyncio.run(sandbox_sees(
                kind, f'cat {host}/secret.txt; {paths_in(kind).node} -e "{fetch}"',
                tmp_path))
        finally:
            server.shutdown()
    # the sandbox Chromium runs in sees neither the host's files nor its loopback
    assert "HOST-SECRET" not in seen and "SERVED" not in seen, seen
    assert "No such file" in seen and ("ECONNREFUSED" in seen or "ENETUNREACH" in seen), seen
    assert Recorder.hits == []  # nothing requested
    # nothing shown: a 400px image at x=1000 would stick out of the 1080px slide, the style
    # sheet would shrink the text below the minimum font size
    assert verdict.resolved and verdict.info["checks"] == dict.fromkeys(CHECKS, 1.0), verdict.info
    assert "HOST-SECRET" not in str(verdict.info) and "SERVED" not in str(verdict.info)


async def sandbox_sees(kind: str, command: str, tmp_path: Path) -> str:
    """What `command` prints in a sandbox of the kind slides renders in."""
    boxes = Boxes(LOADED, kind, tmp_path)
    try:
        sandbox = await boxes.open(await ENV.spec(boxes.ctx))
        result = await sandbox.exec(command, timeout=60)
        return result.stdout + result.stderr
    finally:
        await boxes.close()


def test_refused_where_no_sandbox_can_run_the_browser(tmp_path):
    """Neither docker nor bubblewrap (a local sandbox would be plain processes), or a kind
    without Chromium: refused with the fix before anything is opened."""
    supported = LOADED.manifest.sandbox.supported_kinds
    with pytest.raises(SandboxUnavailable, match=r"apt-get install bubblewrap.*--sandbox docker"):
        check_supported("slides", supported, PLAIN)
    with pytest.raises(SandboxUnavailable, match="docker or local"):
        check_supported("slides", supported, "e2b")

    async def never(spec):
        raise AssertionError("no sandbox may be opened")
    ctx = RunContext(run_id="t", sandbox_kind="e2b", open_sandbox=never, scratch=tmp_path)
    with pytest.raises(EnvFailure, match="--sandbox local or --sandbox docker"):
        asyncio.run(ENV.setup(TASKS["square-poster"], ctx))
