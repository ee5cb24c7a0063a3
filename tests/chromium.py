"""A real Chromium driven by Playwright, for tests of the web pages (`envhub view`, the
registry's HTML index). Chromium is Debian's package, launched by path (no browser download);
.ci/run installs it and the `browser` extra installs playwright.

Screenshots go to the test's tmp folder and to ENVHUB_TEST_ARTIFACTS (default: .test-artifacts/
in the checkout, git-ignored), where they outlive pytest's rotation of its tmp folders, so a
run can be looked at afterwards.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support import require

CHROMIUM = os.environ.get("ENVHUB_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("ENVHUB_TEST_ARTIFACTS")
                 or Path(__file__).resolve().parents[1] / ".test-artifacts") / "screenshots"


@contextmanager
def chromium_page(width: int = 1300, height: int = 900) -> Iterator[Any]:
    """A fresh page in a headless Chromium that may reach loopback only."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "playwright (pip install 'envhub[browser]')")
    require(Path(CHROMIUM).is_file() or shutil.which(CHROMIUM) is not None,
            f"Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            # Pages must not load anything from the network (no CDN): fail the request, and
            # the test, if one tries.
            outside: list[str] = []

            def only_loopback(route: Any) -> None:
                url = route.request.url
                if url.startswith(("http://127.0.0.1", "about:", "data:")):
                    route.continue_()
                else:
                    outside.append(url)
                    route.abort()

            page.route("**/*", only_loopback)
            yield page
            assert not outside, f"the page fetched from outside loopback: {outside}"
        finally:
            browser.close()


def screenshot(page: Any, tmp_path: Path, name: str, full_page: bool = True) -> Path:
    """Save a PNG of the page as a test artifact; returns its path in tmp_path."""
    path = tmp_path / "screenshots" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=full_page)
    assert path.stat().st_size > 1000, path  # a real render, not an empty file
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / f"{tmp_path.name}-{name}.png")
    return path
