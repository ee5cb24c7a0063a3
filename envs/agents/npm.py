"""npm agents (`--agent-install npm:PACKAGE[@VERSION]`, e.g. Codex CLI or Claude Code) for a
bundle: the packages installed on the host with npm into a cached prefix, a portable `node`
(host_node) copied beside them, and each package's `bin` entries as programs in `bin/`.

Install scripts: npm runs none of the dependencies' (`--ignore-scripts`); the packages named on
the command line then get their own install scripts run (`npm rebuild`), since some need them to
put their platform binary in place (Claude Code's postinstall copies its native executable over
a placeholder). Platform binaries come as optional dependencies (Codex's static musl build,
Claude Code's glibc build): npm picks the host's, so the sandbox must be the same OS and machine
(a docker image on this host: Linux, same CPU architecture).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from envhub.envs.agents.cache import cached_folder
from envhub.envs.errors import AgentSpecError

# npm's package-name rules (scoped or not, lower case, URL-safe), optionally @VERSION/@TAG
_SPEC = re.compile(r"^(?P<name>(?:@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*)"
                   r"(?:@(?P<version>[A-Za-z0-9.^~<>=*|+ -]+))?$")
NPM_DIR = "npm"  # the bundle's npm prefix: npm/node_modules/...
# A package's JavaScript `bin` entry as a program: the bundle's own node, whatever is on PATH
# (shell built-ins only: the agent may run it with any PATH).
_ENTRY_JS = """#!/bin/sh
here="${{0%/*}}/.."
exec "$here/bin/node" "$here/{target}" "$@"
"""
_ENTRY_NATIVE = """#!/bin/sh
here="${{0%/*}}/.."
exec "$here/{target}" "$@"
"""


def check_spec(value: str) -> str:
    """The package name of `value` ("@openai/codex@0.169.0" -> "@openai/codex"), or
    AgentSpecError saying what a spec looks like."""
    match = _SPEC.match(value.strip())
    if match is None:
        raise AgentSpecError(f"--agent-install npm:{value!r}: not an npm package spec; use "
                             "npm:NAME or npm:NAME@VERSION (e.g. npm:@openai/codex@0.169.0)")
    return match.group("name")


# What an official Node.js build links: libraries every glibc image has. Debian's own `nodejs`
# also links libnode, libuv, ICU...: fine on this machine, absent from most images.
_BASE_LIBS = ("linux-vdso.so", "libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so",
              "libstdc++.so", "libgcc_s.so", "libatomic.so", "/lib64/ld-linux", "ld-linux")


@functools.lru_cache(maxsize=1)
def host_node() -> tuple[Path, str]:
    """(path, version) of the node that goes into bundles: this machine's `node` if it needs
    only base libraries, else Playwright's own (an official build, envhub[browser])."""
    if shutil.which("npm") is None:
        raise AgentSpecError("npm agents need npm on this machine (apt-get install npm, or "
                             "Node.js from nodejs.org)")
    tried = []
    for node in _node_candidates():
        tried.append(str(node))
        if _portable(node):
            version = subprocess.run([str(node), "--version"], capture_output=True, text=True,
                                     check=True).stdout.strip()
            return node, version
    raise AgentSpecError(f"no portable node for npm agents (tried {', '.join(tried) or 'none'}:"
                         " each links libraries a sandbox image may lack); install Node.js from "
                         "nodejs.org or NodeSource, or pip install 'envhub[browser]' "
                         "(Playwright's Node.js)")


def _node_candidates() -> list[Path]:
    found = [Path(p).resolve() for p in [shutil.which("node")] if p]
    from envhub.envs.browser.chromium import BrowserUnavailable, playwright_core

    try:
        found.append(playwright_core().parent / "node")
    except BrowserUnavailable:  # Playwright not installed: one candidate fewer
        pass
    return [p for p in found if p.is_file()]


def _portable(node: Path) -> bool:
    ran = subprocess.run(["ldd", str(node)], capture_output=True, text=True, check=False)
    if ran.returncode != 0:
        return False
    libs = [line.split()[0] for line in ran.stdout.splitlines() if line.strip()]
    return bool(libs) and all(lib.startswith(_BASE_LIBS) for lib in libs)


def npm_tree(specs: list[str], cache: Path) -> Path:
    """A prefix holding `specs` installed by npm (node_modules/...), cached by specs and node."""
    node, version = host_node()
    key = hashlib.sha256(json.dumps([version, sorted(specs)]).encode()).hexdigest()

    def build(work: Path) -> None:
        common = ["--prefix", str(work), "--no-audit", "--no-fund", "--no-update-notifier",
                  "--loglevel=error"]
        _npm(["install", "--omit=dev", "--ignore-scripts", *common, *specs], specs)
        _npm(["rebuild", "--foreground-scripts", *common, *[check_spec(s) for s in specs]],
             specs)

    return cached_folder(cache / f"npm-{key[:24]}", build, "\n".join(specs))


def _npm(args: list[str], specs: list[str]) -> None:
    npm = shutil.which("npm")
    assert npm is not None  # host_node() checked
    ran = subprocess.run([npm, *args], capture_output=True, text=True, check=False)
    if ran.returncode != 0:
        raise AgentSpecError(f"cannot install {' '.join(specs)} with npm ({args[0]}): "
                             f"{ran.stderr.strip()[-800:]}")


def add_to_bundle(specs: list[str], bundle: Path, cache: Path,
                  link: Callable[[str, str], object]) -> None:
    """`specs`' tree at bundle/npm, node at bundle/bin/node, and the named packages' `bin`
    entries as programs in bundle/bin. `link(src, dst)` copies a file (hard link if it can)."""
    tree = npm_tree(specs, cache)
    shutil.copytree(tree / "node_modules", bundle / NPM_DIR / "node_modules", symlinks=True,
                    copy_function=link)
    node, _ = host_node()
    shutil.copy2(node, bundle / "bin" / "node")
    for spec in specs:
        _write_entry_points(bundle, check_spec(spec))


def _write_entry_points(bundle: Path, name: str) -> None:
    root = Path(NPM_DIR) / "node_modules" / name
    manifest = json.loads((bundle / root / "package.json").read_text())
    bins = manifest.get("bin") or {}
    if isinstance(bins, str):  # "bin": "cli.js" names the program after the package
        bins = {name.rpartition("/")[2]: bins}
    if not bins:
        raise AgentSpecError(f"npm package {name} declares no programs (package.json 'bin'); "
                             "nothing to run")
    for program, target in bins.items():
        relative = (root / target).as_posix()
        with open(bundle / relative, "rb") as f:
            native = f.read(4) == b"\x7fELF"
        path = bundle / "bin" / program
        path.write_text((_ENTRY_NATIVE if native else _ENTRY_JS).format(target=relative))
        path.chmod(0o755)
