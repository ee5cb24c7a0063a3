"""Where packages come from: the embedded local registry or an HTTP registry, behind one
async interface so install, search and info do not care which."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Protocol

from envhub.registry.archive import sha256_file
from envhub.registry.catalog import Catalog
from envhub.registry.client import RegistryClient
from envhub.registry.errors import DigestMismatch
from envhub.registry.home import LOCAL, choose_registry, choose_token, envhub_home
from envhub.registry.models import (
    AuditSummary,
    PackageInfo,
    PublishResult,
    SearchHit,
    SigningKey,
    VersionInfo,
)
from envhub.registry.refs import PackageRef


class Registry(Protocol):
    location: str  # "local" or the server URL

    async def search(self, query: str, limit: int = 20) -> list[SearchHit]: ...
    async def package(self, owner: str, name: str) -> PackageInfo: ...
    async def resolve(self, ref: PackageRef) -> VersionInfo: ...
    async def fetch(self, info: VersionInfo, dest: Path) -> None: ...
    async def publish(self, owner: str, archive: Path, digest: str, name: str,
                      version: str, audit: AuditSummary,
                      signature: str | None = None) -> PublishResult: ...
    async def yank(self, owner: str, name: str, version: str, yanked: bool) -> VersionInfo: ...
    async def default_owner(self) -> str | None: ...
    async def signing_key(self) -> SigningKey: ...
    async def owner_key(self, owner: str) -> SigningKey | None: ...
    async def aclose(self) -> None: ...


class LocalRegistry:
    """The embedded registry under `<home>/registry` (no server, no tokens)."""

    location = LOCAL

    def __init__(self, home: Path | None = None):
        self.catalog = Catalog((home or envhub_home()) / "registry")

    async def search(self, query: str, limit: int = 20) -> list[SearchHit]:
        return await asyncio.to_thread(self.catalog.search, query, limit)

    async def package(self, owner: str, name: str) -> PackageInfo:
        return await asyncio.to_thread(self.catalog.package, owner, name)

    async def resolve(self, ref: PackageRef) -> VersionInfo:
        return await asyncio.to_thread(self.catalog.resolve, ref)

    async def fetch(self, info: VersionInfo, dest: Path) -> None:
        src = self.catalog.blob_path(info.digest)
        await asyncio.to_thread(shutil.copyfile, src, dest)
        # Blobs on local disk can rot or be edited too: verify like a download.
        got = await asyncio.to_thread(sha256_file, dest)
        if got != info.digest:
            raise DigestMismatch(f"the local blob of {info.ref} has digest {got}, not "
                                 f"{info.digest}; delete {src} and publish it again")

    async def publish(self, owner: str, archive: Path, digest: str, name: str,
                      version: str, audit: AuditSummary,
                      signature: str | None = None) -> PublishResult:
        return await asyncio.to_thread(self.catalog.publish_file, owner, archive, "local",
                                       digest, audit, signature)

    async def yank(self, owner: str, name: str, version: str, yanked: bool) -> VersionInfo:
        return await asyncio.to_thread(self.catalog.yank, owner, name, version, yanked)

    async def default_owner(self) -> str | None:
        return None

    async def signing_key(self) -> SigningKey:
        return SigningKey(key=self.catalog.key.public_b64, key_id=self.catalog.key.key_id)

    async def owner_key(self, owner: str) -> SigningKey | None:
        found = await asyncio.to_thread(self.catalog.publisher_key, owner)
        return None if found is None else SigningKey(key=found[0], key_id=found[1])

    async def aclose(self) -> None:
        self.catalog.close()


class RemoteRegistry:
    """An HTTP registry (`envhub registry serve`)."""

    def __init__(self, url: str, token: str | None = None):
        self.location = url
        self.client = RegistryClient(url, token)
        self.has_token = token is not None

    async def search(self, query: str, limit: int = 20) -> list[SearchHit]:
        return await self.client.search(query, limit)

    async def package(self, owner: str, name: str) -> PackageInfo:
        return await self.client.package(owner, name)

    async def resolve(self, ref: PackageRef) -> VersionInfo:
        return await self.client.resolve(ref)

    async def fetch(self, info: VersionInfo, dest: Path) -> None:
        await self.client.download(info, dest)

    async def publish(self, owner: str, archive: Path, digest: str, name: str,
                      version: str, audit: AuditSummary,
                      signature: str | None = None) -> PublishResult:
        return await self.client.publish(owner, name, version, archive, digest, audit,
                                         signature)

    async def yank(self, owner: str, name: str, version: str, yanked: bool) -> VersionInfo:
        return await self.client.yank(owner, name, version, yanked)

    async def default_owner(self) -> str | None:
        """The token's owner when it has exactly one (so `publish` needs no --owner)."""
        if not self.has_token:
            return None
        owners = await self.client.whoami()
        return owners[0] if len(owners) == 1 else None

    async def signing_key(self) -> SigningKey:
        return await self.client.signing_key()

    async def owner_key(self, owner: str) -> SigningKey | None:
        return await self.client.owner_key(owner)

    async def aclose(self) -> None:
        await self.client.aclose()


def open_registry(registry: str | None = None, token: str | None = None,
                  home: Path | None = None) -> Registry:
    """The registry named by `registry` (URL or 'local'), else the configured default."""
    location = choose_registry(registry, home)
    if location == LOCAL:
        return LocalRegistry(home)
    return RemoteRegistry(location, choose_token(location, token, home))
