"""`envhub.toml`: the environment package manifest, validated with pydantic."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


def name_from(text: str, fallback: str) -> str:
    """A package name (NAME_RE) made from a file or folder name: lower case, runs of other
    characters as '-', at most 64; `fallback` when nothing is left."""
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")[:64] or fallback
SEMVER_RE = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")


class ManifestError(ValueError):
    """A bad `envhub.toml`; the message names the field and the fix."""


COMPONENT_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")
# OpenAI's rule for function (tool) names; the environment's own tools must follow it too.
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# TOML gives typed values, so every model here is strict: "no" is not a boolean, "2" not a
# number (pydantic's lax mode would read them as False and 2 without a word).
STRICT = ConfigDict(extra="forbid", strict=True)
# Tables and arrays nested deeper than this are refused: no manifest needs it, and a deep one
# (a hostile package) would exhaust the parser's or the JSON encoder's recursion.
MAX_NESTING = 32


DEFAULT_DISK_MB = 4096  # a sandbox's disk bound when the manifest does not say


class SandboxSpec(BaseModel):
    model_config = STRICT
    kind: str = Field(
        "auto",
        description="'none': the environment needs no sandbox (an in-process file store is "
        "used); 'auto': best available; otherwise the preferred backend, a name of the kinds "
        "table (envs/sandbox/kinds.py) or a dotted path (--sandbox overrides)",
    )
    image: str | None = Field(None, description="docker image tag to run tasks in")
    dockerfile: str | None = Field(None, description="Dockerfile path, relative to the package")
    cpus: float = Field(1.0, gt=0, le=64)
    memory_mb: int = Field(2048, ge=64, le=1 << 20)
    disk_mb: int = Field(DEFAULT_DISK_MB, ge=16, le=1 << 22, description=(
        "everything a rollout's sandbox may write (its workdir, /tmp, /dev/shm; docker: its "
        "writable layer where the engine can bound it), in MB: a write past it gets ENOSPC "
        "inside the sandbox. `--sandbox-disk-mb` sets it for a whole run; `envhub doctor` "
        "says how this machine enforces it"))
    network: bool = Field(False, description="sandboxes have no network unless this is true")
    host_paths: list[str] = Field(
        [], description="local sandboxes: absolute host paths bound read-only beyond the system "
        "folders and the few /etc files they always see (e.g. a toolchain under /opt); nothing "
        "else of the host is visible (envs/sandbox/host_view.py)")
    exec_timeout_s: float = Field(120.0, gt=0)
    setup_timeout_s: float = Field(600.0, gt=0)

    supported_kinds: list[str] | None = Field(
        None, description="sandbox kinds the environment works in (None: any); 'plain' is the "
        "local kind without bubblewrap (plain processes in a host folder): leave it out and "
        "such runs are refused up front with the fix")

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        from envhub.envs.sandbox.kinds import check_kind  # the sandbox package imports us

        return check_kind(v, manifest=True)

    @field_validator("host_paths")
    @classmethod
    def _host_paths(cls, v: list[str]) -> list[str]:
        for path in v:
            if not path.startswith("/") or os.path.normpath(path) in ("/", "/proc", "/dev"):
                raise ValueError(f"{path!r}: give an absolute path of a host folder or file "
                                 "(not / itself)")
        return [os.path.normpath(p) for p in v]

    @field_validator("supported_kinds")
    @classmethod
    def _supported(cls, v: list[str] | None) -> list[str] | None:
        from envhub.envs.sandbox.kinds import PLAIN, check_kind

        if v is not None and not v:
            raise ValueError("list at least one kind, or leave the field out (any kind)")
        return v if v is None else [k if k == PLAIN else check_kind(k) for k in v]


MCP_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")  # no '_': '__' separates it from tools


class McpServerSpec(BaseModel):
    """`[mcp.NAME]`: an MCP server the environment ships, started over stdio INSIDE the
    rollout's sandbox (docker or local; the agent's own, so its tools act on the agent's
    workspace, never on the host). Its tools are offered to the built-in agent as
    `NAME__tool` (envs/mcp/client.py)."""

    model_config = STRICT
    command: list[str] = Field(..., description="argv run inside the sandbox, e.g. "
                               '["python3", "/run/envhub-mcp/NAME/server.py"]')
    files: list[str] = Field(
        [], description="files or folders of the package the server needs (its code), seen "
        "read-only at /run/envhub-mcp/NAME/<path> (local: by the server only; docker: copied)")
    env: dict[str, str] = Field({}, description="environment variables of the server")
    cwd: str | None = Field(None, description="working folder inside the sandbox (default: "
                            "the sandbox's workdir)")
    tools: list[str] | None = Field(
        None, description="the server's tools to offer (its own names); default: all it lists")
    prefix: str | None = Field(
        None, description="prefix of the offered names; default 'NAME__' ('' offers the "
        "server's own names)")
    startup_timeout_s: float = Field(30.0, gt=0, le=600,
                                     description="start, handshake and tool listing")
    call_timeout_s: float = Field(60.0, gt=0, le=3600, description="one tool call")

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        if not v or not v[0] or any("\0" in a for a in v):
            raise ValueError('give the server\'s argv, e.g. ["python3", "server.py"]')
        return v

    @field_validator("files")
    @classmethod
    def _files(cls, v: list[str]) -> list[str]:
        for path in v:
            norm = os.path.normpath(path)
            if os.path.isabs(path) or norm == "." or norm.startswith(".."):
                raise ValueError(f"{path!r}: give a path inside the package, e.g. \"server.py\"")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return v

    @field_validator("tools")
    @classmethod
    def _allowed(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError("list each of the server's tools once (leave the field out to "
                             "offer all of them)")
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str | None) -> str | None:
        if v is not None and v and not TOOL_NAME_RE.match(v):
            raise ValueError("use letters, digits, '_' or '-'")
        return v


class RewardEntry(BaseModel):
    """A reward component of the package's own: `name = { weight = 0.2, component = "m:C" }`."""

    model_config = STRICT
    weight: float = Field(1.0, description="weight of its events in the composite reward")
    component: str = Field(..., description="'module:Class' in the package, or a dotted path "
                           "'package.module:Class' (a RewardComponent, envs/rewards/base.py)")


