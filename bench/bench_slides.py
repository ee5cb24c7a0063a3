"""Chromium render-and-score time per slide inside sandboxes: cold versus warm, side by side.

For each sandbox kind that runs here (local bubblewrap, docker):
  cold  — a one-slide deck as the verifier grades it: open a fresh sandbox, start Node and
          Chromium in it, render and measure the slide, score it, close the sandbox.
  deck  — a whole gold deck graded the same way (one sandbox, one browser for every slide):
          the wall time divided by the deck's slides.
  warm  — inside that one browser: a fresh context per slide, load, measure (render.js's own
          per-slide clock), plus scoring.

Slides are the gold decks of the built-in `slides` environment (10 slides, 1280x720 and
1080x1080), each ROUNDS times; figures are medians per slide.

    python bench/bench_slides.py [--rounds 3] [--kinds local,docker]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import statistics
import time

from envhub.envs.browser.sandbox import browser_spec
from envhub.envs.builtin.slides.env import brief_of
from envhub.envs.builtin.slides.layout import Brief, score_deck
from envhub.envs.builtin.slides.render import render_deck
from envhub.envs.loader import load_env
from envhub.envs.sandbox import open_sandbox

LOADED = load_env("slides")


def decks() -> list[tuple[list[str], Brief]]:
    """(slides, brief) of every task's gold deck; the brief asks for exactly that deck."""
    env = LOADED.env
    out = []
    for task in env.load_tasks():
        paths = sorted((env.solutions / task.id).glob("slide*.html"),
                       key=lambda p: int(p.stem[5:]))
        out.append(([p.read_text() for p in paths],
                    brief_of({**task.data, "slide_count": len(paths), "required": []})))
    return out


async def grade(kind: str, htmls: list[str], brief: Brief) -> list[float]:
    """Fresh sandbox, one browser, every slide; returns the in-browser ms of each slide."""
    spec = await browser_spec(LOADED.manifest.sandbox, kind)
    box = await open_sandbox(kind, spec, run_id="bench-slides", package_root=LOADED.folder)
    try:
        deck = await render_deck(box, htmls, brief.width, brief.height)
    finally:
        await box.close()
    assert score_deck(deck.slides, brief).passed, deck.slides  # gold decks pass every check
    return [m.render_ms for m in deck.slides]


async def bench(kind: str, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"cold": [], "deck": [], "warm": []}
    await grade(kind, *decks()[0])  # build or find the image, stage the runtime
    for _ in range(rounds):
        for htmls, brief in decks():
            for html in htmls:
                t = time.perf_counter()
                await grade(kind, [html], dataclasses.replace(brief, slide_count=1))
                times["cold"].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            warm = await grade(kind, htmls, brief)
            times["deck"].append((time.perf_counter() - t) * 1000 / len(htmls))
            times["warm"] += warm
    return times


def available(kind: str) -> bool:
    if kind == "local":
        return shutil.which("bwrap") is not None
    from envhub.envs.sandbox.engine import docker_reachable

    return docker_reachable()


async def main(rounds: int, kinds: list[str]) -> None:
    n = sum(len(h) for h, _ in decks())
    print(f"slides: {n} gold slides x {rounds} rounds; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'kind':7} {'cold ms/slide':>14} {'deck ms/slide':>14} {'warm ms/slide':>14} "
          f"{'cold/warm':>10} {'cold/deck':>10}")
    for kind in kinds:
        if not available(kind):
            print(f"{kind:7} (not available here)")
            continue
        t = await bench(kind, rounds)
        cold, deck, warm = (statistics.median(t[k]) for k in ("cold", "deck", "warm"))
        print(f"{kind:7} {cold:14.0f} {deck:14.0f} {warm:14.0f} {cold / warm:9.1f}x "
              f"{cold / deck:9.1f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", default="local,docker")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.kinds.split(",")))
