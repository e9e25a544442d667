"""The watchdog dashboard: alerts, actions, gateway admission, per-session signals, target health.

`job` and `instance` select the watchdog (its own series: actions, gateway, rule evaluation). Per-target
series (vllm_watchdog_target_up, _health_up, _canary_success, ...) carry the target's job and instance when
Prometheus scrapes the watchdog with honor_labels: true, as deploy/prometheus.yml does, so those panels and
the alert panels (ALERTS carries the alert's labels) are not filtered by the watchdog's job and instance.
"""

from __future__ import annotations

from panels import (
    Board,
    Json,
    action_annotation,
    actions_new,
    bars,
    dashboard,
    dashed,
    hist,
    q,
    rate,
    series,
    stat,
    table,
    thresholds,
    timeline,
    values,
    variable,
)
from rulefiles import alert_regex, threshold

W = 'job=~"$job", instance=~"$instance"'
ACTIONS = f"vllm_watchdog_actions_total{{{W}}}"
ORANGE_FROM_1 = thresholds((1, "orange"))
OUTCOMES = "succeeded, failed, rolled_back, skipped, would_do, refused"
BUNDLED = f'alertname=~"{alert_regex()}"'  # the alerts of the bundled rule files, nothing else
RESPONSES = "vllm_watchdog_gateway_responses_total"
LAST_CHECK = "vllm_watchdog_known_answer_last_check_timestamp_seconds"


def _now(b: Board) -> None:
    b.row("Now")
    for title, state in (("Firing alerts", "firing"), ("Pending alerts", "pending")):
        count = [q(f'count(ALERTS{{{BUNDLED}, alertstate="{state}"}}) or vector(0)')]
        b.add(
            stat(title, f"Alerts of the bundled rules that are {state}.", count, thresholds=ORANGE_FROM_1),
            4,
            4,
        )
    total = [q(f"sum({ACTIONS}) or vector(0)")]
    b.add(
        stat(
            "Actions (since start)", "Actions run or refused since the watchdog started.", total, no_value="0"
        ),
        4,
        4,
    )
    down = [q("count(vllm_watchdog_target_up == 0) or vector(0)")]
    b.add(
        stat("Targets down", "Targets whose last scrape failed.", down, thresholds=thresholds((1, "red"))),
        4,
        4,
    )
    flight = [
        q(f"sum(vllm_watchdog_gateway_in_flight{{{W}}})", "in flight"),
        q(f"sum(vllm_watchdog_gateway_limit{{{W}}})", "cap"),
    ]
    b.add(
        stat("Gateway in flight / cap", "Requests forwarded now, and the cap the throttle sets.", flight),
        4,
        4,
    )
    mode = [
        q(f"max(vllm_watchdog_paused{{{W}}})", "paused"),
        q(f"max(vllm_watchdog_dry_run{{{W}}})", "dry run"),
    ]
    desc = "1 in maintenance mode (no actions) / when actions only log what they would do."
    b.add(stat("Paused / dry run", desc, mode, thresholds=ORANGE_FROM_1), 4, 4)


def _alerts_actions(b: Board) -> None:
    b.row("Alerts and actions")
    firing, pending = (f'ALERTS{{{BUNDLED}, alertstate="{s}"}}' for s in ("firing", "pending"))
    states = [q(f"max by (alertname) ({firing} * 2 or {pending})", "{{alertname}}")]
    lanes = values((1, "pending", "yellow"), (2, "firing", "red"))
    desc = (
        "Pending and firing alerts of the bundled rules: the watchdog's, and Prometheus' own where it "
        "evaluates the same rules."
    )
    b.add(timeline("Alert states", desc, states, lanes, no_value="no active alerts"), 14)
    active = [q(f"ALERTS_FOR_STATE{{{BUNDLED}}} * 1000", table=True)]
    hide = {"Time": True}
    organize = {
        "id": "organize",
        "options": {"excludeByName": hide, "renameByName": {"Value": "active since"}},
    }
    desc = "Every pending or firing alert of the bundled rules and when it became active."
    b.add(table("Active alerts", desc, active, "dateTimeFromNow", organize), 10)
    taken = [q(f"sum by (action, outcome) ({actions_new(W, '$__rate_interval')})", "{{action}} {{outcome}}")]
    desc = f"Actions per interval by outcome ({OUTCOMES}); the annotations mark them too."
    b.add(series("Actions taken", desc, taken, bars=True, no_value="no actions"), 10)
    outcomes = [
        q(
            f"sum by (action, target, outcome) ({ACTIONS})",
            "{{action}} on {{target}}: {{outcome}}",
            instant=True,
        )
    ]
    b.add(
        bars(
            "Action outcomes (since start)", "Outcomes of every action since the watchdog started.", outcomes
        ),
        7,
    )
    rails = [
        q(f"vllm_watchdog_action_budget_remaining{{{W}}}", "budget {{action}} on {{target}}"),
        q(f"count(vllm_watchdog_action_running{{{W}}}) or vector(0)", "running"),
        q(f"count(vllm_watchdog_drained{{{W}}}) or vector(0)", "drained targets"),
    ]
    desc = "Actions left in each max_per_window budget, actions running, targets drained."
    b.add(series("Rails", desc, rails), 7)


