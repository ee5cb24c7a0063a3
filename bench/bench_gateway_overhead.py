"""Gateway overhead against a zero-work token backend, side by side in one run.

Targets, all in front of the same `envhub engine --model zero` process:
  direct   — POST /v1/completions with token ids straight to the engine
  envhub   — POST /v1/chat/completions through `envhub gateway` (render + record in SQLite)
  responses — POST /v1/responses through the same gateway, resending the conversation's items
             each turn as the OpenAI Agents SDK does (+ storing the response object)
  litellm  — LiteLLM's proxy from its own venv (`bash scripts/bench_venv.sh` makes .venv-bench
             from locks/bench.txt; LITELLM=PATH another `litellm`), /v1/completions passthrough

At concurrency 1: p50 latency and what each proxy adds over direct. At concurrency 64: req/s.
The load generator is one asyncio process (aiohttp) shared by all targets.

    python bench/bench_gateway_overhead.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile

from common import envhub, free_port, load, start

PROMPT_IDS = list(range(1000, 1100))


BENCH_VENV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".venv-bench")


def litellm_exe() -> str | None:
    """The proxy's `litellm` command: $LITELLM, the bench venv's, or one on PATH."""
    for exe in (os.environ.get("LITELLM"), os.path.join(BENCH_VENV, "bin", "litellm"),
                shutil.which("litellm")):
        if exe and os.access(exe, os.X_OK):
            return exe
    return None


def _median(rounds: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000, help="calls per target at c=64")
    ap.add_argument("--serial", type=int, default=300, help="calls per target at c=1")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per target")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    nonce = os.path.basename(tmp)
    procs: list[subprocess.Popen] = []
    ep, gp, lp = free_port(), free_port(), free_port()
    engine_url, gw_url, ll_url = (f"http://127.0.0.1:{p}" for p in (ep, gp, lp))
    try:
        procs.append(start(envhub("engine", "--model", "zero", "--port", str(ep)),
                           f"{engine_url}/health"))
        procs.append(start(envhub("gateway", "--backend", "vllm", "--upstream", engine_url,
                                  "--port", str(gp), "--db", f"sqlite:///{tmp}/pool.db"),
                           f"{gw_url}/health"))
        targets = {}

        async def direct(http, w, i):
            async with http.post(f"{engine_url}/v1/completions", json={
                    "model": "zero", "prompt": PROMPT_IDS, "max_tokens": 8,
                    "return_token_ids": True}) as r:
                assert r.status == 200, await r.text()
                await r.read()

        conversations: dict[int, list] = {}
        sessions: dict[int, int] = {}

        async def gateway(http, w, i):
            # each worker is an agent: a 10-turn conversation per session, then a new session
            msgs = conversations.setdefault(w, [])
            if len(msgs) >= 20:
                msgs.clear()
                sessions[w] = sessions.get(w, 0) + 1
            msgs.append({"role": "user", "content": f"step {len(msgs)} of worker {w}"})
            key = f"bench-{nonce}-{w}-{sessions.get(w, 0)}"
            async with http.post(f"{gw_url}/v1/chat/completions", headers={
                    "authorization": f"Bearer {key}"}, json={
                    "model": "default", "max_tokens": 8, "messages": msgs}) as r:
                assert r.status == 200, await r.text()
                msgs.append((await r.json())["choices"][0]["message"])

        items: dict[int, list] = {}

        async def responses(http, w, i):
            # the same agent shape over the Responses API: output items echoed as input
            conv = items.setdefault(w, [])
            if len(conv) >= 20:
                conv.clear()
                sessions[-1 - w] = sessions.get(-1 - w, 0) + 1
            conv.append({"role": "user", "content": f"step {len(conv)} of worker {w}"})
            key = f"bench-r-{nonce}-{w}-{sessions.get(-1 - w, 0)}"
            async with http.post(f"{gw_url}/v1/responses", headers={
                    "authorization": f"Bearer {key}"}, json={
                    "model": "default", "max_output_tokens": 8, "input": conv}) as r:
                assert r.status == 200, await r.text()
                conv.extend((await r.json())["output"])

        targets["direct"] = direct
        targets["envhub"] = gateway
        targets["responses"] = responses
        exe = litellm_exe()
        if exe is not None:
            cfg = os.path.join(tmp, "litellm.yaml")
            with open(cfg, "w") as f:
                f.write("model_list:\n  - model_name: zero\n    litellm_params:\n"
                        f"      model: text-completion-openai/zero\n      api_base: "
                        f"{engine_url}/v1\n      api_key: none\n")
            procs.append(start([exe, "--config", cfg, "--port", str(lp), "--num_workers", "1"],
                               f"{ll_url}/health/liveliness",
                               env={"LITELLM_LOCAL_MODEL_COST_MAP": "True",
                                    "LITELLM_LOG": "ERROR",
                                    "LITELLM_MASTER_KEY": "sk-bench-master-key"}, timeout=180))

            async def litellm(http, w, i):
                async with http.post(f"{ll_url}/v1/completions", json={
                        "model": "zero", "prompt": "hello there", "max_tokens": 8},
                        headers={"authorization": "Bearer sk-bench-master-key"}) as r:
                    assert r.status == 200, await r.text()
                    await r.read()

            targets["litellm"] = litellm
        else:
            print("litellm proxy not installed (bash scripts/bench_venv.sh): column skipped")

        # New sessions every 20 calls, first turns only: every target's request stays the same
        # size. Warm up every target first.
        for fn in targets.values():
            asyncio.run(load(fn, 4, 40))
        # Targets alternate over several rounds, so the machine's drifting load (it is shared)
        # falls on all of them alike; each figure is the median over rounds.
        serial_rounds: dict[str, list] = {name: [] for name in targets}
        wide_rounds: dict[str, list] = {name: [] for name in targets}
        for _ in range(args.rounds):
            for name, fn in targets.items():
                serial_rounds[name].append(asyncio.run(load(fn, 1, args.serial // args.rounds)))
            for name, fn in targets.items():
                wide_rounds[name].append(asyncio.run(load(fn, 64, args.calls // args.rounds)))
        serial = {name: _median(r) for name, r in serial_rounds.items()}
        wide = {name: _median(r) for name, r in wide_rounds.items()}
    finally:
        for p in procs:
            p.kill()
            p.wait()
    base = serial["direct"]["p50"]
    print(f"{'target':<9} {'c=1 p50 ms':>11} {'added ms':>9} {'c=64 req/s':>11} "
          f"{'c=64 p99 ms':>12} {'errors':>7}")
    for name in targets:
        s, w = serial[name], wide[name]
        print(f"{name:<9} {s['p50']:>11.2f} {s['p50'] - base:>9.2f} {w['rps']:>11.0f} "
              f"{w['p99']:>12.1f} {s['errors'] + w['errors']:>7}")
    g = serial["envhub"]["p50"] - base
    print(f"envhub adds {g:.2f} ms p50 at c=1 (goal <= 1.0 ms); serves "
          f"{wide['envhub']['rps']:.0f} calls/s at c=64 in one process (goal >= 1,000)")
    if "litellm" in targets:
        ratio = wide["envhub"]["rps"] / wide["litellm"]["rps"]
        added = serial["litellm"]["p50"] - base
        print(f"litellm adds {added:.2f} ms p50; envhub/litellm req/s at c=64: {ratio:.1f}x "
              "(goal >= 10x)")


if __name__ == "__main__":
    main()
