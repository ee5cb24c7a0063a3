"""`envhub publish` carries an `envhub audit` of exactly the package it uploads (issue 25), and
the registry shows it beside each version (JSON API, HTML index, `envhub install`).

A real registry server on loopback; most tests pass a precomputed audit JSON (the shape
`envhub audit --json` writes), one runs the real audit on a copy of arith.
"""

from __future__ import annotations

import base64
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from envhub.envs.builtin import arith
from envhub.registry.archive import pack
from tests.registry.conftest import API, Server, make_env, put, run_cli
from tests.support import require_tool

ROW = {"what": "", "sandbox": "none", "tasks": 2, "mean_reward": 0.0, "done": 2,
       "env_failure": 0, "agent_error": 0, "resolved": 0, "timed_out": False, "error": None,
       "wall_s": 1.0, "out": "x", "flags": [], "verdict": "ok"}


def audit_json(path: Path, digest: str | None, name: str = "my-env", version: str = "1.2.0",
               flags: dict[str, list[str]] | None = None, age: timedelta = timedelta(0)) -> Path:
    """An audit report as `envhub audit --json` writes it; `flags` per cheat name."""
    flags = flags or {}
    rows = [{**ROW, "cheat": c, "flags": flags.get(c, []),
             "verdict": ", ".join(flags.get(c, [])) or "ok"}
            for c in ("no-op", "oracle", "write-state", "pytest-skip")]
    data = {"env": name, "version": version, "digest": digest, "envhub_version": "0.1.0",
            "date": (datetime.now(UTC) - age).isoformat(), "wall_s": 3.0,
            "flagged": bool(flags), "rows": rows}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def publish(server: Server, folder: Path, *args: str, owner: str = "alice") -> Any:
    return run_cli("publish", str(folder), "--registry", server.url, "--token",
                   server.tokens[owner], "--owner", owner, *args)


def versions(server: Server, owner: str, name: str) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{server.url}{API}/packages/{owner}/{name}", timeout=30)
    if r.status_code == 404:
        return {}
    assert r.status_code == 200, r.text
    return {v["version"]: v for v in r.json()["versions"]}


def test_publish_refuses_a_flagged_audit(server: Server, tmp_path: Path) -> None:
    env = make_env(tmp_path / "env", name="flagged-env")
    digest = pack(env, tmp_path / "dist").digest
    report = audit_json(tmp_path / "a.json", digest, name="flagged-env",
                        flags={"write-state": ["beats no-op"], "pytest-skip": ["escaped"]})
    out = publish(server, env, "--audit", str(report))
    assert out.returncode == 1, out.stderr
    assert "write-state (none): beats no-op" in out.stderr
    assert "pytest-skip (none): escaped" in out.stderr
    assert versions(server, "alice", "flagged-env") == {}


@pytest.mark.parametrize("case", ["other digest", "other package", "stale", "no digest",
                                  "not json"])
def test_publish_refuses_an_audit_that_is_not_of_this_package(
        server: Server, tmp_path: Path, case: str) -> None:
    env = make_env(tmp_path / "env", name="mismatch-env")
    digest = pack(env, tmp_path / "dist").digest
    other = pack(make_env(tmp_path / "older", name="mismatch-env", body="    X = 1\n"),
                 tmp_path / "dist-older").digest
    path = tmp_path / "a.json"
    if case == "other digest":  # the folder changed after the audit
        audit_json(path, other, name="mismatch-env")
    elif case == "other package":
        audit_json(path, digest, name="another-env")
    elif case == "stale":
        audit_json(path, digest, name="mismatch-env", age=timedelta(days=31))
    elif case == "no digest":  # a built-in's audit has none
        audit_json(path, None, name="mismatch-env")
    else:
        path.write_text("{not json", encoding="utf-8")
    out = publish(server, env, "--audit", str(path))
    assert out.returncode == 2, out.stderr
    assert "envhub audit FOLDER --json" in out.stderr  # the fix: the command to run
    assert versions(server, "alice", "mismatch-env") == {}


