"""Harbor task folders: loading as-is, reward files, and the built-in terminal tasks run on
docker (oracle passes every task, an agent that does nothing fails every task)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from envhub.envs.environment import RunContext, Task, Verdict
from envhub.envs.harbor import HarborTaskError, load_harbor_task, load_harbor_tasks
from envhub.envs.harbor.task import size_mb
from envhub.envs.harbor.verifier import parse_reward
from envhub.envs.loader import load_env
from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox
from tests.support import require_docker

TASKS_ROOT = Path(load_env("terminal-task").folder) / "tasks"


def make_task(root: Path, toml: str) -> Path:
    folder = root / "t"
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text(toml)
    (folder / "instruction.md").write_text("do it\n")
    (folder / "environment" / "Dockerfile").write_text("FROM envhub/base\nWORKDIR /app\n")
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    return folder


def test_builtin_tasks_load_with_their_settings() -> None:
    tasks = load_harbor_tasks(TASKS_ROOT)
    assert len(tasks) >= 10
    categories = {t.config.metadata["category"] for t in tasks}
    assert {"file-processing", "text-processing", "data-wrangling", "service-repair",
            "failing-build"} <= categories
    for t in tasks:
        assert t.has_solution and t.workdir == "/app" and t.instruction.strip()
        assert t.config.environment.allow_internet is False
        assert t.config.verifier.timeout_sec == 120


def test_legacy_spellings_and_defaults(tmp_path: Path) -> None:
    folder = make_task(tmp_path, 'version = "1.0"\n[environment]\nmemory = "4G"\n'
                                 'storage = "512M"\ncpus = 2\n[metadata]\nauthor_name = "x"\n')
    task = load_harbor_task(folder)
    assert task.config.environment.memory_mb == 4096
    assert task.config.environment.storage_mb == 512
    assert task.config.environment.allow_internet is True  # Harbor's default
    assert task.name == "t" and task.workdir == "/app" and not task.has_solution
    assert size_mb(1024) == 1024


@pytest.mark.parametrize("problem,match", [
    ("missing", "missing tests/test.sh"),
    ("toml", "not valid TOML"),
    ("memory", "cannot read size"),
])
def test_bad_task_folders_say_what_to_fix(tmp_path: Path, problem: str, match: str) -> None:
    toml = {"toml": "[environment\n", "memory": '[environment]\nmemory = "lots"\n'}.get(
        problem, "")
    folder = make_task(tmp_path, toml)
    if problem == "missing":
        (folder / "tests" / "test.sh").unlink()
    with pytest.raises(HarborTaskError, match=match):
        load_harbor_task(folder)


def test_reward_files() -> None:
    assert parse_reward("1\n", None)[0] == 1.0
    assert parse_reward("", '{"reward": 0.5, "style": 1}')[0] == 0.5
    assert parse_reward("", '{"a": 1, "b": 0}')[0] == 0.5
    assert parse_reward("", None)[0] is None
    assert parse_reward("yes", None)[0] is None
    assert parse_reward("", "[1]")[0] is None


@pytest.mark.parametrize("txt,js", [
    ("inf", None), ("Infinity", None), ("nan", None), ("1e999", None), ("1_0", None),
    ("\u0661", None), ("", "1" + "0" * 400), ("", "9" * 5000), ("", '{"reward": ' + "9" * 5000 +
                                                                   "}"),
    ("", '{"reward": 1e999}'), ("", "true"),
])
def test_a_reward_that_is_not_a_finite_number_is_no_reward(txt: str, js: str | None):
    """test.sh may write a value computed from the agent's output: `inf` was clamped to a
    solved 1.0, and JSON numbers past float's range or int()'s 4,300 digits raised out of
    verify (an env_failure); each is now no reward (scored 0 with the reason)."""
    reward, info = parse_reward(txt, js)
    assert reward is None and "reward_error" in info, (reward, info)


class TerminalHarness:
    def __init__(self, scratch: Path) -> None:
        self.loaded = load_env("terminal-task")
        self.env = self.loaded.env
        self.tasks = {t.id: t for t in self.env.load_tasks()}
        self.scratch = scratch
        self.opened: list[Sandbox] = []

    async def open(self, spec: SandboxSpec) -> Sandbox:
        box = await open_sandbox("docker", spec, run_id="test-harbor",
                                 package_root=self.loaded.folder)
        self.opened.append(box)
        return box

    async def rollout(self, task: Task, solve: bool) -> Verdict:
        ctx = RunContext(run_id="test-harbor", sandbox_kind="docker", open_sandbox=self.open,
                         scratch=self.scratch)
        try:
            sandbox = await self.env.setup(task, ctx)
            if solve:
                await self.env.solve(task, sandbox, ctx)
            else:  # a do-nothing agent that still tries to plant a reward
                await sandbox.exec("mkdir -p /logs/verifier && echo 1 > "
                                   "/logs/verifier/reward.txt", timeout=30)
            return await self.env.verify(task, sandbox, ctx)
        finally:
            while self.opened:
                await self.opened.pop().close()


@pytest.mark.docker
@pytest.mark.slow
def test_oracle_passes_all_and_doing_nothing_fails_all(tmp_path: Path) -> None:
    require_docker()
    harness = TerminalHarness(tmp_path)

    async def everything() -> dict[str, tuple[Verdict, Verdict]]:
        out = {}
        for task_id, task in sorted(harness.tasks.items()):
            out[task_id] = (await harness.rollout(task, True), await harness.rollout(task, False))
        return out

    results = asyncio.run(everything())
    assert len(results) >= 10
    for task_id, (gold, nothing) in results.items():
        assert gold.env_failure is None and gold.resolved, (task_id, gold.info)
        assert nothing.env_failure is None and not nothing.resolved, (task_id, nothing.info)


def test_local_sandbox_is_refused_with_the_fix(tmp_path: Path) -> None:
    harness = TerminalHarness(tmp_path)
    task = next(iter(harness.tasks.values()))
    ctx = RunContext(run_id="x", sandbox_kind="local", open_sandbox=harness.open,
                     scratch=tmp_path)
    with pytest.raises(Exception, match="--sandbox docker"):
        asyncio.run(harness.env.setup(task, ctx))


#: keeps writing a perfect reward while the verifier runs (Harbor's reward file)
WRITER = "while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; sleep 0.05; done"
WRITTEN = "until [ -s /logs/verifier/reward.txt ]; do sleep 0.05; done"


@pytest.mark.docker
@pytest.mark.parametrize("how", ["tool_call_setsid", "tool_call_double_fork", "docker_exec_d"])
def test_a_leftover_reward_writer_does_not_count(tmp_path: Path, how: str) -> None:
    """The agent leaves a loop writing 1 to reward.txt and does nothing else: killed before
    the verifier starts, and a reward file older than the verifier is never read."""
    require_docker()
    harness = TerminalHarness(tmp_path)
    task = harness.tasks["envhub/word-frequency"]
    ctx = RunContext(run_id="test-harbor", sandbox_kind="docker", open_sandbox=harness.open,
                     scratch=tmp_path)

    async def go() -> Verdict:
        try:
            sandbox = await harness.env.setup(task, ctx)
            # each way waits until the writer has written (a writer killed before its first
            # line would leave nothing for the verifier to ignore)
            if how == "docker_exec_d":  # from outside any tool call, as a host agent could
                sandbox.container.exec_run(["sh", "-c", WRITER], detach=True)  # type: ignore
                wrote = await sandbox.exec(WRITTEN, timeout=30)
            elif how == "tool_call_setsid":
                wrote = await sandbox.exec(f"setsid sh -c '{WRITER}' >/dev/null 2>&1 & {WRITTEN}",
                                           timeout=30)
            else:
                wrote = await sandbox.exec(
                    f"(env -i sh -c '{WRITER}' >/dev/null 2>&1 &) & {WRITTEN}", timeout=30)
            assert wrote.exit_code == 0 and not wrote.timed_out, wrote
            return await harness.env.verify(task, sandbox, ctx)
        finally:
            while harness.opened:
                await harness.opened.pop().close()

    verdict = asyncio.run(go())
    assert verdict.env_failure is None, verdict.env_failure
    assert not verdict.resolved and verdict.outcome == 0.0, verdict.info
