"""`envhub train ENV [ENV=WEIGHT ...]`: the whole RL loop on one machine.

    gateway (embedded engine or a real vLLM: orchestrator/training/engines.py; SQLite pool)
        <- rollouts of the agent (orchestrator/groups, a thread of their own:
           orchestrator/training/producer.py)
        -> finished groups read back over the gateway's HTTP API, windowed FIFO over the
           generation order (orchestrator/training/source.py)
        -> Trainer.step (filters, GRPO + reward-to-go, IS-masked loss, prefix-tree packing)
        -> weights exported and pushed through POST /admin/weights every K steps (version+1)

Rollouts run where `--executor` puts them (in this process, or Ray tasks on the cluster at
RAY_ADDRESS; those of `service:NAME` environments in the task services registered at
`--services`), started in the order of `--schedule` (fifo, or Seer's probes first then
longest-first): orchestrator/training/producer.py. Which environment each new group comes from
is `--mix`'s (static weights, or dynamic ones that meet the weights in trained samples):
orchestrator/training/tasks.py.

Asynchronous by default: N rollouts stay in flight while the trainer trains; the trainer takes
`groups` finished groups per step from the window (the oldest unconsumed group is its head; it
moves only when that group is consumed), drops samples more than `tau` versions old, pushes
every `sync_every` steps and then, when that is 2 or more, resets AdamW's moments (GLM-5).
Rollouts running across a push keep going: their later turns carry the new version. `--sync`
runs today's loop instead: roll out one step's groups, wait for all, train, push.

Rows of `OUT/metrics.jsonl`: one per step (`"phase": "train"`), and one per held-out
evaluation (`"phase": "eval"`, before training and every `eval_every` steps).

Under torchrun (WORLD_SIZE > 1; `envhub train --nproc-per-node N` re-launches itself that way)
the trainer is FSDP2-sharded over the ranks: rank 0 runs the gateway, the rollouts, the loop and
the metrics file, and announces each step's groups and each push to the other ranks, which
follow (orchestrator/training/ranks.py); the push gathers the full state to rank 0, which writes and
pushes it.
"""

from __future__ import annotations

import os
import random
import secrets
from collections.abc import Callable
from typing import Any

from envhub.orchestrator.training.config import TrainLoopConfig

__all__ = ["TrainLoopConfig", "load_training_envs", "task_schedule", "torchrun_argv", "train"]


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


def train(cfg: TrainLoopConfig, log: Callable[[str], Any] = print,
          on_wait: Callable[[Any], None] | None = None) -> list[dict[str, Any]]:
    """Run the loop; returns the metrics rows (also written to OUT/metrics.jsonl).
    `on_wait(WaitState)` is called each time the trainer waits for groups (asynchronous mode):
    which group heads the window and which finished groups lie beyond it."""
    import torch
    from huggingface_hub.utils import disable_progress_bars
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from envhub.envs.agents import make_agent
    from envhub.envs.errors import RunConfigError
    from envhub.gateway.config import GatewayConfig
    from envhub.orchestrator.groups.services.hub import open_hub
    from envhub.orchestrator.training.engines import serving
    from envhub.orchestrator.training.ranks import RankLeader, follow
    from envhub.trainer.config import (
        AdvantageConfig,
        FilterConfig,
        LoraSettings,
        OptimConfig,
        TrainerConfig,
    )
    from envhub.trainer.distributed import DataParallel
    from envhub.trainer.trainer import Trainer

    disable_progress_bars()
    hf_logging.disable_progress_bar()
    dp = DataParallel.init() if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    rank0 = dp is None or dp.rank == 0
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    agent = make_agent(cfg.agent, cfg.agent_install, cfg.agent_on_host)
    if cfg.services and dp is not None:  # under a torchrun of the user's own
        raise RunConfigError("--services runs rollouts on one trainer rank: drop "
                             "--nproc-per-node, or run the environments in this process")
    hub, served = open_hub(cfg, [c.ref for c in cfg.envs], log)
    envs = load_training_envs(cfg, served)
    admin = "envhub-admin-" + secrets.token_urlsafe(16)
    gw_config = GatewayConfig(port=0, db=f"sqlite:///{cfg.out / 'pool.db'}", admin_key=admin,
                              model=cfg.model)
    model = AutoModelForCausalLM.from_pretrained(str(gw_config.model_path()),
                                                 dtype=torch.float32)
    # Saved beside each pushed version: OUT/weights/vN is then a model folder `envhub run
    # --model` and the gateway can serve as it is (tokenizer and chat template included).
    tokenizer = AutoTokenizer.from_pretrained(str(gw_config.tokenizer_path()))
    lora = None
    if cfg.lora_rank is not None:
        lora = LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_alpha or 2 * cfg.lora_rank,
                            targets=cfg.lora_targets or "all-linear")
    trainer = Trainer(model, TrainerConfig(
        optim=OptimConfig(lr=cfg.lr, reset_optimizer_on_sync=cfg.resets_optimizer),
        advantages=AdvantageConfig(normalize_std=cfg.std_norm, env_reward_weights={
            e.name: e.reward_weights for e in envs}),  # the manifests', never an event's
        filters=FilterConfig(tau=cfg.tau, group_size=cfg.k, drop_no_signal=True,
                             chains=cfg.chains),
        gradient_checkpointing=cfg.gradient_checkpointing,
        precision=cfg.precision, lora=lora), data_parallel=dp,  # type: ignore[arg-type]
        tokenizer=tokenizer)
    if not rank0:  # follow rank 0's steps and pushes until it stops
        assert dp is not None
        follow(trainer, cfg.out / "weights")
        return []
    leader = RankLeader(trainer, dp) if dp is not None else None
    try:
        with serving(cfg, gw_config, log) as engine_config:  # vLLM stops when this ends
            return _lead(cfg, leader or trainer, engine_config, admin, envs, agent, log,
                         on_wait, hub, served)
    finally:
        if leader is not None:  # the other ranks stop following, also when this failed
            leader.stop()
        if hub is not None:
            hub.stop_listening()


