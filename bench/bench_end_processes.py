"""Ending a docker sandbox's leftover processes: from the host through the container's frozen
cgroup (the default where this process may write the cgroup) vs the fork-free sweep from
inside the container (the fallback), side by side in one run, on one container each.

  exec         — p50/p99 of `exec("true")`: every exec ends with the sweep of what it left
  end          — p50/p99 of `end_processes()` with LEFT detached `sleep`s planted before each
                 (`docker exec -d`, outside any call, as a host-side agent could)

    python bench/bench_end_processes.py [--rounds 20] [--left 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from common import pct


async def measure(mode: str, rounds: int, left: int) -> dict:
    from envhub.envs.images import ensure_base_image
    from envhub.envs.manifest import SandboxSpec
    from envhub.envs.sandbox import docker as docker_sandbox
    from envhub.envs.sandbox.cgroup import find_freezer

    # the fallback is what runs where the cgroup cannot be written (not root, remote engine)
    docker_sandbox.find_freezer = find_freezer if mode == "cgroup" else (lambda *a: None)
    box = await docker_sandbox.DockerSandbox.create(SandboxSpec(exec_timeout_s=30),
                                                    ensure_base_image().tag,
                                                    f"bench-end-{uuid.uuid4().hex[:6]}")
    execs, ends, how = [], [], set()
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            await box.exec("true")
            execs.append(time.perf_counter() - t0)
            for _ in range(left):
                box.container.exec_run(["sleep", "300"], detach=True)
            t0 = time.perf_counter()
            how.add(await box.end_processes())
            ends.append(time.perf_counter() - t0)
    finally:
        await box.close()
    return {"exec": execs, "end": ends, "how": how}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--left", type=int, default=5)
    args = parser.parse_args()
    results = {mode: asyncio.run(measure(mode, args.rounds, args.left))
               for mode in ("cgroup", "sweep")}
    print(f"{'':8} {'cgroup p50':>11} {'p99':>8} {'sweep p50':>10} {'p99':>8} {'ratio p50':>10}")
    for what in ("exec", "end"):
        c, s = results["cgroup"][what], results["sweep"][what]
        print(f"{what:8} {pct(c, 0.5) * 1e3:9.1f}ms {pct(c, 0.99) * 1e3:6.1f}ms "
              f"{pct(s, 0.5) * 1e3:8.1f}ms {pct(s, 0.99) * 1e3:6.1f}ms "
              f"{pct(s, 0.5) / pct(c, 0.5):9.2f}x")
    print(f"end_processes said: cgroup {sorted(results['cgroup']['how'])}, "
          f"sweep {sorted(results['sweep']['how'])}")


if __name__ == "__main__":
    main()
