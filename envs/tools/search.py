"""`search`: `grep -rn` over the workdir with bounded output."""

from __future__ import annotations

import shlex

from pydantic import BaseModel, ConfigDict, Field

from envhub.envs.sandbox.base import Sandbox
from envhub.envs.tools.result import ToolResult, ToolState
from envhub.envs.tools.truncation import cut_middle

MAX_MATCHES = 200
MAX_LINE_CHARS = 300
MARK = "__envhub_search="  # then "<match count> <grep exit status>"

SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": (
            "Search file contents (like `grep -rn`): prints `path:line:text` for each match, "
            f"at most {MAX_MATCHES} matches. Binary files and .git are skipped."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "extended regular expression"},
                "path": {"type": "string",
                         "description": "file or directory to search (default: workspace)"},
                "include": {"type": "string",
                            "description": "only files matching this glob, e.g. '*.py'"},
                "fixed_strings": {"type": "boolean",
                                  "description": "treat the pattern as a literal string"},
                "ignore_case": {"type": "boolean"},
            },
            "required": ["pattern"],
        },
    },
}


class SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pattern: str = Field(min_length=1)
    path: str = "."
    include: str | None = None
    fixed_strings: bool = False
    ignore_case: bool = False


async def run_search(args: SearchArgs, sandbox: Sandbox, state: ToolState,
                     timeout: float | None) -> ToolResult:
    flags = ["-rnIH", "--exclude-dir=.git", "-F" if args.fixed_strings else "-E"]
    if args.ignore_case:
        flags.append("-i")
    if args.include:
        flags.append(f"--include={args.include}")
    grep = shlex.join(["grep", *flags, "-e", args.pattern, "--", args.path])
    # Count first, then cut: the model should know how much it is not seeing. grep's own exit
    # status travels on stdout after MARK: the exec's exit code alone cannot tell "no matches"
    # (grep exits 1) from a sandbox that failed before grep ran (bwrap exits 1 too).
    cmd = (f'f=$(mktemp) || exit 3; {grep} >"$f" 2>"$f.err"; rc=$?; n=$(wc -l < "$f"); '
           f'head -n {MAX_MATCHES} "$f" | cut -c1-{MAX_LINE_CHARS}; echo "{MARK}$n $rc"; '
           'cat "$f.err" >&2; rm -f "$f" "$f.err"; exit $rc')
    result = await sandbox.exec(cmd, timeout=timeout)
    if result.timed_out:
        return ToolResult("search timed out; narrow `path` or `include`", is_error=True)
    body, found, tail = result.stdout.rpartition(MARK)
    count, _, grep_rc = tail.strip().partition(" ")
    if not found or grep_rc != str(result.exit_code):
        why = result.stderr.strip() or f"exit code {result.exit_code}, no output"
        return ToolResult(f"search failed: the sandbox did not run grep ({why})",
                          is_error=True, exit_code=result.exit_code)
    if result.exit_code == 1:
        return ToolResult(f"no matches for {args.pattern!r} in {args.path}", exit_code=1)
    if result.exit_code != 0:
        return ToolResult(f"search failed: {result.stderr.strip() or 'grep error'}",
                          is_error=True, exit_code=result.exit_code)
    total = int(count or 0)
    note = (f"\n[{total} matches; showing the first {MAX_MATCHES}. Narrow the search to see "
            "more.]" if total > MAX_MATCHES else "")
    return ToolResult(cut_middle(body.rstrip("\n")) + note, exit_code=0)
