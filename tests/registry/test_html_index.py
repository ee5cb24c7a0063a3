"""The registry's browsable HTML index, in a real Chromium against a real `envhub registry
serve`: packages with versions and descriptions, a package page with its versions and
manifest, and publisher-controlled text shown as text (never run as markup)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from envhub.registry.archive import pack
from tests.chromium import chromium_page, screenshot
from tests.registry.conftest import Server, make_env, put

# Attacker-controlled description: a script, an event handler, and markup that would close
# the table cell it is shown in.
XSS = ("pwn <script>document.title='pwned'</script> <img src=x onerror=document.title='img'>"
       " </td></tr></table><b>bold</b>")


def publish(server: Server, tmp_path: Path, owner: str, name: str, version: str,
            description: str) -> None:
    folder = make_env(tmp_path / f"{name}-{version}", name=name, version=version,
                      description=description)
    data = pack(folder, tmp_path / "dist" / f"{name}-{version}").path.read_bytes()
    r = put(server, f"/packages/{owner}/{name}/versions/{version}", data, server.tokens[owner])
    assert r.status_code in (200, 201), r.text


@pytest.fixture(scope="module")
def published(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Server:
    tmp = tmp_path_factory.mktemp("html-index")
    publish(server, tmp, "alice", "web-env", "1.0.0", "grid world, first cut")
    publish(server, tmp, "alice", "web-env", "1.2.0", "grid world with walls & keys")
    publish(server, tmp, "bob", "evil-env", "0.1.0", XSS)
    return server


def test_the_index_is_escaped_html_with_a_script_free_policy(published: Server) -> None:
    r = httpx.get(f"{published.url}/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert "<script>" not in r.text and "&lt;script&gt;document.title=" in r.text
    assert "walls &amp; keys" in r.text
    assert httpx.get(f"{published.url}/ui").text == r.text
    missing = httpx.get(f"{published.url}/ui/alice/nope")
    assert missing.status_code == 404 and "does not exist" in missing.text
    assert httpx.get(f"{published.url}/ui/alice/web-env?version=9.9.9").status_code == 404
    assert httpx.get(f"{published.url}/ui/Bad%20Owner/x").status_code == 400
    assert httpx.get(f"{published.url}/", params={"q": "x" * 500}).status_code == 400
    # the JSON API is unchanged beside it
    assert httpx.get(f"{published.url}/api/v1/search").json()["hits"]


@pytest.mark.browser
def test_browse_packages_versions_and_a_manifest(published: Server, tmp_path: Path) -> None:
    with chromium_page() as page:
        page.goto(f"{published.url}/")
        rows = page.locator("#packages tbody tr")
        assert rows.count() == 2
        web = rows.filter(has_text="alice/web-env")
        assert web.locator(".versions a").all_inner_texts() == ["1.0.0", "1.2.0"]
        assert web.locator(".description").inner_text() == "grid world with walls & keys"
        screenshot(page, tmp_path, "registry-index")

        page.fill("input[name=q]", "walls")
        page.click("button[type=submit]")
        assert page.locator("#packages tbody tr").count() == 1

        page.click("a.package:has-text('alice/web-env')")
        assert page.locator("h1").inner_text() == "alice/web-env"
        assert page.locator("#versions tbody tr").count() == 2
        assert 'version = "1.2.0"' in page.locator("#manifest").inner_text()
        page.click("#versions a:has-text('1.0.0')")
        assert 'version = "1.0.0"' in page.locator("#manifest").inner_text()
        screenshot(page, tmp_path, "registry-package")


@pytest.mark.browser
def test_a_description_with_markup_is_shown_as_text(published: Server, tmp_path: Path) -> None:
    with chromium_page() as page:
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        for name, path, where in (
                ("index", "/", "#packages tr:has-text('bob/evil-env') .description"),
                ("package", "/ui/bob/evil-env", "#description")):
            page.goto(f"{published.url}{path}")
            assert page.title() not in ("pwned", "img")
            assert page.locator("script, img, b").count() == 0  # no element came from the text
            shown = page.locator(where).inner_text()
            assert "<script>document.title='pwned'</script>" in shown
            assert "</td></tr></table><b>bold</b>" in shown
            screenshot(page, tmp_path, f"registry-xss-{name}")
        # the index table still has its two rows: the description did not close it
        page.goto(f"{published.url}/")
        assert page.locator("#packages tbody tr").count() == 2
        assert not errors
