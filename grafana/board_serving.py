"""The vLLM serving dashboard: throughput, latency per instance, request lengths, scheduler queue, caches,
admission, speculative decoding. Threshold lines are the bundled rules' own numbers (rulefiles.py)."""

from __future__ import annotations

from panels import (
    Board,
    Json,
    action_annotation,
    dashboard,
    heatmap,
    hist,
    q,
    rate,
    ratio,
    series,
    stat,
    thresholds,
    variable,
)
from rulefiles import threshold

S = 'job=~"$job", instance=~"$instance", model_name=~"$model_name"'
SI = 'job=~"$job", instance=~"$instance"'  # series without model_name: up, vLLM's HTTP counters
SPEC_OFF = "no drafts (speculative decoding off?)"
NANS_OFF = "not counted (VLLM_COMPUTE_NANS_IN_LOGITS unset)"
FINISHED = "vllm:request_success_total"
HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
WAITING = threshold("VLLMQueueSaturated", "vllm:num_requests_waiting")
KV_FULL = threshold("VLLMKVCachePressure", "vllm:kv_cache_usage_perc")
LATENCIES = (
    (
        "Time to first token",
        "vllm:time_to_first_token_seconds",
        "Arrival to the first output token (TTFT).",
        "VLLMTimeToFirstTokenHigh",
    ),
    (
        "Inter-token latency",
        "vllm:inter_token_latency_seconds",
        "Time between two output tokens (ITL).",
        None,
    ),
    ("End-to-end latency", "vllm:e2e_request_latency_seconds", "Arrival to the last output token.", None),
    (
        "Queue time",
        "vllm:request_queue_time_seconds",
        "Time spent waiting in vLLM's scheduler queue.",
        "VLLMQueueTimeHigh",
    ),
)
# up of the vLLM jobs only: a job with "All" selected is any job, and the watchdog's and dcgm's are not vLLM.
UP = f"up{{{SI}}} and on (job) vllm:num_requests_running"


def line(alert: str, metric: str) -> tuple[float, str]:
    """An alert's threshold for a panel, and the sentence its description ends with."""
    return threshold(alert, metric), f" Red line: {alert}'s threshold (bundled rules)."


def http_5xx(by: str) -> str:
    """Share of vLLM's HTTP responses that were 5xx (prometheus-fastapi-instrumentator's status="5xx"), 0 when
    there were none."""
    total = rate("http_requests_total", SI, by)
    errors = rate("http_requests_total", SI + ', status="5xx"', by)
    return f"({errors} or {total} * 0) / {total}"


def _now(b: Board) -> None:
    b.row("Now")
    up = [q(f"sum({UP})", "up"), q(f"count({UP})", "of")]
    b.add(
        stat("Instances up", "vLLM instances Prometheus scrapes successfully, of those it scrapes.", up), 3, 4
    )
    running = [q(f"sum(vllm:num_requests_running{{{S}}})")]
    b.add(stat("Running", "Requests in the engine's batch.", running), 3, 4)
    waiting = [q(f"sum(vllm:num_requests_waiting{{{S}}})")]
    desc = f"Requests queued in vLLM's scheduler; red from VLLMQueueSaturated's threshold ({WAITING:g})."
    b.add(stat("Waiting", desc, waiting, thresholds=thresholds((WAITING, "red"))), 3, 4)
    kv = [q(f"max(vllm:kv_cache_usage_perc{{{S}}})")]
    desc = f"Highest KV-cache usage; red from VLLMKVCachePressure's threshold ({KV_FULL:.0%})."
    b.add(stat("KV cache (fullest)", desc, kv, "percentunit", thresholds=thresholds((KV_FULL, "red"))), 3, 4)
    gen = [q(rate("vllm:generation_tokens_total", S, "job"))]
    b.add(stat("Generated tokens/s", "Output tokens per second, all selected engines.", gen), 3, 4)
    hits = [q(ratio(*HITS, S, "job"))]
    desc = "Prompt tokens served from the prefix cache."
    b.add(stat("Prefix-cache hit rate", desc, hits, "percentunit"), 3, 4)
    acc = [q(ratio(ACCEPTED, "vllm:spec_decode_num_draft_tokens_total", S, "job"))]
    desc = "Accepted over proposed draft tokens."
    b.add(stat("Draft acceptance", desc, acc, "percentunit", no_value=SPEC_OFF), 3, 4)
    errors = [q(http_5xx("job"))]
    desc = "Share of vLLM's HTTP responses that were 5xx."
    b.add(stat("HTTP 5xx", desc, errors, "percentunit", no_value="no requests"), 3, 4)


