"""The built-in swe-task environment end to end on real sandboxes: setup, oracle, grading.

Sandboxes are real (bubblewrap for `local`, the Docker engine for `docker`); the harness
below only plays the runner's part of opening and closing them.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from envhub.envs.environment import Task
from envhub.envs.loader import load_env
from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox
from envhub.envs.swe.repo import GIT, GIT_ENV, cut_history
from envhub.envs.swe.task import SWETask, TaskFileError, load_swe_tasks, parse_task
from tests.envs.conftest import SWEHarness, kind_available, oracle
from tests.support import require_docker, require_tool

# One task per project keeps the default run short; the full set runs in the slow tests.
SAMPLE = ["inflection-0.5.1__camelize__dropped_branch", "toolz-1.2.0__get_in__wrong_default",
          "cachetools-8.0.0__rr_cache__wrong_default"]


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> SWEHarness:
    kind_available(request.param)
    return SWEHarness(request.param, tmp_path)


def archive_blob_ids(swe: SWETask, root: Path) -> dict[str, str]:
    """git blob ids of the pristine snapshot's files (the fixed sources, the hidden tests)."""
    assert swe.source_archive
    raw = gzip.decompress((root / swe.source_archive).read_bytes())
    out = {}
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            out[member.name] = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return out


pytestmark = pytest.mark.bwrap


def test_the_pytest_handed_to_sandboxes_stands_alone() -> None:
    """The local sandbox grades with the host's python3, which usually has no pytest: the copy
    of envhub's pytest must import with nothing else installed (`-S`: no site-packages; pytest
    8.4+ needs pygments, which a hand-written list once missed)."""
    import subprocess
    import sys

    from envhub.envs.swe.pylib import host_pylib

    lib = host_pylib()
    assert not list(lib.rglob("__pycache__"))
    version = subprocess.run([sys.executable, "-S", "-m", "pytest", "--version"],
                             env={"PYTHONPATH": str(lib)}, capture_output=True, text=True,
                             timeout=60, check=False)
    assert version.returncode == 0, version.stderr
    assert (lib / "pygments").is_dir() and (lib / "pluggy").is_dir()


def test_shipped_task_set_meets_the_issue() -> None:
    root = Path(load_env("swe-task").folder)
    tasks = load_swe_tasks(root / "data" / "tasks.jsonl")
    assert len(tasks) >= 24 and len({t.repo for t in tasks}) >= 4
    families = {t.metadata["bug_family"] for t in tasks}
    assert families == {"off_by_one", "inverted_condition", "wrong_default", "dropped_branch",
                        "swapped_args"}
    for t in tasks:
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS and not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
        assert set(t.source_remove) == set(t.test_files)  # hidden tests are not in the repo
        assert all(line not in t.problem_statement for line in t.patch.splitlines()
                   if line.startswith(("+", "-")) and len(line.strip()) > 12
                   and not line.startswith(("+++", "---")))  # symptom, not the fix


@pytest.mark.parametrize("task_id", SAMPLE)
def test_oracle_resolves_and_empty_patch_does_not(harness: SWEHarness, task_id: str) -> None:
    gold = asyncio.run(harness.rollout(task_id, oracle))
    assert gold.env_failure is None and gold.resolved, gold.info
    assert gold.info["f2p_passed"] == gold.info["f2p_total"] >= 1
    empty = asyncio.run(harness.rollout(task_id, None))
    assert empty.env_failure is None and not empty.resolved
    assert empty.info["f2p_passed"] < empty.info["f2p_total"]
    assert empty.info["p2p_passed"] == empty.info["p2p_total"]


