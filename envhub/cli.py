"""`envhub` console script: wires each component's commands into one Typer app.

Each component owns `<component>/cli.py` with `register(app)`; those modules import only
typer at top level so `envhub --help` stays fast and works without heavy extras.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer

from envhub import __version__

app = typer.Typer(
    name="envhub",
    help="Token-exact gateway, environments, registry and trainer for RL on LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


# Libraries' own switches for their chatter, set before any of them is imported (the commands
# import lazily) and inherited by every process a command starts (ranks, rollout workers):
# transformers' load progress bars and advice-level logging. `envhub -v` leaves them as they are.
QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
             "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the libraries' "
                                 "progress bars and warnings (quiet by default)."),
) -> None:
    if not verbose:
        for name, value in QUIET_ENV.items():
            os.environ.setdefault(name, value)


@app.command("train")
def train_command(
    envs: list[str] = typer.Argument(None, help="environments to train on, with sampling "
                                     "weights if several: arith=3 swe-task=1 (default: arith)"),
    steps: int = typer.Option(20, min=1, help="optimizer steps"),
    seed: int = typer.Option(0, help="seed for torch, task order and sampling"),
    out: str = typer.Option("runs/train", help="folder for metrics.jsonl, pool.db, weights/"),
    groups: int = typer.Option(16, min=1, help="groups (tasks) per optimizer step"),
    k: int = typer.Option(4, min=2, help="samples per task (group size)"),
    concurrency: int = typer.Option(16, min=1, help="rollouts in flight"),
    lr: float = typer.Option(1e-4, min=0, help="AdamW learning rate (see trainer/README.md: "
                             "1e-3 breaks the bundled model's tool-call format)"),
    tau: int = typer.Option(2, min=0, help="staleness bound in weight versions"),
    sync: bool = typer.Option(False, "--sync", help="synchronous loop (roll out a step's "
                              "groups, wait, train, push) instead of the asynchronous one"),
    window: int = typer.Option(None, min=0, help="windowed-FIFO size in groups, over the "
                               "generation order (0: greedy; default: 2 x --groups, greedy "
                               "with --sync)"),
    buffer: int = typer.Option(None, min=1, help="most groups launched but not yet trained on "
                               "(default: --tau x --sync-every steps' worth, at least "
                               "--groups)"),
    model: str = typer.Option(None, help="HF model folder (default: the bundled model)"),
    engine: str = typer.Option("embedded", help="what samples: embedded (the gateway's own "
                               "engine) or vllm (a real vLLM server from vLLM's virtualenv, "
                               "bash scripts/vllm_venv.sh; weights pushed through its RL "
                               "routes; --model must be one vLLM runs)"),
    engine_url: str = typer.Option(None, help="with --engine vllm: a vLLM server already "
                                   "running (VLLM_SERVER_DEV_MODE=1, serving --model, able to "
                                   "read OUT/weights) instead of starting one"),
    engine_start_timeout: float = typer.Option(900.0, min=1, help="seconds the started vLLM "
                                               "server may take to become ready"),
    agent: str = typer.Option("tool", help="tool (the built-in agent) or a command line "
                              "(any agent using OPENAI_BASE_URL / OPENAI_API_KEY; it runs inside "
                              "the rollout's sandbox)"),
    agent_install: list[str] = typer.Option(None, "--agent-install", help="pip:REQ | "
                                            "script:PATH: a command agent's programs, made "
                                            "present in the sandbox (repeatable)"),
    agent_on_host: bool = typer.Option(False, "--agent-on-host", help="run a command agent as "
                                       "a host process: no containment"),
    max_turns: int = typer.Option(None, min=1, help="override the env's max_turns"),
    tasks: int = typer.Option(None, min=1, help="train on each env's first N training tasks "
                              "(default: all); each pass over them is in a fresh seeded order"),
    keep_weights: int = typer.Option(2, min=1, help="weight versions kept in OUT/weights"),
    sync_every: int = typer.Option(1, min=1, help="push weights every K optimizer steps"),
    reset_optimizer: bool = typer.Option(None, "--reset-optimizer/--no-reset-optimizer",
                                         help="clear AdamW's moments after each weight push "
                                         "(default: on with --sync-every 2 or more; off at 1, "
                                         "where it would make every step a sign step, and "
                                         "with --sync)", show_default=False),
    eval_every: int = typer.Option(15, min=0, help="held-out evaluation every E steps, "
                                   "before the first and after the last; 0: none"),
    eval_samples: int = typer.Option(8, min=1, help="samples per held-out task and evaluation, "
                                     "drawn as in training (eval/resolved_rate: their mean), "
                                     "with the same random numbers in every evaluation of the "
                                     "run (seeds from --seed)"),
    eval_greedy: bool = typer.Option(False, "--eval-greedy", help="evaluate with one greedy "
                                     "(temperature 0) sample per held-out task instead"),
    eval_tasks: int = typer.Option(64, min=1, help="held-out tasks per environment (its last N, "
                                   "or each [tasks] stratify kind's last, by share; never "
                                   "trained on)"),
    std_norm: bool = typer.Option(False, "--std-norm/--no-std-norm", help="divide GRPO "
                                  "advantages by the group's reward std (default: r - mean, "
                                  "so a reward's weight keeps its meaning)"),
    gradient_checkpointing: bool = typer.Option(False, "--gradient-checkpointing",
                                                help="recompute activations in the backward "
                                                "pass (less memory, more compute)"),
    chains: str = typer.Option("all", help="conversations of each session to train on: all, "
                               "or main (the one with the most turns; a CLI's side calls are "
                               "other chains)"),
    precision: str = typer.Option("fp32", help="fp32 | bf16 (bfloat16 compute, fp32 master "
                                  "weights)"),
    lora_rank: int = typer.Option(None, min=1, help="train LoRA adapters (PEFT) of this rank "
                                  "instead of all weights; the engine gets merged weights"),
    lora_alpha: int = typer.Option(None, min=1, help="LoRA alpha (default: 2 x rank)"),
    lora_targets: str = typer.Option(None, help="comma-separated module names to adapt "
                                     "(default: every linear layer but the LM head)"),
    executor: str = typer.Option("inprocess", help="where rollouts run: inprocess | ray (each "
                                 "rollout a Ray task on the cluster at RAY_ADDRESS, else a "
                                 "local Ray; needs envhub[ray]); held-out evaluation runs here"),
    schedule: str = typer.Option("fifo", help="which rollout starts next: fifo (a group's "
                                 "samples together, when all fit) | seer (groups queued up to "
                                 "--buffer; one probe sample per group first, then the rest "
                                 "longest-first by what the probes took)"),
    nproc_per_node: int = typer.Option(1, min=1, help="trainer ranks on this machine: re-runs "
                                       "this command under torchrun (FSDP2; rank 0 runs the "
                                       "gateway and rollouts). Under your own torchrun, leave "
                                       "it at 1"),
) -> None:
    """Train on environments: gateway + rollouts + trainer + weight sync (GPU when present,
    else CPU; several ranks with --nproc-per-node or under torchrun). Asynchronous by default
    (rollouts keep running while the trainer trains)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from pydantic import ValidationError

    from envhub.train import TrainLoopConfig, load_training_envs, train
    from envhub.trainer.errors import TrainerError

    if chains not in ("all", "main"):
        _fail(f"--chains {chains!r}: use all or main")
    if engine not in ("embedded", "vllm"):
        _fail(f"--engine {engine!r}: use embedded or vllm")
    if model is not None and not Path(model).is_dir():
        _fail(f"--model {model} is not a folder; pass a Hugging Face model folder")
    if precision not in ("fp32", "bf16"):
        _fail(f"--precision {precision}: use fp32 or bf16")
    targets = [t.strip() for t in lora_targets.split(",") if t.strip()] if lora_targets else None
    if (lora_alpha is not None or targets) and lora_rank is None:
        _fail("--lora-alpha/--lora-targets need --lora-rank R")
    from envhub.envs.errors import RunConfigError
    from envhub.envs.runner.config import EnvChoice

    try:
        choices = [EnvChoice.parse(e) for e in envs or ["arith"]]
    except RunConfigError as e:
        _fail(str(e))
    try:
        cfg = TrainLoopConfig(envs=choices, steps=steps, seed=seed, out=Path(out),
                              groups=groups, k=k, concurrency=concurrency, lr=lr, tau=tau,
                              sync=sync, window=window, buffer=buffer, model=model,
                              engine=engine, engine_url=engine_url,
                              engine_start_timeout=engine_start_timeout, agent=agent,
                              agent_install=agent_install or [], agent_on_host=agent_on_host,
                              max_turns=max_turns, tasks=tasks, keep_weights=keep_weights,
                              sync_every=sync_every, reset_optimizer=reset_optimizer,
                              eval_every=eval_every, eval_tasks=eval_tasks,
                              eval_samples=eval_samples, eval_greedy=eval_greedy,
                              std_norm=std_norm,
                              gradient_checkpointing=gradient_checkpointing, chains=chains,
                              precision=precision, lora_rank=lora_rank, lora_alpha=lora_alpha,
                              lora_targets=targets, executor=executor, schedule=schedule)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        _fail(f"{'--' + where.replace('_', '-') + ': ' if where else ''}{err['msg']}")
    try:
        from envhub.envs.agents import make_agent
        from envhub.envs.runner.executor import make_executor
        from envhub.envs.runner.scheduling import make_policy
        from envhub.training.engines import check_engine

        make_agent(agent, agent_install or [], agent_on_host)
        make_executor(executor)  # only loads it: reaching its machines is train's first act
        make_policy(schedule)
        load_training_envs(cfg)
        check_engine(cfg)
    except Exception as e:  # unknown env, agent, executor or engine, bad manifest, bad split:
        _fail(str(e))  # the fix is in it
    if nproc_per_node > 1 and "WORLD_SIZE" not in os.environ:
        from envhub.train import torchrun_argv

        # the same command line again, each rank sees WORLD_SIZE and trains its shard
        code = subprocess.call(torchrun_argv(nproc_per_node, sys.argv[1:]))
        raise typer.Exit(code)
    from envhub.training.engines import EngineError

    try:
        train(cfg, log=typer.echo)
    # e.g. LoRA targets the model does not have; no Ray to reach, or none of its nodes can run
    # a rollout (before anything is written)
    except (TrainerError, RunConfigError) as e:
        _fail(str(e))
    except EngineError as e:  # vLLM did not start: not the command line's fault
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


