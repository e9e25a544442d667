"""What the demo agent watches: the watchdog's API (audit log, alerts, gateway) and the vLLM processes the
watchdog launched (its process-mode state file and /proc). Each phase's timings are kept in a `Phase`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

POLL = 0.5


@dataclass
class Phase:
    """What one phase did and saw; times are unix seconds."""

    name: str
    expect: str
    ok: bool = False
    detail: str = ""
    fault_at: float = 0.0
    alert_pending_at: float | None = None
    alert_firing_at: float | None = None
    action_started_at: float | None = None
    action_finished_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def timings(self) -> str:
        """fault -> alert firing -> action start -> action done, as offsets from the fault."""

        def off(t: float | None) -> str:
            return "-" if t is None else f"+{t - self.fault_at:.1f}s"

        return (
            f"after the fault: alert pending {off(self.alert_pending_at)}, "
            f"firing {off(self.alert_firing_at)}, "
            f"action started {off(self.action_started_at)}, done {off(self.action_finished_at)}"
        )


class Observer:
    """Reads the watchdog's API and finds the vLLM processes it launched."""

    def __init__(self, client: httpx.AsyncClient, api: str, state_dir: Path) -> None:
        self.client = client
        self.api = api.rstrip("/")
        self.state_dir = state_dir
        self._holds: dict[str, float] | None = None  # alertname -> the rule's `for`, in seconds

    async def history(self) -> list[dict[str, Any]]:
        """The newest audit rows."""
        resp = await self.client.get(self.api + "/api/v1/actions", params={"limit": "50"}, timeout=5)
        rows: list[dict[str, Any]] = resp.json()["data"]["history"]
        return rows

    async def gateway_status(self) -> dict[str, Any]:
        """GET /api/v1/gateway."""
        data: dict[str, Any] = (await self.client.get(self.api + "/api/v1/gateway", timeout=5)).json()["data"]
        return data

    async def wait_action(
        self,
        phase: Phase,
        alertname: str,
        match: Callable[[dict[str, Any]], bool],
        deadline: float,
        *,
        done: bool = True,
    ) -> dict[str, Any] | None:
        """Poll until an audit row started after the fault matches (and has finished, if `done`); note when
        the alert was first seen pending and firing. None at the deadline."""
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                await self._note_alert(phase, alertname)
                for row in await self.history():
                    if row["started_at"] < phase.fault_at - 1 or not match(row):
                        continue
                    if row["outcome"] == "skipped" or (done and row["outcome"] == "running"):
                        continue
                    return row
            await asyncio.sleep(POLL)
        return None

    async def _note_alert(self, phase: Phase, alertname: str) -> None:
        """The alert's times as the watchdog has them: activeAt (pending), plus the rule's `for` (firing)."""
        if self._holds is None:
            rules = (await self.client.get(self.api + "/api/v1/rules", timeout=5)).json()["data"]["groups"]
            self._holds = {r["name"]: float(r.get("duration", 0)) for g in rules for r in g["rules"]}
        resp = await self.client.get(self.api + "/api/v1/alerts", timeout=5)
        for a in resp.json()["data"]["alerts"]:
            active = _rfc3339(a.get("activeAt", ""))
            if a["labels"].get("alertname") != alertname or active is None or active < phase.fault_at - 1:
                continue
            if phase.alert_firing_at is None:
                phase.alert_pending_at = active  # the activation that fires (an earlier one may have lapsed)
            if a["state"] == "firing" and phase.alert_firing_at is None:
                phase.alert_firing_at = active + self._holds.get(alertname, 0.0)

    def record(self, phase: Phase, row: dict[str, Any] | None, what: str) -> bool:
        """Copy the action's times into the phase; False (with the reason) if it is missing or failed."""
        if row is None:
            phase.detail = f"no {what} action before the deadline"
            return False
        phase.action_started_at = row["started_at"]
        phase.action_finished_at = row["finished_at"]
        phase.extra["action"] = {k: row[k] for k in ("action", "type", "trigger", "outcome", "reason")}
        if row["outcome"] != "succeeded":
            phase.detail = f"{row['action']} {row['outcome']}: {row['reason']}"
            return False
        return True

    def server_pid(self) -> int:
        """The pid of the vLLM API server the watchdog launched (its process-mode state file)."""
        state = json.loads((self.state_dir / "process-vllm-0.json").read_text())
        return int(state["child"]["pid"])

    def server_args(self) -> list[str]:
        """The running API server's argv."""
        raw = Path(f"/proc/{self.server_pid()}/cmdline").read_bytes()
        return [a.decode() for a in raw.split(b"\0") if a]

    def engine_core(self) -> int | None:
        """The EngineCore process: in the API server's session, process title VLLM::EngineCore."""
        sid = self.server_pid()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if int(fields[3]) == sid and cmdline.startswith(b"VLLM::EngineCore"):
                return int(entry.name)
        return None


def _rfc3339(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
