#!/usr/bin/env bash
# Refresh the locks (locks/*.txt) that every install of the scripts and CI resolves from: each
# venv script runs in a throwaway virtualenv with the lock left out (ENVHUB_LOCK_REFRESH=1,
# scripts/pip_locked.sh), and what pip resolved there becomes the lock. Commit the locks with the
# dependency change that needed them, after the test command passed on them.
#
#   bash scripts/lock.sh           # all: envhub (.venv), vllm (.venv-vllm), bench (.venv-bench),
#                                  # floors (.venv-floors: pyproject's floors, scripts/floors.sh),
#                                  # verifiers (.venv-verifiers: scripts/verifiers_venv.sh)
#   bash scripts/lock.sh envhub    # one of them
#   ENVHUB_LOCK_KEEP=1 bash scripts/lock.sh envhub   # add what a new dependency needs, keeping
#                                  # every version the lock pins (scripts/pip_locked.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(envhub vllm bench floors verifiers)
work=$(mktemp -d /tmp/envhub-lock-XXXXXX)
trap 'rm -rf "$work"' EXIT
for name in "${names[@]}"; do
  venv="$work/$name"
  case "$name" in
    envhub) ENVHUB_VENV="$venv" ENVHUB_LOCK_REFRESH=1 bash scripts/venv.sh all,dev ;;
    vllm) VLLM_VENV="$venv" ENVHUB_LOCK_REFRESH=1 bash scripts/vllm_venv.sh ;;
    bench) BENCH_VENV="$venv" ENVHUB_LOCK_REFRESH=1 bash scripts/bench_venv.sh ;;
    floors) FLOORS_VENV="$venv" ENVHUB_LOCK_REFRESH=1 bash scripts/floors.sh ;;
    verifiers) ENVHUB_VERIFIERS_VENV="$venv" ENVHUB_LOCK_REFRESH=1 bash scripts/verifiers_venv.sh ;;
    *) echo "unknown lock $name (envhub, vllm, bench, floors or verifiers)" >&2; exit 2 ;;
  esac
  {
    echo "# The $name lock: every version scripts/pip_locked.sh installs for it (a pip constraints"
    echo "# file). Written by \`bash scripts/lock.sh $name\` on $(date -u +%Y-%m-%d), Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'); do not edit by hand."
    cat "$venv/.envhub-resolved.txt"
  } >"locks/$name.txt"
  echo "locks/$name.txt: $(grep -vc '^#' "locks/$name.txt") packages"
done
