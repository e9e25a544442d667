"""The notification hub: routes alerts and action events to notifiers and delivers their queues.

Each notifier has its own queue in one SQLite file. `alerts()` and `event()` only enqueue; `deliver()`
makes one pass over every notifier that is not backing off, sending its due items in batches, notifiers in
parallel. What is queued and what is sent is the notifier's kind's to say (`notifier.Notifier`): an
Alertmanager queue holds the latest state of each alert (its kind gives each alert an identity), a webhook
queue keeps every item, in order; the hub never asks which kind it holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from ..config.httpauth import ClientSettings, CredentialError
from ..matchers import matches_all
from ..statehealth import StateHealth
from .alert import OutgoingAlert
from .config import NotifierConfig
from .delivery import MAX_BATCH, Outcome, backoff, decode_alert, decode_event, encode_alert, post
from .notifier import Notifier, Receiver
from .queue import DeliveryQueue, Item, NewItem
from .registry import kind_of

log = logging.getLogger(__name__)
_UNUSABLE = (ValueError, KeyError, TypeError)


@dataclass(frozen=True)
class ActionEvent:
    """Something an action did, for webhooks; `outcome` is started, succeeded, failed, rolled_back,
    skipped or would_do."""

    action: str
    type: str
    target: str
    outcome: str
    reason: str
    at: float
    labels: Mapping[str, str]
    dry_run: bool
    action_id: int | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)  # `incident`: the bundle's id

    def to_json(self) -> dict[str, Any]:
        """The `event` object of a webhook payload (with `at` still in unix seconds)."""
        out = {
            "action": self.action,
            "type": self.type,
            "target": self.target,
            "outcome": self.outcome,
            "reason": self.reason,
            "at": self.at,
            "labels": dict(self.labels),
            "dryRun": self.dry_run,
            "actionId": self.action_id,
        }
        return out | ({"annotations": dict(self.annotations)} if self.annotations else {})


@dataclass(frozen=True)
class NotifierStats:
    """Delivery counters of one notifier since the hub started; `queued` is what waits now.

    `failed`: items a receiver refused for good (4xx); `dropped`: items pushed out of a full queue;
    `retries`: transient failures (each one backs off)."""

    type: str
    queued: int
    sent: int
    failed: int
    dropped: int
    retries: int
    last_error: str
    last_error_at: float | None
    last_success: float | None
    next_attempt: float | None


@dataclass
class _Channel:
    """One notifier's config, kind and delivery state (the items themselves live in the queue)."""

    config: NotifierConfig
    kind: Notifier
    receiver: Receiver
    sent: int = 0
    failed: int = 0
    dropped: int = 0
    retries: int = 0
    attempts: int = 0  # consecutive transient failures
    next_attempt: float | None = None
    wait: float = 0.0  # the backoff that set next_attempt
    last_error: str = ""
    last_error_at: float | None = None
    last_success: float | None = None
    busy: bool = False
    settings: ClientSettings | None = None  # TLS and credentials, made from config.http when first used
    client: httpx.AsyncClient | None = None  # its own client, where it has TLS settings
    client_tls: ssl.SSLContext | None = None  # the context that client was built with

    def credentials(self) -> ClientSettings:
        if self.settings is None or self.settings.config != self.config.http:
            self.settings = ClientSettings(self.config.http)
        return self.settings


def _tls_client(tls: ssl.SSLContext) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=tls, trust_env=False)


@dataclass(frozen=True)
class HubOptions:
    """What a NotificationHub is wired to, defaults filled at construction (Prometheus' ManagerOptions)."""

    client: httpx.AsyncClient  # shared by the notifiers without TLS settings of their own
    db_path: str | None = None  # the queue's SQLite file; None: memory
    external_url: str = ""  # the watchdog's, in webhook payloads
    clock: Callable[[], float] = time.time  # stamps answers (last_success, last_error_at) when they arrive
    state_health: StateHealth | None = None  # told when the queue's file cannot be written
    tls_client: Callable[[ssl.SSLContext], httpx.AsyncClient] = _tls_client  # per notifier with TLS settings


