"""The router's Prometheus metrics: one registry per router (no global state), served at the HTTP front end's
`/metrics` (docs/http.md lists them).

Names mirror vLLM's `vllm:` metrics with the prefix `pdcluster_`, and mean the same: a dashboard built for one reads
the other. Two kinds: what happens to requests (counters and histograms, updated when a request ends: `finished`,
`failed`), and what the cluster holds now (gauges, read from the router's tables and the workers' last heartbeats
when scraped, so they never drift from the state they describe).
"""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common import protocol as P
from router.disagg_policy import DisaggPolicy
from router.links import KVLinks
from router.registry import WorkerRegistry
from router.request import Phase
from router.request_table import RequestTable

PREFIX = "pdcluster_"
# vLLM's buckets (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)


class Metrics:
    def __init__(self, requests: RequestTable, workers: WorkerRegistry, links: KVLinks | None = None,
                 disagg: DisaggPolicy | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        reg, p = self.registry, PREFIX
        self.success = Counter(f"{p}request_success", "Requests that ended with a result, by finish reason "
                               "(stop, length, abort: the client's abort or disconnect).", ["finished_reason"],
                               registry=reg)
        self.failure = Counter(f"{p}request_failure", "Requests that ended with an error, by error code "
                               "(overloaded, unavailable, bad_request, aborted, timeout, ...).", ["code"], registry=reg)
        self.prompt_tokens = Counter(f"{p}prompt_tokens", "Prompt tokens of finished requests.", registry=reg)
        self.generation_tokens = Counter(f"{p}generation_tokens", "Tokens generated for finished requests.",
                                         registry=reg)
        self.prefix_queries = Counter(f"{p}prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      registry=reg)
        self.prefix_hits = Counter(f"{p}prefix_cache_hits", "Prompt tokens found in the prefix cache.", registry=reg)
        self.ttft = Histogram(f"{p}time_to_first_token_seconds", "From arrival at the router to the first token.",
                              buckets=TTFT_BUCKETS, registry=reg)
        self.itl = Histogram(f"{p}inter_token_latency_seconds", "Between two tokens of a request (tokens of one "
                             "step arrive together: 0).", buckets=TPOT_BUCKETS, registry=reg)
        self.tpot = Histogram(f"{p}request_time_per_output_token_seconds", "A request's mean time per token after "
                              "the first.", buckets=TPOT_BUCKETS, registry=reg)
        self.e2e = Histogram(f"{p}e2e_request_latency_seconds", "From arrival at the router to the result.",
                             buckets=REQUEST_BUCKETS, registry=reg)
        self.queue_time = Histogram(f"{p}request_queue_time_seconds", "From arrival to dispatch to workers.",
                                    buckets=REQUEST_BUCKETS, registry=reg)
        reg.register(ClusterState(requests, workers, links, disagg))

    def finished(self, reason: str, usage: P.Usage, timings: P.Timings) -> None:
        self.success.labels(reason).inc()
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.generation_tokens.inc(usage.completion_tokens)
        self.prefix_queries.inc(usage.prompt_tokens)
        self.prefix_hits.inc(usage.cached_tokens)
        self.e2e.observe(timings.e2e)
        self.queue_time.observe(timings.queued)
        if timings.ttft is not None:
            self.ttft.observe(timings.ttft)
            if usage.completion_tokens > 1:
                self.tpot.observe((timings.e2e - timings.ttft) / (usage.completion_tokens - 1))
        for gap in timings.itl:
            self.itl.observe(gap)

    def failed(self, code: str) -> None:
        self.failure.labels(code).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class ClusterState(Collector):
    """What the cluster holds at scrape time: requests waiting and running, each worker's liveness and KV blocks,
    the KV handoffs its heartbeats report (totals since the worker started), and in a disaggregated cluster the KV
    links between its workers and where its prompts were prefilled."""

    def __init__(self, requests: RequestTable, workers: WorkerRegistry, links: KVLinks | None = None,
                 disagg: DisaggPolicy | None = None):
        self.requests, self.workers, self.links, self.disagg = requests, workers, links, disagg

    def collect(self) -> Iterator[Metric]:
        p = PREFIX
        phases = [r.phase for r in self.requests]
        waiting = sum(1 for ph in phases if ph is Phase.QUEUED)
        yield GaugeMetricFamily(f"{p}num_requests_waiting", "Requests waiting at the router for a worker.",
                                value=waiting)
        yield GaugeMetricFamily(f"{p}num_requests_running", "Requests on workers (reserving, prefilling, decoding "
                                "or running).", value=len(phases) - waiting)
        labels = ["worker", "role"]
        up = GaugeMetricFamily(f"{p}worker_up", "1 while the worker heartbeats, 0 once declared dead.", labels=labels)
        used = GaugeMetricFamily(f"{p}kv_cache_blocks_used", "KV blocks in use on the worker (last heartbeat).",
                                 labels=labels)
        free = GaugeMetricFamily(f"{p}kv_cache_blocks_free", "KV blocks free on the worker (last heartbeat).",
                                 labels=labels)
        usage = GaugeMetricFamily(f"{p}kv_cache_usage_perc", "Share of the worker's KV blocks in use, 0 to 1.",
                                  labels=labels)
        queued = GaugeMetricFamily(f"{p}worker_requests_waiting", "Requests queued in the worker's scheduler.",
                                   labels=labels)
        running = GaugeMetricFamily(f"{p}worker_requests_running", "Requests running in the worker's batch.",
                                    labels=labels)
        handoffs = CounterMetricFamily(f"{p}kv_handoffs", "KV handoffs sent, by transport (prefill workers).",
                                       labels=["transport"])
        handoff_bytes = CounterMetricFamily(f"{p}kv_handoff_bytes", "KV bytes sent, by transport.",
                                            labels=["transport"])
        handoff_seconds = CounterMetricFamily(f"{p}kv_handoff_seconds", "Seconds from a handoff's send to its "
                                              "acknowledgement, summed, by transport.", labels=["transport"])
        by_transport: dict[str, list[float]] = {}
        for w in self.workers.workers.values():
            key, load = [w.worker_id, w.role], w.load
            up.add_metric(key, 1.0 if w.alive else 0.0)
            used.add_metric(key, load.kv_blocks_total - load.kv_blocks_free)
            free.add_metric(key, load.kv_blocks_free)
            usage.add_metric(key, 1 - load.kv_blocks_free / load.kv_blocks_total if load.kv_blocks_total else 0.0)
            queued.add_metric(key, load.queued_requests)
            running.add_metric(key, load.running_requests)
            for h in load.handoffs:
                totals = by_transport.setdefault(h.transport, [0, 0, 0.0])
                totals[0] += h.count
                totals[1] += h.bytes
                totals[2] += h.seconds
        for transport, (count, size, seconds) in sorted(by_transport.items()):
            handoffs.add_metric([transport], count)
            handoff_bytes.add_metric([transport], size)
            handoff_seconds.add_metric([transport], seconds)
        yield from (up, used, free, usage, queued, running, handoffs, handoff_bytes, handoff_seconds)
        yield from self._disaggregated()

    def _disaggregated(self) -> Iterator[Metric]:
        p = PREFIX
        if self.links is not None:
            yield GaugeMetricFamily(f"{p}kv_links_opening", "KV links between a prefill and a decode worker asked for "
                                    "and not open yet (the cluster is not ready while any are).",
                                    value=self.links.still_opening())
            yield CounterMetricFamily(f"{p}kv_links_opened", "KV links opened ahead of any handoff, as workers met.",
                                      value=self.links.opened_count)
        if self.disagg is not None:
            prefills = CounterMetricFamily(f"{p}prefills", "Prompts dispatched in a disaggregated cluster, by where "
                                           "they are prefilled: remote (a prefill worker, the KV handed over) or local "
                                           "(the decode worker, --disagg-policy never or auto).", labels=["where"])
            prefills.add_metric(["remote"], self.disagg.remote_choices)
            prefills.add_metric(["local"], self.disagg.local_choices)
            yield prefills
