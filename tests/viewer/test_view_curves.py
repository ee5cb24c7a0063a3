"""`envhub view` draws the curves of real `envhub train` runs, and two runs side by side, in
a real Chromium: the points of each drawn line, read back from the rendered SVG (the path's
coordinates through the chart's axes), are the values of metrics.jsonl; the pages run no
script and load nothing from elsewhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.chromium import chromium_page, screenshot
from tests.support import envhub
from tests.viewer.conftest import start_viewer

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # slow: two training runs


def train(out: Path, seed: int) -> list[dict]:
    done = envhub("train", "arith", "--steps", "3", "--seed", str(seed), "--groups", "2",
                  "--k", "2", "--tasks", "4", "--max-turns", "2", "--sync", "--eval-every", "2",
                  "--eval-tasks", "2", "--eval-samples", "1", "--out", str(out), cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def numbers(d: str) -> list[tuple[float, float]]:
    values = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", d)]
    return list(zip(values[::2], values[1::2], strict=True))


def drawn(page, series: str) -> list[tuple[float, float]]:
    """The data points of the line `series` (its SVG group's id), from the path as rendered
    and its chart's axes box and limits."""
    chart = page.locator(f"figure.chart:has(g[id='{series}'])")
    assert chart.count() == 1, series
    axes = chart.locator("g[id^='axes-']")
    x0, x1, y0, y1 = (float(v) for v in axes.get_attribute("id")[len("axes-"):].split("_"))
    box = numbers(axes.locator("path").get_attribute("d"))
    left, right = min(x for x, _ in box), max(x for x, _ in box)
    top, bottom = min(y for _, y in box), max(y for _, y in box)
    line = numbers(chart.locator(f"g[id='{series}'] > path").first.get_attribute("d"))
    return [(x0 + (px - left) / (right - left) * (x1 - x0),
             y0 + (bottom - py) / (bottom - top) * (y1 - y0)) for px, py in line]


def close(a: list[tuple[float, float]], b: list[tuple[float, float]], span: float) -> bool:
    tol = 1e-4 * max(span, 1e-9)  # the SVG writes coordinates to 6 decimals
    return len(a) == len(b) and all(abs(p - q) <= tol and abs(u - v) <= tol
                                    for (p, u), (q, v) in zip(a, b, strict=True))


def expected(rows: list[dict], key: str) -> list[tuple[float, float]]:
    phase = "eval" if key.startswith("eval/") else "train"
    at = "after_step" if phase == "eval" else "step"
    return [(float(r[at]), float(r[key])) for r in rows if r["phase"] == phase and key in r]


def test_a_run_page_and_a_compare_page_draw_the_metrics(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    runs = {"a": train(root / "a", 1), "b": train(root / "b", 2)}
    # what an agent writes lands in the sample table: a completion that tries to run script
    hostile = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>"
    with open(root / "a" / "samples.jsonl", "a") as f:
        f.write(json.dumps({"step": 2, "group": "g<b>x</b>", "sample": 0, "prompt_tail": "p",
                            "completion": hostile, "reward": 0.5,
                            "components": {"outcome": 0.5}}) + "\n")
    viewer = start_viewer(str(root), tmp_path / "view.log")
    try:
        head = httpx.head(viewer.url + "/runs/a/curves", timeout=60)
        assert head.status_code == 200 and "script-src 'none'" in head.headers[
            "content-security-policy"]
        assert httpx.get(viewer.url + "/runs/nope/curves", timeout=30).status_code == 404
        assert httpx.get(viewer.url + "/compare?run=a", timeout=30).status_code == 400
        with chromium_page(width=1300, height=1000) as page:
            page.goto(viewer.url + "/")
            assert page.locator("a.curves").count() == 2
            page.locator("a.curves").first.click()
            assert page.locator("script").count() == 0
            titles = page.locator("figure.chart figcaption").all_inner_texts()
            assert titles[:2] == ["reward", "held-out evaluation"], titles
            assert "importance sampling" in titles and "staleness" in titles
            rows = runs["a"]
            for key in ("reward_mean", "resolved_rate", "trainer/loss/pg",
                        "trainer/policy/entropy", "trainer/is/masked_fraction",
                        "eval/resolved_rate"):
                series = f"series-0-{key.replace('/', '_')}"
                want = expected(rows, key)
                span = max(abs(y) for _, y in want) + 1.0
                assert close(drawn(page, series), want, span), (key, drawn(page, series), want)
            assert '"steps": 3' in page.locator("#config").inner_text()
            samples = page.locator("#samples tbody tr")
            assert samples.count() >= 3  # the run's own (a few a step) and the hostile one
            assert samples.first.locator("td.completion").inner_text() == hostile  # as text
            assert samples.first.locator("td.mono").inner_text() == "g<b>x</b>"
            assert page.locator("#samples img, #samples b, script").count() == 0
            assert page.title() != "pwned"
            screenshot(page, tmp_path, "curves-run")

            page.goto(viewer.url + "/")
            for box in page.locator("#compare input[type=checkbox]").all():
                box.check()
            page.click("#compare button[type=submit]")
            assert "/compare?run=a&run=b" in page.url
            for r, name in enumerate(("a", "b")):
                for key in ("reward_mean", "eval/reward_mean", "trainer/policy/entropy"):
                    want = expected(runs[name], key)
                    span = max(abs(y) for _, y in want) + 1.0
                    got = drawn(page, f"series-{r}-{key.replace('/', '_')}")
                    assert close(got, want, span), (name, key, got, want)
            screenshot(page, tmp_path, "curves-compare")
    finally:
        viewer.proc.terminate()
        viewer.proc.wait(timeout=30)
