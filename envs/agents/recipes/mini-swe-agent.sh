#!/bin/sh
# mini-swe-agent (PyPI mini-swe-agent), unchanged, as a command agent: `mini` with its own
# mini.yaml on the task, against this rollout's session through litellm's OpenAI provider
# (model openai/default at $OPENAI_BASE_URL). Its only tool is bash, run where it runs (inside
# the sandbox); when the environment has tools, the task says how to call them from bash with
# `envhub-tool` (installed beside this script: an MCP client of $ENVHUB_MCP_URL).
#   envhub run ENV --agent mini-swe-agent.sh --agent-install recipe:mini-swe-agent
# Extra mini settings (KEY=VALUE, e.g. agent.step_limit=10) go after the script's name.
# Offline: no setup wizard, no price list fetched (cost tracking off), one model attempt per
# step (the gateway's errors are the run's to see); its trajectory at /tmp/mini.traj.json.
# (mcp: this litellm imports it on every completion without declaring it.)
#@install pip:mini-swe-agent==2.4.6
#@install pip:mcp==2.3.0
export HOME=/tmp/agent-home MSWEA_GLOBAL_CONFIG_DIR=/tmp/agent-home/.config/mini-swe-agent \
  MSWEA_CONFIGURED=true MSWEA_SILENT_STARTUP=1 MSWEA_COST_TRACKING=ignore_errors \
  LITELLM_LOCAL_MODEL_COST_MAP=True MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1
mkdir -p "$MSWEA_GLOBAL_CONFIG_DIR"
task=$(cat "$ENVHUB_TASK_FILE")
if [ -n "$ENVHUB_MCP_URL" ]; then
  task="$task

This task's tools are shell commands: \`envhub-tool\` lists them, \`envhub-tool NAME key=value ...\` calls one. Hand in the answer with its submit tool when it has one.
$(envhub-tool 2>&1)"
fi
n=$#
for setting in "$@"; do set -- "$@" -c "$setting"; done
shift "$n"
mini --yolo --exit-immediately --model openai/default --task "$task" -c mini.yaml "$@" \
  --cost-limit 0 --environment-class local --output /tmp/mini.traj.json </dev/null
echo "CLI_EXIT $?"
