"""`envhub view` costs, side by side in one run:

  list      — building the sessions list of a pool with N sessions (4 reward events each):
              reward events read in one query (what the viewer does) versus one query per
              session (Store.events per row).
  decode    — the text of each token for T ids of mixed English/CJK text with the bundled
              tokenizer: the viewer's windowed decode (characters split across ids come out
              whole) versus decoding each id alone (splits them into U+FFFD), per 1k tokens.
  curves    — a training run's curves page (`/runs/RUN/curves`, every series of metrics.jsonl
              drawn by matplotlib) for a metrics file of S steps (an eval every 15), read and
              drawn, against the same for 100 steps; and the page's size.

    python bench/bench_view.py [--sessions 2000] [--tokens 20000] [--steps 10000]
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


def metrics_file(folder: Path, steps: int) -> Path:
    """A metrics.jsonl of `steps` train rows with the series `envhub train` writes (an eval
    row every 15 steps), values moving as a run's do."""
    import json
    import math
    import random

    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as f:
        for step in range(steps):
            p = 1 - math.exp(-step / max(1, steps / 4))
            row = {"phase": "train", "step": step, "weight_version": step + 1,
                   "reward_mean": 0.2 + 0.6 * p + rng.gauss(0, 0.05),
                   "resolved_rate": 0.1 + 0.7 * p, "outcome_mean": 0.1 + 0.7 * p,
                   "rollout_s": rng.uniform(1, 3), "train_s": rng.uniform(2, 4),
                   "push_s": 0.3, "wall_s": 6.0 * step, "rollouts": 64.0,
                   "groups_trained": 16, "in_flight": 16, "queued": 3,
                   "filter/stale": float(rng.randint(0, 4)), "staleness/mean": rng.random(),
                   "staleness/max": 2.0, "versions/mixed_samples": 1.0,
                   "mix/arith/trained_share": 1.0, "mix/arith/trained_samples": 64.0 * step,
                   **{f"trainer/{k}": rng.random() for k in (
                       "loss/pg", "policy/entropy", "kl/rollout_train_k1",
                       "kl/rollout_train_k3", "is/masked_fraction", "is/ratio_min",
                       "is/ratio_max", "tokens/packed", "tokens/naive", "grad/norm")}}
            f.write(json.dumps(row) + "\n")
            if step % 15 == 14:
                f.write(json.dumps({"phase": "eval", "after_step": step,
                                    "eval/reward_mean": 0.3 + 0.5 * p,
                                    "eval/resolved_rate": 0.2 + 0.6 * p}) + "\n")
    return folder


def curves(steps: int) -> None:
    from envhub.viewer.curves import read_metrics, render

    with tempfile.TemporaryDirectory() as tmp:
        big, small = metrics_file(Path(tmp) / "big", steps), metrics_file(Path(tmp) / "s", 100)
        render([("warm", read_metrics(small))])  # matplotlib's import and font cache
        t_small = best_of(lambda: render([("run", read_metrics(small))]))
        t_big = best_of(lambda: render([("run", read_metrics(big))]))
        size = sum(len(c.svg) for c in render([("run", read_metrics(big))]))
        t_two = best_of(lambda: render([("a", read_metrics(big)), ("b", read_metrics(big))]))
    print(f"curves page, {steps} steps: {t_big:.2f} s ({size / 1e6:.1f} MB of SVG); 100 steps "
          f"{t_small:.2f} s, ratio {t_big / t_small:.1f}x; two {steps}-step runs compared "
          f"{t_two:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--steps", type=int, default=10000)
    args = ap.parse_args()
    curves(args.steps)

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
