"""The SWE task schema: SWE-bench's field names plus how to test and where to run.

A row of a JSONL/Parquet file of real SWE-bench instances validates as is (F2P/P2P may be
JSON-encoded strings there); the built-in offline tasks add `source_*` fields that say how
to rebuild the repository from a shipped snapshot instead of a prebuilt image.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# SWE-bench's own images keep the repository at /testbed; ours keep it in the sandbox workdir
# (the local sandbox can only write under /workspace).
SWEBENCH_REPO_DIR = "/testbed"
DEFAULT_TEST_CMD = "python3 -m pytest -rA --tb=no -p no:cacheprovider"


class SWETask(BaseModel):
    """One task. F2P tests must go from failing to passing, P2P tests must keep passing."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str = Field(min_length=1, description="unique task id")
    repo: str = Field(description="'owner/name' of the project")
    base_commit: str = Field(description="commit the agent starts from (40 hex)")
    problem_statement: str = Field(description="the issue text shown to the agent")
    hints_text: str = ""
    patch: str = Field(description="gold patch (source files only)")
    test_patch: str = Field(description="adds/updates the hidden tests at grading time")
    FAIL_TO_PASS: list[str] = Field(description="test ids that the fix must make pass")
    PASS_TO_PASS: list[str] = Field(default_factory=list,
                                    description="test ids that must keep passing")
    version: str = ""
    environment_setup_commit: str = ""
    created_at: str = ""
    test_cmd: str = Field(DEFAULT_TEST_CMD,
                          description="shell command run in the repo; test files are appended "
                                      "unless it already names them")
    test_files: list[str] = Field(default_factory=list,
                                  description="test files the command runs (appended to test_cmd)")
    test_env: dict[str, str] = Field(default_factory=dict, description="extra env for test_cmd")
    shell_setup: str = Field("", description="shell run before test_cmd and any python probe "
                                             "(SWE-bench images: activate conda env testbed)")
    log_parser: str = Field("pytest", description="how to read the test log: 'pytest' (-rA)")
    image: str | None = Field(None, description="prebuilt docker image holding the repository "
                                                "(e.g. a SWE-bench per-instance image)")
    repo_dir: str = Field(SWEBENCH_REPO_DIR, description="where the repository lives")
    timeout: float = Field(300.0, gt=0, description="seconds for the whole test command")
    test_timeout: float = Field(60.0, gt=0, description="seconds per test (then it fails)")
    # Offline tasks: the repository is rebuilt from a snapshot shipped with the environment.
    source_archive: str | None = Field(None, description="tar.gz of the project, relative to "
                                                         "the task file")
    source_patch: str = Field("", description="applied to the archive before the base commit")
    source_remove: list[str] = Field(default_factory=list,
                                     description="paths removed before the base commit "
                                                 "(the hidden tests)")
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", "test_files", "source_remove",
                     mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        # SWE-bench's datasets store these lists as JSON strings.
        if isinstance(v, str):
            try:
                return json.loads(v) if v.strip() else []
            except json.JSONDecodeError:
                raise ValueError("expected a list of test ids or its JSON encoding") from None
        return v

    @field_validator("created_at", "version", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        # `datasets` turns ISO dates into timestamps when it reads JSONL.
        if hasattr(v, "isoformat"):
            return v.isoformat().replace("+00:00", "Z")
        return "" if v is None else str(v)

    @field_validator("test_env", "metadata", mode="before")
    @classmethod
    def _json_dict(cls, v: Any) -> Any:
        if isinstance(v, str):
            return json.loads(v) if v.strip() else {}
        return {} if v is None else v

    @field_validator("FAIL_TO_PASS")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("a task needs at least one FAIL_TO_PASS test")
        return v

    @property
    def target_tests(self) -> list[str]:
        return list(dict.fromkeys(self.FAIL_TO_PASS + self.PASS_TO_PASS))

    def command(self) -> str:
        """The full test command (the task's test files appended)."""
        files = [f for f in self.test_files if f not in self.test_cmd]
        return " ".join([self.test_cmd, *files])

    def in_shell(self, command: str) -> str:
        """`command` after the task's shell setup (if any)."""
        return f"{self.shell_setup} && {command}" if self.shell_setup else command


class TaskFileError(ValueError):
    """A task file that cannot be read; the message names the row and field."""


def refuse_swesmith(row: dict[str, Any], where: str) -> None:
    """SWE-smith rows (an `image_name` of a per-repo image, no `test_patch`) are not run: their
    buggy starting state is a git branch named after the instance in SWE-smith's GitHub mirror
    of the repository, which an offline sandbox cannot fetch."""
    if row.get("image_name") and not row.get("test_patch"):
        raise TaskFileError(
            f"{where}: a SWE-smith row ({row.get('instance_id', '?')}, image_name "
            f"{row['image_name']}): not supported as is, since its starting state is a branch "
            "of SWE-smith's GitHub mirror; convert it to SWE-bench's schema (base_commit of "
            "the buggy state in an image of yours as `image`, the tests as `test_patch`)")


def parse_task(row: dict[str, Any], where: str = "task") -> SWETask:
    try:
        return SWETask.model_validate(row)
    except ValidationError as e:
        problems = "; ".join(f"field '{'.'.join(str(p) for p in err['loc'])}': {err['msg']}"
                             for err in e.errors())
        raise TaskFileError(f"{where}: {problems}") from None


def load_swe_tasks(path: str | Path) -> list[SWETask]:
    """Read a JSONL file of tasks (one JSON object a line); duplicate ids are an error."""
    path = Path(path)
    if not path.is_file():
        raise TaskFileError(f"{path}: no such task file")
    tasks: list[SWETask] = []
    seen: set[str] = set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{path}:{n}: not JSON ({e.msg})") from None
        task = parse_task(row, f"{path}:{n}")
        if task.instance_id in seen:
            raise TaskFileError(f"{path}:{n}: duplicate instance_id {task.instance_id!r}")
        seen.add(task.instance_id)
        tasks.append(task)
    return tasks
