"""The vLLM serving dashboard: throughput, latency quantiles, scheduler queue, caches, spec decoding."""

from __future__ import annotations

from panels import (
    Board,
    Json,
    action_annotation,
    dashboard,
    hist,
    q,
    rate,
    ratio,
    series,
    stat,
    thresholds,
    variable,
)

S = 'job=~"$job", instance=~"$instance", model_name=~"$model_name"'
SPEC_OFF = "no drafts (speculative decoding off?)"
HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
LATENCIES = (
    ("Time to first token", "vllm:time_to_first_token_seconds", "Arrival to the first output token (TTFT)."),
    ("Inter-token latency", "vllm:inter_token_latency_seconds", "Time between two output tokens (ITL)."),
    ("End-to-end latency", "vllm:e2e_request_latency_seconds", "Arrival to the last output token."),
    ("Queue time", "vllm:request_queue_time_seconds", "Time spent waiting in vLLM's scheduler queue."),
)


def _now(b: Board) -> None:
    b.row("Now")
    running = [q(f"sum(vllm:num_requests_running{{{S}}})")]
    b.add(stat("Running", "Requests in the engine's batch.", running), 4, 4)
    waiting = [q(f"sum(vllm:num_requests_waiting{{{S}}})")]
    steps = thresholds((5, "yellow"), (20, "red"))
    b.add(stat("Waiting", "Requests queued in vLLM's scheduler.", waiting, thresholds=steps), 4, 4)
    kv = [q(f"max(vllm:kv_cache_usage_perc{{{S}}})")]
    steps = thresholds((0.8, "yellow"), (0.95, "red"))
    b.add(stat("KV cache (fullest)", "Highest KV-cache usage.", kv, "percentunit", thresholds=steps), 4, 4)
    gen = [q(rate("vllm:generation_tokens_total", S, "job"))]
    b.add(stat("Generated tokens/s", "Output tokens per second, all selected engines.", gen), 4, 4)
    hits = [q(ratio(*HITS, S, "job"))]
    b.add(
        stat("Prefix-cache hit rate", "Prompt tokens served from the prefix cache.", hits, "percentunit"),
        4,
        4,
    )
    acc = [q(ratio(ACCEPTED, "vllm:spec_decode_num_draft_tokens_total", S, "job"))]
    desc = "Accepted over proposed draft tokens."
    b.add(stat("Draft acceptance", desc, acc, "percentunit", no_value=SPEC_OFF), 4, 4)


def _throughput(b: Board) -> None:
    b.row("Throughput")
    tokens = [
        q(rate("vllm:prompt_tokens_total", S, "instance"), "prompt {{instance}}"),
        q(rate("vllm:generation_tokens_total", S, "instance"), "generation {{instance}}"),
    ]
    b.add(series("Tokens/s", "Prompt (prefill) and generated tokens per second.", tokens), 12)
    done = [
        q(
            rate("vllm:request_success_total", S, "instance, finished_reason"),
            "{{finished_reason}} {{instance}}",
        )
    ]
    desc = "Requests finished per second, by why they finished (stop, length, abort, error)."
    b.add(series("Finished requests/s", desc, done, "reqps"), 12)
    b.row("Latency (p50 / p90 / p99 over the selected engines)")
    for title, metric, desc in LATENCIES:
        b.add(series(title, desc, hist(metric, S), "s"), 6)


def _scheduler(b: Board) -> None:
    b.row("Scheduler and caches")
    queue = [
        q(f"sum by (instance) (vllm:num_requests_running{{{S}}})", "running {{instance}}"),
        q(f"sum by (instance) (vllm:num_requests_waiting{{{S}}})", "waiting {{instance}}"),
    ]
    b.add(series("Requests running / waiting", "The batch and the scheduler queue.", queue), 6)
    kv = [q(f"max by (instance) (vllm:kv_cache_usage_perc{{{S}}})", "{{instance}}")]
    b.add(series("KV cache usage", "Share of KV-cache blocks in use.", kv, "percentunit", min=0, max=1), 6)
    hits = [q(ratio(*HITS, S, "instance"), "{{instance}}")]
    desc = "Prefix-cache hits over queried prompt tokens."
    b.add(series("Prefix-cache hit rate", desc, hits, "percentunit", min=0, max=1), 6)
    pre = [q(rate("vllm:num_preemptions_total", S, "instance"), "{{instance}}")]
    desc = "Requests evicted from the batch to free KV cache (recomputed later)."
    b.add(series("Preemptions/s", desc, pre), 6)


def _admission(b: Board) -> None:
    b.row("Admission (vLLM's own queue limits and why requests wait)")
    rej = [q(rate("vllm:admission_rejections_total", S, "instance, reason"), "{{reason}} {{instance}}")]
    desc = (
        "Requests vLLM refused with 503 at its own limits (--max-num-queued-reqs, --max-num-queued-tokens); "
        "0 without them. The gateway lowers its cap on each (vllm_watchdog_gateway_upstream_backoffs_total)."
    )
    b.add(series("Admission rejections/s", desc, rej, "reqps"), 12)
    waiting = [
        q(
            f"sum by (instance, reason) (vllm:num_requests_waiting_by_reason{{{S}}})",
            "{{reason}} {{instance}}",
        )
    ]
    desc = (
        "Waiting requests by reason: capacity (the batch or KV cache is full: VLLMQueueSaturated counts "
        "these) or deferred (a LoRA budget, a KV transfer)."
    )
    b.add(series("Waiting by reason", desc, waiting), 12)


def _speculative(b: Board) -> None:
    b.row("Speculative decoding")
    acc = [q(ratio(ACCEPTED, "vllm:spec_decode_num_draft_tokens_total", S, "instance"), "{{instance}}")]
    desc = "Accepted over proposed draft tokens."
    b.add(series("Draft acceptance rate", desc, acc, "percentunit", min=0, max=1, no_value=SPEC_OFF), 8)
    per_draft = ratio(ACCEPTED, "vllm:spec_decode_num_drafts_total", S, "instance")
    length = [q(f"1 + {per_draft}", "{{instance}}")]
    desc = "Tokens produced per verification step: 1 + accepted tokens per draft."
    b.add(series("Mean acceptance length", desc, length, no_value=SPEC_OFF), 8)
    accepted = rate("vllm:spec_decode_num_accepted_tokens_per_pos_total", S, "position")
    drafts = rate("vllm:spec_decode_num_drafts_total", S, "job")
    by_pos = [q(f"{accepted} / scalar(sum({drafts}))", "position {{position}}")]
    desc = "Share of drafts whose token at this position was accepted."
    b.add(
        series("Acceptance by draft position", desc, by_pos, "percentunit", min=0, max=1, no_value=SPEC_OFF),
        8,
    )


def serving() -> Json:
    """The whole dashboard."""
    b = Board()
    _now(b)
    _throughput(b)
    _scheduler(b)
    _admission(b)
    _speculative(b)
    variables = [
        variable("job", "vllm:num_requests_running", "job"),
        variable("instance", "vllm:num_requests_running", "instance", 'job=~"$job"'),
        variable(
            "model_name", "vllm:num_requests_running", "model_name", 'job=~"$job", instance=~"$instance"'
        ),
    ]
    desc = "vLLM serving: throughput, latency, scheduler queue, KV and prefix caches, speculative decoding."
    return dashboard("vllm-watchdog-serving", "vLLM serving", desc, b, variables, [action_annotation("")])
