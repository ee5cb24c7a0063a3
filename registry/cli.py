"""`envhub` commands owned by the registry component: pack, publish, install, search, yank,
login, and `envhub registry serve | token create`.

Heavy imports stay inside the commands so `envhub --help` stays fast. Every expected
failure prints `error: <what to fix>` on stderr and exits with code 2.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])

HERE = Path(".")
REGISTRY_HELP = "registry URL, or 'local' (default: $ENVHUB_REGISTRY, `envhub login`, local)"
TOKEN_HELP = "API token (default: $ENVHUB_TOKEN or the one saved by `envhub login`)"
RegistryOpt = Annotated[str | None, typer.Option("--registry", help=REGISTRY_HELP)]
TokenOpt = Annotated[str | None, typer.Option("--token", help=TOKEN_HELP)]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _errors_exit_2(fn: F) -> F:
    """Turn expected failures (bad input, refused packages, unreachable registry) into
    a one-line message and exit code 2 instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from envhub.envs.manifest import ManifestError
        from envhub.registry.errors import MissingExtra, RegistryError

        try:
            return fn(*args, **kwargs)
        except RegistryError as e:
            raise _fail(e.message) from None
        except (ManifestError, MissingExtra) as e:
            raise _fail(str(e)) from None

    return wrapper  # type: ignore[return-value]


def _run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


def pack_cmd(
    path: Annotated[Path, typer.Argument(help="environment folder (with envhub.toml)")] = HERE,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="output folder (default: PATH/dist)")] = None,
) -> None:
    """Build the deterministic .tar.gz of an environment and print its sha256 digest."""
    from envhub.registry.archive import pack

    packed = pack(path, out)
    typer.echo(f"{packed.path}\n{packed.digest}  {packed.size} bytes, {packed.files} files")


# How `envhub publish` runs `envhub audit` on the package it uploads: (unpacked tree, its
# digest, output folder, tasks, seconds per cheat) -> the audit's JSON file. The orchestrator's,
# given at registration (envhub/cli.py): this component imports none of it.
Auditor = Callable[[Path, str, Path, int, float], Awaitable[Path]]
_auditor: Auditor | None = None


@dataclass
class AuditChoice:
    """How `envhub publish` gets the package's audit (exactly one way; never skipped unsaid)."""

    file: Path | None = None  # --audit FILE
    skip: bool = False  # --no-audit: recorded and shown as not audited
    tasks: int = 2  # when publish runs the audit itself
    timeout_s: float = 900.0
    out: Path | None = None


async def _audit_package(archive: Path, digest: str, manifest: Any, choice: AuditChoice,
                         tmp: Path) -> Any:
    """The package's AuditSummary: checked from --audit FILE, or the audit run now on the
    unpacked package (the same code as `envhub audit`), or not_audited for --no-audit."""
    import time

    from envhub.registry.audits import load_audit_file
    from envhub.registry.extract import unpack_into
    from envhub.registry.models import not_audited

    name, version = manifest.name, manifest.version
    if choice.skip:
        return not_audited("the publisher passed --no-audit")
    if choice.file is not None:
        return load_audit_file(choice.file, digest, name, version)
    tree = tmp / "package" / name  # the folder name is what the loader calls it
    tree.mkdir(parents=True)
    unpack_into(archive, tree)
    out = choice.out or Path("runs") / time.strftime(
        f"publish-audit-{name}-{version}-%Y%m%d-%H%M%S", time.gmtime())
    if _auditor is None:
        raise _fail("this install cannot audit a package (no orchestrator registered): pass "
                    "--audit FILE from `envhub audit --json`, or --no-audit")
    typer.echo(f"auditing {name}@{version} ({digest}) before publishing: runs go to {out}/ "
               "(--audit FILE uses an earlier `envhub audit --json`)", err=True)
    report = await _auditor(tree, digest, out, choice.tasks, choice.timeout_s)
    typer.echo(f"audit report: {report}", err=True)
    return load_audit_file(report, digest, name, version)


