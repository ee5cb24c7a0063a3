"""IS-masked policy-gradient loss with the rollout policy as behaviour policy (item 4).

Per target token t (loss mask 1), with r_t = exp(log pi_theta(t) - log pi_rollout(t)) from
the logprobs the engine recorded while sampling (no old-policy recompute):
    keep_t = 1 if 1 - eps_low <= r_t <= 1 + eps_high else 0   (two-sided mask, no clipping:
             a token outside the band contributes neither loss nor gradient)
    l_t    = -keep_t * A_t * r_t  +  kl_coef * k3_t,   k3_t = exp(q_t) - q_t - 1,
             q_t = log pi_ref(t) - log pi_theta(t)      (only with a reference model)
The step loss is  sum_t l_t / N,  N = number of loss-mask tokens in the whole step (all
micro-batches, all data-parallel ranks), masked-out tokens included in N. This is the
token-mean of the naive batch, independent of how tokens are split into trees or ranks.

`LossSums` carries sums (not means) so micro-batches and ranks add up before dividing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from envhub.trainer.config import LossConfig

if TYPE_CHECKING:
    import torch


@dataclass
class LossSums:
    """Additive statistics of one or more micro-batches (see `metrics`)."""

    tokens: float = 0.0
    kept: float = 0.0
    # sums of d = r - 1 and d^2, in float64 from expm1(log r): ratios sit within ~1e-5 of 1,
    # where fp32 sums of r and r^2 would cancel to noise (E[r^2] - E[r]^2 read 2.5e-4 on ratios
    # all within [0.99997, 1.00001]); shifting by 1 keeps the variance exact and additive.
    ratio_dev: float = 0.0
    ratio_dev_sq: float = 0.0
    ratio_min: float = float("inf")
    ratio_max: float = float("-inf")
    entropy: float = 0.0
    kl_k1: float = 0.0  # sum of log pi_rollout - log pi_theta  (KL(rollout || train), k1)
    kl_k3: float = 0.0  # sum of r - 1 - log r                  (KL(rollout || train), k3)
    ref_kl: float = 0.0  # sum of k3 to the reference
    pg_loss: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def add(self, other: LossSums) -> None:
        for name in ADDITIVE:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.ratio_min = min(self.ratio_min, other.ratio_min)
        self.ratio_max = max(self.ratio_max, other.ratio_max)

    def metrics(self) -> dict[str, float]:
        n = max(self.tokens, 1.0)
        dev = self.ratio_dev / n
        return {
            "loss/tokens": self.tokens,
            "loss/pg": self.pg_loss / n,
            "is/masked_fraction": 1.0 - self.kept / n if self.tokens else 0.0,
            "is/ratio_mean": 1.0 + dev,
            "is/ratio_std": max(self.ratio_dev_sq / n - dev * dev, 0.0) ** 0.5,
            "is/ratio_min": self.ratio_min if self.tokens else 0.0,
            "is/ratio_max": self.ratio_max if self.tokens else 0.0,
            "policy/entropy": self.entropy / n,
            "kl/rollout_train_k1": self.kl_k1 / n,
            "kl/rollout_train_k3": self.kl_k3 / n,
            "kl/ref_k3": self.ref_kl / n,
        }


# the fields that add up over micro-batches and data-parallel ranks
ADDITIVE = ("tokens", "kept", "ratio_dev", "ratio_dev_sq", "entropy", "kl_k1", "kl_k3", "ref_kl",
            "pg_loss")


def is_masked_loss(logprobs: torch.Tensor, rollout_logprobs: torch.Tensor,
                   advantages: torch.Tensor, normalizer: float, config: LossConfig, *,
                   entropy: torch.Tensor | None = None,
                   ref_logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, LossSums]:
    """Loss contribution of M target tokens (all [M]) divided by the step's `normalizer`."""
    import torch

    log_ratio = logprobs - rollout_logprobs
    ratio = torch.exp(log_ratio)
    with torch.no_grad():
        keep = ((ratio >= 1.0 - config.eps_low) & (ratio <= 1.0 + config.eps_high)).to(ratio.dtype)
    pg = -(keep * advantages * ratio)
    total = pg.sum()
    ref_kl = torch.zeros(())
    if ref_logprobs is not None and config.kl_coef > 0:
        q = ref_logprobs - logprobs
        k3 = torch.exp(q) - q - 1.0
        total = total + config.kl_coef * k3.sum()
        ref_kl = k3.detach().sum()
    with torch.no_grad():
        r, lr = ratio.detach(), log_ratio.detach()
        d = torch.expm1(lr.double())  # r - 1 without cancellation
        sums = LossSums(
            tokens=float(r.numel()), kept=float(keep.sum()), ratio_dev=float(d.sum()),
            ratio_dev_sq=float((d * d).sum()),
            ratio_min=float(r.min()) if r.numel() else float("inf"),
            ratio_max=float(r.max()) if r.numel() else float("-inf"),
            entropy=float(entropy.sum()) if entropy is not None else 0.0,
            kl_k1=float((-lr).sum()), kl_k3=float((r - 1.0 - lr).sum()),
            ref_kl=float(ref_kl), pg_loss=float(pg.detach().sum()))
    return total / max(normalizer, 1.0), sums
