"""The runner: `run(RunConfig)` executes groups of rollouts and returns their records.

Modules: config (options), plan (which rollouts), rollout (one rollout up to grading),
scoring (group rewards, closing sessions), results (folder, resume), progress (display),
gateway_link (in-process or remote gateway), memory_sandbox (for sandbox-less environments).
"""

from envhub.envs.runner.config import EnvChoice, RunConfig
from envhub.envs.runner.run import RunOutcome, run

__all__ = ["EnvChoice", "RunConfig", "RunOutcome", "run"]
