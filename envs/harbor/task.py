"""Reading one Harbor task folder into a validated `HarborTask`.

`task.toml` follows Harbor's schema: `[task]`/`[metadata]` are free-form, `[verifier]`,
`[agent]` and `[environment]` carry timeouts and resources. Harbor's older spellings
(`memory = "4G"`, `storage = "10G"`) are accepted; unknown keys are ignored, as Harbor does.

envhub's own settings live under `[metadata.envhub]` (free-form for Harbor, so the folder stays
a valid Harbor task):

    [metadata.envhub]
    artifacts = ["/app"]        # what grading copies from the agent's container (default: the
                                # Dockerfile's WORKDIR); never the toolchain (/usr, /etc, ...)
    artifacts_max_mb = 256      # past this the agent's output is ungradable (0, not dropped)
"""

from __future__ import annotations

import posixpath
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
UNIT_MB = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}


class HarborTaskError(ValueError):
    """A task folder that is not a valid Harbor task; the message names the file and fix."""


def size_mb(value: Any) -> int:
    """'4G' / '512M' / 2048 → megabytes."""
    if isinstance(value, (int, float)):
        return int(value)
    match = SIZE_RE.match(str(value))
    if not match:
        raise ValueError(f"cannot read size {value!r}; use e.g. 2048 (MB) or '4G'")
    return int(float(match.group(1)) * UNIT_MB[match.group(2).upper()])


class VerifierConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    timeout_sec: float = Field(600.0, gt=0)


class EnvironmentConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    build_timeout_sec: float = Field(600.0, gt=0)
    docker_image: str | None = None
    cpus: float = Field(1.0, gt=0)
    memory_mb: int = Field(2048, ge=64)
    storage_mb: int = Field(10240, ge=1)
    allow_internet: bool = True

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "memory" in data and "memory_mb" not in data:
                data["memory_mb"] = size_mb(data.pop("memory"))
            if "storage" in data and "storage_mb" not in data:
                data["storage_mb"] = size_mb(data.pop("storage"))
        return data


# Where the grader's own toolchain lives (interpreters, site-packages, shells, the dynamic
# loader's config, root's home) and the verifier's own folders: a declared artifact path may
# not be, hold, or lie inside any of them, or the agent's files would replace the grader's.
TOOLCHAIN_ROOTS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc",
                   "/root", "/proc", "/sys", "/dev", "/boot", "/run", "/var/run", "/tests",
                   "/logs", "/solution")


def overlaps(path: str, root: str) -> bool:
    """True when `path` is `root`, lies inside it, or holds it (absolute, normalized paths)."""
    def inside(a: str, b: str) -> bool:
        return a == b or a.startswith(b.rstrip("/") + "/")
    return inside(path, root) or inside(root, path)


class GradingConfig(BaseModel):
    """`[metadata.envhub]`: what the fresh grader container receives from the agent's."""

    model_config = ConfigDict(extra="ignore")
    artifacts: list[str] | None = None  # absolute paths; None: the Dockerfile's WORKDIR
    artifacts_max_mb: float = Field(256.0, gt=0)


class TaskConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    task: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=lambda: VerifierConfig.model_validate({}))
    agent: AgentConfig = Field(default_factory=lambda: AgentConfig.model_validate({}))
    environment: EnvironmentConfig = Field(
        default_factory=lambda: EnvironmentConfig.model_validate({}))


@dataclass
class HarborTask:
    folder: Path
    name: str
    instruction: str
    config: TaskConfig
    workdir: str  # the Dockerfile's last WORKDIR (where solve.sh and test.sh start)
    artifacts: tuple[str, ...] = ()  # copied from the agent's container into the grader's
    artifacts_max_bytes: int = 256 << 20

    @property
    def dockerfile(self) -> Path:
        return self.folder / "environment" / "Dockerfile"

    @property
    def tests_dir(self) -> Path:
        return self.folder / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.folder / "solution"

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()


def _workdir(dockerfile: Path) -> str:
    found = re.findall(r"(?im)^\s*WORKDIR\s+(\S+)\s*$", dockerfile.read_text(encoding="utf-8"))
    return found[-1] if found else "/"


