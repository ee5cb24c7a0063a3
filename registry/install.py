"""Installing packages into `<home>/envs/<owner>/<name>/<version>/` and finding them again.

An install checks the registry's signed version record against the registry's key as this
machine pinned it (registry/signing.py) and the registry's own audit record the same way,
downloads the blob, checks its sha256 against the signed digest, unpacks it safely into a
staging folder, checks the manifest names the requested package, installs missing declared
dependencies, and only then renames the folder into place: a failure at any step leaves
nothing behind. `require="verified"` (`--require verified`, `ENVHUB_REQUIRE=verified`) refuses
a version this registry's own audit did not verify.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from envhub.registry.archive import check_dependencies, sha256_file
from envhub.registry.blobs import check_digest
from envhub.registry.catalog import check_version, version_record
from envhub.registry.deps import pip_install, unsatisfied
from envhub.registry.errors import (
    BadPackage,
    DigestMismatch,
    NotFound,
    RegistryError,
    TooLarge,
)
from envhub.registry.extract import unpack_into
from envhub.registry.home import LOCAL, envhub_home
from envhub.registry.limits import Limits
from envhub.registry.models import AuditSummary, SigningKey, VersionInfo, not_audited
from envhub.registry.refs import PackageRef, Version
from envhub.registry.signing import (
    SignatureError,
    check_signed,
    pin,
    pinned_key,
    pinned_owner_key,
    publisher_record,
)
from envhub.registry.sources import Registry, open_registry

MARKER = ".envhub-install.json"
REQUIRE_ENV = "ENVHUB_REQUIRE"  # "verified": what `--require verified` says, for CI and train
ALLOW_UNSIGNED_ENV = "ENVHUB_ALLOW_UNSIGNED"  # "1": install versions that carry no signature


class NotVerified(RegistryError):
    """The version is not verified by the registry's own audit, and that was required."""

    code = "not_verified"


class InstalledEnv(BaseModel):
    """An installed environment; `path` is the folder `envhub run` loads."""

    owner: str
    name: str
    version: str
    digest: str
    path: Path
    description: str = ""
    source: str = Field(default="", description="registry it came from ('local' or a URL)")
    installed_at: float = 0.0
    dependencies: list[str] = Field(default_factory=list)
    missing_dependencies: list[str] = Field(
        default_factory=list, description="declared but not installed (installed only with "
        "--deps)")
    audit: AuditSummary = Field(
        default_factory=lambda: not_audited("no audit recorded at install"),
        description="the publisher's audit (a claim) recorded with this version")
    publisher_key: str = Field(default="", description="the id of the owner's publisher key "
                               "whose signature of this version was checked at install "
                               "('' when the version carries none)")
    verification: str = Field(default="not_audited", description="the registry's own audit "
                              "of this digest at install, its signature checked: verified, "
                              "flagged, pending, claimed, failed or not_audited")

    @property
    def ref(self) -> str:
        return f"{self.owner}/{self.name}@{self.version}"


def envs_dir(home: Path | None = None) -> Path:
    return (home or envhub_home()) / "envs"


def install_path(owner: str, name: str, version: str, home: Path | None = None) -> Path:
    return envs_dir(home) / owner / name / version


def _read_marker(folder: Path) -> InstalledEnv | None:
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        return InstalledEnv.model_validate({**data, "path": folder})
    except (OSError, ValueError):
        return None


def installed(home: Path | None = None) -> list[InstalledEnv]:
    """Every installed environment, sorted by owner, name, version."""
    root = envs_dir(home)
    found = [env for marker in sorted(root.glob(f"*/*/*/{MARKER}"))
             if (env := _read_marker(marker.parent)) is not None]
    return found


def find_installed(ref: PackageRef, home: Path | None = None) -> InstalledEnv | None:
    """The installed version an exact ref names, without asking any registry."""
    if ref.spec.exact is None:
        return None
    return _read_marker(install_path(ref.owner, ref.name, ref.spec.exact, home))


def _trusted(ref: PackageRef, info: VersionInfo, location: str) -> VersionInfo:
    """Check what a registry answered before any of it becomes a path or a URL."""
    try:
        check_version(info.version)
        check_digest(info.digest)
    except RegistryError as e:
        raise BadPackage(
            f"{location} answered a bad version record ({e.message}); refused") from e
    wanted = (info.version == ref.spec.exact or ref.spec.text in ("latest", "*")
              or ref.spec.matches(Version.parse(info.version)))
    if (info.owner, info.name) != (ref.owner, ref.name) or not wanted:
        raise BadPackage(f"{location} answered {info.ref} for {ref}; refused (is --registry "
                         "the registry you meant?)")
    if info.size > Limits().max_archive_bytes:
        raise TooLarge(f"{info.ref} is {info.size} bytes, over the "
                       f"{Limits().max_archive_bytes}-byte package limit; refused")
    return info