def _throughput(b: Board) -> None:
    b.row("Throughput")
    tokens = [
        q(rate("vllm:prompt_tokens_total", S, "instance"), "prompt {{instance}}"),
        q(rate("vllm:generation_tokens_total", S, "instance"), "generation {{instance}}"),
    ]
    b.add(series("Tokens/s", "Prompt (prefill) and generated tokens per second.", tokens), 8)
    done = [
        q(
            rate("vllm:request_success_total", S, "instance, finished_reason"),
            "{{finished_reason}} {{instance}}",
        )
    ]
    desc = "Requests finished per second, by why they finished (stop, length, abort, error, repetition)."
    b.add(series("Finished requests/s", desc, done, "reqps"), 8)
    errors = [q(http_5xx("instance"), "{{instance}}")]
    desc = "Share of vLLM's HTTP responses that were 5xx, per instance (0 while all succeed)."
    b.add(series("HTTP 5xx ratio", desc, errors, "percentunit", min=0, no_value="no requests"), 8)
    b.row("Latency (p50 / p90 / p99 per instance)")
    for title, metric, desc, alert in LATENCIES:
        if alert is None:
            b.add(series(title, desc, hist(metric, S), "s"), 6)
        else:
            value, note = line(alert, metric + "_bucket")
            b.add(series(title, desc + note, hist(metric, S), "s", line=value), 6)


def _output(b: Board) -> None:
    """vLLM's own signals that its output is bad: engine errors, repetition finishes, NaN logits."""
    b.row("Output integrity")
    done = rate(FINISHED, S, "instance")
    for title, reason, alert, what in (
        ("Error finish ratio", "error", "VLLMRequestErrors", "ended in an engine error"),
        ("Repetition finish ratio", "repetition", "VLLMDegenerateOutput", "stopped on repetition detection"),
    ):
        some = rate(FINISHED, f'{S}, finished_reason="{reason}"', "instance")
        value, note = line(alert, FINISHED)
        desc = f"Share of finished requests that {what} (finished_reason={reason})." + note
        share = [q(f"({some} or {done} * 0) / {done}", "{{instance}}")]
        b.add(series(title, desc, share, "percentunit", min=0, line=value, no_value="no requests"), 8)
    nans = [q(rate("vllm:corrupted_requests_total", S, "instance"), "{{instance}}")]
    desc = (
        "Requests with NaNs in their logits per second: garbage output (VLLMCorruptedRequests). vLLM counts "
        "them only when it runs with VLLM_COMPUTE_NANS_IN_LOGITS=1."
    )
    b.add(series("NaN-logit requests/s", desc, nans, "reqps", no_value=NANS_OFF), 8)


def _requests(b: Board) -> None:
    b.row("Requests: lengths and phases")
    for title, metric, what in (
        ("Prompt length", "vllm:request_prompt_tokens", "prompt"),
        ("Generation length", "vllm:request_generation_tokens", "generated"),
    ):
        expr = f"sum by (le) (increase({metric}_bucket{{{S}}}[$__rate_interval]))"
        desc = f"Finished requests per interval by their {what} tokens (vLLM's histogram buckets)."
        b.add(heatmap(title, desc, expr, "short"), 8)
    phases = [
        q(
            ratio(
                f"vllm:request_{p}_time_seconds_sum", f"vllm:request_{p}_time_seconds_count", S, "instance"
            ),
            f"{p} {{{{instance}}}}",
        )
        for p in ("prefill", "decode")
    ]
    desc = "Mean time a request spent in prefill (its prompt) and in decode (its output tokens)."
    b.add(series("Prefill vs decode time", desc, phases, "s"), 8)


def _scheduler(b: Board) -> None:
    b.row("Scheduler and caches")
    queue = [
        q(f"sum by (instance) (vllm:num_requests_running{{{S}}})", "running {{instance}}"),
        q(f"sum by (instance) (vllm:num_requests_waiting{{{S}}})", "waiting {{instance}}"),
    ]
    _, note = line("VLLMQueueSaturated", "vllm:num_requests_waiting")
    desc = "The batch and the scheduler queue." + note
    b.add(series("Requests running / waiting", desc, queue, line=WAITING), 6)
    kv = [q(f"max by (instance) (vllm:kv_cache_usage_perc{{{S}}})", "{{instance}}")]
    _, note = line("VLLMKVCachePressure", "vllm:kv_cache_usage_perc")
    desc = "Share of KV-cache blocks in use." + note
    b.add(series("KV cache usage", desc, kv, "percentunit", min=0, max=1, line=KV_FULL), 6)
    hits = [q(ratio(*HITS, S, "instance"), "{{instance}}")]
    desc = "Prefix-cache hits over queried prompt tokens."
    b.add(series("Prefix-cache hit rate", desc, hits, "percentunit", min=0, max=1), 6)
    pre = [q(rate("vllm:num_preemptions_total", S, "instance"), "{{instance}}")]
    value, note = line("VLLMPreempting", "vllm:num_preemptions_total")
    desc = "Requests evicted from the batch to free KV cache (recomputed later)." + note
    b.add(series("Preemptions/s", desc, pre, line=value), 6)


