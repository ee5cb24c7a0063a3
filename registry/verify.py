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

The jail (bubblewrap): the package's own Python runs in the audit process, so the audit runs
with no network (its gateway and sandboxes on the jail's own loopback), the host read-only,
a private /tmp, /run and HOME, and the registry's data folder, the worker's ENVHUB_HOME and
/root hidden; the Docker socket is not reachable, so jailed audits use local (bubblewrap)
sandboxes. `--sandbox docker` needs `--unjailed`: the packages' code then runs as the worker's
user with the Docker socket, for registries that trust their publishers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from envhub.registry.archive import sha256_file
from envhub.registry.audits import summarize
from envhub.registry.catalog import AuditJob, Catalog
from envhub.registry.errors import BadRequest, RegistryError
from envhub.registry.extract import unpack_into
from envhub.registry.home import envhub_home

log = logging.getLogger("envhub.registry.verify")
LOG_TAIL = 1500


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
    if cfg.lease_s < 3 or cfg.job_timeout_s < 1 or cfg.max_attempts < 1:
        raise BadRequest("--lease must be at least 3 s, --job-timeout positive, and "
                         "--max-attempts at least 1")


def jail(argv: list[str], work: Path, hidden: list[Path]) -> list[str]:
    """`argv` under bubblewrap: no network, the host read-only, `work` writable, `hidden`
    folders replaced by empty ones (the user's home among them, with the interpreter, the
    venv and envhub's own code bound back read-only when they live there), /tmp and /run
    private (the Docker socket with them)."""
    bwrap = shutil.which("bwrap")
    assert bwrap is not None  # check_config
    args = [bwrap, "--die-with-parent", "--new-session", "--unshare-net", "--unshare-ipc",
            "--unshare-pid", "--unshare-uts", "--ro-bind", "/", "/", "--dev", "/dev",
            "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run"]
    home = Path.home().resolve()
    if home != Path("/") and home.is_dir():
        args += ["--tmpfs", str(home)]
        code = Path(__file__).resolve().parents[1]  # envhub's checkout or site-packages
        for keep in {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), code}:
            if keep.is_relative_to(home):
                args += ["--ro-bind", str(keep), str(keep)]
    for folder in hidden:  # after the binds above: hidden even inside them
        if folder.is_dir() and folder.resolve() != Path("/"):
            args += ["--tmpfs", str(folder.resolve())]
    args += ["--bind", str(work), str(work), "--chdir", str(work)]
    return [*args, "--", *argv]


class Worker:
    def __init__(self, cfg: WorkerConfig) -> None:
        check_config(cfg)
        self.cfg = cfg
        self.catalog = Catalog(cfg.data, cfg.db)
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
                self.audit(job)
                done += 1
        finally:
            self.catalog.close()
        return done

    def audit(self, job: AuditJob) -> None:
        with tempfile.TemporaryDirectory(prefix="envhub-verify-") as tmp:
            work = Path(tmp)
            try:
                tree = self._unpack(job, work)
            except RegistryError as e:
                self.catalog.fail_job(job, self.id, e.message)
                return
            report = work / "report.json"
            argv = [sys.executable, "-m", "envhub", "audit", str(tree), "--json", str(report),
                    "-t", str(self.cfg.tasks), "--timeout", str(self.cfg.cheat_timeout_s),
                    "--out", str(work / "runs")]
            for kind in self.cfg.sandboxes:
                argv += ["--sandbox", kind]
            if self.cfg.jail:
                argv = jail(argv, work, [self.cfg.data, envhub_home()])
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("ENVHUB_TOKEN", "ENVHUB_REGISTRY", "AWS_", "E2B_"))}
            env.update(HOME=str(work / "home"), ENVHUB_HOME=str(work / "envhub-home"),
                       XDG_CACHE_HOME=str(work / "cache"), TMPDIR=str(work / "scratch"))
            (work / "scratch").mkdir()
            outcome = self._run(job, argv, env, work)
            if outcome is None:
                return  # failed (recorded) or no longer ours
            if not report.is_file():
                self.catalog.fail_job(job, self.id, f"the audit exited {outcome} without a "
                                      f"report: {_tail(work / 'audit.log')}")
                return
            text = report.read_text(encoding="utf-8")
            try:
                summary = summarize(json.loads(text))
            except ValueError as e:
                self.catalog.fail_job(job, self.id, f"the audit's report is unreadable: {e}")
                return
            # the registry's own record of what it verified: the stored digest
            summary = summary.model_copy(update={"digest": job.digest})
            if not self.catalog.finish_job(job, self.id, summary, text):
                log.warning("%s: lost the job before it finished; nothing recorded", job.ref)

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
             work: Path) -> int | None:
        """Run the audit, renewing the lease; its exit code, or None when it was killed
        (past the job's time, or the job was taken from this worker)."""
        started = time.monotonic()
        with open(work / "audit.log", "wb") as out:
            proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                while True:
                    try:
                        return proc.wait(timeout=self.cfg.lease_s / 3)
                    except subprocess.TimeoutExpired:
                        pass
                    if time.monotonic() - started > self.cfg.job_timeout_s:
                        _kill(proc)
                        self.catalog.fail_job(
                            job, self.id, f"its audit did not finish within "
                            f"{self.cfg.job_timeout_s:g} s and was stopped (a package whose "
                            "audit hangs)")
                        return None
                    if not self.catalog.renew_job(job, self.id, self.cfg.lease_s):
                        _kill(proc)
                        return None
            finally:
                if proc.poll() is None:
                    _kill(proc)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path) -> str:
    try:
        return path.read_bytes()[-LOG_TAIL:].decode(errors="replace")
    except OSError:
        return ""
