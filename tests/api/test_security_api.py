"""The own API's fences: loopback by default, the bearer token on every state-changing route (found by
enumerating the app's routes), bounded bodies (declared, chunked), 400s that name the field; and malicious
inbound Alertmanager webhooks that name containers the config does not, against a real Docker engine."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.routing import Route

from tests.service.test_daemon import PAYLOAD, wait_for
from tests.support.configs import AUTH, TOKEN, target, write_config
from tests.support.docker_engine import ServerContainers, wait_http
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from vllm_watchdog.actions.runtimes.docker import DockerRuntime
from vllm_watchdog.api.app import ApiOptions, build_app
from vllm_watchdog.api.control import MAX_BODY, READ_METHODS
from vllm_watchdog.api.prometheus import READ_POSTS
from vllm_watchdog.config.model import load_config, parse_config
from vllm_watchdog.gateway.config import GatewayConfig
from vllm_watchdog.service.daemon import Daemon, DaemonOptions

pytestmark = pytest.mark.anyio
RELOAD_LIMIT = 64 * 1024


def _never(*args: Any) -> Any:
    raise AssertionError("a refused request reached a handler")


def bare_app() -> Any:
    """The app the daemon serves, with nothing behind it: for what it does before reading what it serves."""
    unused: Any = None
    return build_app(
        ApiOptions(
            monitor=unused,
            evaluation=unused,
            remediator=unused,
            registry=CollectorRegistry(),
            reload=_never,
            healthy=_never,
            gateway=unused,
            clock=time.time,
        )
    )


def app_routes() -> list[tuple[str, str]]:
    """(method, path) of every route of the app the daemon serves, path parameters filled in."""
    app = bare_app()  # listing the routes reads none of what they serve
    out = []
    for route in app.routes:
        assert isinstance(route, Route), route
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        out += [(method, path) for method in sorted(route.methods or ())]
    return out


@pytest.mark.parametrize("path", sorted(READ_POSTS))
async def test_a_client_gone_before_its_body_arrived_gets_no_traceback(path: str) -> None:
    """A dropped upload (a flood of them while the listener evicts) must not raise out of the app: uvicorn would
    log a 3 kB traceback per connection."""
    app = bare_app()  # the body is read before anything the app serves is touched
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": b"query=up", "more_body": True}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/x-www-form-urlencoded"), (b"content-length", b"1000")]
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 9460),
        "scheme": "http",
        "http_version": "1.1",
        "root_path": "",
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 400, sent


async def _start(cfg: Path) -> tuple[Daemon, asyncio.Task[None]]:
    d = Daemon.load(DaemonOptions(str(cfg), env={}))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait([task, asyncio.create_task(ready.wait())], timeout=30, return_when="FIRST_COMPLETED")
    if task.done():
        task.result()
    return d, task


@pytest.fixture
async def api(tmp_path: Path, fault: FaultServer) -> AsyncIterator[tuple[str, int, Path]]:
    """A daemon with a token and a gateway (so that every route has something behind it); base URL, port, config."""
    fault.vllm_like(PAYLOAD)
    port, gport = free_port(), free_port()
    cfg = write_config(
        tmp_path,
        target(fault.url),
        port=port,
        global_settings=None,
        rest=f"""actions:
  restart: {{type: restart}}