def _gateway(b: Board) -> None:
    b.row("Gateway admission")
    adm = [q(rate("vllm_watchdog_gateway_admitted_total", W, "target, priority"), "{{target}} {{priority}}")]
    b.add(series("Admitted/s by priority", "Requests let through to vLLM.", adm, "reqps"), 8)
    rej = [q(rate("vllm_watchdog_gateway_rejected_total", W, "target, reason"), "{{target}} {{reason}}")]
    desc = "Requests refused: queue full or timed out, session limits, breakers, drains."
    b.add(series("Rejected/s by reason", desc, rej, "reqps"), 8)
    cap = [
        q(f"vllm_watchdog_gateway_in_flight{{{W}}}", "in flight {{target}}"),
        q(f"vllm_watchdog_gateway_limit{{{W}}}", "cap {{target}}"),
        q(f"vllm_watchdog_gateway_limit_ceiling{{{W}}}", "ceiling {{target}}"),
        q(f"sum by (target) (vllm_watchdog_gateway_queue_length{{{W}}})", "queued {{target}}"),
    ]
    desc = "Forwarded requests, the (throttled) cap, its configured ceiling and the gateway's queue."
    b.add(series("In flight against the cap", desc, cap, overrides=[dashed("^(cap|ceiling) .*")]), 8)
    wait = hist("vllm_watchdog_gateway_queue_time_seconds", W, "target, le")
    slow = threshold("GatewayQueueBackedUp", "vllm_watchdog_gateway_queue_time_seconds_bucket")
    desc = "Arrival to admission at the gateway. Red line: GatewayQueueBackedUp's threshold (on the p90)."
    b.add(series("Gateway queue time", desc, wait, "s", line=slow), 8)
    ttfb = hist("vllm_watchdog_gateway_time_to_first_byte_seconds", W, "target, le")
    desc = "Admission to vLLM's first response byte, as the gateway sees it."
    b.add(series("Time to first byte", desc, ttfb, "s"), 8)
    codes = [
        q(rate("vllm_watchdog_gateway_responses_total", W, "target, code"), "{{target}} HTTP {{code}}"),
        q(rate("vllm_watchdog_gateway_upstream_errors_total", W, "target, kind"), "{{target}} {{kind}}"),
        q(rate("vllm_watchdog_gateway_upstream_backoffs_total", W, "target"), "{{target}} cap cut on a 503"),
    ]
    desc = (
        "Responses by status code, forwarding failures by kind, and how often the gateway lowered its cap "
        "because vLLM answered 503 (its own admission limits)."
    )
    b.add(series("Responses/s and upstream errors", desc, codes, "reqps"), 8)
    oldest = [q(f"max by (target) (vllm_watchdog_gateway_oldest_in_flight_seconds{{{W}}})", "{{target}}")]
    stuck = threshold("GatewayRequestStuck", "vllm_watchdog_gateway_oldest_in_flight_seconds")
    desc = (
        "Age of the oldest forwarded request: a hung engine shows here while /health is still 200. "
        "Red line: GatewayRequestStuck's threshold."
    )
    b.add(series("Oldest in-flight request", desc, oldest, "s", line=stuck), 8)
    total = rate(RESPONSES, W, "target")
    errors = rate(RESPONSES, W + ', code=~"5..", code!="503"', "target")
    share = [q(f"({errors} or {total} * 0) / {total}", "{{target}}")]
    bad = threshold("GatewayServerErrors", RESPONSES)
    desc = (
        "Share of the gateway's responses that were 5xx, 503 (its own drain answer) left out. "
        "Red line: GatewayServerErrors' threshold."
    )
    b.add(series("Gateway 5xx ratio", desc, share, "percentunit", min=0, line=bad), 8)
    drain = [q(f"vllm_watchdog_gateway_draining{{{W}}}", "{{target}}")]
    lanes = values((0, "serving", "green"), (1, "draining", "orange"))
    desc = "Whether the gateway holds or rejects new requests for a drain."
    b.add(timeline("Draining", desc, drain, lanes), 8)


