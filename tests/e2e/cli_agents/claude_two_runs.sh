#!/bin/sh
# Claude Code (npm @anthropic-ai/claude-code), unchanged, run twice on one session key: the
# task, then a second, fresh run (no `--continue`) on another task, as a harness running one
# CLI several times would. Same settings as claude_agent.sh.
export HOME=/tmp/agent-home CLAUDE_CONFIG_DIR=/tmp/agent-home/.claude
mkdir -p "$CLAUDE_CONFIG_DIR"
export IS_SANDBOX=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_BUG_COMMAND=1 DISABLE_COST_WARNINGS=1 \
  CLAUDE_CODE_MAX_OUTPUT_TOKENS=512
flags="--dangerously-skip-permissions --output-format json --max-turns 3"
claude -p "$(cat "$ENVHUB_TASK_FILE")" $flags </dev/null
echo "CLI_EXIT $?"
claude -p "A different task: list the files of the repository." $flags </dev/null
echo "CLI_EXIT $?"
