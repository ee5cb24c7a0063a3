"""The browser runtime that sandboxes run: Playwright's own Node.js and `playwright-core`,
staged once per machine into a folder that local (bubblewrap) sandboxes see read-only.

Why a staged copy: Playwright for Python ships the exact Node.js and `playwright-core` it is
tested with (Debian's `nodejs` may be older than playwright-core requires), but inside a
virtualenv that local sandboxes cannot see (/root, /home and an editable checkout are hidden).
`/var/tmp` is bound read-only into every local sandbox, so one copy there serves them all, and
no sandbox can change it.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from envhub.envs.browser.chromium import BrowserUnavailable, playwright_core

RUNTIME_ENV = "ENVHUB_BROWSER_RUNTIME"  # another folder to stage into (must be visible inside)
DEFAULT_PARENT = Path("/var/tmp")


def _version(core: Path) -> str:
    import json

    return str(json.loads((core / "package.json").read_text())["version"])


def _trusted(folder: Path) -> bool:
    """Ours and writable by nobody else (another user could have planted it in /var/tmp)."""
    info = folder.lstat()
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def staged_runtime() -> Path:
    """A folder with `node` and `playwright-core/` (copied on first use; later calls find it).
    BrowserUnavailable when Playwright is missing or the folder cannot be made safely."""
    core = playwright_core()
    node = core.parent / "node"
    if not node.is_file():
        raise BrowserUnavailable(f"{node}: Playwright's Node.js is missing; reinstall it: "
                                 "pip install --force-reinstall playwright")
    parent = Path(os.environ.get(RUNTIME_ENV, DEFAULT_PARENT))
    target = parent / f"envhub-browser-{_version(core)}-uid{os.geteuid()}"
    if not target.exists():
        _stage(node, core, parent, target)
    if not _trusted(target):
        raise BrowserUnavailable(f"{target} is not owned by this user or is writable by "
                                 f"others; remove it, or set {RUNTIME_ENV} to a folder of "
                                 "your own")
    return target


def _stage(node: Path, core: Path, parent: Path, target: Path) -> None:
    """Copy into a temporary sibling, then rename: nobody ever sees half a runtime."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=parent))
        shutil.copy2(node, work / "node")
        shutil.copytree(core, work / "playwright-core", symlinks=True)
        work.chmod(0o755)
        try:
            work.rename(target)
        except OSError:  # another process staged it first: keep theirs
            shutil.rmtree(work, ignore_errors=True)
    except OSError as e:
        raise BrowserUnavailable(f"cannot stage the browser runtime in {parent}: {e}; set "
                                 f"{RUNTIME_ENV} to a writable folder outside /tmp and "
                                 "/home") from None