class JudgeSpec(BaseModel):
    """A model-judged reward component (envs/rewards/judge): `[rewards.judge]` (any key; a
    table without `component` is a judge). The agent's declared output (`Verdict.output`) is
    shown to a judge model as delimited data with the rubric; its constrained JSON verdict
    scores each criterion from 0 to `scale`, and the event's value is their weighted mean / scale,
    in [0, 1]."""

    model_config = STRICT
    weight: float = Field(1.0, description="weight of its events in the composite reward")
    rubric: str | None = Field(None, max_length=20_000,
                               description="what a good output is, told to the judge")
    rubric_file: str | None = Field(None, description="the rubric in a file of the package")
    criteria: dict[str, float] = Field(
        default_factory=lambda: {"quality": 1.0},
        description="criterion -> weight (> 0); the judge scores each (name them in the rubric)")
    scale: int = Field(10, ge=1, le=100, description="each criterion scores 0..scale")
    mode: Literal["single", "group"] = Field(
        "single", description="'single': one request per output; 'group': the judge sees the "
        "group's outputs together and scores them side by side (GRPO needs only their order)")
    model: str | None = Field(None, description="judge model name; default the served model")
    base_url: str | None = Field(
        None, description="an OpenAI-compatible endpoint (.../v1); default the run's gateway, "
        "through a session recorded as not trainable")
    api_key_env: str | None = Field(
        None, description="environment variable holding base_url's API key (never the key)")
    reference_field: str | None = Field(
        None, description="a field of the task row shown to the judge as the reference answer")
    max_output_chars: int = Field(8000, ge=100, le=200_000,
                                  description="an output is cut to this before judging")
    reason_chars: int = Field(300, ge=0, le=4000,
                              description="length of the verdict's reason (0: no reason asked)")
    max_tokens: int = Field(512, ge=16, le=32768, description="judge completion tokens per call")
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_calls: int = Field(1000, ge=1, description="judge requests per run (retries count, "
                           "cached verdicts do not); past it scoring fails as env_failure")
    retries: int = Field(2, ge=0, le=10, description="retries of a transport error, 429 or 5xx")
    timeout_s: float = Field(120.0, gt=0, le=3600)
    cache: str | None = Field(
        None, description="SQLite file of verdicts by input hash; default "
        "$ENVHUB_CACHE/judge.sqlite (~/.cache/envhub); 'off': memory only")

    @field_validator("criteria")
    @classmethod
    def _criteria(cls, v: dict[str, float]) -> dict[str, float]:
        if not v or len(v) > 16:
            raise ValueError("give 1 to 16 criteria, name -> weight")
        for name, w in v.items():
            if not COMPONENT_KEY_RE.match(name) or len(name) > 64:
                raise ValueError(f"criterion {name!r}: use letters, digits, '_' or '-'")
            if not w > 0:
                raise ValueError(f"criterion {name!r}: give a weight > 0")
        return v

    @model_validator(mode="after")
    def _one_rubric(self) -> JudgeSpec:
        if (self.rubric is None) == (self.rubric_file is None):
            raise ValueError("give exactly one of rubric = \"...\" or rubric_file = \"rubric.md\"")
        return self


