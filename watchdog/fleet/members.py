"""The group's members as they registered themselves in etcd: their targets, firing alerts and running
actions, for `vllm-watchdog fleet`. A member's key is written by that member only; its contents are shown,
never trusted for a decision (the slots decide), and every field is bounded when it is shown."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..safetext import shown
from .etcd import EtcdClient

MAX_MEMBERS = 4096
MAX_SHOWN = 200  # characters of one cell


async def read_members(client: EtcdClient, prefix: bytes) -> list[dict[str, Any]]:
    """Every registered member of the group under `prefix` (its `members/` keys), by name."""
    found = await client.get_prefix(prefix + b"members/", limit=MAX_MEMBERS)
    out = []
    for kv in found.kvs:
        try:
            doc = json.loads(kv.value)
        except ValueError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        doc.setdefault("member", kv.key.rsplit(b"/", 1)[-1].decode("utf-8", "replace"))
        out.append(doc)
    return sorted(out, key=lambda d: str(d.get("member")))


def cell(value: Any) -> str:
    """A published value as one printable table cell, at most MAX_SHOWN characters."""
    if isinstance(value, Mapping):
        text = ", ".join(f"{k}: {cell(v)}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0])))
    elif isinstance(value, Sequence) and not isinstance(value, str):
        text = ", ".join(cell(v) for v in value)
    else:
        text = str(value)
    text = shown(text, keep="")
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"


def format_members(group: str, members: Sequence[Mapping[str, Any]]) -> str:
    """A table: member, targets, firing alerts, running and waiting actions."""
    rows = [("MEMBER", "TARGETS", "FIRING ALERTS", "RUNNING", "WAITING FOR A SLOT")]
    for m in members:
        rows.append(
            (
                cell(m.get("member", "?")),
                cell(m.get("targets", []) or "-"),
                cell(m.get("alerts", []) or "-"),
                cell(m.get("running", {}) or "-"),
                cell(m.get("waiting", {}) or "-"),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"group {group}: {len(members)} live member{'s' if len(members) != 1 else ''}"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines) + "\n"
