"""`--metrics HOST:PORT`: per-task Prometheus metrics of a run without task services, scraped
from a real `envhub run` while it runs (prometheus_client's parser reads them)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import free_port


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_run_serves_per_task_metrics_while_it_runs(tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "envhub", "run", "arith", "-n", "20", "-k", "4", "-c", "1",
         "--agent", "oracle", "--model", "zero", "-q", "--metrics", f"127.0.0.1:{port}",
         "--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    done_key = ("envhub_task_rollouts_total", (("status", "done"), ("task", "arith")))
    seen: list[float] = []
    try:
        while proc.poll() is None:
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except httpx.TransportError:
                time.sleep(0.02)  # not listening yet, or the run just ended
                continue
            seen.append(samples(text).get(done_key, 0.0))
            time.sleep(0.02)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert f"per-task metrics at http://127.0.0.1:{port}/metrics" in err
    # scraped mid-run: rollouts of arith ending one by one (80 in all, one at a time)
    assert any(0 < n < 80 for n in seen), seen[-5:]
    assert seen == sorted(seen)  # a counter


def test_a_bad_metrics_address_exits_2():
    from typer.testing import CliRunner

    from envhub.cli import app

    result = CliRunner().invoke(app, ["run", "arith", "--metrics", "localhost"])
    assert result.exit_code == 2 and "--metrics: use HOST:PORT" in result.output
    same = ["--services", "127.0.0.1:7131", "--metrics", "127.0.0.1:7131"]
    result = CliRunner().invoke(app, ["run", "service:a", *same])
    assert result.exit_code == 2 and "serves /metrics already" in result.output
