#!/bin/sh
# Codex CLI (npm @openai/codex), unchanged, as a command agent: one `codex exec` of the task
# against this rollout's session (its Responses API, the only provider), with the
# environment's tools over MCP when it has any (the [mcp_servers.envhub] table envhub writes
# at /run/envhub/codex.toml, appended to its config; Codex offers the tools to the model as a
# Responses `namespace` tool, mcp__envhub__<tool>).
#   envhub run ENV --agent codex.sh --agent-install recipe:codex
# Offline: no update check, web search, analytics, feedback, plugins or other network
# features; approvals and Codex's own sandbox off (the rollout's sandbox is the boundary).
# CODEX_COMPACT_LIMIT: its auto-compact token limit (default: Codex's own).
#@install npm:@openai/codex@0.169.0
export HOME=/tmp/agent-home CODEX_HOME=/tmp/agent-home/.codex
mkdir -p "$CODEX_HOME"
cat > "$CODEX_HOME/config.toml" <<TOML
model = "gpt-5-codex"
model_provider = "envhub"
check_for_update_on_startup = false
web_search = "disabled"
model_context_window = 32768
${CODEX_COMPACT_LIMIT:+model_auto_compact_token_limit = $CODEX_COMPACT_LIMIT}

[model_providers.envhub]
name = "envhub"
base_url = "$OPENAI_BASE_URL"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[agents]
enabled = false

[features]
apps = false
plugins = false
remote_plugin = false
image_generation = false
computer_use = false
browser_use = false
in_app_browser = false
enable_request_compression = false
daemon_auto_start = false
api_key_model_discovery = false
tool_suggest = false
skill_mcp_dependency_install = false
in_app_updates = false
TOML
if [ -f /run/envhub/codex.toml ]; then cat /run/envhub/codex.toml >> "$CODEX_HOME/config.toml"; fi
codex exec --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check --json \
  "$(cat "$ENVHUB_TASK_FILE")" </dev/null
echo "CLI_EXIT $?"
