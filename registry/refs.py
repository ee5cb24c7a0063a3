"""Package references `owner/name@version` and semantic versions.

A reference's version part is an exact version (`1.2.0`), `latest`, or a range:
`^1.2.0` (same major), `~1.2.0` (same minor), or comparisons joined by commas
(`>=1.0.0,<2.0.0`). Ranges and `latest` skip yanked versions and pre-releases (unless the
range itself names a pre-release); an exact version is always installable, yanked or not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

from envhub.envs.manifest import NAME_RE, SEMVER_RE
from envhub.registry.errors import BadRequest

OWNER_RE = NAME_RE
_CORE_RE = re.compile(
    r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
_CMP_RE = re.compile(r"^(>=|<=|>|<|==|=)?\s*(.+)$")


@total_ordering
@dataclass(frozen=True)
class Version:
    """A semantic version; ordering follows semver 2.0 (build metadata ignored)."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> Version:
        if not SEMVER_RE.match(text):
            raise BadRequest(f"'{text}' is not a semantic version; use MAJOR.MINOR.PATCH, "
                             "e.g. 1.0.0 or 1.0.0-rc.1")
        return cls._from(text, partial=False)

    @classmethod
    def _from(cls, text: str, partial: bool) -> Version:
        m = _CORE_RE.match(text)
        if m is None or (not partial and (m.group(2) is None or m.group(3) is None)):
            raise BadRequest(f"'{text}' is not a version; use e.g. 1.2.0")
        pre = tuple(m.group(4).split(".")) if m.group(4) else ()
        return cls(int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0), pre, text)

    @property
    def is_prerelease(self) -> bool:
        return bool(self.pre)

    def _key(self) -> tuple:
        # A release sorts after its pre-releases; numeric identifiers sort before text ones.
        pre_key = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre_key)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.text or f"{self.major}.{self.minor}.{self.patch}"


@dataclass(frozen=True)
class VersionSpec:
    """`latest`, an exact version, or a range (see module docstring)."""

    text: str

    @classmethod
    def parse(cls, text: str) -> VersionSpec:
        spec = cls(text.strip() or "latest")
        spec._bounds()  # validate now so bad input fails at the edge
        return spec

    @property
    def exact(self) -> str | None:
        """The version when the spec names exactly one (`1.2.0` or `=1.2.0`), else None."""
        t = self.text.lstrip("=").strip()
        return t if SEMVER_RE.match(t) else None

    def _bounds(self) -> list[tuple[str, Version]]:
        t = self.text
        if t in ("latest", "*"):
            return []
        if t.startswith("^"):
            low = Version._from(t[1:].strip(), partial=True)
            if low.major > 0:
                high = Version(low.major + 1, 0, 0)
            elif low.minor > 0:
                high = Version(0, low.minor + 1, 0)
            else:
                high = Version(0, 0, low.patch + 1)
            return [(">=", low), ("<", high)]
        if t.startswith("~"):
            low = Version._from(t[1:].strip(), partial=True)
            return [(">=", low), ("<", Version(low.major, low.minor + 1, 0))]
        out = []
        for part in t.split(","):
            m = _CMP_RE.match(part.strip())
            if m is None or not part.strip():
                raise BadRequest(f"bad version range '{t}'; use 1.2.0, latest, ^1.2.0, ~1.2.0 "
                                 "or comparisons like '>=1.0.0,<2.0.0'")
            op = m.group(1) or "=="
            try:
                version = Version._from(m.group(2).strip(), partial=op != "==")
            except BadRequest:
                raise BadRequest(f"bad version range '{t}'; use 1.2.0, latest, ^1.2.0, ~1.2.0 "
                                 "or comparisons like '>=1.0.0,<2.0.0'") from None
            out.append(("==" if op == "=" else op, version))
        return out

    def matches(self, version: Version) -> bool:
        bounds = self._bounds()
        # Pre-releases are opt-in: only a spec that names one picks one.
        if (version.is_prerelease and self.exact is None
                and not any(b.is_prerelease for _, b in bounds)):
            return False
        ops = {">=": version.__ge__, "<=": version.__le__, ">": version.__gt__,
               "<": version.__lt__, "==": version.__eq__}
        return all(ops[op](bound) for op, bound in bounds)

    def pick(self, candidates: list[tuple[str, bool]]) -> str | None:
        """Choose from `(version, yanked)` pairs; exact specs may pick yanked versions."""
        if self.exact is not None:
            want = Version.parse(self.exact)
            return next((v for v, _ in candidates if Version.parse(v) == want), None)
        live = [Version.parse(v) for v, yanked in candidates if not yanked]
        chosen = [v for v in live if self.matches(v)]
        if not chosen and self.text in ("latest", "*"):
            chosen = live  # only pre-releases were published: latest is the newest of them
        return str(max(chosen)) if chosen else None

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class PackageRef:
    """`owner/name[@spec]`; `spec` defaults to `latest`."""

    owner: str
    name: str
    spec: VersionSpec

    @classmethod
    def parse(cls, text: str) -> PackageRef:
        base, _, spec = text.strip().partition("@")
        owner, slash, name = base.partition("/")
        if not slash or not OWNER_RE.match(owner) or not NAME_RE.match(name):
            raise BadRequest(f"'{text}' is not a package reference; use owner/name@version, "
                             "e.g. alice/my-env@1.2.0 (lowercase letters, digits, '.', '_', '-')")
        return cls(owner, name, VersionSpec.parse(spec or "latest"))

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"

    def __str__(self) -> str:
        return f"{self.owner}/{self.name}@{self.spec}"


def check_owner(owner: str) -> str:
    if not OWNER_RE.match(owner):
        raise BadRequest(f"owner '{owner}' is invalid; use lowercase letters, digits, '.', '_' "
                         "or '-', at most 64 chars")
    return owner


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise BadRequest(f"package name '{name}' is invalid; use lowercase letters, digits, "
                         "'.', '_' or '-', at most 64 chars")
    return name
