"""Plug-in losses for the tests (`--loss tests.trainer.plugin_losses:NAME`): one that works
and each way one can be wrong."""

from __future__ import annotations

import torch

from envhub.trainer.loss import LossInputs


def vanilla_pg(x: LossInputs) -> torch.Tensor:
    """REINFORCE with the rollout ratio: -A_t r_t, nothing masked or clipped."""
    return -x.advantages * torch.exp(x.logprobs - x.behaviour)


def two_arguments(x: LossInputs, y: int) -> torch.Tensor:
    return -x.advantages * x.logprobs * y


def not_finite(x: LossInputs) -> torch.Tensor:
    return x.logprobs * float("nan")


def wrong_shape(x: LossInputs) -> torch.Tensor:
    return (-x.advantages * x.logprobs).sum()


def no_gradient(x: LossInputs) -> torch.Tensor:
    return -x.advantages * x.behaviour


def raises(x: LossInputs) -> torch.Tensor:
    raise RuntimeError("a bug in the plug-in")
