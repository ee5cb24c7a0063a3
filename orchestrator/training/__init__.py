"""The parts of `envhub train` (orchestrator/train.py): the task stream, the rollout producer beside
the trainer, the windowed-FIFO view of its groups, held-out evaluation and per-step metrics."""
