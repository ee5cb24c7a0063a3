"""Registry wire types: what the HTTP API returns and what the local registry returns too."""

from __future__ import annotations

from pydantic import BaseModel, Field


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


class WhoAmI(BaseModel):
    owners: list[str]


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorDetail
