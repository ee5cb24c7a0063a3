#!/usr/bin/env bash
# Create or update the project's virtualenv (.venv; ENVHUB_VENV=DIR elsewhere) with the given
# extras, every version from the lock locks/envhub.txt (scripts/pip_locked.sh); idempotent and
# fast when nothing changed (a stamp keyed by the lock, pyproject.toml and this script).
# Python 3.11+ is the one requirement.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-engine}"
venv="${ENVHUB_VENV:-.venv}"
py="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"$py" -c 'import sys; assert sys.version_info >= (3, 11), "envhub needs Python 3.11+"'
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
# The recipes extra (pulled in by dev): verl 0.9 and tensordict's pyvers pin transformers<5.11
# and packaging<26, which would downgrade what envhub runs on; installed without their
# dependencies, whose run-time imports the extra declares (pyproject.toml, recipes).
RECIPES_NO_DEPS="verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0"
key=$(cat pyproject.toml scripts/venv.sh scripts/pip_locked.sh locks/envhub.txt | sha256sum)
stamp="$venv/.envhub-installed-$extras-${key:0:16}"
[ -f "$stamp" ] && [ "${ENVHUB_LOCK_REFRESH:-}" != 1 ] && exit 0
install() { bash scripts/pip_locked.sh envhub "$venv" "$@"; }
# pip and the build backend first, from the lock too: the editable install below builds with
# them (no build isolation, which would fetch the newest setuptools).
install --upgrade pip setuptools wheel
# torch comes from the lock (==2.13.0); pip prefers a local CPU wheel when one is offered
# through --find-links (this machine's pip config), else it resolves from PyPI.
install --no-build-isolation -e ".[$extras]"
if [[ ",$extras," == *",recipes,"* || ",$extras," == *",dev,"* ]]; then
  install --no-deps $RECIPES_NO_DEPS
fi
rm -f "$venv"/.envhub-installed-"$extras"-*
touch "$stamp"
