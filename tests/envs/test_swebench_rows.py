"""SWE-bench rows in SWE-bench's exact schema, run as they are (`envhub run rows.jsonl`) on an
image found by SWE-bench's own image names; refused at load (exit 2, with the fix) when the
image is missing; rows envhub cannot grade (non-pytest, SWE-smith) refused with the reason."""

from __future__ import annotations

import contextlib
import fcntl
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envhub.envs.errors import EnvLoadError
from envhub.envs.loader import load_env
from envhub.envs.swe.swebench import harness_test_files, image_names
from tests.support import envhub, require_docker

INSTANCE = "Demo__calc-1"  # upper case and `__`: both get SWE-bench's treatment in names
BUGGY = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n"
# An image laid out as SWE-bench's instance images are: the repository at /testbed, HEAD at
# the base commit, the fix in the (future) history, working directory /testbed.
DOCKERFILE = """FROM envhub/base
ENV GIT_AUTHOR_NAME=dev GIT_AUTHOR_EMAIL=dev@x GIT_COMMITTER_NAME=dev GIT_COMMITTER_EMAIL=dev@x
RUN mkdir -p /testbed/tests && cd /testbed && git init -q && \\
    printf 'def add(a, b):\\n    return a + b\\n\\n\\ndef sub(a, b):\\n    return a + b\\n' \\
      > calc.py && \\
    printf 'from calc import add\\n\\n\\ndef test_add():\\n    assert add(2, 2) == 4\\n' \\
      > tests/test_calc.py && git add -A && git commit -qm base && \\
    printf 'def add(a, b):\\n    return a + b\\n\\n\\ndef sub(a, b):\\n    return a - b\\n' \\
      > calc.py && git commit -qam 'fix sub (future)' && \\
    git reset -q --hard HEAD~1
WORKDIR /testbed
"""


def swebench_row(base_commit: str) -> dict:
    """A row with exactly SWE-bench's fields (F2P/P2P JSON-encoded, as in its datasets)."""
    from envhub.envs.swe.construct.patches import file_diff

    fixed = BUGGY[: BUGGY.rindex("+")] + "-" + BUGGY[BUGGY.rindex("+") + 1:]
    # As in SWE-bench, the test_patch touches the file holding the PASS_TO_PASS tests too (the
    # harness runs only the files the test_patch changes).
    tests = "from calc import add\n\n\ndef test_add():\n    assert add(2, 2) == 4\n"
    new = tests.replace("import add", "import add, sub") + (
        "\n\ndef test_sub():\n    assert sub(5, 3) == 2\n")
    return {"repo": "demo/calc", "instance_id": INSTANCE, "base_commit": base_commit,
            "patch": file_diff("calc.py", BUGGY, fixed),
            "test_patch": file_diff("tests/test_calc.py", tests, new),
            "problem_statement": "sub(5, 3) returns 8", "hints_text": "",
            "created_at": "2026-01-01T00:00:00Z", "version": "1.0",
            "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_sub"]),
            "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
            "environment_setup_commit": base_commit}


def test_image_names_follow_swebench_harness() -> None:
    assert image_names("astropy__astropy-12907", "x86_64") == [
        "sweb.eval.x86_64.astropy__astropy-12907:latest",
        "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"]
    arm = image_names("Demo__calc-1", "arm64")
    assert arm[:2] == ["sweb.eval.arm64.demo__calc-1:latest",
                       "swebench/sweb.eval.arm64.demo_1776_calc-1:latest"]
    assert arm[2] == "sweb.eval.x86_64.demo__calc-1:latest"  # x86_64 images run emulated
    patch = ("diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n"
             "diff --git a/tests/data.json b/tests/data.json\n")
    assert harness_test_files(patch) == ["tests/test_x.py"]