class NotificationHub:
    """Alert and action-event delivery to every configured notifier, queued in `options.db_path`."""

    def __init__(self, notifiers: tuple[NotifierConfig, ...], options: HubOptions) -> None:
        # The queue falls back to memory if it cannot write.
        self._queue = DeliveryQueue(options.db_path, health=options.state_health)
        self._client = options.client
        self._tls_client = options.tls_client
        self._old_clients: list[httpx.AsyncClient] = []
        self._external_url = options.external_url
        self._clock = options.clock
        self._channels: dict[str, _Channel] = {}
        self.external_labels: Mapping[str, str] = {}  # added to sent alerts that lack them, as Prometheus
        self.update(notifiers)
        for orphan in sorted(self._queue.notifiers() - set(self._channels)):
            n = self._queue.purge(orphan)
            log.warning("dropped the queue of an unknown notifier", extra={"notifier": orphan, "items": n})

    def alerts(self, alerts: Sequence[OutgoingAlert], now: float) -> None:
        """Queue alerts for each notifier whose matchers select them (resolved ones only if send_resolved)."""
        if self.external_labels:  # an alert's own label wins, as in Prometheus' notifier
            alerts = [replace(a, labels={**self.external_labels, **a.labels}) for a in alerts]
        for ch in list(self._channels.values()):
            cfg = ch.config
            items = [
                NewItem("alert", encode_alert(a), ch.kind.identity(a))
                for a in alerts
                if (a.state != "resolved" or cfg.send_resolved) and matches_all(cfg.matchers, a.labels)
            ]
            self._push(ch, items, now)

    def event(self, event: ActionEvent, now: float) -> None:
        """Queue an action event for every notifier that takes them and whose matchers select its labels."""
        body = json.dumps(event.to_json(), sort_keys=True)
        for ch in list(self._channels.values()):
            if ch.kind.takes_events and matches_all(ch.config.matchers, event.labels):
                self._push(ch, [NewItem("event", body)], now)

    def _push(self, ch: _Channel, items: list[NewItem], now: float) -> None:
        if not items:
            return
        name = ch.config.name
        try:
            dropped = self._queue.push(name, items, now, ch.config.max_queue)
        except Exception as exc:  # a full disk must not stop rule evaluation
            ch.dropped += len(items)
            log.error("could not queue notifications", extra={"notifier": name, "error": str(exc)})
            return
        if dropped:
            ch.dropped += dropped
            log.warning(
                "notification queue full, dropped the oldest",
                extra={"notifier": name, "dropped": dropped, "max_queue": ch.config.max_queue},
            )

    async def deliver(self, now: float) -> None:
        """One pass: send every queued item of each notifier not backing off, in batches; never raises.

        Backoff deadlines are in the wall-clock time `now` comes in; a clock set back never stretches a wait
        beyond the backoff that set it (a clock set forward only retries early)."""
        old, self._old_clients = self._old_clients, []
        for client in old:  # replaced after a TLS file changed, or their notifier was removed
            await client.aclose()
        try:
            up_to = self._queue.last_id()
        except Exception as exc:
            log.error("notification queue unreadable", extra={"error": str(exc)})
            return
        for ch in self._channels.values():
            if ch.next_attempt is not None and ch.next_attempt - now > ch.wait:
                # The wall clock went back: wait out the backoff from now, not until the clock catches up.
                ch.next_attempt = now + ch.wait
        due = [
            ch
            for ch in self._channels.values()
            if not ch.busy and (ch.next_attempt is None or ch.next_attempt <= now)
        ]
        await asyncio.gather(*(self._drain(ch, now, up_to) for ch in due))

    async def _drain(self, ch: _Channel, now: float, up_to: int) -> None:
        ch.busy = True
        try:
            after = 0
            while self._channels.get(ch.config.name) is ch:
                items = self._queue.head(ch.config.name, MAX_BATCH, after=after, up_to=up_to)
                if not items:
                    return
                batch, payload = self._batch(ch, items)
                after = batch[-1].id
                if payload is None:
                    continue
                if not await self._send(ch, batch, payload, now):
                    return
        except Exception as exc:  # a bug or a failing disk must not stop the daemon; the items stay queued
            log.exception("notification delivery failed", extra={"notifier": ch.config.name})
            ch.attempts += 1
            ch.wait = backoff(ch.attempts, ch.config.backoff_initial, ch.config.backoff_max)
            ch.next_attempt = now + ch.wait
            ch.last_error, ch.last_error_at = f"{type(exc).__name__}: {exc}", self._clock()
        finally:
            ch.busy = False

    def _batch(self, ch: _Channel, items: list[Item]) -> tuple[list[Item], Any]:
        """The next batch from the head of a queue and its payload (None: the head item was unusable)."""
        head = items[0]
        try:
            if head.kind == "event":  # queued for a kind that takes none: its body says it is unusable
                return [head], ch.kind.event_body(decode_event(head.body), ch.receiver)
            batch: list[Item] = []
            alerts: list[OutgoingAlert] = []
            for item in _leading(items, "alert"):
                try:
                    alerts.append(decode_alert(item.body))
                except _UNUSABLE:
                    if batch:
                        break  # send what came before; the bad one is dropped at the head next time
                    raise
                batch.append(item)
        except _UNUSABLE as exc:
            self._fail(ch, [head], f"unusable queued item: {exc}")
            return [head], None
        return batch, ch.kind.alerts_body(alerts, ch.receiver)

    async def _send(self, ch: _Channel, batch: list[Item], payload: Any, now: float) -> bool:
        """Post one batch; True if the notifier may go on with the next one."""
        cfg = ch.config
        url = ch.kind.url(ch.receiver)
        try:
            client, headers = self._client_of(ch)
        except CredentialError as exc:  # a file that cannot be read now may be readable at the next try
            outcome = Outcome(ok=False, error=str(exc))
        else:
            outcome = await post(client, url, payload, headers, cfg.timeout, now)
        if outcome.ok:
            self._queue.remove(i.id for i in batch)
            ch.sent += len(batch)
            ch.attempts, ch.next_attempt, ch.last_success = 0, None, self._clock()
            return True
        if outcome.permanent:
            self._fail(ch, batch, outcome.error)
            ch.attempts, ch.next_attempt = 0, None
            return True
        ch.attempts += 1
        ch.retries += 1
        delay = backoff(ch.attempts, cfg.backoff_initial, cfg.backoff_max)
        if outcome.retry_after is not None:
            delay = max(delay, min(outcome.retry_after, cfg.backoff_max))
        ch.next_attempt, ch.wait = now + delay, delay
        ch.last_error, ch.last_error_at = outcome.error, self._clock()
        log.warning(
            "notifier unreachable, will retry",
            extra={
                "notifier": cfg.name,
                "error": outcome.error,
                "attempt": ch.attempts,
                "retry_in": delay,
                "queued": self._queue.count(cfg.name),
            },
        )
        return False

    def _client_of(self, ch: _Channel) -> tuple[httpx.AsyncClient, Mapping[str, str]]:
        """The client and headers of the notifier's next request: credentials read now, a client of its own
        built again when a TLS file changed."""
        settings = ch.credentials()
        headers = ch.kind.headers(ch.receiver)
        value = settings.authorization()
        if value is not None:
            headers = {**headers, "Authorization": value}
        tls = settings.ssl_context()
        if tls is None:
            return self._client, headers
        if ch.client is None or tls is not ch.client_tls:
            if ch.client is not None:
                self._old_clients.append(ch.client)
            ch.client, ch.client_tls = self._tls_client(tls), tls
        return ch.client, headers

    def _fail(self, ch: _Channel, batch: list[Item], error: str) -> None:
        self._queue.remove(i.id for i in batch)
        ch.failed += len(batch)
        ch.last_error, ch.last_error_at = error, self._clock()
        log.error(
            "notifier refused notifications, dropped them",
            extra={"notifier": ch.config.name, "error": error, "items": len(batch)},
        )

    def update(self, notifiers: tuple[NotifierConfig, ...]) -> None:
        """Apply a reloaded config: queues of notifiers kept (same name and type) survive, others go."""
        wanted = {n.name: n for n in notifiers}
        for name, ch in list(self._channels.items()):
            cfg = wanted.get(name)
            if cfg is None or cfg.type != ch.config.type:
                if ch.client is not None:
                    self._old_clients.append(ch.client)
                del self._channels[name]
                n = self._queue.purge(name)
                log.info("notifier removed, dropped its queue", extra={"notifier": name, "items": n})
        for name, cfg in wanted.items():
            kept = self._channels.get(name)
            kind, receiver = self._kind(cfg), self._receiver(cfg)
            if kept is None:
                self._channels[name] = _Channel(cfg, kind, receiver)
                continue
            if cfg.url != kept.config.url:  # another receiver: no reason to wait out the old one's backoff
                kept.attempts, kept.next_attempt = 0, None
            kept.config, kept.kind, kept.receiver = cfg, kind, receiver
            kept.dropped += self._queue.trim(name, cfg.max_queue)

    @staticmethod
    def _kind(cfg: NotifierConfig) -> Notifier:
        kind = kind_of(cfg.type)
        if kind is None:  # the config refuses an unknown type
            raise ValueError(f"unknown notifier type {cfg.type!r}")
        return kind

    def _receiver(self, cfg: NotifierConfig) -> Receiver:
        return Receiver(cfg.name, cfg.url, cfg.headers, self._external_url, cfg.options)

    def stats(self) -> dict[str, NotifierStats]:
        """Per notifier: queued, sent, failed, dropped, retries, last error and success, next attempt."""
        return {
            name: NotifierStats(
                type=ch.config.type,
                queued=self._queue.count(name),
                sent=ch.sent,
                failed=ch.failed,
                dropped=ch.dropped,
                retries=ch.retries,
                last_error=ch.last_error,
                last_error_at=ch.last_error_at,
                last_success=ch.last_success,
                next_attempt=ch.next_attempt,
            )
            for name, ch in self._channels.items()
        }

    def due_at(self) -> float | None:
        """When deliver() next has something to try: 0.0 for now, a time while backing off, None if idle."""
        times = [
            ch.next_attempt or 0.0
            for name, ch in self._channels.items()
            if self._queue.count(name) and not ch.busy
        ]
        return min(times, default=None)

    async def aclose(self) -> None:
        """Close the queue database (queued items stay in its file) and the clients of notifiers with TLS
        settings; the shared HTTP client is the caller's."""
        self._queue.close()
        clients = self._old_clients + [ch.client for ch in self._channels.values() if ch.client is not None]
        self._old_clients = []
        for client in clients:
            await client.aclose()


def _leading(items: list[Item], kind: str) -> list[Item]:
    """The run of items of `kind` at the head of the list."""
    out: list[Item] = []
    for item in items:
        if item.kind != kind:
            break
        out.append(item)
    return out
