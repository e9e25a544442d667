"""Notifiers: Alertmanager API v2 and webhooks through the persisted delivery queue, against real receivers.

A real Alertmanager (tests/support/alertmanager_server.py) checks what Alertmanager makes of the bodies; a small
HTTP receiver on 127.0.0.1 records webhook payloads and answers what a test programs. Retry timing uses
injected `now`, so minutes of backoff play in milliseconds.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.alertmanager_server import AlertmanagerServer, running_alertmanager
from tests.support.clock import T0, Clock
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from vllm_watchdog.matchers import parse_matcher
from vllm_watchdog.notifiers.alert import OutgoingAlert
from vllm_watchdog.notifiers.alertmanager import alerts_body, am_time, api_url
from vllm_watchdog.notifiers.config import NotifierConfig
from vllm_watchdog.notifiers.delivery import MAX_BATCH, backoff, retry_after
from vllm_watchdog.notifiers.hub import ActionEvent, HubOptions, NotificationHub
from vllm_watchdog.notifiers.webhook import alerts_payload, event_payload, fingerprint, webhook_alert

pytestmark = pytest.mark.anyio


@dataclass
class Answer:
    """One programmed reply of the receiver."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass(frozen=True)
class Received:
    """One request the receiver got: path, lower-cased headers, JSON body."""

    path: str
    headers: dict[str, str]
    body: Any


