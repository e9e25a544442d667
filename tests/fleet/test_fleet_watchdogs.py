"""A fleet of real watchdog processes sharing one disruption budget in a real 3-member etcd cluster on loopback.

Each member is `vllm-watchdog run` with its own state_dir and one process-mode target, the stub server of
tests/support/stub_server.py (it starts in a fraction of a second and takes as many seconds to stop as its
member's `term_delay` file says, so a restart lasts long enough to overlap another's). Starting a watchdog
costs seconds of CPU, so three members (m0, m1, m2) serve every case of the module: each case first waits
until they are joined, idle and alert-free, counts only the audit rows written after that, and resolves the
alerts it fired at its end. m2 reaches etcd through loopback TCP proxies, which only the partition case cuts.
Leases are 3 s, so a dead member's slot frees within seconds; the rails that would stop a second restart of
the same target (cooldown, budget, crash loop) are off.

Cases: the same alert on every member restarts them one at a time, each after the previous ended; a member
killed with SIGKILL while it holds a slot (a fourth watchdog, m3, frozen in its flow by a failpoint) frees it
when its lease expires and the next proceeds; the etcd leader killed mid-action gives no slot twice; a member
cut off from etcd refuses and alerts while the others proceed; etcd stopped entirely: no disruptive action
starts anywhere, every member alerts, monitoring goes on, and `vllm-watchdog fleet` lists every member while
etcd answers; more than the correlated share firing one alert holds every member's disruptive actions and
raises the fleet alert (also in `top --fleet`) until the alerts resolve.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.apitargets import targets
from tests.support.configs import AUTH, target, write_config
from tests.support.etcd_cluster import EtcdCluster
from tests.support.procs import command_lines
from tests.support.stub_server import write_stub
from tests.support.tcpproxy import TcpProxy
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll
from vllm_watchdog.commands.topfleet import fetch_fleet, render_fleet
from vllm_watchdog.failpoints import ENV

LIMIT = 60.0  # bound on every wait; never asserted on
EVERY = 0.1  # seconds between polls of a member's API: the cases wait on each other's steps dozens of times
CLIENT = httpx.Client(timeout=10, trust_env=False)  # one for every poll: a client per request costs more CPU
# Seconds: a killed member's slot frees this long after its last renewal. A live member must renew within
# it however starved it is: 3 s expired a running member's lease at load average 27.
TTL = 6
GROUP = "pool"
RAN = ("succeeded", "failed", "rolled_back", "running")
CORRELATED = "VLLMWatchdogFleetCorrelatedFault"


@dataclass
class Member:
    """One watchdog of the fleet: its API, its stub's port, its process, log, config and stop-delay file."""

    name: str
    api: str
    vport: int
    proc: subprocess.Popen[bytes]
    log: Path
    cfg: Path
    term_delay: Path
    since: int = 0  # audit rows with a higher id belong to the running case
    fired: set[str] = field(default_factory=set)

    def status(self) -> dict[str, Any]:
        """GET /api/v1/actions' data."""
        data: dict[str, Any] = CLIENT.get(self.api + "/api/v1/actions").json()["data"]
        return data

    def rows(self, action: str = "restart") -> list[dict[str, Any]]:
        """The running case's audit rows of `action`, oldest first."""
        history = self.status()["history"]
        return sorted(
            (h for h in history if h["action"] == action and h["id"] > self.since), key=lambda h: h["id"]
        )

    def alert(self, alertname: str, status: str = "firing") -> None:
        """Deliver an alert about this member's stub, as an Alertmanager would (firing, or resolved)."""
        alert = {"status": status, "labels": {"alertname": alertname, "target": f"stub-{self.name[1:]}"}}
        body = {"version": "4", "status": status, "alerts": [alert]}
        resp = httpx.post(self.api + "/api/v1/alertmanager", json=body, headers=AUTH, timeout=10)
        assert resp.status_code == 200, resp.text
        if status == "firing":
            assert resp.json()["queued"] == 1, resp.text
            self.fired.add(alertname)
        else:
            self.fired.discard(alertname)

    def run(self, action: str = "restart", wait: bool = False) -> dict[str, Any]:
        """Queue `action` by hand (with `wait`, its result)."""
        resp = httpx.post(
            f"{self.api}/api/v1/actions/{action}/run", json={"wait": wait}, headers=AUTH, timeout=LIMIT
        )
        assert resp.status_code in (200, 202), resp.text
        answer: dict[str, Any] = resp.json()
        return answer

    def wait(self, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """Poll the actions status until `pred` holds; AssertionError with the last answer and the log's end
        after LIMIT seconds."""
        deadline = time.monotonic() + LIMIT
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.status()
                if pred(last):
                    return dict(last)
            except (httpx.HTTPError, ValueError, KeyError, TypeError):  # not up yet, or an error document
                pass
            time.sleep(EVERY)
        raise AssertionError(f"{what} not within {LIMIT}s; last: {last}; log: {self.log.read_text()[-3000:]}")

    def reload(self, text: str) -> None:
        """Write a new config and make the watchdog apply it."""
        self.cfg.write_text(text)
        resp = httpx.post(self.api + "/-/reload", headers=AUTH, timeout=LIMIT)
        assert resp.status_code == 200, resp.text


def _stubs_on(port: int) -> list[int]:
    return [
        pid
        for pid, argv in command_lines()
        if b"stub_server.py" in b" ".join(argv) and str(port).encode() in argv
    ]


@dataclass
class Pool:
    """The module's members, how to start one more, and their etcd."""

    members: list[Member]
    etcd: EtcdCluster
    proxies: list[TcpProxy]
    start: Callable[..., list[Member]]

    def config(self, member: Member, correlated_share: str = "null") -> str:
        """`member`'s config with another correlated_share."""
        text = member.cfg.read_text()
        head, _, _ = text.partition("  correlated_share:")
        return f"{head}  correlated_share: {correlated_share}\n"


def _config(home: Path, i: int, port: int, vport: int, endpoints: Sequence[str], script: Path) -> Path:
    command = [
        sys.executable,
        str(script),
        "--port",
        str(vport),
        "--term-delay-file",
        str(home / "term_delay"),
    ]
    fast = "startup_grace: 0s, drain_timeout: 1s, stop_timeout: 20s, ready_timeout: 30s"
    # Every case restarts the same stubs again: no cooldown, budget or crash-loop rail may stop them. No
    # correlated hold either: the first case fires one alert on every member (the correlated case reloads it).
    again = "cooldown: 0s, max_per_window: {count: 1000, window: 1h}, crash_loop_window: 0s"
    return write_config(
        home,
        target(f"http://127.0.0.1:{vport}", name=f"stub-{i}", command=command),
        port=port,
        rest=f"""actions:
  restart: {{type: restart, {fast}, {again}}}
routes:
  - {{match_re: {{alertname: "Stub.*"}}, actions: [restart]}}
fleet:
  endpoints: {list(endpoints)}
  group: {GROUP}
  member: m{i}
  max_disrupted: 1
  lease_ttl: {TTL}s
  request_timeout: 2s
  slot_wait: 60s
  correlated_share: null
""",
    )


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, etcd_cluster: EtcdCluster) -> Iterator[Pool]:
    """m0, m1 and m2 (m2 through proxies), joined; `start(i, failpoint=...)` starts one more, killed at the end."""
    tmp = tmp_path_factory.mktemp("fleet")
    script = write_stub(tmp)
    proxies = [TcpProxy(int(url.rsplit(":", 1)[1])) for url in etcd_cluster.endpoints]
    done: list[Callable[[], None]] = []

    def start(*numbers: int, failpoint: str = "") -> list[Member]:
        members = []
        for i in numbers:
            home = tmp / f"m{i}"
            home.mkdir()
            (home / "term_delay").write_text("0.5")
            port, vport = free_port(), free_port()
            done.append(lambda vport=vport: [os.killpg(p, signal.SIGKILL) for p in _stubs_on(vport)])
            endpoints = [p.url for p in proxies] if i == 2 else etcd_cluster.endpoints
            cfg = _config(home, i, port, vport, endpoints, script)
            env = {k: v for k, v in os.environ.items() if k != ENV} | ({ENV: failpoint} if failpoint else {})
            log = home / "watchdog.log"
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            done.append(lambda proc=proc: (proc.kill(), proc.wait(10)))
            members.append(
                Member(f"m{i}", f"http://127.0.0.1:{port}", vport, proc, log, cfg, home / "term_delay")
            )
        for m in members:  # started together above; their start-ups overlap
            poll(m.api + "/api/v1/targets", lambda j: targets(j)[0]["up"], LIMIT, "the stub up", m.log)
            m.wait(lambda d: d["fleet"]["lease"] != 0 and not d["fleet"]["refusal"], "joined the fleet")
        return members

    try:
        yield Pool(start(0, 1, 2), etcd_cluster, proxies, start)
    finally:
        for fn in reversed(done):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                fn()
        for p in proxies:
            p.close()


