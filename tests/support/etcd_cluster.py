"""A real etcd cluster of three members on loopback (Debian's etcd-server, 3.4), for the fleet's tests.

Each member listens on two free 127.0.0.1 ports (client, peer) and keeps its data in its own folder, so a test
can kill one (SIGKILL), stop all, and start them again on the same ports. `leader()` asks each member's status.
Every wait is bounded; a member that does not come up fails the test with its log's end.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.vllm_server import free_port

WAIT = 30.0  # bound on a member answering or a leader being elected; never asserted on


class EtcdMember:
    """One etcd process: its name, ports, data folder and log."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.data = workdir / name
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self, cluster: str, state: str) -> list[str]:
        """etcd's command line for this member."""
        return [
            "etcd",
            "--name", self.name,
            "--data-dir", str(self.data),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", cluster,
            "--initial-cluster-state", state,
            "--initial-cluster-token", "vllm-watchdog-test",
        ]  # fmt: skip

    @property
    def running(self) -> bool:
        """Whether its process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def start(self, cluster: str, state: str) -> None:
        """Start the process (again, on the same ports and data)."""
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(cluster, state), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def kill(self) -> None:
        """SIGKILL, as a crash or a power cut."""
        if self.running:
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def status(self) -> dict[str, object] | None:
        """Its maintenance status (member id, leader id), None if it does not answer."""
        try:
            answer = httpx.post(self.url + "/v3/maintenance/status", json={}, timeout=2, trust_env=False)
        except httpx.HTTPError:
            return None
        return answer.json() if answer.status_code == 200 else None


class EtcdCluster:
    """Three members on loopback, started together."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.members = [EtcdMember(f"e{i}", workdir) for i in range(size)]
        self.initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        self._started = False

    @property
    def endpoints(self) -> list[str]:
        """Every member's client URL."""
        return [m.url for m in self.members]

    def start(self) -> None:
        """Start every member that is not running and wait for a leader."""
        for member in self.members:
            if not member.running:
                member.start(self.initial, "existing" if self._started else "new")
        self._started = True
        self.wait_leader()

    def leader(self) -> EtcdMember | None:
        """The member that says it leads, if one answers so."""
        for member in self.members:
            if not member.running:
                continue
            status = member.status()
            if status is not None and status.get("leader") == status.get("header", {}).get("member_id"):  # type: ignore[union-attr]
                return member
        return None

    def wait_leader(self) -> EtcdMember:
        """Wait until a running member leads and a write goes through."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None:
                with contextlib.suppress(httpx.HTTPError):
                    put = {"key": "cHJvYmU=", "value": "MQ=="}  # probe=1
                    if httpx.post(leader.url + "/v3/kv/put", json=put, timeout=2).status_code == 200:
                        return leader
            time.sleep(0.1)
        raise AssertionError(f"no etcd leader within {WAIT}s: {self.log_tails()}")

    def stop_all(self) -> None:
        """Kill every member (data kept)."""
        for member in self.members:
            member.kill()

    def call(self, path: str, body: dict[str, object]) -> dict[str, Any]:
        """POST `body` to the v3 JSON gateway's `/v3/<path>` on the first running member that answers."""
        problems = []
        for member in self.members:
            if member.running:
                try:
                    answer = httpx.post(f"{member.url}/v3/{path}", json=body, timeout=5, trust_env=False)
                except httpx.HTTPError as exc:
                    problems.append(f"{member.name}: {exc}")
                    continue
                assert answer.status_code == 200, answer.text
                found: dict[str, Any] = answer.json()
                return found
        raise AssertionError(f"no etcd member answered {path}: {problems}")

    def hold_key(self, key: str, ttl: int = 600) -> int:
        """Write `key` under a new lease of `ttl` seconds, as a member would (a slot, say); the lease's id,
        for `revoke`. The default outlives any test: 60 s expired before a test at load average 27 revoked it."""
        lease = int(self.call("lease/grant", {"TTL": str(ttl)})["ID"])
        self.call("kv/put", {"key": _b64(key), "value": _b64("{}"), "lease": str(lease)})
        return lease

    def revoke(self, lease: int) -> None:
        """End a lease: its keys go."""
        self.call("lease/revoke", {"ID": str(lease)})

    def keys(self, prefix: str) -> list[str]:
        """Every key under `prefix`."""
        key = prefix.encode()
        end = key[:-1] + bytes([key[-1] + 1])
        body = {"key": _b64(prefix), "range_end": base64.b64encode(end).decode(), "keys_only": True}
        return [base64.b64decode(kv["key"]).decode() for kv in self.call("kv/range", body).get("kvs", [])]

    def wipe(self, prefix: str = "/") -> None:
        """Delete every key under `prefix`, so that tests sharing the cluster start clean."""
        key = prefix.encode()
        end = key[:-1] + bytes([key[-1] + 1])
        body = {"key": base64.b64encode(key).decode(), "range_end": base64.b64encode(end).decode()}
        self.wait_leader()
        for member in self.members:
            if member.running:
                with contextlib.suppress(httpx.HTTPError):
                    httpx.post(member.url + "/v3/kv/deleterange", json=body, timeout=5)
                    return

    def log_tails(self) -> str:
        """The end of every member's log."""
        return "\n".join(
            f"--- {m.name}: {m.log.read_text()[-1500:] if m.log.exists() else '(no log)'}"
            for m in self.members
        )


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A 3-member etcd cluster for the session (one per xdist worker); killed at its end. Tests that kill or
    stop members start them again before they end, and each uses its own keys (its own group)."""
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()
