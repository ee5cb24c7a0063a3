"""The runner: `run(RunConfig)` executes groups of rollouts and returns their records.

Modules: config (options), plan (which rollouts), rollout (one rollout up to grading),
scoring (group rewards, closing sessions), results (folder, resume), progress (display),
gateway_link (in-process or remote gateway), memory_sandbox (for sandbox-less environments),
executor (where rollouts run: in-process, or ray_executor on a Ray cluster), scheduling (which
rollout starts next: FIFO or Seer-style probe-then-longest-first) and dispatch (slots granted in
a policy's order).
"""

from envhub.orchestrator.groups.config import EnvChoice, RunConfig
from envhub.orchestrator.groups.run import RunOutcome, run

__all__ = ["EnvChoice", "RunConfig", "RunOutcome", "run"]
