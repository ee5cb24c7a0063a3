"""Harbor task folders, loaded as-is: `instruction.md`, `task.toml`, `environment/Dockerfile`,
`tests/test.sh` (writes /logs/verifier/reward.txt or reward.json), `solution/solve.sh`.

    tasks = load_harbor_tasks("path/to/tasks")        # every sub-folder holding a task.toml
    await run_solution(task, sandbox)                 # the oracle
    verdict = await run_verifier(task, sandbox, open_grader)
        # test.sh in a fresh container of the task image holding only the declared artifacts
"""

from envhub.envs.harbor.grader import run_verifier
from envhub.envs.harbor.task import HarborTask, HarborTaskError, load_harbor_task, load_harbor_tasks
from envhub.envs.harbor.verifier import run_solution

__all__ = ["HarborTask", "HarborTaskError", "load_harbor_task", "load_harbor_tasks",
           "run_solution", "run_verifier"]
