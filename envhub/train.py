"""`envhub train ENV [ENV=WEIGHT ...]`: the whole RL loop on one machine.

    gateway (embedded engine or a real vLLM: envhub/training/engines.py; SQLite pool)
        <- rollouts of the agent (envs/runner, a thread of their own: envhub/training/producer.py)
        -> finished groups read back over the gateway's HTTP API, windowed FIFO over the
           generation order (envhub/training/source.py)
        -> Trainer.step (filters, GRPO + reward-to-go, IS-masked loss, prefix-tree packing)
        -> weights exported and pushed through POST /admin/weights every K steps (version+1)

Rollouts run where `--executor` puts them (in this process, or Ray tasks on the cluster at
RAY_ADDRESS), started in the order of `--schedule` (fifo, or Seer's probes first then
longest-first): envhub/training/producer.py.

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
follow (envhub/training/ranks.py); the push gathers the full state to rank 0, which writes and
pushes it.
"""

from __future__ import annotations

import json
import os
import random
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from envhub.envs.runner.config import EnvChoice, check_schedule


class TrainLoopConfig(BaseModel):
    envs: list[EnvChoice] = Field(default_factory=lambda: [EnvChoice(ref="arith")],
                                  description="environments to train on, with sampling weights "
                                  "(`arith=3 swe-task=1`: three groups of arith per swe-task)")
    steps: int = Field(20, ge=1, description="optimizer steps")
    seed: int = Field(0, description="seeds torch, task order and sampling")
    out: Path = Field(Path("runs/train"), description="metrics.jsonl, pool.db, weights/")
    groups: int = Field(16, ge=1, description="groups (tasks x k samples) per optimizer step")
    k: int = Field(4, ge=2, description="samples per task (group size)")
    concurrency: int = Field(16, ge=1, description="rollouts in flight")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate")
    tau: int | None = Field(2, ge=0, description="staleness bound (versions)")
    sync: bool = Field(False, description="the synchronous loop: roll out a step's groups, "
                       "wait for all, train, push (for comparison)")
    window: int | None = Field(None, ge=0, description="windowed-FIFO size in groups (0: greedy, "
                               "any finished group; None: 2 x groups asynchronous, greedy --sync)")
    buffer: int | None = Field(None, ge=1, description="asynchronous: most groups launched but "
                               "not yet trained on (None: tau x sync_every steps' worth of "
                               "groups, at least one step's, so that a group waiting its turn "
                               "is not made stale by the wait; 3 x groups without tau); "
                               "bounds how far rollouts run ahead of the trainer")
    model: str | None = Field(None, description="HF model folder (default: the bundled one)")
    engine: Literal["embedded", "vllm"] = Field("embedded", description="what samples: the "
                                                "gateway's embedded engine, or a real vLLM "
                                                "server (envhub/training/engines.py)")
    engine_url: str | None = Field(None, pattern=r"^https?://\S+$", description="with vllm: "
                                   "an already running vLLM server (VLLM_SERVER_DEV_MODE=1, "
                                   "serving --model) instead of starting one")
    engine_start_timeout: float = Field(900.0, gt=0, description="seconds the started vLLM "
                                        "server may take to answer /health")
    agent: str = Field("tool", description="the agent: tool (built-in) or a command line")
    agent_install: list[str] = Field(default_factory=list, description="how a command agent's "
                                     "programs get into the sandbox: pip:REQ | script:PATH")
    agent_on_host: bool = Field(False, description="run a command agent as a host process (no "
                                "containment)")
    max_turns: int | None = Field(None, ge=1, description="override the env's max_turns")
    tasks: int | None = Field(None, ge=1, description="train on each env's first N training "
                              "tasks (None: all of them)")
    sync_every: int = Field(1, ge=1, description="push the weights to the engine every K "
                            "optimizer steps (and after the last one)")
    reset_optimizer: bool | None = Field(None, description="clear AdamW's moments after each "
                                         "push (None: on when a push follows several optimizer "
                                         "steps, --sync-every >= 2, as GLM-5 does at every "
                                         "weight sync; off at --sync-every 1 and with --sync)")
    eval_every: int = Field(15, ge=0, description="held-out evaluation every E steps (and before "
                            "the first and after the last); 0: none, and no task held out")
    eval_samples: int = Field(8, ge=1, description="samples of each held-out task per "
                              "evaluation, drawn as training samples them (the agent's "
                              "temperature); eval/resolved_rate is their mean. The built-in "
                              "agent draws them with the same random numbers in every "
                              "evaluation of a run (sampling seeds from --seed, per task, "
                              "sample and turn), so two evaluations differ by the weights")
    eval_greedy: bool = Field(False, description="evaluate greedily instead: one sample per "
                              "held-out task at temperature 0 (built-in agent)")
    eval_tasks: int = Field(64, ge=1, description="held-out tasks per environment: its last N "
                            "(with a [tasks] stratify field: each kind's last, by its share), "
                            "never trained on")
    std_norm: bool = Field(False, description="GRPO advantages divided by the group's reward "
                           "std; off (default): plain r - mean (GLM-5's formula, Dr. GRPO), so "
                           "a reward's weight keeps its meaning. With it on, a group whose "
                           "outcomes tie has its advantages scaled to unit size from whatever "
                           "differs: for arith, the 0.05-weighted time reward's jitter of a "
                           "few ms between samples run together (trainer/README.md)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the "
                                         "backward pass (less memory, more compute)")
    precision: str = Field("fp32", pattern="^(fp32|bf16)$", description="bf16: bfloat16 "
                           "compute with fp32 master weights")
    lora_rank: int | None = Field(None, ge=1, description="train LoRA adapters of this rank "
                                  "(PEFT) instead of all weights; pushes merged weights")
    lora_alpha: int | None = Field(None, ge=1, description="LoRA alpha (default 2 x rank)")
    lora_targets: list[str] | None = Field(None, description="module names to adapt "
                                           "(default: every linear layer but the LM head)")
    chains: Literal["all", "main"] = Field("all", description="conversations of a session to "
                                           "train on: all, or the main one (side calls of CLIs "
                                           "are other chains)")
    keep_weights: int = Field(2, ge=1, description="weight versions kept in OUT/weights (the "
                              "newest; older ones are deleted once a newer one is served)")
    executor: str = Field("inprocess", description="where rollouts run: inprocess | ray (each "
                          "rollout a Ray task on the cluster at RAY_ADDRESS) | "
                          "package.module:Class (envs/runner/executor.py); held-out evaluation "
                          "runs in this process")
    schedule: str = Field("fifo", description="which rollout starts next: fifo (a group's "
                          "samples start together, when all fit) | seer (groups launched while "
                          "the buffer has room; one probe per group first, then the rest "
                          "longest-first) | package.module:Class (envs/runner/scheduling.py)")

    @field_validator("envs", mode="before")
    @classmethod
    def _envs(cls, v: Any) -> Any:
        items = [v] if isinstance(v, str) else v
        return [EnvChoice.parse(x) if isinstance(x, str) else x for x in items]

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str) -> str:
        return check_schedule(v)

    @model_validator(mode="after")
    def _consistent(self) -> TrainLoopConfig:
        refs = [e.ref for e in self.envs]
        if not refs or len(set(refs)) != len(refs):
            raise ValueError(f"give each environment once (got {', '.join(refs) or 'none'}), "
                             "with a weight if wanted: arith=3 swe-task=1")
        if self.engine_url is not None and self.engine != "vllm":
            raise ValueError("--engine-url names a vLLM server: add --engine vllm")
        if self.buffer is not None and self.buffer < self.groups:
            raise ValueError(f"buffer {self.buffer} < groups {self.groups}: the trainer needs "
                             "`groups` finished groups per step; raise buffer")
        return self

    @property
    def window_size(self) -> int | None:
        """Groups the window spans (None: greedy)."""
        if self.window is None:
            return None if self.sync else 2 * self.groups
        return self.window or None

    @property
    def buffer_size(self) -> int:
        if self.buffer is not None:
            return self.buffer
        if self.tau is None:
            return 3 * self.groups
        # A group launched when the buffer has room is trained once the buffer ahead of it is:
        # after buffer / groups steps, i.e. buffer / (groups x sync_every) pushes.
        return max(1, self.tau * self.sync_every) * self.groups

    @property
    def resets_optimizer(self) -> bool:
        """By default after a push that follows several optimizer steps (async, K >= 2). With
        K = 1 a reset before every step leaves AdamW no memory: each step is lr * sign(g) of one
        batch's gradient, mostly noise (trainer/README.md measures it)."""
        if self.reset_optimizer is not None:
            return self.reset_optimizer
        return not self.sync and self.sync_every > 1


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
    from envhub.gateway.config import GatewayConfig
    from envhub.trainer.config import (
        AdvantageConfig,
        FilterConfig,
        LoraSettings,
        OptimConfig,
        TrainerConfig,
    )
    from envhub.trainer.distributed import DataParallel
    from envhub.trainer.trainer import Trainer
    from envhub.training.engines import serving
    from envhub.training.ranks import RankLeader, follow

    disable_progress_bars()
    hf_logging.disable_progress_bar()
    dp = DataParallel.init() if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None
    rank0 = dp is None or dp.rank == 0
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    agent = make_agent(cfg.agent, cfg.agent_install, cfg.agent_on_host)
    envs = load_training_envs(cfg)
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
                         on_wait)
    finally:
        if leader is not None:  # the other ranks stop following, also when this failed
            leader.stop()