async def signed_status(info: VersionInfo, registry: Registry,
                        home: Path) -> tuple[str, SigningKey]:
    """Check `info` against what `registry` signed, with its key as pinned on this machine:
    the version record must be this version's and digest's, and a verification record, if
    any, too. Returns the verification status the signed record says (else the registry's
    word for a status that carries no record), and the key to pin once the install
    succeeded. SignatureError names what is wrong."""
    allow_unsigned = os.environ.get(ALLOW_UNSIGNED_ENV, "") in ("1", "true", "yes")
    try:
        served = await registry.signing_key()
    except NotFound:  # a registry from before signing: nothing it serves is signed
        if not allow_unsigned:
            raise SignatureError(
                f"{registry.location} signs nothing (it has no /api/v1/key: an envhub "
                f"registry from before signing): refused; set {ALLOW_UNSIGNED_ENV}=1 to "
                "install from it unchecked") from None
        return "not_audited", SigningKey(key="", key_id="")
    # the embedded local registry's key is this machine's own: nothing to pin
    public = served.key if registry.location == LOCAL else pinned_key(
        home, registry.location, served.key, served.key_id)
    if info.signed is None:
        if not allow_unsigned:
            raise SignatureError(
                f"{info.ref} carries no signed version record from {registry.location} (it "
                "was published before the registry signed, or its record was removed): "
                "refused; publish the same content again to sign it, or set "
                f"{ALLOW_UNSIGNED_ENV}=1 to install it unchecked")
    else:
        record = check_signed(public, info.signed.record, info.signed.signature, info.ref)
        if record != version_record(info.owner, info.name, info.version, info.digest):
            raise SignatureError(
                f"{info.ref}: the registry signed a record of {record.get('owner')}/"
                f"{record.get('name')}@{record.get('version')} with digest "
                f"{record.get('digest')}, not of this version with digest {info.digest} "
                "(a record copied from another version, or a digest changed after signing); "
                "refused")
    verification = info.verification
    if verification.record is None:
        # the server's word only: never verified or flagged without a signed record
        return ("pending" if verification.status in ("verified", "flagged") else
                verification.status), served
    what = f"{info.ref}'s verification record"
    record = check_signed(public, verification.record.record, verification.record.signature,
                          what)
    if (record.get("kind"), record.get("owner"), record.get("name"), record.get("version"),
            record.get("digest")) != ("verification", info.owner, info.name, info.version,
                                      info.digest):
        raise SignatureError(f"{what} is of {record.get('owner')}/{record.get('name')}@"
                             f"{record.get('version')} with digest {record.get('digest')}, "
                             "not of this version: refused (a replayed record)")
    status = str(record.get("status"))
    if status not in ("verified", "flagged"):
        raise SignatureError(f"{what} says {status!r}; refused")
    return status, served


async def publisher_signature(info: VersionInfo, registry: Registry, home: Path) -> str:
    """The id of the owner key whose signature `info` carries, checked against the owner's key
    as this machine first saw it ('' for a version without one). SignatureError names what is
    wrong: a signature that does not verify, a record of another version, a replaced key."""
    if info.publisher_signed is None:
        return ""
    key = await registry.owner_key(info.owner)
    what = f"{info.ref}'s publisher signature"
    if key is None:
        raise SignatureError(f"{what}: {registry.location} serves no publisher key for "
                             f"{info.owner}, so it cannot be checked; refused")
    if registry.location != LOCAL:
        pinned_owner_key(home, registry.location, info.owner, key.key, key.key_id)
    record = check_signed(key.key, info.publisher_signed.record,
                          info.publisher_signed.signature, what, f"owner {info.owner}")
    if record != publisher_record(info.owner, info.name, info.version, info.digest):
        raise SignatureError(f"{what} is of {record.get('owner')}/{record.get('name')}@"
                             f"{record.get('version')} with digest {record.get('digest')}, not "
                             "of this version: refused (a signature copied from another "
                             "version)")
    return key.key_id


def _pin(home: Path, location: str, served: SigningKey) -> None:
    if location != LOCAL and served.key:
        pin(home, location, served.key, served.key_id)


def required(require: str | None = None) -> str | None:
    """What an install must find: `require`, else ENVHUB_REQUIRE; only 'verified' exists."""
    value = (require or os.environ.get(REQUIRE_ENV, "")).strip() or None
    if value not in (None, "verified"):
        raise RegistryError(f"--require / {REQUIRE_ENV} takes 'verified', not {value!r}")
    return value