@app.command("export")
def export_command(
    out: str = typer.Option(..., "--out", "-o", help="file to write"),
    fmt: str = typer.Option(None, "--format", "-f", help="jsonl | parquet (the pool's "
                            "trajectories) | atif (Harbor's ATIF, one document a line) | "
                            "verl | trl (training rows with advantages); "
                            "default: verl with --gateway/--jsonl, else jsonl"),
    db: str = typer.Option(None, help="pool URL to read (sqlite:///FILE or postgresql://...)"),
    gateway: str = typer.Option(None, help="a gateway's URL to read the pool from"),
    admin_key: str = typer.Option(None, envvar="ENVHUB_ADMIN_KEY", help="its admin key"),
    jsonl: str = typer.Option(None, help="verl/trl: read trajectories from a JSONL export "
                              "(or give --db or --gateway)"),
    group_id: str = typer.Option(None, help="jsonl/parquet: only this group"),
    status: str = typer.Option(None, help="jsonl/parquet: only sessions with this status"),
    window: int = typer.Option(None, min=1, help="verl/trl: windowed-FIFO size"),
    max_groups: int = typer.Option(None, min=1, help="verl/trl: at most this many groups"),
    group_size: int = typer.Option(None, min=1, help="verl/trl: expected samples per group"),
    tau: int = typer.Option(None, min=0, help="verl/trl: staleness bound"),
    trainer_version: int = typer.Option(0, min=0, help="verl/trl: the trainer's version"),
    no_std: bool = typer.Option(False, "--no-std", help="verl/trl: GRPO without std"),
    tokenizer: str = typer.Option(None, help="atif: model folder (or 'bundled') whose "
                                  "tokenizer decodes sampled ids into step messages"),
) -> None:
    """Export trajectories: the pool as JSONL/Parquet, or verl/TRL training rows."""
    target = _export_target(out)
    with _written_whole(target) as partial:
        _export(partial, target, fmt, db, gateway, admin_key, jsonl, group_id, status, window,
                max_groups, group_size, tau, trainer_version, no_std, tokenizer)


