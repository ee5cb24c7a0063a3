"""`envhub init`: the scaffold is a valid, loadable package whose gold solutions pass."""

from __future__ import annotations

import asyncio

import pytest

from envhub.envs.errors import RunConfigError
from envhub.envs.loader import load_env
from envhub.envs.scaffold import scaffold
from tests.support import require_tool


def test_scaffold_loads_with_tasks_solutions_and_checks(tmp_path):
    folder = scaffold(tmp_path / "my-env")
    loaded = load_env(str(folder))
    assert loaded.name == "my-env" and loaded.manifest.sandbox.kind == "auto"
    tasks = loaded.env.load_tasks()
    assert [t.id for t in tasks] == ["hello-file", "count-lines"]
    assert all(t.data["solution"] and t.data["check"] for t in tasks)
    assert "$(cat hello.txt)" in tasks[0].data["check"]  # template dollars survive


@pytest.mark.parametrize("name", ["My Env", "-x", "a/b", ""])
def test_bad_names_are_refused(tmp_path, name):
    with pytest.raises(RunConfigError, match="not a valid environment name"):
        scaffold(tmp_path / "x", name=name)


def test_existing_folder_is_never_overwritten(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(RunConfigError, match="not empty"):
        scaffold(tmp_path / "taken")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"


@pytest.mark.bwrap
def test_gold_solutions_resolve_and_doing_nothing_does_not(tmp_path):
    require_tool("bwrap")
    from envhub.envs.environment import RunContext
    from envhub.envs.sandbox import open_sandbox

    loaded = load_env(str(scaffold(tmp_path / "my-env")))

    async def grade(solve: bool) -> list[bool]:
        opened = []

        async def opener(spec):
            box = await open_sandbox("local", spec, run_id="test-init")
            opened.append(box)
            return box

        ctx = RunContext("test-init", "local", opener, tmp_path)
        verdicts = []
        try:
            for task in loaded.env.load_tasks():
                box = await loaded.env.setup(task, ctx)
                if solve:
                    await loaded.env.solve(task, box, ctx)
                verdicts.append((await loaded.env.verify(task, box, ctx)).resolved)
        finally:
            for box in opened:
                await box.close()
        return verdicts

    assert asyncio.run(grade(True)) == [True, True]
    assert asyncio.run(grade(False)) == [False, False]
