"""`vllm-watchdog incident list|show ID`: the incident bundles of the config's state_dir, read from disk (the
daemon need not run), each shown as a readable summary with its action's outcome from the audit log.

A bundle that cannot be read is listed with the reason and never stops the list; whatever a bundle holds is
printed through `summary.shown`, so no escape sequence in it reaches the terminal."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import TextIO

from ..actions.incidents.bundle import MANIFEST, BundleError, Bundles, load_json
from ..actions.incidents.summary import FRAMES, LOG_LINES, SUMMARY_FILES, headline, summary
from ..actions.store.actionstore import ACTIONS_DB, ActionStore
from ..actions.store.records import ActionRecord
from ..config.model import Config
from ..exitcodes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from ..safetext import shown


def _outcome(state_dir: str, action_id: int | None) -> ActionRecord | None:
    """The audit row of the incident's action, if the audit log is there (never created here)."""
    path = os.path.join(state_dir, ACTIONS_DB)
    if action_id is None or not os.path.isfile(path):
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
        files = bundles.read(incident_id, SUMMARY_FILES)
    except BundleError as exc:
        print(shown(f"vllm-watchdog incident: {exc}"), file=err)
        return EXIT_FAILED
    try:
        doc = load_json(files.get(MANIFEST, b"null"))
    except ValueError:
        doc = None  # the summary says what is wrong with the manifest
    action_id = headline(doc).action_id if isinstance(doc, dict) else None
    out.write(summary(files, _outcome(config.state_dir, action_id), frames=frames, log_lines=lines))
    out.write(f"\nbundle: {shown(bundles.info(incident_id).path)}\n")
    return EXIT_OK


def _list(bundles: Bundles, out: TextIO, err: TextIO) -> int:
    found = bundles.list()
    if not found:
        print(f"no incidents in {bundles.dir}", file=err)
        return EXIT_OK
    print(f"{'ID':<44} {'WHEN (UTC)':<20} {'TARGET':<16} {'ACTION':<18} {'ALERT':<24} SIZE", file=out)
    for info in found:  # an id is letters, digits and `_.-` (valid_id): printable as it is
        try:
            head = headline(bundles.manifest(info.id))
        except BundleError as exc:
            print(shown(f"{info.id:<44} unreadable: {exc}"), file=out)
            continue
        when = datetime.fromtimestamp(head.created_at or info.mtime, timezone.utc)
        print(
            shown(
                f"{info.id:<44} {when:%Y-%m-%d %H:%M:%S}  {head.target or '?':<16} {head.action or '?':<18} "
                f"{head.alertname or '-':<24} {info.size // 1024} KiB"
            ),
            file=out,
        )
    return EXIT_OK
