"""One incident per disruptive action: collected from the moment its audit row is written, waited for (at
most the budget) before the first step that stops or changes the server, written to a bundle while the action
goes on, and named in the audit row, the action events and GET /api/v1/incidents.

A collection that fails, hangs or cannot write its bundle never holds the action back: each part's outcome is
in the bundle's manifest, and a bundle that could not be written is named in the audit row instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ... import __version__
from ...config.model import Config
from ...redact import Redactor, config_secrets
from ...store import SampleStore
from ..pipeline.decisions import Job
from ..pipeline.router import target_of
from ..runtimes.runtime import Runtime
from . import collectors
from .bundle import MANIFEST, Bundles, new_id
from .parts import Collection, PartResult, Sleep
from .stacks import find_py_spy

log = logging.getLogger(__name__)
MAX_FIRING = 50


def _no_store() -> SampleStore | None:
    return None


def _no_alerts() -> Sequence[Mapping[str, Any]]:
    return ()


@dataclass(frozen=True)
class RecorderOptions:
    """What an IncidentRecorder reads besides the config: the sample store, the alerts firing now (as GET
    /api/v1/alerts shows them), NVML, the tools it runs, /proc, and the clocks."""

    store: Callable[[], SampleStore | None] = _no_store
    firing: Callable[[], Sequence[Mapping[str, Any]]] = _no_alerts
    nvml: Any | None = None
    dmesg: tuple[str, ...] = ("dmesg",)
    driver_dir: str = "/proc/driver/nvidia"  # there when the NVIDIA driver is loaded
    proc: str = "/proc"
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Sleep = asyncio.sleep


class Incident:
    """One incident being collected: `evidence()` before the first disruptive step, `close()` at the end."""

    def __init__(
        self,
        incident_id: str,
        collected: asyncio.Task[None],
        written: asyncio.Future[str],
        options: RecorderOptions,
        deadline: float,
    ) -> None:
        self.id = incident_id
        self._collected = collected
        self._written = written
        self._options = options
        self.deadline = deadline  # on options.monotonic: the budget's end, counted from the incident's start

    async def evidence(self) -> None:
        """Wait until the collection is over, and never past the budget's end (a collection still wrapping up
        then goes on without the action); never raises."""
        left = self.deadline - self._options.monotonic()
        if left <= 0 or self._collected.done():
            return
        timer = asyncio.ensure_future(self._options.sleep(left))
        try:
            await asyncio.wait({self._collected, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()

    async def close(self) -> dict[str, object]:
        """Wait for the bundle to be written; the audit row's details: the id, and why no bundle if none."""
        await asyncio.wait({self._collected})
        await asyncio.wait({self._written})
        problem = self._written.result()
        return {"incident": self.id, **({"incident_error": problem} if problem else {})}


