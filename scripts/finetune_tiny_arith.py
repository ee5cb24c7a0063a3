"""Fine-tune the bundled tiny model on the `arith` task format (SFT on ideal agent behaviour).

    python scripts/finetune_tiny_arith.py --out gateway/engine/tiny            # the bundled one
    python scripts/finetune_tiny_arith.py --base DIR --out DIR --seed 1 --steps 40
    python scripts/finetune_tiny_arith.py --eval gateway/engine/tiny --temperature 1.0

Why: `envhub train arith` needs a starting policy that already speaks the format (Hermes tool
calls to `calculator`, then `submit`) yet is far from perfect, so RL has room to improve it. A
random model never produces a parseable tool call; a converged one leaves nothing to learn.

What it trains on: exactly the token ids the gateway sends the engine when the built-in agent
(`envs/agents/tool_calling.py`) behaves ideally on an arith problem: the first prompt rendered
by `ChatRenderer.render_prompt` (agent system prompt, task instruction, the env's tool schemas),
then per turn the assistant's text tokens + `<|im_end|>` (the sampled part: the only tokens with
loss) and the `render_continuation` ids of the tool result. Problems come from seeds disjoint
from the env's evaluation seed, and any question equal to an evaluation question is dropped.

Half of each batch is the same conversations without the system prompt and tool schemas
they all share (`shortened`): a tiny model learns to copy numbers from the question far sooner
in a short context, and rotary positions carry that over to the full one.

    python scripts/finetune_tiny_arith.py --save-examples ex.json.gz        # data only
    python scripts/finetune_tiny_arith.py --examples ex.json.gz --device cuda --out DIR

How: fp32 AdamW (CPU by default; `--device`); the 151k-row LM head is evaluated only at loss
positions and, in training, over the tokens the data targets plus K sampled others (sampled
softmax; the exact full-vocabulary loss is reported on held-out conversations); the base's body
linear layers are scaled down first (`rescale_body` says why). Same base weights, seed, options
and thread count give byte-identical weights (on the same CPU kind and torch build: float
kernels differ between instruction sets); saved as bf16 safetensors with the base file's tensor
names, plus `provenance.json` (base and fine-tune records with digests). `--base random` (the
default) rebuilds the seeded random base of `scripts/build_tiny_model.py` and checks it against
the sha256 recorded in `provenance.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gzip
import hashlib
import json
import math
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = ROOT / "gateway" / "engine" / "tiny"
PROVENANCE = "provenance.json"  # beside the weights: how they were made, with digests
WEIGHTS = "model.safetensors"
# Files of a model folder the fine-tune never changes (copied from the base as they are).
FOLDER_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
DIGIT_IDS = (15, 24)  # "0".."9" in Qwen2's vocabulary (digits are single tokens)
USER_TURN_TOKENS = 3  # "<|im_start|>" "user" "\n"
PAD_ID = 151643  # <|endoftext|>; padded positions are masked out of attention and loss


@dataclass
class Example:
    """One conversation as the engine sees it: ids [T] and loss_mask [T] (1 = sampled token)."""

    ids: list[int]
    loss_mask: list[int]
    family: str = ""  # the arith problem family (reported separately by `score`)

    def __post_init__(self) -> None:
        assert len(self.ids) == len(self.loss_mask), "ids and loss_mask must be parallel"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- data: the ideal agent's conversations, token-exact ------------------------------------------

def arith_env() -> Any:
    from envhub.envs.loader import load_env

    return load_env("arith").env


def training_tasks(env: Any, seed: int, count: int) -> list[Any]:
    """`count` arith tasks from `seed` (never the env's evaluation seed), minus any question the
    evaluation set also has."""
    if seed == env.seed:
        raise ValueError(f"--data-seed {seed} is the arith evaluation seed; pick another one")
    held_out = {t.data["question"] for t in env.load_tasks()}
    train_env = copy.copy(env)
    train_env.seed, train_env.count = seed, count
    return [t for t in train_env.load_tasks() if t.data["question"] not in held_out]


def tool_call_text(name: str, arguments: dict[str, str]) -> str:
    """The assistant text of one Hermes tool call, as the chat template itself renders one."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


async def conversation(env: Any, task: Any, renderer: Any) -> Example:
    """Ids the gateway would send for the ideal rollout: one calculator call per gold step, then
    submit. Tool results come from the env's own tool (so they are what the agent would see)."""
    from envhub.envs.agents.tool_calling import SYSTEM_PROMPT
    from envhub.envs.agents.toolbox import Toolbox
    from envhub.gateway.render.messages import normalize_message

    tools = Toolbox(env, task, sandbox=None).schemas  # type: ignore[arg-type]
    messages = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": task.instruction}]
    ids = renderer.render_prompt([normalize_message(m, i) for i, m in enumerate(messages)],
                                 tools).ids
    mask = [0] * len(ids)
    end_id = renderer.stop_token_ids[0]  # <|im_end|>: the engine samples it and stops
    calls = [("calculator", {"expression": step}) for step in task.data["steps"]]
    calls.append(("submit", {"answer": str(task.data["answer"])}))
    for i, (name, arguments) in enumerate(calls):
        completion = renderer.encode(tool_call_text(name, arguments)) + [end_id]
        ids += completion
        mask += [1] * len(completion)
        if name == "submit":
            break  # the agent stops after submit: no further prompt
        result = await env.call_tool(task, name, json.dumps(arguments), None, {})
        assert not result.is_error, f"gold step {arguments} failed: {result.content}"
        tool_msg = normalize_message({"role": "tool", "tool_call_id": f"call_{i}",
                                      "content": result.content}, 0)
        cont = renderer.render_continuation(completion, [tool_msg], tools).ids
        ids += cont
        mask += [0] * len(cont)
    return Example(ids, mask, task.data.get("family", ""))


def build_examples(base: Path, seed: int, count: int) -> list[Example]:
    from envhub.gateway.render.chat_template import ChatRenderer

    renderer = ChatRenderer.from_pretrained(base)
    env = arith_env()

    async def render_all() -> list[Example]:  # one event loop for all the env's tool calls
        return [await conversation(env, task, renderer)
                for task in training_tasks(env, seed, count)]
    return asyncio.run(render_all())


# -- training ------------------------------------------------------------------------------------

def batch_tensors(batch: list[Example], device: str = "cpu") -> tuple[Any, Any, Any]:
    """Right-padded ids [B, T], attention mask [B, T], loss mask [B, T] (all torch.long)."""
    import torch

    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), PAD_ID, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    loss = torch.zeros((len(batch), width), dtype=torch.long)
    for row, e in enumerate(batch):
        ids[row, :len(e.ids)] = torch.tensor(e.ids)
        attn[row, :len(e.ids)] = 1
        loss[row, :len(e.ids)] = torch.tensor(e.loss_mask)
    return ids.to(device), attn.to(device), loss.to(device)