def _idle(d: dict[str, Any]) -> bool:
    f = d["fleet"]
    return (
        f["lease"] != 0
        and not f["refusal"]
        and not f["alerts"]
        and not f["waiting"]
        and not f["holding"]
        and not f["firing"]
        and not d["running"]
        and not d["queued"]
    )


@pytest.fixture
def fleet(pool: Pool) -> Iterator[list[Member]]:
    """The pool, ready for a case: etcd whole, every member joined, idle and alert-free, no slot key left;
    each member's stop takes 0.5 s. At the end, the alerts the case fired are resolved."""
    pool.etcd.start()
    for p in pool.proxies:
        p.heal()
    for m in pool.members:
        m.term_delay.write_text("0.5")
        found = m.wait(_idle, "joined, idle and alert-free")
        m.since = max((h["id"] for h in found["history"]), default=0)
    deadline = time.monotonic() + LIMIT
    while pool.etcd.keys(f"/vllm-watchdog/{GROUP}/slots/"):  # a killed member's lease may still live
        assert time.monotonic() < deadline, pool.etcd.keys(f"/vllm-watchdog/{GROUP}/slots/")
        time.sleep(0.1)
    yield pool.members
    pool.etcd.start()
    for p in pool.proxies:
        p.heal()
    for m in pool.members:
        for name in sorted(m.fired):
            m.alert(name, "resolved")


