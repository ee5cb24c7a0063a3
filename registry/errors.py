"""Registry errors. Every message says what to fix; the HTTP layer renders them as
`{"error": {"code": ..., "message": ...}}` with `status_code`, the CLI exits with code 2."""

from __future__ import annotations

# One MissingExtra for every component (an `as` import: an explicit re-export).
from envhub.sdk.errors import MissingExtra as MissingExtra


class RegistryError(Exception):
    """Base class; `code` is a stable machine-readable word, `message` is for humans."""

    status_code = 400
    code = "bad_request"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BadRequest(RegistryError):
    """Malformed reference, version, query or header."""


class BadPackage(RegistryError):
    """An archive that is unsafe, corrupt, too large or has a bad manifest."""

    status_code = 422
    code = "bad_package"


class DigestMismatch(BadPackage):
    code = "digest_mismatch"


class TooLarge(BadPackage):
    status_code = 413
    code = "too_large"


class Unauthorized(RegistryError):
    status_code = 401
    code = "unauthorized"


class Forbidden(RegistryError):
    status_code = 403
    code = "forbidden"


class NotFound(RegistryError):
    status_code = 404
    code = "not_found"


class Conflict(RegistryError):
    status_code = 409
    code = "conflict"


class QuotaExceeded(TooLarge):
    """The owner's stored packages would pass the registry's per-owner quota."""

    code = "quota_exceeded"


class RateLimited(RegistryError):
    """Too many uploads from one token in the window; `retry_after` seconds until the next."""

    status_code = 429
    code = "rate_limited"
    retry_after = 60


class Unavailable(RegistryError):
    """The registry could not be reached (client side only)."""

    status_code = 503
    code = "unavailable"


class DependencyError(RegistryError):
    """Installing an environment's declared Python dependencies failed."""

    code = "dependency_error"


_BY_CODE: dict[str, type[RegistryError]] = {
    cls.code: cls
    for cls in (BadRequest, BadPackage, DigestMismatch, TooLarge, QuotaExceeded, Unauthorized,
                Forbidden, NotFound, Conflict, RateLimited, Unavailable, DependencyError)
}


def from_wire(code: str, message: str, status_code: int) -> RegistryError:
    """Rebuild the error a server sent (client side), keeping its class when known."""
    cls = _BY_CODE.get(code)
    if cls is None:
        err = RegistryError(message)
        err.status_code = status_code
        return err
    return cls(message)
