"""Loading an environment package: resolve a reference, validate its manifest, import its
entrypoint, read its tasks through `datasets`.

A reference is, in this order: a folder path (`./my-env`), a built-in name (`arith`), a
registry reference (`owner/name@version`, through `envhub.registry` when installed), or the
name of an installed registry package. Datasets run as they are come first: `hf:ID` and
`.jsonl`/`.parquet` files (SWE-bench rows), `rg:NAME[...]` (a reasoning-gym dataset, envs/rg),
`vf:PATH|ID` (a verifiers environment, envs/verifiers).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.envs.builtin import BUILTIN_ROOT, builtin_folders
from envhub.envs.environment import Environment, Task, ToolProvider
from envhub.envs.errors import EnvLoadError, EnvNotFound
from envhub.envs.manifest import (
    JudgeSpec,
    Manifest,
    ManifestError,
    RewardEntry,
    TasksSource,
    load_manifest,
    name_from,
)
from envhub.envs.rewards import RewardComponent, make_components

REGISTRY_REF_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*(@\S+)?$")
DATASET_PREFIX = "hf:"
RG_PREFIX = "rg:"
VF_PREFIX = "vf:"
ROW_FILE_SUFFIXES = (".jsonl", ".parquet")
ID_FIELDS = ("id", "task_id", "instance_id")
INSTRUCTION_FIELDS = ("instruction", "problem_statement", "prompt", "question")


@dataclass
class LoadedEnv:
    """An environment ready to run: its folder, validated manifest and entrypoint instance."""

    folder: Path
    manifest: Manifest
    env: Environment
    ref: str
    rewards: dict[str, RewardComponent] = field(default_factory=make_components)

    @property
    def name(self) -> str:
        return self.manifest.name


@dataclass(frozen=True)
class Catalog:
    """Where references that are neither folders nor built-in names are found: given by the
    caller (the orchestrator passes the registry's), so this package imports no registry.
    `resolve` maps `owner/name@version` to its installed folder (installing it if it must);
    `installed` lists (reference, folder) of what is installed, newest last."""

    resolve: Callable[[str], Path] | None = None
    installed: Callable[[], list[tuple[str, Path]]] = list


BUILTINS = Catalog()  # folders and built-in names only


def available_envs(catalog: Catalog = BUILTINS) -> dict[str, str]:
    """Name → where it comes from ("builtin" or an installed registry reference)."""
    found = {name: "builtin" for name in builtin_folders()}
    for ref, _path in catalog.installed():
        found.setdefault(ref, "installed")
    return found


def resolve_folder(ref: str, catalog: Catalog = BUILTINS) -> Path:
    """The package folder a reference names; EnvNotFound lists what is available."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path.resolve()
    if ref.startswith((".", "/", "~")) or ref.endswith("/"):
        raise EnvNotFound(f"{ref}: no such folder; give the path of a folder holding an "
                          "envhub.toml (create one with `envhub init NAME`)")
    builtins = builtin_folders()
    if ref in builtins:
        return builtins[ref]
    if REGISTRY_REF_RE.match(ref):
        if catalog.resolve is None:
            raise EnvNotFound(f"'{ref}' looks like a registry reference but no registry was "
                              "given to the loader; pass a folder path instead")
        try:
            return Path(catalog.resolve(ref))
        except Exception as e:  # the registry's errors state their fix
            raise EnvNotFound(f"'{ref}': {e}") from e
    # A bare name matches an installed `owner/name@version`; the last listed (newest) wins.
    matches = [folder for name, folder in catalog.installed()
               if name == ref or name.split("/")[-1].split("@")[0] == ref]
    if matches:
        return matches[-1]
    names = ", ".join(sorted(available_envs(catalog))) or "(none)"
    raise EnvNotFound(f"unknown environment '{ref}'; available: {names}. Give a built-in name, "
                      "a folder path (./my-env) or a registry reference owner/name@version")


def load_env(ref: str, catalog: Catalog = BUILTINS) -> LoadedEnv:
    """Resolve, validate and instantiate. Raises ManifestError / EnvNotFound / EnvLoadError."""
    if ref.startswith(DATASET_PREFIX) or Path(ref).suffix in ROW_FILE_SUFFIXES:
        return load_swe_rows(ref)
    if ref.startswith(RG_PREFIX):
        return load_reasoning_gym(ref)
    if ref.startswith(VF_PREFIX):
        return load_verifiers(ref)
    folder = resolve_folder(ref, catalog)
    if not (folder / "envhub.toml").is_file() and task_folder_kind(folder) is not None:
        return load_task_folders(folder, ref)
    manifest = load_manifest(folder)
    cls = import_entrypoint(folder, manifest)
    try:
        env = cls(folder, manifest)
    except Exception as e:
        raise EnvLoadError(f"{folder}: constructing {manifest.entrypoint} failed: "
                           f"{type(e).__name__}: {e}") from e
    missing = [m for m in ("load_tasks", "setup", "tools", "solve", "verify")
               if not callable(getattr(env, m, None))]
    if missing:
        raise EnvLoadError(f"{folder}: {manifest.entrypoint} lacks {', '.join(missing)}; "
                           "implement the Environment protocol (envhub.envs.environment)")
    if not hasattr(env, "manifest"):
        env.manifest = manifest  # type: ignore[misc]
    loaded = LoadedEnv(folder=folder, manifest=manifest, env=env, ref=ref,
                       rewards=reward_components(folder, manifest))
    check_tools(loaded)
    return loaded


def task_folder_kind(folder: Path) -> str | None:
    """'harbor' / 'terminal-bench' when `folder` is such a task, or a folder of them (a
    dataset); None otherwise."""
    from envhub.envs.harbor.tbench import is_tbench_task

    for candidates in ([folder], sorted(p for p in folder.iterdir() if p.is_dir())):
        if any((p / "task.toml").is_file() for p in candidates):
            return "harbor"
        if any(is_tbench_task(p) for p in candidates):
            return "terminal-bench"
    return None


def load_task_folders(folder: Path, ref: str) -> LoadedEnv:
    """A bare Harbor task folder, a folder of them, or terminal-bench 1 task folder(s), run as
    they are: a synthetic environment over the folder with the built-in terminal-task's
    manifest and code (envs/builtin/terminal_task). Terminal-bench folders are read through a
    Harbor layout staged in a temporary folder (envs/harbor/tbench.py); the user's folder is
    never written to."""
    from envhub.envs.builtin.terminal_task.env import TerminalTaskEnv
    from envhub.envs.harbor import HarborTaskError

    root = folder
    try:
        if task_folder_kind(folder) == "terminal-bench":
            root = _stage_tbench(folder)
        base = load_manifest(builtin_folders()["terminal-task"])
        name = name_from(folder.name, "tasks")
        manifest = base.model_copy(update={
            "name": name, "metadata": {"tasks_dir": "."},
            "description": f"Harbor tasks in {folder} (run as they are)"})
        env = TerminalTaskEnv(root, manifest)
        if not env.load_tasks():
            raise HarborTaskError(f"{folder}: no task folders found")
    except HarborTaskError as e:
        raise EnvLoadError(str(e)) from None
    return LoadedEnv(folder=root, manifest=manifest, env=env, ref=ref,
                     rewards=reward_components(root, manifest))


def load_swe_rows(ref: str) -> LoadedEnv:
    """A JSONL/Parquet file of SWE-bench-schema rows, or `hf:ID[:SPLIT]` (a `datasets` id,
    online only), run as they are by the built-in swe-task's code and manifest."""
    from envhub.envs.builtin.swe_task.env import SWETaskEnv

    base = load_manifest(builtin_folders()["swe-task"])
    if ref.startswith(DATASET_PREFIX):
        dataset, _, split = ref[len(DATASET_PREFIX):].partition(":")
        if not dataset:
            raise EnvLoadError(f"{ref}: give a dataset id, e.g. "
                               "hf:princeton-nlp/SWE-bench_Lite:test")
        folder, source = Path.cwd(), TasksSource(dataset=dataset, split=split or "test")
        stem = dataset.rsplit("/", 1)[-1]
    else:
        path = Path(ref).expanduser().resolve()
        if not path.is_file():
            raise EnvNotFound(f"{ref}: no such file; give a JSONL or Parquet file of "
                              "SWE-bench rows")
        folder, source, stem = path.parent, TasksSource(path=path.name), path.stem
    name = name_from(stem, "swe-rows")
    # SWE-bench's images run only in docker (the repository lives at /testbed in the image).
    sandbox = base.sandbox.model_copy(update={"kind": "docker", "supported_kinds": ["docker"]})
    manifest = base.model_copy(update={
        "name": name, "tasks": source, "sandbox": sandbox, "metadata": {},
        "description": f"SWE-bench rows from {ref} (run as they are)"})
    env = SWETaskEnv(folder, manifest)
    return LoadedEnv(folder=folder, manifest=manifest, env=env, ref=ref,
                     rewards=reward_components(folder, manifest))


def load_reasoning_gym(ref: str) -> LoadedEnv:
    """`rg:NAME[key=value,...]`: a reasoning-gym dataset with its scorer (envs/rg), from the
    same manifest `envhub init DIR --from rg:NAME` writes; needs the reasoning-gym extra."""
    from envhub.envs import rg
    from envhub.envs.rg.env import ReasoningGymEnv
    from envhub.envs.rg.package import manifest_for

    manifest = manifest_for(rg.parse_reference(ref))
    folder = Path(rg.__file__).resolve().parent  # its code; not a package (no envhub.toml)
    env = ReasoningGymEnv(folder, manifest)
    return LoadedEnv(folder=folder, manifest=manifest, env=env, ref=ref,
                     rewards=reward_components(folder, manifest))


def load_verifiers(ref: str) -> LoadedEnv:
    """`vf:PATH|ID`: a verifiers 0.4 taskset run as it is (envs/verifiers: its harness, its
    rewards), through verifiers' own interpreter (`bash scripts/verifiers_venv.sh`)."""
    from envhub.envs.verifiers import VerifiersEnv, manifest_for

    folder, manifest = manifest_for(ref)
    env = VerifiersEnv(folder, manifest)
    env.load_tasks()  # a missing venv or an unsupported environment stops here (exit 2)
    return LoadedEnv(folder=folder, manifest=manifest, env=env, ref=ref,
                     rewards=reward_components(folder, manifest))


def _stage_tbench(folder: Path) -> Path:
    """A temporary Harbor layout of terminal-bench task(s) in `folder` (removed at exit)."""
    import atexit

    from envhub.envs.harbor.tbench import is_tbench_task, stage

    staging = Path(tempfile.mkdtemp(prefix="envhub-tbench-"))
    atexit.register(shutil.rmtree, staging, True)
    tasks = [folder] if is_tbench_task(folder) else sorted(
        p for p in folder.iterdir() if p.is_dir() and is_tbench_task(p))
    try:
        for task in tasks:
            stage(task, staging / task.name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging if len(tasks) > 1 or folder not in tasks else staging / folder.name


def check_tools(loaded: LoadedEnv, tasks: Sequence[Task] = ()) -> None:
    """Refuse tool names that neither the shared tool table (envs/tools) nor the environment
    itself (a ToolProvider) provides: otherwise every rollout would end as agent_error.

    An environment with tools of its own knows them per task, so it is checked once `tasks`
    are given (the runner and `envhub info` pass them); any other is checked at load."""
    from envhub.envs.tools import TOOL_NAMES

    names, own = list(loaded.manifest.tools), []
    if isinstance(loaded.env, ToolProvider):
        if not tasks:
            return
        names = list(loaded.env.tools(tasks[0]))
        own = [s["function"]["name"] for s in loaded.env.tool_schemas(tasks[0])]
    unknown = [name for name in names if name not in TOOL_NAMES and name not in own]
    if unknown:
        choices = ", ".join([*TOOL_NAMES, *(n for n in own if n not in TOOL_NAMES)])
        raise ManifestError(f"{loaded.folder}/envhub.toml: field 'tools': unknown tool "
                            f"{unknown[0]!r}; use one of {choices} (or give the environment "
                            "a tool of that name: tool_schemas/call_tool)")


def reward_components(folder: Path, manifest: Manifest) -> dict[str, RewardComponent]:
    """The built-in reward components plus the manifest's own (`name = { component = ... }`):
    'module:Class' of the package first, else a dotted path; and its model judges
    (`[rewards.NAME]` with a rubric, envs/rewards/judge)."""
    from envhub.sdk.plugins import load_object

    def load(path: str) -> Any:
        module = path.partition(":")[0].replace(".", "/")
        if ":" in path and ((folder / f"{module}.py").is_file()
                            or (folder / module / "__init__.py").is_file()):
            path = f"{package_name(folder)}.{path}"
        return load_object(path, {}, "reward component")

    from envhub.envs.rewards.judge import Judge

    own = {k: e.component for k, e in manifest.rewards.items() if isinstance(e, RewardEntry)}
    try:
        found = make_components(own, load)
    except (LookupError, ImportError) as e:
        raise EnvLoadError(f"{folder}/envhub.toml: field 'rewards': {e}") from None
    found.update({k: Judge.from_package(e, folder, k) for k, e in manifest.rewards.items()
                  if isinstance(e, JudgeSpec)})
    return found


def package_name(folder: Path) -> str:
    """The import name of a package folder's modules (see `import_entrypoint`)."""
    if folder.resolve().parent == BUILTIN_ROOT:
        return f"envhub.envs.builtin.{folder.name}"
    return _synthetic_package(folder)


def import_entrypoint(folder: Path, manifest: Manifest) -> type:
    """Import `module:Class` from the package folder.

    Built-ins import under their real dotted name (`envhub.envs.builtin.<folder>`); any other
    folder becomes a synthetic package named after its path hash, so its modules can use
    relative imports and two packages with the same module names never collide.
    """
    module_name, _, class_name = manifest.entrypoint.partition(":")
    if not (folder / (module_name.replace(".", "/") + ".py")).is_file() and not (
        folder / module_name.replace(".", "/") / "__init__.py"
    ).is_file():
        raise EnvLoadError(f"{folder}/envhub.toml: field 'entrypoint': module '{module_name}' "
                           f"not found in the package; create {module_name}.py or fix the field")
    try:
        module = importlib.import_module(f"{package_name(folder)}.{module_name}")
    except Exception as e:
        raise EnvLoadError(f"{folder}: importing '{module_name}' failed: "
                           f"{type(e).__name__}: {e}") from e
    cls = getattr(module, class_name, None)
    if not inspect.isclass(cls):
        raise EnvLoadError(f"{folder}/envhub.toml: field 'entrypoint': '{module_name}' has no "
                           f"class '{class_name}'; fix the field or define the class")
    return cls


def _synthetic_package(folder: Path) -> str:
    resolved = folder.resolve()
    name = "envhub_pkg_" + hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    if name not in sys.modules:
        spec = importlib.util.spec_from_loader(name, loader=None, is_package=True)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        module.__path__ = [str(resolved)]
        sys.modules[name] = module
    return name


def task_rows(folder: Path, source: TasksSource) -> list[dict[str, Any]]:
    """The task rows of a package's tasks source, read with `datasets`.

    Local JSONL/Parquet files load offline; the `datasets` cache goes to a temporary folder that
    is removed afterwards (the rows are copied into memory), so loading leaves no files behind.
    """
    if source.path is None and source.dataset is None:
        raise EnvLoadError(f"{folder}/envhub.toml: section [tasks] needs 'path' (a JSONL or "
                           "Parquet file in the package) or 'dataset' (a hub id)")
    import datasets

    datasets.disable_progress_bars()
    cache = tempfile.mkdtemp(prefix="envhub-tasks-")
    try:
        if source.path is not None:
            path = (folder / source.path).resolve()
            if not path.is_file():
                raise EnvLoadError(f"{folder}/envhub.toml: field 'tasks.path': {source.path} "
                                   "does not exist in the package")
            builder = "parquet" if path.suffix == ".parquet" else "json"
            ds = datasets.load_dataset(builder, data_files=str(path), split="train",
                                       cache_dir=cache)
        else:
            ds = datasets.load_dataset(source.dataset, split=source.split, cache_dir=cache)
        return [dict(row) for row in ds.to_list()]
    except EnvLoadError:
        raise
    except Exception as e:
        raise EnvLoadError(f"{folder}: reading tasks failed: {type(e).__name__}: {e}") from e
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def rows_to_tasks(rows: list[dict[str, Any]]) -> list[Task]:
    """Default row → Task mapping: id from id/task_id/instance_id, instruction from
    instruction/problem_statement/prompt/question; the whole row is kept as `data`."""
    tasks = []
    for i, row in enumerate(rows):
        tid = next((str(row[f]) for f in ID_FIELDS if row.get(f) is not None), f"task-{i}")
        text = next((str(row[f]) for f in INSTRUCTION_FIELDS if row.get(f)), "")
        tasks.append(Task(id=tid, instruction=text, data=row))
    return tasks
