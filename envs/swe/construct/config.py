"""The pipeline's pinned configuration (`projects.toml`), validated with pydantic."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_CONFIG = Path(__file__).resolve().parent / "projects.toml"


class Project(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="PyPI distribution name")
    version: str = Field(description="exact version (an sdist of it must exist)")
    repo: str = Field(description="'owner/name' upstream, recorded as the task's repo")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the sdist")
    include: list[str] = Field(description="sdist-relative files or folders ('dir/') to keep")
    mutate: list[str] = Field(description="modules to inject bugs into")
    tests: list[str] = Field(description="test files run to record F2P/P2P")
    pythonpath: str = Field("", description="folder holding the package ('src' layouts)")

    @property
    def slug(self) -> str:
        return f"{self.name}-{self.version}"


class PipelineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int
    tasks_per_project: int = Field(6, ge=1)
    max_candidates: int = Field(90, ge=1)
    max_fail_to_pass: int = Field(40, ge=1)
    max_test_files: int = Field(3, ge=1, description="hidden test files per task at most")
    project: list[Project]


def load_config(path: str | Path = DEFAULT_CONFIG) -> PipelineConfig:
    return PipelineConfig.model_validate(tomllib.loads(Path(path).read_text(encoding="utf-8")))
