"""Phases (f)-(i) of bench/isolation.py, their goals and their table.

Each phase is a disturbance run for the window's length by bench/_isolation_window.measure: (f) and (g)/(h)
as processes of their own (bench/_attack_api.py, bench/_attack_gateway.py) so that the bench's legitimate
requests do not share a Python interpreter with the attack; (i) by switching the hostile target on.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from _isolation_window import Context, Disturbance, measure

HERE = Path(__file__).resolve().parent
GOAL_SCRAPES = 0.95
GOAL_FIRE_SLACK = 1.0  # seconds later than undisturbed
GOAL_RSS_MIB = 1024.0
GOAL_ADDED_P99 = 2.5  # ms, as phases (a)-(d)
P99_SLACK = 1.0  # ms: "unchanged" is under the goal or within this of the undisturbed window (a busy machine)
NONREADERS = 80


OTHER_USER = 65534  # nobody: where the bench runs as root, attacks come from another local user
SYSTEM_PYTHON = "/usr/bin/python3"  # the attackers use the standard library only: any Python 3 runs them


def attacker_user() -> tuple[int | None, str]:
    """(uid to run attacks as, interpreter): another user where the bench may switch to one, else ours."""
    if os.geteuid() == 0 and Path(SYSTEM_PYTHON).exists():
        return OTHER_USER, SYSTEM_PYTHON
    return None, sys.executable


class Attack:
    """An attacker process bounded by its own deadline; killed if it overruns it by `grace` seconds. Its
    JSON (stdout) goes to `out`, its stderr to out's .log; `hostile` ones run as attacker_user()."""

    def __init__(self, argv: list[str], out: Path, seconds: float, hostile: bool = True) -> None:
        self.out, self.limit = out, seconds + 45.0
        user, python = attacker_user() if hostile else (None, sys.executable)
        self.uid = os.geteuid() if user is None else user
        with out.open("wb") as stdout, out.with_suffix(".log").open("wb") as log:
            self.proc = subprocess.Popen(
                [python, *argv], stdout=stdout, stderr=log, start_new_session=True, user=user, cwd="/"
            )

    def finish(self) -> dict[str, Any]:
        """Wait for it to end (or kill it); what it wrote."""
        try:
            self.proc.wait(timeout=self.limit)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            return {"error": f"killed after {self.limit:.0f} s"}
        try:
            result: dict[str, Any] = json.loads(self.out.read_text())
            result["uid"] = self.uid
        except (OSError, ValueError):
            tail = self.out.with_suffix(".log").read_text(errors="replace")[-500:]
            return {"error": f"exit {self.proc.returncode}: {tail}"}
        return result


class Together:
    """Several disturbances as one."""

    def __init__(self, parts: dict[str, Disturbance]) -> None:
        self.parts = parts

    def finish(self) -> dict[str, Any]:
        """Finish each; their results merged, each part's `uid` as NAME_uid."""
        out: dict[str, Any] = {}
        for name, part in self.parts.items():
            out |= {(f"{name}_{k}" if k == "uid" else k): v for k, v in part.finish().items()}
        return out