def _sessions(b: Board) -> None:
    b.row("Sessions (the top K by traffic; the rest summed as other)")
    requests = rate("vllm_watchdog_gateway_session_requests_total", W, "target, session")
    b.add(
        series(
            "Requests/s by session", "Requests started per second.", [q(requests, "{{session}}")], "reqps"
        ),
        8,
    )
    flight = [q(f"vllm_watchdog_gateway_session_in_flight{{{W}}}", "{{session}}")]
    b.add(series("In flight by session", "Requests in flight per session.", flight), 8)
    tokens = [
        q(
            rate("vllm_watchdog_gateway_session_prompt_tokens_total", W, "target, session"),
            "prompt {{session}}",
        ),
        q(
            rate("vllm_watchdog_gateway_session_completion_tokens_total", W, "target, session"),
            "completion {{session}}",
        ),
    ]
    desc = "Prompt and completion tokens per second, from the responses' usage."
    b.add(series("Tokens/s by session", desc, tokens), 8)
    hits = [q(f"vllm_watchdog_gateway_session_prefix_cache_hit_ratio{{{W}}}", "{{session}}")]
    desc = "Cached over prompt tokens across each session's recent requests."
    b.add(series("Prefix-cache hit ratio by session", desc, hits, "percentunit", min=0, max=1), 8)
    growth = [q(f"vllm_watchdog_gateway_session_context_growth_tokens{{{W}}}", "{{session}}")]
    desc = "Mean growth of the prompt per agent step: a runaway context climbs."
    b.add(series("Context growth per step", desc, growth), 8)
    loops = [q(f"vllm_watchdog_gateway_session_tool_call_repeats{{{W}}}", "{{session}}")]
    desc = "Most repeats of one tool call (name and arguments) in a session's recent calls: a loop climbs."
    b.add(series("Tool-call repeats", desc, loops), 8)
    tracked = [
        q(f"vllm_watchdog_gateway_sessions_tracked{{{W}}}", "tracked {{target}}"),
        q(f"sum by (target) (vllm_watchdog_gateway_session_breaker_open{{{W}}})", "breakers open {{target}}"),
    ]
    desc = "Sessions the gateway remembers, and those a throttle_session breaker cuts off."
    b.add(series("Sessions tracked and breakers open", desc, tracked), 12)
    top = [
        q(
            f"sum by (session) (vllm_watchdog_gateway_session_requests_total{{{W}}})",
            "{{session}}",
            instant=True,
        )
    ]
    b.add(bars("Requests by session (since start)", "The top sessions by requests, and other.", top), 12)


def _answers(b: Board) -> None:
    """The known-answer check (per target, with the target's job and instance: not filtered by W) and the
    quarantine it can lead to (the watchdog's own series)."""
    b.row("Known answers")
    ok = [q("vllm_watchdog_known_answer_ok", "{{target}}")]
    lanes = values((0, "DIVERGED", "red"), (1, "ok", "green"))
    desc = (
        "The known-answer check's verdict per target: fixed prompts scored against the baseline learnt from "
        "the healthy model (absent while it is learnt). VLLMAnswersDiverged fires on DIVERGED."
    )
    b.add(timeline("Known answers", desc, ok, lanes, no_value="no verdict yet (learning)"), 8)
    gap = [
        q("vllm_watchdog_known_answer_divergence", "divergence {{target}}"),
        q("vllm_watchdog_known_answer_tolerance", "tolerance {{target}}"),
    ]
    desc = (
        "Largest change of a reference token's logprob from the baseline, in nats, and the tolerance above "
        "which the answers are wrong (dashed; auto: 4 x the noise measured while learning)."
    )
    b.add(series("Divergence against tolerance", desc, gap, min=0, overrides=[dashed("^tolerance .*")]), 8)
    quarantined = [q(f"count(vllm_watchdog_target_quarantined{{{W}}} == 1) or vector(0)")]
    desc = (
        "Targets kept drained because their answers stayed wrong after a restart "
        "(VLLMWatchdogTargetQuarantined pages); no action restarts them until a person looks."
    )
    b.add(stat("Quarantined targets", desc, quarantined, thresholds=thresholds((1, "red"))), 8)
    age = [q(f"time() - {LAST_CHECK}", "{{target}}")]
    late = threshold("VLLMAnswersUnchecked", LAST_CHECK)
    desc = (
        "Seconds since the last check that probed the target (none while it is paused or asleep). "
        "Red line: VLLMAnswersUnchecked's threshold."
    )
    b.add(series("Since the last check", desc, age, "s", min=0, line=late), 8)
    cost = [
        q(f"60 * {rate('vllm_watchdog_known_answer_tokens_total', '', 'target')}", "tokens/min {{target}}"),
        q(rate("vllm_watchdog_known_answer_checks_total", "", "target, outcome"), "{{outcome}}/s {{target}}"),
    ]
    desc = (
        "Tokens the probes cost per minute (integrity.max_tokens_per_minute caps them), and checks per "
        "second by outcome (skipped: over the budget)."
    )
    b.add(series("Known-answer probe cost", desc, cost), 8)
    mismatches = [q("vllm_watchdog_known_answer_greedy_mismatches", "{{target}}")]
    desc = "Prompts whose greedy tokens changed where the baseline had a clear margin (no near tie)."
    b.add(series("Greedy mismatches", desc, mismatches, min=0), 8)


