#!/usr/bin/env bash
# Create or update Prime Intellect's verifiers in its own virtualenv (.venv-verifiers, git-ignored).
# envhub loads verifiers environments (`envhub run vf:MODULE`) by running a small worker with this
# interpreter (envs/verifiers/worker.py: stdlib + verifiers, no envhub), one process per call.
# It is not an extra of envhub's: verifiers 0.4 pins mcp==2.0.0 and needs anthropic>=1, which
# envhub's lock does not admit. Every version comes from the lock locks/verifiers.txt
# (scripts/pip_locked.sh). Idempotent and fast when nothing changed (a stamp keyed by this script
# and the lock).
#
#   bash scripts/verifiers_venv.sh        # -> .venv-verifiers (ENVHUB_VERIFIERS_VENV=DIR elsewhere)
#   VF_PACKAGES="my-vf-env==1.0" bash scripts/verifiers_venv.sh   # plus environments from PyPI
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${ENVHUB_VERIFIERS_VENV:-.venv-verifiers}"
VERIFIERS_SPEC="verifiers==0.4.0"
py="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"$py" -c 'import sys; assert sys.version_info >= (3, 11), "verifiers needs Python 3.11+"'
key=$({ cat scripts/verifiers_venv.sh scripts/pip_locked.sh; cat locks/verifiers.txt 2>/dev/null || true; } | sha256sum)
stamp="$venv/.envhub-verifiers-${key:0:16}"
extra=(${VF_PACKAGES:-})
[ -f "$stamp" ] && [ ${#extra[@]} -eq 0 ] && [ "${ENVHUB_LOCK_REFRESH:-}" != 1 ] && exit 0
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
bash scripts/pip_locked.sh verifiers "$venv" --upgrade pip
bash scripts/pip_locked.sh verifiers "$venv" "$VERIFIERS_SPEC" "${extra[@]}"
"$venv/bin/python" - <<'PY'
import verifiers, verifiers.v1 as vf
assert verifiers.__version__ == "0.4.0", f"verifiers' venv has verifiers {verifiers.__version__}"
print(f"verifiers {verifiers.__version__}: {vf.SingleAgentEnv.__name__}, {vf.Taskset.__name__}")
PY
rm -f "$venv"/.envhub-verifiers-*
touch "$stamp"
