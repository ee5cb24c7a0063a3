"""Trainer configuration (pydantic). CLI flags map 1:1 onto these fields."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from envhub.sdk.device import DEVICES, check_device

# `--dtype` spellings of a precision (the engine's names), so one value fits both flags.
PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bf16", "fp32": "fp32", "bf16": "bf16"}


class FilterConfig(BaseModel):
    """Which samples and groups reach the loss (issue 7, item 2)."""

    tau: int | None = Field(
        default=None, ge=0,
        description="Staleness bound: drop a sample when trainer_version - w0 > tau, w0 being "
        "the oldest weight version among its sampled tokens. None disables the cut.")
    group_size: int | None = Field(
        default=None, ge=1,
        description="Expected samples per group; None means the number of sessions listed.")
    drop_no_signal: bool = Field(
        default=False, description="Drop a group whose every token advantage is 0 (all "
        "samples scored alike and no turn-level reward): it has no policy gradient, and "
        "keeping it only dilutes the token normalisation (DAPO's dynamic-sampling filter). "
        "Counted as drop_groups/no_signal; a step left with nothing skips the optimizer.")
    chains: Literal["all", "main"] = Field(
        default="all", description="Which conversations of a session to train on: 'all', or "
        "'main' (the chain with the most turns; a CLI's side calls such as title requests and "
        "sub-agents are other chains, see gateway/history.py).")
    exclude_env_failures: bool = Field(
        default=True, description="Drop sessions whose status is env_failure (infrastructure, "
        "not the policy, failed; a reward of 0 would bias the group baseline).")


class AdvantageConfig(BaseModel):
    """Group advantages (GRPO, RLOO, REINFORCE++) plus per-turn reward-to-go
    (trainer/advantages.py)."""

    estimator: Literal["grpo", "rloo", "reinforce_pp"] = Field(
        default="grpo", description="grpo: (R - group mean) / group std; rloo: R minus the "
        "mean of the group's other samples; reinforce_pp: R (minus the group mean with "
        "group_baseline), then normalised over the whole batch's loss tokens.")
    group_baseline: bool = Field(default=True, description="reinforce_pp: subtract the group "
                                 "mean first (REINFORCE++-baseline); off: no baseline.")
    normalize_std: bool = Field(default=True, description="grpo: divide by the group's reward "
                                "std (off: Dr.GRPO); reinforce_pp: by the batch's std.")
    eps: float = Field(default=1e-6, gt=0, description="Added to the std before dividing.")
    reward_weights: dict[str, float] = Field(
        default_factory=dict,
        description="The composite's weights: a manifest's [rewards] table (key -> weight, as "
        "`Manifest.reward_weights()`; a key it does not list weighs 0), for sessions whose "
        "environment is not in `env_reward_weights`. Empty: 1.0 for every kind. An event's own "
        "`weight` is never used (whoever wrote the event could have set it to anything).")
    env_reward_weights: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Per environment name (a session's `env`): its manifest's [rewards] table. "
        "`envhub train` fills it from the environments it trains on.")
    truncated: Literal["keep", "mask", "penalty"] = Field(
        default="keep", description="Samples cut by the length limit (their last turn ended "
        "with finish_reason 'length'): keep as any other; mask (DAPO's overlong filtering: "
        "no token of theirs is trained, their reward still counts in the group's baseline, "
        "counted as truncated/masked); penalty (overlong_penalty subtracted from their "
        "composite reward, counted as truncated/penalised).")
    overlong_penalty: float = Field(default=1.0, ge=0, description="truncated=penalty: what "
                                    "a truncated sample's composite reward loses.")
    turn_coef: float = Field(
        default=1.0, description="1: each turn's tokens are credited with the rewards from that "
        "turn on (reward-to-go); 0: every token gets the whole sample's reward (plain GRPO).")


BUILTIN_LOSSES = ("is_mask", "ppo_clip", "gspo", "cispo")
Correction = Literal["none", "token_truncate", "token_mask", "sequence_truncate",
                     "sequence_mask"]


class LossConfig(BaseModel):
    """The policy-gradient objective against the rollout policy, its aggregation and rollout
    correction (formulas in trainer/loss.py and trainer/README.md)."""

    name: str = Field(
        default="is_mask", description="is_mask (two-sided token mask, the default), ppo_clip, "
        "gspo, cispo, or a plug-in as module:function (fn(LossInputs) -> per-token loss).")
    eps_low: float = Field(default=0.2, ge=0, lt=1,
                           description="Lower band/clip 1 - eps_low of the token ratio "
                           "(is_mask: masked beyond it; ppo_clip, cispo: clipped).")
    eps_high: float = Field(default=0.28, ge=0,
                            description="Upper band/clip 1 + eps_high of the token ratio.")
    seq_eps_low: float = Field(default=3e-4, ge=0, lt=1,
                               description="gspo: lower clip of the sequence ratio (the "
                               "paper's 3e-4).")
    seq_eps_high: float = Field(default=4e-4, ge=0,
                                description="gspo: upper clip of the sequence ratio (4e-4).")
    agg: Literal["token_mean", "seq_mean", "constant"] = Field(
        default="token_mean", description="token_mean over the step's loss tokens; seq_mean "
        "(each sequence's token mean, then the mean over sequences); constant: sum over "
        "tokens / (sequences x agg_constant), Dr.GRPO's normaliser.")
    agg_constant: float = Field(default=4096.0, gt=0, description="constant aggregation: "
                                "the per-sequence token budget C.")
    correction: Correction = Field(
        default="none", description="Rollout correction for engine/trainer logprob mismatch: "
        "token_truncate (TIS), token_mask (MIS), sequence_truncate, sequence_mask; the loss's "
        "ratio is then taken against the trainer's own policy at the step.")
    correction_cap: float = Field(default=2.0, ge=1.0, description="The cap C of the "
                                  "correction's importance weight.")
    kl_coef: float = Field(default=0.0, ge=0, description="Weight of the k3 KL(train || "
                           "reference) penalty; needs a reference model when > 0.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_loss_name(v)


def check_loss_name(v: str) -> str:
    """A built-in loss's name or a `module:function` spelling (not imported here)."""
    module, sep, attr = v.partition(":")
    if v in BUILTIN_LOSSES or (sep and module and attr.isidentifier()
                               and all(p.isidentifier() for p in module.split("."))):
        return v
    raise ValueError(f"{v!r}: a loss is one of {', '.join(BUILTIN_LOSSES)} or a plug-in "
                     "module:function (e.g. mypkg.losses:my_loss)")


