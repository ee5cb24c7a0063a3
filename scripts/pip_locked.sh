#!/usr/bin/env bash
# Every pip install of the project's scripts and CI goes through here: `pip install` into VENV,
# constrained by the committed lock locks/NAME.txt, so what a fresh machine installs is what the
# last green run installed, whatever PyPI released since. Quiet: pip's output (and its build
# backend's warnings) goes to VENV/.envhub-pip.log and is shown only when pip fails.
#
#   bash scripts/pip_locked.sh NAME VENV [pip install arguments...]
#
# ENVHUB_LOCK_REFRESH=1 leaves the lock out and writes what VENV then holds to
# VENV/.envhub-resolved.txt: scripts/lock.sh resolves afresh that way and commits that as the lock.
# With ENVHUB_LOCK_KEEP=1 too, the lock stays in as constraints: only what it does not pin yet
# (a new dependency) is resolved, every other version kept.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bash scripts/pip_locked.sh NAME VENV [pip install args...]" >&2; exit 2; }
name=$1 venv=$2
shift 2
lock="locks/$name.txt"
args=(--disable-pip-version-check)
if [ "${ENVHUB_LOCK_REFRESH:-}" != 1 ] || [ "${ENVHUB_LOCK_KEEP:-}" = 1 ]; then
  [ -f "$lock" ] || { echo "no lock $lock: bash scripts/lock.sh $name writes it" >&2; exit 2; }
  args+=(--constraint "$lock")
fi
log="$venv/.envhub-pip.log"
if ! "$venv/bin/python" -m pip install "${args[@]}" "$@" >"$log" 2>&1; then
  tail -n 60 "$log" >&2
  echo "pip install ${*} failed with $lock (whole log: $log)" >&2
  exit 1
fi
if [ "${ENVHUB_LOCK_REFRESH:-}" = 1 ]; then
  # Local version labels dropped (torch 2.13.0+cpu -> 2.13.0): `==2.13.0` still admits the local
  # CPU wheel (pip prefers it), and a machine without it takes PyPI's build of the same release.
  "$venv/bin/python" -m pip freeze --all --exclude-editable --disable-pip-version-check 2>/dev/null |
    sed -E 's/^([^=]+==[^+ ]+)\+[^ ]*$/\1/' | LC_ALL=C sort -f >"$venv/.envhub-resolved.txt"
fi
