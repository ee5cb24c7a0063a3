"""Per-turn gateway cost at turn 1, 32 and 128 of one session.

Incremental (TITO) rendering appends only the new messages' ids, so its cost stays flat; the
full re-render of the whole history (what a gateway that re-tokenizes would do) grows with the
turn. Both are measured in the same run, on the same conversation, with the bundled tokenizer.

    python bench/bench_turn_cost.py [--sessions 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import httpx

from envhub.gateway.backends.scripted import ScriptedBackend
from envhub.gateway.config import BUNDLED_MODEL, GatewayConfig
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.server import run_in_thread

CHECKPOINTS = (1, 32, 128)
TOOL = {"type": "function", "function": {"name": "bash", "description": "run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}
OBSERVATION = "\n".join(f"src/module_{i}.py: def handler_{i}(request): return {i}"
                        for i in range(8))


def script() -> list[str]:
    return ['<tool_call>\n{"name": "bash", "arguments": {"cmd": "grep -rn handler_%d src"}}\n'
            '</tool_call>' % i for i in range(200)]


async def one_session(url: str, key: str, renderer: ChatRenderer) -> dict[int, tuple]:
    msgs: list[dict] = [{"role": "system", "content": "You fix bugs."},
                        {"role": "user", "content": "Find the failing handler."}]
    out = {}
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        # sessions are opened up front (as the runner does), so turn 1 is a model call only
        key = (await http.post("/sessions", json={"session_id": key})).json()["api_key"]
        http.headers["authorization"] = f"Bearer {key}"
        for turn in range(1, max(CHECKPOINTS) + 1):
            body = {"model": "default", "messages": msgs, "tools": [TOOL], "max_tokens": 64}
            t0 = time.perf_counter()
            r = await http.post("/v1/chat/completions", json=body)
            call_ms = (time.perf_counter() - t0) * 1000
            data = r.json()
            msg = data["choices"][0]["message"]
            gateway_ms = data["envhub"]["gateway_ms"]
            render_ms = data["envhub"]["render_ms"]
            if turn in CHECKPOINTS:
                t1 = time.perf_counter()
                renderer.render_prompt(msgs, [TOOL])  # what a re-tokenizing gateway would do
                full_ms = (time.perf_counter() - t1) * 1000
                out[turn] = (gateway_ms, call_ms, full_ms, render_ms)
            msgs.append(msg)
            msgs.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                         "content": OBSERVATION})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=5)
    args = ap.parse_args()
    renderer = ChatRenderer.from_pretrained(BUNDLED_MODEL)
    backend = ScriptedBackend(renderer.encode, script(), renderer.stop_token_ids[0],
                              record_prompts=False)
    with tempfile.TemporaryDirectory() as tmp:
        gw = run_in_thread(GatewayConfig(port=0, db=f"sqlite:///{tmp}/pool.db"), backend)
        try:
            asyncio.run(one_session(gw.url, "warm-up", renderer))
            results = [asyncio.run(one_session(gw.url, f"bench-{i}", renderer))
                       for i in range(args.sessions)]
        finally:
            gw.close()
    print(f"per-turn cost, median of {args.sessions} sessions (bundled Qwen tokenizer, "
          "in-process scripted backend, SQLite pool, HTTP on loopback)")
    print("render ms = plan against the history + render the prompt ids (incremental); "
          "gateway ms = server-side time of the call minus the engine's (parse, plan, render, "
          "record); client ms = whole HTTP call seen by the client (includes JSON of the growing "
          "request); full re-render ms = template + tokenize of the whole history")
    print(f"{'turn':>6} {'render ms':>10} {'gateway ms':>11} {'client ms':>10} "
          f"{'full re-render ms':>18}")
    rows = {}
    for turn in CHECKPOINTS:
        gwm = statistics.median(r[turn][0] for r in results)
        call = statistics.median(r[turn][1] for r in results)
        full = statistics.median(r[turn][2] for r in results)
        ren = statistics.median(r[turn][3] for r in results)
        rows[turn] = (gwm, full, ren)
        print(f"{turn:>6} {ren:>10.2f} {gwm:>11.2f} {call:>10.2f} {full:>18.2f}")
    g1, f1, r1 = rows[1]
    g128, f128, r128 = rows[128]
    print(f"ratio turn128/turn1: incremental render {r128 / r1:.2f}x (target <= 1.5x)   "
          f"full re-render {f128 / f1:.2f}x   whole gateway call {g128 / g1:.2f}x (the agent "
          "resends its history: parsing and hashing it grows with the turn)")


if __name__ == "__main__":
    main()