def _export_target(out: str) -> Path:
    """The export file, checked before anything is read: exit 2 with the fix otherwise."""
    target = Path(out)
    if target.is_dir():
        _fail(f"--out {out}: is a folder; give a file name, e.g. {target / 'export.jsonl'}")
    if not target.parent.is_dir():
        _fail(f"--out {out}: folder {target.parent} does not exist; create it first "
              f"(mkdir -p {target.parent})")
    if not os.access(target.parent, os.W_OK):
        _fail(f"--out {out}: folder {target.parent} is not writable")
    return target


@contextmanager
def _written_whole(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `target`, moved onto it only when the export finished:
    a failed export leaves no half-written file."""
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        yield partial
        if partial.exists():
            os.replace(partial, target)
    except OSError as e:
        _fail(f"--out {target}: {e.strerror or e}")
    finally:
        partial.unlink(missing_ok=True)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _export(out: Path, target: Path, fmt: str | None, db: str | None, gateway: str | None,
            admin_key: str | None, jsonl: str | None, group_id: str | None,
            status: str | None, window: int | None, max_groups: int | None,
            group_size: int | None, tau: int | None, trainer_version: int,
            no_std: bool, tokenizer: str | None = None) -> None:
    if fmt is None:
        fmt = "verl" if (gateway or jsonl) else "jsonl"
    if fmt in ("verl", "trl"):
        from envhub.trainer.cli import export

        if db is not None and gateway is None and jsonl is None:
            _check_pool_file(db)
        export(out=out, shown_as=target, fmt=fmt, gateway=gateway, admin_key=admin_key, db=db,
               jsonl=Path(jsonl) if jsonl else None, window=window, max_groups=max_groups,
               group_size=group_size, tau=tau, trainer_version=trainer_version, no_std=no_std)
        return
    if fmt not in ("jsonl", "parquet", "atif"):
        typer.echo(f"error: --format {fmt!r}: use jsonl, parquet, verl or trl, or atif", err=True)
        raise typer.Exit(2)
    if db is None:
        typer.echo("error: jsonl/parquet/atif read the pool directly: pass --db URL, e.g. "
                   "--db sqlite:///envhub-pool.db", err=True)
        raise typer.Exit(2)
    _check_pool_file(db)
    from envhub.gateway.pool.export import export_jsonl, export_parquet
    from envhub.gateway.pool.store import Store

    if fmt == "atif":
        from envhub.gateway.pool.atif import tokenizer_decode

        try:
            decode = tokenizer_decode(tokenizer) if tokenizer else None
        except ValueError as e:
            _fail(str(e))
    store = Store(db)
    try:
        if fmt == "atif":
            from envhub.gateway.pool.atif import export_atif

            n, skipped = export_atif(store, Path(out), group_id, status, __version__, decode)
            typer.echo(f"wrote {n} ATIF trajectories to {target} ({skipped} sessions without "
                       "model calls skipped)")
            return
        writer = export_jsonl if fmt == "jsonl" else export_parquet
        n = writer(store, Path(out), group_id, status)
    finally:
        store.close()
    typer.echo(f"wrote {n} {'trajectories' if fmt == 'jsonl' else 'segments'} to {target}")


def _check_pool_file(db: str) -> None:
    if db.startswith("sqlite:///") and not Path(db[len("sqlite:///"):]).is_file():
        _fail(f"{db}: no such pool file")


def _register_all() -> None:
    from envhub import machine_cli
    from envhub.envs import cli as envs_cli
    from envhub.gateway import cli as gateway_cli
    from envhub.registry import cli as registry_cli
    from envhub.trainer import cli as trainer_cli
    from envhub.viewer import cli as viewer_cli

    for module in (gateway_cli, envs_cli, registry_cli, trainer_cli, viewer_cli, machine_cli):
        module.register(app)


_register_all()


def main() -> None:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a torchrun rank (--nproc-per-node)
        from envhub.trainer.distributed import run_rank

        run_rank(app)
    app()


if __name__ == "__main__":  # python -m envhub.cli (python -m envhub works too)
    main()