def _lead(cfg: TrainLoopConfig, trainer: Any, gw_config: Any, admin: str, envs: list[Any],
          agent: Any, log: Callable[[str], Any],
          on_wait: Callable[[Any], None] | None) -> list[dict[str, Any]]:
    """Rank 0 (or the only process): the gateway, the rollouts and the loop."""
    from envhub.envs.runner.executor import make_executor
    from envhub.envs.runner.run import new_run_id
    from envhub.gateway.server import run_in_thread
    from envhub.trainer.source import HttpSource
    from envhub.trainer.window import GroupWindow
    from envhub.training.loop import Loop
    from envhub.training.producer import Producer
    from envhub.training.source import LaunchOrderSource
    from envhub.training.tasks import task_stream

    refs = [e.ref for e in envs]
    producer = Producer(task_stream(envs, cfg.seed), k=cfg.k, concurrency=cfg.concurrency,
                        buffer=cfg.buffer_size, run_id=new_run_id(), schedule=cfg.schedule,
                        executor=make_executor(cfg.executor))
    gw: Any = None
    http: HttpSource | None = None
    try:
        # Before anything is written: a cluster that cannot be reached leaves no OUT behind.
        host = producer.start_executor(refs)
        cfg.out.mkdir(parents=True, exist_ok=True)
        (cfg.out / "metrics.jsonl").write_text("")
        gw = run_in_thread(gw_config.model_copy(update={"host": host}))
        http = HttpSource(gw.url, admin)
        producer.open(refs=refs, gateway=gw.url, admin_key=admin, agent=agent, out=cfg.out,
                      max_turns=cfg.max_turns, agent_install=cfg.agent_install,
                      agent_on_host=cfg.agent_on_host)
        source = LaunchOrderSource(http, producer)
        window = GroupWindow(source, cfg.window_size)
        loop = Loop(cfg, trainer, producer, source, window, envs,
                    push_url=f"{gw.url}/admin/weights", admin_key=admin, log=log,
                    on_wait=on_wait, eval_agent=None if cfg.agent == "tool" else agent)
        return loop.run()
    finally:
        producer.stop()  # rollouts first: they talk to the gateway
        if http is not None:
            http.close()
        if gw is not None:
            gw.close()


def torchrun_argv(nproc: int, argv: list[str]) -> list[str]:
    """The command that re-runs `envhub ARGV` under torchrun with `nproc` ranks on this host
    (single node, a free rendezvous port)."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), "-m", "envhub", *argv]


def load_training_envs(cfg: TrainLoopConfig) -> list[Any]:
    """Each environment's training and held-out tasks (`EnvTasks`); raises the loader's errors
    and ValueError (with the fix) for a split that leaves nothing to train on."""
    from envhub.envs.loader import load_env
    from envhub.training.tasks import EnvTasks, split_tasks

    envs = []
    for choice in cfg.envs:
        loaded = load_env(choice.ref)
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


def append_row(out: Path, row: dict[str, Any]) -> None:
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
