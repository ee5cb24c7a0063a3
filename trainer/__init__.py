"""envhub trainer: consumes finished groups from the data pool and trains the policy.

Pipeline of one `Trainer.step(groups)` (see trainer/README.md for the contracts):
    source.py      TrajectorySource (in-memory, gateway HTTP); window.py: windowed FIFO
    filters.py     staleness cut, env-failure exclusion, pad-or-drop of incomplete groups
    advantages.py  GRPO on the composite reward + per-turn reward-to-go
    batch.py       TrainSequence: one segment with per-token advantages
    prefix_tree.py / forward.py   packed prefix-tree forward, exact vs the unmerged batch
    loss.py        IS-masked policy-gradient loss against the rollout logprobs
    trainer.py     AdamW, clipping, data parallel, checkpoints, weight sync (weights.py)
    export.py      flat Parquet for verl / TRL
Modules import torch lazily, so `import envhub.trainer` works without the [train] extra.
"""
