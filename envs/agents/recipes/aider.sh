#!/bin/sh
# aider (PyPI aider-chat), unchanged, as a command agent: one `aider --message` of the task in
# the sandbox's workdir against this rollout's session (litellm's OpenAI provider, model
# openai/default at $OPENAI_BASE_URL), editing files in its "whole" format.
#   envhub run ENV --agent aider.sh --agent-install recipe:aider
# aider has no tool calls and no MCP client, and it never runs a shell command unattended
# (--yes-always answers its "Run shell command?" with no). So on an environment graded on the
# files it changes (swe-task, terminal tasks) it works as it is; on one graded on a submitted
# answer (arith, search) the task asks for the answer in ANSWER.txt and this script hands that
# file's text to the environment's submit tool with `envhub-tool` after aider exits: the
# answer is the model's, only the delivery is this script's.
# Offline: no update check, analytics, git, repo map, URL fetching or model list fetch.
#@install pip:aider-chat==0.86.2
export HOME=/tmp/agent-home LITELLM_LOCAL_MODEL_COST_MAP=True AIDER_CHECK_UPDATE=false \
  AIDER_ANALYTICS_DISABLE=true
mkdir -p "$HOME"
task=$(cat "$ENVHUB_TASK_FILE")
submit=""
if [ -n "$ENVHUB_MCP_URL" ] && envhub-tool 2>/dev/null | grep -q '^submit '; then
  submit=ANSWER.txt
  : > "$submit"
  task="$task

Write only your final answer into the file ANSWER.txt; its text is what is submitted."
fi
aider --model openai/default --openai-api-base "$OPENAI_BASE_URL" \
  --openai-api-key "$OPENAI_API_KEY" --edit-format whole --no-git --no-auto-commits \
  --map-tokens 0 --no-check-update --analytics-disable --no-show-model-warnings \
  --no-detect-urls --no-suggest-shell-commands --no-auto-lint --no-auto-test --no-pretty \
  --no-stream --no-fancy-input --yes-always --message "$task" $submit </dev/null
status=$?
if [ -n "$submit" ]; then
  envhub-tool submit answer=@"$submit"
fi
echo "CLI_EXIT $status"