async def _publish(path: Path, registry: str | None, token: str | None,
                   owner: str | None, choice: AuditChoice,
                   sign: Path | None = None) -> tuple[str, Any]:
    import tempfile

    from envhub.registry.archive import pack, sha256_file
    from envhub.registry.errors import BadRequest
    from envhub.registry.extract import scan
    from envhub.registry.refs import check_owner
    from envhub.registry.sources import open_registry

    with tempfile.TemporaryDirectory(prefix="envhub-publish-") as tmp:
        if path.is_file():
            archive, digest, manifest = path, sha256_file(path), scan(path).manifest
        else:
            packed = pack(path, tmp)
            archive, digest, manifest = packed.path, packed.digest, packed.manifest
        reg = open_registry(registry, token)
        try:
            who = owner or manifest.metadata.get("owner") or await reg.default_owner()
            if who is None and reg.location != "local":
                raise BadRequest("which owner? pass --owner NAME (your token may publish "
                                 "under several owners)")
            who = check_owner(str(who or "local"))
            signature = None
            if sign is not None:  # before the audit: a bad key file costs nothing
                from envhub.registry.signing import publisher_record, sign_as_publisher

                signature = sign_as_publisher(sign, publisher_record(
                    who, manifest.name, manifest.version, digest))[1]
            # after the cheap checks, before the upload: a refused audit publishes nothing
            summary = await _audit_package(archive, digest, manifest, choice, Path(tmp))
            result = await reg.publish(who, archive, digest, manifest.name, manifest.version,
                                       summary, signature)
        finally:
            await reg.aclose()
        return reg.location, result


@_errors_exit_2
def publish_cmd(
    path: Annotated[Path, typer.Argument(
        help="environment folder, or a .tar.gz from pack")] = HERE,
    registry: RegistryOpt = None,
    token: TokenOpt = None,
    owner: Annotated[str | None, typer.Option(
        "--owner", help="publish as OWNER/name (default: manifest metadata.owner, the "
        "token's only owner, or 'local')")] = None,
    audit_file: Annotated[Path | None, typer.Option(
        "--audit", help="the JSON of `envhub audit FOLDER --json FILE` for exactly this "
        "package, passing, at most 30 days old (default: run the audit now)")] = None,
    no_audit: Annotated[bool, typer.Option(
        "--no-audit", help="publish without an audit: the registry shows the version as "
        "NOT AUDITED and `envhub install` warns")] = False,
    audit_tasks: Annotated[int, typer.Option(
        "--audit-tasks", min=1, max=1000, help="tasks the audit run by publish uses")] = 2,
    audit_timeout: Annotated[float, typer.Option(
        "--audit-timeout", min=1, help="seconds one cheat's run may take")] = 900.0,
    audit_out: Annotated[Path | None, typer.Option(
        "--audit-out", help="folder for the audit's runs (default: runs/publish-audit-*)")
    ] = None,
    sign: Annotated[Path | None, typer.Option(
        "--sign", help="sign the upload with this publisher key (`envhub registry keygen`; "
        "required once the registry's operator registered the owner's key)")] = None,
) -> None:
    """Pack (if needed), audit and publish an environment: immutable, addressed as
    owner/name@version. Exit 1 when the audit flags a cheat, 2 on bad input or a missing,
    stale or mismatched --audit file."""
    from envhub.registry.audits import AuditFlagged
    from envhub.registry.errors import BadRequest

    if no_audit and audit_file is not None:
        raise BadRequest("--audit FILE and --no-audit contradict each other; pass one")
    choice = AuditChoice(audit_file, no_audit, audit_tasks, audit_timeout, audit_out)
    try:
        location, result = _run(_publish(path, registry, token, owner, choice, sign))
    except AuditFlagged as e:
        typer.echo(f"error: {e.message}", err=True)
        raise typer.Exit(1) from None
    v = result.version
    state = "published" if result.created else "already published (same content)"
    typer.echo(f"{v.ref} {state} to {location}\n{v.digest}\n{v.audit.label}")
    if v.audit.status == "not_audited":
        typer.echo(f"warning: {v.ref} is NOT AUDITED on {location}; users are warned at "
                   "install", err=True)