def _refuse_steps(folder: Path) -> None:
    """Multi-step tasks (`[[steps]]` in task.toml, steps/<name>/) are refused: each step's agent
    phase continues the previous step's container, while envhub grades a rollout once, in a
    fresh sandbox holding only the agent's changes (the containment contract). Running steps
    would need grading inside the agent's own container between steps."""
    try:
        declared = "steps" in tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        declared = False
    if declared or (folder / "steps").is_dir():
        raise HarborTaskError(
            f"{folder}: a multi-step Harbor task ([[steps]] in task.toml, steps/); envhub "
            "grades each rollout once in a fresh sandbox, so steps that build on each other's "
            "container are not supported. Split the steps into separate task folders (each "
            "with its own instruction.md, tests/ and a Dockerfile that sets up the state the "
            "step starts from)")


def _grading(folder: Path, config: TaskConfig, workdir: str) -> tuple[tuple[str, ...], int]:
    """The declared artifact paths (checked against the toolchain) and their byte cap."""
    raw = config.metadata.get("envhub", {})
    try:
        grading = GradingConfig.model_validate(raw if isinstance(raw, dict) else {})
    except ValidationError as e:
        raise HarborTaskError(f"{folder}/task.toml [metadata.envhub]: {e}") from None
    declared = grading.artifacts if grading.artifacts is not None else [workdir]
    where = ("[metadata.envhub] artifacts" if grading.artifacts is not None
             else "the default artifact path (the Dockerfile's WORKDIR)")
    paths = []
    for path in declared:
        clean = posixpath.normpath(path) if path.startswith("/") else ""
        if not clean or clean.startswith("//"):
            raise HarborTaskError(f"{folder}/task.toml: {where} {path!r} is not an absolute "
                                  "path; list absolute paths such as \"/app\"")
        bad = [root for root in TOOLCHAIN_ROOTS if overlaps(clean, root)]
        if clean == "/" or bad:
            raise HarborTaskError(
                f"{folder}: {where} {clean!r} overlaps {', '.join(bad) or '/'}: envhub grades "
                "in a fresh container from the task image with only the agent's output paths "
                "copied in, never the toolchain or the verifier's folders, so this task cannot "
                "be graded that way. Set WORKDIR to the folder the agent works in, or list the "
                "output paths in task.toml: [metadata.envhub] artifacts = [\"/app/out\"]")
        paths.append(clean)
    return tuple(dict.fromkeys(paths)), int(grading.artifacts_max_mb * (1 << 20))


def load_harbor_task(folder: str | Path) -> HarborTask:
    folder = Path(folder)
    _refuse_steps(folder)
    for rel in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh"):
        if not (folder / rel).is_file():
            raise HarborTaskError(f"{folder}: missing {rel}; a Harbor task folder needs "
                                  "task.toml, instruction.md, environment/Dockerfile and "
                                  "tests/test.sh")
    try:
        raw = tomllib.loads((folder / "task.toml").read_text(encoding="utf-8"))
        config = TaskConfig.model_validate(raw)
    except tomllib.TOMLDecodeError as e:
        raise HarborTaskError(f"{folder}/task.toml: not valid TOML: {e}") from None
    except (ValidationError, ValueError) as e:
        raise HarborTaskError(f"{folder}/task.toml: {e}") from None
    name = str(config.task.get("name") or folder.name)
    workdir = _workdir(folder / "environment" / "Dockerfile")
    artifacts, max_bytes = _grading(folder, config, workdir)
    return HarborTask(folder=folder, name=name,
                      instruction=(folder / "instruction.md").read_text(encoding="utf-8"),
                      config=config, workdir=workdir, artifacts=artifacts,
                      artifacts_max_bytes=max_bytes)


def load_harbor_tasks(root: str | Path) -> list[HarborTask]:
    """Every task folder directly under `root` (sorted by folder name); names must be unique."""
    root = Path(root)
    if not root.is_dir():
        raise HarborTaskError(f"{root}: no such folder of Harbor tasks")
    if (root / "task.toml").is_file():  # the folder is itself one task
        return [load_harbor_task(root)]
    tasks = [load_harbor_task(p) for p in sorted(root.iterdir()) if (p / "task.toml").is_file()]
    names = [t.name for t in tasks]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise HarborTaskError(f"{root}: duplicate task names {', '.join(duplicates)}")
    return tasks