def _lead(cfg: TrainLoopConfig, trainer: Any, gw_config: Any, admin: str, envs: list[Any],
          agent: Any, log: Callable[[str], Any], on_wait: Callable[[Any], None] | None,
          hub: Any, served: dict[str, Any]) -> list[dict[str, Any]]:
    """Rank 0 (or the only process): the gateway, the rollouts and the loop."""
    from envhub.gateway.server import run_in_thread
    from envhub.orchestrator.groups.executor import RoutedExecutor, make_executor
    from envhub.orchestrator.groups.services.hub import PREFIX
    from envhub.orchestrator.groups.setup import new_run_id
    from envhub.orchestrator.groups.task_metrics import TaskMetrics, serve_metrics
    from envhub.orchestrator.training.loop import Loop
    from envhub.orchestrator.training.producer import Producer
    from envhub.orchestrator.training.source import LaunchOrderSource
    from envhub.orchestrator.training.tasks import LaunchMix, task_stream
    from envhub.trainer.source import HttpSource
    from envhub.trainer.window import GroupWindow

    refs = [e.ref for e in envs]
    mix = LaunchMix([e.weight for e in envs], dynamic=cfg.mix == "dynamic", k=cfg.k)
    executor = RoutedExecutor(make_executor(cfg.executor), {PREFIX: hub} if hub else {})
    producer = Producer(task_stream(envs, cfg.seed, mix), k=cfg.k,
                        concurrency=cfg.concurrency, buffer=cfg.buffer_size,
                        run_id=new_run_id(), schedule=cfg.schedule, executor=executor)
    gw: Any = None
    http: HttpSource | None = None
    metrics = hub.metrics if hub is not None else TaskMetrics() if cfg.metrics else None
    exporter = serve_metrics(cfg.metrics, metrics, log) if cfg.metrics and metrics else None
    try:
        # Before anything is written: a cluster that cannot be reached leaves no OUT behind.
        host = producer.start_executor(refs, served)
        cfg.out.mkdir(parents=True, exist_ok=True)
        (cfg.out / "metrics.jsonl").write_text("")
        gw = run_in_thread(gw_config.model_copy(update={"host": host}))
        http = HttpSource(gw.url, admin)
        producer.open(refs=refs, gateway=gw.url, admin_key=admin, agent=agent, out=cfg.out,
                      max_turns=cfg.max_turns, agent_install=cfg.agent_install,
                      agent_on_host=cfg.agent_on_host, served=served,
                      metrics=metrics)
        source = LaunchOrderSource(http, producer)
        window = GroupWindow(source, cfg.window_size)
        loop = Loop(cfg, trainer, producer, source, window, envs,
                    push_url=f"{gw.url}/admin/weights", admin_key=admin, log=log,
                    on_wait=on_wait, eval_agent=None if cfg.agent == "tool" else agent,
                    mix=mix, metrics=metrics)
        return loop.run()
    finally:
        producer.stop()  # rollouts first: they talk to the gateway
        if http is not None:
            http.close()
        if gw is not None:
            gw.close()
        if exporter is not None:
            exporter.close()


def torchrun_argv(nproc: int, argv: list[str]) -> list[str]:
    """The command that re-runs `envhub ARGV` under torchrun with `nproc` ranks on this host
    (single node, a free rendezvous port)."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), "-m", "envhub", *argv]


def load_training_envs(cfg: TrainLoopConfig, served: dict[str, Any] | None = None
                       ) -> list[Any]:
    """Each environment's training and held-out tasks (`EnvTasks`); raises the loader's errors
    and ValueError (with the fix) for a split that leaves nothing to train on. `served`: the
    task services' environments by reference (None: skip those, they are not there yet)."""
    from envhub.orchestrator.catalog import load_env
    from envhub.orchestrator.groups.services.hub import PREFIX
    from envhub.orchestrator.training.tasks import EnvTasks, split_tasks

    envs = []
    for choice in cfg.envs:
        if choice.ref.startswith(PREFIX) and served is None:
            continue
        loaded = (served or {}).get(choice.ref) or load_env(choice.ref)
        heldout = cfg.eval_tasks if cfg.eval_every else 0
        tasks = loaded.env.load_tasks()
        stratify = loaded.manifest.tasks.stratify
        if stratify and not any(stratify in t.data for t in tasks):
            raise ValueError(f"{choice.ref}: envhub.toml's [tasks] stratify = {stratify!r} names "
                             "no field of its tasks' rows; name one they have, or drop it")
        train_tasks, held = split_tasks(tasks, cfg.tasks, heldout, stratify)
        envs.append(EnvTasks(choice.ref, loaded.name, choice.weight, train_tasks, held,
                             stratify, loaded.manifest.reward_weights()))
    return envs