gateway: {{listen: "127.0.0.1:{gport}"}}
dry_run: true
""",
    )
    d, task = await _start(cfg)
    yield f"http://127.0.0.1:{port}", port, cfg
    d.stop()
    await asyncio.wait_for(task, 15)


def test_the_defaults_listen_on_loopback_only() -> None:
    defaults = load_config(None, env={})  # the embedded defaults, as `vllm-watchdog run` without --config
    assert (defaults.listen_host, defaults.listen_port) == ("127.0.0.1", 9460)
    assert defaults.listens_on_loopback
    assert defaults.gateway is not None and defaults.gateway.listen_host == "127.0.0.1"
    minimal = parse_config(
        'targets: [{name: v, url: "http://127.0.0.1:8000"}]\ngateway: {}\n', "minimal.yml", env={}
    )
    assert minimal.listen_host == "127.0.0.1" and minimal.listens_on_loopback
    assert minimal.gateway is not None and minimal.gateway.listen_host == "127.0.0.1"
    assert GatewayConfig(target="t", upstream="http://127.0.0.1:8000").listen_host == "127.0.0.1"
    wide = parse_config(
        'listen: 0.0.0.0:9460\ntargets: [{name: v, url: "http://127.0.0.1:8000"}]\n', "wide.yml", env={}
    )
    assert not wide.listens_on_loopback  # what makes the daemon warn at start


async def test_every_state_changing_route_needs_the_token(api: tuple[str, int, Path]) -> None:
    base, _, _ = api
    routes = app_routes()
    # The only POSTs without the token: Prometheus' query API, which reads (Grafana POSTs its queries).
    assert {"/api/v1/query", "/api/v1/query_range", "/api/v1/series", "/api/v1/labels"} == READ_POSTS
    changing = [(m, p) for m, p in routes if m not in READ_METHODS and not (m == "POST" and p in READ_POSTS)]
    # Enumerated, not listed: a route added later is checked too. These must be among them.
    assert {("POST", "/-/reload"), ("POST", "/api/v1/alertmanager"), ("DELETE", "/api/v1/silences/x")} <= set(
        changing
    )
    assert len(changing) >= 9, changing
    async with httpx.AsyncClient(timeout=10) as c:
        for method, path in [*changing, ("POST", "/no/such/route"), ("PUT", "/api/v1/actions")]:
            for headers in ({}, {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer"}):
                r = await c.request(method, base + path, headers=headers, content=b"{}")
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.headers["www-authenticate"] == 'Bearer realm="vllm-watchdog"'
            for wrong in (TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "x"):
                r = await c.request(method, base + path, headers={"Authorization": f"Bearer {wrong}"})
                assert r.status_code == 403 and r.json()["error"] == "invalid bearer token", (method, path)
        for method, path in routes:  # reads are open
            if method in READ_METHODS and "/x" not in path:
                assert (await c.request(method, base + path)).status_code in (200, 400), path
        assert (await c.post(base + "/api/v1/resume", headers=AUTH)).status_code == 200


async def test_a_reload_can_turn_the_control_api_off_at_once(api: tuple[str, int, Path]) -> None:
    base, _, cfg = api
    cfg.write_text(cfg.read_text().replace(f"api_token: {TOKEN}\n", ""))
    async with httpx.AsyncClient(timeout=10) as c:
        assert (await c.post(base + "/-/reload", headers=AUTH)).status_code == 200
        for method, path in app_routes():
            if method not in READ_METHODS and not (method == "POST" and path in READ_POSTS):
                r = await c.request(method, base + path, headers=AUTH)
                assert r.status_code == 403 and "control API disabled" in r.json()["error"], (method, path)


async def test_oversized_bodies_get_413(api: tuple[str, int, Path]) -> None:
    base, _, _ = api
    async with httpx.AsyncClient(timeout=30) as c:
        for path, limit in (("/api/v1/alertmanager", MAX_BODY), ("/-/reload", RELOAD_LIMIT)):
            for size in (limit + 1, limit + 300_000):  # the client is still sending when the answer comes
                r = await c.post(base + path, headers=AUTH, content=b" " * size)
                assert r.status_code == 413 and f"over {limit} bytes" in r.json()["error"], (path, r.text)
                assert r.headers["connection"] == "close"
            assert (await c.post(base + path, headers=AUTH, content=b" " * limit)).status_code != 413

            async def chunks(total: int) -> AsyncIterator[bytes]:
                for _ in range(total // 4096):
                    yield b" " * 4096

            r = await c.post(base + path, headers=AUTH, content=chunks(limit + 8192))  # chunked: no length
            assert r.status_code == 413, (path, r.text)


def _status_line(port: int, head: bytes, body: bytes = b"", repeat: int = 0) -> tuple[bytes, int]:
    """Send `head`, then `body` up to `repeat` times while no answer has come; the answer's first line and
    the bytes of body sent before it (or before the server closed)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        sock.sendall(head)
        sock.setblocking(False)
        answer, sent, pending = b"", 0, memoryview(b"")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not pending and repeat > 0:
                pending, repeat = memoryview(body), repeat - 1
            readable, writable, _ = select.select([sock], [sock] if pending else [], [], 1)
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    break
                answer += data
                if not data or b"\r\n" in answer:
                    break
            if writable:
                try:
                    n = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    continue  # the server closed on us; read what it said
                sent, pending = sent + n, pending[n:]
        return answer.split(b"\r\n", 1)[0], sent
    finally:
        sock.close()


