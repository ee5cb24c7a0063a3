#!/bin/sh
# Claude Code (npm @anthropic-ai/claude-code), unchanged, using the environment's tools over MCP:
# the ready-made config envhub writes into the channel folder ($ENVHUB_MCP_CONFIG: server
# `envhub` at $ENVHUB_MCP_URL, the sandbox's forwarder), so the tools are named
# mcp__envhub__<tool>. Only that server (--strict-mcp-config); otherwise as claude_agent.sh:
# no auto-update, telemetry or other non-essential traffic, permission prompts off; the MCP
# tools offered to the model as they are, not deferred behind its ToolSearch tool.
export HOME=/tmp/agent-home CLAUDE_CONFIG_DIR=/tmp/agent-home/.claude
mkdir -p "$CLAUDE_CONFIG_DIR"
export IS_SANDBOX=1 DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_BUG_COMMAND=1 DISABLE_COST_WARNINGS=1 \
  CLAUDE_CODE_MAX_OUTPUT_TOKENS=512 ENABLE_TOOL_SEARCH=false
claude -p "$(cat "$ENVHUB_TASK_FILE")" --mcp-config "$ENVHUB_MCP_CONFIG" --strict-mcp-config \
  --dangerously-skip-permissions --output-format json --max-turns 4 </dev/null
echo "CLI_EXIT $?"
