#!/bin/sh
# Codex CLI (npm @openai/codex), unchanged, as an envhub command agent inside the sandbox: its
# only provider is the session's forwarder (OPENAI_BASE_URL, Responses API); no update check,
# analytics, feedback, web search, apps, plugins or sub-agents (nothing that wants the network).
# Codex's own sandbox is off: the rollout's sandbox is the containment. Three user turns (the
# task, then two `exec resume`) and a low auto-compact limit, so that it compacts its history.
export HOME=/tmp/agent-home CODEX_HOME=/tmp/agent-home/.codex
mkdir -p "$CODEX_HOME"
cat > "$CODEX_HOME/config.toml" <<TOML
model = "gpt-5-codex"
model_provider = "envhub"
check_for_update_on_startup = false
web_search = "disabled"
model_context_window = 32768
model_auto_compact_token_limit = ${CODEX_COMPACT_LIMIT:-6000}

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
flags="--dangerously-bypass-approvals-and-sandbox --skip-git-repo-check --json"
codex exec $flags "$(cat "$ENVHUB_TASK_FILE")" </dev/null
echo "CLI_EXIT $?"
for prompt in "Continue." "Continue."; do
  codex exec resume --last $flags "$prompt" </dev/null
  echo "CLI_EXIT $?"
done