def _ended(rows: list[dict[str, Any]]) -> bool:
    return bool(rows) and all(r["outcome"] != "running" for r in rows)


def _restarted(m: Member) -> None:
    """Wait until the case's restarts on `m` ended."""
    m.wait(lambda _: _ended(m.rows()), "the restart")


def test_the_same_alert_on_every_member_restarts_them_one_at_a_time(fleet: list[Member]) -> None:
    for m in fleet:
        m.term_delay.write_text("1")
    for m in fleet:  # within milliseconds: without the budget all three would restart at once
        m.alert("StubHung")
    runs = []
    for m in fleet:
        m.wait(lambda _, m=m: _ended([r for r in m.rows() if r["outcome"] in RAN]), "a restart")
        (row,) = [r for r in m.rows() if r["outcome"] in RAN]
        assert row["outcome"] == "succeeded", row
        runs.append(row)
    runs.sort(key=lambda r: r["started_at"])
    for before, after in itertools.pairwise(runs):
        assert after["started_at"] >= before["finished_at"], (before, after)


def test_a_member_killed_while_holding_a_slot_frees_it_when_its_lease_expires(
    fleet: list[Member], pool: Pool
) -> None:
    (holder,) = pool.start(3, failpoint="wait_ready")
    waiter = fleet[0]
    holder.run()
    holder.wait(lambda d: d["fleet"]["holding"], "the holder takes the slot")
    deadline = time.monotonic() + LIMIT
    while "failpoint reached" not in holder.log.read_text():  # it stays in the flow for good
        assert time.monotonic() < deadline, holder.log.read_text()[-3000:]
        time.sleep(0.05)
    waiter.run()
    seen = waiter.wait(lambda d: d["fleet"]["waiting"], "the other member waits for the slot")
    assert seen["fleet"]["waiting"]["stub-0"]["action"] == "restart"
    assert all(r["outcome"] != "running" for r in waiter.rows())
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait(10)
    killed_at = time.time()
    _restarted(waiter)
    (row,) = waiter.rows()
    assert row["outcome"] == "succeeded", row
    assert row["started_at"] >= killed_at  # never while the killed member's lease lived


