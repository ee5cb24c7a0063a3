"""Policy-gradient objectives against the rollout policy, how they aggregate, and rollout
corrections (trainer/README.md has the table with each one's paper and flag).

Per target token t of sequence i (a segment: loss mask 1), with advantage A_t and the ratio
r_t = exp(log pi_theta(t) - log pi_b(t)) to the behaviour policy pi_b:
  - pi_b is the rollout policy: the logprobs the engine recorded while sampling (no old-policy
    recompute). With a rollout correction (below), pi_b is the trainer's own policy at the step
    (sg(pi_theta): one optimizer step per batch, so it is the proximal policy) and the
    mismatch to the rollout policy is corrected by a weight instead.

Losses (`LossConfig.name`; l_t is the per-token loss before aggregation):
  is_mask   (default; GLM-5's two-sided token mask, no clipping)
            keep_t = 1[1 - eps_low <= r_t <= 1 + eps_high],  l_t = -keep_t A_t r_t
  ppo_clip  (PPO, Schulman et al. 2017; asymmetric clip-higher as DAPO, Yu et al. 2025)
            l_t = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
  gspo      (GSPO-token, Zheng et al. 2025, eq. 7-8): s_i = exp(mean_{t in i} log r_t),
            s_{i,t} = sg(s_i) pi_theta(t) / sg(pi_theta(t)),
            l_t = -min(s_{i,t} A_t, clip(s_{i,t}, 1 - seq_eps_low, 1 + seq_eps_high) A_t)
            (with A constant over a sequence, exactly GSPO's sequence objective)
  cispo     (CISPO, MiniMax-M1 2025, eq. 4): w_t = sg(clip(r_t, 1 - eps_low, 1 + eps_high)),
            l_t = -w_t A_t log pi_theta(t)   (no token dropped: every gradient is kept)
  module:fn a plug-in: fn(LossInputs) -> per-token loss [M] (see `LossInputs`)

Aggregation (`LossConfig.agg`): the step loss is sum_t c_t l_t with
  token_mean  c_t = 1 / N          N: loss tokens of the whole step (all micro-batches, all
                                   ranks), masked-out tokens included; today's default
  seq_mean    c_t = 1 / (S L_i)    S: sequences of the step, L_i: loss tokens of sequence i
                                   (sequence-mean, then the mean over sequences)
  constant    c_t = 1 / (S C)      Dr.GRPO's constant normaliser (Liu et al. 2025), C =
                                   `agg_constant` (a generation budget)
Every c_t is computed from step-wide counts before the first forward, so the loss is the same
however tokens are split into trees, micro-batches or ranks.

Rollout corrections (`LossConfig.correction`), rho_t = sg(pi_theta(t)) / pi_rollout(t),
rho_i = prod_{t in i} rho_t, cap C = `correction_cap` (Yao et al. 2025, TIS; Liu et al. 2025,
"When speed kills stability", MIS); the weight w multiplies l_t:
  token_truncate     w_t = min(rho_t, C)
  token_mask         w_t = rho_t 1[rho_t <= C]
  sequence_truncate  w_t = min(rho_i, C)
  sequence_mask      w_t = rho_i 1[rho_i <= C]
A reference-model penalty adds kl_coef k3_t = kl_coef (exp(q_t) - q_t - 1), q_t = log
pi_ref(t) - log pi_theta(t), aggregated with the same c_t.

`LossSums` carries sums (not means) so micro-batches and ranks add up before dividing.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envhub.trainer.config import BUILTIN_LOSSES, LossConfig

if TYPE_CHECKING:
    import torch


@dataclass
class LossInputs:
    """What a loss sees of one forward's M target tokens ([M] tensors, fp32).

    `logprobs` is differentiable; `behaviour` is log pi_b (the rollout logprobs, or the
    detached `logprobs` under a rollout correction); `seq` (int64) says which of the
    forward's `n_seqs` sequences each token belongs to: every token of a sequence is in one
    forward, so per-sequence reductions (`seq_mean_of`) are exact. A plug-in returns the
    per-token loss l_t, [M]; aggregation and corrections are applied to it."""

    logprobs: torch.Tensor
    behaviour: torch.Tensor
    advantages: torch.Tensor
    seq: torch.Tensor
    n_seqs: int
    config: LossConfig

    def seq_mean_of(self, values: torch.Tensor) -> torch.Tensor:
        """Per token, the mean of `values` over the tokens of its sequence ([M])."""
        import torch

        sums = torch.zeros(self.n_seqs, dtype=values.dtype, device=values.device)
        counts = torch.zeros(self.n_seqs, dtype=values.dtype, device=values.device)
        sums = sums.index_add(0, self.seq, values)
        counts = counts.index_add(0, self.seq, torch.ones_like(values))
        return (sums / counts.clamp(min=1.0))[self.seq]


# A built-in loss: (per-token loss, keep) where keep is 1 where the token's gradient is kept
LossFn = Callable[[LossInputs], "tuple[torch.Tensor, torch.Tensor]"]


def _is_mask(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    c = x.config
    ratio = torch.exp(x.logprobs - x.behaviour)
    with torch.no_grad():
        keep = ((ratio >= 1.0 - c.eps_low) & (ratio <= 1.0 + c.eps_high)).to(ratio.dtype)
    return -(keep * x.advantages * ratio), keep


def _clipped(ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """-min(ratio A, clip(ratio) A) and where the unclipped branch (with its gradient) wins."""
    import torch

    plain = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - low, 1.0 + high) * adv
    with torch.no_grad():
        keep = (plain <= clipped).to(ratio.dtype)  # min picks the gradient-carrying branch
    return -torch.minimum(plain, clipped), keep


def _ppo_clip(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    return _clipped(torch.exp(x.logprobs - x.behaviour), x.advantages, x.config.eps_low,
                    x.config.eps_high)


def _gspo(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    log_s = x.seq_mean_of(x.logprobs - x.behaviour)  # log s_i, per token (with its gradient)
    s_token = torch.exp(log_s.detach() + x.logprobs - x.logprobs.detach())
    return _clipped(s_token, x.advantages, x.config.seq_eps_low, x.config.seq_eps_high)


def _cispo(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    c = x.config
    with torch.no_grad():
        w = torch.clamp(torch.exp(x.logprobs - x.behaviour), 1.0 - c.eps_low, 1.0 + c.eps_high)
    return -(w * x.advantages * x.logprobs), torch.ones_like(w)


LOSSES: dict[str, LossFn] = {"is_mask": _is_mask, "ppo_clip": _ppo_clip, "gspo": _gspo,
                             "cispo": _cispo}
assert set(LOSSES) == set(BUILTIN_LOSSES)


class BadLoss(ValueError):
    """A loss named by dotted path that cannot be used; the message says what to fix."""


def resolve_loss(name: str) -> LossFn:
    """The built-in `name`, or the plug-in `module:function` wrapped to the built-ins' shape,
    checked on a small input (a clear `BadLoss` before any step, never a failed step)."""
    if name in LOSSES:
        return LOSSES[name]
    module, _, attr = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise BadLoss(f"--loss {name}: cannot import {attr!r} from {module!r} ({e}); give a "
                      f"built-in ({', '.join(LOSSES)}) or module:function on the PYTHONPATH"
                      ) from None
    if not callable(fn):
        raise BadLoss(f"--loss {name}: {attr} is not a function")
    try:
        inspect.signature(fn).bind(object())
    except TypeError:
        raise BadLoss(f"--loss {name}: a loss takes one argument, the LossInputs of a forward "
                      f"(trainer/README.md); {attr}{inspect.signature(fn)} does not") from None
    except ValueError:  # no signature to read (a builtin): the probe below decides
        pass

    def plugin(x: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        out = fn(x)
        if not isinstance(out, torch.Tensor) or out.shape != x.logprobs.shape:
            shape = getattr(out, "shape", type(out).__name__)
            raise BadLoss(f"--loss {name}: returned {shape}, not a per-token loss of shape "
                          f"{tuple(x.logprobs.shape)}")
        return out, torch.ones_like(x.logprobs.detach())

    _probe(name, plugin)
    return plugin


def _probe(name: str, fn: LossFn) -> None:
    """Run a plug-in on 4 made-up tokens of 2 sequences: finite and differentiable, or a
    `BadLoss` saying which."""
    import torch

    logprobs = torch.tensor([-1.0, -0.5, -2.0, -0.1], requires_grad=True)
    x = LossInputs(logprobs, torch.tensor([-1.1, -0.4, -2.0, -0.2]),
                   torch.tensor([1.0, 1.0, -1.0, -1.0]), torch.tensor([0, 0, 1, 1]), 2,
                   LossConfig())
    try:
        per_token, _ = fn(x)
    except BadLoss:
        raise
    except Exception as e:  # noqa: BLE001 - the plug-in's own bug, reported as such
        raise BadLoss(f"--loss {name}: raised on a test input: {type(e).__name__}: {e}"
                      ) from None
    if not bool(torch.isfinite(per_token).all()):
        raise BadLoss(f"--loss {name}: not finite on a test input ({per_token.tolist()})")
    if not per_token.requires_grad:
        raise BadLoss(f"--loss {name}: has no gradient with respect to x.logprobs")


def correction_weights(logprobs: torch.Tensor, rollout_logprobs: torch.Tensor,
                       seq: torch.Tensor, n_seqs: int, config: LossConfig
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(w_t, cut_t) of the configured rollout correction (module docstring), detached; cut_t
    is 1 where the cap truncated or masked the token's weight. (None, None) without one."""
    import torch

    kind = config.correction
    if kind == "none":
        return None, None
    cap = config.correction_cap
    with torch.no_grad():
        log_rho = logprobs.detach() - rollout_logprobs
        if kind.startswith("sequence"):
            sums = torch.zeros(n_seqs, dtype=log_rho.dtype, device=log_rho.device)
            log_rho = sums.index_add(0, seq, log_rho)[seq]  # log rho_i, per token
        over = log_rho > math.log(cap)
        if kind.endswith("truncate"):
            w = torch.exp(torch.clamp(log_rho, max=math.log(cap)))
        else:
            w = torch.where(over, torch.zeros_like(log_rho), torch.exp(log_rho))
    return w, over.to(w.dtype)


