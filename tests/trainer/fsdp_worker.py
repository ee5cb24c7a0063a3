"""Runs under `torchrun --nproc-per-node 2` for test_fsdp.py (and in one process for the
reference): trainer scenarios whose loss, full gradients and parameters are saved.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/trainer/fsdp_worker.py WORK {equivalence,resume,divergent}

WORK holds groups.json (written by the test); rank 0 writes WORK/<scenario>.pt.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from envhub.orchestrator.training.ranks import RankLeader, follow
from envhub.sdk.types import Trajectory
from envhub.trainer.batch import build_batch
from envhub.trainer.config import (
    AdvantageConfig,
    LoraSettings,
    LossConfig,
    OptimConfig,
    TrainerConfig,
)
from envhub.trainer.distributed import DataParallel, run_rank
from envhub.trainer.errors import TrainerError
from envhub.trainer.prefix_tree import plan_trees
from envhub.trainer.source import Group
from envhub.trainer.trainer import Trainer
from envhub.trainer.weights import full_state, http_pusher
from tests.trainer.models import tiny_model

SCENARIOS: dict[str, dict[str, Any]] = {
    "plain": {},
    "checkpointing": {"gradient_checkpointing": True},
    "lora": {"lora": LoraSettings(rank=4, alpha=8)},
    "bf16": {"precision": "bf16"},
    # the objectives (trainer/loss.py, advantages.py): sequence-level terms and step-wide
    # counts must come out the same however the step is split over ranks
    "gspo": {"loss": LossConfig(name="gspo", agg="seq_mean", seq_eps_low=0.5,
                                seq_eps_high=0.5)},
    "cispo_constant": {"loss": LossConfig(name="cispo", agg="constant", agg_constant=64.0)},
    "ppo_clip_tis": {"loss": LossConfig(name="ppo_clip", correction="token_truncate")},
    "seq_mask_rloo": {"loss": LossConfig(correction="sequence_mask", correction_cap=1e6),
                      "advantages": AdvantageConfig(estimator="rloo")},
    "reinforce_pp": {"advantages": AdvantageConfig(estimator="reinforce_pp")},
    "token_mask": {"loss": LossConfig(correction="token_mask", correction_cap=1.5)},
    "seq_truncate_plugin": {"loss": LossConfig(name="tests.trainer.plugin_losses:vanilla_pg",
                                               correction="sequence_truncate")},
}


# Steps where the ranks do not get the same number of packed trees: one group (rank 1's shard is
# empty) and three groups in small trees (two groups on one rank, one on the other).
UNEVEN: dict[str, tuple[int, dict[str, Any]]] = {
    "empty_shard": (1, {}),
    "more_trees": (3, {"max_tokens_per_forward": 64}),
}


def config(scenario: str) -> TrainerConfig:
    # adam_eps 1e-4: AdamW's first step is smooth in g (see test_trainer._config)
    return TrainerConfig(optim=OptimConfig(lr=1e-2, adam_eps=1e-4), **SCENARIOS[scenario])


def load_groups(work: Path) -> list[Group]:
    data = json.loads((work / "groups.json").read_text())
    return [Group(gid, [Trajectory.model_validate(t) for t in ts]) for gid, ts in data.items()]


def full_grads(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every trainable parameter's whole gradient (FSDP2 shards gathered)."""
    out = {}
    for name, p in trainer.model.named_parameters():
        if p.grad is not None:
            g = p.grad
            out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().cpu()
    return out


def run_scenario(scenario: str, groups: list[Group], dp: DataParallel | None
                 ) -> dict[str, Any]:
    """One full step on `groups`, then the next step's loss and gradients (not applied)."""
    torch.manual_seed(0)  # LoRA's adapter init draws from the RNG
    trainer = Trainer(tiny_model("qwen2"), config(scenario), data_parallel=dp)
    first = trainer.step(groups)
    second = trainer.compute_gradients(build_batch(groups, trainer.config,
                                                   trainer.version).sequences)
    grads = full_grads(trainer)
    params = full_state(trainer.model)
    dtypes = sorted({str(p.dtype) for p in trainer.model.parameters()})
    return {"first": first, "second": second, "grads": grads, "params": params,
            "dtypes": dtypes, "trainable": sorted(grads)}


def run_uneven(case: str, groups: list[Group], dp: DataParallel | None) -> dict[str, Any]:
    """Two steps on the case's groups: their metrics, the parameters after them and, on
    several ranks, each rank's number of packed trees in the first step."""
    n, options = UNEVEN[case]
    torch.manual_seed(0)
    trainer = Trainer(tiny_model("qwen2"), TrainerConfig(
        optim=OptimConfig(lr=1e-2, adam_eps=1e-4), **options), data_parallel=dp)
    trees = []
    if dp is not None:
        local = trainer._local_shard(build_batch(groups[:n], trainer.config, 0).sequences)
        mine = len(plan_trees([s.token_ids for s in local], trainer.config.max_tokens_per_forward,
                              trainer.config.prefix_merge))
        trees = dp.sum_floats([float(mine if r == dp.rank else 0) for r in range(dp.world)])
    steps = [trainer.step(groups[:n]) for _ in range(2)]
    return {"steps": steps, "params": full_state(trainer.model), "trees": trees}


