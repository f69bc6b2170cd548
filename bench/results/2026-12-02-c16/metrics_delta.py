# Lab script (README.md beside it): one round's deltas of the server's Prometheus counters and histograms.
# ruff: noqa
import json, re, sys

line = re.compile(r"^([a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$")


def read(path):
    values = {}
    for text in open(path):
        m = line.match(text.strip())
        if m:
            values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


before, after = read(sys.argv[1]), read(sys.argv[2])


def delta(name):
    return after.get(name, 0.0) - before.get(name, 0.0)


computed = delta("decision_computed_tokens_total")
forward = delta("decision_shard_forward_seconds_sum")
batches = delta("decision_batch_duration_seconds_count")
batch_seconds = delta("decision_batch_duration_seconds_sum")
wait = delta("decision_queue_wait_seconds_sum") / max(delta("decision_queue_wait_seconds_count"), 1)
overhead = delta("decision_router_overhead_seconds_sum") / max(delta("decision_router_overhead_seconds_count"), 1)
requests = delta("decision_batch_requests_sum")
print(
    f"computed {computed:.0f} tokens in {batches:.0f} batches ({requests / max(batches, 1):.2f} requests each); "
    f"shard forward {forward:.1f} s = {computed / max(forward, 1e-9):.1f} tokens/forward-s; "
    f"batches {batch_seconds:.1f} s = {computed / max(batch_seconds, 1e-9):.1f} tokens/batch-s; "
    f"mean queue wait {wait:.2f} s, router overhead {overhead * 1e3:.1f} ms"
)