@_errors_exit_2
def install_cmd(
    ref: Annotated[str, typer.Argument(help="owner/name@version (or a range, or latest)")],
    registry: RegistryOpt = None,
    token: TokenOpt = None,
    deps: Annotated[bool, typer.Option(
        "--deps/--no-deps", help="pip-install the declared dependencies into the interpreter "
        "running envhub (off by default: an environment's requirements run code there)")
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="reinstall even if installed")] = False,
    require: Annotated[str | None, typer.Option(
        "--require", help="'verified': refuse a version the registry's own audit did not "
        "verify (pending, claimed, flagged, failed; default: $ENVHUB_REQUIRE)")] = None,
) -> None:
    """Download, verify and unpack an environment into ENVHUB_HOME/envs."""
    from envhub.registry.install import install
    from envhub.registry.sources import open_registry

    async def go() -> Any:
        reg = open_registry(registry, token)
        try:
            return await install(ref, reg, install_deps=deps, force=force, require=require)
        finally:
            await reg.aclose()

    env = _run(go())
    typer.echo(f"{env.ref} installed at {env.path}\nregistry's audit: {env.verification}\n"
               f"publisher's claim: {env.audit.label}"
               + (f"\nsigned by its publisher: {env.publisher_key}" if env.publisher_key
                  else ""))
    if env.verification == "flagged":
        typer.echo(f"warning: the registry's own audit FLAGGED {env.ref}: its verifier "
                   f"rewards cheating; `envhub info {env.ref}` names the cheats", err=True)
    elif env.verification != "verified" and env.audit.status != "passed":
        typer.echo(f"warning: {env.ref} is {env.audit.label}; its verifier may reward "
                   f"cheating: run `envhub audit {env.ref}` before training on it", err=True)
    if env.missing_dependencies:
        typer.echo("warning: not installed: " + " ".join(env.missing_dependencies) + f"; "
                   f"`envhub install {env.ref} --deps --force` pip-installs them into "
                   f"{sys.executable}, or install them yourself before running", err=True)