def sft_loss(model: Any, ids: Any, attn: Any, loss: Any, head: HeadSample | None = None
             ) -> tuple[Any, Any]:
    """Mean next-token cross-entropy over sampled (loss-mask 1) tokens.

    The LM head (151k x hidden, tied to the embedding) costs far more than the 2-layer body, so
    logits are computed only at the N positions that predict a sampled token, and — when `head`
    is given — only for the tokens the data ever targets plus K uniformly drawn others, whose
    logits get + log(others / K) so their exp-sum estimates the whole tail's (sampled softmax).
    `head=None` is the exact full-vocabulary loss. Returns (loss [N], targets [N]).
    """
    import torch

    hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, T, H]
    predicts = loss[:, 1:].bool()  # position t predicts token t+1
    h = hidden[:, :-1][predicts]  # [N, H]
    targets = ids[:, 1:][predicts]  # [N]
    weight = model.get_output_embeddings().weight  # [V, H]
    if head is None:
        logits, labels = h @ weight.T, targets  # [N, V]
    else:
        rows = torch.cat([head.targets, head.negatives])  # [C + K]
        logits = h @ weight[rows].T  # [N, C + K]
        logits[:, len(head.targets):] += head.log_scale
        labels = head.index[targets]
    return torch.nn.functional.cross_entropy(logits, labels, reduction="none"), targets


