"""GET /api/v1/incidents: the incident bundles in state_dir/incidents, newest first, and one by id with its
evidence and readable summary. Read-only and bounded: a list of at most MAX_LIST, files shown up to MAX_SHOWN
bytes each (the metrics file is left in the bundle: fetch the bundle itself for it), each bundle read within
its ReadLimits. A bundle that cannot be read is listed with an `error` and never fails the list."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..actions.incidents.bundle import MANIFEST, BundleError, Bundles, load_json, valid_id
from ..actions.incidents.summary import SUMMARY_FILES, headline, summary
from ..actions.pipeline.remediator import Remediator
from .control import error_response

DEFAULT_LIST = 50
MAX_LIST = 500
MAX_SHOWN = 1024 * 1024
_JSON_FILES = ("processes.json", "stacks.json", "gpu.json")
_TEXT_FILES = ("log.txt", "kernel.txt")


def incident_routes(remediator: Remediator, answer: Callable[[Any], Response]) -> list[Route]:
    """The two read-only routes; `answer` redacts and encodes (the app's)."""

    def bundles() -> Bundles | None:
        return remediator.incidents.bundles

    async def listing(request: Request) -> Response:
        try:
            limit = int(request.query_params.get("limit", DEFAULT_LIST))
        except ValueError:
            return error_response(400, "limit must be an integer")
        if not 1 <= limit <= MAX_LIST:
            return error_response(400, f"limit must be between 1 and {MAX_LIST}")
        found = bundles()
        entries = [] if found is None else await asyncio.to_thread(_list, found, limit)
        enabled = found is not None and remediator.config.incidents.enabled
        return answer({"status": "success", "data": {"enabled": enabled, "incidents": entries}})

    async def one(request: Request) -> Response:
        incident_id = request.path_params["incident_id"]
        found = bundles()
        if found is None or not valid_id(incident_id):
            return error_response(404, f"no incident {incident_id!r}")
        try:
            contents = await asyncio.to_thread(found.contents, incident_id, SUMMARY_FILES)
        except BundleError as exc:
            return error_response(404, str(exc))
        files = contents.files
        manifest = _json(files.get(MANIFEST), MANIFEST)
        action_id = headline(manifest).action_id if isinstance(manifest, dict) else None
        record = remediator.store.by_id(action_id) if action_id is not None else None
        data: dict[str, Any] = {
            "id": incident_id,
            "manifest": manifest,
            "files": dict(sorted(contents.sizes.items())),
            "outcome": None if record is None else {"outcome": record.outcome, "reason": record.reason},
            "summary": summary(files, record),
        }
        for name in _JSON_FILES:
            data[name.removesuffix(".json")] = _json(files.get(name), name)
        for name in _TEXT_FILES:
            raw = files.get(name)
            data[name.removesuffix(".txt")] = None if raw is None else _text(raw)
        return answer({"status": "success", "data": data})

    return [Route("/api/v1/incidents", listing), Route("/api/v1/incidents/{incident_id}", one)]


def _list(bundles: Bundles, limit: int) -> list[dict[str, Any]]:
    out = []
    for info in bundles.list()[:limit]:
        entry: dict[str, Any] = {"id": info.id, "bytes": info.size}
        try:
            doc = bundles.manifest(info.id)
        except BundleError as exc:
            out.append(entry | {"error": str(exc)})
            continue
        head = headline(doc)
        out.append(
            entry
            | {
                "created_at": head.created_at,
                "target": head.target,
                "action": head.action,
                "type": head.type,
                "trigger": head.trigger,
                "action_id": head.action_id,
                "alertname": head.alertname,
                "parts": head.parts,
            }
        )
    return out


def _json(raw: bytes | None, name: str) -> Any:
    if raw is None:
        return None
    if len(raw) > MAX_SHOWN:
        return {"error": f"{len(raw)} bytes: larger than the {MAX_SHOWN} shown here"}
    try:
        return load_json(raw, name=name)
    except ValueError as exc:
        return {"error": str(exc)[:300]}


def _text(raw: bytes) -> list[str]:
    """The lines of a text file; only its last MAX_SHOWN bytes (the newest lines) when it is longer."""
    lines = raw[-MAX_SHOWN:].decode(errors="replace").splitlines()
    return lines[1:] if len(raw) > MAX_SHOWN else lines
