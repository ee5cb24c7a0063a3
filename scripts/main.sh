#!/usr/bin/env bash
# The main job on embedded defaults: no API key, no network. Runs the headline environment with
# the bundled tiny model behind an in-process gateway; results are kept in runs/<run_id>/.
#
# Provisioning, like .ci/run but only what this job needs: swe-task runs in a docker sandbox
# when dockerd answers and debootstrap can build the base image (root), else in a local
# bubblewrap sandbox, which needs `bwrap` and `git` on this machine. Missing packages are
# installed with apt-get when running as root (and said so); otherwise the script stops before
# the run with the command that fixes it.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "main.sh: $*"; }
stop() { echo "main.sh: $*" >&2; exit 2; }

py="${PYTHON:-$(command -v python3.11 || command -v python3 || true)}"
[ -n "$py" ] || stop "no python3 found; install Python 3.11+ (apt-get install python3 python3-venv)"
root=false; [ "$(id -u)" = 0 ] && root=true

need=()
if $root && command -v debootstrap >/dev/null && docker info >/dev/null 2>&1; then
  sandbox=docker
else
  sandbox=local
  command -v bwrap >/dev/null || need+=(bubblewrap)
  command -v git >/dev/null || need+=(git)  # swe-task builds each task's repository with git
fi
# Debian's python3 ships venv's pip bootstrap separately
if [ ! -x .venv/bin/python ] && ! "$py" -c 'import ensurepip' 2>/dev/null; then
  need+=(python3-venv)
fi

if [ ${#need[@]} -gt 0 ]; then
  if $root && command -v apt-get >/dev/null; then
    say "installing ${need[*]} with apt-get (the $sandbox sandbox needs them)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    stop "the $sandbox sandbox needs ${need[*]}, missing here. Install, then run this again:
  sudo apt-get install -y ${need[*]}
(or, as root with dockerd running and debootstrap installed, it uses docker sandboxes)"
  fi
fi
if [ "$sandbox" = local ] && ! bwrap --ro-bind / / --unshare-pid --unshare-net true 2>/dev/null; then
  stop "bubblewrap is installed but cannot create namespaces here ($(bwrap --ro-bind / / true 2>&1 |
  head -1)). In a container, start it with --privileged; elsewhere enable unprivileged user
  namespaces (sysctl kernel.unprivileged_userns_clone=1), or run as root with dockerd"
fi
say "sandbox: $sandbox"

bash scripts/venv.sh engine,docker,mcp  # mcp: command agents using the environment's tools (docs/tutorials/cli-agents.md)
# four tasks by default (a full pass over all 30 with the tiny CPU model takes ~40 min);
# flags given here override these, e.g. `bash scripts/main.sh -n 30 --sandbox docker`
exec .venv/bin/envhub run swe-task --sandbox "$sandbox" -n 4 "$@"
