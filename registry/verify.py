"""The registry's own audits: workers that take each published version from the durable queue
in the registry's database (catalog.audit_jobs) and run `envhub audit` on the stored archive,
so that "verified" means this registry ran it, never that the publisher said so.

A worker (`envhub registry worker`, or one of `envhub registry serve --audit-workers N`) loops:
claim the oldest waiting job under a lease, check the stored blob still has the published
digest, unpack it into a scratch folder, run `envhub audit` on it in a jail, renew the lease
while it runs, then record the report and the registry's signed verification record
(registry/signing.py) in one transaction, only if it still holds the job. A worker that dies
lets its lease lapse: another worker takes the job again (up to `max_attempts` starts, then the
version shows `failed`). An audit past `job_timeout_s` is killed and the version shows
`failed` with that reason; the next job runs.

Resources: the audit process and everything it starts get rlimits (`--memory-mb` of data
segment each, `--file-mb` per file, no core dumps), everything it writes goes to a tmpfs of
`--disk-mb` (as root), and the whole audit has `--job-timeout`.

The jail (bubblewrap): the package's own Python runs in the audit process, so the audit runs
with no network (its gateway and sandboxes on the jail's own loopback), the host read-only,
a private /tmp, /run and HOME, and the registry's data folder, the worker's ENVHUB_HOME and
/root hidden; the Docker socket is not reachable, so jailed audits use local (bubblewrap)
sandboxes. `--sandbox docker` needs `--unjailed`: the packages' code then runs as the worker's
user with the Docker socket, for registries that trust their publishers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from envhub import __version__
from envhub.registry.archive import sha256_file
from envhub.registry.audits import summarize
from envhub.registry.catalog import AuditJob, Catalog
from envhub.registry.errors import BadRequest, RegistryError
from envhub.registry.extract import unpack_into
from envhub.registry.home import envhub_home

log = logging.getLogger("envhub.registry.verify")
LOG_TAIL = 4000  # bytes of the audit's output kept for the owner's report of a failed audit
MAX_REPORT_BYTES = 16 << 20
PASSED_ENV = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "PYTHONHASHSEED"})
# each of the jail's own tmpfs (/tmp, /run, the home; its TMPDIR and HOME are in the work folder)
JAIL_TMPFS_BYTES = 256 << 20
# the controls every complete audit report holds for each sandbox kind it ran in
CONTROLS = ("no-op", "oracle")


@dataclass
class WorkerConfig:
    """`envhub registry worker` options."""

    data: Path
    db: str | None = None
    sandboxes: list[str] = field(default_factory=lambda: ["local"])
    tasks: int = 2  # tasks per cheat
    cheat_timeout_s: float = 300.0  # one cheat's run (envhub audit --timeout)
    job_timeout_s: float = 3600.0  # the whole audit of one version
    lease_s: float = 60.0
    max_attempts: int = 3
    poll_s: float = 2.0
    once: bool = False  # stop when the queue is empty
    jail: bool = True
    memory_mb: int = 8192  # the audit process's data segment (RLIMIT_DATA), its children's each
    file_mb: int = 4096  # the largest file it (or a sandbox under it) may write (RLIMIT_FSIZE)
    disk_mb: int = 16384  # everything one audit writes (a tmpfs at its folder, as root)


def check_config(cfg: WorkerConfig) -> None:
    """Refuse what cannot work before any job is claimed (BadRequest with the fix)."""
    kinds = set(cfg.sandboxes)
    if not kinds or not kinds <= {"local", "docker"}:
        raise BadRequest(f"--sandbox takes local or docker, not {sorted(kinds)}")
    if cfg.jail and "docker" in kinds:
        raise BadRequest("a jailed audit cannot reach the Docker socket (the package's code "
                         "would reach the host through it): use --sandbox local, or "
                         "--unjailed if this registry trusts its publishers' code")
    if cfg.jail and shutil.which("bwrap") is None:
        raise BadRequest("the audit jail needs bubblewrap: apt-get install bubblewrap "
                         "(or --unjailed if this registry trusts its publishers' code)")
    # util-linux: prlimit for every audit's rlimits; setpriv and unshare for a root worker's
    # unprivileged jail
    needed = ["prlimit"] + (["setpriv", "unshare"] if cfg.jail and os.geteuid() == 0 else [])
    if missing := [tool for tool in needed if shutil.which(tool) is None]:
        raise BadRequest(f"the audit worker needs {', '.join(missing)} (util-linux): apt-get "
                         "install util-linux")
    if cfg.memory_mb < 256 or cfg.file_mb < 1 or cfg.disk_mb < 64:
        raise BadRequest("--memory-mb must be at least 256 (an audit loads a model), "
                         "--file-mb at least 1 and --disk-mb at least 64")
    if cfg.lease_s < 3 or cfg.job_timeout_s < 1 or cfg.max_attempts < 1:
        raise BadRequest("--lease must be at least 3 s, --job-timeout positive, and "
                         "--max-attempts at least 1")


def jail(argv: list[str], work: Path, hidden: list[Path]) -> list[str]:
    """`argv` under bubblewrap: no network, the host read-only, `work` writable, `hidden`
    folders and the user's home replaced by empty ones, /tmp and /run private (the Docker
    socket with them); the interpreter, the venv and envhub's own code bound back read-only
    where those cover them."""
    bwrap = shutil.which("bwrap")
    assert bwrap is not None  # check_config
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-net", "--unshare-ipc",
            "--unshare-pid", "--unshare-uts", "--ro-bind", "/", "/", "--dev", "/dev",
            "--proc", "/proc", "--size", str(JAIL_TMPFS_BYTES), "--tmpfs", "/tmp",
            "--size", str(JAIL_TMPFS_BYTES), "--tmpfs", "/run"]
    covered = [Path("/tmp").resolve(), Path("/run").resolve()]
    home = Path.home().resolve()
    if home != Path("/") and home.is_dir():
        args += ["--size", str(JAIL_TMPFS_BYTES), "--tmpfs", str(home)]
        covered.append(home)
    # the interpreter, the venv and envhub's code where the fresh /tmp, /run or home cover
    # them (a checkout in /tmp, a pyenv in the home): bound back read-only
    for keep in sorted(_kept()):
        if any(keep.is_relative_to(root) for root in covered):
            args += ["--ro-bind", str(keep), str(keep)]
    for folder in hidden:  # after the binds above: hidden even inside them
        if folder.is_dir() and folder.resolve() != Path("/"):
            args += ["--size", str(1 << 20), "--tmpfs", str(folder.resolve())]
    args += ["--bind", str(work), str(work), "--chdir", str(work)]
    return [*args, "--", *argv]


NOBODY = 65534  # the uid and gid a root worker's audits run as


def unprivileged(argv: list[str], work: Path) -> list[str]:
    """`argv` (the jail) started as nobody when this worker is root. bubblewrap run by root
    keeps root's capabilities inside, with which the package's code could unmount what the
    jail hides (the registry's key) or remount the host read-write. As nobody it has none, and
    bubblewrap runs unprivileged (its own user namespace, where the sandboxes the audit starts
    nest). Interpreter and code under root's home (0700: nobody cannot pass) are moved into a
    private mount namespace's fresh home first; `work` is handed to nobody."""
    if os.geteuid() != 0:
        return argv
    setpriv, unshare = shutil.which("setpriv"), shutil.which("unshare")
    assert setpriv is not None and unshare is not None  # check_config
    for path in (work, *work.rglob("*")):
        os.lchown(path, NOBODY, NOBODY)
    home = Path.home().resolve()
    stage = work / ".stage"
    lines = ["set -e"]
    if home != Path("/") and home.is_dir():
        keep = sorted(p for p in _kept() if p.is_relative_to(home))
        for i, path in enumerate(keep):
            lines += [f"mkdir -p {stage}/{i}", f"mount --rbind {_q(path)} {stage}/{i}"]
        lines.append(f"mount -t tmpfs -o mode=0755,nosuid,nodev envhub-jail-home {_q(home)}")
        for i, path in enumerate(keep):
            lines += [f"mkdir -p {_q(path)}", f"mount --move {stage}/{i} {_q(path)}"]
    lines.append(f'exec {setpriv} --reuid {NOBODY} --regid {NOBODY} --clear-groups '
                 '--inh-caps=-all --bounding-set=-all -- "$@"')
    return [unshare, "--mount", "--propagation", "private", "--", "sh", "-c",
            "\n".join(lines), "envhub-jail", *argv]


def _kept() -> set[Path]:
    """The interpreter, the venv and envhub's own code: what the jail binds back where its
    fresh folders cover them."""
    code = Path(__file__).resolve().parents[1]  # envhub's checkout or site-packages
    return {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), code}


