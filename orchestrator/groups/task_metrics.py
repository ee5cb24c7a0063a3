"""Per-task Prometheus metrics of a run or a training (served at `--metrics HOST:PORT` and at
the task services' hub's `/metrics`): rollouts in flight and ended (by status), rewards,
resolved counts, durations, and, under `envhub train`, samples trained and dropped as stale.
Rates are PromQL's (`rate(envhub_task_rollouts_total[1m])`); a mean reward is
`delta(envhub_task_reward_sum[5m]) / increase(envhub_task_rollouts_total{status="done"}[5m])`.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from envhub.orchestrator.groups.results import RolloutRecord


class TaskMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.in_flight = Gauge("envhub_task_rollouts_in_flight", "rollouts running now",
                               ["task"], registry=r)
        self.rollouts = Counter("envhub_task_rollouts", "rollouts ended, by status (done, "
                                "agent_error, env_failure)", ["task", "status"], registry=r)
        self.reward = Gauge("envhub_task_reward_sum", "total reward of done rollouts (a "
                            "sum: rewards may be negative)", ["task"], registry=r)
        self.resolved = Counter("envhub_task_resolved", "done rollouts that resolved the task",
                                ["task"], registry=r)
        self.seconds = Histogram("envhub_task_rollout_seconds", "rollout duration (agent)",
                                 ["task"], registry=r,
                                 buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600))
        self.trained = Counter("envhub_task_trained_samples", "samples the trainer kept",
                               ["task"], registry=r)
        self.stale = Counter("envhub_task_stale_samples", "samples dropped as stale", ["task"],
                             registry=r)

    def finished(self, records: list[RolloutRecord]) -> None:
        for rec in records:
            self.rollouts.labels(rec.env, rec.status).inc()
            self.seconds.labels(rec.env).observe(rec.duration_s)
            if rec.status == "done":
                self.reward.labels(rec.env).inc(rec.components.get("total", 0.0))
                self.resolved.labels(rec.env).inc(1.0 if rec.resolved else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def serve_metrics(listen: str, metrics: TaskMetrics, log: Any) -> Any:
    """Serve `metrics` at http://LISTEN/metrics on a thread of its own (`--metrics`); returns
    the server (close it). RunConfigError when the address cannot be bound."""
    from prometheus_client import make_asgi_app

    from envhub.envs.errors import RunConfigError
    from envhub.orchestrator.groups.config import listen_address
    from envhub.sdk.serve import serve_in_thread

    host, port = listen_address(listen, "--metrics")
    try:
        server = serve_in_thread(make_asgi_app(registry=metrics.registry), host, port,
                                 name="envhub-metrics")
    except (OSError, RuntimeError) as e:  # bound elsewhere, or the server did not start
        raise RunConfigError(f"--metrics {listen}: cannot listen: {e}; pick a free port"
                             ) from None
    log(f"per-task metrics at {server.url}/metrics")
    return server


def run_metrics(listen: str | None, hub: Any, log: Any, stack: Any) -> TaskMetrics | None:
    """A run's per-task metrics: the task services hub's (served at its address) or, with
    `--metrics` (`listen`), a set of their own; served at `listen` until `stack` (an
    ExitStack or AsyncExitStack) closes. None when nothing serves them."""
    if hub is None and not listen:
        return None
    metrics: TaskMetrics = hub.metrics if hub is not None else TaskMetrics()
    if listen:
        stack.callback(serve_metrics(listen, metrics, log).close)
    return metrics
