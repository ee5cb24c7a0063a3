"""The documentation site (mkdocs.yml, docs/): `mkdocs build --strict` passes, a broken link
fails it, and the generated reference follows the code: every flag of `envhub run`, `envhub
train` and `envhub gateway`, every manifest field and the metrics a real run writes are on
their pages, and a config field or a metrics column added in a scratch copy of the checkout
appears in that copy's build."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import copy_checkout

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = [sys.executable, "-m", "mkdocs"]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*MKDOCS, "build", "--strict", "-d", str(site)], cwd=root, env=ENV,
                          capture_output=True, text=True, timeout=300, check=False)


def page_text(site: Path, page: str) -> str:
    raw = (site / page / "index.html").read_text()
    return html.unescape(re.sub(r"<[^>]+>", " ", raw))


def command_section(site: Path, command: str) -> str:
    """The text of `envhub COMMAND`'s section of the commands page (its h3 to the next)."""
    raw = (site / "reference" / "cli" / "index.html").read_text()
    start = raw.index(f'<h3 id="envhub-{command.replace(" ", "-")}"')
    end = raw.find("<h3 ", start + 1)
    return html.unescape(re.sub(r"<[^>]+>", " ", raw[start:end if end > 0 else None]))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = build(ROOT, out)
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def test_the_site_builds_strict_with_every_flag_and_field(site: Path):
    import typer.main

    from envhub.cli import app
    from envhub.envs.manifest import Manifest

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in ("run", "train", "gateway"):
        section = command_section(site, name)
        flags = [o for p in commands[name].params if p.param_type_name == "option"
                 and not p.hidden for o in p.opts]
        assert len(flags) > 10, (name, flags)
        missing = [f for f in flags if not re.search(rf"{re.escape(f)}\b", section)]
        assert missing == [], (name, missing)
    manifest = page_text(site, "reference/manifest")
    assert all(f in manifest for f in Manifest.model_fields), manifest[:2000]
    http = page_text(site, "reference/http")
    assert "/v1/chat/completions" in http and "/api/v1/packages/{owner}/{name}" in http
    trajectory = page_text(site, "concepts/trajectory")
    assert "CM action summarize" in trajectory and "chain 2" in trajectory
    # every column of a real run's rows (its train row's optimizer columns included), and
    # what only options produce, found in the code
    metrics = page_text(site, "reference/metrics")
    for column in ("reward_mean", "trainer/is/masked_fraction", "trainer/grad/norm",
                   "filter/stale", "staleness/max", "mix/arith/trained_share",
                   "eval/resolved_rate", "dynamic/extra_groups"):
        assert column in metrics, column
    # the quickstart is the README's own, included
    quickstart = " ".join(page_text(site, "quickstart").split())
    assert "envhub registry token create --owner alice" in quickstart, quickstart[:3000]


def test_a_broken_link_fails_the_strict_build(tmp_path: Path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")  # the quickstart's snippet
    concepts = tmp_path / "docs" / "concepts" / "loop.md"
    concepts.write_text(concepts.read_text() + "\nSee [the old page](no-such-page.md).\n")
    built = build(tmp_path, tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stderr, built.stderr[-2000:]


def build_edited_copy(tmp_path: Path, file: str, anchor: str, before: str = "",
                      after: str = "") -> Path:
    """The site of a scratch copy of the checkout where `file` has `before` and `after` around
    its first `anchor` (asserted built)."""
    copy = tmp_path / "checkout"
    copy_checkout(copy)
    text = (copy / file).read_text()
    assert anchor in text
    (copy / file).write_text(text.replace(anchor, before + anchor + after, 1))
    built = build(copy, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-4000:]
    return tmp_path / "site"


def test_the_reference_follows_a_config_field_added_in_a_copy(tmp_path: Path):
    build_edited_copy(tmp_path, "orchestrator/groups/config.py", "    k: int = Field(1, ge=1",
                      before='    docs_probe: int = Field(7, description="a field the docs '
                      'test added")\n')
    run = command_section(tmp_path / "site", "run")
    assert "--docs-probe" in run and "a field the docs test added" in run
    assert "--docs-probe" not in command_section(tmp_path / "site", "train")


def test_the_metrics_reference_follows_a_column_added_in_a_copy(tmp_path: Path):
    """A column the loop writes into every train row, added in a scratch copy, is on that
    copy's metrics page: the page comes from the rows a real run of the copy wrote."""
    site = build_edited_copy(tmp_path, "orchestrator/training/metrics.py",
                             "    row.update(trainer)\n",
                             after='    row["docs_probe/rows"] = 7\n')
    page = page_text(site, "reference/metrics")
    assert "docs_probe/rows train 7" in " ".join(page.split()), page[:3000]
