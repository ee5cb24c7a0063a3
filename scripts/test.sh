#!/usr/bin/env bash
# The whole test suite. Creates/updates .venv with every extra; in CI (CI=true) a test whose
# service or tool is missing fails instead of skipping (.ci/run provisions them first).
# Before pytest: ruff, mypy (sdk, gateway, trainer, viewer) and the import contracts of DESIGN.md's
# layout table (lint-imports, [tool.importlinter] in pyproject.toml). Every check runs and shows
# its output; any failure fails the script before the tests start. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh all,dev
bin=.venv/bin
failed=()
check() {
  local name=$1
  shift
  echo "== $name: $*"
  "$@" || failed+=("$name")
}
check ruff "$bin/ruff" check .
check mypy "$bin/mypy" -p envhub.sdk -p envhub.gateway -p envhub.trainer -p envhub.viewer
check import-contracts "$bin/lint-imports"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED before the tests: ${failed[*]} (output above)" >&2
  exit 1
fi
exec "$bin/python" -m pytest -n "${ENVHUB_TEST_WORKERS:-2}" --dist loadfile "$@"