def _q(path: Path) -> str:
    return shlex.quote(str(path))


class Worker:
    def __init__(self, cfg: WorkerConfig) -> None:
        check_config(cfg)
        self.cfg = cfg
        self.catalog = Catalog.existing(cfg.data, cfg.db)
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._stopping = False

    def stop(self) -> None:
        self._stopping = True

    def run(self) -> int:
        """Audit jobs until stopped (or, with `once`, until none waits); the number done."""
        done = 0
        try:
            while not self._stopping:
                job = self.catalog.claim_job(self.id, self.cfg.lease_s, self.cfg.max_attempts)
                if job is None:
                    if self.cfg.once:
                        break
                    time.sleep(self.cfg.poll_s)
                    continue
                log.info("auditing %s (%s), attempt %d", job.ref, job.digest, job.attempt)
                try:
                    self.audit(job)
                except Exception as e:  # noqa: BLE001 - one job's failure must not stop the queue
                    log.exception("%s: the worker failed on it", job.ref)
                    try:
                        self.catalog.fail_job(job, self.id, f"the worker failed on it "
                                              f"({type(e).__name__})")
                    except Exception:  # noqa: BLE001 - the database itself: the lease lapses
                        log.exception("%s: cannot record the failure", job.ref)
                done += 1
        finally:
            self.catalog.close()
        return done

    def audit(self, job: AuditJob) -> None:
        with tempfile.TemporaryDirectory(prefix="envhub-verify-") as tmp, \
                bounded(Path(tmp), self.cfg.disk_mb):
            work = Path(tmp)
            try:
                tree = self._unpack(job, work)
            except RegistryError as e:
                self.catalog.fail_job(job, self.id, e.message)
                return
            if not self.catalog.renew_job(job, self.id, self.cfg.lease_s):
                return  # unpacking outlasted the lease: another worker has it
            report = work / "report.json"
            argv = [sys.executable, "-m", "envhub", "audit", str(tree), "--json", str(report),
                    "-t", str(self.cfg.tasks), "--timeout", str(self.cfg.cheat_timeout_s),
                    "--out", str(work / "runs")]
            for kind in self.cfg.sandboxes:
                argv += ["--sandbox", kind]
            (work / "scratch").mkdir()
            if self.cfg.jail:
                argv = unprivileged(jail(argv, work, [self.cfg.data, envhub_home()]), work)
            # resources: memory and file size by rlimits (inherited by everything the audit
            # starts), time by the job's timeout (so CPU time by it times the cores)
            argv = [*_limits(self.cfg), *argv]
            # an allow-list: nothing of the worker's environment (keys, database URLs,
            # tokens) reaches the package's code
            env = {k: v for k, v in os.environ.items() if k in PASSED_ENV or k.startswith("LC_")}
            env.update(HOME=str(work / "home"), ENVHUB_HOME=str(work / "envhub-home"),
                       XDG_CACHE_HOME=str(work / "cache"), TMPDIR=str(work / "scratch"))
            outcome, tail = self._run(job, argv, env, work)
            if outcome is None:
                return  # failed (recorded) or no longer ours
            text = _read_regular(report, MAX_REPORT_BYTES)
            if text is None:
                self.catalog.fail_job(job, self.id, f"the audit exited {outcome} without a "
                                      "report", detail=tail)
                return
            try:
                data = json.loads(text)
                if not isinstance(data, dict):
                    raise ValueError("it is not a JSON object")
                self._check_complete(data)
                # the registry's own record: the stored digest, this worker's envhub, its date
                # and the sandbox kinds it ran, never what the report (package-writable) says
                summary = summarize({**data, "digest": job.digest, "envhub_version": __version__,
                                     "date": datetime.now(UTC).isoformat()})
            except ValueError as e:
                self.catalog.fail_job(job, self.id, f"the audit's report is unusable: "
                                      f"{str(e)[:300]}", detail=tail)
                return
            summary = summary.model_copy(update={"sandboxes": sorted(self.cfg.sandboxes)})
            if not self.catalog.finish_job(job, self.id, summary, text):
                log.warning("%s: lost the job before it finished; nothing recorded", job.ref)

    def _check_complete(self, data: dict) -> None:
        """A report of the whole battery in every sandbox kind asked for (both controls in
        each), not a few rows written by the package's own code (ValueError otherwise)."""
        rows = [r for r in data.get("rows", []) if isinstance(r, dict)]
        for kind in self.cfg.sandboxes:
            names = {r.get("cheat") for r in rows if r.get("sandbox") in (kind, "none")}
            missing = [c for c in CONTROLS if c not in names]
            if missing:
                raise ValueError(f"it has no {', '.join(missing)} row for sandbox {kind}")

    def _unpack(self, job: AuditJob, work: Path) -> Path:
        blob = self.catalog.blob_path(job.digest)
        got = sha256_file(blob)
        if got != job.digest:
            raise RegistryError(f"the stored blob of {job.ref} has digest {got}, not the "
                                f"published {job.digest}: the registry's blob folder was "
                                "changed; nothing was audited")
        tree = work / "package"
        tree.mkdir()
        unpack_into(blob, tree, self.catalog.limits)
        return tree

    def _run(self, job: AuditJob, argv: list[str], env: dict[str, str],
             work: Path) -> tuple[int | None, str]:
        """Run the audit, renewing the lease: (its exit code, or None when it was killed past
        the job's time or the job was taken from this worker; the tail of its output). The
        output is read back through the worker's own descriptor of an unnamed file, never by
        a path the package could have replaced (a symlink to the registry's key)."""
        started = time.monotonic()
        with tempfile.TemporaryFile() as out:
            proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                while True:
                    try:
                        return proc.wait(timeout=self.cfg.lease_s / 3), _tail(out)
                    except subprocess.TimeoutExpired:
                        pass
                    if time.monotonic() - started > self.cfg.job_timeout_s:
                        _kill(proc)
                        self.catalog.fail_job(
                            job, self.id, f"its audit did not finish within "
                            f"{self.cfg.job_timeout_s:g} s and was stopped (a package whose "
                            "audit hangs)", detail=_tail(out))
                        return None, ""
                    if not self.catalog.renew_job(job, self.id, self.cfg.lease_s):
                        _kill(proc)
                        return None, ""
            finally:
                if proc.poll() is None:
                    _kill(proc)