class HostileTarget:
    """Phase (i): the hostile target is switched on for the window."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        httpx.get(self.base + "/bench/arm", timeout=30)

    def finish(self) -> dict[str, Any]:
        """Switch it off; what it served."""
        stats: dict[str, Any] = httpx.get(self.base + "/bench/disarm", timeout=60).json()
        return stats


def phase_f(ctx: Context, tmp: Path, seconds: float, trickles: int) -> dict[str, Any]:
    """(f) the worst query mix, without a token, beside a second (polite) client of another user."""
    script, api = str(HERE / "_attack_api.py"), str(ctx.daemon.api)

    def start() -> Disturbance:
        hostile = Attack([script, "attack", api, str(seconds), str(trickles)], tmp / "attack-f.json", seconds)
        polite = Attack([script, "polite", api, str(seconds)], tmp / "polite-f.json", seconds, hostile=False)
        return Together({"attack": hostile, "polite": polite})

    return measure(ctx, "(f) worst query mix on the API", seconds, start)


def phase_g(ctx: Context, tmp: Path, seconds: float) -> dict[str, Any]:
    """(g) streaming gateway clients that never read."""
    out = tmp / "attack-g.json"
    gw = str(ctx.daemon.gw)
    argv = [str(HERE / "_attack_gateway.py"), "nonreaders", gw, str(seconds), str(NONREADERS)]
    label = f"(g) {NONREADERS} non-reading gateway streams"
    return measure(ctx, label, seconds, lambda: Attack(argv, out, seconds))


def phase_h(ctx: Context, tmp: Path, seconds: float, clients: int) -> dict[str, Any]:
    """(h) concurrent 16 MiB bodies to the gateway."""
    out = tmp / "attack-h.json"
    gw = str(ctx.daemon.gw)
    argv = [str(HERE / "_attack_gateway.py"), "bodies", gw, str(seconds), str(clients)]
    return measure(
        ctx, f"(h) {clients} concurrent 16 MiB bodies", seconds, lambda: Attack(argv, out, seconds)
    )


def phase_i(ctx: Context, seconds: float, hostile: int) -> dict[str, Any]:
    """(i) one target of the 100 turns hostile."""

    def arm() -> Disturbance:
        return HostileTarget(hostile)

    return measure(ctx, "(i) a hostile target among the 100", seconds, arm)


# -- goals ----------------------------------------------------------------------------------------
def goals(row: dict[str, Any], baseline: dict[str, Any] | None) -> list[tuple[str, str, bool]]:
    """(goal, measured, met) for one window row, against the undisturbed window."""
    base_fire = (baseline or {}).get("fire_delay_s")
    fire = row.get("fire_delay_s")
    fire_ok = fire is not None and base_fire is not None and fire <= base_fire + GOAL_FIRE_SLACK
    fire_text = "no cycle" if fire is None else "never" if math.isinf(fire) else f"{fire:.2f} s"
    base_text = "-" if base_fire is None else f"{base_fire:.2f} s"
    p99, rss_d, rss_g = row["added_p99_ms"], row["daemon_pss_peak_mib"], row["gateway_rss_peak_mib"]
    base_p99 = (baseline or {}).get("added_p99_ms", float("nan"))
    p99_bound = max(GOAL_ADDED_P99, base_p99 + P99_SLACK) if not math.isnan(base_p99) else GOAL_ADDED_P99
    return [
        ("scrapes on schedule >= 95%", f"{row.get('scrapes_on_schedule', 0) * 100:.1f}%",
         row.get("scrapes_on_schedule", 0) >= GOAL_SCRAPES),
        (f"probe fires <= {GOAL_FIRE_SLACK:g} s after undisturbed", f"{fire_text} (undisturbed {base_text})",
         fire_ok),
        ("daemon memory (PSS of its processes) < 1 GiB", f"{rss_d:.0f} MiB", rss_d < GOAL_RSS_MIB),
        ("gateway RSS < 1 GiB", f"{rss_g:.0f} MiB", rss_g < GOAL_RSS_MIB),
        (f"legit added p99 <= {p99_bound:.2f} ms, none refused",
         f"{p99:.3f} ms (undisturbed {base_p99:.3f}), {row['legit_failed']} failed",
         p99 <= p99_bound and row["legit_failed"] == 0),
        ("nothing crashed", _alive_text(row), bool(row["alive"]) and not row["guard_killed"]),
    ]  # fmt: skip


def _alive_text(row: dict[str, Any]) -> str:
    if row["alive"] and not row["guard_killed"]:
        return "daemon and gateway up"
    parts = [f"daemon {'up' if row['daemon_running'] else 'DEAD'}", f"healthz {row['healthz']}"]
    parts += [f"gateway {'up' if row['gateway_running'] else 'DEAD'}", f"via gateway {row['gateway_http']}"]
    if not row["gateway_same_pid"]:
        parts.append("gateway pid changed")
    parts += [f"guard killed {k}" for k in row["guard_killed"]]
    return ", ".join(parts)


def report_windows(rows: list[dict[str, Any]]) -> bool:
    """The goals table of the hostile phases; True if every goal of every phase passed."""
    baseline = next((r for r in rows if r["phase"].startswith("(b)")), None)
    hostile = [r for r in rows if not r["phase"].startswith("(b)")]
    if not hostile:
        return True
    every = True
    print(f"\n{'hostile phase / goal':<52} {'measured':<44} result")
    for row in hostile:
        print(row["phase"])
        for goal, measured, ok in goals(row, baseline):
            every &= ok
            print(f"  {goal:<50} {measured:<44} {'PASS' if ok else 'FAIL'}")
        row["goals"] = {g: ok for g, _, ok in goals(row, baseline)}
        up = row["attack"].get("second_client_up")
        if isinstance(up, dict):
            statuses, p99 = up["statuses"], up.get("p99_s") or 0.0
            answered = (
                f"{statuses.get('200', 0)} of {up['requests']} answered, {statuses.get('503', 0)} x 503"
            )
            print(f"  {'second client asking `up` (info)':<50} {answered}, p99 {p99:.2f} s")
        print(f"  {'what the attack saw':<50} {_attack_text(row['attack'])}")
        print(f"  {'what the daemon saw':<50} {_daemon_text(row)}")
    return every


def _daemon_text(row: dict[str, Any]) -> str:
    """Store size, the hostile target's scrapes and missed deadlines, from the daemon's own counters."""
    if "store_series_after" not in row:
        return str(row.get("scrape_counters", "-"))
    return (
        f"store series {row['store_series_before']:.0f} -> {row['store_series_after']:.0f}; hostile target "
        f"{row['hostile_scrapes']:.0f} scrapes ({row['hostile_scrape_errors']:.0f} failed); "
        f"missed scrape deadlines {row['missed_scrape_deadlines']:.0f}; "
        f"daemon VmHWM {row['daemon_vmhwm_mib']:.0f} MiB"
    )


def _attack_text(attack: dict[str, Any]) -> str:
    """A compact line of the attacker's own view."""
    parts = []
    for name, value in attack.items():
        if isinstance(value, dict) and "statuses" in value:
            p99 = value.get("p99_s")
            extra = f" p99 {p99:.2f}s" if isinstance(p99, float) else ""
            parts.append(f"{name} {value['statuses']}{extra}")
        else:
            parts.append(f"{name} {value}")
    return "; ".join(parts)
