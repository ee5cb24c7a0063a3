"""`envhub run PATH` / `envhub info PATH` on task folders as they come: one bare Harbor task,
a folder of them (a dataset), terminal-bench 1 tasks; multi-step and multi-container tasks
refused with the reason. Folders are written here from the documented formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envhub.envs.errors import EnvLoadError
from envhub.envs.loader import load_env
from tests.support import envhub, require_docker

DOCKERFILE = "FROM envhub/base\nWORKDIR /app\n"


def harbor_task(folder: Path, answer: str = "42", toml: str = "") -> Path:
    """A Harbor task: write `answer` to /app/answer.txt."""
    (folder / "environment").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "solution").mkdir()
    (folder / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 60\n'
                                      '[environment]\nallow_internet = false\n' + toml)
    (folder / "instruction.md").write_text(f"Write {answer} to /app/answer.txt.\n")
    (folder / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (folder / "tests" / "test.sh").write_text(
        f'if [ "$(cat /app/answer.txt)" = "{answer}" ]; then echo 1; else echo 0; fi '
        "> /logs/verifier/reward.txt\n")
    (folder / "solution" / "solve.sh").write_text(f"echo {answer} > /app/answer.txt\n")
    return folder


def tbench_task(folder: Path, answer: str = "7") -> Path:
    """A terminal-bench 1 task: task.yaml, Dockerfile, run-tests.sh, tests/, solution.sh."""
    (folder / "tests").mkdir(parents=True)
    (folder / "task.yaml").write_text(
        f"instruction: |\n  Write {answer} to /app/out.txt.\ndifficulty: easy\n"
        "category: file-operations\nmax_agent_timeout_sec: 120\nmax_test_timeout_sec: 60\n")
    (folder / "Dockerfile").write_text(DOCKERFILE + "COPY data.txt /app/data.txt\n")
    (folder / "data.txt").write_text("context file\n")
    (folder / "docker-compose.yaml").write_text(
        "services:\n  client:\n    build:\n      dockerfile: Dockerfile\n"
        "    image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}\n"
        "    command: [\"sh\", \"-c\", \"sleep infinity\"]\n")
    (folder / "run-tests.sh").write_text("bash $TEST_DIR/check.sh\n")
    (folder / "tests" / "check.sh").write_text(
        f'test "$(cat /app/out.txt)" = "{answer}" && test -f /app/data.txt\n')
    (folder / "solution.sh").write_text(f"echo {answer} > /app/out.txt\n")
    return folder


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_bare_task_dataset_and_tbench_folders_load(tmp_path: Path) -> None:
    one = harbor_task(tmp_path / "one-task")
    loaded = load_env(str(one))
    assert [t.id for t in loaded.env.load_tasks()] == ["one-task"]
    assert loaded.manifest.name == "one-task" and loaded.manifest.sandbox.kind == "docker"

    harbor_task(tmp_path / "set" / "a", "1"), harbor_task(tmp_path / "set" / "b", "2")
    assert [t.id for t in load_env(str(tmp_path / "set")).env.load_tasks()] == ["a", "b"]

    tb = tbench_task(tmp_path / "tb" / "hello")
    before = snapshot(tb)
    tasks = load_env(str(tb)).env.load_tasks()
    assert [t.id for t in tasks] == ["hello"] and "Write 7" in tasks[0].instruction
    tbench_task(tmp_path / "tb" / "second", "8")
    assert [t.id for t in load_env(str(tmp_path / "tb")).env.load_tasks()] == ["hello", "second"]
    assert snapshot(tb) == before  # read, never written to


def test_multi_step_tasks_are_refused_with_the_reason(tmp_path: Path) -> None:
    task = harbor_task(tmp_path / "steps-task", toml='[[steps]]\nname = "first"\n')
    (task / "steps" / "first").mkdir(parents=True)
    with pytest.raises(EnvLoadError, match="multi-step Harbor task.*Split the steps"):
        load_env(str(task))
    result = envhub("run", str(task), "--agent", "oracle", "--sandbox", "docker", cwd=tmp_path)
    assert result.returncode == 2 and "multi-step" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "runs").exists()


def test_multi_container_compose_is_refused(tmp_path: Path) -> None:
    task = tbench_task(tmp_path / "svc")
    (task / "docker-compose.yaml").write_text(
        "services:\n  client:\n    build: .\n  db:\n    image: postgres\n")
    result = envhub("info", str(task), cwd=tmp_path)
    assert result.returncode == 2 and "multi-container tasks are not supported" in result.stderr


def _run(folder: Path, out: Path) -> dict:
    result = envhub("run", str(folder), "--agent", "oracle", "--sandbox", "docker", "-q",
                    "--out", str(out), cwd=out.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "summary.json").read_text())


@pytest.mark.docker
@pytest.mark.slow
def test_oracle_runs_bare_task_dataset_and_tbench(tmp_path: Path) -> None:
    require_docker()
    one = harbor_task(tmp_path / "bare")
    harbor_task(tmp_path / "set" / "a", "1"), harbor_task(tmp_path / "set" / "b", "2")
    tbench_task(tmp_path / "tb")
    for folder, count in ((one, 1), (tmp_path / "set", 2), (tmp_path / "tb", 1)):
        before = snapshot(folder)
        overall = _run(folder, tmp_path / f"out-{folder.name}")["overall"]
        assert overall["rollouts"] == count and overall["resolved"] == count, overall
        assert snapshot(folder) == before


DOCS_TASKS = Path(__file__).parent / "data" / "harbor-docs"  # written by hand, see its README


def test_task_folders_written_as_harbors_docs_show_load_bare_and_as_a_dataset() -> None:
    loaded = load_env(str(DOCS_TASKS))
    # A task named in task.toml's [task] section (schema 1.1) keeps that name as its id.
    ids = {"hello-world": "hello-world", "error-count": "envhub-tests/error-count",
           "fix-median": "fix-median"}
    assert sorted(t.id for t in loaded.env.load_tasks()) == sorted(ids.values())
    for folder, task_id in ids.items():
        assert [t.id for t in load_env(str(DOCS_TASKS / folder)).env.load_tasks()] == [task_id]


def _run_agent(folder: Path, out: Path, agent: str) -> dict:
    result = envhub("run", str(folder), "--agent", agent, "--sandbox", "docker", "-q",
                    "--out", str(out), cwd=out.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "summary.json").read_text())["overall"]


@pytest.mark.docker
@pytest.mark.slow
def test_oracle_solves_the_docs_tasks_bare_and_as_a_dataset(tmp_path: Path) -> None:
    require_docker()
    before = snapshot(DOCS_TASKS)
    for folder, count in ((DOCS_TASKS / "hello-world", 1), (DOCS_TASKS, 3)):
        overall = _run_agent(folder, tmp_path / f"out-{folder.name}", "oracle")
        assert overall["rollouts"] == count and overall["resolved"] == count, overall
    assert snapshot(DOCS_TASKS) == before


@pytest.mark.docker
@pytest.mark.slow
def test_doing_nothing_scores_zero_on_every_folder_form(tmp_path: Path) -> None:
    """The no-op agent (`true`: exits at once, touches nothing) resolves nothing and is never
    an env_failure: bare Harbor task, dataset, terminal-bench 1, the docs' tasks."""
    require_docker()
    one = harbor_task(tmp_path / "bare")
    harbor_task(tmp_path / "set" / "a", "1"), harbor_task(tmp_path / "set" / "b", "2")
    tbench_task(tmp_path / "tb")
    for folder, count in ((one, 1), (tmp_path / "set", 2), (tmp_path / "tb", 1),
                          (DOCS_TASKS, 3)):
        overall = _run_agent(folder, tmp_path / f"noop-{folder.name}", "true")
        assert overall["rollouts"] == count and overall["done"] == count, overall
        assert overall["resolved"] == 0 and overall["env_failure"] == 0, overall


@pytest.mark.parametrize("recursion_limit", [None, 20000])
def test_a_task_yaml_too_deep_is_refused_alike_whatever_the_recursion_limit(
        tmp_path: Path, recursion_limit: int | None) -> None:
    """3,000 nested sequences in task.yaml: refused as too deep before the parser recurses, the
    same answer at Python's default limit and at one other code raised (the old reader caught
    RecursionError: "not valid YAML" at 1,000, read it whole at 20,000)."""
    import sys

    from envhub.envs.harbor.tbench import HarborTaskError, _config

    task = tbench_task(tmp_path / "deep")
    (task / "task.yaml").write_text("instruction: hi\nextra: " + "[" * 3000 + "]" * 3000 + "\n")
    before = sys.getrecursionlimit()
    try:
        if recursion_limit:
            sys.setrecursionlimit(recursion_limit)
        with pytest.raises(HarborTaskError, match="nested too deeply"):
            _config(task)
    finally:
        sys.setrecursionlimit(before)
    (task / "task.yaml").write_text("instruction: hi\nextra: " + "[" * 60 + "]" * 60 + "\n")
    assert _config(task)["instruction"] == "hi"  # deep, within the bound: read
