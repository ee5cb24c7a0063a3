"""Per-instance fleet metrics, exposed on the gateway's `/metrics`.

The fleet keeps its own collectors (it exists before the gateway's registry does, and works
without one); `attach(registry)` bridges them into the gateway's registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from envhub.gateway.fleet.instance import Instance

LATENCY_BUCKETS_MS = (1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 30000, 120000)


class _Live(Collector):
    """Gauges read at scrape time from the instances' state."""

    def __init__(self, instances: Callable[[], Iterable[Instance]],
                 fleet_state: Callable[[], dict[str, float]]):
        self._instances = instances
        self._state = fleet_state

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("envhub_fleet_instance_up", "1 if the instance is in rotation",
                               labels=["instance"])
        load = GaugeMetricFamily("envhub_fleet_in_flight",
                                 "calls in flight to the instance (its queue from this gateway)",
                                 labels=["instance"])
        tps = GaugeMetricFamily("envhub_fleet_tokens_per_second",
                                "completion tokens per second over the last 10 s",
                                labels=["instance"])
        version = GaugeMetricFamily("envhub_fleet_instance_weight_version",
                                    "weight version the instance reports", labels=["instance"])
        for inst in self._instances():
            up.add_metric([inst.name], 1.0 if inst.in_rotation else 0.0)
            load.add_metric([inst.name], inst.in_flight)
            tps.add_metric([inst.name], inst.tokens_per_second())
            version.add_metric([inst.name], inst.weight_version)
        yield from (up, load, tps, version)
        state = self._state()
        yield GaugeMetricFamily("envhub_fleet_paused", "1 while new calls are held for a "
                                "weight update", value=state["paused"])
        yield GaugeMetricFamily("envhub_fleet_waiting", "calls waiting at the pause gate",
                                value=state["waiting"])
        yield GaugeMetricFamily("envhub_fleet_weight_version", "the fleet's weight version",
                                value=state["weight_version"])


class _Bridge(Collector):
    def __init__(self, registry: CollectorRegistry):
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()


class FleetMetrics:
    def __init__(self, instances: Callable[[], Iterable[Instance]],
                 fleet_state: Callable[[], dict[str, float]]):
        r = self.registry = CollectorRegistry()
        self.calls = Counter("envhub_fleet_calls", "engine calls by outcome",
                             ["instance", "outcome"], registry=r)
        self.latency_ms = Histogram("envhub_fleet_call_ms", "engine call latency (ms)",
                                    ["instance"], buckets=LATENCY_BUCKETS_MS, registry=r)
        self.tokens = Counter("envhub_fleet_completion_tokens", "tokens sampled",
                              ["instance"], registry=r)
        self.retries = Counter("envhub_fleet_retries", "calls retried on another instance",
                               registry=r)
        self.removals = Counter("envhub_fleet_removals", "instances taken out of rotation",
                                ["instance", "why"], registry=r)
        self.kept_late = Counter("envhub_fleet_kept_late", "late heartbeats of the last instance "
                                 "in rotation, which keep it in (fleet/heartbeat.py)",
                                 ["instance"], registry=r)
        self.weight_updates = Counter("envhub_fleet_weight_updates", "weight updates done",
                                      registry=r)
        r.register(_Live(instances, fleet_state))
        self._attached: list[CollectorRegistry] = []

    def attach(self, registry: CollectorRegistry) -> None:
        """Expose these metrics through another registry (the gateway's); idempotent."""
        if any(r is registry for r in self._attached):
            return
        registry.register(_Bridge(self.registry))
        self._attached.append(registry)