@_errors_exit_2
def search_cmd(
    query: Annotated[str, typer.Argument(help="text in owner/name or description")] = "",
    registry: RegistryOpt = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Find environments in the registry."""
    from envhub.registry.sources import open_registry

    async def go() -> Any:
        reg = open_registry(registry)
        try:
            return await reg.search(query, limit)
        finally:
            await reg.aclose()

    hits = _run(go())
    if as_json:
        typer.echo(json.dumps([h.model_dump() for h in hits], indent=2))
        return
    for h in hits:
        typer.echo(f"{h.owner}/{h.name}@{h.latest or '-'}  {h.description}")
    if not hits:
        typer.echo("no matches", err=True)


@_errors_exit_2
def yank_cmd(
    ref: Annotated[str, typer.Argument(help="owner/name@version (an exact version)")],
    undo: Annotated[bool, typer.Option("--undo", help="un-yank")] = False,
    registry: RegistryOpt = None,
    token: TokenOpt = None,
) -> None:
    """Yank a version: ranges and `latest` skip it; pinning the exact version still works."""
    from envhub.registry.errors import BadRequest
    from envhub.registry.refs import PackageRef
    from envhub.registry.sources import open_registry

    pref = PackageRef.parse(ref)
    version = pref.spec.exact
    if version is None:
        raise BadRequest(f"yank needs an exact version, e.g. {pref.full_name}@1.2.0")

    async def go() -> Any:
        reg = open_registry(registry, token)
        try:
            return await reg.yank(pref.owner, pref.name, version, not undo)
        finally:
            await reg.aclose()

    v = _run(go())
    typer.echo(f"{v.ref} {'yanked' if v.yanked else 'un-yanked'}")


@_errors_exit_2
def login_cmd(
    url: Annotated[str, typer.Argument(help="registry URL, e.g. http://host:8500")],
    token: Annotated[str, typer.Option("--token", prompt=True, hide_input=True, help="API token")],
    no_default: Annotated[bool, typer.Option(
        "--no-default", help="save the token but keep the current default registry")] = False,
) -> None:
    """Check a token against a registry and save it (and make that registry the default)."""
    from envhub.registry.client import RegistryClient
    from envhub.registry.home import load_credentials, normalize_url, save_credentials

    url = normalize_url(url)

    async def go() -> list[str]:
        async with RegistryClient(url, token) as client:
            return await client.whoami()

    owners = _run(go())
    creds = load_credentials()
    creds.tokens[url] = token
    if not no_default:
        creds.default = url
    path = save_credentials(creds)
    typer.echo(f"logged in to {url} as {', '.join(owners)} (saved in {path})")


@_errors_exit_2
def serve_cmd(
    data: Annotated[Path, typer.Option("--data", help="folder for blobs and the SQLite index")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8500,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    db: Annotated[str | None, typer.Option("--db", help="index DB URL (postgresql://...)")] = None,
    max_upload_mb: Annotated[float, typer.Option(
        "--max-upload-mb", min=0.001, help="largest accepted .tar.gz")] = 100.0,
    owner_quota_mb: Annotated[float, typer.Option(
        "--owner-quota-mb", min=0.001, help="archive megabytes stored per owner (yanked "
        "versions count); past it a publish is 413 quota_exceeded")] = 10240.0,
    uploads_per_hour: Annotated[int, typer.Option(
        "--uploads-per-hour", min=1, max=1_000_000, help="uploads one token may start in any "
        "hour (per server process); past it 429 with Retry-After")] = 120,
    audit_workers: Annotated[int, typer.Option(
        "--audit-workers", min=0, max=64, help="`envhub registry worker` processes started "
        "beside the server (jailed, local sandboxes), auditing every uploaded version")] = 0,
) -> None:
    """Run a shared HTTP registry (FastAPI; OpenAPI at /openapi.json)."""
    import subprocess
    import threading

    from envhub.registry.limits import Limits
    from envhub.registry.server import ServerConfig, serve

    limits = Limits(max_archive_bytes=int(max_upload_mb * (1 << 20)),
                    max_owner_bytes=int(owner_quota_mb * (1 << 20)),
                    uploads_per_hour=uploads_per_hour)
    argv = [sys.executable, "-m", "envhub", "registry", "worker", "--data", str(data),
            *(["--db", db] if db else [])]
    workers = [subprocess.Popen(argv) for _ in range(audit_workers)]
    stopping = threading.Event()

    def supervise() -> None:  # a worker that died (a poison job, the OOM killer) comes back
        while not stopping.wait(2):
            for i, proc in enumerate(workers):
                if proc.poll() is not None:
                    typer.echo(f"audit worker {proc.pid} exited ({proc.returncode}); "
                               "starting another", err=True)
                    workers[i] = subprocess.Popen(argv)

    if workers:
        threading.Thread(target=supervise, daemon=True).start()
    try:
        serve(ServerConfig(data=data, db=db, host=host, port=port, limits=limits))
    finally:
        stopping.set()
        for proc in workers:
            proc.terminate()
        for proc in workers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


@_errors_exit_2
def worker_cmd(
    data: Annotated[Path, typer.Option("--data", help="the registry's data folder (its blobs)")],
    db: Annotated[str | None, typer.Option("--db", help="index DB URL (postgresql://...)")] = None,
    sandbox: Annotated[list[str] | None, typer.Option(
        "--sandbox", help="sandbox kind the audit uses (repeatable): local (default), docker "
        "(needs --unjailed)")] = None,
    tasks: Annotated[int, typer.Option("--tasks", "-t", min=1, max=100,
                                       help="tasks per cheat")] = 2,
    cheat_timeout: Annotated[float, typer.Option(
        "--cheat-timeout", min=1, help="seconds one cheat's run may take")] = 300.0,
    job_timeout: Annotated[float, typer.Option(
        "--job-timeout", min=1, help="seconds one version's whole audit may take; past it the "
        "version is shown as failed and the next job runs")] = 3600.0,
    lease: Annotated[float, typer.Option(
        "--lease", min=3, help="seconds a job stays this worker's without a renewal (a dead "
        "worker's job is taken again after it)")] = 60.0,
    max_attempts: Annotated[int, typer.Option("--max-attempts", min=1, max=20)] = 3,
    once: Annotated[bool, typer.Option("--once", help="stop when the queue is empty")] = False,
    memory_mb: Annotated[int, typer.Option(
        "--memory-mb", min=256, help="memory (data segment) of the audit process and of each "
        "process it starts; a package past it fails its audit")] = 8192,
    file_mb: Annotated[int, typer.Option(
        "--file-mb", min=1, help="the largest file the audit may write")] = 4096,
    disk_mb: Annotated[int, typer.Option(
        "--disk-mb", min=64, help="all one audit may write (a tmpfs at its folder, when run "
        "as root: memory, not disk)")] = 16384,
    unjailed: Annotated[bool, typer.Option(
        "--unjailed", help="run audits without the bubblewrap jail (the packages' code gets "
        "the network and this user's files): only for registries that trust publishers")
    ] = False,
) -> None:
    """Audit every uploaded version of a registry (its durable queue), in a jail."""
    import logging
    import signal

    from envhub.registry.verify import Worker, WorkerConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(message)s")
    worker = Worker(WorkerConfig(
        data=data, db=db, sandboxes=sandbox or ["local"], tasks=tasks,
        cheat_timeout_s=cheat_timeout, job_timeout_s=job_timeout, lease_s=lease,
        max_attempts=max_attempts, once=once, jail=not unjailed, memory_mb=memory_mb,
        file_mb=file_mb, disk_mb=disk_mb))
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    done = worker.run()
    typer.echo(f"audited {done} version(s)", err=True)


@_errors_exit_2
def token_create_cmd(
    owner: Annotated[list[str], typer.Option(
        "--owner", help="owner the token may publish under (repeat for several)")],
    data: Annotated[Path, typer.Option("--data", help="the registry's data folder")],
    db: Annotated[str | None, typer.Option("--db", help="index DB URL (postgresql://...)")] = None,
    label: Annotated[str, typer.Option("--label", help="a note for whoever audits tokens")] = "",
) -> None:
    """Create an API token; it is printed once (only its hash is stored)."""
    from envhub.registry.catalog import Catalog
    from envhub.registry.refs import check_owner

    for name in owner:  # before the data folder is created
        check_owner(name)
    catalog = Catalog(data, db)
    try:
        typer.echo(catalog.create_token(owner, label))
    finally:
        catalog.close()


@_errors_exit_2
def keygen_cmd(
    out: Annotated[Path, typer.Option("--out", help="file for the private key (0600); the "
                                      "public key goes to OUT.pub")],
) -> None:
    """Make an ed25519 publisher key: sign uploads with `envhub publish --sign OUT`, and give
    OUT.pub to the registry's operator (`envhub registry publisher-key`)."""
    from envhub.registry.signing import generate_publisher_key

    public = generate_publisher_key(out)
    typer.echo(f"private key: {out} (keep it secret)\npublic key: {out}.pub\n{public}")


@_errors_exit_2
def publisher_key_cmd(
    owner: Annotated[str, typer.Option("--owner", help="the owner whose uploads must be "
                                       "signed with this key")],
    key: Annotated[str, typer.Option("--key", help="the owner's public key: a KEY.pub file "
                                     "from `envhub registry keygen`, or its base64 text")],
    data: Annotated[Path, typer.Option("--data", help="the registry's data folder")],
    db: Annotated[str | None, typer.Option("--db", help="index DB URL (postgresql://...)")] = None,
) -> None:
    """Register (or replace) an owner's publisher key: from now on the registry takes that
    owner's uploads only when signed with it, and installs check the signature."""
    from envhub.registry.catalog import Catalog
    from envhub.registry.refs import check_owner
    from envhub.registry.signing import check_public_key

    check_owner(owner)
    try:
        text = Path(key).read_text(encoding="ascii", errors="replace") if Path(
            key).is_file() else key
    except OSError:  # a name too long for a file: the key's text
        text = key
    check_public_key(text)  # before the data folder is created
    catalog = Catalog.existing(data, db)
    try:
        kid = catalog.set_publisher_key(owner, text)
    finally:
        catalog.close()
    typer.echo(f"{owner}'s uploads must now be signed with {kid}")


@_errors_exit_2
def reaudit_cmd(
    data: Annotated[Path, typer.Option("--data", help="the registry's data folder")],
    db: Annotated[str | None, typer.Option("--db", help="index DB URL (postgresql://...)")] = None,
    all_versions: Annotated[bool, typer.Option(
        "--all", help="every finished audit (default: the failed ones and those another "
        "envhub version ran)")
    ] = False,
) -> None:
    """Queue finished audits again for the workers (after an envhub upgrade changed the
    battery); superseded verdicts are kept in the audit history."""
    from envhub import __version__
    from envhub.registry.catalog import Catalog

    catalog = Catalog.existing(data, db)
    try:
        queued = catalog.reaudit(None if all_versions else __version__)
    finally:
        catalog.close()
    typer.echo(f"{queued} version(s) queued for a new audit")


def register(app: typer.Typer, auditor: Auditor | None = None) -> None:
    """Add this component's commands to the top-level app; `auditor` runs the audit that
    `envhub publish` records (without one, publish takes only --audit FILE or --no-audit)."""
    global _auditor
    _auditor = auditor
    app.command("pack")(_errors_exit_2(pack_cmd))
    app.command("publish")(publish_cmd)
    app.command("install")(install_cmd)
    app.command("search")(search_cmd)
    app.command("yank")(yank_cmd)
    app.command("login")(login_cmd)
    registry_app = typer.Typer(help="Run and administer a shared registry.",
                               no_args_is_help=True)
    registry_app.command("serve")(serve_cmd)
    registry_app.command("worker")(worker_cmd)
    registry_app.command("reaudit")(reaudit_cmd)
    registry_app.command("keygen")(keygen_cmd)
    registry_app.command("publisher-key")(publisher_key_cmd)
    token_app = typer.Typer(help="API tokens for publishing.", no_args_is_help=True)
    token_app.command("create")(token_create_cmd)
    registry_app.add_typer(token_app, name="token")
    app.add_typer(registry_app, name="registry")
