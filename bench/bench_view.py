"""`envhub view` costs, side by side in one run:

  list      — building the sessions list of a pool with N sessions (4 reward events each):
              reward events read in one query (what the viewer does) versus one query per
              session (Store.events per row).
  decode    — the text of each token for T ids of mixed English/CJK text with the bundled
              tokenizer: the viewer's windowed decode (characters split across ids come out
              whole) versus decoding each id alone (splits them into U+FFFD), per 1k tokens.

    python bench/bench_view.py [--sessions 2000] [--tokens 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

from tokenizers import Tokenizer

from envhub.gateway.config import BUNDLED_MODEL
from envhub.gateway.pool.store import Store, op_event, op_insert
from envhub.sdk.types import RewardEvent
from envhub.viewer.sources import PoolSource
from envhub.viewer.tokens import TokenDecoder


def fill_pool(url: str, n: int) -> None:
    store = Store(url)
    ops = []
    for i in range(n):
        sid = uuid.uuid4().hex
        ops.append(op_insert("sessions", {
            "id": sid, "key_hash": uuid.uuid4().hex, "group_id": f"run-b:arith:t{i // 4}",
            "task_id": f"t{i // 4}", "env": "arith", "sample_index": i % 4, "status": "done",
            "created_at": time.time(), "metadata": "{}"}))
        for kind, value in (("outcome", 1.0), ("process", -0.5), ("time", 0.1),
                            ("reward_to_go", 0.2)):
            ops.append(op_event("rewards", sid, {"kind": kind, "value": value, "weight": 1.0}))
    asyncio.run(store.write(*ops))
    store.close()


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=20000)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'pool.db'}"
        fill_pool(url, args.sessions)
        source = PoolSource(url)
        store = source.store

        def per_row() -> None:
            for row in store.list_sessions(limit=args.sessions):
                [RewardEvent(**e) for e in store.events("rewards", row["id"])]

        batched = best_of(source.sessions)
        naive = best_of(per_row)
        assert len(source.sessions()) == args.sessions
        source.close()
    print(f"list {args.sessions} sessions: one query {batched * 1e3:.0f} ms, "
          f"query per session {naive * 1e3:.0f} ms, ratio {naive / batched:.1f}x")

    tok = Tokenizer.from_file(str(BUNDLED_MODEL / "tokenizer.json"))
    text = "The answer is 42, 因为六乘以七等于四十二. " * (args.tokens // 10)
    ids = tok.encode(text).ids[: args.tokens]
    decoder = TokenDecoder(BUNDLED_MODEL)
    windowed = best_of(lambda: decoder.pieces(ids))
    alone = best_of(lambda: [tok.decode([i], skip_special_tokens=False) for i in ids])
    broken = sum("\ufffd" in tok.decode([i]) for i in ids)
    per_k = 1e3 * 1e3 / len(ids)
    whole = "\ufffd" not in "".join(p.text for p in decoder.pieces(ids))
    print(f"decode {len(ids)} ids: windowed {windowed * per_k:.2f} ms/1k tokens, per id "
          f"{alone * per_k:.2f} ms/1k tokens, ratio {windowed / alone:.1f}x "
          f"(per id leaves {broken} ids as U+FFFD, windowed none: "
          f"{'ok' if whole else 'BAD'})")


if __name__ == "__main__":
    main()
