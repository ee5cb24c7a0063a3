#!/usr/bin/env bash
# Create or update the project's virtualenv (.venv) with the given extras; idempotent and fast
# when nothing changed (pip only installs what is missing). Python 3.11+ is the one requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-engine}"
py="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"$py" -c 'import sys; assert sys.version_info >= (3, 11), "envhub needs Python 3.11+"'
[ -x .venv/bin/python ] || "$py" -m venv .venv
RECIPES_NO_DEPS="verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0"
stamp=".venv/.envhub-installed-$extras-$(cat pyproject.toml scripts/venv.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # torch is pinned in pyproject (==2.13.0); pip prefers a local CPU wheel when one is offered
  # through --find-links (this machine's pip config), else it resolves from PyPI.
  .venv/bin/python -m pip install -q -e ".[$extras]"
  # The recipes extra (pulled in by dev): verl 0.9 and tensordict's pyvers pin transformers<5.11
  # and packaging<26, which would downgrade what envhub runs on; installed without their
  # dependencies, whose run-time imports the extra declares (pyproject.toml, recipes).
  if [[ ",$extras," == *",recipes,"* || ",$extras," == *",dev,"* ]]; then
    .venv/bin/python -m pip install -q --no-deps $RECIPES_NO_DEPS
  fi
  touch "$stamp"
fi