def test_a_passing_audit_is_published_and_shown_beside_the_version(
        server: Server, tmp_path: Path, home: Path) -> None:
    env = make_env(tmp_path / "env", name="audited-env")
    digest = pack(env, tmp_path / "dist").digest
    report = audit_json(tmp_path / "a.json", digest, name="audited-env")
    out = publish(server, env, "--audit", str(report))
    assert out.returncode == 0, out.stderr
    assert "audit passed" in out.stdout

    audit = versions(server, "alice", "audited-env")["1.2.0"]["audit"]
    assert audit["status"] == "passed" and audit["digest"] == digest
    assert audit["envhub_version"] == "0.1.0" and audit["rows"] == 4
    # the report's own date (written just now, by the audit): not today's, which a run across
    # midnight UTC would read as the next day
    day = json.loads(report.read_text())["date"][:10]
    assert audit["date"].startswith(day)
    resolved = httpx.get(f"{server.url}{API}/packages/alice/audited-env/resolve").json()
    assert resolved["audit"]["status"] == "passed"

    index = httpx.get(f"{server.url}/", params={"q": "audited-env"}).text
    assert f"audited {day}, envhub 0.1.0" in index and "NOT AUDITED" not in index
    page = httpx.get(f"{server.url}/ui/alice/audited-env").text
    assert "audited: passed" in page and "envhub 0.1.0 · 4 runs" in page

    installed = run_cli("install", "alice/audited-env@1.2.0", "--registry", server.url)
    assert installed.returncode == 0, installed.stderr
    assert f"audit passed {day} (envhub 0.1.0, 4 runs)" in installed.stdout
    assert "warning" not in installed.stderr


def test_no_audit_is_explicit_and_shown_loudly(server: Server, tmp_path: Path,
                                               home: Path) -> None:
    env = make_env(tmp_path / "env", name="unaudited-env")
    both = publish(server, env, "--no-audit", "--audit", str(tmp_path / "a.json"))
    assert both.returncode == 2 and "contradict" in both.stderr
    out = publish(server, env, "--no-audit")
    assert out.returncode == 0, out.stderr
    assert "NOT AUDITED" in out.stderr
    audit = versions(server, "alice", "unaudited-env")["1.2.0"]["audit"]
    assert audit["status"] == "not_audited" and "--no-audit" in audit["note"]
    assert "NOT AUDITED" in httpx.get(f"{server.url}/ui/alice/unaudited-env").text
    installed = run_cli("install", "alice/unaudited-env@1.2.0", "--registry", server.url)
    assert installed.returncode == 0, installed.stderr
    assert "warning: alice/unaudited-env@1.2.0 is NOT AUDITED" in installed.stderr
    assert "envhub audit alice/unaudited-env@1.2.0" in installed.stderr

    # the same content published again with a passing audit gets it; later ones change nothing
    digest = pack(env, tmp_path / "dist").digest
    again = publish(server, env, "--audit", str(audit_json(tmp_path / "a.json", digest,
                                                              name="unaudited-env")))
    assert again.returncode == 0 and "already published" in again.stdout, again.stderr
    first = versions(server, "alice", "unaudited-env")["1.2.0"]["audit"]
    assert first["status"] == "passed"
    later = audit_json(tmp_path / "b.json", digest, name="unaudited-env", age=timedelta(days=1))
    for args in (["--no-audit"], ["--audit", str(later)]):
        assert publish(server, env, *args).returncode == 0
        assert versions(server, "alice", "unaudited-env")["1.2.0"]["audit"] == first


def test_an_old_client_without_audit_shows_not_audited(server: Server, tmp_path: Path,
                                                       home: Path) -> None:
    env = make_env(tmp_path / "env", name="old-client-env")
    data = pack(env, tmp_path / "dist").path.read_bytes()
    r = put(server, "/packages/bob/old-client-env/versions/1.2.0", data, server.tokens["bob"])
    assert r.status_code == 201, r.text
    assert r.json()["version"]["audit"]["status"] == "not_audited"
    index = httpx.get(f"{server.url}/", params={"q": "old-client-env"}).text
    assert "NOT AUDITED" in index
    installed = run_cli("install", "bob/old-client-env@1.2.0", "--registry", server.url)
    assert "NOT AUDITED" in installed.stderr


def _header(summary: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(summary).encode()).decode()