def test_the_etcd_leader_killed_mid_action_gives_no_slot_twice(fleet: list[Member], pool: Pool) -> None:
    first, second = fleet[0], fleet[1]
    first.term_delay.write_text("3")
    lost = first.status()["fleet"]["lost"]
    first.run()
    first.wait(lambda d: d["fleet"]["holding"], "the first member takes the slot")
    second.run()
    second.wait(lambda d: d["fleet"]["waiting"], "the second member waits")
    leader = pool.etcd.leader()
    assert leader is not None
    leader.kill()
    for m in (first, second):
        _restarted(m)
    (a,), (b,) = first.rows(), second.rows()
    assert a["outcome"] == b["outcome"] == "succeeded", (a["reason"], b["reason"])
    assert b["started_at"] >= a["finished_at"], (a, b)
    assert first.status()["fleet"]["lost"] == lost  # the holder's lease lived through the election


def test_a_member_cut_off_from_etcd_refuses_and_alerts_while_the_others_proceed(
    fleet: list[Member], pool: Pool
) -> None:
    a, b, cut = fleet  # m2 reaches etcd through the proxies
    for p in pool.proxies:
        p.cut()
    for m in (a, b):
        m.run()
    cut.wait(lambda d: d["fleet"]["refusal"], "the cut-off member knows it")
    result = cut.run(wait=True)["result"]
    assert result["outcome"] == "skipped" and result["reason"].startswith("fleet:"), result
    alerts = cut.wait(lambda d: d["fleet"]["alerts"], "the fleet alert")["fleet"]["alerts"]
    assert [x["labels"]["alertname"] for x in alerts] == ["VLLMWatchdogFleetUnreachable"]
    for m in (a, b):
        _restarted(m)
        assert [r["outcome"] for r in m.rows()] == ["succeeded"]
    assert all(r["outcome"] == "skipped" for r in cut.rows())
    assert _stubs_on(cut.vport)  # the cut-off member's server was never touched


def _fleet_command(member: Member) -> subprocess.CompletedProcess[str]:
    with _fleet_command_started(member) as proc:
        stdout, stderr = proc.communicate(timeout=LIMIT)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _fleet_command_started(member: Member) -> subprocess.Popen[str]:
    """`vllm-watchdog fleet` with `member`'s config, started (as a context manager: its pipes closed and its
    exit awaited at the end)."""
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_watchdog", "fleet", "--config", str(member.cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_with_etcd_stopped_no_disruptive_action_starts_and_monitoring_goes_on(
    fleet: list[Member], pool: Pool
) -> None:
    members = fleet[:2]
    # `vllm-watchdog fleet` lists every member's targets from etcd, once each has published them.
    for m in fleet:
        poll(
            m.api + "/api/v1/fleet",
            lambda j, m=m: any(f"stub-{m.name[1:]}" in x.get("targets", []) for x in j["data"]["members"]),
            LIMIT,
            "its targets published",
            m.log,
        )
    listed = _fleet_command(members[0])
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[2:]}
    assert rows.keys() == {"m0", "m1", "m2"} and all(f"stub-{m[1]}" in rows[m] for m in rows), listed.stdout
    assert listed.stdout.startswith(f"group {GROUP}: 3 live members")
    pool.etcd.stop_all()
    with _fleet_command_started(members[0]) as listing:  # it runs while the members find out
        for m in members:
            alerts = m.wait(lambda d: d["fleet"]["alerts"], "the fleet alert")["fleet"]["alerts"]
            assert alerts[0]["labels"]["alertname"] == "VLLMWatchdogFleetUnreachable"
            result = m.run(wait=True)["result"]
            assert result["outcome"] == "skipped" and "etcd" in result["reason"], result
        _, stderr = listing.communicate(timeout=LIMIT)
    assert listing.returncode == 1 and "no etcd endpoint answered" in stderr, stderr
    for m in members:
        assert [r["outcome"] for r in m.rows()] == ["skipped"]
    for m in members:
        before = targets(httpx.get(m.api + "/api/v1/targets", timeout=10).json())[0]["last_scrape"]
        poll(
            m.api + "/api/v1/targets",
            lambda j, before=before: targets(j)[0]["up"] and targets(j)[0]["last_scrape"] > before,
            LIMIT,
            "a newer scrape",
            m.log,
        )


