#!/usr/bin/env bash
# The bench-only tools' own virtualenv (.venv-bench, git-ignored; BENCH_VENV=DIR elsewhere):
# LiteLLM's proxy, the peer bench/bench_gateway_overhead.py measures the gateway against. Its
# own venv because litellm[proxy] pins older rich, websockets and litellm than envhub runs on.
# Every version from the lock locks/bench.txt (scripts/pip_locked.sh); idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${BENCH_VENV:-.venv-bench}"
BENCH_SPEC="litellm[proxy]>=1.40,<2"
py="${PYTHON:-$(command -v python3.11 || command -v python3)}"
key=$(cat scripts/bench_venv.sh scripts/pip_locked.sh locks/bench.txt | sha256sum)
stamp="$venv/.envhub-bench-${key:0:16}"
[ -f "$stamp" ] && [ "${ENVHUB_LOCK_REFRESH:-}" != 1 ] && exit 0
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
bash scripts/pip_locked.sh bench "$venv" --upgrade pip
bash scripts/pip_locked.sh bench "$venv" "$BENCH_SPEC"
rm -f "$venv"/.envhub-bench-*
touch "$stamp"