def _reward_kind(v: Any) -> str:
    """A `[rewards]` value's member: a table with `component` is a component of the package's
    own, any other table a judge, anything else a weight."""
    if isinstance(v, dict):
        return "RewardEntry" if "component" in v else "JudgeSpec"
    return type(v).__name__ if isinstance(v, RewardEntry | JudgeSpec) else "float"


RewardValue = Annotated[
    Annotated[float, Tag("float")] | Annotated[RewardEntry, Tag("RewardEntry")]
    | Annotated[JudgeSpec, Tag("JudgeSpec")], Discriminator(_reward_kind)]


class AgentLimits(BaseModel):
    model_config = STRICT
    max_turns: int = Field(30, ge=1)
    max_tokens: int = Field(32768, ge=1, description="total completion tokens per rollout")
    max_tokens_per_turn: int = Field(2048, ge=1, description="completion tokens per model call")
    time_limit_s: float = Field(600.0, gt=0)
    time_limit_is_failure: bool = Field(
        False, description="true: reaching time_limit_s ends the rollout as env_failure (the "
        "machine was too slow), never graded; for environments whose limits are in turns and "
        "tokens, so that machine load cannot decide a reward")
    context_budget: int = Field(8192, ge=256, description="prompt tokens before context management")


class TasksSource(BaseModel):
    model_config = STRICT
    path: str | None = Field(None, description="JSONL/Parquet file in the package")
    dataset: str | None = Field(None, description="a `datasets` hub id (needs network)")
    split: str = "train"
    stratify: str | None = Field(
        None, description="a field of each task's row (e.g. a problem family or difficulty): "
        "`envhub train` interleaves its values by their share within each pass over the tasks, "
        "so every stretch of steps trains on the whole mix (without it a stretch can draw "
        "mostly one kind, and its mean reward moves with the draw rather than with learning)")


