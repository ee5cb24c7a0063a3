#!/bin/sh
# Claude Code (npm @anthropic-ai/claude-code), unchanged, as a command agent: one `claude -p`
# of the task against this rollout's session, with the environment's tools over MCP when it
# has any (the config envhub writes at $ENVHUB_MCP_CONFIG: server `envhub`, so the model sees
# the tools as mcp__envhub__<tool>; only that server, --strict-mcp-config).
#   envhub run ENV --agent claude-code.sh --agent-install recipe:claude-code
# Offline: no auto-update, telemetry, error reports or other non-essential traffic; permission
# prompts off (the sandbox is the boundary); MCP tools offered as they are, not deferred behind
# its ToolSearch tool. CLAUDE_MAX_TURNS (default 20) bounds its turns.
#@install npm:@anthropic-ai/claude-code@2.1.330
export HOME=/tmp/agent-home CLAUDE_CONFIG_DIR=/tmp/agent-home/.claude
mkdir -p "$CLAUDE_CONFIG_DIR"
export IS_SANDBOX=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_BUG_COMMAND=1 DISABLE_COST_WARNINGS=1 \
  CLAUDE_CODE_MAX_OUTPUT_TOKENS=${CLAUDE_CODE_MAX_OUTPUT_TOKENS:-512} ENABLE_TOOL_SEARCH=false
if [ -n "$ENVHUB_MCP_CONFIG" ]; then
  set -- --mcp-config "$ENVHUB_MCP_CONFIG" --strict-mcp-config
fi
claude -p "$(cat "$ENVHUB_TASK_FILE")" "$@" --dangerously-skip-permissions \
  --output-format json --max-turns "${CLAUDE_MAX_TURNS:-20}" </dev/null
echo "CLI_EXIT $?"
