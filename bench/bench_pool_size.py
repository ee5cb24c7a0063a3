"""Pool size: bytes stored per unique token over 50-turn sessions (target <= 12).

Sessions are realistic tool-calling conversations (tool calls out, multi-line observations in)
through the real gateway into SQLite. "Unique tokens" are the tokens of the sessions' segments
(each token once, however many later prompts repeat it). Stored bytes are the SQLite file after
VACUUM minus an empty pool, so page overhead, indexes and row headers are all counted.

    python bench/bench_pool_size.py [--sessions 20 --turns 50]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile

import httpx

from envhub.gateway.backends.scripted import ScriptedBackend
from envhub.gateway.config import BUNDLED_MODEL, GatewayConfig
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.server import run_in_thread

TOOL = {"type": "function", "function": {"name": "bash", "description": "run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}


def observation(k: int) -> str:
    return "\n".join(f"tests/test_mod{k}.py::test_case_{j} {'PASSED' if j % 3 else 'FAILED'}"
                     for j in range(6))


def vacuumed_size(path: str) -> int:
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("VACUUM")
    con.close()
    return os.path.getsize(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--turns", type=int, default=50)
    args = ap.parse_args()
    renderer = ChatRenderer.from_pretrained(BUNDLED_MODEL)
    script = ['I will look at the failing test first.\n<tool_call>\n{"name": "bash", '
              '"arguments": {"cmd": "python -m pytest tests/test_mod%d.py -x -q"}}\n</tool_call>'
              % i for i in range(64)]
    backend = ScriptedBackend(renderer.encode, script, renderer.stop_token_ids[0],
                              record_prompts=False)
    tmp = tempfile.mkdtemp()
    empty = f"{tmp}/empty.db"
    gw = run_in_thread(GatewayConfig(port=0, db=f"sqlite:///{empty}"), backend)
    gw.close()
    path = f"{tmp}/pool.db"
    gw = run_in_thread(GatewayConfig(port=0, db=f"sqlite:///{path}"), backend)
    unique = prompt_sum = turns = 0
    try:
        with httpx.Client(base_url=gw.url, timeout=60) as http:
            for s in range(args.sessions):
                key = f"size-{s}"
                msgs = [{"role": "system", "content": "You are a careful software engineer."},
                        {"role": "user", "content": f"Fix the failing tests in module {s}."}]
                for k in range(args.turns):
                    r = http.post("/v1/chat/completions", headers={
                        "authorization": f"Bearer {key}"}, json={
                        "model": "default", "messages": msgs, "tools": [TOOL]})
                    msg = r.json()["choices"][0]["message"]
                    msgs += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                                   "content": observation(k)}]
                t = http.get(f"/sessions/{key}/trajectory").json()
                unique += sum(len(seg["token_ids"]) for seg in t["segments"])
                prompt_sum += sum(len(turn["prompt_ids"]) for turn in t["turns"])
                turns += len(t["turns"])
    finally:
        gw.close()
    stored = vacuumed_size(path) - vacuumed_size(empty)
    print(f"{args.sessions} sessions x {args.turns} turns, {turns} turns, {unique} unique tokens")
    print(f"stored bytes per unique token: {stored / unique:.2f} (target <= 12)")
    print(f"storing every turn's full prompt instead would hold {prompt_sum / unique:.1f}x the "
          f"tokens ({prompt_sum} prompt tokens in all)")


if __name__ == "__main__":
    main()
