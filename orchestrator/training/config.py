"""`envhub train`'s configuration: every option of the RL loop, validated. The command line
(orchestrator/train_cli.py) is generated from it: each field is a flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from envhub.orchestrator.groups.config import EnvChoice, ServicesOptions, check_schedule
from envhub.sdk.device import DEVICES, DTYPES, check_device, check_dtype
from envhub.trainer.config import precision_name

# The engine's dtype that computes as the trainer's precision does (fp32 master weights and
# bf16 autocast compute in bf16).
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


class TrainLoopConfig(ServicesOptions):
    envs: list[EnvChoice] = Field(default_factory=lambda: [EnvChoice(ref="arith")],
                                  description="environments to train on, with sampling weights "
                                  "(`arith=3 swe-task=1`: three groups of arith per swe-task; "
                                  "default: arith)")
    steps: int = Field(20, ge=1, description="optimizer steps")
    seed: int = Field(0, description="seeds torch, task order and sampling")
    out: Path = Field(Path("runs/train"), description="run.json (the resolved config and "
                      "provenance), metrics.jsonl, pool.db, weights/; a folder that holds a run "
                      "is refused (exit 2) unless --overwrite")
    overwrite: bool = Field(False, description="train into an --out that holds a run: its "
                            "run.json, metrics, pool, weights, checkpoints and rollouts are "
                            "removed first")
    resume: Path | None = Field(None, description="go on with the run in this folder after a "
                                "crash or Ctrl-C: its run.json's options (flags given here "
                                "override them), its newest checkpoint, the groups it finished "
                                "and did not train (orchestrator/training/resume.py)")
    log_to: list[str] = Field(default_factory=list, description="trackers that get every "
                              "metrics row, the config and sample rollouts: tensorboard, wandb "
                              "(offline), mlflow, trackio (local stores), comma-separated; each "
                              "an extra (envhub[trackers]); files under OUT/trackers")
    quiet: bool = Field(False, description="no progress display and no per-step lines (errors "
                        "still shown); off a terminal the progress display is plain lines")
    checkpoint_every: int | None = Field(None, ge=1, description="write a checkpoint every N "
                                         "optimizer steps (None: after every weight push); "
                                         "also after the last step and on Ctrl-C")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept in OUT/checkpoints "
                                  "(the newest)")
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
                                                "server (orchestrator/training/engines.py)")
    engine_url: str | None = Field(None, pattern=r"^https?://\S+$", description="with vllm: "
                                   "an already running vLLM server (VLLM_SERVER_DEV_MODE=1, "
                                   "serving --model) instead of starting one")
    engine_start_timeout: float = Field(900.0, gt=0, description="seconds the started vLLM "
                                        "server may take to answer /health")
    agent: str | None = Field(None, description="the agent: default each environment's own "
                              "(vf for verifiers environments, else tool); tool (built-in) or a "
                              "command line")
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
    truncated: Literal["keep", "mask", "penalty"] = Field(
        "keep", description="samples cut by the length limit (last turn finish_reason "
        "length): keep; mask (DAPO's overlong filtering: not trained, still in the group "
        "baseline); penalty (--overlong-penalty off their reward); counted in the row")
    overlong_penalty: float = Field(1.0, ge=0, description="--truncated penalty: what a "
                                    "truncated sample's reward loses")
    difficulty_filter: bool = Field(False, description="launch tasks solved always or never "
                                    "over their last --difficulty-window groups only with "
                                    "probability --difficulty-floor (the next task instead)")
    difficulty_window: int = Field(2, ge=1, description="finished groups of a task the "
                                   "difficulty filter looks at")
    difficulty_floor: float = Field(0.2, gt=0, le=1, description="the probability an "
                                    "all-or-nothing task is still launched, so it returns")
    dynamic_sampling: bool = Field(False, description="DAPO's dynamic sampling: groups that "
                                   "would train nothing (all samples scored alike) do not "
                                   "count towards --groups; more are taken, up to "
                                   "--dynamic-sampling-max extra per step (the row's dynamic/*)")
    dynamic_sampling_max: int | None = Field(None, ge=0, description="most extra groups one "
                                             "step takes for dynamic sampling (None: 2 x "
                                             "--groups)")
    loss: str = Field("is_mask", description="the policy loss: is_mask (GLM-5's two-sided "
                      "token mask, default), ppo_clip, gspo, cispo, or a plug-in "
                      "module:function (trainer/README.md has each one's formula)")
    loss_agg: Literal["token_mean", "seq_mean", "constant"] = Field(
        "token_mean", description="how token losses add up to the step's: token_mean, "
        "seq_mean (per sequence, then over sequences), constant (Dr.GRPO: / sequences x "
        "--loss-agg-constant)")
    loss_agg_constant: float = Field(4096.0, gt=0, description="--loss-agg constant: the "
                                     "per-sequence token budget it divides by")
    eps_low: float = Field(0.2, ge=0, lt=1, description="the token ratio's lower band or clip "
                           "(1 - eps_low): is_mask masks beyond it, ppo_clip and cispo clip")
    eps_high: float = Field(0.28, ge=0, description="the token ratio's upper band or clip "
                            "(1 + eps_high)")
    advantage: Literal["grpo", "rloo", "reinforce_pp"] = Field(
        "grpo", description="the advantage estimator: grpo (group mean, --std-norm: / std), "
        "rloo (leave-one-out mean), reinforce_pp (group mean, then normalised over the "
        "batch's tokens); each with reward-to-go")
    correction: Literal["none", "token_truncate", "token_mask", "sequence_truncate",
                        "sequence_mask"] = Field(
        "none", description="rollout correction for engine/trainer logprob mismatch: TIS "
        "(token_truncate, sequence_truncate) or MIS (token_mask, sequence_mask) with cap "
        "--correction-cap; the loss's ratio is then to the trainer's own policy")
    correction_cap: float = Field(2.0, ge=1.0, description="the correction's weight cap")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the "
                                         "backward pass (less memory, more compute)")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="the trainer's compute "
                                               "dtype (--dtype is the same flag; float32 and "
                                               "bfloat16 are accepted too). bf16: bfloat16 "
                                               "compute with fp32 master weights. The embedded "
                                               "engine samples in the same precision unless "
                                               "--engine-dtype says otherwise")
    device: str | None = Field(None, description=f"where the trainer and the embedded engine "
                               f"run: {DEVICES} (None or auto: this rank's GPU, cuda:LOCAL_RANK, "
                               "when CUDA is present, else cpu). cpu keeps everything off the "
                               "GPU")
    engine_device: str | None = Field(None, description="the embedded engine's device when it "
                                      "differs from --device (e.g. cuda:1 beside a trainer on "
                                      "cuda:0)")
    engine_dtype: str | None = Field(None, description=f"the embedded engine's dtype: "
                                     f"{', '.join(DTYPES)} (None: the trainer's precision, "
                                     "float32 or bfloat16, so rollouts and training compute "
                                     "alike; auto: bfloat16 on cuda, float32 elsewhere)")
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
                          "package.module:Class (orchestrator/groups/executor.py); held-out "
                          "evaluation runs in this process")
    schedule: str = Field("fifo", description="which rollout starts next: fifo (a group's "
                          "samples start together, when all fit) | seer (groups launched while "
                          "the buffer has room; one probe per group first, then the rest "
                          "longest-first) | package.module:Class "
                          "(orchestrator/groups/scheduling.py)")
    nproc_per_node: int = Field(1, ge=1, description="trainer ranks on this machine: re-runs "
                                "the command under torchrun (FSDP2; rank 0 runs the gateway and "
                                "the rollouts). Under your own torchrun, leave it at 1")
    mix: Literal["static", "dynamic"] = Field(
        "static", description="static: groups launched by the weights' shares; dynamic: the "
        "weights are shares of trained samples, and launches are paced by what each "
        "environment's groups yield (orchestrator/training/tasks.py, LaunchMix)")

    @model_validator(mode="before")
    @classmethod
    def _resume_out(cls, data: Any) -> Any:
        """--resume DIR without --out: the run goes on in DIR."""
        if isinstance(data, dict) and data.get("resume") is not None and data.get(
                "out") is None:
            data = {**data, "out": data["resume"]}
        return data

    @field_validator("log_to", mode="before")
    @classmethod
    def _log_to(cls, v: Any) -> Any:
        """`tensorboard,wandb` or the flag repeated."""
        v = _listed(v)
        if isinstance(v, list):
            from envhub.orchestrator.training.trackers import TRACKERS

            v = [t.lower() for t in v]
            unknown = [t for t in v if t not in TRACKERS]
            if unknown:
                raise ValueError(f"{', '.join(unknown)}: not a tracker; choose from "
                                 f"{', '.join(TRACKERS)} (comma-separated)")
        return v

    @field_validator("lora_targets", mode="before")
    @classmethod
    def _lora_targets(cls, v: Any) -> Any:
        """`q_proj,v_proj` or the flag repeated; none given is None (every linear layer)."""
        v = _listed(v)
        return (v or None) if isinstance(v, list) else v

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str) -> str:
        return check_schedule(v)

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, v: Any) -> Any:
        return precision_name(v)

    @field_validator("loss")
    @classmethod
    def _loss(cls, v: str) -> str:
        """A built-in, or a plug-in that imports, takes LossInputs and gives a finite loss
        with a gradient on a test input: refused here, before anything is written."""
        from envhub.trainer.config import check_loss_name
        from envhub.trainer.loss import resolve_loss

        check_loss_name(v)
        if ":" in v:
            resolve_loss(v)
        return v

    @field_validator("device", "engine_device")
    @classmethod
    def _device(cls, v: str | None) -> str | None:
        return None if v is None else check_device(v)

    @field_validator("engine_dtype")
    @classmethod
    def _engine_dtype(cls, v: str | None) -> str | None:
        return None if v is None else check_dtype(v)

    @model_validator(mode="after")
    def _consistent(self) -> TrainLoopConfig:
        refs = [e.ref for e in self.envs]
        if not refs or len(set(refs)) != len(refs):
            raise ValueError(f"give each environment once (got {', '.join(refs) or 'none'}), "
                             "with a weight if wanted: arith=3 swe-task=1")
        if self.engine_url is not None and self.engine != "vllm":
            raise ValueError("--engine-url names a vLLM server: add --engine vllm")
        if self.engine == "vllm" and (self.engine_device or self.engine_dtype):
            raise ValueError("--engine-device/--engine-dtype set the embedded engine; vLLM "
                             "chooses its own: drop them, or use --engine embedded")
        self.check_served(refs)
        if (self.lora_alpha is not None or self.lora_targets) and self.lora_rank is None:
            raise ValueError("--lora-alpha/--lora-targets need --lora-rank R")
        if self.services and self.nproc_per_node > 1:
            raise ValueError("--services runs rollouts on one trainer rank: drop "
                             "--nproc-per-node, or run the environments in this process")
        if self.resume is not None and self.out.resolve() != self.resume.resolve():
            raise ValueError(f"--resume {self.resume} goes on in that folder: drop --out "
                             f"{self.out} (or give the same folder)")
        if self.resume is not None and self.overwrite:
            raise ValueError("--resume goes on with a run, --overwrite replaces it: give one")
        if self.buffer is not None and self.buffer < self.groups:
            raise ValueError(f"buffer {self.buffer} < groups {self.groups}: the trainer needs "
                             "`groups` finished groups per step; raise buffer")
        return self

    @property
    def rollout_device(self) -> str | None:
        """The embedded engine's device: --engine-device, else --device."""
        return self.engine_device or self.device

    @property
    def rollout_dtype(self) -> str:
        """The embedded engine's dtype: --engine-dtype, else the trainer's precision's."""
        return self.engine_dtype or PRECISION_DTYPES[self.precision]

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


def _listed(v: Any) -> Any:
    """A flag given comma-separated, repeated, or both, as one list of its names."""
    if isinstance(v, str):
        v = [v]
    if isinstance(v, list):
        v = [t.strip() for item in v for t in str(item).split(",") if t.strip()]
    return v
