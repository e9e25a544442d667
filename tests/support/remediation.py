"""Doubles for the remediator's tests: a scripted runtime that records calls, a readiness check, a hub that
collects what would be notified, an alert builder, a wait for the queues to drain, and the config they share."""

from __future__ import annotations

import asyncio
from typing import Any

from vllm_watchdog.actions.pipeline.remediator import Remediator
from vllm_watchdog.actions.runtimes.runtime import Launch
from vllm_watchdog.config.targets import TargetConfig
from vllm_watchdog.errors import ActionError
from vllm_watchdog.notifiers.alert import OutgoingAlert

SPEC = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}'
ARGS = (
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/m",
    "--speculative-config",
    SPEC,
    "--max-num-seqs",
    "4",
)
CONFIG = """
targets: [{name: vllm-0, url: "http://127.0.0.1:1", container: vllm-0}]
routes:
  - {match: {alertname: Hung}, actions: [restart]}
  - {match: {alertname: SpecBad}, actions: [draft_off]}
  - {match: {alertname: Hot}, actions: [smaller]}
actions:
  restart: {type: restart, cooldown: 15m, startup_grace: 0s, max_per_window: {count: 3, window: 6h}}
  draft_off: {type: disable_draft, startup_grace: 0s}
  draft_on: {type: enable_draft, startup_grace: 0s}
  smaller: {type: reconfigure, set: {--max-num-seqs: "1"}, restore_after: 10m, startup_grace: 0s, cooldown: 0s}
"""


class ScriptedRuntime:
    """Records every call; `ready_after_replace` False makes the replacement fail its ready check."""

    kind = "docker"

    def __init__(self, args: tuple[str, ...] = ARGS) -> None:
        self.target = "vllm-0"
        self.current = Launch("docker", args, {"image": "vllm:test"})
        self.previous: Launch | None = None
        self.calls: list[str] = []
        self.running = True
        self.fail_stop = False

    async def launch(self) -> Launch:
        return self.current

    async def is_running(self) -> bool:
        return self.running

    async def started_at(self) -> float | None:
        return 0.0

    async def stop(self, timeout: float) -> None:
        self.calls.append("stop")
        if self.fail_stop:
            raise ActionError("docker: stop failed: 500 Server Error")
        self.running = False

    async def start(self) -> None:
        self.calls.append("start")
        self.running = True

    async def replace(self, launch: Launch, stop_timeout: float) -> None:
        self.calls.append("replace")
        self.previous, self.current = self.current, launch

    async def has_previous(self) -> bool:
        return self.previous is not None

    async def commit(self) -> None:
        self.calls.append("commit")
        self.previous = None

    async def rollback(self, stop_timeout: float) -> None:
        self.calls.append("rollback")
        assert self.previous is not None
        self.current, self.previous = self.previous, None

    async def close(self) -> None:
        pass


class Ready:
    """Ready unless the current launch is in `broken` (by its args)."""

    def __init__(self, runtime: ScriptedRuntime) -> None:
        self.runtime = runtime
        self.broken: set[tuple[str, ...]] = set()

    async def wait(self, target: TargetConfig, timeout: float, alive: object = None) -> tuple[bool, str]:
        if self.runtime.current.args in self.broken:
            return False, f"not ready within {timeout:g}s (/health: connection refused)"
        return True, ""


class Hub:
    """Collects what would be notified."""

    def __init__(self) -> None:
        self.sent: list[OutgoingAlert] = []
        self.events: list[Any] = []

    def alerts(self, alerts: list[OutgoingAlert], now: float) -> None:
        self.sent.extend(alerts)

    def event(self, event: Any, now: float) -> None:
        self.events.append(event)


def alert(name: str, state: str = "firing", **labels: str) -> OutgoingAlert:
    return OutgoingAlert({"alertname": name, "instance": "vllm-0", **labels}, {}, state, 0.0, 0.0, 1.0)


async def settle(r: Remediator) -> None:
    for _ in range(200):
        if not any(q for q in r.queues.values()) and not r.current:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("queue did not drain")
