//! Every Prometheus series the router exports, in one table: its name, kind, help text and, for a
//! histogram, its explicit buckets. `install` builds the recorder from it, so every series has a
//! `# HELP`, every histogram is a real Prometheus histogram (aggregatable across replicas, unlike a
//! summary) and `docs/metrics.md` is checked against it.

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// What a series is, and a histogram's bucket upper bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram(&'static [f64]),
}

impl Kind {
    /// The kind's name in Prometheus' `# TYPE` line.
    pub fn type_name(&self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram(_) => "histogram",
        }
    }
}

/// One exported series.
#[derive(Debug, Clone, Copy)]
pub struct Series {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

/// A whole request, and the wait of its reads in the queue: a few milliseconds (a cached state) to the
/// default deadline of 120 s.
const REQUEST_SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];
/// The router's own share of a request: tens of microseconds to a large body's parse.
const ROUTER_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// One shard call or forward: a GPU pass over a few tokens to a CPU pass over a full batch.
const FORWARD_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Reads (questions) in one shard call, up to the default --max-queued-reads.
const BATCH_READS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
];
/// Requests in one shard call.
const BATCH_REQUESTS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// The table. A new series is one line here (and its row in docs/metrics.md: a test checks both ways).
pub const SERIES: &[Series] = &[
    // Requests (http/middleware.rs, http/ops.rs, decide.rs)
    Series { name: "decision_http_requests_total", kind: Kind::Counter, help: "HTTP requests answered, by route template and status." },
    Series { name: "decision_http_request_duration_seconds", kind: Kind::Histogram(REQUEST_SECONDS), help: "Wall time of an HTTP request, by route template." },
    Series { name: "decision_http_requests_in_flight", kind: Kind::Gauge, help: "Decision requests being answered now (a drain waits for them)." },
    Series { name: "decision_requests_queued", kind: Kind::Gauge, help: "Decision requests whose reads wait in the batch queue for the shards." },
    Series { name: "decision_requests_running", kind: Kind::Gauge, help: "Decision requests whose reads are at the shards now." },
    Series { name: "decision_router_overhead_seconds", kind: Kind::Histogram(ROUTER_SECONDS), help: "The router's own time in a decision request: its wall time less queue wait and shard time." },
    Series { name: "decision_queue_wait_seconds", kind: Kind::Histogram(REQUEST_SECONDS), help: "Time a decision request's reads waited in the batch queue." },
    Series { name: "decision_requests_timed_out_total", kind: Kind::Counter, help: "Decision requests answered 504 at their deadline." },
    Series { name: "decision_requests_backlogged_total", kind: Kind::Counter, help: "Decision requests refused at once (529/429) because the queued work would keep them past their deadline." },
    Series { name: "decision_questions_total", kind: Kind::Counter, help: "Questions answered." },
    Series { name: "decision_prompt_tokens_total", kind: Kind::Counter, help: "Prompt tokens of the answered requests (a shared prefix counted once)." },
    Series { name: "decision_cached_tokens_total", kind: Kind::Counter, help: "Prompt tokens served from the shards' prefix cache." },
    Series { name: "decision_computed_tokens_total", kind: Kind::Counter, help: "Prompt tokens the shards computed." },
    // Batches and the shard (queue.rs)
    Series { name: "decision_batch_reads", kind: Kind::Histogram(BATCH_READS), help: "Reads (questions) per shard call." },
    Series { name: "decision_batch_requests", kind: Kind::Histogram(BATCH_REQUESTS), help: "Requests per shard call." },
    Series { name: "decision_batch_duration_seconds", kind: Kind::Histogram(FORWARD_SECONDS), help: "A shard call, as the router waited for it." },
    Series { name: "decision_shard_forward_seconds", kind: Kind::Histogram(FORWARD_SECONDS), help: "The shards' forward time per call, as they reported it." },
    Series { name: "decision_shard_idle_seconds", kind: Kind::Histogram(FORWARD_SECONDS), help: "How long the shard's model thread sat idle before each call, since the call before it: under load, the time the device waited for the router." },
    Series { name: "decision_shard_forward_passes_total", kind: Kind::Counter, help: "Walks over the model's layers, as rank 0 ran them." },
    Series { name: "decision_shard_head_seconds", kind: Kind::Histogram(FORWARD_SECONDS), help: "Joint-schema models: the part of the forward time the head took." },
    Series { name: "decision_queued_reads", kind: Kind::Gauge, help: "Reads queued or at the shards (bounded by --max-queued-reads)." },
    Series { name: "decision_queued_tokens", kind: Kind::Gauge, help: "Unique prompt tokens queued or at the shards." },
    Series { name: "decision_queue_high_water_reads", kind: Kind::Gauge, help: "Queued reads above which GET /ready answers 503 (--queue-high-water-percent of --max-queued-reads)." },
    Series { name: "decision_read_rate_tokens_per_second", kind: Kind::Gauge, help: "Prompt tokens per second the shards have been reading; admission estimates waits by it." },
    Series { name: "decision_reads_dropped_total", kind: Kind::Counter, help: "Reads dropped before compute because their request went away." },
    Series { name: "decision_prefix_cache_usage_ratio", kind: Kind::Gauge, help: "The shards' prefix cache: bytes held over its budget, after the last shard call (0 without a cache)." },
    Series { name: "decision_cache_config_info", kind: Kind::Gauge, help: "The prefix cache's configuration in labels (always 1): enabled, budget_bytes, rule, engine." },
    // Connections and media (http/connections.rs, media/)
    Series { name: "decision_http_connections_open", kind: Kind::Gauge, help: "Client connections held (bounded by --max-connections)." },
    Series { name: "decision_http_connections_closed_idle_total", kind: Kind::Counter, help: "Connections closed for idling past --keep-alive-timeout-secs." },
    Series { name: "decision_http_connections_closed_slow_total", kind: Kind::Counter, help: "Connections closed for a request head slower than --header-read-timeout-secs." },
    Series { name: "decision_media_items_total", kind: Kind::Counter, help: "Media items turned into bytes, by modality." },
    Series { name: "decision_media_fetch_failures_total", kind: Kind::Counter, help: "Failed or refused media URLs, by reason." },
];

