"""reasoning-gym datasets as envhub environments (`envhub run rg:NAME`, `envhub init DIR --from
rg:NAME`).

A reference names a dataset of reasoning-gym's registry and, in brackets, its settings:

    rg:chain_sum                                   100 tasks from seed 0, the default config
    rg:chain_sum[size=20,seed=3,max_terms=4]       20 tasks from seed 3, at most 4 terms
    rg:basic_arithmetic[operators=["+","-"]]       a list value, written as JSON

`size` is the task count, `seed` the generator's seed, `partial=true` makes the scorer's partial
credit the outcome (by default only a full score counts: several scorers give len(gold) /
len(answer) to any answer containing the gold one, a reward a policy learns to farm by listing
candidates), every other key a field of the dataset's
config (its difficulty settings: an unknown key's error lists them, and the manifest pins every
one: `envhub info rg:NAME --json`, or a generated package's envhub.toml). Values are JSON literals
(numbers, true/false, lists) or plain text. Brackets, not `?a=1&b=2`: a reference ending in
`=<number>` would read as a sampling weight (`envhub train rg:chain_sum[size=20]=3`).
`score_timeout_s` (default 10) is the scorer's time limit per answer. A reference whose config
differs from the dataset's defaults (or with partial=true) gets a digest in its name and task ids
(`rg-chain_sum-1a2b3c4d`), so one dataset can be listed twice with two configs.

Modules: spec (the reference and its checks against the installed reasoning-gym), env (the
Environment: a `submit(answer)` tool, graded by the dataset's own `score_answer`), scorer and
worker (the worker processes that generate entries under a fixed hash seed and score answers),
screen (answers a scorer would run as Python must be plain expressions), package (the same
environment written out as a package folder, publishable like any other).
"""

from envhub.envs.rg.spec import PREFIX, RGSpec, parse_reference

__all__ = ["PREFIX", "RGSpec", "parse_reference"]