async def install(ref: str | PackageRef, registry: Registry, home: Path | None = None,
                  install_deps: bool = True, force: bool = False,
                  require: str | None = None) -> InstalledEnv:
    """Install `ref` from `registry` (idempotent: an installed exact version is reused, as
    long as it meets `require`)."""
    home = home or envhub_home()
    need = required(require)
    pref = PackageRef.parse(ref) if isinstance(ref, str) else ref
    if not force and (have := find_installed(pref, home)) is not None:
        if need is None or have.verification == need:
            return have
    info = _trusted(pref, await registry.resolve(pref), registry.location)
    status, served = await signed_status(info, registry, home)
    signer = await publisher_signature(info, registry, home)
    if need is not None and status != need:
        raise NotVerified(
            f"{info.ref} is {status} at {registry.location}, and {need} is required "
            f"(--require / {REQUIRE_ENV}): {info.verification.label}; refused. Wait for the "
            "registry's audit (`envhub info` shows it), or pick a verified version")
    target = install_path(info.owner, info.name, info.version, home)
    have = _read_marker(target)
    if have is not None and not force:
        if have.digest == info.digest and (need is None or have.verification == need):
            return have
        if have.digest == info.digest:  # the registry verified it since: record that
            have.verification = status
            (target / MARKER).write_text(have.model_dump_json(exclude={"path"}),
                                         encoding="utf-8")
            _pin(home, registry.location, served)
            return have
        raise DigestMismatch(
            f"{info.ref} is installed with digest {have.digest} but {registry.location} serves "
            f"{info.digest}; reinstall with --force if you trust {registry.location}")
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".install-", dir=home))
    try:
        blob = staging / "package.tar.gz"
        await registry.fetch(info, blob)
        if (got := await asyncio.to_thread(sha256_file, blob)) != info.digest:
            raise DigestMismatch(f"{info.ref}: archive digest {got} is not the registry's "
                                 f"{info.digest}; refused")
        tree = staging / "tree"
        tree.mkdir()
        archive = await asyncio.to_thread(unpack_into, blob, tree)
        m = archive.manifest
        if (m.name, m.version) != (info.name, info.version):
            raise BadPackage(f"{info.ref}: the archive's envhub.toml says {m.name}@{m.version}; "
                             "refused (the registry entry does not match its content)")
        # a registry that skipped this at publish (another server, an old one) is not trusted
        check_dependencies(m.dependencies, source=f"{info.ref}'s envhub.toml")
        missing = unsatisfied(m.dependencies)
        if missing and install_deps:
            await asyncio.to_thread(pip_install, missing)
            missing = unsatisfied(m.dependencies)
        env = InstalledEnv(owner=info.owner, name=info.name, version=info.version,
                           digest=info.digest, path=target, description=m.description,
                           source=registry.location, installed_at=time.time(),
                           dependencies=m.dependencies, missing_dependencies=missing,
                           audit=info.audit, verification=status, publisher_key=signer)
        (tree / MARKER).write_text(env.model_dump_json(exclude={"path"}), encoding="utf-8")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():  # --force: move the old one aside, then drop it with staging
            os.rename(target, staging / "previous")
        os.rename(tree, target)
        _pin(home, registry.location, served)
        return env
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def resolve(ref: str, registry: str | None = None, token: str | None = None,
            home: Path | None = None, install_deps: bool | None = None,
            require: str | None = None) -> Path:
    """The folder of `owner/name@version`, installing it first if needed (for `envhub run`).

    Exact installed versions resolve offline; ranges and `latest` ask the registry.
    `install_deps=None` installs missing dependencies only with `ENVHUB_INSTALL_DEPS=1`:
    running an environment never pip-installs into envhub's interpreter unasked.
    """
    pref = PackageRef.parse(ref)
    need = required(require)
    if (have := find_installed(pref, home)) is not None and (
            need is None or have.verification == need):
        return have.path
    if install_deps is None:
        install_deps = os.environ.get("ENVHUB_INSTALL_DEPS", "") in ("1", "true", "yes")

    async def go() -> Path:
        reg = open_registry(registry, token, home)
        try:
            return (await install(pref, reg, home, install_deps=install_deps,
                                  require=need)).path
        finally:
            await reg.aclose()

    return asyncio.run(go())


def registry_info(ref: str, registry: str | None = None, token: str | None = None,
                  home: Path | None = None) -> dict[str, Any] | None:
    """What `envhub info owner/name[@spec]` shows for registry packages.

    None when `ref` is not an `owner/name` reference or neither the registry nor this
    machine knows it. RegistryError (e.g. Unavailable) propagates.
    """
    try:
        pref = PackageRef.parse(ref)
    except RegistryError:
        return None
    local = [e for e in installed(home) if (e.owner, e.name) == (pref.owner, pref.name)]

    async def go() -> dict[str, Any] | None:
        reg = open_registry(registry, token, home)
        try:
            pkg = await reg.package(pref.owner, pref.name)
        except NotFound:
            return None
        finally:
            await reg.aclose()
        return {"registry": reg.location, **pkg.model_dump(mode="json")}

    remote = asyncio.run(go())
    if remote is None and not local:
        return None
    out: dict[str, Any] = remote or {"owner": pref.owner, "name": pref.name,
                                     "registry": None, "versions": []}
    out["installed"] = [{"version": e.version, "digest": e.digest, "path": str(e.path)}
                        for e in local]
    return out