class OptimConfig(BaseModel):
    """AdamW, clipping and what happens at a weight sync (issue 7, item 6)."""

    lr: float = Field(default=1e-6, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(default=0.0, ge=0)
    adam_eps: float = Field(default=1e-8, gt=0)
    max_grad_norm: float | None = Field(default=1.0, gt=0,
                                        description="None disables clipping.")
    reset_optimizer_on_sync: bool = Field(
        default=False, description="Clear AdamW moments after each weight sync.")


class LoraSettings(BaseModel):
    """LoRA adapters through PEFT: only the adapters train; pushes send merged weights."""

    rank: int = Field(default=16, ge=1, description="LoRA rank r.")
    alpha: int = Field(default=32, ge=1, description="LoRA alpha (scale alpha / r).")
    targets: list[str] | str = Field(
        default="all-linear", description="Module names to adapt (PEFT's target_modules), or "
        "'all-linear' (every linear layer but the LM head).")
    dropout: float = Field(default=0.0, ge=0, lt=1)


class TrainerConfig(BaseModel):
    filters: FilterConfig = Field(default_factory=FilterConfig)
    advantages: AdvantageConfig = Field(default_factory=AdvantageConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    max_tokens_per_forward: int = Field(
        default=8192, ge=1,
        description="Budget of packed (unique) tokens per forward pass; a step is split into "
        "several packed trees beyond it (gradients accumulate, the math is unchanged).")
    tree_attention: Literal["auto", "flex", "blocks", "dense"] = Field(
        default="auto", description="How packed trees attend (trainer/tree_attention.py). "
        "flex: one FlexAttention kernel per layer on a block mask of the tree (CUDA; no "
        "attention dropout). blocks: block-sparse SDPA per 128-query block (cost ~ ancestors "
        "per block; the CPU path). dense: each layer's [N, N] mask through the model's own "
        "eager/SDPA kernel. auto: blocks off CUDA; on CUDA flex (head dim >= 16, no attention "
        "dropout), else dense up to 8192 nodes, else blocks; and on CUDA with prefix_merge it "
        "packs a step unmerged (plain packed sequences) when merging saves under 10% of the "
        "tokens (sequence tokens / tree nodes < 1.1). The step metrics attention/<mode> and "
        "tree/merged say what ran.")
    sparse_attention: bool | None = Field(
        default=None, description="Deprecated spelling of tree_attention (True: 'blocks', "
        "False: 'dense'); when set it wins over tree_attention.")

    @property
    def attention_mode(self) -> str:
        """tree_attention, or what the deprecated sparse_attention asks for."""
        if self.sparse_attention is None:
            return self.tree_attention
        return "blocks" if self.sparse_attention else "dense"
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute each decoder layer's activations in the backward "
        "instead of keeping them (transformers' activation checkpointing, non-reentrant): "
        "less memory for about one more forward of compute. Works with every tree-attention "
        "mode.")
    precision: Literal["fp32", "bf16"] = Field(
        default="fp32", description="bf16: mixed precision with fp32 master weights (FSDP2's "
        "MixedPrecisionPolicy under torchrun, torch.autocast in one process; gradients are "
        "reduced and the optimizer steps in fp32). fp32: compute in the parameters' dtype.")
    device: str | None = Field(
        default=None, description=f"Where the model trains: {DEVICES}. None or auto: this "
        "rank's CUDA device (cuda:LOCAL_RANK) when CUDA is present, else the CPU.")
    lora: LoraSettings | None = Field(
        default=None, description="Train LoRA adapters (PEFT) instead of all weights.")
    prefix_merge: bool = Field(default=True, description="Pack shared prefixes as one tree "
                               "(off: one branch per sequence, for comparison).")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str | None) -> str | None:
        return None if v is None else check_device(v)

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, v: object) -> object:
        return precision_name(v)


def precision_name(value: object) -> object:
    """fp32/bf16, in any case, and float32/bfloat16 (the engine's dtype names) as fp32/bf16;
    a ValueError naming what the trainer computes in for any other string (`auto`, float16)."""
    if not isinstance(value, str):
        return value
    name = PRECISION_NAMES.get(value.strip().lower())
    if name is None:
        raise ValueError(f"{value!r}: the trainer computes in fp32 (float32) or bf16 "
                         "(bfloat16, fp32 master weights); --dtype is --precision's other name")
    return name
