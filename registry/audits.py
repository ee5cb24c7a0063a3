"""The `envhub audit` result a published version carries.

`envhub publish` gets it one of three ways: `--audit FILE` (the JSON `envhub audit ENV --json
FILE` wrote, checked here: same package digest, not older than MAX_AGE_DAYS, written by a
recorded envhub version, nothing flagged), running the audit itself on the packed package, or
`--no-audit` (recorded, and shown, as "not audited"). The summary travels to an HTTP registry
in the `X-Envhub-Audit` header (base64url JSON, at most MAX_HEADER_CHARS), so the upload body
stays the raw .tar.gz an older registry or client also understands.
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envhub.registry.errors import BadRequest, RegistryError
from envhub.registry.models import MAX_FLAGGED, AuditSummary

HEADER = "X-Envhub-Audit"
MAX_HEADER_CHARS = 8192
MAX_FILE_BYTES = 16 << 20  # an audit JSON holds one row per cheat: a few hundred KB at most
MAX_AGE_DAYS = 30
FUTURE_SLACK = timedelta(hours=1)  # clock skew allowed on an audit's date


class AuditMissing(RegistryError):
    """No usable audit for this package (exit 2, with the command to run)."""

    code = "audit_missing"


class AuditFlagged(RegistryError):
    """The package's audit flagged a cheat (publish exits 1)."""

    code = "audit_flagged"


def summarize(data: dict[str, Any]) -> AuditSummary:
    """The summary of an `envhub audit --json` report (ValueError/ValidationError if malformed)."""
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ValueError("it has no 'rows' (the table of cheats)")
    flagged = [f"{r.get('cheat')} ({r.get('sandbox')}): {', '.join(r.get('flags') or [])}"[:200]
               for r in rows if isinstance(r, dict) and r.get("flags")]
    if data.get("flagged") and not flagged:
        flagged = ["(the report says flagged)"]
    sandboxes = sorted({str(r.get("sandbox"))[:200] for r in rows if isinstance(r, dict)})
    return AuditSummary(
        status="flagged" if flagged else "passed", digest=data.get("digest"),
        date=data.get("date"), envhub_version=str(data.get("envhub_version") or ""),
        rows=len(rows), sandboxes=sandboxes[:8], flagged=flagged[:MAX_FLAGGED])


def check_summary(summary: AuditSummary, digest: str, name: str, version: str,
                  now: datetime | None = None) -> AuditSummary:
    """Refuse an audit that is not a recent passing one of exactly this package."""
    fix = (f"run `envhub audit FOLDER --json audit.json` on {name} {version} as it is now and "
           "pass --audit audit.json, or publish without --audit to run it")
    if summary.digest != digest:
        raise AuditMissing(f"the audit is of package {summary.digest}, but {name}@{version} packs "
                           f"to {digest} (the folder changed since, or it is another package); "
                           + fix)
    now = now or datetime.now(UTC)
    assert summary.date is not None  # the model requires it for an audited status
    when = summary.date if summary.date.tzinfo else summary.date.replace(tzinfo=UTC)
    if when < now - timedelta(days=MAX_AGE_DAYS) or when > now + FUTURE_SLACK:
        raise AuditMissing(f"the audit is dated {when:%Y-%m-%d %H:%M} UTC, not within the last "
                           f"{MAX_AGE_DAYS} days; " + fix)
    if summary.status == "flagged":
        raise AuditFlagged(f"envhub audit flagged {name}@{version}: "
                           + "; ".join(summary.flagged) + ". Fix the verifier so no cheat "
                           "beats the no-op or escapes into env_failure (see the audit's run "
                           "folders), then audit and publish again")
    return summary


def load_audit_file(path: Path, digest: str, name: str, version: str) -> AuditSummary:
    """`--audit FILE`: read, summarize and check it (AuditMissing/AuditFlagged with the fix)."""
    fix = f"write it with `envhub audit FOLDER --json {path}`"
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise AuditMissing(f"--audit {path} is over {MAX_FILE_BYTES} bytes; {fix}")
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("it is not a JSON object")
        if (data.get("env"), data.get("version")) != (name, version):
            raise ValueError(f"it audits {data.get('env')} {data.get('version')}, not "
                             f"{name} {version}")
        summary = summarize(data)
    except OSError as e:
        raise AuditMissing(f"cannot read --audit {path} ({e.strerror}); {fix}") from None
    except (ValueError, ValidationError) as e:
        raise AuditMissing(f"--audit {path} is not an `envhub audit --json` report of this "
                           f"package ({_first_problem(e)}); {fix}") from None
    return check_summary(summary, digest, name, version)


def _first_problem(e: Exception) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc']) or 'summary'}: {err['msg']}"
    return str(e)[:300]


def encode_header(summary: AuditSummary) -> str:
    text = base64.urlsafe_b64encode(summary.model_dump_json().encode()).decode("ascii")
    if len(text) > MAX_HEADER_CHARS:  # MAX_FLAGGED short lines fit; keep the first ones
        keep = summary.model_copy(update={"flagged": summary.flagged[:8]})
        text = base64.urlsafe_b64encode(keep.model_dump_json().encode()).decode("ascii")
    return text


def decode_header(value: str) -> AuditSummary:
    """The registry's side: untrusted input, bounded, BadRequest naming what to fix."""
    if len(value) > MAX_HEADER_CHARS:
        raise BadRequest(f"{HEADER} is {len(value)} characters, over {MAX_HEADER_CHARS}; send "
                         "the summary `envhub publish` makes, not the whole audit report")
    try:
        raw = base64.urlsafe_b64decode(value.strip().encode("ascii"))
        return AuditSummary.model_validate_json(raw)
    except (ValueError, binascii.Error, UnicodeEncodeError) as e:
        raise BadRequest(f"{HEADER} must be the base64url of an audit summary JSON "
                         f"({_first_problem(e)}); publish with `envhub publish`") from None
