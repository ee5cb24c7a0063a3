"""Prefix-tree packing vs unmerged batches (issues 7 and 28), side by side in one run.

The same training loss (forward + backward over every loss token) is computed as:
  tree, <mode>   one packed prefix tree per forward (shared prefixes once), tree attention in
                 each mode that can run here: blocks (block-sparse SDPA, the CPU path), dense
                 ([N, N] mask, model's SDPA), flex (FlexAttention, compiled; CUDA only: torch
                 has no flex backward on the CPU, so there the row reads n/a)
  packed         the unmerged packed batch: every sequence its own chain in one row
                 (`pack(merge=False)`: packed variable-length sequences, no padding), through
                 the same attention the selector picks for this device: the fair baseline
  padded         a right-padded batch, one row per sequence (`--micro` rows per forward)
  per-turn       (group workload) a padded batch with one row per turn (context so far +
                 completion): the "each turn is a sample" format, tokens grow as turns^2
`bound` is the token bound: tokens the row feeds the model / tree nodes (compute linear in
tokens cannot shrink more than the packed row's bound). `auto` names what the trainer's
selector (TrainerConfig.tree_attention="auto") runs for this workload: merged or not
(on CUDA: token bound >= 1.1; always on the CPU), and which mode
(tree_attention.choose_attention).

Workloads: `group` samples G=8 sessions with 10+ turns and context-management breaks from a
small model; `shared` is the issue-28 shape, `--samples` x (`--shared` common + `--own`
tokens), loss on the own tokens.

    .venv/bin/python bench/bench_prefix_tree.py [--turns 12] [--reps 2] [--bundled]
    .venv/bin/python bench/bench_prefix_tree.py --workload shared --shared 256 --own 64
    # the issue's GPU shape: Qwen2 h1024 x 4 layers, 8 x (2048 + 512), bf16
    python bench/bench_prefix_tree.py --device cuda --dtype bf16 --hidden 1024 --layers 4 \
        --workload shared --shared 2048 --own 512 --budgets 32768

The default model is a random Qwen2 (h256 x 4 layers, 32k vocab). `--bundled` adds the
gateway's bundled tiny model (group workload, CPU), whose 151k-token LM head dominates.
`--check` instead compares tree and naive logprobs and gradients (fp32, 1e-5) for four tiny
model configs in every mode: on CUDA it is the check of flex's backward.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from envhub.trainer.flex_tree import flex_available
from envhub.trainer.forward import tree_logprobs
from envhub.trainer.prefix_tree import pack, plan_trees
from envhub.trainer.synthetic import RolloutShape, sample_group
from envhub.trainer.tree_attention import choose_attention, worth_merging

TINY = Path(__file__).resolve().parents[1] / "gateway" / "engine" / "tiny"
Rows = tuple[list[list[int]], list[list[int]]]  # (token ids, loss mask) per sequence


def random_qwen2(vocab: int, hidden: int, layers: int, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3,
                      num_hidden_layers=layers, num_attention_heads=max(hidden // 64, 2),
                      num_key_value_heads=max(hidden // 128, 1), max_position_embeddings=8192,
                      attn_implementation="sdpa", tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).float()


def rows(trajectories, per_turn: bool) -> Rows:
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


def shared_rows(samples: int, shared: int, own: int, vocab: int) -> Rows:
    """`samples` sequences of one common prefix + their own tokens; loss on the own ones."""
    g = torch.Generator().manual_seed(0)
    trunk = torch.randint(0, vocab, (shared,), generator=g).tolist()
    ids = [trunk + torch.randint(0, vocab, (own,), generator=g).tolist()
           for _ in range(samples)]
    return ids, [[0] * shared + [1] * own for _ in range(samples)]


def naive_step(model, ids: list[list[int]], masks: list[list[int]], micro: int) -> None:
    """Padded batches of `micro` rows; LM head only where a loss token is predicted."""
    device = next(model.parameters()).device
    n_loss = sum(sum(m[1:]) for m in masks)
    for i in range(0, len(ids), micro):
        chunk, mchunk = ids[i:i + micro], masks[i:i + micro]
        width = max(len(x) for x in chunk)
        x = torch.tensor([r + [0] * (width - len(r)) for r in chunk], device=device)
        att = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in chunk], device=device)
        # target[b, j]: position j predicts a loss token (token j+1 has loss mask 1)
        target = torch.tensor([m[1:] + [0] * (width - len(m)) + [0] for m in mchunk],
                              dtype=torch.bool, device=device)
        hidden = model.model(input_ids=x, attention_mask=att, use_cache=False).last_hidden_state
        logp = torch.log_softmax(model.lm_head(hidden[target]).float(), -1)
        nxt = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], 1)[target]
        (-logp.gather(1, nxt[:, None]).sum() / n_loss).backward()


def tree_step(model, ids: list[list[int]], masks: list[list[int]], budget: int,
              attention: str, merge: bool = True) -> int:
    """Trees of at most `budget` nodes (the trainer's max_tokens_per_forward) in mode
    `attention`; merge=False packs every sequence as its own chain. Returns the nodes run."""
    n_loss = sum(sum(m[1:]) for m in masks)
    nodes = 0
    for b in plan_trees(ids, budget, merge):
        tree = pack([ids[i] for i in b], merge=merge)
        nodes += tree.n_nodes
        out = tree_logprobs(model, tree, [masks[i] for i in b], with_entropy=False,
                            attention=attention)
        (-out.logprobs.sum() / n_loss).backward()
    return nodes


def timed(fn: Callable[[], object], reps: int, cuda: bool) -> tuple[float, float]:
    """(wall s, process CPU s), best of `reps` after a warm-up (which also compiles flex). CPU
    time is reported too because on a shared machine wall time mostly measures the
    neighbours."""
    def run() -> None:
        fn()
        if cuda:
            torch.cuda.synchronize()

    run()
    wall = cpu = float("inf")
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        run()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return wall, cpu


def tree_modes() -> list[str]:
    return ["blocks", "dense"] + (["flex"] if flex_available() else [])


def bench(title: str, model, data: Rows, extra: list[tuple[str, Rows]], args) -> None:
    """Time every method on `data` (+ `extra` padded row sets) and print one table."""
    ids, masks = data
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    budget = args.budgets[0]
    tree = pack(ids)
    unique = tree.n_nodes
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    auto_mode = choose_attention("auto", device.type, head_dim, 0.0, min(unique, budget))
    merged = worth_merging(tree.n_sequence_tokens, unique, device.type)
    measured: dict[str, tuple[int, tuple[float, float] | None]] = {}
    model.zero_grad(set_to_none=True)
    for mode in tree_modes():
        if mode == "flex" and not cuda:
            measured[f"tree, {mode}"] = (unique, None)  # no flex backward on the CPU
            continue
        for b in (args.budgets if mode == auto_mode else [budget]):
            label = f"tree, {mode}" + (f" <={b}" if b != budget else "")
            run = partial(tree_step, model, ids, masks, b, mode)
            measured[label] = (run(), timed(run, args.reps, cuda))
    packed = partial(tree_step, model, ids, masks, budget, auto_mode, merge=False)
    measured[f"packed, {auto_mode}"] = (packed(), timed(packed, args.reps, cuda))
    measured["padded"] = (tree.n_sequence_tokens,
                          timed(lambda: naive_step(model, ids, masks, args.micro), args.reps,
                                cuda))
    for name, (xi, xm) in extra:
        measured[name] = (sum(map(len, xi)),
                          timed(lambda xi=xi, xm=xm: naive_step(model, xi, xm, args.micro),
                                args.reps, cuda))
    auto_row = f"tree, {auto_mode}" if merged else f"packed, {auto_mode}"
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"\n== {title} ({params:.1f}M params, {device.type}, {args.dtype}): "
          f"{len(ids)} sequences, {tree.n_sequence_tokens} tokens, {unique} tree nodes, "
          f"token bound {tree.n_sequence_tokens / unique:.2f}x")
    rule = ("bound >= 1.1" if merged else "bound < 1.1") if cuda else "always on the CPU"
    print(f"auto -> {auto_row} ({'merge' if merged else 'do not merge'}: {rule}; "
          f"mode {auto_mode} on {device.type})")
    ref = measured[auto_row][1]
    assert ref is not None
    print(f"{'method':<20} {'tokens':>8} {'bound':>7} {'wall s':>8} {'vs auto':>8} "
          f"{'cpu s':>8} {'vs auto':>8}")
    for label, (n, t) in measured.items():
        mark = " *" if label == auto_row else ""
        if t is None:
            print(f"{label:<20} {n:>8} {n / unique:>6.2f}x   n/a (no CPU backward)")
            continue
        print(f"{label + mark:<20} {n:>8} {n / unique:>6.2f}x {t[0]:>8.3f} {t[0] / ref[0]:>7.2f}x "
              f"{t[1]:>8.2f} {t[1] / ref[1]:>7.2f}x")


def tiny_model(arch: str):
    """2-layer random fp32 models with GQA, as tests/trainer/models.py builds them: Mistral
    slides a 16-token window on every layer, Gemma-2 soft-caps at 5 and slides on layer 0."""
    import transformers as tf

    torch.manual_seed(0)
    common = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 1024, "attn_implementation": "sdpa"}
    if arch == "gemma2":
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(
            **{**common, "attn_implementation": "eager"}, head_dim=16, sliding_window=16,
            attn_logit_softcapping=5.0, query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention"]))
        with torch.no_grad():  # scores of ~+-10, so the cap at 5 bites
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(10)
                layer.self_attn.k_proj.weight.mul_(10)
        return model.float()
    cls = {"qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
           "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
           "mistral": (tf.MistralConfig, tf.MistralForCausalLM)}[arch]
    extra = {"sliding_window": 16} if arch == "mistral" else {}
    return cls[1](cls[0](**common, **extra)).float()


def check(device: torch.device) -> bool:
    """Tree vs each sequence alone through the model's own attention, fp32: max |difference|
    of logprobs and of parameter gradients, per model and mode (what the CPU tests cannot
    run: flex's backward needs CUDA; on the CPU flex is checked forward only)."""
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (the flex kernel too)
    ids, _ = shared_rows(6, 24, 30, 512)
    ids += [ids[0][:24] + ids[1][24:40] + [5] * 20, list(range(300, 350))]  # fork, own root
    # Per-token loss weights in [-1, 1] over the token count, as the trainer normalises.
    n_tok = sum(len(s) - 1 for s in ids)
    weights = [torch.linspace(-1, 1, len(s) - 1) / n_tok for s in ids]
    ok = True
    print(f"{'model':<8} {'mode':<7} {'max |d logprob|':>16} {'max |d grad|':>13} "
          f"{'max |grad|':>11}  (tol 1e-5)")
    for arch in ("qwen2", "llama", "mistral", "gemma2"):
        model = tiny_model(arch).to(device).train()  # no dropout in these models

        def grads(m=model) -> dict[str, torch.Tensor]:
            out = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
            m.zero_grad(set_to_none=True)
            return out

        lps = []
        for seq, w in zip(ids, weights, strict=True):
            x = torch.tensor([seq], device=device)
            lp = torch.log_softmax(model(input_ids=x, use_cache=False).logits[0, :-1], -1)
            lps.append(lp[torch.arange(len(seq) - 1), x[0, 1:]])
            (lps[-1] * w.to(device)).sum().backward()
        naive, g_naive = torch.cat(lps).detach(), grads()
        for mode in tree_modes():
            backward = mode != "flex" or device.type == "cuda"
            with torch.set_grad_enabled(backward):
                out = tree_logprobs(model, pack(ids), with_entropy=False, attention=mode)
            d_lp = (out.logprobs.detach() - naive).abs().max().item()
            d_g = float("nan")
            if backward:
                (out.logprobs * torch.cat(weights).to(device)).sum().backward()
                g = grads()
                d_g = max((g[n] - g_naive[n]).abs().max().item() for n in g_naive)
            good = d_lp <= 1e-5 and (not backward or d_g <= 1e-5)
            ok &= good
            note = "" if backward else "  (forward only: no flex backward here)"
            g_max = max(g.abs().max().item() for g in g_naive.values())
            print(f"{arch:<8} {mode:<7} {d_lp:>16.2e} {d_g:>13.2e} {g_max:>11.2e}  "
                  f"{'ok' if good else 'FAIL'}{note}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=["group", "shared"], default="group")
    ap.add_argument("--turns", type=int, default=12, help="group: turns per session")
    ap.add_argument("--samples", type=int, default=8, help="shared: sequences")
    ap.add_argument("--shared", type=int, default=256, help="shared: common prefix tokens")
    ap.add_argument("--own", type=int, default=64, help="shared: own tokens per sequence")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--micro", type=int, default=8, help="rows per padded naive micro-batch")
    ap.add_argument("--bundled", action="store_true", help="also run the bundled tiny model")
    ap.add_argument("--budgets", type=int, nargs="+", default=[8192, 2048],
                    help="max nodes per packed tree (the first for every row; the others "
                    "for the mode the selector picks)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                    help="parameter dtype (default: bf16 on CUDA, fp32 on the CPU)")
    ap.add_argument("--check", action="store_true", help="only check tree vs naive (fp32) "
                    "for Qwen2, Llama, Mistral and Gemma-2 in every mode; exit 1 on a miss")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.check:
        raise SystemExit(0 if check(device) else 1)
    args.dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if device.type == "cpu":
        torch.set_num_threads(2)
    vocab = 32000
    if args.workload == "shared":
        data, extra = shared_rows(args.samples, args.shared, args.own, vocab), []
        what = f"{args.samples} x ({args.shared} shared + {args.own} own)"
    else:
        shape = RolloutShape(sessions=8, turns=args.turns, prompt_len=128,
                             completion_len=(8, 32), tool_len=(8, 32), cm_every=6,
                             keep_prompt=96, summary_len=32)
        sampler = random_qwen2(vocab, 64, 2, seed=1)  # cheap sampler sharing the vocabulary
        group = sample_group(sampler, "bench", shape, seed=0)
        data, extra = rows(group, per_turn=False), [("per-turn", rows(group, per_turn=True))]
        what = f"G=8, {args.turns} turns, CM break every {shape.cm_every} turns"
        if args.bundled and (TINY / "config.json").is_file():
            from transformers import AutoModelForCausalLM

            tiny = AutoModelForCausalLM.from_pretrained(TINY, dtype=dtype).to(device)
            bench(f"bundled tiny model, {what}", tiny, data, extra, args)
    model = random_qwen2(vocab, args.hidden, args.layers).to(device=device, dtype=dtype)
    bench(f"random Qwen2 h{args.hidden} x{args.layers}, {what}", model, data, extra, args)


if __name__ == "__main__":
    main()
