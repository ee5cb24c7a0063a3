"""How a command-line agent is made present inside a sandbox: a bundle folder built on the host
(`lib/` importable packages, `bin/` programs), cached by what it holds and the Python it targets,
then baked into an image layer (docker) or bound read-only (local). Nothing is fetched at run time.

Specs (`--agent-install`, repeatable):
  pip:REQUIREMENT  a PyPI requirement, installed for the sandbox's Python (`pip install --target`,
                   wheels only when that Python differs from the host's); its console scripts
                   become programs in `bin/` that run with the sandbox's `python3`
  script:PATH      a host file copied into `bin/` (executable; run it with its own shebang or
                   `python3 NAME`)
  npm:PACKAGE[@V]  an npm package (Codex CLI, Claude Code), installed with the host's npm; a
                   portable node comes with it into bin/, its `bin` entries become programs
                   (npm.py)
  recipe:NAME      a shipped agent recipe (recipes/NAME.sh: claude-code, codex, opencode,
                   mini-swe-agent, aider): the script, the package versions it was tested with
                   (its `#@install SPEC` lines) and `envhub-tool`, the environment's tools as a
                   shell command; run it with `--agent NAME.sh`
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from envhub.envs.agents.cache import cached_folder
from envhub.envs.agents.npm import add_to_bundle, check_spec, host_node
from envhub.envs.errors import AgentSpecError

KINDS = ("pip", "script", "npm")
RECIPES = Path(__file__).with_name("recipes")
TOOL_COMMAND = RECIPES / "envhub-tool"
USAGE = ("use pip:REQUIREMENT (e.g. pip:mini-swe-agent==2.4.6), npm:PACKAGE[@VERSION], "
         "script:PATH or recipe:NAME")
FORWARDER = Path(__file__).with_name("forwarder.py")
# A console script as a program: the bundle's lib/ first on sys.path (not PYTHONPATH, which the
# agent's own tool commands would inherit and which could shadow the task's packages).
_ENTRY = """#!/bin/sh
here=$(cd "$(dirname "$0")/.." && pwd)
exec python3 -c 'import sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = "{name}"
from {module} import {attr}
sys.exit({call}())' "$here/lib" "$@"
"""


@dataclass(frozen=True)
class AgentInstall:
    kind: str
    value: str

    @classmethod
    def parse(cls, text: str) -> AgentInstall:
        kind, sep, value = text.partition(":")
        if not sep or kind not in KINDS or not value.strip():
            raise AgentSpecError(f"--agent-install {text!r}: {USAGE}")
        if kind == "npm":
            check_spec(value)
        if kind == "script" and not Path(value).is_file():
            raise AgentSpecError(f"--agent-install {text!r}: {value} is not a file")
        return cls(kind, value.strip())

    def fingerprint(self) -> str:
        if self.kind == "script":
            return f"script:{Path(self.value).name}:" + hashlib.sha256(
                Path(self.value).read_bytes()).hexdigest()
        if self.kind == "npm":  # the bundle carries the host's node too
            return f"npm:{self.value}:node-{host_node()[1]}"
        return f"{self.kind}:{self.value}"


def recipe_names() -> list[str]:
    return sorted(p.name.removesuffix(".sh") for p in RECIPES.glob("*.sh"))


def recipe_path(name: str) -> Path:
    """The shipped recipe script `name` (AgentSpecError naming the recipes when there is none)."""
    if name not in recipe_names():
        raise AgentSpecError(f"--agent-install recipe:{name}: no such recipe; the shipped ones "
                             f"are {', '.join(recipe_names())}")
    return RECIPES / f"{name}.sh"


def parse_installs(specs: list[str]) -> list[AgentInstall]:
    """`--agent-install` specs as installs, each `recipe:NAME` expanded into its `#@install`
    packages, its script and `envhub-tool`; an install named twice is kept once."""
    out: list[AgentInstall] = []
    for text in specs:
        kind, _, name = text.partition(":")
        if kind != "recipe":
            out.append(AgentInstall.parse(text))
            continue
        script = recipe_path(name.strip())
        lines = script.read_text(encoding="utf-8").splitlines()
        out += [AgentInstall.parse(line.removeprefix("#@install").strip())
                for line in lines if line.startswith("#@install ")]
        out += [AgentInstall("script", str(script)), AgentInstall("script", str(TOOL_COMMAND))]
    return list(dict.fromkeys(out))


def cache_root() -> Path:
    home = Path(os.environ.get("ENVHUB_HOME", Path.home() / ".envhub"))
    return Path(os.environ.get("ENVHUB_AGENT_CACHE", home / "agents"))


def build_bundle(installs: list[AgentInstall], python: str) -> Path:
    """The bundle for `installs` targeting Python `python` ("3.11"), built once and cached.
    Blocking (runs pip); AgentSpecError with pip's reason when a package cannot be had."""
    key = hashlib.sha256(json.dumps([python, platform.machine()]
                                    + [i.fingerprint() for i in installs]).encode()).hexdigest()
    final = cache_root() / key[:24]
    if (final / "ok").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        (work / "bin").mkdir()
        (work / "lib").mkdir()
        shutil.copy(FORWARDER, work / "forwarder.py")
        requirements = [i.value for i in installs if i.kind == "pip"]
        if requirements:
            # hard links to the packages' own cache: a new script next to them costs no pip run
            shutil.copytree(_pip_lib(requirements, python), work / "lib", dirs_exist_ok=True,
                            copy_function=_link_or_copy)
            _write_entry_points(work)
        specs = [i.value for i in installs if i.kind == "npm"]
        if specs:
            add_to_bundle(specs, work, cache_root(), _link_or_copy)
        for i in installs:
            if i.kind == "script":
                target = work / "bin" / Path(i.value).name
                shutil.copy(i.value, target)
                target.chmod(0o755)
        (work / "ok").write_text(json.dumps({"python": python,
                                             "installs": [i.fingerprint() for i in installs]}))
        os.chmod(work, 0o755)
        try:
            work.rename(final)
        except OSError:  # built concurrently by another run: keep theirs
            shutil.rmtree(work, ignore_errors=True)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return final


