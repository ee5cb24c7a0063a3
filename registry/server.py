"""The HTTP registry: FastAPI over a `Catalog`. OpenAPI at /openapi.json, docs at /docs.

Reads are public; publishing and yanking need `Authorization: Bearer <token>` from
`envhub registry token create`, and a token acts only under its owners. Uploads are the
raw .tar.gz as the request body; the declared Content-Length is checked before reading
and the streamed size while reading, so an oversized upload gets 413 without being read.
"""

from __future__ import annotations

import os
import pathlib
import socket
from typing import Annotated, Any

from fastapi import FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from envhub import __version__
from envhub.envs.manifest import SEMVER_RE
from envhub.registry.audits import decode_header
from envhub.registry.blobs import DIGEST_RE
from envhub.registry.catalog import Catalog, check_version
from envhub.registry.errors import (
    BadRequest,
    Forbidden,
    NotFound,
    RateLimited,
    RegistryError,
    TooLarge,
    Unauthorized,
)
from envhub.registry.limits import Limits, UploadWindow
from envhub.registry.models import (
    ErrorBody,
    PackageInfo,
    PublishResult,
    SearchResult,
    SigningKey,
    VersionInfo,
    WhoAmI,
    YankRequest,
)
from envhub.registry.refs import PackageRef, VersionSpec, check_name, check_owner
from envhub.registry.web import add_html_index

API = "/api/v1"
_NAME = r"^[a-z0-9][a-z0-9._-]{0,63}$"
# Path parameters carry their syntax in the OpenAPI spec, so clients and fuzzers know it.
Owner = Annotated[str, Path(pattern=_NAME, examples=["alice"], description="package owner")]
Name = Annotated[str, Path(pattern=_NAME, examples=["my-env"], description="package name")]
Ver = Annotated[str, Path(max_length=64, pattern=SEMVER_RE.pattern, examples=["1.2.0"],
                          description="semantic version")]
Digest = Annotated[str, Path(pattern=DIGEST_RE.pattern, description="'sha256:<64 hex>'")]
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 413, 422)}


class ServerConfig(BaseModel):
    """`envhub registry serve` options (flags map 1:1 onto these fields)."""

    data: pathlib.Path = Field(description="folder for blobs and the SQLite index")
    db: str | None = Field(default=None, description="index database URL; default sqlite in `data`")
    host: str = "127.0.0.1"
    port: int = 8500
    limits: Limits = Field(default_factory=lambda: Limits())


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized("this request needs a token: send 'Authorization: Bearer <token>' "
                           "(create one with `envhub registry token create --owner NAME`)")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("use 'Authorization: Bearer <token>'")
    return token.strip()


