"""Rollout start latency of a command agent inside the sandbox vs on the host, side by side.

    python bench/bench_agent_start.py                # 20 rollouts per mode, local + docker
    python bench/bench_agent_start.py --rollouts 10 --modes host,local

One rollout of `arith` (no sandbox of its own) with an agent that makes one chat call and
exits, against the zero-work backend (instant completions), one rollout at a time, modes
interleaved round by round so that drift on a shared machine hits all alike. "start" is the
time from the rollout starting (its session opened, the rollout's first step) until the agent's
call is recorded (the turn's timestamp; both stamped by the gateway): for `host` a host
process; for `local`/`docker` opening the agent's sandbox (docker: a container from the cached
agent layer, built once before timing), starting the forwarder, the call through the channel.
Also printed: the whole `run()` call (in-process gateway start and stop included).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from envhub.orchestrator.groups import EnvChoice, RunConfig, run

AGENT = """#!/usr/bin/env python3
import json, os, time, urllib.request
body = {"model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(), headers={"content-type": "application/json",
    "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
urllib.request.urlopen(req, timeout=60).read()
"""


def one_rollout(mode: str, script: Path, out: Path) -> tuple[float, float]:
    """(start latency, whole rollout) in seconds for one rollout in `mode`."""
    if mode == "host":
        kw: dict = {"agent": f"{sys.executable} {script}", "agent_on_host": True}
    else:
        kw = {"agent": script.name, "agent_install": [f"script:{script}"], "sandbox": mode}
    config = RunConfig(envs=[EnvChoice.parse("arith")], model="zero", n=1, out=out, **kw)
    started = time.monotonic()
    result = asyncio.run(run(config, progress=False))
    whole = time.monotonic() - started
    (record,) = result.records
    assert record.status == "done", (mode, record.reason, record.agent_info)
    from envhub.gateway.pool.store import Store

    store = Store(f"sqlite:///{out / 'pool.db'}")
    try:
        session = store.session_row(record.session_id)
        turns = store.turn_rows(record.session_id)
    finally:
        store.close()
    assert session is not None and len(turns) == 1
    return turns[0]["created_at"] - session["created_at"], whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--modes", default="host,local,docker")
    args = parser.parse_args()
    modes = args.modes.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-agent-start-"))
    script = work / "one_call.py"
    script.write_text(AGENT)
    script.chmod(0o755)
    for mode in modes:  # warm-up: bundle, agent layer, engine caches (not timed)
        one_rollout(mode, script, work / f"warm-{mode}")
    starts: dict[str, list[float]] = {m: [] for m in modes}
    wholes: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(args.rollouts):
        for mode in modes:
            s, w = one_rollout(mode, script, work / f"{mode}-{i}")
            starts[mode].append(s)
            wholes[mode].append(w)
    base = statistics.median(starts[modes[0]])
    print(f"{'mode':8} {'start median (s)':>17} {'vs ' + modes[0]:>9} {'p90 (s)':>8} "
          f"{'envhub run median (s)':>22}   ({args.rollouts} rollouts each)")
    for mode in modes:
        med = statistics.median(starts[mode])
        p90 = sorted(starts[mode])[int(0.9 * (len(starts[mode]) - 1))]
        print(f"{mode:8} {med:17.3f} {med / base:8.2f}x {p90:8.3f} "
              f"{statistics.median(wholes[mode]):22.3f}")


if __name__ == "__main__":
    main()
