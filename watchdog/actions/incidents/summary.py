"""An incident bundle as a person reads it: what fired, what was done, where each vLLM thread was (the
innermost frames of its stack), what the GPUs and the driver said, and the last lines of the log.

Everything shown comes from the bundle (already redacted when it was written) and, when the audit log is at
hand, the action's outcome. Malformed files are skipped with a note, never raised on: a bundle is evidence
from a bad moment, and a summary must still print what it can. Nothing in it reaches a terminal as it is: a
character a terminal would act on (an escape sequence, a C1 control, a bidi override) is shown as `?`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...safetext import shown
from ..store.records import ActionRecord
from .bundle import MANIFEST, load_json

FRAMES = 5
LOG_LINES = 20
KERNEL_LINES = 5
_MIB = 1024 * 1024
SUMMARY_FILES = (MANIFEST, "processes.json", "stacks.json", "gpu.json", "log.txt", "kernel.txt")
"""The files a summary reads: all but the metrics, the largest by far, which a read leaves in the bundle."""


_INT64 = 1 << 63  # an action id beyond SQLite's integers is no audit row (and would raise there)
_LAST_TIME = 253402300800.0  # 10000-01-01: a later created_at cannot be shown as a date


def _load(files: Mapping[str, bytes], name: str) -> Any:
    try:
        return load_json(files[name]) if name in files else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Headline:
    """What a list shows of one bundle, from its manifest: each field of its type, or None."""

    created_at: float | None = None
    target: str | None = None
    action: str | None = None
    type: str | None = None
    trigger: str | None = None
    action_id: int | None = None
    alertname: str | None = None
    parts: dict[str, str] = field(default_factory=dict)


def headline(doc: Mapping[str, Any]) -> Headline:
    """The listed fields of a manifest; a field of the wrong type is None, never an error."""
    action, target, alert = (_dict(doc.get(k)) for k in ("action", "target", "alert"))
    found = doc.get("parts")
    parts = [p for p in found if isinstance(p, dict)] if isinstance(found, list) else []
    return Headline(
        created_at=_float(doc.get("created_at"), _LAST_TIME),
        target=_text(target.get("name")),
        action=_text(action.get("name")),
        type=_text(action.get("type")),
        trigger=_text(action.get("trigger")),
        action_id=_int(action.get("action_id"), _INT64),
        alertname=_text(alert.get("alertname")),
        parts={str(p.get("name")): str(p.get("status")) for p in parts},
    )


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any, below: int) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < below
    return value if ok else None


def _float(value: Any, below: float) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < below
    return float(value) if ok else None


def summary(
    files: Mapping[str, bytes],
    outcome: ActionRecord | None = None,
    frames: int = FRAMES,
    log_lines: int = LOG_LINES,
) -> str:
    """The readable summary of a bundle's files (and the action's audit row, if known), safe on a terminal."""
    doc = _load(files, MANIFEST)
    if not isinstance(doc, dict):
        return f"no readable {MANIFEST} in this bundle\n"
    sections: list[tuple[str, Callable[[], list[str]]]] = [
        ("what fired", lambda: _head(doc)),
        ("what was done", lambda: _done(doc, outcome)),
        ("evidence", lambda: _parts(doc)),
        (
            "processes",
            lambda: _processes(_load(files, "processes.json"), _load(files, "stacks.json"), frames),
        ),
        ("GPUs", lambda: _gpus(_load(files, "gpu.json"), files.get("kernel.txt"))),
        ("log", lambda: _log(files.get("log.txt"), doc, log_lines)),
    ]
    lines: list[str] = []
    for name, section in sections:
        try:
            lines += section()
        except (AttributeError, TypeError, ValueError, KeyError, OverflowError) as exc:
            lines += ["", f"{name}: malformed in this bundle ({type(exc).__name__}: {str(exc)[:200]})"]
    return "\n".join(shown(line) for line in lines) + "\n"


def _labels(labels: Any) -> str:
    if not isinstance(labels, Mapping):
        return "{}"
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _head(doc: Mapping[str, Any]) -> list[str]:
    target = doc.get("target") or {}
    alert = doc.get("alert") or {}
    firing = [
        a.get("labels", {}).get("alertname", "?") for a in doc.get("firing") or [] if isinstance(a, dict)
    ]
    return [
        f"incident {doc.get('id', '?')}",
        f"  target {target.get('name', '?')} ({target.get('mode') or 'watch only'}), at {doc.get('created')}",
        "",
        "what fired",
        f"  {alert.get('alertname', '(no alertname)')} {_labels(alert)}",
        f"  firing about this target then: {', '.join(firing) or 'none known'}",
    ]


def _done(doc: Mapping[str, Any], outcome: ActionRecord | None) -> list[str]:
    action = doc.get("action") or {}
    out = [
        "",
        "what was done",
        f"  {action.get('name', '?')} ({action.get('type', '?')}, trigger {action.get('trigger', '?')},"
        f" audit row {action.get('action_id', '?')}): {action.get('plan', '')}",
    ]
    if outcome is not None:
        ended = f"{outcome.outcome}: {outcome.reason}" if outcome.reason else outcome.outcome
        out.append(f"  outcome: {ended}")
        out.append(f"  steps: {' > '.join(s.step for s in outcome.steps) or 'none'}")
    vllm = doc.get("vllm") or {}
    out.append(f"  vLLM {vllm.get('version') or 'version unknown'}")
    if vllm.get("command"):
        out.append(f"  command: {' '.join(str(a) for a in vllm['command'])[:2000]}")
    return out


def _parts(doc: Mapping[str, Any]) -> list[str]:
    out = [
        "",
        f"evidence (collected in {doc.get('collection_seconds', '?')}s, budget {doc.get('budget', '?')}s)",
    ]
    for part in doc.get("parts") or []:
        if isinstance(part, dict):
            why = f": {part['error']}" if part.get("error") else ""
            out.append(
                f"  {part.get('name', '?'):<10} {part.get('status', '?'):<8} {part.get('seconds', 0)}s{why}"
            )
    return out


def _short(path: str) -> str:
    for mark in ("site-packages/", "dist-packages/"):
        if mark in path:
            return path.split(mark, 1)[1]
    return path


def _by_pid(entries: Any) -> dict[int, dict[str, Any]]:
    if not isinstance(entries, list):
        return {}
    return {e["pid"]: e for e in entries if isinstance(e, dict) and isinstance(e.get("pid"), int)}


def _processes(facts: Any, stacks: Any, frames: int) -> list[str]:
    by_pid, threads_of = _by_pid(facts), _by_pid(stacks)
    if not by_pid and not threads_of:
        return []
    out = ["", "processes (each thread's innermost frames first)"]
    for pid in [*by_pid, *(p for p in threads_of if p not in by_pid)]:
        p = by_pid.get(pid, {})
        rss = f"{p['rss_bytes'] / _MIB:.0f} MiB" if isinstance(p.get("rss_bytes"), int) else "?"
        name = " ".join(str(a) for a in p.get("cmdline") or [])[:80] or p.get("name", "?")
        out.append(
            f"  pid {pid} {name}: {p.get('state', '?')}, wchan {p.get('wchan', '?')}, "
            f"{p.get('threads', '?')} threads, rss {rss}, {p.get('fds', '?')} fds"
        )
        stack = p.get("kernel_stack") or []
        if isinstance(stack, list) and stack:
            out.append(f"    kernel: {' < '.join(str(s).split(' ', 1)[-1] for s in stack[:3])}")
        out += _threads(threads_of.get(pid, {}), pid, frames)
    return out


def _threads(stacks: Mapping[str, Any], pid: int, frames: int) -> list[str]:
    if "error" in stacks:
        return [f"    no Python stacks: {stacks['error']}"]
    out, quiet = [], 0
    found = stacks.get("threads")
    threads = [t for t in found if isinstance(t, dict)] if isinstance(found, list) else []
    for thread in sorted(threads, key=lambda t: t.get("os_thread_id") != pid):  # the main thread first
        shown = [f for f in thread.get("frames") or [] if isinstance(f, dict)][:frames]
        if not shown:
            quiet += 1
            continue
        state = "active" if thread.get("active") else "idle"
        gil = ", holds the GIL" if thread.get("owns_gil") else ""
        out.append(f"    thread {thread.get('os_thread_id', '?')} {thread.get('name') or ''} ({state}{gil})")
        for f in shown:
            out.append(f"      {f.get('name', '?')} ({_short(str(f.get('file', '')))}:{f.get('line', '?')})")
    if quiet:
        out.append(f"    (+{quiet} threads without Python frames)")
    return out


def _gpus(snap: Any, kernel: bytes | None) -> list[str]:
    if not isinstance(snap, dict) and kernel is None:
        return []
    out = ["", "GPUs"]
    if isinstance(snap, dict):
        if snap.get("error"):
            out.append(f"  NVML: {snap['error']}")
        xids = snap.get("last_xid") or {}
        for g in snap.get("gpus") or []:
            if isinstance(g, dict):
                out.append("  " + _gpu_line(g, xids.get(str(g.get("index")))))
    if kernel is not None:
        lines = kernel.decode(errors="replace").splitlines()
        out.append(f"  kernel log: {len(lines)} NVIDIA driver lines")
        out += [f"    {line}" for line in lines[-KERNEL_LINES:]]
    return out


def _gpu_line(g: Mapping[str, Any], xid: object) -> str:
    reasons = (g.get("clock_event_reasons") or {}).get("names")
    ecc = (g.get("ecc") or {}).get("volatile") or {}
    rows = g.get("remapped_rows") or {}
    pages = g.get("retired_pages") or {}
    errors = g.get("errors") or {}
    parts = [
        f"gpu {g.get('index')} {g.get('name', '')}",
        f"{g.get('temperature_c', '?')} C",
        f"{g.get('power_w', '?')}/{g.get('power_limit_w', '?')} W",
        f"P{g.get('pstate', '?')}",
        f"sm {(g.get('clocks_mhz') or {}).get('sm', '?')} MHz",
        f"clock reasons: {', '.join(reasons) if reasons else 'none'}",
        f"ECC (volatile) {ecc.get('corrected', '?')} corrected/{ecc.get('uncorrected', '?')} uncorrected",
        f"remapped rows {rows.get('corrected', '?')}/{rows.get('uncorrected', '?')}"
        + (" pending" if rows.get("pending") else "")
        + (" FAILED" if rows.get("failure") else ""),
        f"retired pages {pages.get('single_bit_ecc', '?')}/{pages.get('double_bit_ecc', '?')}"
        if pages
        else f"retired pages: {errors.get('retired_pages', '?')}",
        f"last XID {xid if xid is not None else 'none seen'}",
    ]
    if errors:
        parts.append(f"refused: {', '.join(sorted(errors))}")
    return "; ".join(parts)


def _log(log: bytes | None, doc: Mapping[str, Any], count: int) -> list[str]:
    if log is None:
        return []
    lines = log.decode(errors="replace").splitlines()
    source = ((doc.get("facts") or {}).get("log") or {}).get("source", "")
    shown = lines[-count:] if count else []
    out = ["", f"log (last {len(shown)} of {len(lines)} lines kept{f', from {source}' if source else ''})"]
    return out + [f"  {line}" for line in shown]
