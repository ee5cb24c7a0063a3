"""Render slides in a real Chromium inside a sandbox and measure their layout (`measure.js`).

The agent's HTML is hostile input, so it is never rendered by a host process: `render_deck`
writes the deck into a sandbox (local bubblewrap or docker, no network; see
envs/browser/sandbox.py) and runs `render.js` there with the sandbox's Node.js and Chromium.
Besides the layout, each required phrase is located and judged from screenshots: how many
pixels its own glyphs change on screen (render.js, unpaint.js).
One browser renders the whole deck (its start-up is most of the cost); each slide gets a
fresh context sized to the slide, with JavaScript off and every request aborted (a slide is
static HTML and CSS; data: URLs still work), so a slide can neither run code nor reach
anything, and the browser itself sits in a sandbox that holds only the deck.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.envs.browser.chromium import LAUNCH_ARGS, BrowserUnavailable
from envhub.envs.browser.sandbox import paths_in
from envhub.envs.environment import EnvFailure
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import SandboxFileError

HERE = Path(__file__).parent
RENDER_DIR = ".render"  # in the sandbox's workdir: render.js, measure.js, job.json, slides
SCRIPTS = ("render.js", "measure.js", "unpaint.js")
RENDER_TIMEOUT_MS = 15_000  # one slide: load, measure, screenshots
CLOSE_S = 3  # closing a slide's context, which render.js waits for at most 2 s
LAUNCH_TIMEOUT_S = 60.0  # Node and Chromium starting, on a loaded machine
MAX_SLIDE_BYTES = 256 << 10


@dataclass
class Measurement:
    """What one slide looks like once rendered (measure.js's answer)."""

    text: str = ""  # the slide's visible text, whitespace collapsed
    texts: list[dict[str, Any]] = field(default_factory=list)  # text groups: font, rects, problems
    overlaps: list[dict[str, Any]] = field(default_factory=list)
    overflow: list[str] = field(default_factory=list)
    # per required phrase: {phrase, chars, found: [{rects, font_px, opacity, problems, ink_px}]}
    phrases: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None  # the slide could not be rendered (too big, timed out, crashed)
    broke: bool = False  # it made the browser fail (timed out, crashed its page), not too big
    render_ms: float = 0.0  # in the warm browser: fresh context, load, measure, screenshots
    ink_ms: float = 0.0  # of which the screenshots and their pixels (required phrases)


@dataclass
class DeckRender:
    slides: list[Measurement]
    launch_ms: float  # starting Chromium in the sandbox (once per deck)


async def render_deck(sandbox: Sandbox, htmls: list[str | None], width: int, height: int,
                      phrases: Sequence[str] = ()) -> DeckRender:
    """Measure every slide of `htmls` (None: a slide too large to read) at width x height in
    one browser inside `sandbox`, and where each of `phrases` shows. A slide's own fault is its
    Measurement's error; EnvFailure when the browser fails (whose fault: see env.verify)."""
    try:
        paths = paths_in(str(getattr(sandbox, "kind", "")))
    except BrowserUnavailable as e:
        raise EnvFailure(str(e)) from None
    files: list[str | None] = []
    for number, html in enumerate(htmls, 1):
        data = html.encode() if html is not None else b""
        if html is None or len(data) > MAX_SLIDE_BYTES:
            files.append(None)
            continue
        files.append(f"slide{number}.html")
        await sandbox.write_file(f"{RENDER_DIR}/slide{number}.html", data)
    job = {"slides": files, "width": width, "height": height, "args": LAUNCH_ARGS,
           "timeout_ms": RENDER_TIMEOUT_MS, "phrases": list(phrases)}
    await sandbox.write_file(f"{RENDER_DIR}/job.json", json.dumps(job).encode())
    for name in SCRIPTS:
        await sandbox.write_file(f"{RENDER_DIR}/{name}", (HERE / name).read_bytes())
    workdir = getattr(sandbox, "workdir", "/workspace")
    result = await sandbox.exec(
        f"{paths.node} {RENDER_DIR}/render.js {workdir}/{RENDER_DIR}", env=paths.env(),
        timeout=LAUNCH_TIMEOUT_S + len(htmls) * (RENDER_TIMEOUT_MS / 1000 + CLOSE_S))
    too_big = Measurement(error=f"slide is larger than {MAX_SLIDE_BYTES >> 10} KiB")
    try:
        if result.exit_code != 0:
            raise SandboxFileError("render.js failed")
        answer = json.loads(await sandbox.read_file(f"{RENDER_DIR}/measurements.json"))
        slides = [Measurement(**m) if m is not None else too_big for m in answer["slides"]]
        if len(slides) != len(htmls):
            raise ValueError("one measurement per slide")
        return DeckRender(slides, float(answer["launch_ms"]))
    except (SandboxFileError, ValueError, TypeError, KeyError):
        raise EnvFailure(f"Chromium failed while rendering in the {paths.kind} sandbox (exit "
                         f"{result.exit_code}{', timed out' if result.timed_out else ''}): "
                         f"{result.stderr.strip()[-500:]}") from None
