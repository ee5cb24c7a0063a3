"""Registry wire types: what the HTTP API returns and what the local registry returns too."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

AuditStatus = Literal["passed", "flagged", "not_audited"]
MAX_FLAGGED = 64  # flagged rows kept in a summary; the audit's own JSON has them all


class AuditSummary(BaseModel):
    """What `envhub publish` records beside a version: the `envhub audit` verdict of exactly
    that package digest. It is the publisher's claim (signed by their token, not re-run by the
    registry); "not_audited" is what versions published without one show."""

    model_config = ConfigDict(extra="forbid")

    status: AuditStatus = Field(description="passed, flagged or not_audited")
    digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$",
                               description="the package digest the audit ran on")
    date: datetime | None = Field(default=None, description="when the audit ran (UTC)")
    envhub_version: str = Field(default="", max_length=64,
                                description="the envhub that ran the audit")
    rows: int = Field(default=0, ge=0, le=10_000, description="cheats and controls run")
    sandboxes: list[str] = Field(default_factory=list, max_length=8)
    flagged: list[str] = Field(default_factory=list, max_length=MAX_FLAGGED,
                               description="'cheat (sandbox): flags' of each flagged row")
    note: str = Field(default="", max_length=300, description="e.g. why there is no audit")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.status != "not_audited" and (self.digest is None or self.date is None
                                             or not self.envhub_version):
            raise ValueError(f"an audit with status {self.status!r} needs digest, date and "
                             "envhub_version")
        if (self.status == "flagged") != bool(self.flagged):
            raise ValueError("status 'flagged' goes with a non-empty 'flagged' list and only "
                             "with it")
        if any(len(s) > 200 for s in [*self.flagged, *self.sandboxes]):
            raise ValueError("'flagged' and 'sandboxes' entries are at most 200 characters")
        return self

    @property
    def label(self) -> str:
        """One line for people: 'audit passed 2026-11-20 (envhub 0.4.0, 14 runs)'."""
        if self.status == "not_audited":
            return "NOT AUDITED" + (f" ({self.note})" if self.note else "")
        when = self.date.strftime("%Y-%m-%d") if self.date else "?"
        what = "passed" if self.status == "passed" else "FLAGGED: " + "; ".join(self.flagged)
        return f"audit {what} {when} (envhub {self.envhub_version}, {self.rows} runs)"


def not_audited(note: str = "") -> AuditSummary:
    return AuditSummary(status="not_audited", note=note)


class SignedRecord(BaseModel):
    """A record the registry signed when it made it (registry/signing.py): the canonical JSON
    text, its base64 ed25519 signature, and the id of the key that signed it."""

    record: str = Field(max_length=16_384)
    signature: str = Field(max_length=200)
    key_id: str = Field(max_length=80)


VerificationStatus = Literal["verified", "flagged", "pending", "claimed", "failed",
                             "not_audited"]


class Verification(BaseModel):
    """Whether the registry's own audit workers ran `envhub audit` on this version's digest:
    `verified` / `flagged` (with the signed record of that audit), `pending` (queued or
    running), `claimed` (not yet audited here: only the publisher's own audit, shown as a
    claim, never as verified), `failed` (the audit could not finish after its attempts: not
    verified), `not_audited`. An install checks the record's signature and digest itself."""

    status: VerificationStatus = "not_audited"
    summary: AuditSummary | None = Field(default=None, description="the registry's own audit "
                                         "(verified/flagged)")
    record: SignedRecord | None = None
    attempts: int = Field(default=0, ge=0)
    error: str = Field(default="", max_length=500, description="why it failed")

    @property
    def label(self) -> str:
        if self.status in ("verified", "flagged") and self.summary is not None:
            when = self.summary.date.strftime("%Y-%m-%d") if self.summary.date else "?"
            what = ("VERIFIED by this registry" if self.status == "verified" else
                    "FLAGGED by this registry: " + "; ".join(self.summary.flagged))
            return (f"{what} {when} (envhub {self.summary.envhub_version}, "
                    f"{', '.join(self.summary.sandboxes)}, {self.summary.rows} runs)")
        return {"pending": "audit pending", "claimed": "CLAIMED by the publisher, not verified "
                "by this registry", "failed": f"NOT VERIFIED: the audit failed ({self.error})",
                }.get(self.status, "NOT AUDITED")


class VersionInfo(BaseModel):
    """One published version of a package."""

    owner: str
    name: str
    version: str
    digest: str = Field(description="sha256 of the .tar.gz, as 'sha256:<hex>'")
    size: int = Field(description="compressed bytes")
    yanked: bool = False
    description: str = ""
    dependencies: list[str] = Field(default_factory=list)
    published_at: float = 0.0
    publisher: str = ""
    audit: AuditSummary = Field(
        default_factory=lambda: not_audited("published without an audit"),
        description="the publisher's `envhub audit` result sent at publish (a claim)")
    verification: Verification = Field(default_factory=Verification, description="the "
                                       "registry's own audit of this digest")
    signed: SignedRecord | None = Field(default=None, description="the version record (owner, "
                                        "name, version, digest) the registry signed at publish")
    publisher_signed: SignedRecord | None = Field(
        default=None, description="the same record signed by the owner's publisher key "
        "(`envhub publish --sign`), when the owner has one")

    @property
    def ref(self) -> str:
        return f"{self.owner}/{self.name}@{self.version}"


class PackageInfo(BaseModel):
    owner: str
    name: str
    description: str = ""
    latest: str | None = Field(default=None, description="newest version `latest` resolves to")
    versions: list[VersionInfo] = Field(default_factory=list, description="oldest first")


class SearchHit(BaseModel):
    owner: str
    name: str
    description: str = Field(default="", description="at most 500 characters, cut with an "
                             "ellipsis; the package's own endpoint has the whole text")
    latest: str | None = None


class SearchResult(BaseModel):
    hits: list[SearchHit]


class PublishResult(BaseModel):
    version: VersionInfo
    created: bool = Field(description="false when the same content was already published")


class YankRequest(BaseModel):
    yanked: bool = Field(default=True, description="false un-yanks")


class SigningKey(BaseModel):
    """The registry's public key: installs pin it on first use (registry/signing.py)."""

    algorithm: Literal["ed25519"] = "ed25519"
    key: str = Field(max_length=100, description="base64 of the raw 32-byte public key")
    key_id: str = Field(max_length=80)


class WhoAmI(BaseModel):
    owners: list[str]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail
