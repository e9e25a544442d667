"""`vllm-watchdog incident list|show ID`: the incident bundles of the config's state_dir, read from disk (the
daemon need not run), each shown as a readable summary with its action's outcome from the audit log."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import TextIO

from ..actions.incidents.bundle import BundleError, Bundles
from ..actions.incidents.summary import FRAMES, LOG_LINES, summary
from ..actions.records import ActionRecord
from ..actions.state import ACTIONS_DB, ActionStore
from ..config.model import Config
from ..exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE


def _outcome(state_dir: str, action_id: object) -> ActionRecord | None:
    """The audit row of the incident's action, if the audit log is there (never created here)."""
    path = os.path.join(state_dir, ACTIONS_DB)
    if not isinstance(action_id, int) or not os.path.isfile(path):
        return None
    store = ActionStore(path)
    try:
        return store.by_id(action_id)
    finally:
        store.close()


def run_incident(
    config: Config,
    verb: str,
    incident_id: str | None,
    out: TextIO,
    err: TextIO,
    *,
    frames: int = FRAMES,
    lines: int = LOG_LINES,
) -> int:
    """List the bundles, or show one; 0, 1 when it cannot be read, 2 on a usage error."""
    if config.state_dir is None:
        print(
            "vllm-watchdog incident: the config has no state_dir: incidents live in state_dir/incidents",
            file=err,
        )
        return EXIT_USAGE
    bundles = Bundles(config.state_dir)
    if verb == "list":
        return _list(bundles, out, err)
    if not incident_id:
        print("vllm-watchdog incident show: which incident? (see `vllm-watchdog incident list`)", file=err)
        return EXIT_USAGE
    try:
        files = bundles.read(incident_id)
    except BundleError as exc:
        print(f"vllm-watchdog incident: {exc}", file=err)
        return EXIT_FAILED
    try:
        action_id = (bundles.manifest(incident_id).get("action") or {}).get("action_id")
    except BundleError:
        action_id = None  # the summary says what is wrong with the manifest
    out.write(summary(files, _outcome(config.state_dir, action_id), frames=frames, log_lines=lines))
    out.write(f"\nbundle: {bundles.info(incident_id).path}\n")
    return EXIT_OK


def _list(bundles: Bundles, out: TextIO, err: TextIO) -> int:
    found = bundles.list()
    if not found:
        print(f"no incidents in {bundles.dir}", file=err)
        return EXIT_OK
    print(f"{'ID':<44} {'WHEN (UTC)':<20} {'TARGET':<16} {'ACTION':<18} {'ALERT':<24} SIZE", file=out)
    for info in found:
        try:
            doc = bundles.manifest(info.id)
        except BundleError as exc:
            print(f"{info.id:<44} unreadable: {exc}", file=out)
            continue
        when = datetime.fromtimestamp(float(doc.get("created_at") or info.mtime), timezone.utc)
        action = doc.get("action") or {}
        print(
            f"{info.id:<44} {when:%Y-%m-%d %H:%M:%S}  {(doc.get('target') or {}).get('name', '?'):<16} "
            f"{action.get('name', '?'):<18} {(doc.get('alert') or {}).get('alertname', '-'):<24} "
            f"{info.size // 1024} KiB",
            file=out,
        )
    return EXIT_OK
