"""NVML's last reading on the watchdog's own /metrics, under dcgm-exporter's names, with job="nvml" and this
host as instance (as the store keeps them): a Prometheus that scrapes the watchdog (honor_labels) then feeds
the GPU dashboard, whose `job` variable lists `nvml` beside any dcgm-exporter, without a dcgm-exporter."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from .gpu import GpuCollector

EXPORTED_PREFIX = "DCGM_FI_"  # the readings; NVML's own counters (XID totals) have their own families


class NvmlExport:
    """A prometheus_client collector of the NVML reading the monitor took last (nothing while NVML fails)."""

    def __init__(self, gpu: Callable[[], GpuCollector | None]) -> None:
        self.gpu = gpu

    def collect(self) -> Iterator[Metric]:
        """One gauge family per dcgm-exporter name in the last reading."""
        gpu = self.gpu()
        if gpu is None or not gpu.up:
            return
        by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        for name, labels, value in gpu.latest:
            if name.startswith(EXPORTED_PREFIX):
                by_name.setdefault(name, []).append((labels, value))
        for name, samples in sorted(by_name.items()):
            keys = sorted({k for labels, _ in samples for k in labels} - {"job", "instance"})
            family = GaugeMetricFamily(
                name,
                f"{name} read through NVML (dcgm-exporter's name and unit).",
                labels=["job", "instance", *keys],
            )
            for labels, value in samples:
                family.add_metric(["nvml", gpu.instance, *(labels.get(k, "") for k in keys)], value)
            yield family
