"""Names, semantic versions, ranges, `latest` and yanking rules."""

from __future__ import annotations

import pytest

from envhub.registry.errors import BadRequest
from envhub.registry.refs import PackageRef, Version, VersionSpec


def test_semver_precedence() -> None:
    order = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta",
             "1.0.0-beta.2", "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.10.0",
             "2.0.0"]
    parsed = [Version.parse(v) for v in order]
    shuffled = parsed[5:] + parsed[:5]
    shuffled.reverse()
    assert sorted(shuffled) == parsed
    assert Version.parse("1.0.0+build.5") == Version.parse("1.0.0")


@pytest.mark.parametrize("text", ["1.0", "v1.0.0", "1.0.0.0", "", "latest!"])
def test_bad_versions_are_refused(text: str) -> None:
    with pytest.raises(BadRequest, match="semantic version"):
        Version.parse(text)


CANDIDATES = [("0.9.0", False), ("1.0.0", False), ("1.2.0", False), ("1.3.0", True),
              ("1.4.0-rc.1", False), ("2.0.0", True)]


@pytest.mark.parametrize(("spec", "expected"), [
    ("latest", "1.2.0"),          # 2.0.0 and 1.3.0 are yanked, 1.4.0-rc.1 is a pre-release
    ("^1.0.0", "1.2.0"),
    ("~1.0.0", "1.0.0"),
    (">=0.9.0,<1.0.0", "0.9.0"),
    ("1.3.0", "1.3.0"),           # exact pins still reach yanked versions
    ("2.0.0", "2.0.0"),
    ("1.4.0-rc.1", "1.4.0-rc.1"),
    (">=1.4.0-rc.1", "1.4.0-rc.1"),  # a range naming a pre-release may pick one
    ("^3.0.0", None),
])
def test_spec_picks(spec: str, expected: str | None) -> None:
    assert VersionSpec.parse(spec).pick(CANDIDATES) == expected


def test_latest_falls_back_to_prereleases_when_nothing_else() -> None:
    assert VersionSpec.parse("latest").pick([("1.0.0-rc.1", False), ("1.0.0-rc.2", False)]) \
        == "1.0.0-rc.2"


@pytest.mark.parametrize("text", ["alice/my-env@1.2.0", "alice/my-env", "a.b/c_d@^1.0.0"])
def test_refs_parse(text: str) -> None:
    ref = PackageRef.parse(text)
    assert ref.full_name == text.split("@")[0]


@pytest.mark.parametrize("text", ["my-env", "Alice/my-env", "alice/", "/x", "a/b/c",
                                  "alice/my env", "alice/x@>>1", "alice/x@1.2.3.4"])
def test_bad_refs_say_the_form(text: str) -> None:
    with pytest.raises(BadRequest, match=r"owner/name@version|version range|version"):
        PackageRef.parse(text)