def _self(b: Board) -> None:
    b.row("Targets and the watchdog itself")
    target = "{{job}} {{instance}}"
    up = [q("vllm_watchdog_target_up", target)]
    desc = "1 if the watchdog's last scrape of the target succeeded."
    b.add(series("Scrape up", desc, up, min=0, max=1), 8)
    probes = [
        q("vllm_watchdog_health_up", "health {{instance}}"),
        q("vllm_watchdog_canary_success", "canary {{instance}}"),
    ]
    desc = "1 if /health answered 200 / if the canary completion produced a token."
    b.add(series("/health and canary", desc, probes, min=0, max=1), 8)
    latency = [
        q("vllm_watchdog_health_latency_seconds", "health {{instance}}"),
        q("vllm_watchdog_canary_latency_seconds", "canary {{instance}}"),
    ]
    b.add(
        series("Probe latency", "Latency of the last /health probe and canary completion.", latency, "s"), 8
    )
    took = [q("vllm_watchdog_scrape_duration_seconds", target)]
    b.add(series("Scrape duration", "How long the last scrape of each target took.", took, "s"), 8)
    errors = [
        q(
            rate("vllm_watchdog_scrape_errors_total", "", "job, instance, kind"),
            "{{job}} {{instance}} {{kind}}",
        )
    ]
    b.add(series("Scrape errors/s", "Failed scrapes by kind.", errors, no_value="no scrape errors"), 8)
    evals = [
        q(rate("vllm_watchdog_rule_group_evaluations_total", W, "rule_group"), "evaluations {{rule_group}}"),
        q(rate("vllm_watchdog_rule_evaluation_failures_total", W, "rule_group"), "failures {{rule_group}}"),
    ]
    b.add(series("Rule evaluations/s", "Rule-group evaluations and failed rule evaluations.", evals), 8)
    notes = [
        q(f"vllm_watchdog_notifications_queued{{{W}}}", "queued {{notifier}}"),
        q(rate("vllm_watchdog_notifications_sent_total", W, "notifier"), "sent/s {{notifier}}"),
        q(rate("vllm_watchdog_notifications_failed_total", W, "notifier"), "failed/s {{notifier}}"),
        q(rate("vllm_watchdog_notifications_dropped_total", W, "notifier"), "dropped/s {{notifier}}"),
    ]
    desc = "Notification queue and deliveries, per notifier."
    b.add(series("Notifications", desc, notes, no_value="no notifiers"), 8)
    reload = [q(f"vllm_watchdog_config_last_reload_successful{{{W}}}", "{{instance}}")]
    lanes = values((0, "failed", "red"), (1, "ok", "green"))
    b.add(timeline("Config reload", "Whether the last config reload (SIGHUP) succeeded.", reload, lanes), 16)


def watchdog() -> Json:
    """The whole dashboard."""
    b = Board()
    _now(b)
    _alerts_actions(b)
    _gateway(b)
    _sessions(b)
    _answers(b)
    _self(b)
    variables = [
        variable("job", "vllm_watchdog_build_info", "job"),
        variable("instance", "vllm_watchdog_build_info", "instance", 'job=~"$job"'),
    ]
    desc = (
        "vllm-watchdog: alerts, actions, gateway admission, per-session signals, known answers, target "
        "health."
    )
    return dashboard("vllm-watchdog", "vllm-watchdog", desc, b, variables, [action_annotation(W)])
