"""Task services: an environment's rollout and reward logic as a service of its own (its own
process, machine or image, its own dependencies, any language) that registers with a running
orchestrator (`envhub run --services HOST:PORT`) and is asked to run rollouts there.

The protocol (JSON over HTTP, version 1; the models are in protocol.py):

Service → orchestrator (every request with `Authorization: Bearer TOKEN`, the run's token:
`envhub run --services-token` or ENVHUB_SERVICES_TOKEN, else one the run makes and prints;
anything else gets 401, so nothing without it, an agent included, can register a grader)
  POST /v1/services            {name, url, capacity, protocol: 1}
                               → {id, heartbeat_s}. `name` is the environment it serves (a run
                               asks for it as `service:NAME`); several services of one name
                               share its rollouts, each up to its `capacity` at once.
  POST /v1/services/{id}/heartbeat  {in_flight} every `heartbeat_s`
                               → 204; 404 when the orchestrator no longer knows the id (it
                               missed HEARTBEATS_MISSED beats): register again.
  GET  /v1/services            → the registered services, their load and liveness.

Orchestrator → service (at the `url` it registered)
  GET  /v1/env                 → {name, version, rewards: {component: weight}, tasks: [{id,
                               instruction, data}]}: what the run plans its groups from.
  POST /v1/rollouts            {rollout_id, group_id, task_id, sample, gateway_url, session_id,
                               api_key, limits: {max_turns?, time_limit_s?}}
                               → (when the rollout is over) {status, reason, stopped, turns,
                               verdict: {outcome, resolved, info, env_failure, signals},
                               duration_s, setup_s, verify_s, signals}: `signals` are the
                               agent phase's process signals (tool errors), which the
                               orchestrator records with its admin key (the session's key
                               cannot: an agent would award itself process rewards).

The session is the orchestrator's: it opens it in the pool before asking, the service's agent
talks to the model only through `gateway_url` with `api_key` (so every turn is in the pool,
token-exact), and the orchestrator scores the group and closes the sessions. The pool stays the
single source of truth; the service reports only what the pool cannot know (its verdict, how the
rollout ended) and the signals only the orchestrator's key may write.

Failure accounting: each rollout is asked of one service, once. A service whose connection
breaks mid-rollout (killed), or that stops heartbeating (hung), ends its rollouts as
`env_failure` with the reason; they are not asked of another service in the run (a second
attempt would write its turns into the same session), so no rollout is lost or counted twice.
`envhub run --resume` runs them again. An answer that does not parse, or a status other than
done, agent_error or env_failure, ends the rollout as env_failure naming the service: a
service cannot make a sample vanish by answering something else.
"""