def create_app(config: ServerConfig, catalog: Catalog | None = None) -> FastAPI:
    catalog = catalog or Catalog(config.data, config.db, config.limits)
    limits = catalog.limits
    app = FastAPI(title="envhub registry", version=__version__,
                  description="Publish, find and download envhub environment packages.")

    uploads = UploadWindow(limits.uploads_per_hour)

    @app.exception_handler(RegistryError)
    async def _registry_error(_req: Request, exc: RegistryError) -> JSONResponse:
        resp = _error(exc.status_code, exc.code, exc.message)
        if isinstance(exc, RateLimited):
            resp.headers["Retry-After"] = str(exc.retry_after)
        return resp

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors())
        return _error(422, "invalid_request", problems)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        resp = _error(exc.status_code, "http_error", str(exc.detail))
        resp.headers.update(exc.headers or {})  # e.g. `Allow` on 405
        return resp

    async def owners_of(authorization: str | None) -> list[str]:
        owners = await run_in_threadpool(catalog.token_owners, _bearer(authorization))
        if owners is None:
            raise Unauthorized("unknown token; check it or create a new one with "
                               "`envhub registry token create --owner NAME`")
        return owners

    async def may_act_as(authorization: str | None, owner: str) -> list[str]:
        """The token's owners, if `owner` is one of them (401/403 otherwise)."""
        owners = await owners_of(authorization)
        if owner not in owners:
            raise Forbidden(f"this token acts only for {', '.join(owners)}, not '{owner}'; "
                            f"publish under your owner or get a token with --owner {owner}")
        return owners

    @app.get(f"{API}/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @app.get(f"{API}/key", response_model=SigningKey)
    async def key() -> SigningKey:
        """The public key this registry signs version and verification records with."""
        return SigningKey(key=catalog.key.public_b64, key_id=catalog.key.key_id)

    @app.get(f"{API}/owners/{{owner}}/key", response_model=SigningKey, responses=ERRORS)
    async def owner_key(owner: Owner) -> SigningKey:
        """The owner's publisher key, whose signature its uploads carry (404: it has none)."""
        check_owner(owner)
        found = await run_in_threadpool(catalog.publisher_key, owner)
        if found is None:
            raise NotFound(f"owner {owner} has no publisher key on this registry")
        return SigningKey(key=found[0], key_id=found[1])

    @app.get(f"{API}/packages/{{owner}}/{{name}}/versions/{{version}}/audit",
             responses={**ERRORS, 200: {"content": {"application/json": {}}, "description":
                                         "the whole `envhub audit --json` report"}})
    async def audit_report(owner: Owner, name: Name, version: Ver,
                           authorization: Annotated[str | None, Header()] = None) -> Response:
        """The report of the registry's own audit of a version (the owner's token): which
        cheats won, and each run's numbers."""
        check_owner(owner), check_name(name), check_version(version)
        await may_act_as(authorization, owner)
        await run_in_threadpool(catalog.version, owner, name, version)  # 404 with the fix
        report = await run_in_threadpool(catalog.audit_report, owner, name, version)
        if report is None:
            raise NotFound(f"{owner}/{name}@{version} has no audit by this registry yet")
        return Response(report, media_type="application/json")

    @app.get(f"{API}/whoami", response_model=WhoAmI, responses=ERRORS)
    async def whoami(authorization: Annotated[str | None, Header()] = None) -> WhoAmI:
        return WhoAmI(owners=await owners_of(authorization))

    @app.get(f"{API}/search", response_model=SearchResult, responses=ERRORS)
    async def search(q: Annotated[str, Query(max_length=200)] = "",
                     limit: Annotated[int, Query(ge=1, le=100)] = 20) -> SearchResult:
        return SearchResult(hits=await run_in_threadpool(catalog.search, q, limit))

    @app.get(f"{API}/packages/{{owner}}/{{name}}", response_model=PackageInfo, responses=ERRORS)
    async def package(owner: Owner, name: Name) -> PackageInfo:
        return await run_in_threadpool(catalog.package, check_owner(owner), check_name(name))

    @app.get(f"{API}/packages/{{owner}}/{{name}}/resolve", response_model=VersionInfo,
             responses=ERRORS)
    async def resolve(owner: Owner, name: Name,
                      spec: Annotated[str, Query(max_length=100)] = "latest") -> VersionInfo:
        ref = PackageRef(check_owner(owner), check_name(name), VersionSpec.parse(spec))
        return await run_in_threadpool(catalog.resolve, ref)

    @app.get(f"{API}/packages/{{owner}}/{{name}}/versions/{{version}}",
             response_model=VersionInfo, responses=ERRORS)
    async def version(owner: Owner, name: Name, version: Ver) -> VersionInfo:
        return await run_in_threadpool(catalog.version, owner, name, version)

    @app.put(
        f"{API}/packages/{{owner}}/{{name}}/versions/{{version}}",
        response_model=PublishResult, status_code=201,
        responses={**ERRORS, 200: {"model": PublishResult,
                                   "description": "identical content was already published"}},
        openapi_extra={"requestBody": {"required": True, "content": {
            # Any content type is accepted; the body is the raw .tar.gz from `envhub pack`.
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
    )
    async def publish(owner: Owner, name: Name, version: Ver, request: Request,
                      authorization: Annotated[str | None, Header()] = None,
                      x_envhub_digest: Annotated[str | None, Header()] = None,
                      x_envhub_audit: Annotated[str | None, Header(
                          description="base64url JSON AuditSummary of this exact package; "
                          "absent: recorded as not audited")] = None,
                      x_envhub_publisher_signature: Annotated[str | None, Header(
                          max_length=200, description="base64 ed25519 signature of the "
                          "publisher record (owner, name, version, digest) by the owner's "
                          "publisher key; required when the owner has one")] = None
                      ) -> JSONResponse:
        """Upload a package built by `envhub pack`; 201 new, 200 same content again."""
        check_owner(owner), check_name(name), check_version(version)
        owners = await may_act_as(authorization, owner)
        wait = uploads.admit(_bearer(authorization))
        if wait is not None:  # before the body is read: a flood costs a header each
            error = RateLimited(f"this token started {limits.uploads_per_hour} uploads in the "
                                f"last hour, this registry's limit; retry in {wait} s")
            error.retry_after = wait
            raise error
        audit = None if x_envhub_audit is None else decode_header(x_envhub_audit)
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise BadRequest("Content-Length must be a number of bytes")
            if int(declared) > limits.max_archive_bytes:
                raise TooLarge(f"the upload is {declared} bytes, over this registry's "
                               f"{limits.max_archive_bytes}-byte limit; shrink the package")
        tmp = catalog.blobs.incoming()
        try:
            received = 0
            # Local disk writes of 64 KiB chunks: cheaper inline than a thread hop each.
            with open(tmp, "wb") as f:  # noqa: ASYNC230
                async for chunk in request.stream():
                    received += len(chunk)
                    if received > limits.max_archive_bytes:
                        raise TooLarge(f"the upload is over this registry's "
                                       f"{limits.max_archive_bytes}-byte limit; shrink it")
                    f.write(chunk)
            if received == 0:
                raise BadRequest("the request body is empty; send the .tar.gz from `envhub pack`")
            result = await run_in_threadpool(catalog.publish, owner, name, version, tmp,
                                             ",".join(owners), x_envhub_digest, audit,
                                             x_envhub_publisher_signature)
        finally:
            tmp.unlink(missing_ok=True)
        return JSONResponse(result.model_dump(mode="json"),
                            status_code=201 if result.created else 200)

    @app.post(f"{API}/packages/{{owner}}/{{name}}/versions/{{version}}/yank",
              response_model=VersionInfo, responses=ERRORS)
    async def yank(owner: Owner, name: Name, version: Ver, body: YankRequest,
                   authorization: Annotated[str | None, Header()] = None) -> VersionInfo:
        """Yank (or un-yank) a version: ranges and `latest` skip it, exact pins still work."""
        check_owner(owner), check_name(name), check_version(version)
        await may_act_as(authorization, owner)
        return await run_in_threadpool(catalog.yank, owner, name, version, body.yanked)

    @app.get(f"{API}/blobs/{{digest}}", responses={
        **ERRORS, 200: {"content": {"application/gzip": {}}, "description": "the .tar.gz"}})
    async def blob(digest: Digest) -> FileResponse:
        path = await run_in_threadpool(catalog.blob_path, digest)
        return FileResponse(path, media_type="application/gzip",
                            headers={"X-Envhub-Digest": digest})

    add_html_index(app, catalog)
    app.state.catalog = catalog
    return app


def serve(config: ServerConfig) -> None:
    """Run the registry with uvicorn until interrupted."""
    import uvicorn

    config.data.mkdir(parents=True, exist_ok=True)
    # Fail with the fix before uvicorn starts, rather than with its traceback.
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((config.host, config.port))
        except OSError as e:
            raise BadRequest(f"cannot listen on {config.host}:{config.port} ({e.strerror}); "
                             "pick another --port or --host") from None
    app = create_app(config)
    # One worker process: SQLite's writer lock and the blob directory are per host anyway;
    # scale out with PostgreSQL and several `serve` processes on a shared data folder.
    uvicorn.run(app, host=config.host, port=config.port, log_level=os.environ.get(
        "ENVHUB_LOG_LEVEL", "warning"))