def test_rows_envhub_cannot_grade_are_refused_with_the_reason(tmp_path: Path) -> None:
    django = {**swebench_row("0" * 40), "instance_id": "django__django-1",
              "FAIL_TO_PASS": json.dumps(["test_a (admin.tests.AdminTests)"])}
    rows = tmp_path / "django.jsonl"
    rows.write_text(json.dumps(django) + "\n")
    with pytest.raises(EnvLoadError, match="not a pytest id"):
        load_env(str(rows)).env.load_tasks()
    smith = {"instance_id": "oauthlib__oauthlib.1fd52536.combine_file__09vlzwgc",
             "repo": "swesmith/oauthlib__oauthlib.1fd52536", "patch": "diff",
             "problem_statement": "p",
             "FAIL_TO_PASS": ["tests/test_a.py::test_a"], "PASS_TO_PASS": [],
             "image_name": "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536"}
    rows.write_text(json.dumps(smith) + "\n")
    result = envhub("info", str(rows), cwd=tmp_path)
    assert result.returncode == 2 and "SWE-smith row" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    result = envhub("info", str(tmp_path / "missing.jsonl"), cwd=tmp_path)
    assert result.returncode == 2 and "no such file" in result.stderr, result.stderr


def _summary(result, out: Path) -> dict:
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "summary.json").read_text())["overall"]


@pytest.mark.docker
@pytest.mark.slow
@contextlib.contextmanager
def swebench_image_names() -> Iterator[None]:
    """Hold the SWE-bench image names, which are global to the Docker engine, for one test at
    a time across xdist workers. This test and the swebench-row audit (test_audit.py) both tag
    and remove them. When they ran at once, an audit rollout's setup found no repository in
    its image and became an env_failure (seen in CI)."""
    with open(Path(tempfile.gettempdir()) / "envhub-tests-swebench-images.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def test_swebench_row_runs_on_its_image_oracle_solves_and_noop_scores_zero(
        tmp_path: Path) -> None:
    require_docker()
    import pyarrow as pa
    import pyarrow.parquet as pq

    from envhub.envs.images import build_env_image
    from envhub.envs.sandbox.engine import docker_client

    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "Dockerfile").write_text(DOCKERFILE)
    built = build_env_image(dockerfile=tmp_path / "image" / "Dockerfile").tag
    client = docker_client()
    base = client.containers.run(built, "git -C /testbed rev-parse HEAD", remove=True)
    row = swebench_row(base.decode().strip())
    rows = tmp_path / "swebench.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    parquet = tmp_path / "swebench.parquet"
    pq.write_table(pa.Table.from_pylist([row]), parquet)
    with swebench_image_names():
        _run_on_the_harness_names(tmp_path, client, built, rows, parquet)


def _run_on_the_harness_names(tmp_path: Path, client: Any, built: str, rows: Path,
                              parquet: Path) -> None:
    local, pulled = image_names(INSTANCE)[:2]
    for name in (local, pulled):  # a stale tag from an interrupted run
        if client.images.list(name=name.split(":")[0]):
            client.images.remove(name)

    missing = envhub("run", str(rows), "--agent", "oracle", "-q", cwd=tmp_path)
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert f"docker pull {pulled}" in missing.stderr and local in missing.stderr
    assert "Traceback" not in missing.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was written

    try:
        # The name a `docker pull` from SWE-bench's namespace gives: the oracle solves it.
        client.images.get(built).tag(pulled.split(":")[0], "latest")
        [task] = load_env(str(rows)).env.load_tasks()
        assert task.data["image"] == pulled and "conda activate testbed" in task.instruction
        gold = _summary(envhub("run", str(rows), "--agent", "oracle", "-q",
                               "--out", str(tmp_path / "gold"), cwd=tmp_path), tmp_path / "gold")
        assert gold["rollouts"] == 1 and gold["resolved"] == 1, gold
        client.images.remove(pulled)
        # The name the harness gives a local build; a Parquet file; an agent that does nothing.
        client.images.get(built).tag(local.split(":")[0], "latest")
        noop = _summary(envhub("run", str(parquet), "--agent", "true", "-q",
                               "--out", str(tmp_path / "noop"), cwd=tmp_path), tmp_path / "noop")
        assert noop["rollouts"] == 1 and noop["resolved"] == 0, noop
        assert noop["env_failure"] == 0, noop
    finally:
        for name in (local, pulled):
            if client.images.list(name=name.split(":")[0]):
                client.images.remove(name)
