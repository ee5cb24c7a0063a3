"""The in-sandbox wrapper every exec runs under (docker and e2b): POSIX sh + coreutils.

Why a wrapper: output goes to files inside the sandbox, not to the exec's pipe, so a
background child that keeps running cannot hold the call open; `timeout` runs the command
in its own process group and signals the whole group; every process started by the call
inherits ENVHUB_EXEC_ID, which `SWEEP` uses to kill escapees (setsid, double fork) after a
timeout.

Arguments: $1 = cwd, $2 = timeout seconds, $3 = command, $4 = max bytes kept per stream.
"""

from __future__ import annotations

import shlex

EXEC_ID_VAR = "ENVHUB_EXEC_ID"
MAX_STREAM_BYTES = 8 << 20  # a command printing gigabytes must not exhaust host memory
KILL_GRACE_S = 2  # SIGTERM first, SIGKILL this long after

# Where the wrapper keeps a call's output: a tmpfs of its own where the sandbox mounts one
# (docker: EXEC_DIR), so an agent that filled its disk still gets its commands' output and the
# grader's calls still run; else /tmp (e2b).
EXEC_DIR = "/run/envhub-exec"
EXEC_DIR_MB = 64  # a call's two streams, the kept part (MAX_STREAM_BYTES each) and more

WRAPPER = r"""
b={exec_dir}; [ -d "$b" ] || b=/tmp
d=$(mktemp -d "$b/.envhub-exec.XXXXXX") || exit 125
cd "$1" || { rm -rf "$d"; exit 2; }
if command -v bash >/dev/null 2>&1; then sh=bash; else sh=sh; fi
timeout -k {grace} "$2" "$sh" -c "$3" </dev/null >"$d/out" 2>"$d/err"
rc=$?
head -c "$4" "$d/out"; head -c "$4" "$d/err" >&2
rm -rf "$d"
exit $rc
""".replace("{grace}", str(KILL_GRACE_S)).replace("{exec_dir}", EXEC_DIR)

SWEEP = r"""
for p in /proc/[0-9]*; do
  if grep -qxz "{var}=$1" "$p/environ" 2>/dev/null; then kill -9 "${p#/proc/}" 2>/dev/null; fi
done
exit 0
""".replace("{var}", EXEC_ID_VAR)


# Kills every process of the container except PID 1 (the init), the pids given as arguments
# (the container's main process) and itself, in rounds until a round finds nothing; prints
# CLEAN then. Shell builtins only (no fork): it must work when a fork bomb filled the pids limit
# and must not be outrun by one.
SWEEP_ALL = r"""
keep=" 1 $$ $* "
n=0
while [ $n -lt 50 ]; do
  n=$((n+1)); found=
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    case "$keep" in *" $pid "*) continue;; esac
    kill -9 "$pid" 2>/dev/null && found=1
  done
  if [ -z "$found" ]; then echo CLEAN; exit 0; fi
done
exit 1
"""
SWEEP_CLEAN = "CLEAN"

# Kills every process that any wrapped exec started (they all carry EXEC_ID_VAR), for backends
# whose own agent processes share the sandbox (e2b's envd): cannot see processes that cleared
# their environment.
SWEEP_TAGGED = r"""
for p in /proc/[0-9]*; do
  [ "${p#/proc/}" = "$$" ] && continue
  if grep -qz "^{var}=" "$p/environ" 2>/dev/null; then kill -9 "${p#/proc/}" 2>/dev/null; fi
done
exit 0
""".replace("{var}", EXEC_ID_VAR)


def wrapper_argv(cmd: str, cwd: str, timeout: float) -> list[str]:
    """argv running `cmd` under the wrapper (`sh -c WRAPPER envhub-exec cwd timeout cmd max`)."""
    return ["sh", "-c", WRAPPER, "envhub-exec", cwd, f"{timeout:g}", cmd, str(MAX_STREAM_BYTES)]


def wrapper_line(cmd: str, cwd: str, timeout: float) -> str:
    """The same as one shell line, for APIs that take a command string (e2b)."""
    return shlex.join(wrapper_argv(cmd, cwd, timeout))


def sweep_argv(exec_id: str) -> list[str]:
    """argv killing every process that carries `ENVHUB_EXEC_ID=exec_id` in its environment."""
    return ["sh", "-c", SWEEP, "envhub-sweep", exec_id]


def timed_out(exit_code: int, elapsed: float, timeout: float) -> bool:
    """`timeout` exits 124 (TERM worked) or 137 (needed KILL); a command exiting 124 by itself
    before its deadline is not a timeout."""
    return exit_code in (124, 137) and elapsed >= timeout * 0.98