async def test_a_declared_or_chunked_body_over_the_limit_is_refused_without_reading_it(
    api: tuple[str, int, Path],
) -> None:
    _, port, _ = api
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    huge = 100 * 1024 * 1024
    # A Content-Length far over the limit and no body at all: answered from the header alone.
    head = b"POST /api/v1/alertmanager HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: %d\r\n\r\n" % huge
    status, _ = await asyncio.to_thread(_status_line, port, head)
    assert status == b"HTTP/1.1 413 Request Entity Too Large", status
    # A chunked body that never ends: refused after about the limit, the connection closed on the rest.
    chunk = b" " * 65536
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    head = b"POST /api/v1/alertmanager HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n"
    status, sent = await asyncio.to_thread(_status_line, port, head, frame, huge // len(chunk))
    assert status == b"HTTP/1.1 413 Request Entity Too Large", status
    assert MAX_BODY < sent < huge // 2, sent


async def test_malformed_bodies_get_400_naming_the_field(api: tuple[str, int, Path]) -> None:
    base, _, _ = api
    bad: list[tuple[str, Any, str]] = [
        ("/api/v1/pause", b"{not json", "body is not JSON"),
        ("/api/v1/pause", b'["a list"]', "body must be a JSON object"),
        ("/api/v1/pause", {"reason": 5}, "reason"),
        ("/api/v1/silences", {"matchers": "alertname=x", "duration": "1h"}, "matchers"),
        ("/api/v1/silences", {"matchers": [{"name": 1, "value": "x"}], "duration": "1h"}, "matchers[0].name"),
        ("/api/v1/silences", {"matchers": ["a=b"], "endsAt": 12}, "endsAt"),
        ("/api/v1/silences", {"matchers": ["a=b"], "duration": "1h", "comment": []}, "comment"),
        ("/api/v1/actions/restart/run", {"target": ["vllm-0"]}, "target"),
        ("/api/v1/alertmanager", {"alerts": {}}, "alerts"),
        (
            "/api/v1/alertmanager",
            {"alerts": [{"labels": {"a": "b"}, "annotations": 3}]},
            "alerts[0].annotations",
        ),
        ("/api/v1/alertmanager", {"alerts": [{"labels": {}, "endsAt": 5}]}, "alerts[0].endsAt"),
        ("/api/v1/gateway/breakers", {"session": 5}, "session"),
        ("/api/v1/gateway/breakers", {"session": ""}, "session"),
        ("/api/v1/gateway/breakers", {"session": "s", "duration": "soon"}, "duration"),
        ("/api/v1/gateway/breakers", {"session": "s", "reason": False}, "reason"),
    ]
    async with httpx.AsyncClient(timeout=10) as c:
        for path, body, field in bad:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            r = await c.post(base + path, content=content, headers=AUTH)
            assert r.status_code == 400, (path, body, r.text)
            assert field in r.json()["error"], (path, body, r.json())


# -- malicious inbound webhooks, against a real Docker engine ---------------------------------------------


class Stack:
    """A watchdog acting on one configured container, beside a decoy container it must never touch."""

    def __init__(self, base: str, client: Any, mine: str, decoy: str, decoy_port: int) -> None:
        self.base, self.client, self.mine, self.decoy, self.decoy_port = base, client, mine, decoy, decoy_port
        self.since_ns = time.time_ns()  # the engine filters by whole seconds: the decoy's own start is older
        self.started = {n: self.state(n)["StartedAt"] for n in (mine, decoy)}

    def state(self, name: str) -> dict[str, Any]:
        """The container's State."""
        return dict(self.client.containers.get(name).attrs["State"])

    async def refused(self, c: httpx.AsyncClient) -> float:
        """vllm_watchdog_actions_total of refused restarts."""
        for line in (await c.get(self.base + "/metrics")).text.splitlines():
            if line.startswith('vllm_watchdog_actions_total{action="restart",outcome="refused"'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    async def send_each_refused(self, c: httpx.AsyncClient, label_sets: list[dict[str, str]]) -> None:
        """POST each as an inbound firing alert: accepted (valid token), nothing queued, one refusal more."""
        for labels in label_sets:
            before = await self.refused(c)
            body = {
                "version": "4",
                "alerts": [{"status": "firing", "labels": {"alertname": "Hung", **labels}}],
            }
            r = await c.post(self.base + "/api/v1/alertmanager", json=body, headers=AUTH)
            assert r.json() == {"status": "success", "alerts": 1, "queued": 0}, (labels, r.text)
            assert await self.refused(c) == before + 1, labels
        history = (await c.get(self.base + "/api/v1/actions")).json()["data"]["history"]
        assert any(
            h["outcome"] == "refused" and h["reason"] == "the alert names no configured target"
            for h in history
        ), history
        assert not [h for h in history if h["outcome"] != "refused"], history  # nothing ran

    def decoy_untouched(self) -> None:
        """The decoy still runs since the same instant, and the engine saw no event for it."""
        state = self.state(self.decoy)
        assert state["Running"] and state["StartedAt"] == self.started[self.decoy], state
        found = self.client.events(
            since=self.since_ns // 10**9,
            until=int(time.time()) + 1,
            filters={"container": self.decoy},
            decode=True,
        )
        events = [e for e in found if int(e.get("timeNano", 0)) >= self.since_ns]
        assert events == [], events


@pytest.fixture
async def stack(
    tmp_path: Path, server_containers: ServerContainers, docker_client: Any
) -> AsyncIterator[Stack]:
    """Two cheap server containers; the watchdog's config names only the first, and acts for real."""
    mine, mine_port = server_containers.run()
    decoy, decoy_port = server_containers.run()
    port = free_port()
    cfg = write_config(
        tmp_path,
        target(f"http://127.0.0.1:{mine_port}", name="vllm-d", container=mine),
        port=port,
        rest="""routes:
  - {match: {alertname: Hung}, actions: [restart]}
actions:
  restart: {type: restart, cooldown: 0s, startup_grace: 0s, drain_timeout: 1s, stop_timeout: 5s, ready_timeout: 3s}
""",
    )
    d = Daemon.load(DaemonOptions(str(cfg), env={}, docker_client=lambda: docker.from_env(timeout=120)))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait([task, asyncio.create_task(ready.wait())], timeout=30, return_when="FIRST_COMPLETED")
    if task.done():
        task.result()
    yield Stack(f"http://127.0.0.1:{port}", docker_client, mine, decoy, decoy_port)
    d.stop()
    await asyncio.wait_for(task, 15)


async def test_malicious_webhooks_naming_other_servers_are_refused(stack: Stack) -> None:
    s = stack
    async with httpx.AsyncClient(timeout=10) as c:
        await s.send_each_refused(
            c,
            [
                {"instance": "evil"},
                {"instance": s.decoy},
                {"target": s.decoy},
                {
                    "instance": f"127.0.0.1:{s.decoy_port}"
                },  # the decoy's address, as a central Prometheus names it
                {"instance": "evil", "container": s.mine},  # our container, but a server we do not know
                {"target": "evil", "instance": "vllm-d"},  # `target` decides, and names none of ours
            ],
        )
        await asyncio.sleep(2)  # a job queued by mistake would have started by now
        s.decoy_untouched()
        assert s.state(s.mine)["StartedAt"] == s.started[s.mine]
        # The control: the same webhook naming the configured server does restart it, and only it.
        r = await c.post(
            s.base + "/api/v1/alertmanager",
            json={"alerts": [{"status": "firing", "labels": {"alertname": "Hung", "instance": "vllm-d"}}]},
            headers=AUTH,
        )
        assert r.json()["queued"] == 1
        # (It then fails its readiness check: the small server is no vLLM. What counts is that it acted.)
        status: Any = await wait_for(
            c,
            s.base + "/api/v1/actions",
            lambda j: any(
                h["target"] == "vllm-d" and h["outcome"] != "running" for h in j["data"]["history"]
            ),
            limit=120,
        )
        (done,) = [h for h in status["data"]["history"] if h["target"]]
        assert {"stop", "start"} <= {step["step"] for step in done["steps"]}, done
    assert s.state(s.mine)["StartedAt"] != s.started[s.mine]
    s.decoy_untouched()


async def test_malicious_webhooks_naming_other_containers_or_units_are_refused(stack: Stack) -> None:
    """Labels that name a container or unit other than the target's own: refused even when the rest of the
    alert names the configured server (or, with one target, names none)."""
    s = stack
    async with httpx.AsyncClient(timeout=10) as c:
        await s.send_each_refused(
            c,
            [
                {"container": s.decoy},
                {"name": s.decoy},
                {"container": f"/{s.decoy}"},
                {"instance": "vllm-d", "container": s.decoy},
                {"target": "vllm-d", "name": s.decoy},
                {"instance": "vllm-d", "container": s.mine, "name": s.decoy},
                {"instance": "vllm-d", "unit": "docker.service"},
            ],
        )
        await asyncio.sleep(2)
    s.decoy_untouched()
    assert s.state(s.mine)["StartedAt"] == s.started[s.mine]


# -- the documented Docker socket proxy (security/docker-socket-proxy.cfg) --------------------------------

PROXY_CONFIG = Path(__file__).resolve().parents[2] / "security" / "docker-socket-proxy.cfg"
# What DockerRuntime asks of the engine through restart, relaunch, commit and rollback (docs/security.md).
RUNTIME_CALLS = {
    "GET /version",
    "GET /containers/{name}/json",
    "GET /containers/{name}.watchdog-previous/json",
    "GET /containers/{id}/json",
    "POST /containers/{id}/stop",
    "POST /containers/{id}/start",
    "POST /containers/{id}/rename",
    "POST /containers/create",
    "DELETE /containers/{id}",
    "GET /images/{image}/json",
}


class SocketProxy:
    """HAProxy running the documented config for one container name, on a free loopback port."""

    def __init__(self, tmp_path: Path, container: str) -> None:
        socket_path = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
        self.port = free_port()
        text = PROXY_CONFIG.read_text()
        rules = "".join(line for line in text.splitlines(keepends=True) if not line.lstrip().startswith("#"))
        assert rules.count("vllm-0") == 3 and "127.0.0.1:2375" in rules and "/var/run/docker.sock" in rules
        text = text.replace("vllm-0", container).replace("127.0.0.1:2375", f"127.0.0.1:{self.port}")
        cfg = tmp_path / "haproxy.cfg"
        cfg.write_text(text.replace("/var/run/docker.sock", socket_path))
        self.log = tmp_path / "haproxy.log"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                ["haproxy", "-db", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT
            )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/_ping", timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError(f"haproxy did not start: {self.log.read_text()[-2000:]}")

    def requests(self) -> list[tuple[int, str, str]]:
        """(status, method, path and query) of every request the proxy has logged."""
        out = []
        for line in self.log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[1].isdigit():
                out.append((int(parts[1]), parts[2], parts[3]))
        return out

    def close(self) -> None:
        """Stop HAProxy."""
        self.proc.terminate()
        self.proc.wait(10)


def _shape(method: str, uri: str, name: str) -> str:
    path = re.sub(r"^/v[0-9.]+", "", uri.split("?", 1)[0])
    path = re.sub(r"/[0-9a-f]{64}(?=/|$)", "/{id}", path).replace(f"/{name}", "/{name}")
    return f"{method} " + re.sub(r"^/images/.+/json$", "/images/{image}/json", path)


def _answer(port: int) -> Any:
    return httpx.get(f"http://127.0.0.1:{port}/", timeout=10).json()


async def test_the_documented_socket_proxy_lets_docker_actions_through_and_nothing_else(
    tmp_path: Path, server_containers: ServerContainers, docker_client: Any
) -> None:
    name, port = server_containers.run()
    decoy, _ = server_containers.run()
    decoy_id = docker_client.containers.get(decoy).id
    started = docker_client.containers.get(decoy).attrs["State"]["StartedAt"]
    proxy = SocketProxy(tmp_path, name)
    try:
        client = docker.DockerClient(base_url=f"tcp://127.0.0.1:{proxy.port}", timeout=120)
        runtime = DockerRuntime("t", name, client)
        launch = await runtime.launch()
        assert await runtime.is_running() and await runtime.started_at() is not None
        await runtime.stop(5)
        await runtime.start()
        await asyncio.to_thread(wait_http, docker_client, name, f"http://127.0.0.1:{port}/", 60)
        await runtime.replace(launch.with_args(["--port", str(port), "--flavour", "b"]), stop_timeout=5)
        await asyncio.to_thread(wait_http, docker_client, name, f"http://127.0.0.1:{port}/", 60)
        assert _answer(port)["args"][-1] == "b" and await runtime.has_previous()
        await runtime.commit()
        await runtime.replace(launch.with_args(["--port", str(port), "--flavour", "c"]), stop_timeout=5)
        await runtime.rollback(stop_timeout=5)
        await asyncio.to_thread(wait_http, docker_client, name, f"http://127.0.0.1:{port}/", 60)
        assert _answer(port)["args"][-1] == "b"
        await runtime.close()
        made = [r for r in proxy.requests() if r[2] != "/_ping"]  # the ping: SocketProxy's own start-up check
        assert made and all(status < 400 or status == 404 for status, _, _ in made), made
        assert {_shape(m, u, name) for _, m, u in made} == RUNTIME_CALLS, made
        assert not [u for _, _, u in made if decoy in u or decoy_id in u]
        creates = [u for _, m, u in made if m == "POST" and "/containers/create" in u]
        assert creates and all(u.endswith(f"?name={name}") for u in creates), creates

        forbidden = [
            ("GET", "/v1.41/containers/json"),  # listing: how ids would be found
            ("GET", f"/v1.41/containers/{decoy}/json"),
            ("POST", f"/v1.41/containers/{decoy}/stop"),
            ("POST", f"/v1.41/containers/{decoy_id[:12]}/stop"),  # a short id (prefix) is not an id
            ("DELETE", f"/v1.41/containers/{decoy}?force=1"),
            ("POST", "/v1.41/containers/create?name=evil"),
            ("POST", "/v1.41/containers/create"),
            ("POST", f"/v1.41/containers/{decoy_id}/rename?name=evil"),
            ("POST", f"/v1.41/containers/{decoy_id}/exec"),
            ("POST", f"/v1.41/containers/{decoy_id}/kill"),
            ("GET", f"/v1.41/containers/{decoy_id}/logs?stdout=1"),
            ("GET", f"/v1.41/containers/{name}/logs?stdout=1"),
            ("POST", "/v1.41/images/create?fromImage=alpine"),
            ("POST", "/v1.41/build"),
            ("GET", "/v1.41/info"),
            ("POST", "/v1.41/volumes/create"),
            ("PUT", f"/v1.41/containers/{decoy_id}/archive?path=/"),
        ]
        async with httpx.AsyncClient(timeout=10) as c:
            for method, path in forbidden:
                r = await c.request(method, proxy.url + path, json={})
                assert r.status_code == 403, (method, path, r.status_code)
    finally:
        proxy.close()
    state = docker_client.containers.get(decoy).attrs["State"]
    assert state["Running"] and state["StartedAt"] == started
