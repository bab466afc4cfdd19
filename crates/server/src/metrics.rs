//! Prometheus metrics under SGLang's names (`python/sglang/srt/metrics/collector.py`):
//! `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`,
//! `sglang:cache_hit_rate`, `sglang:gen_throughput`, `sglang:prompt_tokens_total`,
//! `sglang:generation_tokens_total`, `sglang:cached_tokens_total`, `sglang:num_requests_total`,
//! `sglang:time_to_first_token_seconds`, `sglang:inter_token_latency_seconds`,
//! `sglang:e2e_request_latency_seconds`, plus `sparrow:num_retractions_total`, `sparrow:num_prefill_chunks_total` and
//! `sparrow:radix_hit_tokens_total`; with speculative decoding `sglang:spec_accept_length`,
//! `sglang:spec_accept_rate` and the counters `sparrow:spec_verify_total`,
//! `sparrow:spec_draft_tokens_total`, `sparrow:spec_accepted_tokens_total`. Histogram
//! buckets are SGLang's.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sparrow_engine::scheduler::SchedulerStats;

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    /// Seconds from request arrival to the first token.
    pub ttft: Histogram,
    /// Seconds between consecutive tokens of one choice.
    pub itl: Histogram,
    /// Seconds from arrival to the end of a choice.
    pub e2e: Histogram,
    /// Generation requests received.
    pub requests: Counter,
    running: Gauge,
    queued: Gauge,
    token_usage: Gauge<f64, AtomicU64>,
    cache_hit_rate: Gauge<f64, AtomicU64>,
    gen_throughput: Gauge<f64, AtomicU64>,
    prompt_tokens: Counter,
    gen_tokens: Counter,
    cached_tokens: Counter,
    retractions: Counter,
    prefill_chunks: Counter,
    radix_hit_tokens: Counter,
    spec_accept_length: Gauge<f64, AtomicU64>,
    spec_accept_rate: Gauge<f64, AtomicU64>,
    spec_verify_ct: Counter,
    spec_draft_tokens: Counter,
    spec_accepted_tokens: Counter,
    /// HTTP connections being served (refusals past `--max-connections` not counted).
    pub open_connections: Gauge,
    /// Connections refused past `--max-connections` (answered 503 or closed unanswered).
    pub refused_connections: Counter,
    /// Requests refused with 503 on arrival because `--max-queued-requests` were waiting.
    pub queue_full: Counter,
    /// Those, plus the requests answered 503 in the engine for a full queue (displaced by a
    /// more urgent one, or not more urgent than any waiting one): the exported counter.
    queue_full_total: Counter,
    queue_timeouts: Counter,
    preemptions: Counter,
    storage_hit_tokens: Counter,
    storage_write_pages: Counter,
    storage_load_pages: Counter,
    storage_bad_blocks: Counter,
    storage_bytes: Gauge,
    /// Bytes of weights the model holds.
    pub weight_bytes: Gauge,
    /// Bytes of weights one token reads (a MoE model: its routed experts, not all).
    pub active_weight_bytes: Gauge,
    last_rate: Mutex<Option<(Instant, u64)>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let ttft = Histogram::new([
            0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 120.0, 160.0,
        ]);
        let itl = Histogram::new([
            0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.050, 0.075, 0.100, 0.150,
            0.200, 0.300, 0.400, 0.500, 0.750, 1.0, 2.0,
        ]);
        let e2e = Histogram::new([
            0.1, 0.2, 0.4, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 150.0, 200.0, 250.0, 300.0, 350.0,
            500.0, 1000.0,
        ]);
        let m = Metrics {
            ttft,
            itl,
            e2e,
            requests: Counter::default(),
            running: Gauge::default(),
            queued: Gauge::default(),
            token_usage: Gauge::default(),
            cache_hit_rate: Gauge::default(),
            gen_throughput: Gauge::default(),
            prompt_tokens: Counter::default(),
            gen_tokens: Counter::default(),
            cached_tokens: Counter::default(),
            retractions: Counter::default(),
            prefill_chunks: Counter::default(),
            radix_hit_tokens: Counter::default(),
            spec_accept_length: Gauge::default(),
            spec_accept_rate: Gauge::default(),
            spec_verify_ct: Counter::default(),
            spec_draft_tokens: Counter::default(),
            spec_accepted_tokens: Counter::default(),
            open_connections: Gauge::default(),
            refused_connections: Counter::default(),
            queue_full: Counter::default(),
            queue_full_total: Counter::default(),
            queue_timeouts: Counter::default(),
            preemptions: Counter::default(),
            storage_hit_tokens: Counter::default(),
            storage_write_pages: Counter::default(),
            storage_load_pages: Counter::default(),
            storage_bad_blocks: Counter::default(),
            storage_bytes: Gauge::default(),
            weight_bytes: Gauge::default(),
            active_weight_bytes: Gauge::default(),
            last_rate: Mutex::new(None),
            registry: Registry::default(),
        };
        registry.register("sglang:time_to_first_token_seconds", "Time to first token", m.ttft.clone());
        registry.register("sglang:inter_token_latency_seconds", "Time between tokens of one choice", m.itl.clone());
        registry.register(
            "sglang:e2e_request_latency_seconds",
            "Request latency, arrival to last token",
            m.e2e.clone(),
        );
        registry.register(
            "sglang:num_requests",
            "Requests received (each embedding input counts one)",
            m.requests.clone(),
        );
        registry.register("sglang:num_running_reqs", "Requests prefilling or decoding", m.running.clone());
        registry.register("sglang:num_queue_reqs", "Requests waiting for admission", m.queued.clone());
        registry.register("sglang:token_usage", "Fraction of KV pages in use", m.token_usage.clone());
        registry.register(
            "sglang:cache_hit_rate",
            "Prompt tokens served from the radix cache / prompt tokens",
            m.cache_hit_rate.clone(),
        );
        registry.register(
            "sglang:gen_throughput",
            "Generated tokens per second since the last scrape",
            m.gen_throughput.clone(),
        );
        registry.register("sglang:prompt_tokens", "Prompt tokens admitted", m.prompt_tokens.clone());
        registry.register("sglang:generation_tokens", "Tokens generated", m.gen_tokens.clone());
        // SGLang's name: a fleet's radix hit rate is the sum of these over its workers
        // divided by the sum of `prompt_tokens_total` (a ratio of gauges cannot be summed).
        registry.register(
            "sglang:cached_tokens",
            "Prompt tokens served from the radix cache (first admissions, as usage reports them)",
            m.cached_tokens.clone(),
        );
        registry.register("sparrow:num_retractions", "Requests retracted for lack of KV pages", m.retractions.clone());
        registry.register(
            "sparrow:num_prefill_chunks",
            "Prompt chunks that did not finish their prompt (chunked prefill)",
            m.prefill_chunks.clone(),
        );
        registry.register(
            "sparrow:radix_hit_tokens",
            "Tokens matched in the radix cache at admission, re-admissions included",
            m.radix_hit_tokens.clone(),
        );
        registry.register(
            "sglang:spec_accept_length",
            "Speculative decoding: tokens emitted per verify step (1 + accepted / verify steps), since start",
            m.spec_accept_length.clone(),
        );
        registry.register(
            "sglang:spec_accept_rate",
            "Speculative decoding: accepted / proposed draft tokens, since start",
            m.spec_accept_rate.clone(),
        );
        registry.register(
            "sparrow:spec_verify",
            "Speculative decoding: verify steps (decode forwards)",
            m.spec_verify_ct.clone(),
        );
        registry.register(
            "sparrow:spec_draft_tokens",
            "Speculative decoding: tokens proposed",
            m.spec_draft_tokens.clone(),
        );
        registry.register(
            "sparrow:spec_accepted_tokens",
            "Speculative decoding: proposed tokens accepted",
            m.spec_accepted_tokens.clone(),
        );
        registry.register(
            "sparrow:queue_full_rejections",
            "Requests answered 503 because --max-queued-requests waited (on arrival, or displaced by a more urgent one)",
            m.queue_full_total.clone(),
        );
        registry.register(
            "sparrow:queue_timeouts",
            "Requests answered 503 after waiting past --queue-timeout",
            m.queue_timeouts.clone(),
        );
        registry.register(
            "sparrow:priority_preemptions",
            "Running requests retracted for a more urgent one",
            m.preemptions.clone(),
        );
        registry.register(
            "sparrow:hicache_storage_hit_tokens",
            "Prompt tokens loaded from the hierarchical cache's file tier",
            m.storage_hit_tokens.clone(),
        );
        registry.register(
            "sparrow:hicache_storage_write_pages",
            "KV pages written to the file tier",
            m.storage_write_pages.clone(),
        );
        registry.register(
            "sparrow:hicache_storage_load_pages",
            "KV pages loaded back from the file tier",
            m.storage_load_pages.clone(),
        );
        registry.register(
            "sparrow:hicache_storage_bad_blocks",
            "File-tier blocks skipped: corrupt, truncated, another model or layout, unreadable",
            m.storage_bad_blocks.clone(),
        );
        registry.register("sparrow:hicache_storage_bytes", "Bytes held by the file tier", m.storage_bytes.clone());
        registry.register("sparrow:http_connections_open", "HTTP connections being served", m.open_connections.clone());
        registry.register(
            "sparrow:http_connections_refused",
            "HTTP connections refused past --max-connections",
            m.refused_connections.clone(),
        );
        registry.register("sparrow:weight_bytes", "Bytes of model weights held", m.weight_bytes.clone());
        registry.register(
            "sparrow:active_weight_bytes",
            "Bytes of model weights one token reads (MoE: the routed experts it is sent to)",
            m.active_weight_bytes.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Renders the text exposition format after refreshing engine-side values.
    pub fn render(&self, s: &SchedulerStats) -> String {
        self.running.set(s.num_running_reqs as i64);
        self.queued.set(s.num_queue_reqs as i64);
        let used = s.used_pages.saturating_sub(s.evictable_pages);
        self.token_usage.set(if s.total_pages > 0 { used as f64 / s.total_pages as f64 } else { 0.0 });
        self.cache_hit_rate.set(if s.prompt_tokens_total > 0 {
            s.cached_tokens_total as f64 / s.prompt_tokens_total as f64
        } else {
            0.0
        });
        catch_up(&self.prompt_tokens, s.prompt_tokens_total);
        catch_up(&self.gen_tokens, s.generation_tokens_total);
        catch_up(&self.cached_tokens, s.cached_tokens_total);
        catch_up(&self.retractions, s.num_retractions);
        catch_up(&self.prefill_chunks, s.num_prefill_chunks);
        catch_up(&self.radix_hit_tokens, s.radix_hit_tokens_total);
        catch_up(&self.queue_full_total, self.queue_full.get() + s.num_queue_full_aborts);
        catch_up(&self.queue_timeouts, s.num_queue_timeouts);
        catch_up(&self.preemptions, s.num_preemptions);
        catch_up(&self.storage_hit_tokens, s.storage_hit_tokens_total);
        catch_up(&self.storage_write_pages, s.storage_write_pages_total);
        catch_up(&self.storage_load_pages, s.storage_load_pages_total);
        catch_up(&self.storage_bad_blocks, s.storage_bad_blocks_total);
        self.storage_bytes.set(s.storage_bytes as i64);
        catch_up(&self.spec_verify_ct, s.spec_verify_ct_total);
        catch_up(&self.spec_draft_tokens, s.spec_draft_tokens_total);
        catch_up(&self.spec_accepted_tokens, s.spec_accepted_tokens_total);
        self.spec_accept_length.set(s.avg_spec_accept_length);
        self.spec_accept_rate.set(if s.spec_draft_tokens_total > 0 {
            s.spec_accepted_tokens_total as f64 / s.spec_draft_tokens_total as f64
        } else {
            0.0
        });
        if let Ok(mut last) = self.last_rate.lock() {
            let now = Instant::now();
            if let Some((t, n)) = *last {
                let dt = now.duration_since(t).as_secs_f64();
                if dt > 0.0 {
                    self.gen_throughput.set(s.generation_tokens_total.saturating_sub(n) as f64 / dt);
                }
            }
            *last = Some((now, s.generation_tokens_total));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

fn catch_up(c: &Counter, total: u64) {
    let now = c.get();
    if total > now {
        c.inc_by(total - now);
    }
}
