"""The base-image recipe: what goes into `envhub/base:<hash12>` and how its tag is derived.

The tag is a content hash of the recipe (suite, mirror, packages, variant, script version),
so changing any of them builds a new image and an unchanged recipe is found in the cache.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

# Bump when the build steps change in a way the other fields do not capture.
SCRIPT_VERSION = 1
BASE_REPOSITORY = "envhub/base"

DEFAULT_PACKAGES = (
    "python3", "python3-pytest", "git", "patch", "ca-certificates", "procps",
    "coreutils", "findutils", "grep", "sed",
)
FALLBACK_MIRROR = "http://deb.debian.org/debian"
FALLBACK_SUITE = "bookworm"


class BaseRecipe(BaseModel):
    """Inputs of the debootstrap build; every field is part of the image tag."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    suite: str = Field(description="Debian release codename, e.g. 'bookworm'")
    mirror: str = Field(description="Debian archive URL the packages come from")
    packages: tuple[str, ...] = Field(default=DEFAULT_PACKAGES,
                                      description="extra packages to include")
    variant: str = Field(default="minbase", description="debootstrap --variant")
    script_version: int = SCRIPT_VERSION

    def digest(self) -> str:
        """Hex sha256 of the canonical JSON of the recipe (packages sorted)."""
        data = self.model_dump()
        data["packages"] = sorted(set(self.packages))
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    @property
    def tag(self) -> str:
        return f"{BASE_REPOSITORY}:{self.digest()[:12]}"


def host_suite(os_release: Path = Path("/etc/os-release")) -> str:
    """The host's Debian codename, or bookworm when the host is not Debian-like."""
    try:
        text = os_release.read_text()
    except OSError:
        return FALLBACK_SUITE
    match = re.search(r"^VERSION_CODENAME=\"?([a-z]+)\"?$", text, re.MULTILINE)
    return match.group(1) if match else FALLBACK_SUITE


def host_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The first Debian archive configured in the host's apt sources (deb822 or one-line).

    Security and third-party archives are skipped: debootstrap needs the main archive.
    """
    files = [apt_dir / "sources.list"] + sorted((apt_dir / "sources.list.d").glob("*"))
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        uris = re.findall(r"^URIs:\s*(\S+)", text, re.MULTILINE)
        uris += re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s", text, re.MULTILINE)
        for uri in uris:
            if re.search(r"/debian/?$", uri) and "security" not in uri:
                return uri.rstrip("/")
    return FALLBACK_MIRROR


def default_recipe(packages: tuple[str, ...] = DEFAULT_PACKAGES) -> BaseRecipe:
    """The recipe for this host: its release and mirror, the default package set."""
    return BaseRecipe(suite=host_suite(), mirror=host_mirror(), packages=packages)
