#!/bin/sh
# opencode (npm opencode-ai), unchanged, as a command agent: one `opencode run`
# of the task against this rollout's session, with the environment's tools over MCP.
#   envhub run ENV --agent opencode.sh --agent-install recipe:opencode
# Its provider is the session's forwarder ($OPENAI_BASE_URL, OpenAI chat API, model "default");
# when the environment has tools, the MCP server `envhub` at $ENVHUB_MCP_URL (the model sees
# them as envhub_<tool>).
#@install npm:opencode-ai@1.18.33
# Offline: no update check, model list fetch, LSP download, default plugins, sharing or
# project config; `--title` given, else opencode spends the task's first model reply on a
# title side call; permissions granted (`--auto`), the sandbox is the boundary.
export HOME=/tmp/agent-home XDG_CONFIG_HOME=/tmp/agent-home/.config \
  XDG_DATA_HOME=/tmp/agent-home/.local/share XDG_CACHE_HOME=/tmp/agent-home/.cache \
  XDG_STATE_HOME=/tmp/agent-home/.local/state
mkdir -p "$XDG_CONFIG_HOME/opencode"
export OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_MODELS_FETCH=1 \
  OPENCODE_DISABLE_LSP_DOWNLOAD=1 OPENCODE_DISABLE_DEFAULT_PLUGINS=1 OPENCODE_DISABLE_SHARE=1 \
  OPENCODE_DISABLE_PROJECT_CONFIG=1 OPENCODE_DISABLE_CLAUDE_CODE=1 \
  OPENCODE_DISABLE_EXTERNAL_SKILLS=1 OPENCODE_DISABLE_AUTOCOMPACT=1
mcp=""
if [ -n "$ENVHUB_MCP_URL" ]; then
  mcp=',"mcp": {"envhub": {"type": "remote", "url": "'"$ENVHUB_MCP_URL"'", "enabled": true}}'
fi
cat > "$XDG_CONFIG_HOME/opencode/opencode.json" <<JSON
{
  "\$schema": "https://opencode.ai/config.json",
  "autoupdate": false,
  "share": "disabled",
  "model": "envhub/default",
  "small_model": "envhub/default",
  "provider": {
    "envhub": {
      "npm": "@ai-sdk/openai-compatible",
      "name": "envhub",
      "options": {"baseURL": "$OPENAI_BASE_URL", "apiKey": "$OPENAI_API_KEY"},
      "models": {"default": {"name": "default", "limit": {"context": 32768, "output": 1024}}}
    }
  }$mcp
}
JSON
opencode run --model envhub/default --title envhub --format json --auto \
  "$(cat "$ENVHUB_TASK_FILE")" </dev/null
echo "CLI_EXIT $?"
