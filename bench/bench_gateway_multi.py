"""Calls/s of one and two gateway processes behind nginx, side by side in one run.

All targets record into one real PostgreSQL pool and answer from the in-process zero-work
engine (`--backend zero`), so the figure is the gateways' own capacity:
  1 direct   — agents call one gateway process straight
  1 + nginx  — the same process behind nginx (deploy/nginx/envhub.conf, one server line)
  2 + nginx  — two processes behind nginx, sessions spread by the hash of their key

Agents are multi-turn (a new session every 10 turns, as in bench_gateway_overhead.py); targets
alternate over several rounds so the machine's drifting load falls on all of them alike; each
figure is the median over rounds. Needs Debian's `nginx` and `postgresql` packages.

    python bench/bench_gateway_multi.py [--calls 2000] [--concurrency 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import envhub, free_port, load, start

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.postgres, tests.nginx
from tests.nginx import NginxProxy  # noqa: E402
from tests.postgres import PostgresServer  # noqa: E402


def agent(url: str, tag: str):
    conversations: dict[int, list] = {}
    sessions: dict[int, int] = {}

    async def call(http, w, i):
        msgs = conversations.setdefault(w, [])
        if len(msgs) >= 20:
            msgs.clear()
            sessions[w] = sessions.get(w, 0) + 1
        msgs.append({"role": "user", "content": f"step {len(msgs)} of worker {w}"})
        key = f"{tag}-{w}-{sessions.get(w, 0)}"
        async with http.post(f"{url}/v1/chat/completions", headers={
                "authorization": f"Bearer {key}"}, json={
                "model": "default", "max_tokens": 8, "messages": msgs}) as r:
            assert r.status == 200, await r.text()
            msgs.append((await r.json())["choices"][0]["message"])

    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000, help="calls per target and round")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    pg = PostgresServer().start()
    procs: list[subprocess.Popen] = []
    proxies: list[NginxProxy] = []
    try:
        db = pg.create_database()
        ports = [free_port(), free_port()]
        for p in ports:
            procs.append(start(envhub("gateway", "--backend", "zero", "--port", str(p),
                                      "--db", db), f"http://127.0.0.1:{p}/health"))
        proxies = [NginxProxy(ports[:1]).start(), NginxProxy(ports).start()]
        urls = {"1 direct": f"http://127.0.0.1:{ports[0]}", "1 + nginx": proxies[0].url,
                "2 + nginx": proxies[1].url}
        nonce = os.urandom(4).hex()
        for name, url in urls.items():  # warm-up
            asyncio.run(load(agent(url, f"warm-{nonce}-{name[0]}{len(name)}"), 8, 200))
        rounds: dict[str, list] = {name: [] for name in urls}
        for k in range(args.rounds):
            for j, (name, url) in enumerate(urls.items()):
                rounds[name].append(asyncio.run(load(agent(url, f"b-{nonce}-{k}-{j}"),
                                                     args.concurrency, args.calls)))
    finally:
        for proxy in proxies:
            proxy.stop()
        for proc in procs:
            proc.kill()
            proc.wait()
        pg.stop()
    print(f"\n{args.concurrency} concurrent agents, {args.calls} calls per target x "
          f"{args.rounds} rounds, PostgreSQL pool, zero engine; {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'target':<10} {'calls/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    med = {}
    for name, rs in rounds.items():
        med[name] = {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        m = med[name]
        print(f"{name:<10} {m['rps']:>8.0f} {m['p50']:>8.2f} {m['p99']:>8.1f} "
              f"{sum(r['errors'] for r in rs):>7}")
    rps = {name: m["rps"] for name, m in med.items()}
    print(f"calls/s ratios: 1 + nginx / 1 direct x{rps['1 + nginx'] / rps['1 direct']:.2f}, "
          f"2 + nginx / 1 + nginx x{rps['2 + nginx'] / rps['1 + nginx']:.2f}")


if __name__ == "__main__":
    main()
