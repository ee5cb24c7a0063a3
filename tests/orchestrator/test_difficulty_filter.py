"""The online difficulty filter (orchestrator/training/tasks.py) on a real ledger, seeded: a
task every sample solved in its last `window` groups, or none did, is launched at about
`floor` of its turns (the next task instead), a task with signal at every turn, a task with
too short a record always; a resumed stream goes on exactly where the first left it."""

from __future__ import annotations

from envhub.envs.environment import Task
from envhub.orchestrator.groups.results import RolloutRecord
from envhub.orchestrator.training.ledger import GroupLedger
from envhub.orchestrator.training.tasks import DifficultyFilter, EnvTasks, task_stream

TASKS = [Task("easy", "1+1"), Task("hard", "prove it"), Task("mid", "2*3"), Task("new", "?")]


def finished(ledger: GroupLedger, task: str, resolved: list[bool | None],
             status: str = "done") -> None:
    gid = ledger.launch("arith", task)
    ledger.finish(gid, [RolloutRecord(env="arith", task_id=task, sample=i, group_id=gid,
                                      agent="tool", status=status, resolved=r)
                        for i, r in enumerate(resolved)])


class Watched(DifficultyFilter):
    """Records each decision (the filter's own, unchanged)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.seen: dict[str, list[bool]] = {}

    def admits(self, env, task) -> bool:
        ok = super().admits(env, task)
        self.seen.setdefault(task.id, []).append(ok)
        return ok


def ledger_with_history() -> GroupLedger:
    ledger = GroupLedger("run", ["arith"], k=2)
    for _ in range(2):
        finished(ledger, "easy", [True, True])
        finished(ledger, "hard", [False, False])
    finished(ledger, "mid", [True, False])
    finished(ledger, "mid", [True, True])
    finished(ledger, "new", [False, False])  # one group only: under the window
    # an env failure does not count as unsolved: hard's record stays all-or-nothing
    finished(ledger, "hard", [None, False], status="env_failure")
    return ledger


def test_all_or_nothing_tasks_are_launched_at_the_floor_rate() -> None:
    ledger = ledger_with_history()
    admit = Watched(ledger, 2, 0.2, 7)
    env = EnvTasks("arith", "arith", 1.0, TASKS, [])
    stream = task_stream([env], seed=3, admit=admit)
    drawn = []
    for _ in range(3000):
        _, task = next(stream)
        drawn.append(task.id)
        ledger.launch("arith", task.id)  # as the producer does (never finished here)
    for task in ("easy", "hard"):
        rate = sum(admit.seen[task]) / len(admit.seen[task])
        assert 0.15 <= rate <= 0.25, (task, rate, len(admit.seen[task]))
    assert all(admit.seen["mid"]) and all(admit.seen["new"])
    assert admit.passed == sum(not ok for oks in admit.seen.values() for ok in oks)
    share = {t.id: drawn.count(t.id) / len(drawn) for t in TASKS}
    assert share["easy"] < 0.12 and share["hard"] < 0.12  # a quarter each without the filter
    assert share["mid"] > 0.35 and share["new"] > 0.35


def test_a_resumed_stream_goes_on_where_the_first_left_it() -> None:
    env = EnvTasks("arith", "arith", 1.0, TASKS, [])
    ledger = ledger_with_history()
    stream = task_stream([env], seed=3, admit=DifficultyFilter(ledger, 2, 0.2, 7))
    first = []
    for _ in range(40):
        first.append(next(stream)[1].id)
        ledger.launch("arith", first[-1])
    after = [next(stream)[1].id for _ in range(10)]
    # a new process: the same ledger (the journal's), the stream advanced past its launches
    # (those of the stream: the history above was launched by hand, 8 groups)
    launched = [ledger.launched_tasks_by_env()[0][8:]]
    assert launched[0] == first
    resumed = task_stream([env], seed=3, launched=launched,
                          admit=DifficultyFilter(ledger, 2, 0.2, 7))
    assert [next(resumed)[1].id for _ in range(10)] == after
