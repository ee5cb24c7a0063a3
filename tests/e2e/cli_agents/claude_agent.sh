#!/bin/sh
# Claude Code (npm @anthropic-ai/claude-code), unchanged, as an envhub command agent inside the
# sandbox: ANTHROPIC_BASE_URL is the session's forwarder; no auto-update, telemetry, error
# reports or other non-essential traffic; its permission prompts are off (IS_SANDBOX=1 lets it
# run so as root: the rollout's sandbox is the containment). Four user turns in one
# conversation (`--continue`), the third a manual `/compact`.
# --model: a claude-4.5 name, for which Claude Code sends the system prompt only in `system`
# (for its newer default model it also puts a role "system" message inside `messages`).
export HOME=/tmp/agent-home CLAUDE_CONFIG_DIR=/tmp/agent-home/.claude
mkdir -p "$CLAUDE_CONFIG_DIR"
export IS_SANDBOX=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_BUG_COMMAND=1 DISABLE_COST_WARNINGS=1 \
  CLAUDE_CODE_MAX_OUTPUT_TOKENS=512 MAX_THINKING_TOKENS=0
flags="--dangerously-skip-permissions --output-format json --max-turns 4 --model claude-sonnet-4-5"
claude -p "$(cat "$ENVHUB_TASK_FILE")" $flags </dev/null
echo "CLI_EXIT $?"
for prompt in "Continue." "/compact" "Continue."; do
  claude --continue -p "$prompt" $flags </dev/null
  echo "CLI_EXIT $?"
done
