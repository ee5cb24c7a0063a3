"""SWE-style tasks: a repository at a base commit, an issue, hidden tests that decide.

Reusable by any SWE-style environment (the built-in `swe-task`, real SWE-bench instances):

* `task`     — `SWETask`, the SWE-bench field names plus how to test and where to run.
* `logparse` — pytest `-rA` summaries → per-test status, with consistency checks.
* `diff`     — splitting a unified diff per file and dropping what an agent may not change.
* `repo`     — materialising the repository in a sandbox with no history beyond the base.
* `grading`  — the verdict: fresh sandbox, agent diff only, hidden tests, SWE-bench rules.
* `task_image` — per-task docker images (snapshot built on the envhub base, cached).
* `construct` — the pipeline that builds the offline task set (scripts/build_swe_tasks.py).
"""

from envhub.envs.swe.task import SWETask, load_swe_tasks

__all__ = ["SWETask", "load_swe_tasks"]
