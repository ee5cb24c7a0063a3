"""`envhub train ENV`: the whole RL loop on one machine.

    gateway (embedded engine, SQLite pool) ← rollouts of the built-in agent (runner)
        → finished groups read back over the gateway's HTTP API (windowed FIFO)
        → Trainer.step (filters, GRPO + reward-to-go, IS-masked loss, prefix-tree packing)
        → weights exported and pushed to the engine through POST /admin/weights (version+1)

Per-step metrics, with the step's mean reward, are appended to `OUT/metrics.jsonl`.

Under torchrun (WORLD_SIZE > 1; `envhub train --nproc-per-node N` re-launches itself that way)
the trainer is FSDP2-sharded over the ranks: rank 0 runs the gateway, the rollouts and the
metrics file and broadcasts each step's groups; every rank trains its shard; the weight push
gathers the full state to rank 0, which writes and pushes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import statistics
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field


class TrainLoopConfig(BaseModel):
    env: str = Field("arith", description="environment to train on")
    steps: int = Field(20, ge=1, description="optimizer steps (one rollout batch each)")
    seed: int = Field(0, description="seeds torch, task order and sampling")
    out: Path = Field(Path("runs/train"), description="metrics.jsonl, pool.db, weights/")
    groups: int = Field(8, ge=1, description="tasks (groups) per step")
    k: int = Field(8, ge=2, description="samples per task (group size)")
    concurrency: int = Field(16, ge=1, description="rollouts in flight")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate")
    tau: int | None = Field(2, ge=0, description="staleness bound (versions)")
    window: int | None = Field(None, ge=1, description="windowed-FIFO size (None: greedy)")
    model: str | None = Field(None, description="HF model folder (default: the bundled one)")
    max_turns: int | None = Field(None, ge=1, description="override the env's max_turns")
    tasks: int | None = Field(None, ge=1, description="train on the env's first N tasks "
                              "(None: all of them)")
    sync_every: int = Field(1, ge=1, description="push the weights to the engine every K "
                            "optimizer steps (and after the last one)")
    reset_optimizer: bool = Field(False, description="clear AdamW's moments after each push "
                                  "(GLM-5 resets them at every weight sync)")
    std_norm: bool = Field(True, description="GRPO advantages divided by the group's reward "
                           "std; off: plain r - mean (GLM-5's formula)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the "
                                         "backward pass (less memory, more compute)")
    chains: Literal["all", "main"] = Field("all", description="conversations of a session to "
                                           "train on: all, or the main one (side calls of CLIs "
                                           "are other chains)")
    precision: str = Field("fp32", pattern="^(fp32|bf16)$", description="bf16: bfloat16 "
                           "compute with fp32 master weights")
    lora_rank: int | None = Field(None, ge=1, description="train LoRA adapters of this rank "
                                  "(PEFT) instead of all weights; pushes merged weights")
    lora_alpha: int | None = Field(None, ge=1, description="LoRA alpha (default 2 x rank)")
    lora_targets: list[str] | None = Field(None, description="module names to adapt "
                                           "(default: every linear layer but the LM head)")
    keep_weights: int = Field(2, ge=1, description="weight versions kept in OUT/weights (the "
                              "newest; older ones are deleted once a newer one is served)")


def prune_weights(folder: Path, keep: int) -> None:
    """Delete all but the newest `keep` version folders (v000001, ...) under `folder`."""
    import shutil

    versions = sorted(p for p in folder.glob("v[0-9]*") if p.is_dir())
    for old in versions[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def task_schedule(task_ids: list[str], steps: int, groups: int, seed: int) -> list[list[str]]:
    """The tasks of each step: passes (epochs) over `task_ids`, each pass in a fresh seeded
    order, cut into steps of `groups` tasks (a step may span two passes). When the task count
    is a multiple of `groups`, every run of len/groups consecutive steps from a pass boundary
    sees each task exactly once, so reward windows of that length compare like with like."""
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < steps * groups:
        epoch = list(task_ids)
        rng.shuffle(epoch)
        order += epoch
    return [order[i * groups:(i + 1) * groups] for i in range(steps)]


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else 0.0


def train(cfg: TrainLoopConfig, log: Any = print) -> list[dict[str, Any]]:
    """Run the loop; returns the per-step metrics (also written to OUT/metrics.jsonl)."""
    import torch
    from huggingface_hub.utils import disable_progress_bars
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from envhub.envs.loader import load_env
    from envhub.envs.runner.config import EnvChoice, RunConfig
    from envhub.envs.runner.run import run
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.server import run_in_thread
    from envhub.trainer.config import (
        AdvantageConfig,
        FilterConfig,
        LoraSettings,
        OptimConfig,
        TrainerConfig,
    )
    from envhub.trainer.distributed import DataParallel
    from envhub.trainer.source import HttpSource
    from envhub.trainer.trainer import Trainer
    from envhub.trainer.window import GroupWindow

    disable_progress_bars()
    hf_logging.disable_progress_bar()
    dp = DataParallel.init() if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    rank0 = dp is None or dp.rank == 0
    torch.manual_seed(cfg.seed)
    metrics_path = cfg.out / "metrics.jsonl"
    if rank0:
        cfg.out.mkdir(parents=True, exist_ok=True)
        metrics_path.write_text("")
    admin = "envhub-admin-" + secrets.token_urlsafe(16)
    gw_config = GatewayConfig(port=0, db=f"sqlite:///{cfg.out / 'pool.db'}", admin_key=admin,
                              model=cfg.model)
    all_tasks = [t.id for t in load_env(cfg.env).env.load_tasks()]
    schedule = task_schedule(all_tasks[:cfg.tasks], cfg.steps, cfg.groups, cfg.seed)
    model = AutoModelForCausalLM.from_pretrained(str(gw_config.model_path()),
                                                 dtype=torch.float32)
    lora = None
    if cfg.lora_rank is not None:
        lora = LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_alpha or 2 * cfg.lora_rank,
                            targets=cfg.lora_targets or "all-linear")
    trainer = Trainer(model, TrainerConfig(
        optim=OptimConfig(lr=cfg.lr, reset_optimizer_on_sync=cfg.reset_optimizer),
        advantages=AdvantageConfig(normalize_std=cfg.std_norm),
        filters=FilterConfig(tau=cfg.tau, group_size=cfg.k, drop_no_signal=True,
                             chains=cfg.chains),
        gradient_checkpointing=cfg.gradient_checkpointing,
        precision=cfg.precision, lora=lora), data_parallel=dp)  # type: ignore[arg-type]
    history: list[dict[str, Any]] = []
    gw = run_in_thread(gw_config) if rank0 else None
    source = HttpSource(gw.url, admin) if gw else None
    window = GroupWindow(source, cfg.window) if source else None
    try:
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            outcome, groups = None, []
            if gw is not None and window is not None:
                outcome = asyncio.run(run(RunConfig(
                    envs=[EnvChoice(ref=cfg.env)], k=cfg.k, tasks=schedule[step],
                    n=cfg.groups, gateway=gw.url, admin_key=admin,
                    concurrency=cfg.concurrency, max_turns=cfg.max_turns,
                    out=cfg.out / "rollouts" / f"step-{step:04d}"), progress=False))
                groups = window.take(len(window.ready()))
            if dp is not None:
                groups = _broadcast(groups)
            t_roll = time.perf_counter() - t0
            stats = trainer.step(groups)
            t_train = time.perf_counter() - t0 - t_roll
            if (step + 1) % cfg.sync_every == 0 or step == cfg.steps - 1:
                trainer.sync(cfg.out / "weights", push=_pusher(gw.url, admin) if gw else None)
                if rank0:
                    prune_weights(cfg.out / "weights", cfg.keep_weights)
            if outcome is None:
                continue
            done = [r for r in outcome.records if r.status == "done"]
            row = {
                **{f"trainer/{k}": v for k, v in stats.items() if isinstance(v, (int, float))},
                "step": step, "weight_version": trainer.version,
                "reward_mean": _mean([r.components.get("total", 0.0) for r in done]),
                "outcome_mean": _mean([r.outcome or 0.0 for r in done]),
                "resolved_rate": _mean([1.0 if r.resolved else 0.0 for r in done]),
                "rollouts": len(outcome.records),
                "env_failures": sum(r.status == "env_failure" for r in outcome.records),
                "groups_trained": len(groups), "rollout_s": round(t_roll, 2),
                "train_s": round(t_train, 2), "ranks": dp.world if dp else 1,
            }
            history.append(row)
            with open(metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            log(f"step {step:>3}  reward {row['reward_mean']:+.3f}  resolved "
                f"{row['resolved_rate']:.2f}  groups {len(groups)}  "
                f"rollout {t_roll:.1f}s  train {t_train:.1f}s  v{trainer.version}")
    finally:
        if source is not None:
            source.close()
        if gw is not None:
            gw.close()
        if dp is not None:
            import torch.distributed as dist

            dist.destroy_process_group()
    return history


def _pusher(url: str, admin: str) -> Any:
    import httpx

    def push(path: str) -> None:
        r = httpx.post(f"{url}/admin/weights", json={"path": path},
                       headers={"authorization": f"Bearer {admin}"}, timeout=600)
        r.raise_for_status()

    return push


def _broadcast(groups: list[Any]) -> list[Any]:
    """Rank 0's groups on every rank (pickled through torch.distributed)."""
    import torch.distributed as dist

    box = [groups]
    dist.broadcast_object_list(box, src=0)
    return list(box[0])


def torchrun_argv(nproc: int, argv: list[str]) -> list[str]:
    """The command that re-runs `envhub ARGV` under torchrun with `nproc` ranks on this host
    (single node, a free rendezvous port)."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), "-m", "envhub", *argv]
