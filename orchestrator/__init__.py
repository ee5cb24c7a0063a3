"""The orchestrator: rollout groups (plan, dispatch, scheduling, executors, the rollout phases,
scoring, results: `groups/`), the RL loop around them (`train.py`, `training/`), the audit that
attacks an environment with cheating agents (`audit/`), and the commands that run them
(`cli.py`). It wires every component; only the CLI imports it. See README.md."""