class Manifest(BaseModel):
    model_config = STRICT
    name: str
    version: str
    description: str = ""
    entrypoint: str = Field(..., description="'module:Class' (module relative to the package)")
    tasks: TasksSource = Field(default_factory=TasksSource)
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    tools: list[str] = Field(
        default_factory=lambda: ["bash", "str_replace_editor", "submit"],
        description="tools offered to the agent: names of the shared tool table "
        "(envs/tools/__init__.py) or of the environment's own tools (ToolProvider); the "
        "loader refuses any other name (`check_tools`)")
    rewards: dict[str, RewardValue] = Field(
        default_factory=lambda: dict[str, float | RewardEntry | JudgeSpec](outcome=1.0),
        description="reward components and their weights (envs/rewards/__init__.py)")
    agent: AgentLimits = Field(default_factory=AgentLimits)
    mcp: dict[str, McpServerSpec] = Field(
        default_factory=dict, description="[mcp.NAME]: MCP servers run over stdio inside the "
        "rollout's sandbox; their tools are offered to the built-in agent as NAME__tool")
    dependencies: list[str] = Field(default_factory=list, description="pip requirement strings")
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("use lowercase letters, digits, '.', '_' or '-', at most 64 chars")
        return v

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[str]) -> list[str]:
        for name in v:
            if not TOOL_NAME_RE.match(name):
                raise ValueError(f"tool name {name!r} is not valid; use letters, digits, '_' "
                                 "or '-' (at most 64), e.g. one of " + ", ".join(_tool_names()))
        twice = sorted({name for name in v if v.count(name) > 1})
        if twice:
            raise ValueError(f"tool {twice[0]!r} is listed twice; list each tool once")
        return v

    @field_validator("mcp")
    @classmethod
    def _mcp(cls, v: dict[str, McpServerSpec]) -> dict[str, McpServerSpec]:
        for name, spec in v.items():
            if not MCP_NAME_RE.match(name):
                raise ValueError(f"[mcp.{name}]: name a server with lowercase letters, digits "
                                 "or '-' (at most 32; its tools are offered as NAME__tool)")
            prefix = f"{name}__" if spec.prefix is None else spec.prefix
            for tool in spec.tools or []:
                if not TOOL_NAME_RE.match(prefix + tool):
                    raise ValueError(f"[mcp.{name}] tools: {prefix + tool!r} is not a valid "
                                     "tool name (letters, digits, '_' or '-', at most 64 with "
                                     "the prefix); shorten the prefix or leave the tool out")
        return v

    @model_validator(mode="after")
    def _mcp_needs_a_sandbox(self) -> Manifest:
        if self.mcp and self.sandbox.kind == "none":
            raise ValueError("[mcp] servers run inside the rollout's sandbox: set [sandbox] "
                             "kind to auto, local or docker (not 'none')")
        return self

    def mcp_tool_name(self, server: str, tool: str) -> str:
        """The name the agent sees for `tool` of `[mcp.server]`."""
        prefix = self.mcp[server].prefix
        return (f"{server}__" if prefix is None else prefix) + tool

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if not SEMVER_RE.match(v):
            raise ValueError("use a semantic version such as 1.0.0")
        return v

    @field_validator("rewards")
    @classmethod
    def _rewards(cls, v: dict[str, float | RewardEntry | JudgeSpec]
                 ) -> dict[str, float | RewardEntry | JudgeSpec]:
        from envhub.envs.rewards import REWARDS
        from envhub.sdk.plugins import is_dotted_path

        for key, entry in v.items():
            if isinstance(entry, JudgeSpec):
                if not COMPONENT_KEY_RE.match(key):
                    raise ValueError(f"{key!r}: name a judge with letters, digits, '_' or '-'")
                continue
            if isinstance(entry, RewardEntry):
                if not COMPONENT_KEY_RE.match(key) or not is_dotted_path(entry.component):
                    raise ValueError(f"{key!r}: name a component with letters, digits, '_' or "
                                     "'-' and give component = 'module:Class'")
                continue
            kind, _, sub = key.partition(".")
            if kind not in (*REWARDS, "custom") or (key.endswith(".") or "." in sub):
                raise ValueError(
                    f"unknown reward weight {key!r}; use {', '.join(REWARDS)}, "
                    "'process.<signal>', 'custom.<name>', or a component of your own: "
                    f"{key.split('.')[0]} = {{ weight = 1.0, component = \"module:Class\" }}"
                    f" (or a model judge: [rewards.{key.split('.')[0]}] rubric = \"...\")")
        return v

    def reward_weights(self) -> dict[str, float]:
        """Manifest key -> weight, for built-in and own components alike."""
        return {k: e.weight if isinstance(e, RewardEntry | JudgeSpec) else float(e)
                for k, e in self.rewards.items()}

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, v: str) -> str:
        if ":" not in v:
            raise ValueError("use 'module:Class', e.g. 'env:MyEnv'")
        return v


def _tool_names() -> tuple[str, ...]:
    from envhub.envs.tools import TOOL_NAMES  # the tools package imports the sandbox, then us

    return TOOL_NAMES


