"""Chromium launched by path (Debian's `chromium` package; no browser download) by Playwright's
Node.js driver inside sandboxes (sandbox.py); nothing here starts a browser on the host.

Playwright is the `browser` extra (its bundled Node.js and `playwright-core` are what sandboxes
run); a missing extra or browser is a `BrowserUnavailable` naming the fix.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM_ENV = "ENVHUB_CHROMIUM"  # a Chromium executable other than the one on PATH
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# No first-run UI, no GPU (headless servers), no crash reporter, no background networking:
# nothing the browser does should depend on the machine it runs on. --no-sandbox: Chromium's
# own sandbox needs privileges that the envhub sandbox around it (bubblewrap with every
# capability dropped, or a docker container) does not give; that sandbox is the boundary.
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--disable-background-networking", "--disable-breakpad", "--no-first-run",
               "--disable-extensions", "--mute-audio", "--hide-scrollbars"]
MISSING_EXTRA = "Playwright is missing: pip install 'envhub[browser]'"


class BrowserUnavailable(RuntimeError):
    """No Chromium or no Playwright on this machine; the message says how to install them."""


def chromium_path() -> str:
    """The Chromium executable: $ENVHUB_CHROMIUM, else the first of CANDIDATES on PATH."""
    override = os.environ.get(CHROMIUM_ENV)
    if override:
        if not os.access(override, os.X_OK):
            raise BrowserUnavailable(f"{CHROMIUM_ENV}={override} is not an executable file")
        return override
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise BrowserUnavailable("Chromium is missing: apt-get install chromium (Debian's package; "
                             f"or point {CHROMIUM_ENV} at a Chromium executable)")


def playwright_core() -> Path:
    """The `playwright-core` Node package bundled with Playwright for Python: what a driver
    script inside a sandbox `require`s (same version as the host's Playwright)."""
    try:
        import playwright
    except ImportError:
        raise BrowserUnavailable(MISSING_EXTRA) from None
    package = Path(playwright.__file__).parent / "driver" / "package"
    if not (package / "package.json").is_file():
        raise BrowserUnavailable(f"{package}: Playwright's driver package is missing; "
                                 "reinstall it: pip install --force-reinstall playwright")
    return package