def test_the_registry_refuses_a_bad_audit_header(server: Server, tmp_path: Path) -> None:
    env = make_env(tmp_path / "env", name="header-env")
    packed = pack(env, tmp_path / "dist")
    good = {"status": "passed", "digest": packed.digest, "date": datetime.now(UTC).isoformat(),
            "envhub_version": "0.1.0", "rows": 3, "sandboxes": ["none"], "flagged": []}
    bad = {
        "not base64": "%%%",
        "not json": base64.urlsafe_b64encode(b"{nope").decode(),
        "unknown field": _header({**good, "script": "<b>"}),
        "passed without a digest": _header({**good, "digest": None}),
        "flagged without cheats": _header({**good, "status": "flagged"}),
        "unknown status": _header({**good, "status": "trust me"}),
        "too many flagged": _header({**good, "status": "flagged", "flagged": ["x"] * 65}),
        "huge entry": _header({**good, "sandboxes": ["x" * 300]}),
        "other digest": _header({**good, "digest": "sha256:" + "0" * 64}),
        "oversized": "A" * 9000,
    }
    path = "/packages/alice/header-env/versions/1.2.0"
    for case, value in bad.items():
        r = put(server, path, packed.path.read_bytes(), server.tokens["alice"],
                {"X-Envhub-Audit": value})
        assert r.status_code == 400, (case, r.status_code, r.text)
        assert "audit" in r.json()["error"]["message"].lower(), case
    assert versions(server, "alice", "header-env") == {}
    r = put(server, path, packed.path.read_bytes(), server.tokens["alice"],
            {"X-Envhub-Audit": _header(good)})
    assert r.status_code == 201, r.text
    assert r.json()["version"]["audit"]["status"] == "passed"


def test_an_index_from_before_audits_shows_not_audited(tmp_path: Path) -> None:
    """No migration: the audits table is added to an existing index, its versions read as
    not audited."""
    import sqlalchemy as sa

    from envhub.registry.catalog import Catalog

    archive = pack(make_env(tmp_path / "env"), tmp_path / "dist").path
    catalog = Catalog(tmp_path / "data")
    catalog.publish_file("alice", archive)
    with catalog.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE audits"))
    catalog.close()
    reopened = Catalog(tmp_path / "data")
    audit = reopened.version("alice", "my-env", "1.2.0").audit
    assert audit.status == "not_audited"
    reopened.close()


def test_envhub_audit_json_of_a_folder_names_the_digest_publish_packs(tmp_path: Path) -> None:
    from envhub.envs.loader import load_env
    from envhub.orchestrator.audit.audit import package_digest

    folder = shutil.copytree(Path(arith.__file__).parent, tmp_path / "arith",
                             ignore=shutil.ignore_patterns("__pycache__"))
    assert package_digest(load_env(str(folder))) == pack(folder, tmp_path / "dist").digest


@pytest.mark.slow
def test_publish_runs_the_real_audit_when_given_none(server: Server, tmp_path: Path) -> None:
    folder = shutil.copytree(Path(arith.__file__).parent, tmp_path / "arith",
                             ignore=shutil.ignore_patterns("__pycache__"))
    out = publish(server, folder, "--audit-tasks", "1", "--audit-out", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stderr[-3000:]
    digest = pack(folder, tmp_path / "dist").digest
    audit = versions(server, "alice", "arith")["0.3.0"]["audit"]
    assert audit["status"] == "passed" and audit["digest"] == digest
    assert audit["rows"] >= 3 and audit["sandboxes"] == ["none"]
    report = json.loads((tmp_path / "runs" / "audit.json").read_text())
    assert report["digest"] == digest and not report["flagged"]
    assert "audited " in httpx.get(f"{server.url}/", params={"q": "arith"}).text


@pytest.mark.slow
@pytest.mark.bwrap
def test_a_fresh_init_publishes_through_its_own_audit_in_local_sandboxes(
        server: Server, tmp_path: Path) -> None:
    """The template grades in a fresh sandbox with only its declared outputs copied in, so the
    audit publish runs passes out of the box (its former verify ran the check in the agent's
    own sandbox: toolchain-trojan's `sh` shim scored 1 in docker). The README's quickstart
    test publishes the same template in the default (docker) sandbox."""
    require_tool("bwrap")
    assert run_cli("init", str(tmp_path / "fresh")).returncode == 0
    manifest = tmp_path / "fresh" / "envhub.toml"
    manifest.write_text(manifest.read_text().replace('kind = "auto"', 'kind = "local"', 1))
    out = publish(server, tmp_path / "fresh", "--audit-out", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stderr[-3000:]
    audit = versions(server, "alice", "fresh")["0.1.0"]["audit"]
    assert audit["status"] == "passed" and audit["sandboxes"] == ["local"], audit
    report = json.loads((tmp_path / "runs" / "audit.json").read_text())
    assert not report["flagged"] and {r["cheat"] for r in report["rows"]} >= {
        "toolchain-trojan", "write-artifacts", "fill-disk"}
