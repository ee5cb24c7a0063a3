"""Async client for the HTTP registry (`envhub registry serve`)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from envhub.registry.audits import HEADER, encode_header
from envhub.registry.errors import (
    DigestMismatch,
    NotFound,
    RegistryError,
    Unavailable,
    from_wire,
)
from envhub.registry.models import (
    AuditSummary,
    PackageInfo,
    PublishResult,
    SearchHit,
    SearchResult,
    SigningKey,
    VersionInfo,
    WhoAmI,
)
from envhub.registry.refs import PackageRef

API = "/api/v1"
M = TypeVar("M", bound=BaseModel)


class RegistryClient:
    """One registry at `url`; `token` is needed only to publish and yank."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 120.0):
        if not url.startswith(("http://", "https://")):
            raise RegistryError(f"registry URL '{url}' must start with http:// or https://")
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=self.url + API, headers=headers,
                                       timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    def _unreachable(self, exc: Exception) -> Unavailable:
        return Unavailable(f"cannot reach the registry at {self.url} ({exc}); check the URL "
                           "(--registry / `envhub login`) and that `envhub registry serve` runs")

    @staticmethod
    def _raise_for(resp: httpx.Response) -> None:
        if resp.status_code < 400:
            return
        try:
            err = resp.json()["error"]
            raise from_wire(err["code"], err["message"], resp.status_code)
        except (ValueError, KeyError, TypeError):
            raise RegistryError(f"registry answered HTTP {resp.status_code}: "
                                f"{resp.text[:300]}") from None

    async def _call(self, model: type[M], method: str, path: str, **kw: Any) -> M:
        """One request; the answer parsed as `model`, or a RegistryError saying why not."""
        try:
            resp = await self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise self._unreachable(e) from None
        self._raise_for(resp)
        try:
            return model.model_validate_json(resp.content)
        except ValidationError as e:
            raise RegistryError(f"{self.url} sent something that is not a valid answer to "
                                f"{method} {path} ({e.error_count()} problems, first: "
                                f"{e.errors()[0]['msg']}); is it an envhub registry?") from None

    async def signing_key(self) -> SigningKey:
        """The registry's public key (a registry that has none does not sign: NotFound)."""
        return await self._call(SigningKey, "GET", "/key")

    async def owner_key(self, owner: str) -> SigningKey | None:
        """`owner`'s publisher key, None when it has none."""
        try:
            return await self._call(SigningKey, "GET", f"/owners/{owner}/key")
        except NotFound:
            return None

    async def whoami(self) -> list[str]:
        return (await self._call(WhoAmI, "GET", "/whoami")).owners

    async def search(self, query: str = "", limit: int = 20) -> list[SearchHit]:
        params = {"q": query, "limit": limit}
        return (await self._call(SearchResult, "GET", "/search", params=params)).hits

    async def package(self, owner: str, name: str) -> PackageInfo:
        return await self._call(PackageInfo, "GET", f"/packages/{owner}/{name}")

    async def resolve(self, ref: PackageRef) -> VersionInfo:
        return await self._call(VersionInfo, "GET", f"/packages/{ref.owner}/{ref.name}/resolve",
                                params={"spec": str(ref.spec)})

    async def publish(self, owner: str, name: str, version: str, archive: Path,
                      digest: str, audit: AuditSummary,
                      signature: str | None = None) -> PublishResult:
        headers = {"Content-Type": "application/gzip", "X-Envhub-Digest": digest,
                   HEADER: encode_header(audit)}
        if signature is not None:
            headers["X-Envhub-Publisher-Signature"] = signature
        return await self._call(PublishResult, "PUT",
                                f"/packages/{owner}/{name}/versions/{version}",
                                content=archive.read_bytes(), headers=headers)

    async def yank(self, owner: str, name: str, version: str, yanked: bool) -> VersionInfo:
        return await self._call(VersionInfo, "POST",
                                f"/packages/{owner}/{name}/versions/{version}/yank",
                                json={"yanked": yanked})

    async def download(self, info: VersionInfo, dest: Path) -> None:
        """Stream the blob into `dest`, refusing it if its sha256 or size is not `info`'s."""
        h = hashlib.sha256()
        size = 0
        try:
            async with self._http.stream("GET", f"/blobs/{info.digest}") as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    self._raise_for(resp)
                # Local disk writes of 64 KiB chunks: cheaper inline than a thread hop each.
                with open(dest, "wb") as f:  # noqa: ASYNC230
                    async for chunk in resp.aiter_bytes(1 << 16):
                        size += len(chunk)
                        if size > info.size:
                            raise DigestMismatch(f"the download of {info.ref} is larger than "
                                                 f"the registry's {info.size} bytes; refused")
                        h.update(chunk)
                        f.write(chunk)
        except httpx.TransportError as e:
            raise self._unreachable(e) from None
        got = "sha256:" + h.hexdigest()
        if got != info.digest:
            raise DigestMismatch(f"the download of {info.ref} has digest {got}, not the "
                                 f"registry's {info.digest}; it was corrupted or tampered with, "
                                 "refused (retry, or tell the registry's admin)")
