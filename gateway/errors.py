"""Gateway errors; rendered in the OpenAI error shape by the HTTP layer."""

from __future__ import annotations

import logging
import uuid

# One MissingExtra for every component (an `as` import: an explicit re-export).
from envhub.sdk.errors import MissingExtra as MissingExtra

POOL_RETRY_AFTER_S = 5.0  # what a client is told to wait while the pool cannot write


class GatewayError(Exception):
    status_code = 400
    type = "invalid_request_error"
    error_id: str | None = None  # set where the cause is logged under an id (x-envhub-error-id)

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


class PoolFault(GatewayError):
    """The data pool cannot record (or read) right now through no fault of the request: its
    disk is full, its database unreachable. A 503 naming the pool, with Retry-After; nothing
    of the call reached the client."""

    status_code = 503
    type = "server_error"

    def __init__(self, reason: str, retry_after: float = POOL_RETRY_AFTER_S):
        super().__init__(f"the gateway's data pool cannot record this call: {reason}; its "
                         f"answer was not returned. Retry after {round(retry_after)} s (the "
                         "gateway's /health says when the pool is ready again)",
                         code="pool_unavailable")
        self.reason = reason
        self.retry_after = retry_after


class InternalError(GatewayError):
    """A 500 that tells the client nothing of its cause: a generic message and an error id.
    Build it with `internal_error`, which logs the id with the full traceback."""

    status_code = 500
    type = "server_error"

    def __init__(self, error_id: str):
        super().__init__(f"internal server error (error id {error_id}); the operator finds the "
                         "cause in the server's log under this id", code="internal_error")
        self.error_id = error_id


class BodyTooLarge(Exception):
    """A request body grew past the limit while it was read: the edge answers 413
    (gateway/server.py). Not a GatewayError: route handlers let it pass."""


def internal_error(exc: BaseException, where: str,
                   logger: logging.Logger | None = None) -> GatewayError:
    """An unexpected exception as a client-safe 500: the exception text, its type and any
    paths stay in the log (with the traceback and `where`, under a fresh error id); the
    body carries only the id. A failure of the data pool itself (full disk, database gone)
    is a PoolFault (503 + Retry-After) instead, logged as one line under its id."""
    from envhub.gateway.pool.store import fault_reason

    error_id = "err_" + uuid.uuid4().hex[:16]
    logger = logger or logging.getLogger("envhub.gateway")
    reason = fault_reason(exc)
    if reason is not None:
        logger.warning("pool unavailable %s on %s: %s (%s)", error_id, where, reason,
                       str(getattr(exc, "orig", exc))[:300])
        fault = PoolFault(reason)
        fault.error_id = error_id
        return fault
    err = InternalError(error_id)
    logger.error("internal error %s on %s", err.error_id, where, exc_info=exc)
    return err


def engine_unavailable(exc: GatewayError, logger: logging.Logger | None = None
                       ) -> BackendUnavailable:
    """An engine's failure as the client sees it: still a 503 to retry, but the instance's
    name (often its URL), the upstream's own message and the fleet's state stay in the log
    (one line, no traceback: an engine going away is an operational event, not a bug) under
    a fresh error id that the answer carries."""
    error_id = "err_" + uuid.uuid4().hex[:16]
    (logger or logging.getLogger("envhub.gateway")).warning(
        "engine unavailable %s: %s", error_id, exc.message)
    err = BackendUnavailable(f"the inference engine is unavailable (error id {error_id}; the "
                             "operator finds the cause in the gateway's log); retry")
    err.error_id = error_id
    return err
