"""Chromium render-and-score time per slide, cold browser versus warm, side by side.

  cold — what `slides`' verifier pays for a one-slide deck: start Playwright and Chromium,
         render and measure the slide, score it, stop the browser (per slide).
  warm — one browser already running: a fresh context per slide (as the verifier makes),
         render, measure, score.

Slides are the gold decks of the built-in `slides` environment (10 slides, 1280x720 and
1080x1080), each measured ROUNDS times; the figures are medians per slide.

    python bench/bench_slides.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from envhub.envs.builtin.slides.env import brief_of
from envhub.envs.builtin.slides.layout import Brief, score_deck
from envhub.envs.builtin.slides.render import SlideRenderer
from envhub.envs.loader import load_env


def slides() -> list[tuple[str, Brief]]:
    """(html, brief) of every gold slide; the brief asks for that one slide."""
    env = load_env("slides").env
    out = []
    for task in env.load_tasks():
        brief = brief_of({**task.data, "slide_count": 1, "required": []})
        for path in sorted((env.solutions / task.id).glob("slide*.html")):
            out.append((path.read_text(), brief))
    return out


async def one(renderer: SlideRenderer, html: str, brief: Brief) -> None:
    """Render, measure and score one slide (a gold slide passes every check)."""
    m = await renderer.measure(html, brief.width, brief.height)
    assert score_deck([m], brief).passed, m


async def main(rounds: int) -> None:
    deck = slides()
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(rounds):
        for html, brief in deck:
            t = time.perf_counter()
            async with SlideRenderer() as renderer:
                await one(renderer, html, brief)
            cold.append(time.perf_counter() - t)
        async with SlideRenderer() as renderer:
            await one(renderer, *deck[0])  # the first page of a new browser is not "warm"
            for html, brief in deck:
                t = time.perf_counter()
                await one(renderer, html, brief)
                warm.append(time.perf_counter() - t)
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"slides: {len(deck)} x {rounds} rounds; load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'':6} {'median ms/slide':>16} {'p90 ms':>8}")
    for name, xs in (("cold", cold), ("warm", warm)):
        p90 = statistics.quantiles(xs, n=10)[-1] if len(xs) > 1 else xs[0]
        print(f"{name:6} {statistics.median(xs) * 1000:16.0f} {p90 * 1000:8.0f}")
    print(f"cold / warm: {c / w:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args().rounds))
