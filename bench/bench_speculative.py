"""Grouped speculative decoding (issue 28, Seer) on arith groups of 8: with and without.

Each group is one arith task's first-turn prompt (agent system prompt, tool schemas, question)
sampled 8 times at temperature 1 on the bundled model, `--groups` groups at once, the way an RL
step samples. Both modes run in this process on the same prompts and seeds; printed per mode:
tokens per row-forward (tokens a sequence gains per forward pass it is in), tokens per batch
forward, drafted and accepted tokens, wall-clock tokens/s, and the ratio of the two.

    .venv/bin/python bench/bench_speculative.py [--groups 4] [--max-tokens 96] [--repeats 3]
        [--turns 2] [--device cpu]

`--turns 2` also samples a second turn: each sample's first completion plus a tool result,
where the group's earlier turns are in the draft index (Seer's multi-turn case).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from envhub.gateway.backends.base import GenerateRequest, GenerateResult, SamplingParams
from envhub.gateway.engine import BUNDLED_MODEL, Engine, EngineConfig

SAMPLES = 8


def arith_prompts(count: int) -> tuple[list[list[int]], Any]:
    """First-turn prompt ids of `count` arith tasks, as the built-in agent renders them."""
    from envhub.envs.agents.tool_calling import SYSTEM_PROMPT
    from envhub.envs.agents.toolbox import Toolbox
    from envhub.envs.loader import load_env
    from envhub.gateway.render.chat_template import ChatRenderer
    from envhub.gateway.render.messages import normalize_message

    env = load_env("arith").env
    renderer = ChatRenderer.from_pretrained(BUNDLED_MODEL)
    prompts = []
    for task in env.load_tasks()[:count]:
        messages = [{"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": task.instruction}]
        tools = Toolbox(env, task, sandbox=None).schemas  # type: ignore[arg-type]
        prompts.append(renderer.render_prompt(
            [normalize_message(m, i) for i, m in enumerate(messages)], tools).ids)
    return prompts, renderer


def second_turn(renderer: Any, prompt: list[int], first: GenerateResult) -> list[int]:
    """prompt + first completion + a tool result turn: the next prompt of that sample."""
    from envhub.gateway.render.messages import normalize_message

    tool = normalize_message({"role": "tool", "tool_call_id": "call_0", "content": "42"}, 0)
    return prompt + first.completion_ids + renderer.render_continuation(
        first.completion_ids, [tool], None).ids


async def run_groups(engine: Engine, prompts: list[list[int]], max_tokens: int, seed: int,
                     tag: str) -> list[GenerateResult]:
    requests = [GenerateRequest(list(p), SamplingParams(max_tokens=max_tokens, temperature=1.0,
                                                        seed=seed * 1000 + g * SAMPLES + i),
                                group_id=f"{tag}-{g}")
                for g, p in enumerate(prompts) for i in range(SAMPLES)]
    return list(await asyncio.gather(*(engine.generate(r) for r in requests)))


def measure(engine: Engine, prompts: list[list[int]], renderer: Any, args: argparse.Namespace,
            rep: int, totals: dict[str, float]) -> None:
    """One repeat (all groups, `args.turns` turns) on `engine`, added to `totals`."""
    before = engine.stats()
    t0 = time.perf_counter()
    results = asyncio.run(run_groups(engine, prompts, args.max_tokens, rep, f"r{rep}"))
    if args.turns > 1:
        nexts = [second_turn(renderer, prompts[k // SAMPLES], r) for k, r in enumerate(results)]
        results += asyncio.run(_second(engine, nexts, args, rep))
    totals["wall_s"] += time.perf_counter() - t0
    after = engine.stats()
    totals["tokens"] += sum(len(r.completion_ids) for r in results)
    totals["row_forwards"] += sum(r.forwards or 0 for r in results)
    for k in ("forwards", "drafted_tokens", "accepted_tokens", "spec_steps"):
        totals[k] += after[k] - before[k]


async def _second(engine: Engine, prompts: list[list[int]], args: argparse.Namespace,
                  rep: int) -> list[GenerateResult]:
    requests = [GenerateRequest(p, SamplingParams(max_tokens=args.max_tokens, temperature=1.0,
                                                  seed=rep * 1000 + 500 + k),
                                group_id=f"r{rep}-{k // SAMPLES}")
                for k, p in enumerate(prompts)]
    return list(await asyncio.gather(*(engine.generate(r) for r in requests)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--turns", type=int, default=1, choices=(1, 2))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-draft", type=int, default=8)
    args = ap.parse_args()
    prompts, renderer = arith_prompts(args.groups)
    engines = {mode: Engine(EngineConfig(device=args.device, threads=args.threads,
                                         max_batch_size=args.groups * SAMPLES,
                                         speculative=mode, spec_max_draft=args.max_draft))
               for mode in ("off", "group")}
    rows: dict[str, dict[str, float]] = {mode: dict.fromkeys(
        ("tokens", "wall_s", "row_forwards", "forwards", "drafted_tokens", "accepted_tokens",
         "spec_steps"), 0.0) for mode in engines}
    for engine in engines.values():
        asyncio.run(run_groups(engine, prompts[:1], 8, 99, "warm"))  # warm-up
    for rep in range(args.repeats):  # interleaved, so load from elsewhere hits both alike
        for mode, engine in engines.items():
            measure(engine, prompts, renderer, args, rep, rows[mode])
    for engine in engines.values():
        engine.close()
    for r in rows.values():
        r["tokens_per_s"] = r["tokens"] / r["wall_s"]
        r["tokens_per_row_forward"] = r["tokens"] / r["row_forwards"]
        r["tokens_per_batch_forward"] = r["tokens"] / r["forwards"]
    print(f"arith groups of {SAMPLES}: {args.groups} groups x {args.repeats} repeats, "
          f"{args.turns} turn(s), max_tokens {args.max_tokens}, temperature 1, "
          f"device {args.device}")
    print(f"{'mode':6} {'tokens':>7} {'tok/row-fwd':>11} {'tok/batch-fwd':>13} "
          f"{'drafted':>8} {'accepted':>8} {'acc.rate':>8} {'tok/s':>8} {'wall s':>7}")
    for mode, r in rows.items():
        rate = r["accepted_tokens"] / r["drafted_tokens"] if r["drafted_tokens"] else 0.0
        print(f"{mode:6} {r['tokens']:7.0f} {r['tokens_per_row_forward']:11.2f} "
              f"{r['tokens_per_batch_forward']:13.2f} {r['drafted_tokens']:8.0f} "
              f"{r['accepted_tokens']:8.0f} {rate:8.2f} {r['tokens_per_s']:8.1f} "
              f"{r['wall_s']:7.2f}")
    ratio = rows["group"]["tokens_per_s"] / rows["off"]["tokens_per_s"]
    completions = args.repeats * args.groups * SAMPLES * args.turns
    mean = statistics.fmean([rows["off"]["tokens"], rows["group"]["tokens"]]) / completions
    print(f"speed-up (tokens/s, group / off): {ratio:.2f}x; mean completion {mean:.1f} tokens")


if __name__ == "__main__":
    main()
