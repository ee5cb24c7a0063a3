"""`envhub doctor`: what this machine has for envhub, each missing piece with the command that
provides it. Every check is read-only and answers in a few seconds."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import resource
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

CHECKOUT = Path(__file__).resolve().parents[1]  # a checkout's root; a wheel has no locks/ here
KEY_PACKAGES = ("torch", "transformers", "tokenizers", "pydantic", "fastapi", "openai")
APT = "sudo apt-get install -y"
FDS_BASE, FDS_PER_ROLLOUT = 256, 32  # gateway, pool and engine; a rollout's sockets and pipes
DISK_WANTED = 10 << 30  # base images ~0.3 GB, the browser image ~1 GB, vLLM's venv 3.4 GB, runs


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | missing
    detail: str
    fix: str = ""


def _run(argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def locked_versions(lock: Path) -> dict[str, str]:
    """{normalised name: version} of a lock file (locks/*.txt)."""
    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        if line and not line.startswith("#") and "==" in line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def installed_versions() -> dict[str, str]:
    """{normalised name: version} of what this interpreter's environment has installed: its
    site-packages only (setuptools puts its vendored copies, `setuptools/_vendor/*.dist-info`,
    on sys.path once imported; they are not installed packages)."""
    paths = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    return {canonicalize_name(d.metadata["Name"]): d.version
            for d in importlib.metadata.distributions(path=paths)}


def check_python() -> Check:
    """Informational: envhub does not install, let alone run, below its requires-python."""
    return Check("python", "ok", f"{platform.python_version()} at {sys.executable}")


def check_packages(lock: Path = CHECKOUT / "locks" / "envhub.txt") -> Iterator[Check]:
    installed = installed_versions()
    pins = locked_versions(lock) if lock.is_file() else {}
    refresh = "bash scripts/venv.sh all,dev (installs the lock's versions)"
    for name in KEY_PACKAGES:
        have, want = installed.get(name), pins.get(name)
        if have is None:
            yield Check(name, "missing", "not installed", refresh)
        elif want is not None and have.split("+")[0] != want:
            yield Check(name, "warn", f"{have}, the lock has {want}", refresh)
        else:
            yield Check(name, "ok", have + (" (as locked)" if want else ""))
    if not pins:
        yield Check("lock", "warn", f"no {lock} beside this install (a wheel?): versions not "
                    "compared", "run from a checkout: bash scripts/venv.sh all,dev")
        return
    off = sorted(n for n, v in installed.items()
                 if n in pins and v.split("+")[0] != pins[n])
    if off:
        yield Check("lock", "warn", f"{len(off)} package(s) differ from {lock.name}: "
                    + ", ".join(off[:8]) + (" ..." if len(off) > 8 else ""), refresh)
    else:
        yield Check("lock", "ok", f"every locked package installed is at its {lock.name} version")


def check_docker() -> Check:
    from envhub.envs.sandbox.engine import docker_reachable

    if importlib.util.find_spec("docker") is None:
        return Check("docker", "missing", "the docker SDK is not installed",
                     "bash scripts/venv.sh engine,docker")
    if docker_reachable():
        info = _run(["docker", "info", "--format", "{{.ServerVersion}} at {{.DockerRootDir}}"])
        return Check("docker", "ok", "engine answers" + (f" ({info.stdout.strip()})"
                                                         if info and info.returncode == 0 else ""))
    if shutil.which("dockerd") is None:
        return Check("docker", "missing", "no Docker engine on this machine",
                     f"{APT} docker.io && sudo dockerd &")
    return Check("docker", "missing", "dockerd is installed but not answering",
                 "sudo dockerd & (or: sudo systemctl start docker; DOCKER_HOST for another)")


def check_debootstrap() -> Check:
    if shutil.which("debootstrap") or Path("/usr/sbin/debootstrap").exists():
        return Check("debootstrap", "ok", "builds envhub's base images (as root)")
    return Check("debootstrap", "missing", "docker sandboxes cannot build their base image",
                 f"{APT} debootstrap")


def check_bubblewrap() -> Check:
    from envhub.envs.sandbox.local import bwrap_path

    bwrap = bwrap_path()
    if bwrap is None:
        return Check("bubblewrap", "missing", "local sandboxes would run as plain processes "
                     "(swe-task refuses them)", f"{APT} bubblewrap")
    probe = _run([bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "true"])
    if probe is None or probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no answer"])[0] if probe else "no answer"
        return Check("bubblewrap", "missing", f"{bwrap} cannot create namespaces here ({why})",
                     "in a container: start it with --privileged; elsewhere: sysctl "
                     "kernel.unprivileged_userns_clone=1; or run as root with dockerd")
    return Check("bubblewrap", "ok", f"{bwrap} creates namespaces")


def check_chromium() -> Check:
    from envhub.envs.browser.chromium import BrowserUnavailable, chromium_path

    try:
        path = chromium_path()
    except BrowserUnavailable as e:
        return Check("chromium", "missing", "slides and webtask cannot render or browse",
                     str(e).removeprefix("Chromium is missing: "))
    return Check("chromium", "ok", path)


def check_postgres() -> Check:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return Check("postgresql", "ok", f"server binaries in {found[-1].parent}")
    return Check("postgresql", "missing", "no server binaries (the pool can use SQLite; "
                 "many gateways share PostgreSQL)", f"{APT} postgresql")


def check_vllm_venv() -> Check:
    venv = Path(os.environ.get("VLLM_VENV", CHECKOUT / ".venv-vllm"))
    if not (venv / "bin" / "python").exists() or not list(venv.glob(".envhub-vllm-*")):
        return Check("vllm venv", "missing", f"no vLLM venv at {venv} (--engine vllm and its "
                     "tests need it)", "bash scripts/vllm_venv.sh (~5 min, 3.4 GB)")
    return Check("vllm venv", "ok", f"{venv} (bash scripts/vllm_venv.sh brings it to its lock)")


def venv_stamp(script: str, lock: str, checkout: Path = CHECKOUT) -> str | None:
    """The stamp name `scripts/SCRIPT` leaves in a venv it brought to `locks/LOCK`: its key is
    the sha256 of the script, scripts/pip_locked.sh and the lock, as the script computes it;
    None without those files (an installed wheel)."""
    parts = [checkout / "scripts" / script, checkout / "scripts" / "pip_locked.sh"]
    if not all(p.is_file() for p in parts):
        return None
    lock_file = checkout / "locks" / lock
    data = b"".join(p.read_bytes() for p in parts)
    data += lock_file.read_bytes() if lock_file.is_file() else b""
    return hashlib.sha256(data).hexdigest()[:16]


def check_verifiers_venv() -> Check:
    from envhub.envs.verifiers.process import python

    exe = python()
    venv, fix = exe.parent.parent, "bash scripts/verifiers_venv.sh"
    stamps = sorted(p.name for p in venv.glob(".envhub-verifiers-*"))
    if not exe.exists() or not stamps:
        return Check("verifiers venv", "missing", f"no verifiers venv at {venv} "
                     "(`envhub run vf:...` and its tests need it)", f"{fix} (~1 min, 570 MB)")
    key = venv_stamp("verifiers_venv.sh", "verifiers.txt")
    if key is not None and f".envhub-verifiers-{key}" not in stamps:
        return Check("verifiers venv", "warn", f"{venv} was built from another "
                     "locks/verifiers.txt or script than this checkout's", fix)
    return Check("verifiers venv", "ok", f"{venv}" + (" (as locked)" if key else
                                                      f" (not checked: no lock here; {fix})"))


def check_gpus() -> Check:
    try:
        import torch
    except ImportError:
        return Check("gpu", "warn", "torch is not installed", "bash scripts/venv.sh engine")
    if not torch.cuda.is_available():
        return Check("gpu", "ok", "no CUDA device visible: the engine and the trainer use the "
                     "CPU (fp32)")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return Check("gpu", "ok", f"{len(names)} CUDA device(s): {', '.join(names)}; the engine "
                 "uses cuda (bf16), the trainer cuda:LOCAL_RANK (one rank a GPU)")


def check_fds(concurrency: int) -> Check:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FDS_BASE + FDS_PER_ROLLOUT * concurrency
    detail = f"{soft} open files allowed (hard {hard}); ~{need} for {concurrency} rollouts"
    if soft != resource.RLIM_INFINITY and soft < need:
        return Check("file descriptors", "warn", detail,
                     f"ulimit -n {need * 2} (or lower --concurrency)")
    return Check("file descriptors", "ok", detail)


def check_disk(paths: list[Path]) -> Iterator[Check]:
    seen: set[int] = set()
    for path in paths:
        while not path.exists():
            path = path.parent
        device = path.stat().st_dev
        if device in seen:
            continue
        seen.add(device)
        free = shutil.disk_usage(path).free
        detail = f"{free / (1 << 30):.1f} GiB free at {path}"
        if free < DISK_WANTED:
            yield Check("disk", "warn", detail + f" (want {DISK_WANTED >> 30} GiB)",
                        "envhub gc --dry-run lists what envhub can remove")
        else:
            yield Check("disk", "ok", detail)


def check_sandbox_disk(concurrency: int, disk_mb: int | None = None) -> Iterator[Check]:
    """How this machine bounds what a sandbox writes (`[sandbox] disk_mb`), and what
    `concurrency` rollouts can then take at most."""
    from envhub.envs.manifest import DEFAULT_DISK_MB
    from envhub.envs.sandbox.disk import can_mount

    mb = disk_mb or DEFAULT_DISK_MB
    most = f"-c {concurrency} rollouts take at most {concurrency * mb / 1024:.1f} GiB"
    if can_mount():
        yield Check("sandbox disk (local)", "ok", f"workdir, /tmp and /dev/shm share one "
                    f"{mb} MB tmpfs per sandbox (memory, not disk): {most} of memory")
    else:
        yield Check("sandbox disk (local)", "warn", "not root: a command's /tmp and /dev/shm "
                    f"are bounded ({mb} MB each, gone with it) but the workdir only per file",
                    "run as root for one bounded disk per sandbox")
    info = _run(["docker", "info", "--format", "{{.Driver}} {{json .DriverStatus}}"])
    if info is None or info.returncode != 0:
        return
    text = info.stdout.strip()
    driver = text.split(" ", 1)[0]
    bounded = driver in ("btrfs", "zfs", "devicemapper") or (
        driver == "overlay2" and '"xfs"' in text)
    stale = btrfs_quotas_stale() if driver == "btrfs" else None
    if stale:
        yield Check("sandbox disk (docker)", "warn", f"btrfs: the quotas that bound each "
                    f"container are inconsistent ({stale}), so no limit is enforced",
                    f"btrfs quota rescan -w {stale}; echo 8 > /sys/fs/btrfs/UUID/qgroups/"
                    "drop_subtree_threshold keeps them counted")
    elif bounded:
        yield Check("sandbox disk (docker)", "ok", f"{driver}: the writable layer is bounded "
                    f"(--storage-opt size; overlay2 needs xfs with pquota): {most} of disk")
    else:
        yield Check("sandbox disk (docker)", "warn", f"{driver} on this backing filesystem "
                    "cannot bound a container's writable layer: docker sandboxes can fill the "
                    "disk", "give dockerd a data-root on btrfs (a loop file will do), or on xfs "
                    "mounted with pquota (a kernel with CONFIG_XFS_QUOTA)")


def btrfs_quotas_stale() -> str | None:
    """Docker's data root when it is a btrfs filesystem whose qgroups are marked inconsistent
    (limits are then not enforced until a rescan), else None; None also when this machine
    cannot look (a remote engine, no findmnt)."""
    root = _run(["docker", "info", "--format", "{{.DockerRootDir}}"])
    if root is None or root.returncode != 0:
        return None
    folder = root.stdout.strip()
    uuid = _run(["findmnt", "-no", "UUID", "--target", folder])
    if uuid is None or uuid.returncode != 0 or not uuid.stdout.strip():
        return None
    flag = Path("/sys/fs/btrfs") / uuid.stdout.strip() / "qgroups" / "inconsistent"
    try:
        return folder if flag.read_text().strip() != "0" else None
    except OSError:
        return None


def checks(concurrency: int, runs: Path) -> Iterator[Check]:
    from envhub.envs.images.base import cache_dir

    yield check_python()
    yield from check_packages()
    steps: list[Callable[[], Check]] = [check_docker, check_debootstrap, check_bubblewrap,
                                        check_chromium, check_postgres, check_vllm_venv,
                                        check_verifiers_venv, check_gpus]
    for step in steps:
        yield step()
    yield check_fds(concurrency)
    yield from check_sandbox_disk(concurrency)
    yield from check_disk([runs.resolve(), cache_dir(), Path("/var/lib/docker")])