/// The recorder for `SERIES`: explicit buckets for every histogram. None when another recorder is
/// installed already (the process has one, installed once: `http/state.rs`).
pub fn install() -> Option<PrometheusHandle> {
    let handle = builder().ok()?.install_recorder().ok()?;
    describe();
    Some(handle)
}

fn builder() -> Result<PrometheusBuilder, BuildError> {
    let mut builder = PrometheusBuilder::new();
    for series in SERIES {
        if let Kind::Histogram(buckets) = series.kind {
            builder = builder.set_buckets_for_metric(Matcher::Full(series.name.into()), buckets)?;
        }
    }
    Ok(builder)
}

/// The `# HELP` of every series (the exporter writes it with the series' first sample).
fn describe() {
    for series in SERIES {
        match series.kind {
            Kind::Counter => metrics::describe_counter!(series.name, series.help),
            Kind::Gauge => metrics::describe_gauge!(series.name, series.help),
            Kind::Histogram(_) => metrics::describe_histogram!(series.name, series.help),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_counters_end_in_total() {
        let mut seen = std::collections::HashSet::new();
        for series in SERIES {
            assert!(seen.insert(series.name), "{} twice", series.name);
            assert!(series.name.starts_with("decision_"), "{}", series.name);
            assert_eq!(
                series.kind == Kind::Counter,
                series.name.ends_with("_total"),
                "{}: counters, and only counters, end in _total",
                series.name
            );
            assert!(
                !series.help.is_empty() && series.help.ends_with('.'),
                "{}",
                series.name
            );
        }
    }

    #[test]
    fn buckets_rise_strictly() {
        for series in SERIES {
            if let Kind::Histogram(buckets) = series.kind {
                assert!(!buckets.is_empty(), "{}", series.name);
                assert!(
                    buckets.windows(2).all(|w| w[0] < w[1]),
                    "{}: {buckets:?}",
                    series.name
                );
            }
        }
        assert!(builder().is_ok());
    }

    /// docs/metrics.md is the reference: every series in the table has a row there, and every
    /// `decision_…` name the page's tables list is a series.
    #[test]
    fn the_metrics_reference_lists_exactly_these_series() {
        let page = include_str!("../../docs/metrics.md");
        let mut listed = std::collections::BTreeSet::new();
        for line in page.lines().filter(|l| l.starts_with("| `decision_")) {
            let cell = line.split('|').nth(1).unwrap_or_default();
            for name in cell.split('`').skip(1).step_by(2) {
                listed.insert(name.split('{').next().unwrap_or_default().to_owned());
            }
        }
        let table: std::collections::BTreeSet<String> =
            SERIES.iter().map(|s| s.name.to_owned()).collect();
        assert_eq!(listed, table);
        for series in SERIES {
            let row = page
                .lines()
                .find(|l| {
                    l.split('|').nth(1).is_some_and(|c| {
                        c.contains(&format!("`{}`", series.name))
                            || c.contains(&format!("`{}{{", series.name))
                    })
                })
                .unwrap_or_else(|| panic!("no row for {}", series.name));
            let kind = row.split('|').nth(2).unwrap_or_default();
            assert!(
                kind.contains(series.kind.type_name()),
                "{}: the page says {kind}",
                series.name
            );
        }
    }
}
