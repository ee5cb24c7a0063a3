"""Each loss, aggregation, rollout correction and advantage estimator against its paper's
equation, transcribed here token by token in plain Python (not the implementation called
twice): the loss value, the gradient's sign and size on every token, and which tokens are
masked or clipped (a zero gradient)."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.trainer.advantages import baselines_and_scale
from envhub.trainer.batch import build_batch
from envhub.trainer.config import AdvantageConfig, LossConfig, TrainerConfig
from envhub.trainer.loss import BadLoss, policy_loss, resolve_loss, token_coefficients
from envhub.trainer.source import Group
from tests.trainer.handmade import trajectory

# Two sequences: tokens 0-2 are sequence 0, tokens 3-4 sequence 1.
SEQ = [0, 0, 0, 1, 1]
ROLLOUT = [-1.0, -0.5, -2.0, -0.7, -1.2]  # log pi_rollout
RATIOS = [0.7, 1.1, 1.5, 0.95, 1.2]  # pi_theta / pi_rollout
ADV = [1.0, -2.0, 0.5, -1.0, 3.0]


def run(config: LossConfig, ratios=RATIOS, adv=ADV, agg_counts=(5.0, 2.0)):
    """(loss, d loss / d log pi_theta per token, sums) of the configured loss."""
    rollout = torch.tensor(ROLLOUT)
    logprobs = (rollout + torch.log(torch.tensor(ratios))).requires_grad_()
    coef = torch.tensor(token_coefficients([3, 2], *agg_counts, config))[torch.tensor(SEQ)]
    loss, sums = policy_loss(logprobs, rollout, torch.tensor(adv), torch.tensor(SEQ), 2, coef,
                             config)
    loss.backward()
    return loss.item(), logprobs.grad.tolist(), sums


def clip(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


def test_ppo_clip_is_the_clipped_surrogate_with_clip_higher() -> None:
    """PPO (Schulman et al. 2017, eq. 7) with DAPO's decoupled eps (Yu et al. 2025, eq. 8):
    J = 1/N sum_t min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t); loss = -J."""
    cfg = LossConfig(name="ppo_clip", eps_low=0.2, eps_high=0.28)
    loss, grad, sums = run(cfg)
    n = 5
    terms = [min(r * a, clip(r, 0.8, 1.28) * a) for r, a in zip(RATIOS, ADV, strict=True)]
    assert loss == pytest.approx(-sum(terms) / n, rel=1e-6)
    # d(-min(rA, clip(r)A))/d log pi = -rA where the unclipped branch is the min, else 0:
    # token 0: r 0.7 < 0.8 with A > 0: min is r A (the pessimistic side), gradient kept;
    # token 2: r 1.5 > 1.28 with A > 0: clipped, 0; token 1: r 1.1 in band, kept (A < 0);
    # token 3: r 0.95, A < 0, in band: kept; token 4: r 1.2, A > 0, in band: kept.
    want = [-RATIOS[0] * ADV[0] / n, -RATIOS[1] * ADV[1] / n, 0.0,
            -RATIOS[3] * ADV[3] / n, -RATIOS[4] * ADV[4] / n]
    assert grad == pytest.approx(want, rel=1e-5, abs=1e-9)
    assert grad[0] < 0 and grad[1] > 0  # descending raises pi where A > 0, lowers it where < 0
    assert sums.metrics()["is/masked_fraction"] == pytest.approx(1 / 5)


def test_ppo_clip_keeps_the_gradient_of_a_negative_advantage_beyond_the_upper_clip() -> None:
    # r 1.5 with A < 0: min(rA, 1.28 A) = rA (more negative), so the gradient flows
    loss, grad, _ = run(LossConfig(name="ppo_clip"), ratios=[1.5] * 5, adv=[-1.0] * 5)
    assert grad == pytest.approx([1.5 / 5] * 5, rel=1e-5)


def test_gspo_clips_whole_sequences_by_their_length_normalised_ratio() -> None:
    """GSPO (Zheng et al. 2025, eq. 5-7): s_i = (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|),
    J = 1/G sum_i min(s_i A_i, clip(s_i, 1 - eps_l, 1 + eps_h) A_i), and
    grad J = 1/G sum_i s_i A_i (1/|y_i|) sum_t grad log pi_theta(y_i,t) where unclipped."""
    cfg = LossConfig(name="gspo", agg="seq_mean", seq_eps_low=0.05, seq_eps_high=0.05)
    ratios = [1.02, 0.99, 1.01, 1.3, 1.25]  # s_0 ~ 1.0066 (in band), s_1 ~ 1.275 (clipped)
    adv = [2.0, 2.0, 2.0, 1.0, 1.0]  # one advantage per sequence, as in the paper
    loss, grad, sums = run(cfg, ratios=ratios, adv=adv)
    s0 = math.prod(ratios[:3]) ** (1 / 3)
    s1 = math.prod(ratios[3:]) ** (1 / 2)
    j = (min(s0 * 2.0, clip(s0, 0.95, 1.05) * 2.0) + min(s1 * 1.0, clip(s1, 0.95, 1.05) * 1.0)) / 2
    assert loss == pytest.approx(-j, rel=1e-6)
    g0 = -s0 * 2.0 * (1 / 3) / 2  # d(-J)/d log pi_t for each token of sequence 0
    assert grad == pytest.approx([g0, g0, g0, 0.0, 0.0], rel=1e-5, abs=1e-9)
    assert grad[0] < 0
    assert sums.metrics()["is/masked_fraction"] == pytest.approx(2 / 5)  # all of sequence 1


def test_cispo_drops_no_token_and_weighs_each_by_its_clipped_ratio() -> None:
    """CISPO (MiniMax-M1, 2025, eq. 4): J = 1/sum|o_i| sum_i sum_t sg(clip(r_t, 1 - eps_low,
    1 + eps_high)) A_t log pi_theta(o_t); its gradient is clip(r_t) A_t grad log pi_theta."""
    cfg = LossConfig(name="cispo", eps_low=0.2, eps_high=0.28)
    loss, grad, sums = run(cfg)
    w = [clip(r, 0.8, 1.28) for r in RATIOS]
    logp = [lr + math.log(r) for lr, r in zip(ROLLOUT, RATIOS, strict=True)]
    assert loss == pytest.approx(-sum(wi * a * lp for wi, a, lp in zip(w, ADV, logp,
                                                                        strict=True)) / 5,
                                 rel=1e-6)
    assert grad == pytest.approx([-wi * a / 5 for wi, a in zip(w, ADV, strict=True)], rel=1e-5)
    assert all(g != 0 for g in grad)  # token 2 (r 1.5) still learns, at weight 1.28
    assert sums.metrics()["is/masked_fraction"] == 0.0


def test_the_aggregations_weigh_tokens_as_their_formulas_say() -> None:
    """token_mean: sum / N; seq_mean: 1/S sum_i 1/L_i sum_{t in i}; constant (Dr.GRPO, Liu et
    al. 2025): 1/(S C) sum over all tokens. Checked on the is_mask loss, whose per-token loss is
    -keep_t A_t r_t (band [0.8, 1.28]: token 0 and 2 masked)."""
    per_token = [0.0, 2.0 * 1.1, 0.0, 1.0 * 0.95, -3.0 * 1.2]
    for agg, weights in (("token_mean", [1 / 5] * 5),
                         ("seq_mean", [1 / (2 * 3)] * 3 + [1 / (2 * 2)] * 2),
                         ("constant", [1 / (2 * 100.0)] * 5)):
        loss, grad, _ = run(LossConfig(agg=agg, agg_constant=100.0))
        assert loss == pytest.approx(sum(w * x for w, x in zip(weights, per_token,
                                                               strict=True)), rel=1e-6), agg
        want = [0.0 if x == 0 else -w * a * r
                for w, x, a, r in zip(weights, per_token, ADV, RATIOS, strict=True)]
        assert grad == pytest.approx(want, rel=1e-5, abs=1e-9), agg


@pytest.mark.parametrize("kind", ["token_truncate", "token_mask", "sequence_truncate",
                                  "sequence_mask"])
def test_rollout_corrections_weigh_the_on_policy_gradient(kind: str) -> None:
    """TIS (Yao et al. 2025) and MIS (Liu et al. 2025), rho = pi_theta / pi_rollout at the step,
    cap C: token_truncate w_t = min(rho_t, C); token_mask w_t = rho_t 1[rho_t <= C];
    sequence_*: the same with rho_i = prod_t rho_t for every token of sequence i. The loss's own
    ratio is then to the trainer's policy (value 1), so with ppo_clip each token's gradient
    is -w_t A_t / N."""
    cap = 1.3
    ratios = [0.7, 1.1, 1.5, 0.95, 1.2]
    rho_seq = [math.prod(ratios[:3])] * 3 + [math.prod(ratios[3:])] * 2  # 1.155, 1.14
    rho = rho_seq if kind.startswith("sequence") else ratios
    if kind.endswith("truncate"):
        w = [min(x, cap) for x in rho]
    else:
        w = [x if x <= cap else 0.0 for x in rho]
    loss, grad, sums = run(LossConfig(name="ppo_clip", correction=kind, correction_cap=cap),
                           ratios=ratios)
    assert loss == pytest.approx(-sum(wi * a for wi, a in zip(w, ADV, strict=True)) / 5,
                                 rel=1e-6)
    assert grad == pytest.approx([-wi * a / 5 for wi, a in zip(w, ADV, strict=True)],
                                 rel=1e-5, abs=1e-9)
    m = sums.metrics(kind)
    assert m["correction/cut_fraction"] == pytest.approx(sum(x > cap for x in rho) / 5)
    assert m["correction/weight_mean"] == pytest.approx(sum(w) / 5, rel=1e-6)
    if kind == "token_mask":
        assert grad[2] == 0.0  # rho 1.5 > 1.3: the token is dropped
    if kind == "sequence_truncate":
        assert grad[2] != 0.0  # its sequence's rho 1.155 is under the cap


def test_rloo_subtracts_the_mean_of_the_other_samples() -> None:
    """RLOO (Ahmadian et al. 2024, eq. 6): A_i = R_i - 1/(K-1) sum_{j != i} R_j."""
    rewards = [0.0, 1.0, 2.0, 3.0]
    baselines, scale = baselines_and_scale(rewards, AdvantageConfig(estimator="rloo"))
    want = [r - sum(x for j, x in enumerate(rewards) if j != i) / 3
            for i, r in enumerate(rewards)]
    assert [r - b for r, b in zip(rewards, baselines, strict=True)] == pytest.approx(want)
    assert want == pytest.approx([-2.0, -2 / 3, 2 / 3, 2.0]) and scale == 1.0
    assert baselines_and_scale([5.0], AdvantageConfig(estimator="rloo"))[0] == [5.0]  # A = 0


def test_reinforce_pp_normalises_over_the_batch_tokens() -> None:
    """REINFORCE++ (Hu et al. 2025, eq. 9-10): A = R (minus the group mean with the baseline
    variant), then (A - mean) / std over every loss token of the global batch."""
    groups = [Group("g0", [trajectory("a", reward=1.0, index=0),
                           trajectory("b", reward=0.0, index=1)]),
              Group("g1", [trajectory("c", reward=1.0, index=0),
                           trajectory("d", reward=1.0, index=1)])]
    for baseline in (True, False):
        cfg = TrainerConfig(advantages=AdvantageConfig(estimator="reinforce_pp",
                                                       group_baseline=baseline, eps=1e-12))
        batch = build_batch(groups, cfg, 0)
        raw = [0.5, -0.5, 0.0, 0.0] if baseline else [1.0, 0.0, 1.0, 1.0]
        n_tok = 3  # handmade: mask [0,0,0,1,1,0,1], three loss tokens per sample
        tokens = [x for x in raw for _ in range(n_tok)]
        mean = sum(tokens) / len(tokens)
        std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / len(tokens))
        for seq, a in zip(batch.sequences, raw, strict=True):
            got = [x for x, m in zip(seq.advantages, seq.loss_mask, strict=True) if m]
            assert got == pytest.approx([(a - mean) / std] * n_tok), baseline
            assert all(x == 0 for x, m in zip(seq.advantages, seq.loss_mask, strict=True)
                       if not m)


def test_grpo_without_std_is_dr_grpo() -> None:
    """Dr.GRPO (Liu et al. 2025): A_i = R_i - mean_j R_j, no std division."""
    baselines, scale = baselines_and_scale([0.0, 1.0, 3.0], AdvantageConfig(normalize_std=False))
    assert baselines == pytest.approx([4 / 3] * 3) and scale == 1.0


def test_a_plug_in_loss_is_checked_before_it_is_used() -> None:
    fn = resolve_loss("tests.trainer.plugin_losses:vanilla_pg")
    loss, grad, _ = run(LossConfig(name="tests.trainer.plugin_losses:vanilla_pg"))
    assert fn is not None
    # vanilla PG: -A r / N on every token (no mask, no clip)
    assert grad == pytest.approx([-a * r / 5 for a, r in zip(ADV, RATIOS, strict=True)],
                                 rel=1e-5)
    for name, says in (("tests.trainer.plugin_losses:two_arguments", "one argument"),
                       ("tests.trainer.plugin_losses:not_finite", "not finite"),
                       ("tests.trainer.plugin_losses:wrong_shape", "per-token loss"),
                       ("tests.trainer.plugin_losses:no_gradient", "no gradient"),
                       ("tests.trainer.plugin_losses:raises", "raised on a test input"),
                       ("tests.trainer.plugin_losses:missing", "cannot import"),
                       ("no_such_module_here:fn", "cannot import")):
        with pytest.raises(BadLoss, match=says):
            resolve_loss(name)
    with pytest.raises(ValueError, match="a loss is one of"):
        LossConfig(name="gspo2")


def _cut(t):
    """`t` with its last turn cut by the length limit."""
    t.turns[-1] = t.turns[-1].model_copy(update={"finish_reason": "length"})
    return t


def test_truncated_samples_are_kept_masked_or_penalised() -> None:
    """DAPO (Yu et al. 2025): overlong filtering masks the loss of truncated samples; the
    penalty variant lowers their reward. Sample b is cut (last turn finish_reason 'length');
    rewards a 1, b 1, c 0, no std (A = R - mean)."""
    def groups():
        return [Group("g", [trajectory("a", reward=1.0, index=0),
                            _cut(trajectory("b", reward=1.0, index=1)),
                            trajectory("c", reward=0.0, index=2)])]

    def adv(batch):
        return {q.session_id: [x for x, m in zip(q.advantages, q.loss_mask, strict=True) if m][0]
                for q in batch.sequences}

    keep = build_batch(groups(), TrainerConfig(advantages=AdvantageConfig(
        normalize_std=False)), 0)
    assert adv(keep) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": -2 / 3})
    masked = build_batch(groups(), TrainerConfig(advantages=AdvantageConfig(
        normalize_std=False, truncated="mask")), 0)
    # b is not trained; its reward still counts in the baseline (mean 2/3)
    assert adv(masked) == pytest.approx({"a": 1 / 3, "c": -2 / 3})
    assert masked.metrics()["truncated/masked"] == 1
    penalised = build_batch(groups(), TrainerConfig(advantages=AdvantageConfig(
        normalize_std=False, truncated="penalty", overlong_penalty=0.5)), 0)
    # R_b = 1 - 0.5: mean (1 + 0.5 + 0) / 3 = 0.5
    assert adv(penalised) == pytest.approx({"a": 0.5, "b": 0.0, "c": -0.5})
    assert penalised.metrics()["truncated/penalised"] == 1