def push_fails(work: Path, dp: DataParallel) -> None:
    """`envhub train`'s ranks (training/ranks.py): rank 0 leads a step and a push whose POST
    is refused (nothing listens on the port), rank 1 follows. Each writes what it saw."""
    trainer = Trainer(tiny_model("qwen2"), config("lora"), data_parallel=dp)
    if dp.rank != 0:
        follow(trainer, work / "weights")  # returns on `stop`; closes the process group
        seen = {"version": trainer.version}
    else:
        leader = RankLeader(trainer, dp)
        try:
            leader.step(load_groups(work)[:2])
            with socket.socket() as s:  # a port nothing listens on
                s.bind(("127.0.0.1", 0))
                url = f"http://127.0.0.1:{s.getsockname()[1]}/update_weights_from_disk"
            try:
                leader.sync(work / "weights", push=http_pusher(url, timeout=30))
                seen = {"error": None}
            except TrainerError as exc:
                seen = {"error": str(exc), "url": url}
        finally:
            leader.stop()
        seen["version"] = trainer.version
    (work / f"push_fails.{dp.rank}.json").write_text(json.dumps(seen))


# Rank 0's pause before its first command in `slow_leader`, beyond that launch's process-group
# timeout (PG_TIMEOUT_S), as rollouts, an evaluation or an engine's start-up can be.
PG_TIMEOUT_S, SLOW_LEADER_S = 15, 35


def slow_leader(work: Path, dp: DataParallel) -> None:
    """Rank 0 leads one step after a pause longer than the process group's timeout; rank 1
    waits for it on ranks.py's command group. Each writes the steps it made."""
    trainer = Trainer(tiny_model("qwen2"), config("plain"), data_parallel=dp)
    if dp.rank != 0:
        follow(trainer, work / "weights")
    else:
        leader = RankLeader(trainer, dp)
        try:
            time.sleep(SLOW_LEADER_S)
            leader.step(load_groups(work)[:2])
        finally:
            leader.stop()
    (work / f"slow_leader.{dp.rank}.json").write_text(json.dumps({"steps": trainer.steps}))


def resume_first_half(work: Path, dp: DataParallel) -> None:
    groups = load_groups(work)
    trainer = Trainer(tiny_model("qwen2"), config("plain"), data_parallel=dp)
    trainer.step(groups[:2])
    trainer.save_checkpoint(work / "ckpt")
    _finish(trainer, groups, work / "continued.pt", dp)


def resume_second_half(work: Path, dp: DataParallel) -> None:
    groups = load_groups(work)
    trainer = Trainer(tiny_model("qwen2", seed=7), config("plain"), data_parallel=dp)
    trainer.load_checkpoint(work / "ckpt")
    _finish(trainer, groups, work / "resumed.pt", dp)


def _finish(trainer: Trainer, groups: list[Group], out: Path, dp: DataParallel) -> None:
    metrics = trainer.step(groups[1:])
    params = full_state(trainer.model)
    if dp.rank == 0:
        torch.save({"metrics": metrics, "params": params, "steps": trainer.steps,
                    "rng": torch.get_rng_state()}, out)


def main(work: Path, mode: str) -> None:
    torch.set_num_threads(1)
    # a collective one rank misses fails in two minutes instead of gloo's default 30
    dp = DataParallel.init(timeout=timedelta(seconds=PG_TIMEOUT_S if mode == "slow_leader"
                                             else 120))
    try:
        if mode == "equivalence":
            groups = load_groups(work)
            for scenario in SCENARIOS:
                result = run_scenario(scenario, groups, dp)
                if dp.rank == 0:
                    torch.save(result, work / f"{scenario}.pt")
            resume_first_half(work, dp)
        elif mode == "resume":
            resume_second_half(work, dp)
        elif mode == "divergent":
            groups = load_groups(work)
            results = {case: run_uneven(case, groups, dp) for case in UNEVEN}
            if dp.rank == 0:
                torch.save(results, work / "uneven.pt")
            push_fails(work, dp)  # last: RankLeader.stop and follow close the process group
            return
        elif mode == "slow_leader":
            slow_leader(work, dp)  # RankLeader.stop and follow close the process group
            return
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        dp.barrier()  # leave together: a rank tearing gloo down early aborts its peer
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":  # as `envhub train`'s ranks end (see run_rank)
    run_rank(lambda: main(Path(sys.argv[1]), sys.argv[2]))