@contextlib.contextmanager
def bounded(work: Path, disk_mb: int) -> Iterator[None]:
    """`work` on a tmpfs of `disk_mb` while the audit runs, so that what the package writes
    stops at ENOSPC there (as root; other users keep the per-file bound only, said once)."""
    global _unbounded_said
    if os.geteuid() != 0 or shutil.which("mount") is None:
        if not _unbounded_said:
            _unbounded_said = True
            log.warning("not root: an audit's folder is bounded per file only (--file-mb)")
        yield
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={disk_mb}m,mode=0700,nosuid,nodev",
                    "envhub-audit", str(work)], check=True, capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(work)], capture_output=True, timeout=30,
                       check=False)


_unbounded_said = False


def _limits(cfg: WorkerConfig) -> list[str]:
    """The argv prefix setting the audit process's rlimits (util-linux prlimit)."""
    prlimit = shutil.which("prlimit")
    assert prlimit is not None  # check_config
    return [prlimit, f"--data={cfg.memory_mb << 20}", f"--fsize={cfg.file_mb << 20}",
            "--core=0", "--"]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _tail(out: IO[bytes]) -> str:
    size = out.seek(0, os.SEEK_END)
    out.seek(max(0, size - LOG_TAIL))
    return out.read(LOG_TAIL).decode(errors="replace")


def _read_regular(path: Path, limit: int) -> str | None:
    """A file the package wrote, only if it is a regular file (no symlink followed) of at most
    `limit` bytes; None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return f.read(limit + 1)[:limit].decode("utf-8", errors="replace")
