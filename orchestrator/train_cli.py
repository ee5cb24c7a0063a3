"""`envhub train`: the command line of the RL loop (orchestrator/train.py)."""

from __future__ import annotations

import typer

from envhub.orchestrator.console import fail


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
    services: str = typer.Option(None, help="HOST:PORT to listen on for task services "
                                 "(envhub serve); give their environments as service:NAME"),
    services_token: str = typer.Option(None, envvar="ENVHUB_SERVICES_TOKEN", help="what task "
                                       "services present to register (default: a random one, "
                                       "printed)"),
    service_wait: float = typer.Option(60.0, help="seconds a rollout waits for a live task "
                                       "service of its name with a free slot"),
    mix: str = typer.Option("static", help="static: groups launched by the weights' shares | "
                            "dynamic: the weights are shares of TRAINED samples; launches follow "
                            "what each environment's groups yield (slow, failing, no-signal)"),
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

    from envhub.orchestrator.train import TrainLoopConfig, load_training_envs, train
    from envhub.trainer.errors import TrainerError

    if chains not in ("all", "main"):
        fail(f"--chains {chains!r}: use all or main")
    if engine not in ("embedded", "vllm"):
        fail(f"--engine {engine!r}: use embedded or vllm")
    if model is not None and not Path(model).is_dir():
        fail(f"--model {model} is not a folder; pass a Hugging Face model folder")
    if precision not in ("fp32", "bf16"):
        fail(f"--precision {precision}: use fp32 or bf16")
    targets = [t.strip() for t in lora_targets.split(",") if t.strip()] if lora_targets else None
    if (lora_alpha is not None or targets) and lora_rank is None:
        fail("--lora-alpha/--lora-targets need --lora-rank R")
    from envhub.envs.errors import RunConfigError
    from envhub.orchestrator.groups.config import EnvChoice

    try:
        choices = [EnvChoice.parse(e) for e in envs or ["arith"]]
    except RunConfigError as e:
        fail(str(e))
    try:
        cfg = TrainLoopConfig.model_validate(dict(
            envs=choices, steps=steps, seed=seed, out=Path(out), groups=groups, k=k,
            concurrency=concurrency, lr=lr, tau=tau, sync=sync, window=window, buffer=buffer,
            model=model, engine=engine, engine_url=engine_url,
            engine_start_timeout=engine_start_timeout, agent=agent,
            agent_install=agent_install or [], agent_on_host=agent_on_host,
            max_turns=max_turns, tasks=tasks, keep_weights=keep_weights,
            sync_every=sync_every, reset_optimizer=reset_optimizer, eval_every=eval_every,
            eval_tasks=eval_tasks, eval_samples=eval_samples, eval_greedy=eval_greedy,
            std_norm=std_norm, gradient_checkpointing=gradient_checkpointing, chains=chains,
            precision=precision, lora_rank=lora_rank, lora_alpha=lora_alpha,
            lora_targets=targets, executor=executor, schedule=schedule, services=services,
            services_token=services_token, service_wait_s=service_wait, mix=mix))
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        fail(f"{'--' + where.replace('_', '-') + ': ' if where else ''}{err['msg']}")
    try:
        from envhub.envs.agents import make_agent
        from envhub.orchestrator.groups.executor import make_executor
        from envhub.orchestrator.groups.scheduling import make_policy
        from envhub.orchestrator.training.engines import check_engine

        make_agent(agent, agent_install or [], agent_on_host)
        make_executor(executor)  # only loads it: reaching its machines is train's first act
        make_policy(schedule)
        if services and nproc_per_node > 1:
            raise RunConfigError("--services runs rollouts on one trainer rank: drop "
                                 "--nproc-per-node, or run the environments in this process")
        load_training_envs(cfg, served=None)  # task services' environments: once they register
        check_engine(cfg)
    except Exception as e:  # unknown env, agent, executor or engine, bad manifest, bad split:
        fail(str(e))  # the fix is in it
    if nproc_per_node > 1 and "WORLD_SIZE" not in os.environ:
        from envhub.orchestrator.train import torchrun_argv

        # the same command line again, each rank sees WORLD_SIZE and trains its shard
        code = subprocess.call(torchrun_argv(nproc_per_node, sys.argv[1:]))
        raise typer.Exit(code)
    from envhub.orchestrator.training.engines import EngineError

    try:
        train(cfg, log=typer.echo)
    # e.g. LoRA targets the model does not have; no Ray to reach, or none of its nodes can run
    # a rollout (before anything is written)
    except (TrainerError, RunConfigError) as e:
        fail(str(e))
    except EngineError as e:  # vLLM did not start: not the command line's fault
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None

