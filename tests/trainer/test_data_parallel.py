"""Two gloo processes make the same update as one process on the same batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from envhub.sdk.types import Trajectory
from envhub.trainer.config import OptimConfig, TrainerConfig
from envhub.trainer.source import Group
from envhub.trainer.synthetic import RolloutShape, sample_group
from envhub.trainer.trainer import Trainer
from tests.support import free_port
from tests.trainer.models import tiny_model

pytestmark = pytest.mark.slow  # two processes importing torch on a shared 2-core box

CONFIG = TrainerConfig(optim=OptimConfig(lr=1e-2, adam_eps=1e-4))


def _load_groups(path: Path) -> list[Group]:
    data = json.loads(path.read_text())
    return [Group(gid, [Trajectory.model_validate(t) for t in ts]) for gid, ts in data.items()]


def _worker(rank: int, world: int, port: int, work: str) -> None:
    import torch.distributed as dist

    from envhub.trainer.distributed import DataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        torch.set_num_threads(1)
        model = tiny_model("qwen2")
        trainer = Trainer(model, CONFIG, data_parallel=DataParallel())
        metrics = trainer.step(_load_groups(Path(work) / "groups.json"))
        if rank == 0:
            torch.save({n: p.detach() for n, p in model.named_parameters()},
                       Path(work) / "dp.pt")
            (Path(work) / "dp_metrics.json").write_text(json.dumps(metrics))
        # both ranks leave together: a rank tearing gloo down while its peer still holds the
        # connection aborted the peer ("terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_equal_one_process(tmp_path) -> None:
    import torch.multiprocessing as mp

    sampler = tiny_model("qwen2", seed=1)
    shape = RolloutShape(sessions=4, turns=3, prompt_len=16, cm_every=2, keep_prompt=8)
    groups = {f"g{i}": [t.model_dump(mode="json") for t in sample_group(sampler, f"g{i}", shape,
                                                                        seed=i)]
              for i in range(3)}  # 3 groups over 2 ranks: uneven shards on purpose
    (tmp_path / "groups.json").write_text(json.dumps(groups))

    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)

    single = tiny_model("qwen2")
    before = {n: p.detach().clone() for n, p in single.named_parameters()}
    m1 = Trainer(single, CONFIG).step(_load_groups(tmp_path / "groups.json"))
    dp = torch.load(tmp_path / "dp.pt")
    m2 = json.loads((tmp_path / "dp_metrics.json").read_text())
    moved = max((p - before[n]).abs().max().item() for n, p in single.named_parameters())
    diff = max((p.detach() - dp[n]).abs().max().item() for n, p in single.named_parameters())
    assert moved > 1e-3 and diff < 1e-6, (moved, diff)
    for key in ("loss/tokens", "tokens/packed", "tokens/naive", "is/masked_fraction"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-9), key
    assert m2["grad/norm"] == pytest.approx(m1["grad/norm"], rel=1e-5)
