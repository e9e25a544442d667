"""The one line `systemctl status` shows for the daemon (sd_notify STATUS=): targets up, alerts firing,
actions running."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..ruler.alerting import AlertState
from ..ruler.evaluation import RuleEvaluation
from ..sources.monitor import Monitor
from .actionplane import ActionPlane

MAX_NAMED = 3  # names listed per part; more are counted


def _named(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_NAMED])
    return shown + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")


def status_line(up: Mapping[str, bool], firing: Sequence[str], running: Mapping[str, str]) -> str:
    """`3/4 targets up (down: vllm-2); 2 alerts firing (VLLMEngineHung, ...); 1 action running (restart on
    vllm-2)`, from each target's `up`, the names of the firing alerts and target -> running action."""
    down = [name for name, ok in up.items() if not ok]
    parts = [f"{len(up) - len(down)}/{len(up)} targets up" + (f" (down: {_named(down)})" if down else "")]
    names = sorted(set(firing))
    parts.append(f"{len(firing)} alerts firing" + (f" ({_named(names)})" if names else ""))
    acts = [f"{action} on {target}" for target, action in sorted(running.items())]
    parts.append(f"{len(acts)} actions running" + (f" ({_named(acts)})" if acts else ""))
    return "; ".join(parts)


def daemon_status(monitor: Monitor, evaluation: RuleEvaluation, actions: ActionPlane) -> str:
    """The status line of a running daemon."""
    up = {name: rt.scrape.status.up for name, rt in monitor.targets.items()}
    firing = [
        rule.name for rule, alert in evaluation.manager.active_alerts() if alert.state == AlertState.FIRING
    ]
    running = {target: job.action.name for target, job in actions.remediator.current.items()}
    return status_line(up, firing, running)
