"""Prometheus metrics of one server (its own registry: servers in one process do not share counts)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]

        def make(kind, name, doc, **kw):
            return kind(name, doc, labels, registry=r, **kw).labels(model_name)

        self.running = make(Gauge, "dsv4_num_requests_running", "Sequences holding a decode slot")
        self.waiting = make(Gauge, "dsv4_num_requests_waiting", "Sequences waiting for a decode slot")
        self.prompt_tokens = make(Counter, "dsv4_prompt_tokens", "Prompt tokens prefilled")
        self.generation_tokens = make(Counter, "dsv4_generation_tokens", "Tokens sampled")
        self.ttft = make(Histogram, "dsv4_time_to_first_token_seconds",
                         "From the request's arrival to its first sampled token", buckets=_TTFT_BUCKETS)
        self.tpot = make(Histogram, "dsv4_time_per_output_token_seconds",
                         "Between consecutive sampled tokens of one sequence", buckets=_TPOT_BUCKETS)
        self.e2e = make(Histogram, "dsv4_e2e_request_latency_seconds",
                        "From a choice's arrival to its end (finished, stopped, cancelled or failed)",
                        buckets=_E2E_BUCKETS)
        self.queue_time = make(Histogram, "dsv4_request_queue_time_seconds",
                               "From a choice's arrival to its slot (time spent waiting for one)",
                               buckets=_TTFT_BUCKETS)
        self.rejected = make(Counter, "dsv4_requests_rejected", "Requests refused with 429 (queue full)")
        self.draft_tokens = make(Counter, "dsv4_spec_decode_num_draft_tokens",
                                 "Drafted tokens a verify step checked (speculative decoding)")
        self.accepted_tokens = make(Counter, "dsv4_spec_decode_num_accepted_tokens",
                                    "Drafted tokens a verify step accepted (speculative decoding)")
        self.prefix_queries = make(Counter, "dsv4_prefix_cache_queries",
                                   "Prompt tokens to prefill looked up in the prefix cache")
        self.prefix_hits = make(Counter, "dsv4_prefix_cache_hits",
                                "Prompt tokens the prefix cache gave (not prefilled again)")
        self.finished = Counter("dsv4_requests_finished", "Choices (a sequence each) ended, by finish reason",
                                ["model_name", "finished_reason"], registry=r)
        self.model_name = model_name

    def first_token(self, seconds: float, prompt_tokens: int):
        self.ttft.observe(seconds)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc()

    def next_token(self, seconds: float):
        self.tpot.observe(seconds)
        self.generation_tokens.inc()

    def queued(self, seconds: float):
        self.queue_time.observe(seconds)

    def ended(self, seconds: float):
        self.e2e.observe(seconds)

    def speculated(self, drafted: int, accepted: int):
        self.draft_tokens.inc(drafted)
        self.accepted_tokens.inc(accepted)

    def prefix_cached(self, queried: int, hit: int):
        self.prefix_queries.inc(max(0, queried))
        self.prefix_hits.inc(hit)

    def queues(self, running: int, waiting: int):
        self.running.set(running)
        self.waiting.set(waiting)

    def finish(self, reason: str):
        self.finished.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
