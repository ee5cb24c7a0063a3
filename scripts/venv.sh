#!/usr/bin/env bash
# Create or update the project's virtualenv (.venv) with the given extras; idempotent and fast
# when nothing changed (pip only installs what is missing). Python 3.11+ is the one requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-engine}"
py="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"$py" -c 'import sys; assert sys.version_info >= (3, 11), "envhub needs Python 3.11+"'
[ -x .venv/bin/python ] || "$py" -m venv .venv
stamp=".venv/.envhub-installed-$extras-$(sha256sum pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch is pinned in pyproject (==2.13.0); pip prefers a local CPU wheel when one is offered
  # through --find-links (this machine's pip config), else it resolves from PyPI.
  .venv/bin/python -m pip install -q -e ".[$extras]"
  touch "$stamp"
fi