def test_agent_sandbox_holds_one_commit_and_no_fix_or_hidden_test(harness: SWEHarness) -> None:
    task_id = SAMPLE[1]
    swe = harness.swe(task_id)
    blobs = archive_blob_ids(swe, harness.env.data_root)
    fixed_file = swe.metadata["file"]
    secret = [blobs[fixed_file]] + [blobs[p] for p in swe.test_files]
    seen: dict[str, str] = {}

    async def inspect(sandbox: Sandbox, h: SWEHarness, task: Task) -> None:
        repo = swe.repo_dir
        for name, cmd in {
            "commits": f"{GIT} -C {repo} rev-list --all --reflog",
            "objects": (f"{GIT} -C {repo} cat-file --batch-all-objects "
                        "--batch-check='%(objectname)'"),
            "files": f"cd {repo} && ls -R",
        }.items():
            result = await sandbox.exec(cmd, timeout=60, env=GIT_ENV)
            assert result.exit_code == 0, result.stderr
            seen[name] = result.stdout

    asyncio.run(harness.rollout(task_id, inspect))
    assert seen["commits"].split() == [swe.base_commit]
    assert not set(secret) & set(seen["objects"].split())
    for hidden in swe.test_files:
        assert Path(hidden).name not in seen["files"]


def test_prebuilt_repository_history_is_cut(tmp_path: Path) -> None:
    """A SWE-bench image carries the project's whole history (even future commits)."""
    require_tool("bwrap")

    async def scenario() -> tuple[str, str, str]:
        box = await open_sandbox("local", SandboxSpec(), run_id="test-swe-cut")
        try:
            setup = ("mkdir -p testbed && cd testbed && git init -q && "
                     "git -c user.name=a -c user.email=a@b commit -q --allow-empty -m base && "
                     "echo fix > f.py && git add f.py && "
                     "git -c user.name=a -c user.email=a@b commit -q -m future && "
                     "git rev-parse HEAD && git tag v9 && git reset -q --hard HEAD~1")
            r = await box.exec(setup, timeout=60)
            assert r.exit_code == 0, r.stderr
            future = r.stdout.split()[-1]
            task = parse_task({"instance_id": "x", "repo": "o/r", "base_commit": "0" * 40,
                               "problem_statement": "p", "patch": "", "test_patch": "",
                               "FAIL_TO_PASS": '["t.py::a"]', "repo_dir": "/workspace/testbed"})
            base = await cut_history(box, task)
            everything = await box.exec(
                f"{GIT} -C testbed rev-list --all --reflog; "
                f"{GIT} -C testbed cat-file -e {future} && echo REACHABLE", timeout=60)
            return base, future, everything.stdout
        finally:
            await box.close()

    base, future, listing = asyncio.run(scenario())
    assert listing.split() == [base] and future not in listing


def test_swebench_rows_validate_and_bad_rows_name_the_field(tmp_path: Path) -> None:
    row = {"instance_id": "astropy__astropy-12907", "repo": "astropy/astropy",
           "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607", "problem_statement": "p",
           "hints_text": "", "patch": "diff", "test_patch": "diff", "version": "4.3",
           "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_a"]',
           "PASS_TO_PASS": "[]", "environment_setup_commit": "298ccb4", "created_at": "2022",
           "image": "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"}
    task = parse_task(row)
    assert task.FAIL_TO_PASS == ["astropy/modeling/tests/test_separable.py::test_a"]
    assert task.repo_dir == "/testbed" and task.image
    bad = tmp_path / "tasks.jsonl"
    bad.write_text(json.dumps({**row, "FAIL_TO_PASS": "[]"}) + "\n")
    with pytest.raises(TaskFileError, match="FAIL_TO_PASS"):
        load_swe_tasks(bad)
    bad.write_text("{not json\n")
    with pytest.raises(TaskFileError, match=":1: not JSON"):
        load_swe_tasks(bad)


