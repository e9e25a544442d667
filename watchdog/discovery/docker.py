"""Docker label discovery: every container carrying `<label_prefix>target=<name>` is a docker-mode target
named `<name>` whose actions act on that container.

A container's labels (with the default prefix `vllm-watchdog.`):

- `vllm-watchdog.target`: the target name (required; letters, digits, `_ . -`);
- `vllm-watchdog.port`: the port vLLM listens on (else the discovery's `port`, 8000);
- `vllm-watchdog.scheme`: `http` or `https` (else the discovery's `scheme`);
- `vllm-watchdog.job`: the `job` label (else the template's);
- `vllm-watchdog.gpus`: its GPUs' NVML indices, `0,1` (for gpu_power_limit);
- `vllm-watchdog.label.<name>`: the label `<name>` on the target's series.

The URL is on loopback: 127.0.0.1:<port> for a container on the host network, else the host port that
publishes <port> on 127.0.0.1 or on every address. Stopped containers are listed too (a restart stops one);
a stopped container that publishes its port only while it runs keeps the URL it had. The copy a relaunch
keeps for rollback (`<name>.watchdog-previous`) stands for its container while the replacement is made, so
the target does not flicker during a reconfigure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..actions.runtimes.docker import BACKUP_SUFFIX
from ..config.targets import TARGET_LABELS, DiscoveredBy, TargetConfig, valid_name
from .config import DockerSdConfig
from .files import Refresh
from .targetgroups import MAX_LABEL_VALUE, encodable, label_name_ok, parse_gpus, target_url

log = logging.getLogger(__name__)
SHOWN_LABELS = 64  # container labels shown among a target's discovered labels (images add many)
_PUBLISHED_ON_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "127.0.0.1": "127.0.0.1"}
_PUBLISHED_ON_LOOPBACK6 = {"::": "[::1]", "::1": "[::1]"}


def list_limit(sd: DockerSdConfig) -> int:
    """How many containers one look asks the engine for (backups included); that many means too many."""
    return 2 * sd.max_targets + 16


def _meta_name(label: str) -> str:
    """A container label as Prometheus names it among discovered labels: other characters become `_`."""
    return "__meta_docker_container_label_" + "".join(
        c if c.isascii() and c.isalnum() else "_" for c in label
    )


def _address(summary: Mapping[str, Any], port: int) -> str | None:
    """Where the container's vLLM answers on this host, or None."""
    mode = str((summary.get("HostConfig") or {}).get("NetworkMode", ""))
    if mode == "host":
        return f"127.0.0.1:{port}"
    for published in summary.get("Ports") or ():
        if published.get("PrivatePort") != port or published.get("Type", "tcp") != "tcp":
            continue
        ip, public = str(published.get("IP", "")), published.get("PublicPort")
        host = _PUBLISHED_ON_LOOPBACK.get(ip) or _PUBLISHED_ON_LOOPBACK6.get(ip)
        if host is not None and isinstance(public, int):
            return f"{host}:{public}"
    return None


