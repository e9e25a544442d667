"""The Docker runtime: stops, starts and recreates one named vLLM container through the Docker API.

A replacement keeps the old container itself, stopped and renamed `<container>.watchdog-previous`,
so that a rollback brings back that very container (same id, same settings). Docker cannot relabel
an existing container, so the backup is known by its name alone. Every step is safe to repeat:
the state of a half-done replace or rollback is read back from which of the two names exist.
The kept container is left untouched apart from its name, restart policy included (changing it would
make the rollback inexact): should the engine restart while a replacement is pending, a `--restart
always` one comes back too, and the watchdog's reconcile (has_previous, then commit or rollback)
settles which one stays.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from docker import DockerClient
from docker.errors import APIError, DockerException, NotFound

from ...errors import ActionError, RefusedError
from ...formats.rfc3339 import parse_rfc3339
from ..incidents.bounded import last_lines
from .exits import LOG_BYTES, LOG_LINES, ExitStatus, ExitWatch, docker_exit, engine_death
from .runtime import Launch, LogTail, ServerPid

log = logging.getLogger("vllm_watchdog.actions.docker")  # the name logs have always carried

BACKUP_SUFFIX = ".watchdog-previous"
# Docker's own rule for container names.
_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
# Network modes whose endpoint Docker creates by itself; only user-defined networks are carried over.
_BUILTIN_NETWORKS = frozenset({"host", "none", "bridge", "default"})

T = TypeVar("T")


def valid_container_name(name: str) -> bool:
    """Whether `name` is a Docker container name: letters, digits and `_.-`, no slash."""
    return _NAME.fullmatch(name) is not None


def launch_from_inspect(attrs: Mapping[str, Any]) -> Launch:
    """The launch spec of a container, from its `docker inspect` document."""
    config = dict(attrs.get("Config") or {})
    args = tuple(str(a) for a in config.pop("Cmd", None) or ())
    image = str(config.pop("Image", "") or attrs.get("Image", ""))
    cid = str(attrs.get("Id", ""))
    host_config = dict(attrs.get("HostConfig") or {})
    if _shares_network(host_config):
        config.pop("Hostname", None)  # taken from the other container; Docker refuses one given
    elif cid and config.get("Hostname") == cid[:12]:
        del config["Hostname"]  # Docker's default; the new container gets its own
    data = {
        "container": str(attrs.get("Name", "")).lstrip("/"),
        "image": image,
        "image_id": str(attrs.get("Image", "")),
        "config": config,
        "host_config": host_config,
        "volumes": _unnamed_volumes(attrs, host_config),
        "networks": {} if _shares_network(host_config) else _endpoints(attrs, cid),
    }
    return Launch(kind="docker", args=args, data=data)


def _shares_network(host_config: Mapping[str, Any]) -> bool:
    """Whether the container lives in another container's network namespace (`--network container:X`)."""
    return str(host_config.get("NetworkMode", "")).startswith("container:")


