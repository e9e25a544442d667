"""A fleet of real watchdog processes sharing one disruption budget in a real 3-member etcd cluster on loopback.

Each member is `vllm-watchdog run` with its own state_dir and one process-mode target, the stub server of
tests/support/stub_server.py (it starts in a fraction of a second and takes `--term-delay` seconds to stop, so
a restart lasts long enough to overlap another's). Each test has its own group, so they share the cluster
without seeing each other's keys. Leases are 3 s, so a dead member's slot frees within seconds.

Cases: the same alert on every member restarts them one at a time, each after the previous ended; a member
killed with SIGKILL while it holds a slot frees it when its lease expires and the next proceeds; the etcd
leader killed mid-action gives no slot twice; a member cut off from etcd (its traffic goes through a
loopback TCP proxy the test cuts) refuses and alerts while the others proceed; etcd stopped entirely: no
disruptive action starts anywhere, every member alerts, and monitoring goes on; `vllm-watchdog fleet` lists every
member's targets from etcd while it answers.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.apitargets import targets
from tests.support.configs import AUTH, target, write_config
from tests.support.etcd_cluster import EtcdCluster
from tests.support.stub_server import write_stub
from tests.support.tcpproxy import TcpProxy
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll
from vllm_watchdog.failpoints import ENV

LIMIT = 60.0  # bound on every wait; never asserted on
TTL = 3  # seconds: a killed member's slot frees this long after its last renewal
RAN = ("succeeded", "failed", "rolled_back", "running")


@dataclass
class Member:
    """One watchdog of the fleet: its API, its stub's port, its process and log."""

    name: str
    api: str
    vport: int
    proc: subprocess.Popen[bytes]
    log: Path
    cfg: Path

    def status(self) -> dict[str, Any]:
        """GET /api/v1/actions' data."""
        data: dict[str, Any] = httpx.get(self.api + "/api/v1/actions", timeout=10).json()["data"]
        return data

    def rows(self, action: str = "restart") -> list[dict[str, Any]]:
        """The audit rows of `action`, oldest first."""
        return sorted((h for h in self.status()["history"] if h["action"] == action), key=lambda h: h["id"])

    def alert(self, alertname: str) -> None:
        """Deliver a firing alert about this member's stub, as an Alertmanager would."""
        alert = {"status": "firing", "labels": {"alertname": alertname, "target": f"stub-{self.name[1:]}"}}
        body = {"version": "4", "status": "firing", "alerts": [alert]}
        resp = httpx.post(self.api + "/api/v1/alertmanager", json=body, headers=AUTH, timeout=10)
        assert resp.status_code == 200 and resp.json()["queued"] == 1, resp.text

    def run(self, action: str = "restart", wait: bool = False) -> dict[str, Any]:
        """Queue `action` by hand (with `wait`, its result)."""
        resp = httpx.post(
            f"{self.api}/api/v1/actions/{action}/run", json={"wait": wait}, headers=AUTH, timeout=LIMIT
        )
        assert resp.status_code in (200, 202), resp.text
        answer: dict[str, Any] = resp.json()
        return answer

    def wait(self, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """Poll the actions status until `pred` holds."""
        found: dict[str, Any] = poll(
            self.api + "/api/v1/actions", lambda j: pred(j["data"]), LIMIT, what, self.log
        )["data"]
        return found


def _stubs_on(port: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"stub_server.py" in b" ".join(argv) and str(port).encode() in argv:
                pids.append(int(entry.name))
    return pids


@pytest.fixture
def fleet(
    tmp_path: Path,
    etcd_cluster: EtcdCluster,
    cleanup: list[Callable[[], None]],
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., list[Member]]]:
    """Starts members: `fleet(n, endpoints=..., failpoint=..., term_delay=..., max_disrupted=...)`."""
    script = write_stub(tmp_path)
    group = request.node.name.replace("[", "-").replace("]", "")[:60]

    def start(
        n: int,
        *,
        endpoints: Sequence[Sequence[str]] | None = None,
        failpoint: dict[int, str] | None = None,
        term_delay: str = "0.5",
        max_disrupted: str = "1",
    ) -> list[Member]:
        members = []
        for i in range(n):
            home = tmp_path / f"m{i}"
            home.mkdir()
            port, vport = free_port(), free_port()
            cleanup.append(lambda vport=vport: [os.killpg(p, signal.SIGKILL) for p in _stubs_on(vport)])
            command = [sys.executable, str(script), "--port", str(vport), "--term-delay", term_delay]
            eps = list(endpoints[i]) if endpoints is not None else etcd_cluster.endpoints
            fast = "startup_grace: 0s, drain_timeout: 1s, stop_timeout: 20s, ready_timeout: 30s"
            cfg = write_config(
                home,
                target(f"http://127.0.0.1:{vport}", name=f"stub-{i}", command=command),
                port=port,
                rest=f"""actions:
  restart: {{type: restart, cooldown: 1h, {fast}}}
routes:
  - {{match: {{alertname: StubHung}}, actions: [restart]}}
fleet:
  endpoints: {list(eps)}
  group: {group}
  member: m{i}
  max_disrupted: {max_disrupted}
  lease_ttl: {TTL}s
  request_timeout: 1s
  slot_wait: 60s
""",
            )
            env = {k: v for k, v in os.environ.items() if k != ENV}
            if failpoint and i in failpoint:
                env[ENV] = failpoint[i]
            log = home / "watchdog.log"
            with log.open("ab") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "vllm_watchdog", "run", "--config", str(cfg)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            cleanup.append(lambda proc=proc: (proc.kill(), proc.wait(10)))
            members.append(Member(f"m{i}", f"http://127.0.0.1:{port}", vport, proc, log, cfg))
        for m in members:
            poll(m.api + "/api/v1/targets", lambda j: targets(j)[0]["up"], LIMIT, "the stub up", m.log)
            m.wait(lambda d: d["fleet"]["lease"] != 0 and not d["fleet"]["refusal"], "joined the fleet")
        return members

    yield start


def _ended(rows: list[dict[str, Any]]) -> bool:
    return bool(rows) and all(r["outcome"] != "running" for r in rows)


def test_the_same_alert_on_every_member_restarts_them_one_at_a_time(
    fleet: Callable[..., list[Member]],
) -> None:
    members = fleet(3, term_delay="1")
    for m in members:  # within milliseconds: without the budget all three would restart at once
        m.alert("StubHung")
    runs = []
    for m in members:
        m.wait(
            lambda d: _ended([h for h in d["history"] if h["action"] == "restart" and h["outcome"] in RAN]),
            "a restart",
        )
        (row,) = [r for r in m.rows() if r["outcome"] in RAN]
        assert row["outcome"] == "succeeded", row
        runs.append(row)
    runs.sort(key=lambda r: r["started_at"])
    for before, after in itertools.pairwise(runs):
        assert after["started_at"] >= before["finished_at"], (before, after)


def test_a_member_killed_while_holding_a_slot_frees_it_when_its_lease_expires(
    fleet: Callable[..., list[Member]],
) -> None:
    holder, waiter = fleet(2, failpoint={0: "wait_ready"})
    holder.run()
    holder.wait(lambda d: d["fleet"]["holding"], "the holder takes the slot")
    poll_log = holder.log
    deadline = time.monotonic() + LIMIT
    while "failpoint reached" not in poll_log.read_text():  # it stays in the flow for good
        assert time.monotonic() < deadline, poll_log.read_text()[-3000:]
        time.sleep(0.05)
    waiter.run()
    seen = waiter.wait(lambda d: d["fleet"]["waiting"], "the other member waits for the slot")
    assert seen["fleet"]["waiting"]["stub-1"]["action"] == "restart"
    assert not waiter.rows() or all(r["outcome"] != "running" for r in waiter.rows())
    holder.proc.send_signal(signal.SIGKILL)
    holder.proc.wait(10)
    killed_at = time.time()
    waiter.wait(
        lambda d: _ended([h for h in d["history"] if h["action"] == "restart"]), "the waiter's restart"
    )
    (row,) = waiter.rows()
    assert row["outcome"] == "succeeded", row
    assert row["started_at"] >= killed_at  # never while the killed member's lease lived


def test_the_etcd_leader_killed_mid_action_gives_no_slot_twice(
    fleet: Callable[..., list[Member]], etcd_cluster: EtcdCluster
) -> None:
    first, second = fleet(2, term_delay="3")
    try:
        first.run()
        first.wait(lambda d: d["fleet"]["holding"], "the first member takes the slot")
        second.run()
        second.wait(lambda d: d["fleet"]["waiting"], "the second member waits")
        leader = etcd_cluster.leader()
        assert leader is not None
        leader.kill()
        for m in (first, second):
            m.wait(lambda d: _ended([h for h in d["history"] if h["action"] == "restart"]), "the restart")
        (a,), (b,) = first.rows(), second.rows()
        assert a["outcome"] == b["outcome"] == "succeeded", (a["reason"], b["reason"])
        assert b["started_at"] >= a["finished_at"], (a, b)
        assert first.status()["fleet"]["lost"] == 0  # the holder's lease lived through the election
    finally:
        etcd_cluster.start()


def test_a_member_cut_off_from_etcd_refuses_and_alerts_while_the_others_proceed(
    fleet: Callable[..., list[Member]], etcd_cluster: EtcdCluster
) -> None:
    proxies = [TcpProxy(int(url.rsplit(":", 1)[1])) for url in etcd_cluster.endpoints]
    try:
        direct = etcd_cluster.endpoints
        a, b, cut = fleet(3, endpoints=[direct, direct, [p.url for p in proxies]])
        for p in proxies:
            p.cut()
        cut.wait(lambda d: d["fleet"]["refusal"], "the cut-off member knows it")
        result = cut.run(wait=True)["result"]
        assert result["outcome"] == "skipped" and result["reason"].startswith("fleet:"), result
        alerts = cut.wait(lambda d: d["fleet"]["alerts"], "the fleet alert")["fleet"]["alerts"]
        assert [x["labels"]["alertname"] for x in alerts] == ["VLLMWatchdogFleetUnreachable"]
        for m in (a, b):
            m.run()
        for m in (a, b):
            m.wait(lambda d: _ended([h for h in d["history"] if h["action"] == "restart"]), "the restart")
            assert [r["outcome"] for r in m.rows()] == ["succeeded"]
        assert all(r["outcome"] == "skipped" for r in cut.rows())
        assert _stubs_on(cut.vport)  # the cut-off member's server was never touched
    finally:
        for p in proxies:
            p.close()


def test_with_etcd_stopped_no_disruptive_action_starts_and_monitoring_goes_on(
    fleet: Callable[..., list[Member]], etcd_cluster: EtcdCluster
) -> None:
    members = fleet(2)
    # `vllm-watchdog fleet` lists every member's targets from etcd, once each has published them.
    deadline = time.monotonic() + LIMIT
    while True:
        listed = subprocess.run(
            [sys.executable, "-m", "vllm_watchdog", "fleet", "--config", str(members[0].cfg)],
            capture_output=True,
            text=True,
            timeout=LIMIT,
        )
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[0]: line for line in listed.stdout.splitlines()[2:]}
        if rows.keys() == {"m0", "m1"} and all(f"stub-{m[1]}" in rows[m] for m in rows):
            break
        assert time.monotonic() < deadline, listed.stdout
        time.sleep(0.3)
    assert listed.stdout.startswith("group test_with_etcd_stopped")
    etcd_cluster.stop_all()
    try:
        for m in members:
            alerts = m.wait(lambda d: d["fleet"]["alerts"], "the fleet alert")["fleet"]["alerts"]
            assert alerts[0]["labels"]["alertname"] == "VLLMWatchdogFleetUnreachable"
            result = m.run(wait=True)["result"]
            assert result["outcome"] == "skipped" and "etcd" in result["reason"], result
        listed = subprocess.run(
            [sys.executable, "-m", "vllm_watchdog", "fleet", "--config", str(members[0].cfg)],
            capture_output=True,
            text=True,
            timeout=LIMIT,
        )
        assert listed.returncode == 1 and "no etcd endpoint answered" in listed.stderr, listed
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
    finally:
        etcd_cluster.start()
