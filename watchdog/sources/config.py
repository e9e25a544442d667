"""The `gpus:` section: NVML in-process, and the GPU exporters scraped like targets."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..config.yamlnodes import Node
from ..redact import secret, url_password

DCGM = "dcgm"  # the name and job of the exporter `dcgm_url` stands for
# Labels every series of an exporter carries, set by the watchdog (`target` is a watched server's).
EXPORTER_LABELS = ("job", "instance", "target")
_EXPORTER_KEYS = {"name", "url", "job", "labels"}


@dataclass(frozen=True)
class GpuExporterConfig:
    """One GPU exporter (a dcgm-exporter, say): its name in logs and the schedule, its URL, the `job` of its
    series (instance is the URL's host:port) and the labels added to them."""

    name: str
    url: str = field(metadata=secret(url_password))  # its password masked in logs and answers
    job: str = DCGM
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuConfig:
    """Where GPU signals come from: NVML in-process, GPU exporters, or both."""

    nvml: bool = False
    exporters: tuple[GpuExporterConfig, ...] = ()


def parse_gpus(node: Node, url: Callable[[str], str]) -> GpuConfig:
    """The `gpus:` mapping; `dcgm_url: U` is `exporters: [{name: dcgm, url: U}]`. `url` checks a URL."""
    m = node.mapping({"nvml", "dcgm_url", "exporters"})
    if m is None:
        return GpuConfig()
    nvml = m["nvml"].boolean() if "nvml" in m else None
    exporters: list[GpuExporterConfig] = []
    if "dcgm_url" in m and "exporters" in m:
        node.error("set dcgm_url (one dcgm-exporter) or exporters, not both")
    elif "dcgm_url" in m:
        dcgm = m["dcgm_url"].parsed(url)
        exporters = [GpuExporterConfig(DCGM, dcgm)] if dcgm is not None else []
    for item in m["exporters"].items() if "exporters" in m else []:
        exporter = _exporter(item, url)
        if exporter is None:
            continue
        if any(e.name == exporter.name for e in exporters):
            item.error(f"duplicate exporter name {exporter.name!r}", field=f"{item.path}.name")
        elif any(e.url == exporter.url for e in exporters):
            item.error(f"another exporter scrapes {exporter.url!r}", field=f"{item.path}.url")
        else:
            exporters.append(exporter)
    return GpuConfig(nvml=bool(nvml), exporters=tuple(exporters))


def _exporter(node: Node, url: Callable[[str], str]) -> GpuExporterConfig | None:
    """One item of `exporters:`; None when unusable (problems recorded)."""
    m = node.mapping(_EXPORTER_KEYS)
    if m is None:
        return None
    for required in ("name", "url"):
        if required not in m:
            node.error("is required", field=f"{node.path}.{required}")
    name = m["name"].string() if "name" in m else None  # a non-empty string, or a problem
    job = m["job"].string() if "job" in m else None
    labels = (m["labels"].string_map() or {}) if "labels" in m else {}
    for reserved in EXPORTER_LABELS:
        if reserved in labels:
            m["labels"].error(f"must not set {reserved!r}; it is derived from the exporter")
    address = m["url"].parsed(url) if "url" in m else None
    if not name or address is None:
        return None
    return GpuExporterConfig(name, address, job or DCGM, labels)
