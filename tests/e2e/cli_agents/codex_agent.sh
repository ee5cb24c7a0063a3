#!/bin/sh
# Codex CLI through its shipped recipe (envs/agents/recipes/codex.sh: the session's forwarder
# its only provider, nothing that wants the network, Codex's own sandbox off), then two more
# user turns (`exec resume`) with a low auto-compact limit, so that it compacts its history.
export HOME=/tmp/agent-home CODEX_HOME=/tmp/agent-home/.codex
export CODEX_COMPACT_LIMIT="${CODEX_COMPACT_LIMIT:-6000}"
codex.sh
for prompt in "Continue." "Continue."; do
  codex exec resume --last --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check \
    --json "$prompt" </dev/null
  echo "CLI_EXIT $?"
done