def _unnamed_volumes(attrs: Mapping[str, Any], host_config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Volumes the container got from its image's VOLUME list: the new container must reuse them."""
    given = {str(b).split(":")[1] for b in host_config.get("Binds") or () if ":" in str(b)}
    given |= {str(m.get("Target")) for m in host_config.get("Mounts") or ()}
    return [
        {"Type": "volume", "Source": m["Name"], "Target": m["Destination"], "ReadOnly": not m.get("RW", True)}
        for m in attrs.get("Mounts") or ()
        if m.get("Type") == "volume" and m.get("Name") and m.get("Destination") not in given
    ]


def _endpoints(attrs: Mapping[str, Any], cid: str) -> dict[str, dict[str, Any]]:
    """The container's settings on each user-defined network (aliases, fixed addresses)."""
    networks = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
    out: dict[str, dict[str, Any]] = {}
    for name, endpoint in networks.items():
        if name in _BUILTIN_NETWORKS:
            continue
        aliases = [a for a in endpoint.get("Aliases") or () if a != cid[:12]]
        out[str(name)] = {
            "Aliases": aliases or None,
            "Links": endpoint.get("Links"),
            "IPAMConfig": endpoint.get("IPAMConfig"),
            "DriverOpts": endpoint.get("DriverOpts"),
        }
    return out


def create_request(launch: Launch, image: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The body of `POST /containers/create` for a launch, and the networks to connect after creating."""
    data = launch.data
    host_config = dict(data["host_config"])
    if data.get("volumes"):
        host_config["Mounts"] = [*(host_config.get("Mounts") or ()), *data["volumes"]]
    body: dict[str, Any] = {
        **data["config"],
        "Image": image,
        "Cmd": list(launch.args) or None,
        "HostConfig": host_config,
    }
    networks = dict(data.get("networks") or {})
    primary = str(host_config.get("NetworkMode", ""))
    if primary in networks:
        body["NetworkingConfig"] = {"EndpointsConfig": {primary: networks.pop(primary)}}
    return body, networks


def _parse_time(text: str) -> float | None:
    """Unix time of a Docker timestamp (RFC 3339 with nanoseconds); None for Docker's zero time."""
    if not text or text.startswith("0001-"):
        return None
    return parse_rfc3339(text, no_zone="utc", nanoseconds=True)


def _explain(exc: Exception) -> str:
    if isinstance(exc, APIError):
        return str(exc.explanation or exc)
    if isinstance(exc, DockerException):
        return str(exc)
    return f"no answer from the Docker engine: {exc}"


class DockerRuntime:
    """The Runtime of a vLLM that runs in the Docker container named `container`; owns `client`."""

    kind = "docker"

    def __init__(
        self,
        target: str,
        container: str,
        client: DockerClient,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self.container = container
        self.backup = container + BACKUP_SUFFIX
        self._client = client
        self._monotonic = monotonic  # times `docker stop` for the log; a wall-clock jump would skew it
        self._lock = asyncio.Lock()
        self.exit_status = ExitWatch(self._read_exit, monotonic)  # how the last run ended, every 5 s at most

    # -- the Runtime protocol -------------------------------------------------------------------

    async def launch(self) -> Launch:
        """The running container's launch spec: its Cmd as args, everything else in data."""
        return await self._call("inspect", self._launch)

    async def is_running(self) -> bool:
        """Whether the container exists and is running."""
        return await self._call("inspect", self._is_running)

    async def started_at(self) -> float | None:
        """Unix time the running container started; None when it is not running or absent."""
        return await self._call("inspect", self._started_at)

    async def stop(self, timeout: float) -> None:
        """`docker stop` with `timeout`; stopped already: no-op."""
        await self._call("stop", self._stop, timeout)

    async def start(self) -> None:
        """`docker start`; running already: no-op."""
        await self._call("start", self._start)

    async def replace(self, launch: Launch, stop_timeout: float) -> None:
        """Rename the old to the backup name, create `launch` under the name, stop the old, start the new."""
        await self._call("replace", self._replace, launch, stop_timeout)

    async def has_previous(self) -> bool:
        """Whether a backup container exists."""
        return await self._call("inspect", lambda: self._find(self.backup) is not None)

    async def commit(self) -> None:
        """Remove the backup container (its volumes stay); none: no-op."""
        await self._call("commit", self._commit)

    async def rollback(self, stop_timeout: float) -> None:
        """Remove the replacement, start the backup and give it its name back; no backup: no-op."""
        await self._call("rollback", self._rollback, stop_timeout)

    async def close(self) -> None:
        """Close the Docker client; the container is left as it is."""
        await asyncio.to_thread(self._client.close)

    # -- what an incident bundle reads (not under the lock: a running action's call may hang) ----

    async def server_pid(self) -> ServerPid:
        """The container's main process as the host numbers it (docker inspect's State.Pid)."""
        try:
            found = await asyncio.to_thread(self._find, self.container)
        except (DockerException, OSError) as exc:
            return ServerPid(None, problem=f"docker inspect of {self.container!r}: {_explain(exc)}")
        if found is None or not found.attrs["State"].get("Pid"):
            return ServerPid(None, problem=f"container {self.container!r} is not running")
        return ServerPid(int(found.attrs["State"]["Pid"]), container_id=str(found.id))

    async def log_tail(self, lines: int, max_bytes: int) -> LogTail:
        """`docker logs --tail` of the container, stdout and stderr, at most `max_bytes` read."""
        source = f"docker logs {self.container}"
        try:
            data, cut = await asyncio.to_thread(self._logs, lines, max_bytes)
        except (DockerException, OSError) as exc:
            return LogTail(source, problem=_explain(exc))
        return LogTail(source, tuple(last_lines(data, lines, cut)))

    async def _read_exit(self) -> ExitStatus | None:
        """exits.docker_exit of the container, with its last run's log; None if running, absent or unknown."""
        try:
            return await asyncio.to_thread(self._exit_status)
        except (DockerException, OSError) as exc:
            log.warning("docker inspect of %r: %s", self.container, _explain(exc))
            return None

    def _exit_status(self) -> ExitStatus | None:
        found = self._find(self.container)
        attrs = found.attrs if found is not None else {}
        policy = str(((attrs.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or "")
        if found is None or docker_exit(attrs["State"], policy, "") is None:
            return None
        since = _parse_time(str(attrs["State"].get("StartedAt", "")))  # that run's lines only
        data, cut = self._logs(LOG_LINES, LOG_BYTES, since)
        return docker_exit(attrs["State"], policy, engine_death(last_lines(data, LOG_LINES, cut)))

    def _logs(self, lines: int, max_bytes: int, since: float | None = None) -> tuple[bytes, bool]:
        found = self._require(self.container)
        data, cut = bytearray(), False
        # Docker splits lines longer than 16 KiB, so `tail` lines are a bounded read; the newest come last.
        more = {"since": since} if since is not None else {}
        for chunk in found.logs(stdout=True, stderr=True, tail=lines, stream=True, follow=False, **more):
            data += chunk
            if len(data) > max_bytes:
                del data[: len(data) - max_bytes]
                cut = True
        return bytes(data), cut

    # -- plumbing ------------------------------------------------------------------------------

    async def _call(self, step: str, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            try:
                return await asyncio.to_thread(fn, *args)
            except (DockerException, OSError) as exc:  # requests' errors are OSErrors
                raise ActionError(f"docker {step} of container {self.container!r}: {_explain(exc)}") from exc

    def _find(self, name: str) -> Any:
        """The container named exactly `name`, or None; refuses whatever else the name resolves to."""
        if not valid_container_name(name):
            raise RefusedError(f"{name!r} is not a container name; refusing to touch it")
        try:
            found = self._client.containers.get(name)
        except NotFound:
            return None
        if found.name != name:  # Docker also resolves id prefixes
            raise RefusedError(
                f"{name!r} resolves to container {found.name!r} ({found.short_id}), "
                f"not to one named {name!r}; refusing to touch it"
            )
        return found

    def _require(self, name: str) -> Any:
        found = self._find(name)
        if found is None:
            pending = " (a replacement is pending: rollback() brings the previous one back)"
            hint = pending if name == self.container and self._find(self.backup) is not None else ""
            raise ActionError(f"no container named {name!r}{hint}")
        return found

    def _info(self, message: str, **extra: Any) -> None:
        log.info(message, extra={"target": self.target, "container": self.container, **extra})

    # -- the steps (run in a worker thread) ----------------------------------------------------

    def _launch(self) -> Launch:
        return launch_from_inspect(self._require(self.container).attrs)

    def _is_running(self) -> bool:
        found = self._find(self.container)
        return found is not None and bool(found.attrs["State"]["Running"])

    def _started_at(self) -> float | None:
        found = self._find(self.container)
        if found is None or not found.attrs["State"]["Running"]:
            return None
        return _parse_time(str(found.attrs["State"].get("StartedAt", "")))

    def _stop(self, timeout: float) -> None:
        self._stop_container(self._require(self.container), timeout)

    def _start(self) -> None:
        found = self._require(self.container)
        if not found.attrs["State"]["Running"]:
            found.start()
            self._info("container started")

    def _replace(self, launch: Launch, stop_timeout: float) -> None:
        if launch.kind != "docker":
            raise ActionError(f"a {launch.kind} launch spec cannot run in a Docker container")
        if launch.data.get("container") != self.container:
            raise RefusedError(
                f"the launch spec is for container {launch.data.get('container')!r}, "
                f"not {self.container!r}; refusing to create it"
            )
        backup, current = self._find(self.backup), self._find(self.container)
        if backup is None:
            if current is None:
                raise ActionError(f"no container named {self.container!r} to replace")
            if current.attrs["HostConfig"].get("AutoRemove"):
                raise ActionError(
                    f"container {self.container!r} runs with --rm: stopping it would delete it, "
                    "so it cannot be kept for a rollback"
                )
            current.rename(self.backup)
            self._info("old container renamed", backup=self.backup)
            backup = current
        elif current is not None:
            # An earlier replace() left its replacement: replace that one and keep the original backup.
            self._stop_container(current, stop_timeout)
            current.remove(force=True)
            self._info("earlier replacement removed")
        created = self._create(launch)
        self._stop_container(backup, stop_timeout)
        created.start()
        self._info("replacement started", container_id=created.short_id)

    def _create(self, launch: Launch) -> Any:
        data = launch.data
        if not isinstance(data.get("config"), Mapping) or not isinstance(data.get("host_config"), Mapping):
            raise ActionError("the launch spec lacks the container's config and host config")
        body, extra_networks = create_request(launch, self._image(data))
        created = self._client.api.create_container_from_config(body, name=self.container)
        for network, endpoint in extra_networks.items():
            ipam = endpoint.get("IPAMConfig") or {}
            self._client.api.connect_container_to_network(
                created["Id"],
                network,
                ipv4_address=ipam.get("IPv4Address") or None,
                ipv6_address=ipam.get("IPv6Address") or None,
                link_local_ips=ipam.get("LinkLocalIPs") or None,
                aliases=endpoint.get("Aliases"),
                links=endpoint.get("Links"),
                driver_opt=endpoint.get("DriverOpts"),
            )
        self._info("replacement created", container_id=str(created["Id"])[:12])
        return self._require(self.container)

    def _image(self, data: Mapping[str, Any]) -> str:
        """The image name as the old container was created with it, or its id once the name moved on."""
        name, image_id = str(data.get("image", "")), str(data.get("image_id", ""))
        if not image_id:
            return name
        try:
            return name if name and self._client.images.get(name).id == image_id else image_id
        except NotFound:
            return image_id

    def _commit(self) -> None:
        backup = self._find(self.backup)
        if backup is not None:
            backup.remove(force=True)
            self._info("old container removed", backup=self.backup)

    def _rollback(self, stop_timeout: float) -> None:
        backup = self._find(self.backup)
        if backup is None:
            self._info("nothing to roll back")
            return
        current = self._find(self.container)
        if current is not None:
            self._stop_container(current, stop_timeout)
            current.remove(force=True)
            self._info("replacement removed")
        backup.reload()
        if not backup.attrs["State"]["Running"]:
            backup.start()
        backup.rename(self.container)
        self._info("old container started again", container_id=backup.short_id)

    def _stop_container(self, found: Any, timeout: float) -> None:
        found.reload()
        if not found.attrs["State"]["Running"]:
            return
        began = self._monotonic()
        found.stop(timeout=math.ceil(max(timeout, 0.0)))
        self._info("container stopped", stopped=found.name, seconds=round(self._monotonic() - began, 1))
