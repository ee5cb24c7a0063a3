"""Recipe: one verl policy update on an envhub export (`envhub export --format verl`).

verl 0.9 runs its actor inside a Ray `TrainingWorker` with an FSDP/Megatron engine; its policy
math is `verl.trainer.ppo.core_algos` (the registered policy losses and `agg_loss`), configured
by `verl.workers.config.ActorConfig`. This recipe feeds an export, loaded as a `DataProto`, to
that math with a plain Hugging Face model on one process (CPU or GPU), so a verl user sees the
fields line up before wiring the export into a verl run:

    data = load_dataproto("verl.parquet")                      # DataProto.from_dict(*read_verl(.))
    config = actor_config()                                    # verl's FSDPActorConfig
    metrics = actor_step(model, optimizer, data, config)       # verl's policy loss, one step

or `python -m envhub.trainer.recipe_verl verl.parquet --model MODEL_DIR`. `old_log_probs` are
the rollout's (bypass mode: no recompute), `advantages` are envhub's per-token values.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch


def actor_config(**overrides: Any) -> Any:
    """verl's actor config with the defaults of its PPO trainer (vanilla clipped loss,
    token-mean) for one single-process mini-batch."""
    from verl.workers.config import FSDPActorConfig

    fields = {"strategy": "fsdp", "ppo_mini_batch_size": 1, "ppo_micro_batch_size_per_gpu": 1,
              "use_dynamic_bsz": False, "rollout_n": 1}
    return FSDPActorConfig(**{**fields, **overrides})


def response_log_probs(model: Any, data: Any) -> torch.Tensor:
    """log pi(response token) under `model`, (B, R): logits at position t score token t+1, so
    the R response tokens are scored by positions P-1 .. P+R-2 (P = padded prompt length)."""
    batch = data.batch
    n_prompt, n_response = batch["prompts"].shape[1], batch["responses"].shape[1]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits  # (B, P+R, V)
    logits = logits[:, n_prompt - 1:n_prompt + n_response - 1].float()  # (B, R, V)
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def actor_step(model: Any, optimizer: torch.optim.Optimizer, data: Any, config: Any
               ) -> dict[str, float]:
    """One optimizer step on the whole `data` with verl's policy loss and its grad clip."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    model.train()
    batch = data.batch
    log_prob = response_log_probs(model, data)
    loss_fn = get_policy_loss_fn(config.policy_loss.get("loss_mode", "vanilla"))
    pg_loss, metrics = loss_fn(
        old_log_prob=batch["old_log_probs"], log_prob=log_prob, advantages=batch["advantages"],
        response_mask=batch["response_mask"].bool(), loss_agg_mode=config.loss_agg_mode,
        config=config)
    optimizer.zero_grad()
    pg_loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return {**metrics, "actor/pg_loss": pg_loss.item(), "actor/grad_norm": grad_norm.item()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from envhub.trainer.errors import TrainerError
    from envhub.trainer.export_verl import load_dataproto

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", help="a `envhub export --format verl` Parquet file")
    parser.add_argument("--model", required=True, help="HF model folder the rollouts sampled")
    parser.add_argument("--lr", type=float, default=1e-5)
    args = parser.parse_args(argv)
    try:
        data = load_dataproto(args.export)
    except (TrainerError, OSError) as exc:  # not an export, empty, unreadable: say so
        parser.error(str(exc))
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    metrics = actor_step(model, optimizer, data, actor_config())
    print(json.dumps(metrics))
    return metrics


if __name__ == "__main__":
    main()