class IncidentRecorder:
    """Collects and keeps incident bundles in state_dir/incidents per the config's `incidents:`."""

    def __init__(self, config: Config, options: RecorderOptions) -> None:
        self.options = options
        self.collection = Collection(options.sleep, options.monotonic)
        self.config = config
        self.redactor = Redactor.of(config_secrets(config))
        self.bundles: Bundles | None = None
        self._writes: set[asyncio.Task[str]] = set()  # bundles being written
        self.apply(config)

    def apply(self, config: Config) -> None:
        """Adopt a reloaded config (budget, retention, secrets to mask)."""
        self.config = config
        self.redactor = Redactor.of(config_secrets(config))
        inc = config.incidents
        self.bundles = Bundles(config.state_dir, inc.keep, inc.max_bytes) if config.state_dir else None

    def wanted(self, job: Job) -> bool:
        """Whether this action gets an incident: enabled, a state_dir, and a kind that collects_evidence (a
        restart, relaunch or power change), not the restore after its alert resolved."""
        return (
            self.config.incidents.enabled
            and self.bundles is not None
            and job.action.traits.collects_evidence
            and not job.restore
        )

    def open(self, job: Job, plan: str, action_id: int, runtime: Runtime | None) -> Incident:
        """Start collecting for the action whose audit row is `action_id`; returns at once."""
        assert self.bundles is not None
        now, inc = self.options.clock(), self.config.incidents
        incident_id = new_id(now, job.target.name, action_id)
        src = collectors.Sources(
            target=job.target,
            runtime=runtime,
            store=self.options.store(),
            nvml=self.options.nvml,
            redactor=self.redactor,
            py_spy=find_py_spy(inc.py_spy),
            log_lines=inc.log_lines,
            metrics_window=inc.metrics_window,
            gpu_host=collectors.gpu_host(self.config.gpus.nvml, job.target, self.options.driver_dir),
            now=now,
            dmesg=self.options.dmesg,
            proc=self.options.proc,
        )
        head = {
            "id": incident_id,
            "created_at": now,
            "created": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
            "watchdog_version": __version__,
            "target": {"name": job.target.name, "url": job.target.url, "mode": job.target.mode},
            "action": {
                "name": job.action.name,
                "type": job.action.type,
                "trigger": job.trigger,
                "action_id": action_id,
                "plan": plan,
            },
            "alert": dict(job.labels),
            "firing": self._firing(job),
            "budget": inc.budget,
        }
        written: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        deadline = self.options.monotonic() + inc.budget
        collected = asyncio.ensure_future(self._collect(src, head, written, self.bundles))
        return Incident(incident_id, collected, written, self.options, deadline)

    def _firing(self, job: Job) -> list[dict[str, Any]]:
        """The alerts firing now about the action's target (as /api/v1/alerts shows them), bounded."""
        try:
            alerts = list(self.options.firing())
        except Exception:  # a failing view of the rules must not stop the action
            log.exception("reading the firing alerts for an incident failed")
            return []
        out = []
        for alert in alerts:
            about = target_of(alert.get("labels") or {}, self.config.targets)
            if alert.get("state") != "firing" or about is None or about.name != job.target.name:
                continue
            out.append(dict(alert))
            if len(out) >= MAX_FIRING:
                break
        return out

    async def _collect(
        self, src: collectors.Sources, head: dict[str, Any], written: asyncio.Future[str], bundles: Bundles
    ) -> None:
        """Run the parts, then start writing the bundle; `written` always gets an answer."""
        try:
            budget = float(head["budget"])
            began = self.options.monotonic()
            try:
                results = await self.collection.run(collectors.parts(src), budget)
            except Exception as exc:  # a bug in a collector: still no reason to hold the action
                log.exception("incident collection failed", extra={"incident": head["id"]})
                results = [PartResult("collection", "failed", 0.0, f"{type(exc).__name__}: {exc}")]
            took = self.options.monotonic() - began
            files: dict[str, bytes | Callable[[], bytes]] = {}
            for r in results:
                files.update(r.found.files)
                files.update(r.found.later)
            files[MANIFEST] = collectors.json_bytes(self.redactor.value(self._manifest(head, results, took)))
        except BaseException as exc:  # cancelled (the watchdog stops), or a bug: the action goes on
            written.set_result(f"no bundle: the collection ended with {type(exc).__name__}: {exc}")
            if not isinstance(exc, Exception):
                raise
            log.exception("incident bundle not assembled", extra={"incident": head["id"]})
            return
        task = asyncio.ensure_future(self._write(bundles, head["id"], files, float(head["created_at"])))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        task.add_done_callback(lambda t: _settle(t, written))
        log.warning(
            "incident collected",
            extra={
                "incident": head["id"],
                "target": head["target"]["name"],
                "seconds": round(took, 3),
                "parts": {r.name: r.status for r in results},
            },
        )

    def _manifest(self, head: dict[str, Any], results: list[PartResult], took: float) -> dict[str, Any]:
        facts = {r.name: dict(r.found.facts) for r in results}
        processes = facts.get("processes", {})
        return {
            **head,
            "collection_seconds": round(took, 3),
            "parts": [r.json() for r in results],
            "vllm": {"version": processes.get("vllm_version", ""), "command": processes.get("command", [])},
            "facts": {name: {k: v for k, v in f.items() if k != "command"} for name, f in facts.items() if f},
        }

    async def _write(
        self, bundles: Bundles, incident_id: str, files: dict[str, bytes | Callable[[], bytes]], mtime: float
    ) -> str:
        """Make the files left for later and write the bundle, in a worker thread; "" or why it could not be
        written."""
        try:
            info = await asyncio.to_thread(lambda: bundles.write(incident_id, _made(files), mtime))
        except (OSError, ValueError) as exc:
            log.error("incident bundle not written", extra={"incident": incident_id, "error": str(exc)})
            return f"bundle not written: {exc}"
        log.info(
            "incident bundle written", extra={"incident": incident_id, "path": info.path, "bytes": info.size}
        )
        return ""


def _made(files: dict[str, bytes | Callable[[], bytes]]) -> dict[str, bytes]:
    """The bundle's files, those left for later made now; one whose making fails is left out (logged)."""
    out = {}
    for name, data in files.items():
        if isinstance(data, bytes):
            out[name] = data
            continue
        try:
            out[name] = data()
        except Exception:  # a bug in one file's writer: keep the rest of the bundle
            log.exception("incident file not made", extra={"file": name})
    return out


def _settle(task: asyncio.Task[str], written: asyncio.Future[str]) -> None:
    """Pass the write's outcome on to whoever waits for the bundle."""
    if written.done():
        return
    if task.cancelled():
        written.set_result("the bundle write was cancelled (the watchdog is stopping)")
    elif (exc := task.exception()) is not None:
        written.set_result(f"bundle not written: {type(exc).__name__}: {exc}")
    else:
        written.set_result(task.result())
