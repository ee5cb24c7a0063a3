"""Terminal-bench 1 task folders (`task.yaml`, `Dockerfile`, `run-tests.sh`, `tests/`,
`solution.sh`), read as Harbor tasks the way Harbor's own terminal-bench mapper reads them.

The user's folder is never changed: `stage` writes a Harbor layout of it into a folder the
caller owns (a temporary one, removed when the process ends):

    environment/   the task folder minus task.yaml, tests/, solution.sh, run-tests.sh
                   (the Dockerfile's build context), Dockerfile + `ENV TEST_DIR=/tests`
    tests/         tests/ plus test.sh = run-tests.sh ($TEST_DIR -> /tests), reward 1 on exit 0
    solution/      solve.sh = solution.sh
    task.toml      max_agent_timeout_sec / max_test_timeout_sec, the rest as [metadata]
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from envhub.envs.harbor.task import HarborTaskError

TASK_FILE = "task.yaml"
NOT_CONTEXT = {TASK_FILE, "tests", "solution.sh", "run-tests.sh", "docker-compose.yaml",
               "docker-compose.yml"}
REWARD_SUFFIX = """
_envhub_exit=$?
mkdir -p /logs/verifier
if [ $_envhub_exit -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; \\
else echo 0 > /logs/verifier/reward.txt; fi
exit $_envhub_exit
"""


def is_tbench_task(folder: Path) -> bool:
    return (folder / TASK_FILE).is_file()


def _yaml(path: Path) -> Any:
    """A task's YAML file: refused (HarborTaskError) when not YAML or nested deeper than
    MAX_YAML_DEPTH, counted before the parser recurses, so any process answers alike."""
    import yaml

    from envhub.sdk.limits import MAX_YAML_DEPTH, yaml_too_deep

    text = path.read_text(encoding="utf-8")
    if yaml_too_deep(text):
        raise HarborTaskError(f"{path}: nested too deeply to read (more than {MAX_YAML_DEPTH} "
                              "mappings and sequences inside each other)")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise HarborTaskError(f"{path}: not valid YAML: {e}") from None


def _config(folder: Path) -> dict[str, Any]:
    data = _yaml(folder / TASK_FILE)
    if not isinstance(data, dict) or not isinstance(data.get("instruction"), str) \
            or not data["instruction"].strip():
        raise HarborTaskError(f"{folder}/{TASK_FILE}: needs 'instruction' (the task text)")
    return data


def _check_compose(folder: Path) -> None:
    """A docker-compose.yaml is accepted when it is terminal-bench's single-service default
    (built from this folder's Dockerfile); anything more is refused, not half-run."""

    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if not (folder / name).is_file():
            continue
        compose = _yaml(folder / name) or {}
        services = compose.get("services") if isinstance(compose, dict) else None
        build = next(iter(services.values())).get("build", ".") \
            if isinstance(services, dict) and len(services) == 1 else None
        context = build.get("context", ".") if isinstance(build, dict) else build
        if context not in (".", "./"):
            raise HarborTaskError(
                f"{folder}/{name}: several services or another build context; envhub runs "
                "one container per task from the folder's Dockerfile, so multi-container "
                "tasks are not supported. Remove the extra services (or the compose file) "
                "and put what the task needs in its Dockerfile")


def stage(folder: Path, into: Path) -> Path:
    """Write the Harbor layout of terminal-bench task `folder` to `into` (created); return it."""
    data = _config(folder)
    if not (folder / "Dockerfile").is_file():
        raise HarborTaskError(f"{folder}: missing Dockerfile; a terminal-bench task needs "
                              "task.yaml, Dockerfile, run-tests.sh and tests/")
    if not (folder / "run-tests.sh").is_file():
        raise HarborTaskError(f"{folder}: missing run-tests.sh; a terminal-bench task needs "
                              "task.yaml, Dockerfile, run-tests.sh and tests/")
    if (folder / "solution.yaml").is_file() and not (folder / "solution.sh").is_file():
        raise HarborTaskError(f"{folder}: solution.yaml is not supported (Harbor refuses it "
                              "too); write the solution as solution.sh")
    _check_compose(folder)
    env_dir, tests_dir = into / "environment", into / "tests"
    shutil.copytree(folder, env_dir, ignore=lambda d, names: [
        n for n in names if Path(d) == folder and n in NOT_CONTEXT], symlinks=True)
    with open(env_dir / "Dockerfile", "a", encoding="utf-8") as f:
        f.write("\nENV TEST_DIR=/tests\n")
    if (folder / "tests").is_dir():
        shutil.copytree(folder / "tests", tests_dir, symlinks=True)
    tests_dir.mkdir(exist_ok=True)
    run_tests = (folder / "run-tests.sh").read_text(encoding="utf-8")
    (tests_dir / "test.sh").write_text(run_tests.replace("$TEST_DIR", "/tests").rstrip("\n")
                                       + "\n" + REWARD_SUFFIX, encoding="utf-8")
    if (folder / "solution.sh").is_file():
        (into / "solution").mkdir()
        shutil.copyfile(folder / "solution.sh", into / "solution" / "solve.sh")
    (into / "instruction.md").write_text(data["instruction"].rstrip("\n") + "\n",
                                         encoding="utf-8")
    (into / "task.toml").write_text(_task_toml(folder.name, data), encoding="utf-8")
    return into


def _task_toml(name: str, data: dict[str, Any]) -> str:
    import json

    agent = float(data.get("max_agent_timeout_sec", 360.0))
    tests = float(data.get("max_test_timeout_sec", 60.0))
    meta = {k: v for k, v in data.items() if k != "instruction"
            and isinstance(v, (str, int, float, bool))}
    # JSON strings are valid TOML basic strings
    lines = ["[task]", f"name = {json.dumps(name)}", "", "[agent]", f"timeout_sec = {agent}",
             "", "[verifier]", f"timeout_sec = {tests}", "", "[metadata]"]
    lines += [f"{json.dumps(k)} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}"
              for k, v in meta.items()]
    return "\n".join(lines) + "\n"
