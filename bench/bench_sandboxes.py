"""Sandbox start latency per backend, and rollout throughput through one gateway, side by side
in one run (bounded: about 3-5 minutes on a 2-core machine).

  start       — p50/p99 of `open_sandbox(kind)` (until the sandbox answers calls) followed by
                one `exec("true")`, STARTS sequential starts per backend: local (bubblewrap),
                docker (base image, cached), e2b-fake (official e2b SDK against the in-repo fake
                E2B server, whose sandboxes are local ones). A backend that cannot run here is
                reported as skipped, with the reason.
  throughput  — `envhub run <scaffolded env> --model zero --sandbox local -c C` with C rollouts
                in flight (WAVES × C rollouts in all) through one in-process gateway: rollouts
                per minute (from the run's own start/finish stamps) and failures (env_failure +
                agent_error + rollouts that never reported).

    python bench/bench_sandboxes.py [--starts 30] [--levels 64,256] [--waves 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from common import envhub, pct

E2B_KEY = "e2b_bench_key"


async def time_starts(kind: str, starts: int) -> list[float]:
    from envhub.envs.manifest import SandboxSpec
    from envhub.envs.sandbox import open_sandbox, reap

    run_id = f"bench-sb-{uuid.uuid4().hex[:6]}"
    took: list[float] = []
    try:
        for _ in range(starts):
            t0 = time.perf_counter()
            box = await open_sandbox(kind, SandboxSpec(exec_timeout_s=30),
                                     run_id=run_id)
            try:
                result = await box.exec("true")
                took.append(time.perf_counter() - t0)
                if result.exit_code != 0:
                    raise RuntimeError(f"{kind}: `true` exited {result.exit_code}")
            finally:
                await box.close()
    finally:
        reap(run_id)
    return took


def start_figures(kind: str, starts: int) -> dict:
    why = unavailable(kind)
    if why:
        return {"backend": kind, "skipped": why}
    if kind == "e2b-fake":
        from envhub.envs.sandbox.e2b_fake import running_fake_e2b

        with running_fake_e2b(api_key=E2B_KEY) as url:
            saved = {k: os.environ.get(k) for k in
                     ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_HTTP_VERSION", "E2B_API_KEY")}
            os.environ.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url,
                               "E2B_HTTP_VERSION": "1.1", "E2B_API_KEY": E2B_KEY})
            try:
                took = asyncio.run(time_starts("e2b", starts))
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
    else:
        if kind == "docker":  # the base image is built once and cached: not part of a start
            from envhub.envs.images import ensure_base_image

            ensure_base_image()
        took = asyncio.run(time_starts(kind, starts))
    return {"backend": kind, "n": len(took), "p50_ms": pct(took, 0.50) * 1000,
            "p99_ms": pct(took, 0.99) * 1000}


def unavailable(kind: str) -> str | None:
    if kind in ("local", "e2b-fake") and shutil.which("bwrap") is None:
        return "bubblewrap missing (apt-get install bubblewrap)"
    if kind == "e2b-fake":
        try:
            import e2b  # noqa: F401
        except ImportError:
            return "the e2b SDK is missing (pip install 'envhub[e2b]')"
    if kind == "docker":
        try:
            ok = subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode
        except (OSError, subprocess.TimeoutExpired):
            ok = 1
        if ok != 0:
            return "no running Docker engine"
    return None


def throughput(env_dir: Path, concurrency: int, waves: int, work: Path) -> dict:
    """One `envhub run` with `concurrency` rollouts in flight; the env has 2 tasks, so
    k = concurrency * waves / 2 samples each."""
    rollouts = concurrency * waves
    out = work / f"out-{concurrency}"
    args = envhub("run", str(env_dir), "--model", "zero", "--sandbox", "local", "-c",
                  str(concurrency), "-k", str(max(1, rollouts // 2)), "--out", str(out), "-q")
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"concurrency": concurrency, "error": proc.stderr[-800:]}
    summary = json.loads((out / "summary.json").read_text())
    overall = summary["overall"]
    span = summary["finished_at"] - summary["started_at"]
    failures = overall["env_failure"] + overall["agent_error"] + (rollouts - overall["rollouts"])
    reasons: Counter[str] = Counter()
    turns: list[int] = []
    for path in (out / "rollouts").glob("*.json"):
        record = json.loads(path.read_text())
        turns.append(int(record.get("turns") or 0))
        if record["status"] != "done":
            reasons[f"{record['status']}: {str(record.get('reason'))[:120]}"] += 1
    return {"concurrency": concurrency, "rollouts": overall["rollouts"],
            "per_min": overall["rollouts"] / span * 60, "failures": failures,
            "run_s": span, "wall_s": wall, "reasons": reasons,
            "mean_turns": sum(turns) / max(1, len(turns))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=30, help="sandbox starts per backend")
    parser.add_argument("--levels", default="64,256", help="concurrent rollouts, comma-separated")
    parser.add_argument("--waves", type=int, default=1, help="rollouts = waves × concurrency")
    parser.add_argument("--backends", default="local,docker,e2b-fake")
    a = parser.parse_args()

    starts = [start_figures(kind, a.starts) for kind in a.backends.split(",")]
    with tempfile.TemporaryDirectory(prefix="envhub-bench-sb-") as tmp:
        work = Path(tmp)
        made = subprocess.run(envhub("init", "bench-env"), cwd=work, capture_output=True,
                              text=True, check=False)
        if made.returncode != 0:
            raise SystemExit(f"envhub init failed: {made.stderr}")
        runs = [throughput(work / "bench-env", int(c), a.waves, work)
                for c in a.levels.split(",")]

    print(f"\nsandbox start (open + exec 'true'), {a.starts} sequential starts per backend")
    print(f"{'backend':<10} {'n':>4} {'p50 ms':>9} {'p99 ms':>9}")
    for s in starts:
        if "skipped" in s:
            print(f"{s['backend']:<10} skipped: {s['skipped']}")
        else:
            print(f"{s['backend']:<10} {s['n']:>4} {s['p50_ms']:>9.1f} {s['p99_ms']:>9.1f}")
    print("\nrollouts through one in-process gateway (model zero, local sandbox, tool agent)")
    print(f"{'in flight':>9} {'rollouts':>9} {'per min':>9} {'failures':>9} {'turns':>6} "
          f"{'run s':>7} {'wall s':>7}")
    for r in runs:
        if "error" in r:
            print(f"{r['concurrency']:>9} failed: {r['error']}")
            continue
        print(f"{r['concurrency']:>9} {r['rollouts']:>9} {r['per_min']:>9.0f} "
              f"{r['failures']:>9} {r['mean_turns']:>6.1f} {r['run_s']:>7.1f} {r['wall_s']:>7.1f}")
        for reason, count in r["reasons"].most_common():
            print(f"{'':>9}   {count} × {reason}")


if __name__ == "__main__":
    main()
