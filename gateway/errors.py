"""Gateway errors; rendered in the OpenAI error shape by the HTTP layer."""

from __future__ import annotations

# One MissingExtra for every component (an `as` import: an explicit re-export).
from envhub.sdk.errors import MissingExtra as MissingExtra


class GatewayError(Exception):
    status_code = 400
    type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class BadRequest(GatewayError):
    pass


class Unauthorized(GatewayError):
    status_code = 401
    type = "authentication_error"


class Forbidden(GatewayError):
    """A valid key that may not do this (another session's key, not the admin key)."""

    status_code = 403
    type = "permission_error"


class NotFound(GatewayError):
    status_code = 404
    type = "not_found_error"


class Conflict(GatewayError):
    status_code = 409


class Overloaded(GatewayError):
    """Engines paused (weight update) or saturated; the client should retry later."""

    status_code = 429
    type = "rate_limit_error"

    def __init__(self, message: str, retry_after: float = 1.0):
        super().__init__(message)
        self.retry_after = retry_after


class BackendUnavailable(GatewayError):
    status_code = 503
    type = "server_error"
