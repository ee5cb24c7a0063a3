#!/bin/sh
# Claude Code (npm @anthropic-ai/claude-code), unchanged, as an envhub command agent inside the
# sandbox: ANTHROPIC_BASE_URL is the session's forwarder; no auto-update, telemetry, error
# reports or other non-essential traffic; its permission prompts are off (IS_SANDBOX=1 lets it
# run so as root: the rollout's sandbox is the containment). Four user turns in one
# conversation (`--continue`), the third a manual `/compact`. Its default model name (any name
# maps to the served model); with it, Claude Code also sends role "system" messages inside
# `messages`, which the gateway renders in place.
export HOME=/tmp/agent-home CLAUDE_CONFIG_DIR=/tmp/agent-home/.claude
mkdir -p "$CLAUDE_CONFIG_DIR"
export IS_SANDBOX=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_BUG_COMMAND=1 DISABLE_COST_WARNINGS=1 \
  CLAUDE_CODE_MAX_OUTPUT_TOKENS=512
flags="--dangerously-skip-permissions --output-format json --max-turns 4"
claude -p "$(cat "$ENVHUB_TASK_FILE")" $flags </dev/null
echo "CLI_EXIT $?"
for prompt in "Continue." "/compact" "Continue."; do
  claude --continue -p "$prompt" $flags </dev/null
  echo "CLI_EXIT $?"
done
