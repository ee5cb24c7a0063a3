"""Model-judged rewards (issue 29): a rubric, criteria with weights and a judge model at any
OpenAI-compatible endpoint (default: the run's gateway, recorded as not trainable).

    [rewards.judge]                  # envhub.toml; any key, a table without `component`
    weight = 0.5
    rubric_file = "rubric.md"        # or rubric = "..."
    criteria = { correctness = 2, clarity = 1 }
    reference_field = "answer"       # optional: a task row field shown as the reference
    mode = "group"                   # optional: the group's outputs judged side by side

The judge grades `Verdict.output` (the environment's verifier sets it). prompt.py: what the
judge sees (outputs as fenced data it cannot break out of) and the verdict's JSON schema;
calls.py: endpoint, cache, budget and retries in one place; component.py: the component.

Caching is by the judge's inputs, not its weights: with the run's gateway as judge (the default)
a trained model's verdicts are those of the weights that first gave them; set `cache = "off"` to
re-ask, or judge with a fixed model (`base_url`, `model`).
"""

from envhub.envs.rewards.judge.calls import JudgeBudgetExhausted, JudgeCalls, JudgeError
from envhub.envs.rewards.judge.component import Judge

__all__ = ["Judge", "JudgeBudgetExhausted", "JudgeCalls", "JudgeError"]
