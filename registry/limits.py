"""Size limits for packages, shared by `pack`, the server and `install`."""

from __future__ import annotations

import hashlib
import math
import time
from collections import deque
from collections.abc import Callable

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
    # What one publisher may take: stored bytes per owner (every version's archive, yanked ones
    # included: they are still served), and uploads per token per hour, counted before the body
    # is read (refused ones too: each costs the server a scan), per server process.
    max_owner_bytes: int = Field(default=10 * 1024 * MiB, ge=1,
                                 description="archive bytes stored for one owner")
    uploads_per_hour: int = Field(default=120, ge=1, description="uploads one token may start "
                                  "in any hour")

    @property
    def max_stream_bytes(self) -> int:
        """Bound on the decompressed tar stream: file data plus header/padding overhead."""
        return self.max_total_bytes + self.max_entries * 2048 + MiB


class UploadWindow:
    """The upload starts of each token over the last hour (this process's): `admit` says
    whether one more may start, and if not, in how many seconds it may. Tokens are only counted
    once the server has checked them, so the table holds at most one entry per real token."""

    HOUR = 3600.0

    def __init__(self, per_hour: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_hour, self.clock = per_hour, clock
        self._starts: dict[str, deque[float]] = {}

    def admit(self, token: str) -> int | None:
        """None and the start counted, or the whole seconds until the oldest start leaves."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        starts = self._starts.setdefault(key, deque())
        while starts and starts[0] <= now - self.HOUR:
            starts.popleft()
        if len(starts) >= self.per_hour:
            return max(1, math.ceil(starts[0] + self.HOUR - now))
        starts.append(now)
        return None
