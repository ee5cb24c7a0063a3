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

import contextlib
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
          on_wait: Callable[[Any], None] | None = None,
          on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run the loop; returns the metrics rows (also written to OUT/metrics.jsonl).
    `on_wait(WaitState)` is called each time the trainer waits for groups (asynchronous mode):
    which group heads the window and which finished groups lie beyond it; `on_row(row)` with
    each metrics row as it is written (the live console: training/console.py, and the
    trackers). Each part is set up
    here in the order it is needed and taken down in the reverse one (the ExitStack)."""
    import torch

    from envhub.envs.agents import make_agents
    from envhub.envs.errors import RunConfigError
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.server import run_in_thread
    from envhub.orchestrator.groups.executor import RoutedExecutor, make_executor
    from envhub.orchestrator.groups.services.hub import PREFIX, open_hub, served_envs
    from envhub.orchestrator.groups.setup import new_run_id
    from envhub.orchestrator.groups.task_metrics import run_metrics
    from envhub.orchestrator.training import resume as rs
    from envhub.orchestrator.training.engines import serving
    from envhub.orchestrator.training.ledger import GroupJournal, GroupLedger
    from envhub.orchestrator.training.loop import Loop, LoopStart
    from envhub.orchestrator.training.model import build_trainer, placement
    from envhub.orchestrator.training.producer import Producer
    from envhub.orchestrator.training.provenance import NOT_RECORDED, provenance, write_json
    from envhub.orchestrator.training.ranks import RankLeader, follow
    from envhub.orchestrator.training.source import LaunchOrderSource
    from envhub.orchestrator.training.tasks import DifficultyFilter, LaunchMix, task_stream
    from envhub.trainer.distributed import DataParallel
    from envhub.trainer.source import HttpSource
    from envhub.trainer.window import GroupWindow

    dp = (DataParallel.init(device=cfg.device) if int(os.environ.get("WORLD_SIZE", "1")) > 1
          else None)
    if cfg.services and dp is not None:  # under a torchrun of the user's own
        raise RunConfigError("--services runs rollouts on one trainer rank: drop "
                             "--nproc-per-node, or run the environments in this process")
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    refs = [c.ref for c in cfg.envs]
    with contextlib.ExitStack() as stack:
        hub = open_hub(cfg, log)
        if hub is not None:
            stack.callback(hub.stop_listening)
        served = served_envs(hub, refs)  # each waits for its first task service
        envs = load_training_envs(cfg, served)  # each with its agent (RunConfigError)
        agents = make_agents({e.ref: e.agent for e in envs}, cfg.agent_install,
                             cfg.agent_on_host)
        admin = "envhub-admin-" + secrets.token_urlsafe(16)
        gw_config = GatewayConfig(port=0, db=f"sqlite:///{cfg.out / 'pool.db'}",
                                  admin_key=admin, model=cfg.model, device=cfg.rollout_device,
                                  dtype=cfg.rollout_dtype)
        point = rs.resume_point(cfg.out, [e.name for e in envs]) if cfg.resume else None
        trainer: Any = build_trainer(cfg, gw_config, envs, dp)
        tokenizer = trainer.tokenizer
        if point is not None and point.folder is not None:  # every rank loads its part
            trainer.load_checkpoint(point.folder)
            rs.python_rng(point.loop.get("python_rng"))
        if dp is not None and dp.rank != 0:  # follow rank 0's steps and pushes until it stops
            follow(trainer, cfg.out / "weights")
            return []
        where = placement(cfg, trainer.device)
        if dp is not None:  # the other ranks stop following at the end, also on failure
            trainer = RankLeader(trainer, dp)
            stack.callback(trainer.stop)
        # Rank 0 (or the only process): the engine, the rollouts, the gateway and the loop.
        log("trainer on {train_device} in {train_dtype}, rollouts on {rollout_device} in "
            "{rollout_dtype} (--device, --dtype, --engine-dtype)".format(**where))
        engine = stack.enter_context(serving(cfg, gw_config, log))  # a vLLM stops at the end
        metrics = run_metrics(cfg.metrics, hub, log, stack)
        run_id = point.journal.run_id if point is not None else new_run_id()
        assert run_id is not None
        ledger = GroupLedger(run_id, [e.name for e in envs], cfg.k)  # every group's state
        stopped: list[str] = []  # a resumed run's groups that were running at the crash
        if point is not None:
            stopped = ledger.restore(point.journal, point.consumed, point.loop.get("settled"))
        mix = LaunchMix([e.weight for e in envs], ledger, dynamic=cfg.mix == "dynamic")
        executor = RoutedExecutor(make_executor(cfg.executor), {PREFIX: hub} if hub else {})
        launched = ledger.launched_tasks_by_env() if point is not None else None
        admit = (DifficultyFilter(ledger, cfg.difficulty_window, cfg.difficulty_floor,
                                  cfg.seed) if cfg.difficulty_filter else None)
        producer = Producer(task_stream(envs, cfg.seed, mix, launched, admit), ledger,
                            concurrency=cfg.concurrency, buffer=cfg.buffer_size,
                            schedule=cfg.schedule, executor=executor)
        producer.admit = admit  # its count goes into the step rows
        stack.callback(producer.stop)
        # Before anything is written: a cluster that cannot be reached leaves no OUT behind.
        host = producer.start_executor(refs, served)
        cfg.out.mkdir(parents=True, exist_ok=True)
        record = provenance(cfg.model_dump(mode="json", exclude=NOT_RECORDED),
                            [(e.ref, e.name, e.folder) for e in envs], gw_config.model_path(),
                            where)
        start = LoopStart()
        if point is None:
            write_json(cfg.out / "run.json", record)
            (cfg.out / "metrics.jsonl").write_text("")
        else:
            start = _resumed(cfg, point, record, log)
        ledger.journal = GroupJournal(cfg.out / rs.JOURNAL, run_id)
        stack.callback(ledger.journal.close)
        trackers = None
        if cfg.log_to:
            from envhub.orchestrator.training.trackers import Trackers

            trackers = Trackers(cfg.log_to, cfg.out, record["config"], run_id,
                                start.step if point is not None else None, start.rows,
                                start.samples)
            stack.callback(trackers.close)
        gw = run_in_thread(engine.model_copy(update={"host": host}))
        stack.callback(gw.close)
        http = stack.enter_context(contextlib.closing(HttpSource(gw.url, admin)))
        stack.callback(producer.stop)  # again, before those two: rollouts talk to the gateway
        producer.open(refs=refs, gateway=gw.url, admin_key=admin, agent=agents,
                      out=cfg.out, max_turns=cfg.max_turns, agent_install=cfg.agent_install,
                      agent_on_host=cfg.agent_on_host, served=served, metrics=metrics)
        consumed = frozenset(point.consumed) if point else frozenset()
        source = LaunchOrderSource(http, ledger, trained=consumed)
        window = GroupWindow(source, cfg.window_size, consumed=consumed)
        loop = Loop(cfg, trainer, producer, source, window, envs,
                    push_url=f"{gw.url}/admin/weights", admin_key=admin, log=log,
                    on_wait=on_wait, metrics=metrics, dtypes=where, start=start, on_row=on_row,
                    trackers=trackers, tokenizer=tokenizer,
                    # the built-in agent evaluates greedily (evaluate's own); others as they run
                    eval_agent={e.ref: agents[e.ref] for e in envs if e.agent != "tool"})
        if point is not None:
            closed = rs.close_stopped_sessions(gw.url, admin)
            window.skip(stopped)  # never finished: nothing to train, never waited for
            for gid in ledger.release(stopped):
                ledger.settle(gid, 0.0)
            where_from = point.folder.name if point.folder else "no checkpoint yet: the start"
            log(f"resume: from step {start.step} ({where_from}), {len(stopped)} groups "
                f"running at the stop passed, {closed} sessions closed as env_failure "
                f"({rs.STOPPED!r})")
            if trainer.version > 0:  # the engine serves the checkpoint's weights again
                loop.push(bump=False)
        rows = loop.run()
        if loop.interrupted:
            raise rs.RunStopped(f"stopped after step {start.step}")
        return rows
    raise AssertionError("unreachable")  # the stack re-raises or the body returned


def _resumed(cfg: TrainLoopConfig, point: Any, record: dict[str, Any],
             log: Callable[[str], Any]) -> Any:
    """OUT set back to `point` (resume.py): the inputs checked against run.json, the resume
    noted there, metrics.jsonl as the checkpoint holds it, newer weights removed; returns
    where the loop starts."""
    import json

    from envhub.orchestrator.training import resume as rs
    from envhub.orchestrator.training.loop import LoopStart
    from envhub.orchestrator.training.provenance import write_json

    meta = json.loads((cfg.out / "run.json").read_text(encoding="utf-8"))
    changed = rs.changed_inputs(meta, record)
    if changed:
        raise rs.ResumeError(f"--resume {cfg.out}: {'; '.join(changed)} changed since the run "
                             "started; resume with what it trained on, or train into a fresh "
                             "folder")
    meta.setdefault("resumes", []).append({
        "from_step": point.step, "checkpoint": point.folder.name if point.folder else None,
        "config": record["config"], "argv": record["argv"], "git": record["git"],
        "envhub": record["envhub"]})
    write_json(cfg.out / "run.json", meta)
    rows = rs.restore_metrics(cfg.out, point)
    samples = rs.restore_samples(cfg.out, point)
    rs.drop_newer_weights(cfg.out, int(point.state.get("version", 0)), log)
    return LoopStart(point.step, rows, samples, float(point.loop.get("wall_s", 0.0)))


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
    task services' environments by reference (None: skip those, they are not there yet).
    Each environment's agent is resolved here: RunConfigError when --agent cannot act on it."""
    from envhub.envs.agents import agent_for
    from envhub.orchestrator.catalog import load_env
    from envhub.orchestrator.groups.services.hub import PREFIX
    from envhub.orchestrator.training.tasks import EnvTasks, split_tasks

    envs: list[EnvTasks] = []
    for choice in cfg.envs:
        if choice.ref.startswith(PREFIX) and served is None:
            continue
        loaded = (served or {}).get(choice.ref) or load_env(choice.ref)
        agent = agent_for(cfg.agent, loaded.env, choice.ref)
        heldout = cfg.eval_tasks if cfg.eval_every else 0
        tasks = loaded.env.load_tasks()
        stratify = loaded.manifest.tasks.stratify
        if stratify and not any(stratify in t.data for t in tasks):
            raise ValueError(f"{choice.ref}: envhub.toml's [tasks] stratify = {stratify!r} names "
                             "no field of its tasks' rows; name one they have, or drop it")
        train_tasks, held = split_tasks(tasks, cfg.tasks, heldout, stratify)
        if any(e.name == loaded.name for e in envs):
            raise ValueError(f"{choice.ref}: another environment of this run is named "
                             f"{loaded.name!r} too; rename one (envhub.toml's name), since "
                             "rows, metrics and the launch mix count by name")
        envs.append(EnvTasks(choice.ref, loaded.name, choice.weight, train_tasks, held,
                             stratify, loaded.manifest.reward_weights(), agent,
                             str(loaded.folder)))
    return envs