class Receiver:
    """A real HTTP receiver on 127.0.0.1: answers programmed replies in turn (then 200), records requests."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.requests: list[Received] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with outer.lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    outer.requests.append(Received(self.path, headers, json.loads(body)))
                    answer = outer.answers.pop(0) if outer.answers else Answer()
                time.sleep(answer.delay)
                self.send_response(answer.status)
                for k, v in answer.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                with suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(answer.body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def answer(self, *answers: Answer) -> None:
        """Queue replies for the next requests."""
        with self.lock:
            self.answers.extend(answers)

    def bodies(self) -> list[Any]:
        """The JSON bodies received so far."""
        with self.lock:
            return [r.body for r in self.requests]

    def wait_for(self, check: Any, timeout: float = 10.0) -> list[Any]:
        """Poll until check(bodies) holds; fail the test after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check(self.bodies()):
                return self.bodies()
            time.sleep(0.05)
        pytest.fail(f"the receiver never got what was expected within {timeout}s; got {self.bodies()}")

    def close(self) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A programmable webhook receiver on 127.0.0.1."""
    r = Receiver()
    yield r
    r.close()


def alert(
    name: str, state: str = "firing", start: float = T0, end: float = T0 + 240, **labels: str
) -> OutgoingAlert:
    """An alert as the rule engine hands it to notifiers."""
    return OutgoingAlert(
        labels={"alertname": name, **labels},
        annotations={"summary": f"{name} is happening"},
        state=state,
        starts_at=start,
        ends_at=end,
        value=1.0,
        generator_url="http://127.0.0.1:9/graph?g0.expr=up",
    )


def notifier(name: str, kind: str, url: str, **kw: Any) -> NotifierConfig:
    """A notifier config with fast defaults for tests."""
    kw.setdefault("timeout", 5.0)
    return NotifierConfig(name=name, type=kind, url=url, **kw)


@asynccontextmanager
async def hub_for(
    *notifiers: NotifierConfig, db: Path | None = None, clock: Clock | None = None
) -> AsyncIterator[NotificationHub]:
    """A hub with its own loopback-only HTTP client, closed afterwards."""
    async with httpx.AsyncClient(trust_env=False) as client:
        hub = NotificationHub(
            notifiers,
            HubOptions(
                client,
                str(db) if db else None,
                external_url="http://127.0.0.1:9099",
                clock=clock or Clock(),
            ),
        )
        try:
            yield hub
        finally:
            await hub.aclose()


def dead_url() -> str:
    """A 127.0.0.1 URL nothing listens on."""
    return f"http://127.0.0.1:{free_port()}/hook"


# --- payload shapes -------------------------------------------------------------------------------


def test_alertmanager_body_is_what_prometheus_posts() -> None:
    a = alert("Down", start=T0 + 0.25, end=T0 + 240, job="vllm")
    assert alerts_body([a]) == [
        {
            "labels": {"alertname": "Down", "job": "vllm"},
            "annotations": {"summary": "Down is happening"},
            "startsAt": "2023-11-14T22:13:20.250Z",
            "endsAt": "2023-11-14T22:17:20.000Z",
            "generatorURL": "http://127.0.0.1:9/graph?g0.expr=up",
        }
    ]
    assert am_time(0) == "1970-01-01T00:00:00.000Z"
    assert api_url("http://127.0.0.1:9093") == "http://127.0.0.1:9093/api/v2/alerts"
    assert api_url("http://127.0.0.1:9093/am/") == "http://127.0.0.1:9093/am/api/v2/alerts"
    assert api_url("http://127.0.0.1:9093/api/v2/alerts") == "http://127.0.0.1:9093/api/v2/alerts"


def test_backoff_and_retry_after() -> None:
    assert [backoff(n, 1.0, 10.0) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert backoff(10_000, 1.0, 300.0) == 300.0
    assert retry_after("7", T0) == 7.0
    assert retry_after("Tue, 14 Nov 2023 22:13:50 GMT", T0) == 30.0
    assert retry_after("soon", T0) is None
    assert retry_after(None, T0) is None


# --- a real Alertmanager --------------------------------------------------------------------------


async def test_firing_then_resolved_reach_a_real_alertmanager(tmp_path: Path, receiver: Receiver) -> None:
    now = float(int(time.time()))
    firing = alert("WatchdogFiring", start=now - 60.25, end=now + 300, job="vllm")
    with running_alertmanager(tmp_path / "am", webhook_url=f"{receiver.url}/am") as am:
        async with hub_for(notifier("am", "alertmanager", am.url)) as hub:
            hub.alerts([firing], now)
            await hub.deliver(now)
            listed = am.wait_for_alerts(lambda got: len(got) == 1, alertname="WatchdogFiring")[0]
            assert listed["status"]["state"] == "active"
            assert listed["labels"] == dict(firing.labels)
            assert listed["annotations"] == dict(firing.annotations)
            assert (listed["startsAt"], listed["endsAt"]) == (am_time(now - 60.25), am_time(now + 300))
            assert listed["generatorURL"] == firing.generator_url
            assert listed["fingerprint"] == fingerprint(firing.labels)

            resolved_at = time.time() - 0.5
            resolved = replace(firing, state="resolved", ends_at=resolved_at)
            hub.alerts([resolved], now + 1)
            await hub.deliver(now + 1)
            am.wait_for_alerts(lambda got: got == [], alertname="WatchdogFiring")
            assert hub.stats()["am"].sent == 2

        # What Alertmanager forwarded is exactly what our own webhook notifier sends for the same alerts.
        bodies = receiver.wait_for(lambda b: any(x["status"] == "resolved" for x in b))
        first, last = bodies[0], bodies[-1]
        assert first["alerts"] == [webhook_alert(firing)]
        assert last["alerts"] == [webhook_alert(resolved)]
        ours = alerts_payload([resolved], "test", am.url)
        assert set(ours) - {"type"} == set(last)
        for key in (
            "version",
            "groupKey",
            "status",
            "receiver",
            "groupLabels",
            "commonLabels",
            "commonAnnotations",
        ):
            assert ours[key] == last[key], key


async def test_alertmanager_down_then_back_loses_nothing(tmp_path: Path) -> None:
    now = time.time()
    am = AlertmanagerServer(tmp_path)
    am.start()
    try:
        cfg = notifier("am", "alertmanager", am.url, backoff_initial=1.0, backoff_max=4.0)
        async with hub_for(cfg) as hub:
            am.stop()
            batches = [[alert("Lost", end=now + 600, n=str(i * 50 + j)) for j in range(50)] for i in range(3)]
            for step, batch in enumerate(batches):
                hub.alerts(batch, now + step)
                await hub.deliver(now + step)
            stats = hub.stats()["am"]
            assert (stats.queued, stats.sent, stats.failed, stats.dropped) == (150, 0, 0, 0)
            assert stats.retries == 2  # at now+0 and now+1; at now+2 it was backing off (2 s after the 2nd)
            assert stats.next_attempt == now + 1 + 2.0
            assert stats.last_error

            am.start()  # same port, same storage
            await hub.deliver(now + 2.9)  # still backing off: nothing sent
            assert hub.stats()["am"].queued == 150
            await hub.deliver(now + 3)
            stats = hub.stats()["am"]
            assert (stats.queued, stats.sent, stats.retries) == (0, 150, 2)
        got = am.wait_for_alerts(lambda got: len(got) == 150, alertname="Lost")
        assert sorted(int(a["labels"]["n"]) for a in got) == list(range(150))
        assert {a["status"]["state"] for a in got} == {"active"}
    finally:
        am.close()


async def test_newer_alert_state_supersedes_queued_one_for_alertmanager(receiver: Receiver) -> None:
    am_cfg = notifier("am", "alertmanager", receiver.url)
    hook_cfg = notifier("hook", "webhook", f"{receiver.url}/hook")
    async with hub_for(am_cfg, hook_cfg) as hub:
        a_firing, b_firing = alert("A"), alert("B")
        a_resolved = replace(a_firing, state="resolved", ends_at=T0 + 30)
        hub.alerts([a_firing, b_firing], T0)
        hub.alerts([a_resolved], T0 + 30)
        assert hub.stats()["am"].queued == 2
        assert hub.stats()["hook"].queued == 3
        await hub.deliver(T0 + 30)
    by_path = {r.path: r.body for r in receiver.requests}
    assert by_path["/api/v2/alerts"] == alerts_body([b_firing, a_resolved])
    assert [(a["labels"]["alertname"], a["status"]) for a in by_path["/hook"]["alerts"]] == [
        ("A", "firing"),
        ("B", "firing"),
        ("A", "resolved"),
    ]


# --- webhooks ---------------------------------------------------------------------------------------


async def test_webhook_payloads_headers_and_order(receiver: Receiver) -> None:
    headers = {"Authorization": "Bearer t0ken", "X-Team": "inference"}
    async with hub_for(notifier("ops", "webhook", f"{receiver.url}/hook", headers=headers)) as hub:
        firing = alert("HighLatency", job="vllm", target="a")
        resolved = alert("QueueFull", "resolved", end=T0 + 60, job="vllm", target="a")
        event = ActionEvent(
            "restart-a", "restart", "a", "succeeded", "ready after 40s", T0 + 90, {"job": "vllm"}, False, 7
        )
        hub.alerts([firing, resolved], T0)
        hub.event(event, T0 + 90)
        hub.alerts([alert("Late", start=T0 + 100)], T0 + 100)
        await hub.deliver(T0 + 100)
    first, second, third = receiver.bodies()
    assert first == {
        "version": "4",
        "type": "alert",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "ops",
        "groupLabels": {},
        "commonLabels": {"job": "vllm", "target": "a"},
        "commonAnnotations": {},
        "externalURL": "http://127.0.0.1:9099",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "HighLatency", "job": "vllm", "target": "a"},
                "annotations": {"summary": "HighLatency is happening"},
                "startsAt": "2023-11-14T22:13:20Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://127.0.0.1:9/graph?g0.expr=up",
                "fingerprint": fingerprint(firing.labels),
            },
            {
                "status": "resolved",
                "labels": {"alertname": "QueueFull", "job": "vllm", "target": "a"},
                "annotations": {"summary": "QueueFull is happening"},
                "startsAt": "2023-11-14T22:13:20Z",
                "endsAt": "2023-11-14T22:14:20Z",
                "generatorURL": "http://127.0.0.1:9/graph?g0.expr=up",
                "fingerprint": fingerprint(resolved.labels),
            },
        ],
    }
    assert second["type"] == "action"
    assert second["groupLabels"] == {"action": "restart-a", "target": "a"}
    assert second["event"] == {
        "action": "restart-a",
        "type": "restart",
        "target": "a",
        "outcome": "succeeded",
        "reason": "ready after 40s",
        "at": "2023-11-14T22:14:50Z",
        "labels": {"job": "vllm"},
        "dryRun": False,
        "actionId": 7,
    }
    assert second == event_payload(event.to_json(), "ops", "http://127.0.0.1:9099")
    assert [a["labels"]["alertname"] for a in third["alerts"]] == ["Late"]
    sent = receiver.requests[0].headers
    assert (sent["authorization"], sent["x-team"]) == ("Bearer t0ken", "inference")
    assert sent["content-type"] == "application/json"


def test_an_action_event_carries_its_incident_as_an_annotation() -> None:
    event = ActionEvent("r", "restart", "a", "started", "restart a", T0, {}, False, 3, {"incident": "i-3"})
    payload = event_payload(event.to_json(), "ops", "http://127.0.0.1:9099")
    assert payload["commonAnnotations"] == {"incident": "i-3"}
    assert payload["event"]["annotations"] == {"incident": "i-3"}
    plain = ActionEvent("r", "restart", "a", "skipped", "cooldown", T0, {}, False).to_json()
    assert "annotations" not in plain and event_payload(plain, "ops", "")["commonAnnotations"] == {}


async def test_matchers_send_resolved_and_events_only_to_webhooks(receiver: Receiver) -> None:
    critical = (parse_matcher('severity="critical"'),)
    pager = notifier("pager", "webhook", f"{receiver.url}/pager", matchers=critical, send_resolved=False)
    am = notifier("am", "alertmanager", receiver.url)
    async with hub_for(pager, am) as hub:
        hub.alerts([alert("A", severity="critical"), alert("B", severity="warning")], T0)
        hub.alerts([alert("C", "resolved", severity="critical")], T0)
        hub.event(ActionEvent("r", "restart", "a", "failed", "x", T0, {"severity": "critical"}, False), T0)
        hub.event(ActionEvent("r", "restart", "a", "failed", "x", T0, {"severity": "info"}, False), T0)
        assert hub.stats()["pager"].queued == 2
        assert hub.stats()["am"].queued == 3  # every alert, no events
        await hub.deliver(T0)
    pager_bodies = [r.body for r in receiver.requests if r.path == "/pager"]
    assert [a["labels"]["alertname"] for a in pager_bodies[0]["alerts"]] == ["A"]
    assert pager_bodies[1]["event"]["labels"] == {"severity": "critical"}
    assert len(pager_bodies) == 2


async def test_external_labels_are_added_to_sent_alerts_unless_the_alert_has_the_label(
    receiver: Receiver,
) -> None:
    am = notifier("am", "alertmanager", receiver.url)
    async with hub_for(am) as hub:
        hub.external_labels = {"cluster": "eu-1", "severity": "page"}
        hub.alerts([alert("A", severity="critical"), alert("B")], T0)
        await hub.deliver(T0)
    sent = {a["labels"]["alertname"]: a["labels"] for a in receiver.bodies()[0]}
    assert sent["A"] == {"alertname": "A", "cluster": "eu-1", "severity": "critical"}
    assert sent["B"] == {"alertname": "B", "cluster": "eu-1", "severity": "page"}


async def test_batches_of_at_most_64(receiver: Receiver) -> None:
    async with hub_for(notifier("am", "alertmanager", receiver.url)) as hub:
        hub.alerts([alert("Many", n=str(i)) for i in range(150)], T0)
        await hub.deliver(T0)
        assert hub.stats()["am"].sent == 150
    assert [len(b) for b in receiver.bodies()] == [MAX_BATCH, MAX_BATCH, 150 - 2 * MAX_BATCH]


# --- failures ---------------------------------------------------------------------------------------


async def test_5xx_is_retried_with_exponential_backoff(receiver: Receiver) -> None:
    clock = Clock()
    cfg = notifier("hook", "webhook", f"{receiver.url}/hook", backoff_initial=1.0, backoff_max=4.0)
    receiver.answer(Answer(503), Answer(500, b"oops"), Answer(502), Answer(429, headers={"Retry-After": "3"}))
    async with hub_for(cfg, clock=clock) as hub:
        hub.alerts([alert("Flaky")], T0)
        expected_next = [T0 + 1, T0 + 1 + 2, T0 + 3 + 4, T0 + 7 + 4]
        at, errors = T0, []
        for n, next_at in enumerate(expected_next, start=1):
            await hub.deliver(at)
            assert len(receiver.requests) == n
            errors.append(hub.stats()["hook"].last_error)
            assert hub.stats()["hook"].next_attempt == next_at
            await hub.deliver(next_at - 0.01)  # not due yet: no request
            assert len(receiver.requests) == n
            at = next_at
        assert errors == ["HTTP 503", "HTTP 500: oops", "HTTP 502", "HTTP 429"]
        clock.now = T0 + 42
        await hub.deliver(at)
        stats = hub.stats()["hook"]
    assert (stats.sent, stats.retries, stats.failed, stats.queued) == (1, 4, 0, 0)
    assert (stats.last_success, stats.next_attempt) == (T0 + 42, None)
    assert len({json.dumps(b, sort_keys=True) for b in receiver.bodies()}) == 1  # the same batch each time


async def test_retry_after_beyond_the_backoff_is_honoured(receiver: Receiver) -> None:
    cfg = notifier("hook", "webhook", f"{receiver.url}/hook", backoff_initial=1.0, backoff_max=60.0)
    receiver.answer(Answer(503, headers={"Retry-After": "30"}))
    async with hub_for(cfg) as hub:
        hub.alerts([alert("Busy")], T0)
        await hub.deliver(T0)
        assert hub.stats()["hook"].next_attempt == T0 + 30


async def test_4xx_is_dropped_and_counted_408_is_retried(receiver: Receiver) -> None:
    cfg = notifier("hook", "webhook", f"{receiver.url}/hook")
    receiver.answer(Answer(400, b"bad alert"), Answer(408))
    async with hub_for(cfg) as hub:
        hub.alerts([alert("Rejected")], T0)
        await hub.deliver(T0)
        stats = hub.stats()["hook"]
        assert (stats.failed, stats.queued, stats.retries) == (1, 0, 0)
        assert stats.last_error == "HTTP 400: bad alert"
        hub.alerts([alert("Timeout")], T0 + 1)
        await hub.deliver(T0 + 1)
        assert (hub.stats()["hook"].queued, hub.stats()["hook"].retries) == (1, 1)
        await hub.deliver(T0 + 2)
        stats = hub.stats()["hook"]
    assert (stats.sent, stats.failed, stats.queued) == (1, 1, 0)
    assert [b["alerts"][0]["labels"]["alertname"] for b in receiver.bodies()] == [
        "Rejected",
        "Timeout",
        "Timeout",
    ]


async def test_queue_bound_drops_the_oldest(receiver: Receiver) -> None:
    hook = notifier("hook", "webhook", f"{receiver.url}/hook", max_queue=5)
    am = notifier("am", "alertmanager", f"{receiver.url}/am", max_queue=5)
    async with hub_for(hook, am) as hub:
        for i in range(8):
            hub.alerts([alert("Burst", n=str(i))], T0 + i)
        stats = hub.stats()
        assert (stats["hook"].queued, stats["hook"].dropped) == (5, 3)
        assert (stats["am"].queued, stats["am"].dropped) == (5, 3)
        await hub.deliver(T0 + 8)
    hook_body = next(r.body for r in receiver.requests if r.path == "/hook")
    assert [a["labels"]["n"] for a in hook_body["alerts"]] == ["3", "4", "5", "6", "7"]
    am_body = next(r.body for r in receiver.requests if r.path.startswith("/am"))
    assert [a["labels"]["n"] for a in am_body] == ["3", "4", "5", "6", "7"]


async def test_garbage_slow_and_reset_answers(fault: FaultServer, receiver: Receiver) -> None:
    fault.set("/reset", b"{}", close_early=True)  # claims a longer body, then drops the connection
    fault.set("/slow", b"", delay=1.0)
    fault.set("/garbage", b"\x00\xffnot json at all" * 1000)
    reset = notifier("reset", "webhook", f"{fault.url}/reset")
    slow = notifier("slow", "webhook", f"{fault.url}/slow", timeout=0.2)
    garbage = notifier("garbage", "webhook", f"{fault.url}/garbage")
    dead = notifier("dead", "webhook", dead_url())
    async with hub_for(reset, slow, garbage, dead) as hub:
        hub.alerts([alert("X")], T0)
        await hub.deliver(T0)
        stats = hub.stats()
    for name in ("reset", "slow", "dead"):
        assert (stats[name].queued, stats[name].retries, stats[name].sent) == (1, 1, 0), name
        assert stats[name].last_error, name
    assert "timed out" in stats["slow"].last_error
    assert (stats["garbage"].sent, stats["garbage"].queued) == (1, 0)  # a 200 is a 200, whatever its body


# --- persistence and reloads ------------------------------------------------------------------------


async def test_queue_survives_a_new_hub_on_the_same_file(tmp_path: Path, receiver: Receiver) -> None:
    db = tmp_path / "notify.db"
    down = notifier("hook", "webhook", dead_url())
    event = ActionEvent("restart-a", "restart", "a", "started", "", T0 + 1, {}, True)
    async with hub_for(down, notifier("gone", "webhook", dead_url()), db=db) as hub:
        hub.alerts([alert("Kept", n="1"), alert("Kept", n="2")], T0)
        hub.event(event, T0 + 1)
        await hub.deliver(T0 + 1)
        assert hub.stats()["hook"].queued == 3
    up = replace(down, url=f"{receiver.url}/hook")  # same name and type: the queue is still its own
    async with hub_for(up, db=db) as hub:
        assert hub.stats()["hook"].queued == 3
        assert "gone" not in hub.stats()
        await hub.deliver(T0 + 2)
        assert hub.stats()["hook"].queued == 0
    first, second = receiver.bodies()
    assert [a["labels"]["n"] for a in first["alerts"]] == ["1", "2"]
    assert second["event"]["outcome"] == "started" and second["event"]["dryRun"] is True
    async with hub_for(up, db=db) as hub:
        assert hub.stats()["hook"].queued == 0


async def test_update_keeps_queues_of_kept_notifiers(receiver: Receiver) -> None:
    a = notifier("a", "webhook", dead_url())
    b = notifier("b", "webhook", dead_url())
    c = notifier("c", "webhook", dead_url())
    async with hub_for(a, b, c) as hub:
        hub.alerts([alert(f"N{i}", n=str(i)) for i in range(4)], T0)
        await hub.deliver(T0)
        assert hub.stats()["a"].next_attempt is not None
        hub.update((replace(a, url=f"{receiver.url}/a", max_queue=2), replace(b, type="alertmanager")))
        stats = hub.stats()
        assert set(stats) == {"a", "b"}
        assert (stats["a"].queued, stats["a"].dropped, stats["a"].next_attempt) == (2, 2, None)
        assert stats["b"].queued == 0  # its type changed: the old queue went with it
        await hub.deliver(T0 + 0.5)  # a new URL need not wait out the old one's backoff
    assert [a["labels"]["n"] for a in receiver.bodies()[0]["alerts"]] == ["2", "3"]


async def test_corrupt_queue_file_is_moved_aside(tmp_path: Path, receiver: Receiver) -> None:
    db = tmp_path / "notify.db"
    db.write_bytes(b"this is not a sqlite database" * 100)
    async with hub_for(notifier("hook", "webhook", f"{receiver.url}/hook"), db=db) as hub:
        hub.alerts([alert("AfterCorruption")], T0)
        await hub.deliver(T0)
        assert hub.stats()["hook"].sent == 1
    assert (tmp_path / "notify.db.corrupt-1").read_bytes().startswith(b"this is not")


async def test_unusable_queued_item_is_dropped_and_the_rest_delivered(
    tmp_path: Path, receiver: Receiver
) -> None:
    db = tmp_path / "notify.db"
    hook = notifier("hook", "webhook", f"{receiver.url}/hook")
    async with hub_for(hook, db=db) as hub:
        hub.alerts([alert("Before")], T0)
    with sqlite3.connect(db) as conn:  # a row no hub wrote, e.g. from a future version
        conn.execute(
            "INSERT INTO items (notifier, kind, key, body, enqueued_at) VALUES ('hook', 'alert', NULL, '{oops', 0)"
        )
    async with hub_for(hook, db=db) as hub:
        hub.alerts([alert("After")], T0 + 1)
        assert hub.due_at() == 0.0
        await hub.deliver(T0 + 1)
        stats = hub.stats()["hook"]
        assert (stats.sent, stats.failed, stats.queued) == (2, 1, 0)
        assert stats.last_error.startswith("unusable queued item")
        assert hub.due_at() is None
    assert [[a["labels"]["alertname"] for a in b["alerts"]] for b in receiver.bodies()] == [
        ["Before"],
        ["After"],
    ]
    await hub.deliver(T0 + 2)  # after aclose: logs, never raises
