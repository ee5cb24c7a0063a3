"""Size limits for packages, shared by `pack`, the server and `install`."""

from __future__ import annotations

from pydantic import BaseModel, Field

MiB = 1 << 20
# A search hit carries at most this much of a description (the package's own endpoint, or
# `envhub info`, gives the whole text): a result page stays small whatever authors write.
SEARCH_DESCRIPTION_CHARS = 500


def brief(text: str, limit: int = SEARCH_DESCRIPTION_CHARS) -> str:
    """`text` cut to `limit` characters, ending with an ellipsis when it was cut."""
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "\u2026"


class Limits(BaseModel):
    """Bounds an archive must respect; checked while streaming, before anything is kept."""

    max_archive_bytes: int = Field(default=100 * MiB, ge=1, description="compressed .tar.gz size")
    max_total_bytes: int = Field(default=512 * MiB, ge=1, description="sum of unpacked file sizes")
    max_file_bytes: int = Field(default=256 * MiB, ge=1, description="one unpacked file")
    max_entries: int = Field(default=20_000, ge=1, description="files and folders in one package")
    max_ratio: float = Field(
        default=200.0, gt=1,
        description="unpacked/compressed bytes; above it the archive is a bomb")
    ratio_floor_bytes: int = Field(
        default=8 * MiB, ge=0,
        description="the ratio is enforced once this many bytes are unpacked "
        "(tiny archives of text legitimately compress very well)")
    # Filesystems count names in bytes: ext4, xfs, btrfs and APFS allow 255 per component, and
    # an install root plus the entry's path must stay well under PATH_MAX (4096 on Linux).
    # Refused at publish, so the registry never holds a package that cannot be installed.
    max_name_bytes: int = Field(default=255, ge=16,
                                description="UTF-8 bytes of one path component (file name)")
    max_path_bytes: int = Field(default=1024, ge=16,
                                description="UTF-8 bytes of one entry's whole path")
    max_manifest_bytes: int = Field(default=1 * MiB, ge=1024, description="size of envhub.toml")

    @property
    def max_stream_bytes(self) -> int:
        """Bound on the decompressed tar stream: file data plus header/padding overhead."""
        return self.max_total_bytes + self.max_entries * 2048 + MiB
