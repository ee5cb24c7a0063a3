"""What checkpoints cost a run of `envhub train` on the bundled model, and what resuming costs.

Runs the real command line twice in one go, side by side on the same machine:
  fresh    `envhub train arith --steps S ...` from nothing: each step's wall time (metrics
           rows), each checkpoint's write time (its log line), and the time from the process
           start to the end of its first step;
  resumed  `envhub train --resume OUT --steps S+R` on that run's folder: the time from the
           process start to the end of its first step (start-up, checkpoint load, journal,
           serving the checkpoint's weights again, then a step).
and prints the checkpoint write over the step time, and the resumed start over the fresh one.

    .venv/bin/python bench/bench_checkpoint.py [--steps 6] [--more 2] [-- envhub train options]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKPOINT = re.compile(r"checkpoint step-\d+ \((\d+\.\d+)s\)")
STEP = re.compile(r"^step +\d+ ")


def run(args: list[str]) -> tuple[float, list[str]]:
    """(seconds from the start to the end of the first step, the log lines)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "envhub", "train", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first, lines = None, []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if first is None and STEP.match(line):
            first = time.perf_counter() - t0
    if proc.wait() != 0 or first is None:
        sys.exit("envhub train failed:\n" + "\n".join(lines[-40:]))
    return first, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--more", type=int, default=2, help="steps the resumed run adds")
    parser.add_argument("extra", nargs="*", help="more envhub train options (after --)")
    a = parser.parse_args()
    options = ["--seed", "0", "--groups", "4", "--k", "4", "--tasks", "16", "--eval-every",
               "0", *a.extra]
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp:
        out = Path(tmp) / "run"
        fresh_first, lines = run(["arith", "--steps", str(a.steps), "--out", str(out),
                                  *options])
        writes = [float(m.group(1)) for x in lines if (m := CHECKPOINT.search(x))]
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        walls = [r["wall_s"] for r in rows if r["phase"] == "train"]
        steps = [b - c for b, c in zip(walls[1:], walls, strict=False)]
        resumed_first, _ = run(["--resume", str(out), "--steps", str(a.steps + a.more)])
        size = sum(p.stat().st_size for p in (out / "checkpoints").rglob("*") if p.is_file())
        kept = len(list((out / "checkpoints").iterdir()))
    step = statistics.median(steps)
    write = statistics.median(writes)
    print(f"bundled model, {len(steps) + 1} steps of {options[3]} groups x {options[5]}, "
          f"{len(writes)} checkpoints ({size / kept / 1e6:.1f} MB each)")
    print(f"{'step (median wall)':<34}{step:>8.2f} s")
    print(f"{'checkpoint write (median)':<34}{write:>8.2f} s   {write / step:>6.2f} x a step"
          f"   (max {max(writes):.2f} s)")
    print(f"{'fresh start -> first step done':<34}{fresh_first:>8.2f} s")
    print(f"{'resume -> first step done':<34}{resumed_first:>8.2f} s   "
          f"{resumed_first / fresh_first:>6.2f} x a fresh start, "
          f"{(resumed_first - fresh_first) / step:+.2f} steps")


if __name__ == "__main__":
    main()