def _admission(b: Board) -> None:
    b.row("Admission (vLLM's own queue limits and why requests wait)")
    rej = [q(rate("vllm:admission_rejections_total", S, "instance, reason"), "{{reason}} {{instance}}")]
    desc = (
        "Requests vLLM refused with 503 at its own limits (--max-num-queued-reqs, --max-num-queued-tokens); "
        "0 without them. The gateway lowers its cap on each (vllm_watchdog_gateway_upstream_backoffs_total)."
    )
    b.add(series("Admission rejections/s", desc, rej, "reqps"), 8)
    rejected = rate("vllm:admission_rejections_total", S, "instance")
    share = [
        q(f"{rejected} / ({rejected} + {rate('vllm:request_success_total', S, 'instance')})", "{{instance}}")
    ]
    value, note = line("VLLMRejecting", "vllm:admission_rejections_total")
    desc = "Rejected over rejected and finished requests." + note
    b.add(series("Admission rejection ratio", desc, share, "percentunit", min=0, line=value), 8)
    waiting = [
        q(
            f"sum by (instance, reason) (vllm:num_requests_waiting_by_reason{{{S}}})",
            "{{reason}} {{instance}}",
        )
    ]
    _, note = line("VLLMQueueSaturated", "vllm:num_requests_waiting_by_reason")
    desc = (
        "Waiting requests by reason: capacity (the batch or KV cache is full: VLLMQueueSaturated counts "
        "these) or deferred (a LoRA budget, a KV transfer)." + note
    )
    b.add(series("Waiting by reason", desc, waiting, line=WAITING), 8)


def _speculative(b: Board) -> None:
    b.row("Speculative decoding")
    acc = [q(ratio(ACCEPTED, "vllm:spec_decode_num_draft_tokens_total", S, "instance"), "{{instance}}")]
    value, note = line("VLLMSpecDecodeAcceptanceLow", "instance:vllm_spec_decode_acceptance_ratio:rate10m")
    desc = "Accepted over proposed draft tokens." + note
    b.add(
        series(
            "Draft acceptance rate", desc, acc, "percentunit", min=0, max=1, no_value=SPEC_OFF, line=value
        ),
        8,
    )
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
    _goodput(b)


def _goodput(b: Board) -> None:
    """The watchdog's estimate by batch size (vllm_watchdog_spec_*, docs/rules.md)."""
    no_estimate = "no estimate (no drafts, or one batch size seen so far)"
    speedup = [q(f"vllm_watchdog_spec_speedup{{{SI}}}", "batch {{batch_size}}, k={{k}} ({{instance}})")]
    desc = (
        "Estimated goodput with k draft tokens over none, per running batch size: E[tokens per step with k] "
        "times the step time without drafts over the step time with them, as this engine measured it."
    )
    b.add(series("Speculation speedup by batch size", desc, speedup, min=0, no_value=no_estimate), 8)
    ks = [
        q(f"vllm_watchdog_spec_best_k{{{SI}}}", "best {{batch_size}} ({{instance}})"),
        q(f"vllm_watchdog_spec_current_k{{{SI}}}", "running {{batch_size}} ({{instance}})"),
    ]
    desc = "Draft tokens per batch size: the schedule the measurements call for, and what runs now."
    b.add(series("Draft tokens by batch size", desc, ks, min=0, no_value=no_estimate), 8)
    gain = [q(f"vllm_watchdog_spec_schedule_gain{{{SI}}}", "{{schedule}} ({{instance}})")]
    value, note = line("VLLMSpecDecodeScheduleMistuned", "vllm_watchdog_spec_schedule_gain")
    desc = "Estimated goodput of that schedule over what runs now." + note
    b.add(series("Schedule gain", desc, gain, min=0, no_value=no_estimate, line=value), 8)


def serving() -> Json:
    """The whole dashboard."""
    b = Board()
    _now(b)
    _throughput(b)
    _output(b)
    _requests(b)
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
    desc = (
        "vLLM serving: throughput, latency, request lengths, scheduler queue, KV and prefix caches, "
        "admission, speculative decoding."
    )
    return dashboard("vllm-watchdog-serving", "vLLM serving", desc, b, variables, [action_annotation("")])