# pydantic's type errors -> (what TOML value the field takes, an example to write)
TOML_TYPES = {"bool_type": ("a boolean", "true or false, no quotes"),
              "int_type": ("a whole number", "e.g. 2048, no quotes"),
              "float_type": ("a number", "e.g. 1.5, no quotes"),
              "string_type": ("a string", 'e.g. "text", in quotes'),
              "list_type": ("a list", 'e.g. ["a", "b"]'),
              "dict_type": ("a table", "e.g. [section] or { key = 1 }")}


UNION_TAGS = {"float", "int", "str", "bool", "RewardEntry", "JudgeSpec"}


def _explain(err: Any) -> str:
    """pydantic's message, plus the fix where pydantic's own words do not give one."""
    if err["type"] in TOML_TYPES:
        key = str(err["loc"][-1]) if err["loc"] else "value"
        got, (noun, example) = err.get("input"), TOML_TYPES[err["type"]]
        if err["type"] == "bool_type" and isinstance(got, str):
            fix = "true" if got.strip().lower() in ("yes", "y", "true", "on", "1") else "false"
            return f"{got!r} is a string, not a boolean; write {key} = {fix} (no quotes)"
        return f"{got!r} is not {noun}; write {example}"
    if err["type"] == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        model: Any = Manifest
        for part in err["loc"][:-1]:
            fields = getattr(model, "model_fields", None)
            field = fields.get(str(part)) if isinstance(fields, dict) else None
            model = field.annotation if field is not None else None
        if isinstance(model, type) and issubclass(model, BaseModel):
            return (f"unknown field; remove it or fix its spelling (allowed here: "
                    f"{', '.join(model.model_fields)})")
        return "unknown field; remove it or fix its spelling"
    if err["type"] == "missing":
        return "required; add it"
    return str(err["msg"])


def _too_deep(data: dict[str, Any]) -> str | None:
    """The dotted location of the first value nested over MAX_NESTING levels, else None
    (iterative: the point is to survive input that recursion would not)."""
    stack: list[tuple[Any, list[str]]] = [(data, [])]
    while stack:
        value, loc = stack.pop()
        if len(loc) > MAX_NESTING:
            return ".".join(loc[:3]) + "..."
        if isinstance(value, dict):
            stack.extend((v, [*loc, str(k)]) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, [*loc, str(i)]) for i, v in enumerate(value))
    return None


def parse_manifest(text: str, source: str = "envhub.toml") -> Manifest:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(f"{source}: not valid TOML: {e}") from None
    except RecursionError:  # deeper than the parser's recursion goes: the same answer as below
        raise ManifestError(f"{source}: nested more than {MAX_NESTING} levels deep; "
                            "flatten it") from None
    where = _too_deep(data)
    if where is not None:
        raise ManifestError(f"{source}: field '{where}': nested more than {MAX_NESTING} levels "
                            "deep; flatten it")
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        problems: dict[str, str] = {}
        for err in e.errors():
            # A union (`rewards.x`: a number or a RewardEntry) reports once per member, tagged
            # with the member's name; the first member's words are enough.
            loc = [str(p) for p in err["loc"] if str(p) not in UNION_TAGS]
            problems.setdefault(".".join(loc) or "(root)", _explain(err))
        raise ManifestError(f"{source}: " + "; ".join(
            f"field '{loc}': {why}" for loc, why in problems.items())) from None


def load_manifest(folder: str | Path) -> Manifest:
    path = Path(folder) / "envhub.toml"
    if not path.is_file():
        raise ManifestError(f"{path}: missing; an environment folder needs an envhub.toml "
                            "(create one with `envhub init NAME`), or give a Harbor task "
                            "folder (task.toml, instruction.md, environment/Dockerfile, "
                            "tests/test.sh), a terminal-bench task (task.yaml) or a folder "
                            "of such tasks")
    manifest = parse_manifest(path.read_text(encoding="utf-8"), str(path))
    for name, spec in manifest.mcp.items():
        missing = [rel for rel in spec.files if not (Path(folder) / rel).exists()]
        if missing:
            raise ManifestError(f"{path}: field 'mcp.{name}.files': {missing[0]!r} is not in the "
                                "package; add it or fix the path")
    return manifest
