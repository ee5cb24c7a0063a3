"""The registry's index (SQLAlchemy Core; SQLite by default, PostgreSQL by URL) plus its
blob store. Used by the HTTP server and, embedded, as the local registry.

Immutability is the database's job: `(owner, name, version)` is unique, so of two
concurrent publishes of one version exactly one insert wins; the loser sees the winner's
row and gets 200 (same digest: an idempotent re-publish) or 409 (different content).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from envhub.registry.archive import check_dependencies, sha256_file
from envhub.registry.blobs import BlobStore, check_digest
from envhub.registry.errors import (
    BadPackage,
    BadRequest,
    Conflict,
    DigestMismatch,
    Forbidden,
    MissingExtra,
    NotFound,
    QuotaExceeded,
)
from envhub.registry.extract import scan
from envhub.registry.limits import Limits, brief
from envhub.registry.models import (
    AuditSummary,
    PackageInfo,
    PublishResult,
    SearchHit,
    SignedRecord,
    Verification,
    VersionInfo,
    not_audited,
)
from envhub.registry.refs import PackageRef, Version, VersionSpec, check_name, check_owner
from envhub.registry.signing import (
    RegistryKey,
    SignatureError,
    canonical,
    check_public_key,
    check_signed,
    publisher_record,
)

MAX_VERSION_CHARS = 64
MAX_QUERY_CHARS = 200

metadata = sa.MetaData()


def _version_columns(primary_key: bool = True) -> list[sa.Column]:
    """owner, name, version: the columns naming one version (the key of the tables that hold
    one row per version)."""
    return [sa.Column("owner", sa.String(64), primary_key=primary_key, nullable=False),
            sa.Column("name", sa.String(64), primary_key=primary_key, nullable=False),
            sa.Column("version", sa.String(MAX_VERSION_CHARS), primary_key=primary_key,
                      nullable=False)]


def _of(table: sa.Table, owner: str, name: str,
        version: str) -> tuple[sa.ColumnElement[bool], ...]:
    """The rows of `table` about one version."""
    return (table.c.owner == owner, table.c.name == name, table.c.version == version)


versions = sa.Table(
    "versions", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    *_version_columns(primary_key=False),
    sa.Column("digest", sa.String(71), nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("yanked", sa.Boolean, nullable=False, default=False),
    sa.Column("description", sa.Text, nullable=False, default=""),
    sa.Column("dependencies", sa.Text, nullable=False, default="[]"),  # JSON list
    sa.Column("manifest", sa.Text, nullable=False),
    sa.Column("published_at", sa.Float, nullable=False),
    sa.Column("publisher", sa.String(200), nullable=False, default=""),
    sa.UniqueConstraint("owner", "name", "version", name="uq_versions_owner_name_version"),
)
# The audit recorded at publish, one row per version (a table of its own, not a column of
# `versions`: create_all adds a missing table to an existing index, never a missing column).
# A version without a row was published without an audit (older clients and registries).
audits = sa.Table(
    "audits", metadata,
    *_version_columns(),
    sa.Column("summary", sa.Text, nullable=False),  # AuditSummary JSON
)
# Records the registry signed when it made them (registry/signing.py): kind "version" at
# publish, "verification" when its own audit of the version finished.
signatures = sa.Table(
    "signatures", metadata,
    *_version_columns(),
    sa.Column("kind", sa.String(16), primary_key=True),
    sa.Column("record", sa.Text, nullable=False),
    sa.Column("signature", sa.String(200), nullable=False),
    sa.Column("key_id", sa.String(80), nullable=False),
)
# Owners' publisher keys (registry/signing.py): set by the registry's operator; an owner with
# a key publishes only uploads signed with it (kind "publisher" in `signatures`).
publisher_keys = sa.Table(
    "publisher_keys", metadata,
    sa.Column("owner", sa.String(64), primary_key=True),
    sa.Column("key", sa.String(80), nullable=False),
    sa.Column("key_id", sa.String(80), nullable=False),
    sa.Column("set_at", sa.Float, nullable=False),
)
# The durable queue of audits the registry runs itself (registry/verify.py): one job per
# version, `pending` -> `running` (a worker holds it while its lease is renewed) -> `done` or
# `failed`; a running job whose lease lapsed (its worker died) is taken again.
audit_jobs = sa.Table(
    "audit_jobs", metadata,
    *_version_columns(),
    sa.Column("digest", sa.String(71), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("worker", sa.String(200), nullable=False, default=""),
    sa.Column("lease_until", sa.Float, nullable=False, default=0.0),
    sa.Column("enqueued_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float, nullable=True),
    sa.Column("error", sa.Text, nullable=False, default=""),
    sa.Column("summary", sa.Text, nullable=True),  # the registry's AuditSummary JSON
    sa.Column("report", sa.Text, nullable=True),  # the whole `envhub audit --json` report
)
# Verdicts a re-audit superseded (`Catalog.reaudit`): each with its signed record, kept.
audit_history = sa.Table(
    "audit_history", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    *_version_columns(primary_key=False),
    sa.Column("digest", sa.String(71), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("finished_at", sa.Float, nullable=True),
    sa.Column("error", sa.Text, nullable=False, default=""),
    sa.Column("summary", sa.Text, nullable=True),
    sa.Column("report", sa.Text, nullable=True),
    sa.Column("record", sa.Text, nullable=True),
    sa.Column("signature", sa.String(200), nullable=True),
    sa.Column("requeued_at", sa.Float, nullable=False),
)
tokens = sa.Table(
    "tokens", metadata,
    # Only sha256(token) is stored: a leaked database does not leak usable tokens.
    sa.Column("token_hash", sa.String(64), primary_key=True),
    sa.Column("owners", sa.Text, nullable=False),  # comma-separated owner names
    sa.Column("label", sa.String(200), nullable=False, default=""),
    sa.Column("created_at", sa.Float, nullable=False),
)


def make_engine(db_url: str | None, data: Path) -> sa.Engine:
    """SQLite file under `data` by default; `postgresql://...` uses psycopg 3."""
    if not db_url:
        db_url = f"sqlite:///{data / 'index.db'}"
    if db_url.startswith(("postgresql://", "postgres://")):
        db_url = "postgresql+psycopg://" + db_url.split("://", 1)[1]
    if db_url.startswith("postgresql"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise MissingExtra("a PostgreSQL registry index", "postgres") from None
        return sa.create_engine(db_url, pool_pre_ping=True)
    if not db_url.startswith("sqlite"):
        raise BadRequest(f"unsupported database URL '{db_url}'; use sqlite:///PATH or "
                         "postgresql://USER@HOST:PORT/DB")
    engine = sa.create_engine(db_url, connect_args={"timeout": 30, "check_same_thread": False})

    @sa.event.listens_for(engine, "connect")
    def _pragmas(conn, _record):  # type: ignore[no-untyped-def]
        # WAL: readers never block the writer; busy timeout makes writers queue, not fail.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=30000")

    return engine


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_version(version: str) -> str:
    if len(version) > MAX_VERSION_CHARS:
        raise BadRequest(f"version '{version[:20]}...' is longer than {MAX_VERSION_CHARS} chars")
    Version.parse(version)
    return version


def _row_audit(text: str | None) -> AuditSummary:
    if text is None:
        return not_audited("published without an audit")
    return AuditSummary.model_validate_json(text)


def check_audit(audit: AuditSummary, digest: str) -> AuditSummary:
    """The audit must be of exactly this upload (BadRequest with the fix otherwise)."""
    if audit.status != "not_audited" and audit.digest != digest:
        raise BadRequest(f"the audit sent with this upload is of {audit.digest}, but the upload "
                         f"is {digest}; audit this exact package (`envhub audit FOLDER --json "
                         "FILE`, then `envhub publish FOLDER --audit FILE`)")
    return audit


def _signed(row: sa.Row | None) -> SignedRecord | None:
    if row is None:
        return None
    return SignedRecord(record=row.record, signature=row.signature, key_id=row.key_id)


def _verification(job: sa.Row | None, record: sa.Row | None, claimed: AuditSummary,
                  key: RegistryKey, digest: str) -> Verification:
    """What the registry says of its own audit of a version: its status is what the signed
    record says, checked here with the registry's own key (clients check it again). The last
    signed verdict stands while a re-audit (`reaudit`) is queued, running or failed."""
    if job is not None and record is not None and job.summary:
        try:
            signed = check_signed(key.public_b64, record.record, record.signature, "")
        except SignatureError:
            signed = {}
        status = signed.get("status")
        if status not in ("verified", "flagged") or signed.get("digest") != digest:
            # shown as failed, the record passed on: installs check it and refuse it
            return Verification(status="failed", attempts=job.attempts, record=_signed(record),
                                error="its verification record does not verify with this "
                                "registry's key (edited after it was signed)")
        summary = AuditSummary.model_validate_json(job.summary)
        return Verification(status=status, summary=summary, record=_signed(record),
                            attempts=job.attempts,
                            error=job.error[-500:] if job.state == "failed" else "")
    if job is not None and job.state == "failed":
        return Verification(status="failed", attempts=job.attempts, error=job.error[-500:])
    attempts = job.attempts if job is not None else 0
    if claimed.status == "passed":
        return Verification(status="claimed", attempts=attempts)
    return Verification(status="pending" if job is not None else "not_audited",
                        attempts=attempts)


def _row_to_info(row: sa.Row, signed: dict[tuple[str, str], sa.Row],
                 jobs: dict[str, sa.Row], key: RegistryKey) -> VersionInfo:
    audit = _row_audit(row.summary)
    return VersionInfo(
        audit=audit,
        owner=row.owner, name=row.name, version=row.version, digest=row.digest, size=row.size,
        yanked=bool(row.yanked), description=row.description,
        dependencies=json.loads(row.dependencies), published_at=row.published_at,
        publisher=row.publisher, signed=_signed(signed.get((row.version, "version"))),
        publisher_signed=_signed(signed.get((row.version, "publisher"))),
        verification=_verification(jobs.get(row.version),
                                   signed.get((row.version, "verification")), audit, key,
                                   row.digest))


def version_record(owner: str, name: str, version: str, digest: str) -> dict[str, str]:
    """What the registry signs at publish (checked by `install`, registry/install.py)."""
    return {"kind": "version", "owner": owner, "name": name, "version": version,
            "digest": digest}


def verification_record(owner: str, name: str, version: str, digest: str,
                        summary: AuditSummary) -> dict[str, object]:
    """What the registry signs when its own audit of a version finished."""
    return {"kind": "verification", "owner": owner, "name": name, "version": version,
            "digest": digest, "status": "verified" if summary.status == "passed" else "flagged",
            "date": summary.date.isoformat() if summary.date else None,
            "envhub_version": summary.envhub_version, "sandboxes": summary.sandboxes,
            "rows": summary.rows, "flagged": summary.flagged}


@dataclass(frozen=True)
class AuditJob:
    """A version taken from the queue by one worker (`attempt`: 1 the first time)."""

    owner: str
    name: str
    version: str
    digest: str
    attempt: int

    @property
    def ref(self) -> str:
        return f"{self.owner}/{self.name}@{self.version}"


class Catalog:
    """Index + blobs under `data` (blobs always on disk; the index may live in PostgreSQL)."""

    def __init__(self, data: str | Path, db_url: str | None = None,
                 limits: Limits | None = None):
        self.data = Path(data)
        self.data.mkdir(parents=True, exist_ok=True)
        self.blobs = BlobStore(self.data / "blobs")
        self.limits = limits or Limits()
        self.engine = make_engine(db_url, self.data)
        metadata.create_all(self.engine)
        self.key = RegistryKey.load_or_create(self.data)

    @classmethod
    def existing(cls, data: str | Path, db_url: str | None = None) -> Catalog:
        """The registry under `data`, refused (BadRequest with the fix) where there is none,
        rather than made empty: for the commands that work on a registry `serve` runs."""
        if db_url is None and not (Path(data) / "index.db").exists():
            raise BadRequest(f"{data} holds no registry (no index.db); pass the folder "
                             "`envhub registry serve --data` uses")
        return cls(data, db_url)

    def close(self) -> None:
        self.engine.dispose()

    # -- reading -----------------------------------------------------------------------
    def versions(self, owner: str, name: str) -> list[VersionInfo]:
        """All versions of a package, oldest first (semver order); [] when unknown."""
        check_owner(owner), check_name(name)
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(versions, audits.c.summary).select_from(
                versions.outerjoin(audits, sa.and_(
                    audits.c.owner == versions.c.owner, audits.c.name == versions.c.name,
                    audits.c.version == versions.c.version))).where(
                versions.c.owner == owner, versions.c.name == name)).all()
            signed = {(r.version, r.kind): r for r in conn.execute(sa.select(signatures).where(
                signatures.c.owner == owner, signatures.c.name == name))}
            jobs = {r.version: r for r in conn.execute(sa.select(audit_jobs).where(
                audit_jobs.c.owner == owner, audit_jobs.c.name == name))}
        infos = [_row_to_info(r, signed, jobs, self.key) for r in rows]
        return sorted(infos, key=lambda i: Version.parse(i.version))

    def package(self, owner: str, name: str) -> PackageInfo:
        infos = self.versions(owner, name)
        if not infos:
            raise NotFound(f"package {owner}/{name} does not exist; find names with "
                           "`envhub search`")
        latest = VersionSpec("latest").pick([(i.version, i.yanked) for i in infos])
        top = next((i for i in infos if i.version == latest), infos[-1])
        return PackageInfo(owner=owner, name=name, description=top.description, latest=latest,
                           versions=infos)

    def version(self, owner: str, name: str, version: str) -> VersionInfo:
        check_version(version)
        for info in self.versions(owner, name):
            if info.version == version:
                return info
        raise NotFound(f"{owner}/{name}@{version} does not exist; list versions with "
                       f"`envhub info {owner}/{name}`")

    def manifest_text(self, owner: str, name: str, version: str) -> str:
        """The envhub.toml of a published version, as it was in its archive."""
        self.version(owner, name, version)  # NotFound with the fix
        with self.engine.connect() as conn:
            return str(conn.execute(sa.select(versions.c.manifest).where(
                *_of(versions, owner, name, version))).scalar_one())

    def resolve(self, ref: PackageRef) -> VersionInfo:
        infos = self.versions(ref.owner, ref.name)
        if not infos:
            raise NotFound(f"package {ref.full_name} does not exist; find names with "
                           "`envhub search`")
        chosen = ref.spec.pick([(i.version, i.yanked) for i in infos])
        if chosen is None:
            listed = ", ".join(i.version + (" (yanked)" if i.yanked else "") for i in infos)
            raise NotFound(f"no version of {ref.full_name} matches '{ref.spec}' "
                           f"(available: {listed}); pick one of those")
        return next(i for i in infos if i.version == chosen)

    def search(self, query: str = "", limit: int = 20) -> list[SearchHit]:
        if len(query) > MAX_QUERY_CHARS or "\x00" in query:
            raise BadRequest(f"search query must be at most {MAX_QUERY_CHARS} chars of text")
        pattern = "%" + query.lower().replace("\\", "\\\\").replace("%", "\\%").replace(
            "_", "\\_") + "%"
        full = versions.c.owner + "/" + versions.c.name
        stmt = sa.select(versions.c.owner, versions.c.name).where(sa.or_(
            full.like(pattern, escape="\\"),
            sa.func.lower(versions.c.description).like(pattern, escape="\\"),
        )).distinct().order_by(versions.c.owner, versions.c.name).limit(max(1, min(limit, 100)))
        with self.engine.connect() as conn:
            names = conn.execute(stmt).all()
        hits = []
        for owner, name in names:
            pkg = self.package(owner, name)
            hits.append(SearchHit(owner=owner, name=name, description=brief(pkg.description),
                                  latest=pkg.latest))
        return hits

    def blob_path(self, digest: str) -> Path:
        path = self.blobs.path(check_digest(digest))
        if not path.is_file():
            raise NotFound(f"no blob {digest}; resolve a version first to get its digest")
        return path

    # -- writing -----------------------------------------------------------------------
    def publish_file(self, owner: str, archive: Path, publisher: str = "",
                     expected_digest: str | None = None,
                     audit: AuditSummary | None = None,
                     publisher_signature: str | None = None) -> PublishResult:
        """Publish a .tar.gz from anywhere (copied first; the original is left alone)."""
        tmp = self.blobs.incoming()
        try:
            shutil.copyfile(archive, tmp)
            info = scan(tmp, self.limits)
            return self.publish(owner, info.manifest.name, info.manifest.version, tmp,
                                publisher=publisher, expected_digest=expected_digest,
                                audit=audit, publisher_signature=publisher_signature)
        finally:
            tmp.unlink(missing_ok=True)

    def publish(self, owner: str, name: str, version: str, incoming: Path, publisher: str = "",
                expected_digest: str | None = None,
                audit: AuditSummary | None = None,
                publisher_signature: str | None = None) -> PublishResult:
        """Validate the archive at `incoming` (a file from `blobs.incoming()`) and record it,
        with its audit (None: recorded as not audited, as old clients publish).

        The caller deletes `incoming` afterwards (it is moved away when it becomes a blob).
        A re-publish of the same content keeps the first record; only a version published
        without an audit may get one that way (`envhub publish` again, audited).
        """
        check_owner(owner), check_name(name), check_version(version)
        digest = sha256_file(incoming)
        if expected_digest is not None and expected_digest != digest:
            raise DigestMismatch(f"the upload's digest is {digest} but {expected_digest} was "
                                 "declared; the archive was corrupted in transit, retry")
        archive = scan(incoming, self.limits)
        m = archive.manifest
        if (m.name, m.version) != (name, version):
            raise BadPackage(f"the archive's envhub.toml says {m.name}@{m.version} but it is "
                             f"published as {name}@{version}; publish it under its own name "
                             "and version")
        check_dependencies(m.dependencies, source="envhub.toml in the archive")
        audit = check_audit(audit or not_audited("published without an audit"), digest)
        self._check_quota(owner, name, version, digest, incoming.stat().st_size)
        signed_by = self._check_publisher(owner, name, version, digest, publisher_signature)
        row = {"owner": owner, "name": name, "version": version, "digest": digest,
               "size": incoming.stat().st_size, "yanked": False, "description": m.description,
               "dependencies": json.dumps(m.dependencies), "manifest": archive.manifest_text,
               "published_at": time.time(), "publisher": publisher}
        placed = False
        try:
            with self.engine.begin() as conn:
                conn.execute(versions.insert().values(**row))
                conn.execute(audits.insert().values(owner=owner, name=name, version=version,
                                                    summary=audit.model_dump_json()))
                self.sign_version(conn, owner, name, version, digest)
                if signed_by is not None:
                    conn.execute(signatures.insert().values(
                        owner=owner, name=name, version=version, kind="publisher",
                        record=canonical(publisher_record(owner, name, version, digest)),
                        signature=publisher_signature, key_id=signed_by))
                conn.execute(audit_jobs.insert().values(
                    owner=owner, name=name, version=version, digest=digest, state="pending",
                    attempts=0, worker="", lease_until=0.0, enqueued_at=time.time(), error=""))
                # The blob goes in place inside the transaction: if the commit fails we
                # remove it, if the insert fails it never appears.
                placed = self.blobs.place(incoming, digest)
        except IntegrityError:
            existing = self.version(owner, name, version)
            if existing.digest == digest:
                if existing.audit.status == "not_audited" and audit.status != "not_audited":
                    existing = self._attach_audit(owner, name, version, audit)
                if existing.signed is None:  # published before this registry signed
                    existing = self._backfill(owner, name, version, digest)
                return PublishResult(version=existing, created=False)
            raise Conflict(f"{owner}/{name}@{version} is already published with different "
                           f"content ({existing.digest}); versions are immutable: bump "
                           "'version' in envhub.toml and publish again") from None
        except BaseException:
            if placed:
                self.blobs.remove(digest)
            raise
        return PublishResult(version=self.version(owner, name, version), created=True)

    def set_publisher_key(self, owner: str, public: str) -> str:
        """Register (or replace) `owner`'s publisher key (base64); its id."""
        check_owner(owner)
        key, kid = check_public_key(public)
        with self.engine.begin() as conn:
            conn.execute(publisher_keys.delete().where(publisher_keys.c.owner == owner))
            conn.execute(publisher_keys.insert().values(owner=owner, key=key, key_id=kid,
                                                        set_at=time.time()))
        return kid

    def publisher_key(self, owner: str) -> tuple[str, str] | None:
        """(`owner`'s publisher key, its id), or None when it has none."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(publisher_keys).where(
                publisher_keys.c.owner == owner)).first()
        return None if row is None else (row.key, row.key_id)

    def _check_publisher(self, owner: str, name: str, version: str, digest: str,
                         signature: str | None) -> str | None:
        """The id of the owner key that signed this upload, None for an owner without one;
        Forbidden / BadRequest naming the fix otherwise."""
        key = self.publisher_key(owner)
        if key is None:
            if signature is not None:
                raise BadRequest(f"the upload is signed, but owner {owner} has no publisher "
                                 "key on this registry; ask its operator to register yours "
                                 "(`envhub registry publisher-key`) or publish without --sign")
            return None
        if signature is None:
            raise Forbidden(f"owner {owner} signs its uploads (key {key[1]}): publish with "
                            "--sign KEY")
        try:
            check_signed(key[0], canonical(publisher_record(owner, name, version, digest)),
                         signature, f"{owner}/{name}@{version}")
        except SignatureError:
            raise Forbidden(f"the upload's signature does not verify with {owner}'s publisher "
                            f"key {key[1]} for {owner}/{name}@{version} with digest {digest}: "
                            "sign with that key (or ask the operator to register your new "
                            "one)") from None
        return key[1]

    def _check_quota(self, owner: str, name: str, version: str, digest: str, size: int) -> None:
        """TooLarge when `owner`'s stored archives and this one pass `max_owner_bytes` (a
        re-publish of the same content stores nothing and passes)."""
        with self.engine.connect() as conn:
            same = conn.execute(sa.select(versions.c.digest).where(
                *_of(versions, owner, name, version))).scalar()
            stored = int(conn.execute(sa.select(sa.func.coalesce(sa.func.sum(versions.c.size), 0))
                                      .where(versions.c.owner == owner)).scalar() or 0)
        if same != digest and stored + size > self.limits.max_owner_bytes:
            raise QuotaExceeded(f"owner {owner} stores {stored} bytes of packages; with this "
                           f"{size}-byte one that passes this registry's quota of "
                           f"{self.limits.max_owner_bytes} bytes per owner; yanked versions "
                           "count too: ask the registry's operator for more")

    def _attach_audit(self, owner: str, name: str, version: str,
                      audit: AuditSummary) -> VersionInfo:
        """A version published without an audit gets its first one (same digest, checked by
        the caller); an audited version's record never changes."""
        key = _of(audits, owner, name, version)
        summary = audit.model_dump_json()
        try:
            with self.engine.begin() as conn:
                row = conn.execute(sa.select(audits.c.summary).where(*key)).first()
                if row is None:  # indexes from before audits have no row
                    conn.execute(audits.insert().values(owner=owner, name=name,
                                                        version=version, summary=summary))
                elif _row_audit(row.summary).status == "not_audited":
                    # only over the unaudited record: a concurrent attach that won stays
                    conn.execute(audits.update().where(*key, audits.c.summary == row.summary)
                                 .values(summary=summary))
        except IntegrityError:  # a concurrent attach inserted first; its record stays
            pass
        return self.version(owner, name, version)

    def sign_version(self, conn: sa.Connection, owner: str, name: str, version: str,
                     digest: str) -> None:
        """Sign the version record of a row being written in `conn`'s transaction."""
        text, signature = self.key.sign(version_record(owner, name, version, digest))
        conn.execute(signatures.insert().values(owner=owner, name=name, version=version,
                                                kind="version", record=text,
                                                signature=signature, key_id=self.key.key_id))

    def _backfill(self, owner: str, name: str, version: str, digest: str) -> VersionInfo:
        """A version from before signing, published again with the same content (its digest
        just checked against the upload): sign it and queue its audit now."""
        try:
            with self.engine.begin() as conn:
                self.sign_version(conn, owner, name, version, digest)
        except IntegrityError:  # a concurrent re-publish did it
            pass
        try:
            with self.engine.begin() as conn:
                conn.execute(audit_jobs.insert().values(
                    owner=owner, name=name, version=version, digest=digest, state="pending",
                    attempts=0, worker="", lease_until=0.0, enqueued_at=time.time(), error=""))
        except IntegrityError:  # already queued
            pass
        return self.version(owner, name, version)

    # -- the audit queue (registry/verify.py runs it) -----------------------------------
    def claim_job(self, worker: str, lease_s: float, max_attempts: int) -> AuditJob | None:
        """The oldest version waiting for its audit, now held by `worker` for `lease_s`; a
        running job whose lease lapsed is taken again (its worker died), up to `max_attempts`
        times, then failed. None when nothing waits (a lost race is tried again)."""
        for _ in range(100):
            claimed, empty = self._claim_once(worker, lease_s, max_attempts)
            if claimed is not None or empty:
                return claimed
        return None

    def _claim_once(self, worker: str, lease_s: float,
                    max_attempts: int) -> tuple[AuditJob | None, bool]:
        now = time.time()
        with self.engine.begin() as conn:
            conn.execute(audit_jobs.update().where(
                audit_jobs.c.state == "running", audit_jobs.c.lease_until < now,
                audit_jobs.c.attempts >= max_attempts).values(
                state="failed", finished_at=now,
                error=f"its audit was started {max_attempts} times and never finished (the "
                      "worker died or stopped answering each time)"))
            row = conn.execute(sa.select(audit_jobs).where(sa.or_(
                audit_jobs.c.state == "pending", sa.and_(audit_jobs.c.state == "running",
                                                         audit_jobs.c.lease_until < now)))
                .order_by(audit_jobs.c.enqueued_at).limit(1)).first()
            if row is None:
                return None, True
            taken = conn.execute(audit_jobs.update().where(
                *_of(audit_jobs, row.owner, row.name, row.version),
                audit_jobs.c.state == row.state,
                audit_jobs.c.attempts == row.attempts).values(
                state="running", worker=worker[:200], lease_until=now + lease_s,
                attempts=row.attempts + 1))
            if taken.rowcount != 1:
                return None, False
        return AuditJob(row.owner, row.name, row.version, row.digest, row.attempts + 1), False

    def _held(self, job: AuditJob, worker: str) -> tuple[sa.ColumnElement[bool], ...]:
        return (*_of(audit_jobs, job.owner, job.name, job.version),
                audit_jobs.c.state == "running",
                audit_jobs.c.worker == worker[:200], audit_jobs.c.attempts == job.attempt)

    def renew_job(self, job: AuditJob, worker: str, lease_s: float) -> bool:
        """Extend the lease; False when the job is no longer this worker's."""
        with self.engine.begin() as conn:
            return conn.execute(audit_jobs.update().where(*self._held(job, worker)).values(
                lease_until=time.time() + lease_s)).rowcount == 1

    def finish_job(self, job: AuditJob, worker: str, summary: AuditSummary,
                   report: str) -> bool:
        """Record the audit and sign its verification record, in one transaction, only while
        `worker` still holds the job (False otherwise: nothing written)."""
        text, signature = self.key.sign(verification_record(
            job.owner, job.name, job.version, job.digest, summary))
        with self.engine.begin() as conn:
            if conn.execute(audit_jobs.update().where(*self._held(job, worker)).values(
                    state="done", finished_at=time.time(), summary=summary.model_dump_json(),
                    report=report, error="")).rowcount != 1:
                return False
            key = (*_of(signatures, job.owner, job.name, job.version),
                   signatures.c.kind == "verification")
            conn.execute(signatures.delete().where(*key))
            conn.execute(signatures.insert().values(
                owner=job.owner, name=job.name, version=job.version, kind="verification",
                record=text, signature=signature, key_id=self.key.key_id))
        return True

    def fail_job(self, job: AuditJob, worker: str, error: str, detail: str = "") -> bool:
        """The audit could not give a verdict (it hung past the worker's limit, or could not
        run here): the version is shown as not verified, with `error` (public, the worker's
        own words); `detail` (the audit's output, which the package's code wrote into) goes
        only to the owner's report. Not retried."""
        report = json.dumps({"error": error[:2000], "output_tail": detail[-8000:]})
        with self.engine.begin() as conn:
            return conn.execute(audit_jobs.update().where(*self._held(job, worker)).values(
                state="failed", finished_at=time.time(), error=error[:2000],
                report=report)).rowcount == 1

    def reaudit(self, envhub_version: str | None = None) -> int:
        """Queue again every finished audit (`done` or `failed`); with `envhub_version`, only
        the failed ones and those another envhub ran (its battery may differ). Each superseded
        verdict goes to `audit_history` with its signed record; the last signed verdict stays
        shown until the new one lands. The number queued."""
        now = time.time()
        queued = 0
        with self.engine.begin() as conn:
            for job in conn.execute(sa.select(audit_jobs).where(
                    audit_jobs.c.state.in_(("done", "failed")))).all():
                if envhub_version is not None and job.summary and AuditSummary \
                        .model_validate_json(job.summary).envhub_version == envhub_version:
                    continue
                record = conn.execute(sa.select(signatures).where(
                    *_of(signatures, job.owner, job.name, job.version),
                    signatures.c.kind == "verification")).first()
                conn.execute(audit_history.insert().values(
                    owner=job.owner, name=job.name, version=job.version, digest=job.digest,
                    state=job.state, finished_at=job.finished_at, error=job.error,
                    summary=job.summary, report=job.report,
                    record=record.record if record else None,
                    signature=record.signature if record else None, requeued_at=now))
                conn.execute(audit_jobs.update().where(
                    *_of(audit_jobs, job.owner, job.name, job.version),
                    audit_jobs.c.state == job.state)
                    .values(state="pending", attempts=0, worker="", lease_until=0.0,
                            enqueued_at=now, error=""))
                queued += 1
        return queued

    def audit_report(self, owner: str, name: str, version: str) -> str | None:
        """The whole report of the registry's own audit of a version (for its owner)."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(audit_jobs.c.report).where(
                *_of(audit_jobs, owner, name, version))).scalar()

    def yank(self, owner: str, name: str, version: str, yanked: bool = True) -> VersionInfo:
        self.version(owner, name, version)  # NotFound with the fix
        with self.engine.begin() as conn:
            conn.execute(versions.update().where(
                *_of(versions, owner, name, version)).values(yanked=yanked))
        return self.version(owner, name, version)

    # -- tokens ------------------------------------------------------------------------
    def create_token(self, owners: list[str], label: str = "") -> str:
        """A new API token allowed to publish under `owners`; shown once, stored hashed."""
        if not owners:
            raise BadRequest("a token needs at least one owner: pass --owner NAME")
        for owner in owners:
            check_owner(owner)
        token = "ehr_" + secrets.token_urlsafe(32)
        with self.engine.begin() as conn:
            conn.execute(tokens.insert().values(
                token_hash=hash_token(token), owners=",".join(sorted(set(owners))),
                label=label[:200], created_at=time.time()))
        return token

    def token_owners(self, token: str) -> list[str] | None:
        """Owners a token may publish under, or None for an unknown token."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(tokens.c.owners).where(
                tokens.c.token_hash == hash_token(token))).first()
        return None if row is None else row.owners.split(",")
