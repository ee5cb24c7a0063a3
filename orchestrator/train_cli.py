"""`envhub train`: the command line of the RL loop (orchestrator/train.py), generated from
`TrainLoopConfig` (sdk/config_cli.py): every field is a flag, the environments the argument."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from envhub.orchestrator.console import fail
from envhub.orchestrator.training.config import TrainLoopConfig
from envhub.orchestrator.training.resume import ResumeError, RunStopped
from envhub.sdk.config_cli import config_command

# Flag names that differ from the field names (kept from earlier releases).
# --dtype: the trainer's precision under the name `envhub gateway`/`engine` use (train.py).
FLAGS: dict[str, str | tuple[str, ...]] = {"service_wait_s": "--service-wait",
                                           "precision": ("--precision", "--dtype"),
                                           "quiet": ("--quiet", "-q")}
ENVVARS = {"services_token": "ENVHUB_SERVICES_TOKEN"}
SPAWNED = "ENVHUB_TRAIN_RANKS_SPAWNED"  # set for the torchrun `--nproc-per-node` starts


def train_main(cfg: TrainLoopConfig) -> None:
    """Train on environments: gateway + rollouts + trainer + weight sync (GPU when present,
    else CPU; several ranks with --nproc-per-node or under torchrun). Asynchronous by default
    (rollouts keep running while the trainer trains)."""
    import os
    import sys

    from envhub.envs.agents import make_agent
    from envhub.envs.errors import RunConfigError
    from envhub.orchestrator.groups.executor import make_executor
    from envhub.orchestrator.groups.scheduling import make_policy
    from envhub.orchestrator.train import load_training_envs, torchrun_argv, train
    from envhub.orchestrator.training.engines import EngineError, check_devices, check_engine
    from envhub.orchestrator.training.provenance import clear_run, held_run
    from envhub.orchestrator.training.trackers import check_trackers
    from envhub.trainer.errors import TrainerError

    if cfg.model is not None and not Path(cfg.model).is_dir():
        fail(f"--model {cfg.model} is not a folder; pass a Hugging Face model folder")
    # the run's first process looks: this one, or rank 0 of a torchrun of the user's own (the
    # ranks this command starts itself were looked for already)
    first = os.environ.get(SPAWNED) is None and os.environ.get("RANK", "0") == "0"
    held = held_run(cfg.out) if first else []
    if cfg.resume is not None:
        held = []  # going on with it
    elif held and not cfg.overwrite:  # before anything is read or written
        fail(f"--out {cfg.out} holds a run ({', '.join(held)}); nothing was changed. Go on "
             f"with it (envhub train --resume {cfg.out}), train into a fresh folder, or add "
             "--overwrite to replace it")
    try:
        make_agent(cfg.agent, cfg.agent_install, cfg.agent_on_host)
        make_executor(cfg.executor)  # only loads it: reaching its machines is train's first act
        make_policy(cfg.schedule)
        load_training_envs(cfg, served=None)  # task services' environments: once they register
        check_engine(cfg)
        check_devices(cfg)  # a GPU the machine lacks: said now, not deep inside torch
        check_trackers(cfg.log_to)  # a tracker whose library is missing: the extra to install
    except Exception as e:  # unknown env, agent, executor or engine, bad manifest, bad split:
        fail(str(e))  # the fix is in it
    cfg.apply_sandbox_disk()
    if held:  # --overwrite, and everything else checked: the old run goes now
        clear_run(cfg.out)
    if cfg.nproc_per_node > 1 and "WORLD_SIZE" not in os.environ:
        # the same command line again, each rank sees WORLD_SIZE and trains its shard
        from envhub.orchestrator.training.ranks import spawn

        code, interrupted = spawn(torchrun_argv(cfg.nproc_per_node, sys.argv[1:]),
                                  env={**os.environ, SPAWNED: "1"})
        if interrupted and code == 0:  # rank 0 stopped at a step with a checkpoint
            typer.echo(f"stopped by Ctrl-C; go on with: envhub train --resume {cfg.out}")
            raise typer.Exit(130)
        raise typer.Exit(code)
    from envhub.orchestrator.training.console import TrainConsole

    try:
        with TrainConsole(cfg.steps, quiet=cfg.quiet) as console:
            train(cfg, log=console.log, on_row=console.row)
    except ResumeError as e:
        fail(str(e))
    except RunStopped:  # Ctrl-C: a checkpoint was written
        if os.environ.get(SPAWNED):  # rank 0 of --nproc-per-node: the command says it
            raise typer.Exit(0) from None  # (an exit code torchrun would report as a crash)
        typer.echo(f"stopped by Ctrl-C; go on with: envhub train --resume {cfg.out}")
        raise typer.Exit(130) from None
    # e.g. LoRA targets the model does not have; no Ray to reach, or none of its nodes can run
    # a rollout (before anything is written)
    except (TrainerError, RunConfigError) as e:
        fail(str(e))
    except EngineError as e:  # vLLM did not start: not the command line's fault
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


def resume_options(out: Path) -> dict[str, Any]:
    """`--resume OUT`: the options the run in OUT was started with (its run.json), in OUT."""
    import json

    meta = out / "run.json"
    try:
        recorded = json.loads(meta.read_text(encoding="utf-8"))["config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"--resume {out}: cannot read the run's options from {meta} ({e}); point it at "
             "the --out of an envhub train run")
    fields = TrainLoopConfig.model_fields
    return {**{k: v for k, v in recorded.items() if k in fields}, "out": out, "resume": out}


train_command = config_command(TrainLoopConfig, train_main, arguments=("envs",), flags=FLAGS,
                               envvars=ENVVARS, config_file="--config",
                               presets={"resume": resume_options})
