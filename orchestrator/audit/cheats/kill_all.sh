# Kill every process it can reach: the sandbox's init and main process where reachable, then
# every process of its user (`kill -9 -1`, its own shell included). The rollout must still be
# graded as the agent's (nothing it could kill is the grader, and a sandbox stopped from inside
# is the agent's doing), never turned into env_failure.
kill -9 1 2>/dev/null
kill -9 -1 2>/dev/null
exit 0
