"""The two-sided IS mask and the loss normalisation against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.trainer.config import LossConfig
from envhub.trainer.loss import is_masked_loss


def test_ratios_outside_the_band_are_masked_entirely() -> None:
    ratios = [0.5, 0.85, 1.0, 1.25, 1.3, 2.0]
    rollout = torch.tensor([-1.0] * 6)
    logprobs = (rollout + torch.log(torch.tensor(ratios))).requires_grad_()
    adv = torch.tensor([1.0, 2.0, -1.0, 0.5, 3.0, 1.0])
    cfg = LossConfig(eps_low=0.2, eps_high=0.28)
    # band [0.8, 1.28]: keep 0.85, 1.0, 1.25; mask 0.5, 1.3, 2.0
    loss, sums = is_masked_loss(logprobs, rollout, adv, normalizer=10.0, config=cfg)
    expected = -(0.85 * 2.0 + 1.0 * -1.0 + 1.25 * 0.5) / 10.0  # masked tokens still count in N
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # d/d logp of -A r / N = -A r / N on kept tokens, exactly 0 on masked ones
    want = [0.0, -0.85 * 2.0 / 10, 1.0 / 10, -1.25 * 0.5 / 10, 0.0, 0.0]
    assert logprobs.grad.tolist() == pytest.approx(want, rel=1e-5, abs=1e-9)
    m = sums.metrics()
    assert m["is/masked_fraction"] == pytest.approx(0.5)
    assert m["is/ratio_min"] == pytest.approx(0.5) and m["is/ratio_max"] == pytest.approx(2.0)
    assert m["is/ratio_mean"] == pytest.approx(sum(ratios) / 6, rel=1e-6)
    k1 = sum(-math.log(r) for r in ratios) / 6
    k3 = sum(r - 1 - math.log(r) for r in ratios) / 6
    assert m["kl/rollout_train_k1"] == pytest.approx(k1, rel=1e-5)
    assert m["kl/rollout_train_k3"] == pytest.approx(k3, rel=1e-5)


def test_ratio_std_of_near_one_ratios_over_many_micro_batches() -> None:
    # What a trainer sees when the engine samples the current weights: log-ratios of ~1e-5
    # over tens of thousands of tokens, summed over micro-batches. The reference std is
    # computed in float64 from the same log-ratios.
    from envhub.trainer.loss import LossSums

    gen = torch.Generator().manual_seed(0)
    total, chunks = LossSums(), []
    for _ in range(8):
        log_ratio = (torch.randn(4096, generator=gen) * 1e-5).float()
        rollout = torch.full((4096,), -2.0)
        _, sums = is_masked_loss(rollout + log_ratio, rollout, torch.zeros(4096), 1.0,
                                 LossConfig())
        total.add(sums)
        chunks.append(torch.exp((rollout + log_ratio).double() - rollout.double()))
    r = torch.cat(chunks)
    m = total.metrics()
    assert m["is/ratio_std"] == pytest.approx(float(r.std(correction=0)), rel=1e-3)
    assert m["is/ratio_mean"] == pytest.approx(float(r.mean()), abs=1e-9)


def test_kl_to_reference_adds_k3() -> None:
    logprobs = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -2.0])
    cfg = LossConfig(kl_coef=0.1)
    loss, sums = is_masked_loss(logprobs, logprobs.detach(), torch.zeros(2), 2.0, cfg,
                                ref_logprobs=ref)
    q = -0.5
    assert loss.item() == pytest.approx(0.1 * (math.exp(q) - q - 1) / 2.0, rel=1e-6)
    assert sums.metrics()["kl/ref_k3"] == pytest.approx((math.exp(q) - q - 1) / 2, rel=1e-6)


def test_config_rejects_an_empty_band() -> None:
    with pytest.raises(ValueError):
        LossConfig(eps_low=1.5)
