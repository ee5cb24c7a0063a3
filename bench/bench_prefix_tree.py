"""Prefix-tree packing vs naive batches on group trajectories (issue 7, item 5).

One run, figures side by side (no timing asserts). A group of G=8 sessions with 10+ turns
and context-management breaks is sampled from a real model; then the same training loss
(forward + backward over every sampled token) is computed three ways:
  tree         one packed tree per forward (shared prefixes once, ancestor mask)
  per-segment  a right-padded batch, one row per segment (what the trajectory holds)
  per-turn     a right-padded batch, one row per turn (context so far + completion): the
               common "each turn is a sample" trainer format, whose tokens grow as turns^2
Tokens columns: real (unpadded) tokens each method feeds the model, and the bound
naive/tree on the token count (compute that is linear in tokens cannot shrink more).

    .venv/bin/python bench/bench_prefix_tree.py [--turns 12] [--reps 2] [--bundled]

The default model is a random Qwen2 (h256 x 4 layers, 32k vocab). `--bundled` adds the
gateway's bundled tiny model, whose 151k-token LM head dominates its cost on CPU (the head
runs on the same loss tokens in every method, so it dilutes the ratios).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from envhub.trainer.forward import tree_logprobs
from envhub.trainer.prefix_tree import pack, plan_trees
from envhub.trainer.synthetic import RolloutShape, sample_group

TINY = Path(__file__).resolve().parents[1] / "gateway" / "engine" / "tiny"


def random_qwen2(vocab: int, hidden: int, layers: int, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3,
                      num_hidden_layers=layers, num_attention_heads=max(hidden // 64, 2),
                      num_key_value_heads=max(hidden // 128, 1), max_position_embeddings=8192,
                      attn_implementation="sdpa", tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).float()


def rows(trajectories, per_turn: bool) -> tuple[list[list[int]], list[list[int]]]:
    """(token ids, loss mask) per row: segments, or one row per turn."""
    out_ids, out_mask = [], []
    for t in trajectories:
        for seg in t.segments:
            if not per_turn:
                out_ids.append(seg.token_ids)
                out_mask.append(seg.loss_mask)
                continue
            end = 0
            for turn in (x for x in t.turns if x.segment == seg.index):
                start = end + len(turn.prompt_delta_ids)
                end = start + len(turn.completion_ids)
                out_ids.append(seg.token_ids[:end])
                out_mask.append([0] * start + [1] * (end - start))
    return out_ids, out_mask


def naive_step(model, ids: list[list[int]], masks: list[list[int]], micro: int) -> None:
    """Padded batches of `micro` rows; LM head only where a loss token is predicted."""
    n_loss = sum(sum(m[1:]) for m in masks)
    for i in range(0, len(ids), micro):
        chunk, mchunk = ids[i:i + micro], masks[i:i + micro]
        width = max(len(x) for x in chunk)
        x = torch.tensor([r + [0] * (width - len(r)) for r in chunk])
        att = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in chunk])
        # target[b, j]: position j predicts a loss token (token j+1 has loss mask 1)
        target = torch.tensor([m[1:] + [0] * (width - len(m)) + [0] for m in mchunk],
                              dtype=torch.bool)
        hidden = model.model(input_ids=x, attention_mask=att, use_cache=False).last_hidden_state
        logp = torch.log_softmax(model.lm_head(hidden[target]).float(), -1)
        nxt = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], 1)[target]
        (-logp.gather(1, nxt[:, None]).sum() / n_loss).backward()


def tree_step(model, ids: list[list[int]], masks: list[list[int]], budget: int) -> int:
    """Trees of at most `budget` nodes (the trainer's max_tokens_per_forward); returns the
    number of nodes processed."""
    n_loss = sum(sum(m[1:]) for m in masks)
    nodes = 0
    for b in plan_trees(ids, budget):
        tree = pack([ids[i] for i in b])
        nodes += tree.n_nodes
        out = tree_logprobs(model, tree, [masks[i] for i in b], with_entropy=False)
        (-out.logprobs.sum() / n_loss).backward()
    return nodes


def timed(fn, reps: int) -> tuple[float, float]:
    """(wall s, process CPU s), best of `reps` after a warm-up. CPU time is reported too
    because on a shared machine wall time mostly measures the neighbours."""
    fn()  # warm-up (allocator, kernels)
    wall = cpu = float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu


def bench(name: str, model, sampler, shape: RolloutShape, reps: int, micro: int,
          budgets: list[int]) -> None:
    group = sample_group(sampler, "bench", shape, seed=0)
    seg_ids, seg_masks = rows(group, per_turn=False)
    turn_ids, turn_masks = rows(group, per_turn=True)
    tree = pack(seg_ids)
    assert pack(turn_ids).n_nodes == tree.n_nodes  # per-turn rows are prefixes of segments
    unique = tree.n_nodes
    n_seg, n_turn = tree.n_sequence_tokens, sum(len(x) for x in turn_ids)
    model.zero_grad(set_to_none=True)
    trees = [(b, tree_step(model, seg_ids, seg_masks, b),
              timed(lambda b=b: tree_step(model, seg_ids, seg_masks, b), reps)) for b in budgets]
    t_tree = trees[0][2]
    t_seg = timed(lambda: naive_step(model, seg_ids, seg_masks, micro), reps)
    t_turn = timed(lambda: naive_step(model, turn_ids, turn_masks, micro), reps)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"\n== {name} ({params:.1f}M params), G={shape.sessions}, {shape.turns} turns, "
          f"CM break every {shape.cm_every} turns: {len(seg_ids)} segments, "
          f"{len(turn_ids)} turns")
    print(f"{'method':<16} {'tokens':>8} {'bound':>7} {'wall s':>8} {'vs tree':>8} "
          f"{'cpu s':>8} {'vs tree':>8}")
    rows_out = [(f"tree <={b}", n, t) for b, n, t in trees]
    rows_out += [("per-segment", n_seg, t_seg), ("per-turn", n_turn, t_turn)]
    for label, n, (wall, cpu) in rows_out:
        print(f"{label:<16} {n:>8} {n / unique:>6.2f}x {wall:>8.2f} {wall / t_tree[0]:>7.2f}x "
              f"{cpu:>8.2f} {cpu / t_tree[1]:>7.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--micro", type=int, default=8, help="rows per padded naive micro-batch")
    ap.add_argument("--bundled", action="store_true", help="also run the bundled tiny model")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8192, 2048, 1024],
                    help="max nodes per packed tree (the first is the reference row)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    shape = RolloutShape(sessions=8, turns=args.turns, prompt_len=128, completion_len=(8, 32),
                         tool_len=(8, 32), cm_every=6, keep_prompt=96, summary_len=32)
    if args.bundled and (TINY / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        tiny = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
        bench("bundled tiny model", tiny, tiny, shape, args.reps, args.micro, args.budgets)
    sampler = random_qwen2(32000, 64, 2, seed=1)  # cheap sampler sharing the vocabulary
    bench("random Qwen2 h256 x4", random_qwen2(32000, 256, 4), sampler, shape, args.reps,
          args.micro, args.budgets)


if __name__ == "__main__":
    main()
