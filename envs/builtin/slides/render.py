"""Render slides in a real Chromium and measure their layout (`measure.js`).

One `SlideRenderer` is one browser; each slide gets a fresh context sized to the slide, with
JavaScript off and every request refused (a slide is static HTML and CSS; data: URLs still
work), so an agent's HTML can neither run code nor reach anything while it is graded.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.envs.browser.chromium import async_playwright, launch

MEASURE_JS = (Path(__file__).parent / "measure.js").read_text()
RENDER_TIMEOUT_MS = 15_000
MAX_SLIDE_BYTES = 256 << 10


@dataclass
class Measurement:
    """What one slide looks like once rendered (measure.js's answer)."""

    text: str = ""  # the slide's visible text, whitespace collapsed
    texts: list[dict[str, Any]] = field(default_factory=list)  # text groups: font, rects, problems
    overlaps: list[dict[str, Any]] = field(default_factory=list)
    overflow: list[str] = field(default_factory=list)
    error: str | None = None  # the slide could not be rendered (too big, not HTML, timeout)


class SlideRenderer:
    """`async with SlideRenderer() as r: await r.measure(html, 1280, 720)`; the browser starts
    on entry (cold) and is reused for every slide measured inside the block (warm)."""

    def __init__(self) -> None:
        self._pw: Any = None
        self._browser: Any = None

    async def __aenter__(self) -> SlideRenderer:
        self._pw = await async_playwright()().start()
        try:
            self._browser = await launch(self._pw)
        except BaseException:
            await self._pw.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self._browser is not None:
                await self._browser.close()
        finally:
            await self._pw.stop()

    async def measure(self, html: str, width: int, height: int) -> Measurement:
        if len(html.encode()) > MAX_SLIDE_BYTES:
            return Measurement(error=f"slide is larger than {MAX_SLIDE_BYTES >> 10} KiB")
        context = await self._browser.new_context(
            viewport={"width": width, "height": height}, java_script_enabled=False,
            offline=True, device_scale_factor=1)
        try:
            await context.route("**/*", lambda route: route.abort())
            page = await context.new_page()
            page.set_default_timeout(RENDER_TIMEOUT_MS)
            await page.set_content(html, wait_until="load")
            data = await page.evaluate(MEASURE_JS, [width, height])
            return Measurement(**data)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # playwright's TimeoutError / Error: the slide's own fault
            if not self._browser.is_connected():
                raise  # the browser died: infrastructure, not the slide
            return Measurement(error=f"could not render: {str(e).splitlines()[0][:200]}")
        finally:
            await context.close()