def policy_loss(logprobs: torch.Tensor, rollout_logprobs: torch.Tensor,
                advantages: torch.Tensor, seq: torch.Tensor, n_seqs: int,
                coef: torch.Tensor, config: LossConfig, *, fn: LossFn | None = None,
                entropy: torch.Tensor | None = None,
                ref_logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, LossSums]:
    """This forward's share of the step loss, sum_t c_t w_t l_t (+ the KL term), over M
    target tokens ([M] each; `coef` holds c_t, `seq` each token's sequence among `n_seqs`)."""
    import torch

    fn = fn or resolve_loss(config.name)
    w, cut = correction_weights(logprobs, rollout_logprobs, seq, n_seqs, config)
    behaviour = rollout_logprobs if w is None else logprobs.detach()
    per_token, keep = fn(LossInputs(logprobs, behaviour, advantages, seq, n_seqs, config))
    pg = per_token if w is None else per_token * w
    total = (coef * pg).sum()
    ref_kl = torch.zeros(())
    if ref_logprobs is not None and config.kl_coef > 0:
        q = ref_logprobs - logprobs
        k3 = torch.exp(q) - q - 1.0
        total = total + config.kl_coef * (coef * k3).sum()
        ref_kl = k3.detach().sum()
    with torch.no_grad():
        lr = (logprobs - rollout_logprobs).detach()
        r = torch.exp(lr)
        d = torch.expm1(lr.double())  # r - 1 without cancellation
        sums = LossSums(
            tokens=float(r.numel()), kept=float(keep.sum()), ratio_dev=float(d.sum()),
            ratio_dev_sq=float((d * d).sum()),
            ratio_min=float(r.min()) if r.numel() else float("inf"),
            ratio_max=float(r.max()) if r.numel() else float("-inf"),
            entropy=float(entropy.sum()) if entropy is not None else 0.0,
            kl_k1=float((-lr).sum()), kl_k3=float((r - 1.0 - lr).sum()),
            ref_kl=float(ref_kl), pg_loss=float(pg.detach().sum()),
            corr_weight=float(w.sum()) if w is not None else 0.0,
            corr_cut=float(cut.sum()) if cut is not None else 0.0)
    return total, sums


