#!/bin/sh
# Codex CLI (npm @openai/codex), unchanged, using the environment's tools over MCP: the provider
# config of codex_agent.sh (only the session's forwarder; nothing that wants the network) plus
# the server table envhub writes into the channel folder (/run/envhub/codex.toml:
# [mcp_servers.envhub] url = $ENVHUB_MCP_URL). Codex offers the server's tools to the model as a
# Responses `namespace` tool (the model sees mcp__envhub__<tool>). One `codex exec` of the task.
export HOME=/tmp/agent-home CODEX_HOME=/tmp/agent-home/.codex
mkdir -p "$CODEX_HOME"
cat > "$CODEX_HOME/config.toml" <<TOML
model = "gpt-5-codex"
model_provider = "envhub"
check_for_update_on_startup = false
web_search = "disabled"
model_context_window = 32768

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
cat /run/envhub/codex.toml >> "$CODEX_HOME/config.toml"
codex exec --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check --json \
  "$(cat "$ENVHUB_TASK_FILE")" </dev/null
echo "CLI_EXIT $?"
