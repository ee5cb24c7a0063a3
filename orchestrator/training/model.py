"""The trainer `envhub train` trains: the model and tokenizer of the gateway's model folder,
wrapped in a `Trainer` configured from the loop's options."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from envhub.gateway.config import GatewayConfig
    from envhub.orchestrator.training.config import TrainLoopConfig
    from envhub.orchestrator.training.tasks import EnvTasks
    from envhub.trainer.distributed import DataParallel
    from envhub.trainer.trainer import Trainer


def build_trainer(cfg: TrainLoopConfig, gw_config: GatewayConfig, envs: list[EnvTasks],
                  dp: DataParallel | None) -> Trainer:
    """The policy the gateway serves (fp32 master weights), its optimizer, filters and
    advantages; FSDP2-sharded over `dp`'s ranks when given."""
    import torch
    from huggingface_hub.utils import disable_progress_bars
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from envhub.trainer.config import (
        AdvantageConfig,
        FilterConfig,
        LoraSettings,
        LossConfig,
        OptimConfig,
        TrainerConfig,
    )
    from envhub.trainer.trainer import Trainer

    disable_progress_bars()
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(gw_config.model_path()),
                                                 dtype=torch.float32)
    # Saved beside each pushed version: OUT/weights/vN is then a model folder `envhub run
    # --model` and the gateway can serve as it is (tokenizer and chat template included).
    tokenizer = AutoTokenizer.from_pretrained(str(gw_config.tokenizer_path()))
    lora = None
    if cfg.lora_rank is not None:
        lora = LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_alpha or 2 * cfg.lora_rank,
                            targets=cfg.lora_targets or "all-linear")
    config = TrainerConfig(
        optim=OptimConfig(lr=cfg.lr, reset_optimizer_on_sync=cfg.resets_optimizer),
        advantages=AdvantageConfig(
            estimator=cfg.advantage, normalize_std=cfg.std_norm, truncated=cfg.truncated,
            overlong_penalty=cfg.overlong_penalty, env_reward_weights={
                e.name: e.reward_weights for e in envs}),  # the manifests', never an event's
        loss=LossConfig(name=cfg.loss, agg=cfg.loss_agg, agg_constant=cfg.loss_agg_constant,
                        eps_low=cfg.eps_low, eps_high=cfg.eps_high, correction=cfg.correction,
                        correction_cap=cfg.correction_cap),
        filters=FilterConfig(tau=cfg.tau, group_size=cfg.k, drop_no_signal=True,
                             chains=cfg.chains),
        gradient_checkpointing=cfg.gradient_checkpointing, precision=cfg.precision, lora=lora,
        device=cfg.device)
    return Trainer(model, config, data_parallel=dp, tokenizer=tokenizer)


def placement(cfg: TrainLoopConfig, trainer_device: torch.device) -> dict[str, str]:
    """Where and in what dtype each side computes, for the start line and every step's row:
    when the two dtypes differ, the recorded (rollout) and recomputed (trainer) logprobs
    differ by that much more (is/ratio_*, kl/rollout_train_* in the row)."""
    from envhub.orchestrator.training.config import PRECISION_DTYPES
    from envhub.sdk.device import auto_dtype, resolve_device

    if cfg.engine == "vllm":
        rollout_device, rollout_dtype = "vllm", "vllm"  # the server's own --dtype
    else:
        device = resolve_device(cfg.rollout_device)
        rollout_device, rollout_dtype = str(device), auto_dtype(cfg.rollout_dtype, device.type)
    return {"train_device": str(trainer_device), "train_dtype": PRECISION_DTYPES[cfg.precision],
            "rollout_device": rollout_device, "rollout_dtype": rollout_dtype}
