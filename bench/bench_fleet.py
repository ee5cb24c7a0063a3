"""Fleet routing cost and failover, side by side in one run.

Three `envhub engine --model zero` processes behind one `envhub gateway --backend vllm`
(separate processes; this script is only the load generator):

  scale     — sessions/s and p99 latency at 1, 100 and 1,000 concurrent sessions (each
              session: a new chat, then TURNS turns that extend it). "Added" latency is the
              gateway's own time per call (`envhub.gateway_ms` in each answer: total minus
              engine time), next to a direct engine call at the same concurrency.
  routing   — the fleet's own per-call cost in process (placement, retry wrapper, counters)
              over in-process zero engines, versus calling one engine directly.
  failover  — 200 sessions; one engine gets `kill -9` mid-run. p99 latency of the calls that
              hit the dying instance (the first call of each session that lived there, after
              the kill) versus the other calls of the same window.

With `--think S` each session waits S seconds between its calls, as an agent running tools
does: the load is then sessions in flight rather than calls back to back (GLM-5's 1,000+
rollouts), and the figure that matters is the gateway's own p99 (`gw p99`). `--gateways N`
runs N gateway processes on one PostgreSQL pool behind nginx (Debian's `nginx` and
`postgresql`), sessions spread by the hash of their key.

    python bench/bench_fleet.py [--turns 2] [--levels 1,100,1000] [--think 1.0] [--gateways 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from common import cpu_seconds, envhub, free_port, pct, start

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.postgres, tests.nginx
from tests.nginx import NginxProxy  # noqa: E402
from tests.postgres import PostgresServer  # noqa: E402

PROMPT_IDS = list(range(1000, 1100))


class Target:
    """The engines and the gateway process(es): one on a SQLite pool, or several on one
    PostgreSQL pool behind nginx (deploy/nginx/envhub.conf: sessions hashed by key)."""

    def __init__(self, tmp: str, gateways: int = 1):
        self.engine_ports = [free_port() for _ in range(3)]
        self.engines = [start(envhub("engine", "--model", "zero", "--zero-length", "8",
                                     "--port", str(p)), f"http://127.0.0.1:{p}/health")
                        for p in self.engine_ports]
        self.pg: Any = None
        self.nginx: Any = None
        db = f"sqlite:///{tmp}/pool.db"
        if gateways > 1:
            self.pg = PostgresServer().start()
            db = self.pg.create_database()
        ports = [free_port() for _ in range(gateways)]
        self.gateways = []
        for port in ports:
            args = ["gateway", "--backend", "vllm", "--port", str(port), "--db", db,
                    "--heartbeat-interval", "0.5", "--default-max-tokens", "16"]
            for p in self.engine_ports:
                args += ["--upstream", f"http://127.0.0.1:{p}"]
            self.gateways.append(start(envhub(*args), f"http://127.0.0.1:{port}/health"))
        self.url = f"http://127.0.0.1:{ports[0]}"
        if gateways > 1:
            self.nginx = NginxProxy(ports).start()
            self.url = self.nginx.url

    def close(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()
        for proc in [*self.gateways, *self.engines]:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=20)
        if self.pg is not None:
            self.pg.stop()


async def session(http: aiohttp.ClientSession, url: str, key: str, turns: int,
                  record: list[dict[str, Any]], think: float = 0.0) -> None:
    """One agent: a chat of `turns` calls, `think` seconds apart; each call's latency and
    gateway time recorded."""
    messages: list[dict[str, str]] = [{"role": "user", "content": "start"}]
    headers = {"authorization": f"Bearer {key}"}
    if think:  # sessions start spread over one think time: steady arrivals, not one burst
        await asyncio.sleep(random.uniform(0, think))
    for turn in range(turns):
        t0 = time.perf_counter()
        async with http.post(f"{url}/v1/chat/completions", headers=headers,
                             json={"model": "default", "messages": messages}) as r:
            body = await r.json()
            ok = r.status == 200
        ms = (time.perf_counter() - t0) * 1000
        error = None if ok else f"{r.status} {str(body.get('error', body))[:120]}"
        record.append({"key": key, "turn": turn, "ok": ok, "ms": ms, "start": t0,
                       "gateway_ms": body.get("envhub", {}).get("gateway_ms") if ok else None,
                       "error": error})
        if not ok:
            return
        messages += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"turn {turn}"}]
        if think and turn < turns - 1:
            await asyncio.sleep(think)


async def scale(target: Target, level: int, turns: int, run: str,
                think: float = 0.0) -> dict[str, float]:
    sessions = max(level, 50 if level == 1 else level)  # level 1: 50 sessions in sequence
    record: list[dict[str, Any]] = []
    sem = asyncio.Semaphore(level)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as http:
        async def one(k: int) -> None:
            async with sem:
                await session(http, target.url, f"{run}-c{level}-{k}", turns, record, think)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(sessions)))
        wall = time.perf_counter() - t0
    ok = [r for r in record if r["ok"]]
    for error, n in Counter(r["error"] for r in record if not r["ok"]).most_common(3):
        print(f"  {level} sessions: {n} x {error}")
    gw = [r["gateway_ms"] for r in ok if r["gateway_ms"] is not None]
    return {"sessions_s": sessions / wall, "calls_s": len(ok) / wall,
            "p50": statistics.median(r["ms"] for r in ok), "p99": pct([r["ms"] for r in ok], .99),
            "gw_p99": pct(gw, .99) if gw else float("nan"), "errors": len(record) - len(ok),
            "calls": len(record)}


async def direct(target: Target, level: int, calls: int) -> float:
    """p99 (ms) of token-in completions straight to the engines (round-robin)."""
    lat: list[float] = []
    sem = asyncio.Semaphore(level)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def one(k: int) -> None:
            port = target.engine_ports[k % 3]
            async with sem:
                t0 = time.perf_counter()
                async with http.post(f"http://127.0.0.1:{port}/v1/completions", json={
                        "prompt": PROMPT_IDS, "max_tokens": 16, "logprobs": 0,
                        "return_token_ids": True}) as r:
                    await r.read()
                lat.append((time.perf_counter() - t0) * 1000)

        await asyncio.gather(*(one(k) for k in range(calls)))
    return pct(lat, .99)


async def failover(target: Target, run: str) -> dict[str, float]:
    """200 sessions x 4 turns; kill -9 engine 0 after 200 calls."""
    record: list[dict[str, Any]] = []
    victim_url = f"http://127.0.0.1:{target.engine_ports[0]}"
    killed: dict[str, float] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def killer() -> None:
            while len(record) < 200:
                await asyncio.sleep(0.005)
            killed["at"] = time.perf_counter()
            os.kill(target.engines[0].pid, signal.SIGKILL)

        await asyncio.gather(killer(), *(session(http, target.url, f"{run}-fo-{k}", 4, record)
                                         for k in range(200)))
        homes = {}
        for k in range(200):  # each session's instance before the kill, from the pool
            async with http.get(f"{target.url}/sessions/{run}-fo-{k}/trajectory") as r:
                turns = (await r.json())["turns"]
            homes[f"{run}-fo-{k}"] = turns[0]["instance"] if turns else None
    after = [r for r in record if r["start"] >= killed["at"] or
             r["start"] + r["ms"] / 1000 >= killed["at"]]
    hit, normal, seen = [], [], set()
    for r in sorted(after, key=lambda r: r["start"]):
        if homes.get(r["key"]) == victim_url and r["key"] not in seen:
            seen.add(r["key"])
            hit.append(r["ms"])
        else:
            normal.append(r["ms"])
    errors = sum(not r["ok"] for r in record)
    return {"hit_p99": pct(hit, .99) if hit else float("nan"), "hit_n": len(hit),
            "normal_p99": pct(normal, .99) if normal else float("nan"),
            "normal_n": len(normal), "errors": errors, "calls": len(record)}


async def routing_cost(calls: int = 20_000, sessions: int = 1000) -> dict[str, float]:
    """Per-call cost of the fleet itself (placement, retry wrapper, counters), in process:
    Fleet over 3 in-process zero engines versus calling one zero engine directly."""
    from envhub.gateway.backends.base import GenerateRequest, SamplingParams
    from envhub.gateway.backends.zero import ZeroBackend
    from envhub.gateway.router import Fleet

    fleet = Fleet([ZeroBackend(instance=f"z{k}") for k in range(3)], heartbeat_interval=60)
    await fleet.start()
    direct = ZeroBackend(instance="direct")
    params = SamplingParams(max_tokens=8)
    reqs = [GenerateRequest(PROMPT_IDS, params, f"s{k % sessions}-{k}", f"s{k % sessions}")
            for k in range(calls)]
    out = {}
    for name, target in (("direct", direct), ("fleet", fleet)):
        t0 = time.perf_counter()
        for r in reqs:
            await target.generate(r)
        out[name] = (time.perf_counter() - t0) / calls * 1e6  # µs per call
    await fleet.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--levels", default="1,100,1000")
    ap.add_argument("--think", type=float, default=0.0,
                    help="seconds each session waits between its calls")
    ap.add_argument("--gateways", type=int, default=1,
                    help="gateway processes; more than 1: on a PostgreSQL pool behind nginx")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        target = Target(tmp, args.gateways)
        try:
            run = f"r{int(time.time())}"
            rows = {}
            for level in levels:
                procs = {"gateway": target.gateways, "engines": target.engines}
                before = {k: sum(cpu_seconds(p.pid) for p in ps) for k, ps in procs.items()}
                me, t0 = cpu_seconds(), time.perf_counter()
                res = asyncio.run(scale(target, level, args.turns, run, args.think))
                wall = time.perf_counter() - t0
                # cores each part kept busy: a saturated machine shows in every latency
                res["cpu"] = {k: (sum(cpu_seconds(p.pid) for p in ps) - before[k]) / wall
                              for k, ps in procs.items()}
                res["cpu"]["load generator"] = (cpu_seconds() - me) / wall
                res["direct_p99"] = asyncio.run(direct(target, level, max(100, level)))
                rows[level] = res
            fo = asyncio.run(failover(target, run))
        finally:
            target.close()
    cost = asyncio.run(routing_cost())
    behind = ("one gateway process (SQLite pool)" if args.gateways == 1 else
              f"{args.gateways} gateway processes (PostgreSQL pool) behind nginx")
    print(f"\nfleet: 3 zero-work engines behind {behind}, {args.turns} turns per "
          f"session, {args.think:g} s think time between calls")
    print(f"{'sessions':>9} {'sessions/s':>11} {'calls/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'gw p99':>8} {'direct p99':>11} {'errors':>7}")
    for level, r in rows.items():
        print(f"{level:>9} {r['sessions_s']:>11.1f} {r['calls_s']:>8.1f} {r['p50']:>8.2f} "
              f"{r['p99']:>8.2f} {r['gw_p99']:>8.2f} {r['direct_p99']:>11.2f} "
              f"{r['errors']:>4}/{r['calls']}")
    for level, r in rows.items():
        print(f"cores busy at {level} sessions: " + ", ".join(
            f"{k} {v:.2f}" for k, v in r["cpu"].items()) + f" (of {os.cpu_count()})")
    base = rows[levels[0]]
    for level in levels[1:]:
        r = rows[level]
        speed = r["sessions_s"] / base["sessions_s"]
        print(f"ratio {level} vs {levels[0]}: sessions/s x{speed:.2f}, "
              f"p99 x{r['p99'] / base['p99']:.2f}, "
              f"gateway p99 x{r['gw_p99'] / base['gw_p99']:.2f}")
    print(f"\nfailover (kill -9 of 1 of 3 engines, 200 sessions x 4 turns, "
          f"{fo['errors']}/{fo['calls']} failed calls):")
    print(f"  calls that hit the dying instance: p99 {fo['hit_p99']:.2f} ms (n={fo['hit_n']})")
    print(f"  other calls in the same window:    p99 {fo['normal_p99']:.2f} ms "
          f"(n={fo['normal_n']})")
    print(f"  ratio: x{fo['hit_p99'] / fo['normal_p99']:.2f}")
    print(f"\nrouting cost in process (20,000 calls, 1,000 sessions, 3 zero engines): "
          f"direct {cost['direct']:.1f} µs/call, through the fleet {cost['fleet']:.1f} µs/call "
          f"(+{cost['fleet'] - cost['direct']:.1f} µs, x{cost['fleet'] / cost['direct']:.2f})")


if __name__ == "__main__":
    main()
