"""Prometheus metrics of one gateway (its own registry, so several gateways can share a
process in tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("envhub_requests", "HTTP API calls", ["route", "status"],
                                registry=r)
        self.turns = Counter("envhub_turns", "turns recorded", registry=r)
        self.prompt_tokens = Counter("envhub_prompt_tokens", "prompt tokens sent", registry=r)
        self.completion_tokens = Counter("envhub_completion_tokens", "tokens sampled",
                                         registry=r)
        self.cm_actions = Counter("envhub_cm_actions", "context-management actions", ["kind"],
                                  registry=r)
        self.backend_errors = Counter("envhub_backend_errors", "failed engine calls", registry=r)
        self.lease_lost = Counter("envhub_lease_lost", "calls re-run because another gateway "
                                  "process on the pool had taken the session", registry=r)
        self.render_ms = Histogram("envhub_render_ms", "plan + render time per call (ms)",
                                   buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100),
                                   registry=r)
        self.latency_ms = Histogram("envhub_call_ms", "model call latency (ms)",
                                    buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000, 30000),
                                    registry=r)
        self.forwards = Counter("envhub_engine_forwards", "engine forward passes that produced "
                                "completions, from engines that report them", registry=r)
        self.forward_tokens = Counter(
            "envhub_engine_forward_tokens", "completion tokens of those completions: / forwards "
            "= tokens per forward (> 1 with speculative decoding)", registry=r)
        self.in_flight = Gauge("envhub_in_flight", "model calls in flight", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