def _container(
    summary: Mapping[str, Any], sd: DockerSdConfig, previous: Mapping[str, TargetConfig]
) -> TargetConfig | str:
    """The target one labelled container stands for, or the problem that keeps it from being one."""
    names = summary.get("Names") or ["/?"]
    container = str(names[0]).lstrip("/")
    container = container.removesuffix(BACKUP_SUFFIX)
    labels = {str(k): str(v) for k, v in (summary.get("Labels") or {}).items()}
    p = sd.label_prefix
    name = labels.get(p + "target", "")
    where = f"container {container[:64]!r}"
    if not valid_name(name):
        return f"{where}: label {p}target must be letters, digits, '_', '.' or '-'"
    port_text = labels.get(p + "port", str(sd.port))
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text[:6]) < 65536:
        return f"{where}: label {p}port must be a TCP port"
    scheme = labels.get(p + "scheme", sd.scheme)
    if scheme not in ("http", "https"):
        return f"{where}: label {p}scheme must be http or https"
    own: dict[str, str] = {}
    for key, value in labels.items():
        if not key.startswith(p + "label."):
            continue
        label = key[len(p + "label.") :]
        if not label_name_ok(label) or label.startswith("__") or label in TARGET_LABELS:
            return f"{where}: label {key[:96]!r} does not name a label a target may set"
        if len(value) > MAX_LABEL_VALUE or not encodable(value):
            return f"{where}: label {key[:96]!r} must be valid text of at most {MAX_LABEL_VALUE} characters"
        own[label] = value
    try:
        gpus = parse_gpus(labels[p + "gpus"]) if labels.get(p + "gpus") else ()
    except ValueError as exc:
        return f"{where}: label {p}gpus {exc}"
    address = _address(summary, int(port_text))
    if address is None:
        known = previous.get(name)
        if known is None or known.container != container:
            return f"{where}: neither on the host network nor publishing port {port_text} on loopback"
        address = known.url.partition("://")[2]
    job = labels.get(p + "job") or sd.target.job
    found = {
        "__address__": address,
        "__scheme__": scheme,
        "__metrics_path__": sd.target.metrics_path,
        "__meta_docker_container_id": str(summary.get("Id", "")),
        "__meta_docker_container_name": "/" + container,
        "__meta_docker_network_mode": str((summary.get("HostConfig") or {}).get("NetworkMode", "")),
    }
    for key in sorted(labels)[:SHOWN_LABELS]:
        found[_meta_name(key)] = labels[key][:MAX_LABEL_VALUE]
    return replace(
        sd.target,
        name=name,
        url=target_url(scheme, address),
        job=job,
        container=container,
        gpus=gpus,
        labels={**sd.target.labels, **own},
        discovered=DiscoveredBy("docker_sd", sd.name, f"docker:{container}", found),
    )


def docker_targets(
    summaries: list[Mapping[str, Any]], sd: DockerSdConfig, previous: Mapping[str, TargetConfig]
) -> Refresh:
    """The targets of the listed containers (`GET /containers/json`), by target name; a name two containers
    claim is refused for both (which one would a restart act on?), a relaunch's kept copy yields to its
    container."""
    found: dict[str, list[tuple[bool, TargetConfig]]] = {}
    problems: list[str] = []
    for summary in summaries:
        target = _container(summary, sd, previous)
        if isinstance(target, str):
            problems.append(target)
            continue
        backup = str((summary.get("Names") or [""])[0]).endswith(BACKUP_SUFFIX)
        found.setdefault(target.name, []).append((backup, target))
    out = []
    for name, claims in sorted(found.items()):
        primary = [t for backup, t in claims if not backup] or [t for _, t in claims]
        if len({t.container for t in primary}) > 1:
            problems.append(f"target {name!r} is claimed by {len(primary)} containers; none is used")
            continue
        out.append(primary[0])
    return Refresh(tuple(out), tuple(problems))


class DockerDiscovery:
    """One `docker_sd_configs` entry: its Docker client and the targets of its last look."""

    def __init__(self, sd: DockerSdConfig, client_factory: Callable[[], Any]) -> None:
        self.sd = sd
        self.client_factory = client_factory
        self._client: Any = None
        self.last: dict[str, TargetConfig] = {}
        self._down = False

    def refresh(self) -> Refresh | None:
        """List the labelled containers (blocking: call it in a thread); None when the engine does not
        answer (the caller keeps the last targets)."""
        limit = list_limit(self.sd)
        try:
            if self._client is None:
                self._client = self.client_factory()
            listed = self._client.api.containers(
                all=True, filters={"label": self.sd.label_prefix + "target"}, limit=limit
            )
        except Exception as exc:  # the docker SDK raises DockerException, requests and OS errors
            if not self._down:  # once per outage, not at every look
                extra = {"discovery": self.sd.name, "error": str(exc)}
                log.error("docker_sd: Docker engine not reachable", extra=extra)
            self._down = True
            self.close()
            return None
        if self._down:
            log.info("docker_sd: Docker engine reachable again", extra={"discovery": self.sd.name})
            self._down = False
        if len(listed) >= limit:
            log.error(
                "docker_sd: too many labelled containers; the last targets stay",
                extra={"discovery": self.sd.name, "limit": limit},
            )
            return None
        refresh = docker_targets(listed, self.sd, self.last)
        self.last = {t.name: t for t in refresh.targets}
        return refresh

    def close(self) -> None:
        """Close the Docker client (a new one is made at the next look)."""
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken client must not fail a look
                log.debug("docker_sd: closing the client failed", exc_info=True)