def _pip_lib(requirements: list[str], python: str) -> Path:
    """`requirements` installed for `python` (`pip install --target`), cached by both."""
    key = hashlib.sha256(json.dumps([python, platform.machine(), sorted(requirements)]
                                    ).encode()).hexdigest()
    return cached_folder(cache_root() / f"pip-{key[:24]}",
                         lambda work: _pip_install(requirements, work, python),
                         "\n".join(requirements))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _pip_install(requirements: list[str], target: Path, python: str) -> None:
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-compile", "--target", str(target)]
    if python != f"{sys.version_info[0]}.{sys.version_info[1]}":
        machine = platform.machine()
        argv += ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
        for tag in ("manylinux2014", "manylinux_2_28", "manylinux_2_34", "linux"):
            argv += ["--platform", f"{tag}_{machine}"]
    ran = subprocess.run(argv + requirements, capture_output=True, text=True, check=False)
    if ran.returncode != 0:
        raise AgentSpecError(f"cannot install {' '.join(requirements)} for the sandbox's Python "
                             f"{python}: {ran.stderr.strip()[-800:]}")


def _write_entry_points(bundle: Path) -> None:
    for points in (bundle / "lib").glob("*.dist-info/entry_points.txt"):
        parser = configparser.ConfigParser(interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read(points)
        if not parser.has_section("console_scripts"):
            continue
        for name, target in parser.items("console_scripts"):
            module, _, attr = target.partition(":")
            attr = attr.split("[")[0].strip()
            path = bundle / "bin" / name
            path.write_text(_ENTRY.format(name=name, module=module.strip(),
                                          attr=attr.split(".")[0], call=attr))
            path.chmod(0o755)