@dataclass
class HeadSample:
    """Vocabulary rows of one step's sampled softmax: every token the SFT data targets (C) and K
    draws (with replacement) from the other V - C tokens."""

    targets: Any  # [C] token ids
    negatives: Any  # [K] token ids
    index: Any  # [V] token id -> its column among `targets` (-1 for others)
    log_scale: float  # log((V - C) / K): importance weight of a uniform draw

    @classmethod
    def draw(cls, targets: Any, others: Any, index: Any, k: int, generator: Any) -> HeadSample:
        import torch

        picks = torch.randint(len(others), (k,), generator=generator, device=others.device)
        return cls(targets, others[picks], index, math.log(len(others) / k))


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(base: Path, examples: list[Example], args: argparse.Namespace,
          held_out: list[Example] = ()) -> tuple[Any, float]:  # type: ignore[assignment]
    """AdamW in fp32 (on --device); returns (model, mean loss of the last 10% of steps)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(args.device)
    model.train()
    rescale_body(model, args.body_scale)
    vocab = model.get_output_embeddings().weight.shape[0]
    targets = sorted({i for e in examples for i, m in zip(e.ids, e.loss_mask, strict=True)
                      if m})
    target_ids = torch.tensor(targets, device=args.device)
    index = torch.full((vocab,), -1, dtype=torch.long, device=args.device)
    index[target_ids] = torch.arange(len(targets), device=args.device)
    others = (index < 0).nonzero().squeeze(1)
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    order = random.Random(args.seed)
    short = shortened(examples) if args.short_share > 0 else []
    n_short = round(args.batch * args.short_share)
    tail: list[float] = []
    started = time.monotonic()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps, args.lr, args.warmup)
        batch = order.sample(examples, min(args.batch, len(examples)) - n_short)
        if n_short:
            batch += order.sample(short, n_short)
        head = None if args.negatives <= 0 else HeadSample.draw(
            target_ids, others, index, args.negatives, generator)
        losses, targets_n = sft_loss(model, *batch_tensors(batch, args.device), head)
        value = losses.mean()
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step >= args.steps - max(1, args.steps // 10):
            tail.append(value.item())
        if step % args.log_every == 0 or step == args.steps - 1:
            digits = losses[(targets_n >= DIGIT_IDS[0]) & (targets_n <= DIGIT_IDS[1])]
            print(f"step {step:4d}  loss {value.item():.4f}  digits {digits.mean().item():.3f}  "
                  f"{time.monotonic() - started:.0f}s", flush=True)
        if held_out and args.score_every and (step + 1) % args.score_every == 0:
            print(f"step {step:4d}  held-out {json.dumps(score(model, held_out, args.device))}",
                  flush=True)
    return model, sum(tail) / len(tail)


def shortened(examples: list[Example]) -> list[Example]:
    """The examples without the prefix they all share (system prompt + tool schemas), from the
    user turn on. Rotary positions make attention depend only on distances, so what a head
    learns to copy here holds in the full conversation, and the shorter context spreads
    attention (and its gradient) over ~5x fewer positions at first."""
    first = examples[0].ids
    common = min(next((i for i, (a, b) in enumerate(zip(first, e.ids, strict=False)) if a != b),
                      min(len(first), len(e.ids))) for e in examples[1:]) if len(examples) > 1 \
        else 0
    start = max(0, common - USER_TURN_TOKENS)  # keep "<|im_start|>user\n"
    return [Example(e.ids[start:], e.loss_mask[start:], e.family) for e in examples]


def rescale_body(model: Any, scale: float) -> None:
    """Scale the weights and biases of every linear layer of the transformer body by `scale`
    before training (embedding, norms and the tied head keep the base's values).

    The base's wide init (std 0.3, chosen so the *random* model samples varied text) gives
    attention logits of std ~6 (each head attends almost one-hot to arbitrary positions, and the
    softmax passes back little gradient) and MLP outputs ~20x the embedding in the residual
    stream. Scaling by 0.1 starts training from a standard init (std ~0.03) instead, the regime
    the optimizer settings here are meant for. (On full conversations alone neither regime
    learnt to copy numbers in 1600 steps: the loss on digit tokens stays near ln 9 nats; with
    half of each batch `shortened`, copying is under way by ~1,000 steps.)
    """
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            for module in layer.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.mul_(scale)
                    if module.bias is not None:
                        module.bias.mul_(scale)


def full_loss(model: Any, examples: list[Example], batch: int, device: str = "cpu") -> float:
    """Exact full-vocabulary SFT loss over `examples` (token-weighted)."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), batch):
            chunk = examples[i:i + batch]
            n = sum(sum(e.loss_mask) for e in chunk)
            total += sft_loss(model, *batch_tensors(chunk, device))[0].sum().item()
            count += n
    return total / count


def score(model: Any, examples: list[Example], device: str = "cpu") -> dict[str, dict[str, float]]:
    """Per problem family, teacher-forced on the gold conversations (exact full vocabulary):
    `greedy` = share whose every sampled token is the argmax (the greedy agent would reproduce
    the gold rollout), `sampled` = mean probability of sampling the whole gold rollout at
    temperature 1 (a lower bound on the T=1 success rate), `nll` = mean nats per conversation."""
    import torch

    rows: dict[str, list[tuple[bool, float]]] = {}
    model.eval()
    with torch.no_grad():
        for e in examples:
            ids, attn, loss = batch_tensors([e], device)
            hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state[0, :-1]
            at = loss[0, 1:].bool()
            logits = hidden[at] @ model.get_output_embeddings().weight.T  # [N, V]
            targets = ids[0, 1:][at]
            nll = torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
            greedy = bool((logits.argmax(-1) == targets).all())
            for key in {"all", e.family or "all"}:
                rows.setdefault(key, []).append((greedy, nll))
    model.train()
    return {k: {"n": len(v), "greedy": sum(g for g, _ in v) / len(v),
                "sampled": sum(math.exp(-n) for _, n in v) / len(v),
                "nll": sum(n for _, n in v) / len(v)} for k, v in sorted(rows.items())}


def save_weights(model: Any, base: Path, out: Path) -> None:
    """bf16 safetensors with exactly the base file's tensor names and metadata (tied LM head
    not stored), so loaders and `Engine.load_weights` see the same layout."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(base / WEIGHTS), "pt") as f:
        names, metadata = list(f.keys()), f.metadata()
    state = model.state_dict()
    tensors = {n: state[n].detach().to("cpu", torch.bfloat16).contiguous() for n in names}
    tmp = out / (WEIGHTS + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.chmod(0o644)
    tmp.replace(out / WEIGHTS)  # atomic: a crash never leaves half-written weights


# -- base model ----------------------------------------------------------------------------------

def random_base(folder: Path) -> Path:
    """Rebuild the seeded random base of build_tiny_model.py into `folder` (weights from its own
    code, tokenizer/config files copied from the bundled folder) and check its recorded digest."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import build_tiny_model as build

    recorded = json.loads((BUNDLED / PROVENANCE).read_text())["base"]
    build.build_model(folder, recorded["seed"], recorded["vocab_size"], recorded["embed_std"],
                      recorded["init_std"], recorded.get("layers", 2))
    for name in FOLDER_FILES:
        shutil.copyfile(BUNDLED / name, folder / name)
    digest = sha256(folder / WEIGHTS)
    if digest != recorded["sha256"]:
        sys.exit(f"rebuilt base weights {digest} differ from the recorded {recorded['sha256']} "
                 "(different torch/transformers?); pass --base DIR with the base model folder")
    return folder


def base_record(base: Path, rebuilt: bool) -> dict[str, Any]:
    """Provenance of the base weights: the recorded build (for the rebuilt random base), else
    what the base folder records, else just its digest and path."""
    if rebuilt:
        return dict(json.loads((BUNDLED / PROVENANCE).read_text())["base"])
    if (base / PROVENANCE).is_file():
        recorded = json.loads((base / PROVENANCE).read_text())
        return dict(recorded.get("base", {}), sha256=sha256(base / WEIGHTS))
    return {"path": str(base), "sha256": sha256(base / WEIGHTS)}


def write_folder(model: Any, base: Path, out: Path, provenance: dict[str, Any]) -> None:
    """Out = base's tokenizer/config files (unchanged) + the trained weights + provenance.json
    (base and fine-tune records; the fine-tune's with the digest of the weights written)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in FOLDER_FILES:
        if not (out / name).exists() or sha256(out / name) != sha256(base / name):
            shutil.copyfile(base / name, out / name)
    save_weights(model, base, out)
    provenance["finetune"]["sha256"] = sha256(out / WEIGHTS)
    (out / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n")


# -- evaluation: the built-in agent through a real gateway + embedded engine ---------------------

async def _rollout(gw: Any, admin_key: str, env: Any, task: Any, temperature: float,
                   scratch: Path) -> tuple[bool, int, int, str]:
    """(resolved, turns, malformed tool calls, why it stopped) of one built-in agent rollout."""
    from envhub.envs.agents.base import AgentContext
    from envhub.envs.agents.tool_calling import ToolCallingAgent
    from envhub.envs.environment import RunContext
    from envhub.orchestrator.groups.memory_sandbox import MemorySandbox
    from envhub.sdk import AsyncSession

    session = await AsyncSession.open(gw.url, admin_key=admin_key, task_id=task.id, env="arith")
    run = RunContext("eval", "none", lambda spec: None, scratch)  # type: ignore[arg-type,return-value]
    ctx = AgentContext(task=task, env=env, sandbox=MemorySandbox(), run=run,
                       limits=env.manifest.agent, session=session, gateway_url=gw.url)
    result = await ToolCallingAgent(temperature=temperature).run(ctx)
    trajectory = await session.trajectory()
    verdict = await env.verify(task, ctx.sandbox, run)
    await session.aclose("done")
    malformed = sum(s.name == "malformed_tool_call" for s in trajectory.signals)
    return verdict.resolved, result.turns, malformed, result.stopped


def evaluate(folder: Path, temperature: float, limit: int, concurrency: int) -> dict[str, Any]:
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.server import run_in_thread

    env = arith_env()
    tasks = env.load_tasks()[:limit]
    with tempfile.TemporaryDirectory() as scratch:
        key = "finetune-eval"
        gw = run_in_thread(GatewayConfig(port=0, db=f"sqlite:///{scratch}/pool.db",
                                         admin_key=key, model=str(folder)))
        try:
            async def go() -> list[tuple[bool, int, int, str]]:
                sem = asyncio.Semaphore(concurrency)

                async def one(task: Any) -> tuple[bool, int, int, str]:
                    async with sem:
                        return await _rollout(gw, key, env, task, temperature, Path(scratch))
                return await asyncio.gather(*(one(t) for t in tasks))
            results = asyncio.run(go())
        finally:
            gw.close()
    turns = sum(r[1] for r in results)
    return {"tasks": len(results), "temperature": temperature,
            "solved": sum(r[0] for r in results),
            "success_rate": sum(r[0] for r in results) / len(results),
            "turns": turns, "malformed_turns": sum(r[2] for r in results),
            "stopped": dict(Counter(r[3] for r in results))}


# -- command line --------------------------------------------------------------------------------

def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="random", help="base model folder, or 'random': rebuild "
                   "the seeded random base of build_tiny_model.py (checked by digest)")
    p.add_argument("--out", type=Path, help="output model folder (created; may be --base)")
    p.add_argument("--seed", type=int, default=1, help="training seed (batch order)")
    p.add_argument("--data-seed", type=int, default=7, help="arith problem seed for SFT data "
                   "(must differ from the env's evaluation seed)")
    p.add_argument("--problems", type=int, default=6000, help="SFT conversations generated")
    p.add_argument("--steps", type=int, default=3000, help="optimizer steps")
    p.add_argument("--batch", type=int, default=8, help="conversations per step")
    p.add_argument("--lr", type=float, default=4e-3, help="peak learning rate (AdamW)")
    p.add_argument("--negatives", type=int, default=8192, help="sampled-softmax draws per "
                   "step from tokens the data never targets (0: exact full-vocabulary loss)")
    p.add_argument("--heldout", type=int, default=300, help="extra conversations kept out of "
                   "training to report the exact full-vocabulary loss")
    p.add_argument("--body-scale", type=float, default=0.1, help="scale of the base's linear "
                   "layers before training (1: unchanged; see rescale_body)")
    p.add_argument("--families", nargs="+", help="train only on these arith families")
    p.add_argument("--short-share", type=float, default=0.5, help="share of each batch taken "
                   "from the conversations without their common prefix (see `shortened`)")
    p.add_argument("--warmup", type=int, default=20, help="linear warmup steps")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed: the "
                   "result is deterministic for a given thread count)")
    p.add_argument("--device", default="cpu", help="torch device to train on (cpu, cuda)")
    p.add_argument("--score-every", type=int, default=0, help="print the held-out `score` "
                   "every N steps (0: only at the end; scoring changes nothing in training)")
    p.add_argument("--save-examples", type=Path, metavar="FILE", help="only build the SFT "
                   "conversations (and held-out ones) and write them to FILE as JSON (.gz: "
                   "gzipped)")
    p.add_argument("--examples", type=Path, metavar="FILE", help="train on conversations "
                   "written by --save-examples (needs only torch + transformers: no envhub)")
    p.add_argument("--log-every", type=int, default=20, help="print the loss every N steps")
    p.add_argument("--eval", type=Path, metavar="FOLDER", help="only evaluate FOLDER on the "
                   "arith evaluation tasks with the built-in agent and print JSON")
    p.add_argument("--temperature", type=float, default=1.0, help="--eval sampling temperature")
    p.add_argument("--eval-tasks", type=int, default=64, help="--eval: first N evaluation tasks")
    p.add_argument("--concurrency", type=int, default=8, help="--eval: rollouts in flight")
    args = p.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.eval is not None:
        if not (args.eval / "config.json").is_file():
            p.error(f"--eval {args.eval}: not a model folder (no config.json)")
        print(json.dumps(evaluate(args.eval, args.temperature, args.eval_tasks,
                                  args.concurrency)))
        return
    if args.out is None and args.save_examples is None:
        p.error("--out DIR is required (e.g. --out gateway/engine/tiny)")
    if args.steps < 1 or args.batch < 1 or args.problems < 1 or args.heldout < 0:
        p.error("--steps, --batch and --problems must be >= 1 and --heldout >= 0")
    if args.examples is not None and not args.examples.is_file():
        p.error(f"--examples {args.examples}: no such file (write one with --save-examples)")
    if args.examples is None and args.data_seed == arith_env().seed:
        p.error(f"--data-seed {args.data_seed} is the arith evaluation seed "
                "(envs/builtin/arith/envhub.toml [metadata] seed); pick another one")
    if args.base != "random" and not (Path(args.base) / "config.json").is_file():
        p.error(f"--base {args.base}: not a model folder (no config.json); or use --base random")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        base = random_base(Path(tmp)) if args.base == "random" else Path(args.base)
        if args.examples is not None:  # built elsewhere: the file says from which data
            data = json.loads(gzip.decompress(args.examples.read_bytes())
                              if args.examples.suffix == ".gz" else args.examples.read_bytes())
            args.data_seed, args.problems, args.heldout = \
                data["data_seed"], data["problems"], data["heldout"]
            examples = [Example(**e) for e in data["examples"]]
        else:
            examples = build_examples(base, args.data_seed, args.problems + args.heldout)
        if args.save_examples is not None:
            blob = json.dumps({"data_seed": args.data_seed, "problems": args.problems,
                               "heldout": args.heldout,
                               "examples": [e.__dict__ for e in examples]}).encode()
            args.save_examples.write_bytes(gzip.compress(blob, mtime=0)
                                           if args.save_examples.suffix == ".gz" else blob)
            print(f"wrote {len(examples)} conversations to {args.save_examples}")
            return
        held_out, examples = examples[len(examples) - args.heldout:], \
            examples[:len(examples) - args.heldout]
        if args.families:
            examples = [e for e in examples if e.family in args.families]
        sampled = sum(sum(e.loss_mask) for e in examples)
        print(f"{len(examples)} conversations, {sum(len(e.ids) for e in examples)} tokens, "
              f"{sampled} with loss", flush=True)
        model, final_loss = train(base, examples, args, held_out)
        held_loss = (full_loss(model, held_out, args.batch, args.device) if held_out
                     else float("nan"))
        held_score = score(model, held_out, args.device) if held_out else {}
        print(f"held-out full-vocabulary loss {held_loss:.4f} ({len(held_out)} conversations)")
        print(f"held-out score {json.dumps(held_score)}")
        record = {"script": "scripts/finetune_tiny_arith.py", "base_sha256": sha256(
            base / WEIGHTS), "seed": args.seed, "data_seed": args.data_seed,
            "problems": args.problems, "steps": args.steps, "batch": args.batch,
            "lr": args.lr, "warmup": args.warmup, "threads": args.threads,
            "device": args.device, "negatives": args.negatives,
            "body_scale": args.body_scale, "short_share": args.short_share,
            "heldout": args.heldout, "families": args.families,
            "final_loss": round(final_loss, 4),
            "held_out_loss": round(held_loss, 4),
            "held_out_score": {k: {m: round(x, 4) for m, x in v.items()}
                               for k, v in held_score.items()}}
        write_folder(model, base, args.out,
                     {"base": base_record(base, args.base == "random"), "finetune": record})
    print(f"final loss {final_loss:.4f}; wrote {args.out / WEIGHTS} "
          f"({(args.out / WEIGHTS).stat().st_size / 1e6:.1f} MB) in "
          f"{time.monotonic() - started:.0f}s; sha256 {sha256(args.out / WEIGHTS)}")


if __name__ == "__main__":
    main()