def is_masked_loss(logprobs: torch.Tensor, rollout_logprobs: torch.Tensor,
                   advantages: torch.Tensor, normalizer: float, config: LossConfig, *,
                   entropy: torch.Tensor | None = None,
                   ref_logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, LossSums]:
    """The configured loss over M tokens of one sequence, token-mean over `normalizer`."""
    import torch

    coef = torch.full_like(logprobs.detach(), 1.0 / max(normalizer, 1.0))
    seq = torch.zeros(logprobs.shape[0], dtype=torch.int64)
    return policy_loss(logprobs, rollout_logprobs, advantages, seq, 1, coef, config,
                       entropy=entropy, ref_logprobs=ref_logprobs)


@dataclass
class LossSums:
    """Additive statistics of one or more micro-batches (see `metrics`)."""

    tokens: float = 0.0
    kept: float = 0.0  # tokens whose gradient the loss kept (not masked, not clipped)
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
    corr_weight: float = 0.0  # sum of the rollout correction's weights
    corr_cut: float = 0.0  # tokens whose correction weight the cap truncated or masked
    extra: dict[str, float] = field(default_factory=dict)

    def add(self, other: LossSums) -> None:
        for name in ADDITIVE:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.ratio_min = min(self.ratio_min, other.ratio_min)
        self.ratio_max = max(self.ratio_max, other.ratio_max)

    def metrics(self, correction: str = "none") -> dict[str, Any]:
        n = max(self.tokens, 1.0)
        dev = self.ratio_dev / n
        out = {
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
        if correction != "none":
            out["correction/weight_mean"] = self.corr_weight / n
            out["correction/cut_fraction"] = self.corr_cut / n if self.tokens else 0.0
        return out


# the fields that add up over micro-batches and data-parallel ranks
ADDITIVE = ("tokens", "kept", "ratio_dev", "ratio_dev_sq", "entropy", "kl_k1", "kl_k3", "ref_kl",
            "pg_loss", "corr_weight", "corr_cut")


def token_coefficients(loss_tokens: list[int], n_tokens: float, n_seqs: float,
                       config: LossConfig) -> list[float]:
    """c for each sequence of a forward (the same for all its tokens), from its loss-token
    count and the step's totals (module docstring)."""
    if config.agg == "token_mean":
        return [1.0 / max(n_tokens, 1.0)] * len(loss_tokens)
    if config.agg == "seq_mean":
        return [1.0 / (max(n_seqs, 1.0) * max(n, 1)) for n in loss_tokens]
    return [1.0 / (max(n_seqs, 1.0) * config.agg_constant)] * len(loss_tokens)
