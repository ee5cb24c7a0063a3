"""`OUT/run.json`: what a training run was, written before it starts, so that it can be told
apart from another and run again: the resolved configuration (every option, defaults included),
envhub's version and git commit, the lock's digest, each environment's digest, the model
folder's digest, and the versions and device that trained.

A folder that holds a run (any of RUN_FILES) is never written over unasked: `envhub train
--out` into one exits 2 and leaves it as it was (`check_out`); `--overwrite` clears exactly
those entries first.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from envhub.orchestrator.groups.results import write_json

__all__ = ["CLEARED", "NOT_RECORDED", "RUN_FILES", "clear_run", "folder_digest", "held_run",
           "provenance", "write_json"]

# What `envhub train` writes under OUT: a folder holding any of these holds a run ...
RUN_FILES = ("run.json", "metrics.jsonl", "pool.db", "pool.db-wal", "pool.db-shm", "weights",
             "rollouts", "checkpoints", "groups.jsonl", "metrics.discarded.jsonl",
             "samples.jsonl", "samples.discarded.jsonl", "trackers")
# ... and what --overwrite clears besides (a vLLM that failed to start leaves only its log)
CLEARED = (*RUN_FILES, "vllm.log")
# Options run.json leaves out: a secret, and how this invocation treats OUT (a config file
# read back must not clear a folder by itself)
NOT_RECORDED = {"services_token", "overwrite", "resume", "quiet"}
SECRET_FLAGS = ("--services-token",)
SOURCE = Path(__file__).resolve().parents[2]  # the checkout (or site-packages' envhub/..)


def held_run(out: Path) -> list[str]:
    """The entries of a run that `out` holds (empty: none, or no such folder)."""
    found = []
    for name in RUN_FILES:
        path = out / name
        if path.is_dir() and not any(path.iterdir()):
            continue  # an empty folder holds nothing of a run
        if path.exists() or path.is_symlink():
            found.append(name)
    return found


def clear_run(out: Path) -> None:
    """Remove the entries of CLEARED under `out` (--overwrite), nothing else."""
    for name in CLEARED:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def folder_digest(folder: Path) -> str | None:
    """sha256 over the folder's files (relative path and content, sorted; symlinks by their
    target text): equal folders give equal digests wherever they lie. None when a file cannot
    be read (it is then not a digest of the folder)."""
    total = hashlib.sha256()
    try:
        for path in sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()):
            rel = path.relative_to(folder).as_posix()
            if "__pycache__" in rel.split("/"):
                continue
            total.update(rel.encode() + b"\0")
            if path.is_symlink():
                total.update(b"link:" + os.readlink(path).encode())
            else:
                with open(path, "rb") as f:
                    total.update(hashlib.file_digest(f, "sha256").digest())
    except OSError:
        return None
    return "sha256:" + total.hexdigest()


def _env_entry(ref: str, name: str, folder: str) -> dict[str, Any]:
    """An environment's line: its package folder's digest; a task service's environment has
    no folder here (it runs elsewhere), so only its reference is recorded."""
    if folder in ("", "."):  # services/hub.py's LoadedEnv of a served environment
        return {"ref": ref, "name": name, "digest": None, "served": True}
    return {"ref": ref, "name": name, "digest": folder_digest(Path(folder))}


def _argv() -> list[str]:
    """This command line with secrets blanked."""
    argv, hide = [], False
    for arg in sys.argv[1:]:
        if hide:
            argv.append("***")
        elif any(arg.startswith(flag + "=") for flag in SECRET_FLAGS):
            argv.append(arg.split("=", 1)[0] + "=***")
        else:
            argv.append(arg)
        hide = arg in SECRET_FLAGS
    return argv


def git_commit(folder: Path = SOURCE) -> dict[str, Any] | None:
    """The commit of the checkout envhub runs from, and whether it has local changes; None
    outside a git checkout (an installed wheel)."""
    if not (folder / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain",
                                "--untracked-files=no"], check=True, capture_output=True,
                               text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head, "dirty": bool(dirty)}


def lock_digest(folder: Path = SOURCE) -> str | None:
    lock = folder / "locks" / "envhub.txt"
    if not lock.is_file():
        return None
    return "sha256:" + hashlib.sha256(lock.read_bytes()).hexdigest()


def provenance(config: dict[str, Any], envs: list[Any], model: str | Path,
               device: dict[str, Any]) -> dict[str, Any]:
    """run.json's content. `envs`: (reference, name, folder) of each environment."""
    import torch
    import transformers

    from envhub import __version__

    return {
        "config": config,
        "envhub": __version__,
        "git": git_commit(),
        "lock": lock_digest(),
        "environments": [_env_entry(ref, name, folder) for ref, name, folder in envs],
        "model": {"path": str(model), "digest": folder_digest(Path(model))},
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "argv": _argv(),
    }