def test_more_than_the_share_firing_one_alert_holds_the_group_until_it_resolves(
    fleet: list[Member], pool: Pool
) -> None:
    a, b, quiet = fleet
    for m in fleet:
        m.reload(pool.config(m, "0.5"))
    try:
        for m in fleet:
            m.wait(lambda d: d["fleet"]["correlated_share"] == 0.5, "the share reloaded")
        # Another member holds the slot, so that the members that fire wait in line: the hold decides, not
        # which of them etcd would order first.
        lease = pool.etcd.hold_key(f"/vllm-watchdog/{GROUP}/slots/elsewhere/gpu-9/0")
        try:
            a.alert("StubBroken")
            b.alert("StubBroken")  # 2 of 3 live members: more than half
            for m in (a, b):
                m.wait(lambda _, m=m: _ended(m.rows()), "the refusal")
                (row,) = m.rows()
                assert row["outcome"] == "skipped", row
                assert row["reason"].startswith(
                    f"fleet_hold: 2 of 3 live members of group {GROUP} fire StubBroken (m0, m1), more than "
                    "correlated_share 50%"
                ), row
            found = quiet.wait(
                lambda d: d["fleet"]["alerts"], "the fleet alert on a member that fires nothing"
            )
            (alert,) = found["fleet"]["alerts"]
            assert alert["labels"] == {
                "alertname": CORRELATED,
                "group": GROUP,
                "fault": "StubBroken",
                "severity": "critical",
            }
            assert alert["annotations"]["members"] == "m0, m1"
            result = quiet.run(wait=True)["result"]  # group-wide: a member that fires nothing holds too
            assert result["outcome"] == "skipped" and result["reason"].startswith("fleet_hold: "), result
            with httpx.Client(timeout=10, trust_env=False) as client:
                frame = render_fleet(fetch_fleet(client, quiet.api), time.time())
            assert "HOLD  StubBroken fired by 2 of 3 live members (m0, m1)" in frame, frame
            assert (
                'vllm_watchdog_fleet_refusals_total{group="pool",rail="fleet_hold"} 1.0'
                in httpx.get(quiet.api + "/metrics", timeout=10).text
            )
            for m in (a, b):
                m.alert("StubBroken", "resolved")
            for m in fleet:
                m.wait(lambda d: not d["fleet"]["alerts"] and not d["fleet"]["holds"], "the hold ended")
        finally:
            pool.etcd.revoke(lease)
        a.alert("StubBroken")  # 1 of 3 now: restarts fix single faults again
        a.wait(lambda _: any(r["outcome"] in RAN for r in a.rows()) and _ended(a.rows()), "the restart")
        assert [r["outcome"] for r in a.rows()][-1] == "succeeded", a.rows()
    finally:
        for m in fleet:
            m.reload(pool.config(m))
