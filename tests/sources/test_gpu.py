from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pynvml
import pytest

from tests.service.test_daemon import wait_for
from tests.sources.test_scrape import target
from tests.support.configs import target as target_entry  # `target` is a scrape target here
from tests.support.configs import watchdog_yaml
from tests.support.fake_nvml import FakeNvml
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.service.daemon import Daemon, DaemonOptions
from vllm_watchdog.sources.gpu import GpuCollector
from vllm_watchdog.sources.monitor import Monitor, MonitorOptions
from vllm_watchdog.sources.nvml import NvmlSource
from vllm_watchdog.sources.nvmlexport import NvmlExport
from vllm_watchdog.sources.storeneeds import NO_RULES
from vllm_watchdog.store import SampleStore, is_stale

DCGM_PAYLOAD = """# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100",Hostname="h"} 71
# TYPE DCGM_FI_DEV_CLOCK_THROTTLE_REASONS gauge
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100",Hostname="h"} 4
"""


def test_collector_stores_dcgm_names_and_goes_stale_when_nvml_fails() -> None:
    fake = FakeNvml(gpus=2)
    fake.gpus[1].temperature_c = 88
    store = SampleStore(600)
    collector = GpuCollector(NvmlSource(nvml=fake, hostname="h"), store, instance="h")
    collector.commit(collector.collect(), 1000, None)
    temps = {dict(s.labels)["gpu"]: s.vals[-1] for s in store.select("DCGM_FI_DEV_GPU_TEMP")}
    assert temps == {"0": 40.0, "1": 88.0}
    labels = dict(next(iter(store.select("DCGM_FI_DEV_POWER_USAGE"))).labels)
    assert labels["job"] == "nvml" and labels["instance"] == "h" and labels["UUID"].startswith("GPU-")
    fake.fail("nvmlDeviceGetCount", pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    fake.gpus[0].lost = True
    collector.commit(collector.collect(), 2000, None)
    assert not collector.up and collector.last_error
    assert all(is_stale(s.vals[-1]) for s in store.select("DCGM_FI_DEV_GPU_TEMP"))
    (up,) = store.select("up")
    assert list(up.vals) == [1.0, 0.0]
    assert list(NvmlExport(lambda: collector).collect()) == []  # nothing exported while NVML fails
    fake.clear_failures()
    fake.gpus[0].lost = False
    collector.commit(collector.collect(), 3000, None)  # NVML came back: reopened, fresh samples
    temps_out = next(f for f in NvmlExport(lambda: collector).collect() if f.name == "DCGM_FI_DEV_GPU_TEMP")
    assert sorted(s.labels["gpu"] for s in temps_out.samples) == ["0", "1"]
    assert {s.labels["job"] for s in temps_out.samples} == {"nvml"}
    assert collector.up and list(up.vals) == [1.0, 0.0, 1.0]
    assert not any(is_stale(s.vals[-1]) for s in store.select("DCGM_FI_DEV_GPU_TEMP"))


@pytest.mark.anyio
async def test_dcgm_exporter_payload_with_legacy_name(fault: FaultServer) -> None:
    fault.set("/metrics", DCGM_PAYLOAD)
    store = SampleStore(600)
    assert (await target(store, fault.url, job="dcgm", instance="127.0.0.1:9400").scrape(1.0)).up
    (reasons,) = store.select("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    assert reasons.vals[-1] == 4.0 and dict(reasons.labels)["gpu"] == "0"


@pytest.mark.anyio
async def test_daemon_reads_fake_nvml_and_dcgm(tmp_path: Path, fault: FaultServer) -> None:
    fault.vllm_like("vllm:num_requests_waiting 0\n")
    fault.set("/dcgm", DCGM_PAYLOAD)
    port = free_port()
    cfg = tmp_path / "c.yml"
    cfg.write_text(
        watchdog_yaml(
            target_entry(fault.url, name="v"),
            port=port,
            token=None,
            global_settings=None,
            rest=f"gpus: {{nvml: true, dcgm_url: '{fault.url}/dcgm'}}\n",
        )
    )
    fake = FakeNvml(gpus=1)
    d = Daemon.load(DaemonOptions(str(cfg), env={}, nvml=fake))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait_for(ready.wait(), 20)
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as client:
            got = await wait_for(
                client, base + "/api/v1/samples?match=DCGM_FI_DEV_GPU_TEMP", lambda j: len(j["data"]) == 2
            )
            jobs = sorted(s["labels"]["job"] for s in got["data"])  # type: ignore[index]
            assert jobs == ["dcgm", "nvml"]
            metrics = (await client.get(base + "/metrics")).text
            assert "vllm_watchdog_nvml_up 1.0" in metrics
            # NVML's reading re-exported under dcgm-exporter's names: the GPU dashboard reads it from a
            # Prometheus that scrapes the watchdog (honor_labels), with no dcgm-exporter; the dcgm one is not.
            exported = [line for line in metrics.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
            assert len(exported) == 1 and 'job="nvml"' in exported[0] and 'gpu="0"' in exported[0], exported
            assert "DCGM_FI_DEV_FB_USED{" in metrics  # a family no rule reads, so not in the store
    finally:
        d.stop()
        await asyncio.wait_for(task, 10)
    assert fake.count("nvmlShutdown") == 1


@pytest.mark.anyio
async def test_reload_with_new_scrape_settings_retires_the_old_dcgm_scraper(fault: FaultServer) -> None:
    fault.set("/dcgm", DCGM_PAYLOAD)
    text = f"gpus: {{dcgm_url: '{fault.url}/dcgm'}}\n"
    monitor = Monitor(parse_config(text, "c.yml", env={}), MonitorOptions(client_factory=httpx.AsyncClient))
    old = monitor.exporters.get("dcgm")
    assert old is not None
    await monitor.scrape_exporter("dcgm", 1.0)
    assert old.connected  # kept alive between scrapes
    faster = parse_config("global: {scrape_interval: 2s}\n" + text, "c.yml", env={})
    monitor.apply(faster, NO_RULES, now=2.0)
    await monitor.close_retired()
    new = monitor.exporters.get("dcgm")
    assert new is not None and new is not old
    assert not old.connected
    assert all(is_stale(s.vals[-1]) for s in monitor.store.select("DCGM_FI_DEV_GPU_TEMP"))
    await monitor.scrape_exporter("dcgm", 2.0)
    assert new.connected
    await monitor.aclose()
    assert not new.connected


@pytest.mark.anyio
async def test_two_exporters_each_scraped_with_its_labels_named_in_the_summary_and_retired_alone(
    fault: FaultServer,
) -> None:
    fault.set("/a", DCGM_PAYLOAD)
    fault.set("/b", "gone", status=503)
    text = (
        "gpus:\n  exporters:\n"
        f"    - {{name: node-a, url: '{fault.url}/a', labels: {{rack: r1}}}}\n"
        f"    - {{name: node-b, url: '{fault.url}/b', job: gpu}}\n"
    )
    monitor = Monitor(parse_config(text, "c.yml", env={}), MonitorOptions(client_factory=httpx.AsyncClient))
    assert list(monitor.exporters) == ["node-a", "node-b"]
    await monitor.scrape_exporter("node-a", 1.0)
    await monitor.scrape_exporter("node-b", 1.0)
    (temp,) = monitor.store.select("DCGM_FI_DEV_GPU_TEMP")
    labels = dict(temp.labels)
    assert (labels["job"], labels["instance"], labels["rack"]) == ("dcgm", fault.url.split("//")[1], "r1")
    ups = {dict(s.labels)["job"]: s.vals[-1] for s in monitor.store.select("up")}
    assert ups == {"dcgm": 1.0, "gpu": 0.0}
    summary = monitor.warnings.summary(monitor.warnings.episodes, monitor.monotonic())
    assert summary.startswith("0 of 0 targets down; node-b-exporter scrape: server returned HTTP status 503")
    kept = monitor.exporters["node-a"]
    only_a = "gpus:\n  exporters:\n" + text.splitlines(keepends=True)[2]
    monitor.apply(parse_config(only_a, "c.yml", env={}), NO_RULES, now=2.0)
    await monitor.close_retired()
    assert monitor.exporters == {"node-a": kept}  # the same settings: the same scraper and connection
    assert [key for key in monitor.warnings.episodes if "node-b" in str(key)] == []
    await monitor.aclose()


def test_nvml_attaches_from_the_config_and_detaches_on_reload() -> None:
    fake = FakeNvml(gpus=1)
    options = MonitorOptions(client_factory=httpx.AsyncClient, nvml=fake, hostname="h")
    monitor = Monitor(parse_config("gpus: {nvml: true}\n", "c.yml", env={}), options)
    assert monitor.gpu is not None and monitor.gpu.instance == "h"
    assert monitor.gpu.collect() and monitor.gpu.up
    monitor.apply(parse_config("gpus: {nvml: false}\n", "c.yml", env={}), NO_RULES, now=1.0)
    assert monitor.gpu is None and fake.count("nvmlShutdown") == 1


def test_the_daemon_schedules_each_exporter_and_nvml() -> None:
    text = (
        "gpus:\n  nvml: true\n  exporters:\n"
        "    - {name: node-a, url: 'http://127.0.0.1:9/a'}\n"
        "    - {name: node-b, url: 'http://127.0.0.1:9/b'}\n"
    )
    d = Daemon(parse_config(text, "c.yml", env={}), (), DaemonOptions(env={}, nvml=FakeNvml(gpus=1)))
    d._schedule(d.monitor.config)
    jobs = set(d.schedule.due_times())
    assert {"scrape:node-a", "scrape:node-b", "nvml"} <= jobs