SWEBENCH_LIKE_DOCKERFILE = """FROM envhub/base
ENV GIT_AUTHOR_NAME=dev GIT_AUTHOR_EMAIL=dev@x GIT_COMMITTER_NAME=dev GIT_COMMITTER_EMAIL=dev@x
RUN mkdir -p /testbed/tests && cd /testbed && git init -q && \\
    printf 'def add(a, b):\\n    return a + b\\n\\n\\ndef sub(a, b):\\n    return a + b\\n' \\
      > calc.py && \\
    printf 'from calc import add\\n\\n\\ndef test_add():\\n    assert add(2, 2) == 4\\n' \\
      > tests/test_add.py && git add -A && git commit -qm base && \\
    printf 'def add(a, b):\\n    return a + b\\n\\n\\ndef sub(a, b):\\n    return a - b\\n' \\
      > calc.py && git commit -qam 'fix sub (future)' && \\
    git tag v2 && git reset -q --hard HEAD~1
WORKDIR /testbed
"""


@pytest.mark.docker
def test_swebench_style_rows_run_on_their_own_images(tmp_path: Path) -> None:
    """A user's Parquet of SWE-bench-style rows naming prebuilt images (here a local image
    shaped like SWE-bench's: repository at /testbed with its future history inside)."""
    require_docker()
    import pyarrow as pa
    import pyarrow.parquet as pq

    from envhub.envs.images import build_env_image
    from envhub.envs.swe.construct.patches import file_diff

    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "Dockerfile").write_text(SWEBENCH_LIKE_DOCKERFILE)
    image = build_env_image(dockerfile=tmp_path / "image" / "Dockerfile").tag
    buggy = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n"
    fixed = buggy[: buggy.rindex("+")] + "-" + buggy[buggy.rindex("+") + 1:]
    test = "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"
    row = {"instance_id": "demo__calc-1", "repo": "demo/calc", "base_commit": "unknown",
           "problem_statement": "sub(5, 3) returns 8", "hints_text": "", "version": "1.0",
           "patch": file_diff("calc.py", buggy, fixed),
           "test_patch": file_diff("tests/test_sub.py", None, test),
           "FAIL_TO_PASS": json.dumps(["tests/test_sub.py::test_sub"]),
           "PASS_TO_PASS": json.dumps(["tests/test_add.py::test_add"]),
           "environment_setup_commit": "", "created_at": "2026-01-01",
           "test_files": json.dumps(["tests/test_add.py", "tests/test_sub.py"]),
           "image": image, "repo_dir": "/testbed"}
    folder = tmp_path / "my-swebench"
    folder.mkdir()
    (folder / "envhub.toml").write_text(
        'name = "my-swebench"\nversion = "0.1.0"\nentrypoint = "env:Env"\n'
        '[tasks]\npath = "tasks.parquet"\n[sandbox]\nkind = "docker"\n')
    (folder / "env.py").write_text(
        "from envhub.envs.builtin.swe_task.env import SWETaskEnv as Env\n")
    pq.write_table(pa.Table.from_pylist([row]), folder / "tasks.parquet")

    loaded = load_env(str(folder))
    harness = SWEHarness.__new__(SWEHarness)
    harness.kind, harness.loaded, harness.env = "docker", loaded, loaded.env
    harness.tasks = {t.id: t for t in loaded.env.load_tasks()}
    harness.scratch, harness.opened = tmp_path, []
    history: dict[str, str] = {}

    async def look_then_solve(sandbox: Sandbox, h: SWEHarness, task: Task) -> None:
        r = await sandbox.exec(f"{GIT} -C /testbed log --all --reflog --oneline", timeout=60,
                               env=GIT_ENV)
        history["log"] = r.stdout
        await oracle(sandbox, h, task)

    gold = asyncio.run(harness.rollout("demo__calc-1", look_then_solve))
    assert gold.resolved and gold.env_failure is None, gold.info
    assert len(history["log"].splitlines()) == 1 and "future" not in history["log"]
    empty = asyncio.run(harness.rollout("demo__calc-1", None))
    assert not empty.resolved and empty.info["failed_tests"] == {
        "tests/test_sub.py::test_sub": "FAILED"}
