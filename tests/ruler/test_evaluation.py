"""Rule evaluation in the daemon: embedded and remote backends, own API and metrics, state across restarts."""

from __future__ import annotations

import asyncio
import json
import random
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.test_daemon import PAYLOAD, wait_for
from tests.support.configs import FAST, target, watchdog_yaml
from tests.support.faultserver import FaultServer
from tests.support.vllm_server import free_port
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.promql.engine import Engine, vector_query
from vllm_watchdog.ruler.evaluation import RuleEvaluation
from vllm_watchdog.ruler.files import load_rule_files, parse_rule_file
from vllm_watchdog.ruler.groups import RuleManager, RuleManagerOptions
from vllm_watchdog.service.daemon import Daemon, DaemonOptions
from vllm_watchdog.sources.scrape import ScrapeTarget
from vllm_watchdog.store import SampleStore, make_labels

RULES = """
groups:
  - name: queue
    rules:
      - record: instance:waiting:max
        expr: max by (instance) (vllm:num_requests_waiting)
      - alert: Backlog
        expr: instance:waiting:max > 2
        for: 1s
        labels: {severity: warning}
        annotations: {summary: "{{ $labels.instance }}: {{ $value }} waiting"}
      - alert: Never
        expr: vllm:num_requests_waiting > 100
"""


def firing(j: Any, name: str = "Backlog") -> list[dict[str, Any]]:
    return [a for a in j["data"]["alerts"] if a["labels"]["alertname"] == name and a["state"] == "firing"]


def write(tmp_path: Path, url: str, port: int, extra: str = "") -> Path:
    (tmp_path / "r.yml").write_text(RULES)
    cfg = tmp_path / "c.yml"
    cfg.write_text(
        watchdog_yaml(
            target(url),
            port=port,
            token=None,
            state_dir=tmp_path / "state",
            global_settings={**FAST, "external_labels": {"cluster": "lab"}},
            rest="rule_files: [r.yml]\n" + extra,
        )
    )
    return cfg


async def start(cfg: Path) -> tuple[Daemon, asyncio.Task[None]]:
    d = Daemon.load(DaemonOptions(str(cfg), env={}))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait([task, asyncio.create_task(ready.wait())], timeout=20, return_when="FIRST_COMPLETED")
    if task.done():
        task.result()
    return d, task


@pytest.fixture
async def running(tmp_path: Path, fault: FaultServer) -> AsyncIterator[tuple[Daemon, str, Path]]:
    fault.vllm_like(PAYLOAD)
    port = free_port()
    cfg = write(tmp_path, fault.url, port)
    d, task = await start(cfg)
    yield d, f"http://127.0.0.1:{port}", cfg
    d.stop()
    await asyncio.wait_for(task, 10)


@pytest.mark.anyio
async def test_alert_fires_and_shows_in_api_and_metrics(
    running: tuple[Daemon, str, Path], fault: FaultServer
) -> None:
    d, base, _ = running
    hostport = fault.url.removeprefix("http://")  # the instance label: Prometheus' own, host:port
    async with httpx.AsyncClient() as client:
        alerts = await wait_for(client, base + "/api/v1/alerts", firing)
        (alert,) = firing(alerts)
        assert alert["labels"] == {
            "alertname": "Backlog",
            "instance": hostport,
            "severity": "warning",
            "cluster": "lab",
        } or alert["labels"] == {"alertname": "Backlog", "instance": hostport, "severity": "warning"}
        assert alert["annotations"] == {"summary": f"{hostport}: 3 waiting"}
        assert alert["activeAt"].endswith("Z") and alert["value"] == "3e+00"
        rules = (await client.get(base + "/api/v1/rules")).json()
        (group,) = rules["data"]["groups"]
        assert [r["name"] for r in group["rules"]] == ["instance:waiting:max", "Backlog", "Never"]
        assert all(r["health"] == "ok" for r in group["rules"])
        assert group["rules"][2]["state"] == "inactive"
        metrics = (await client.get(base + "/metrics")).text
        assert (
            f'ALERTS{{alertname="Backlog",alertstate="firing",instance="{hostport}",severity="warning"}} 1.0'
            in metrics
        )
        assert f'ALERTS_FOR_STATE{{alertname="Backlog",instance="{hostport}",severity="warning"}}' in metrics
        assert 'vllm_watchdog_rule_group_evaluations_total{rule_group="' in metrics
        # the recording rule's output is a series later rules (and the series API) can read
        rec = (await client.get(base + "/api/v1/samples", params={"match": "instance:waiting:max"})).json()
        assert rec["data"][0]["labels"] == {"__name__": "instance:waiting:max", "instance": hostport}
    assert d.evaluation is not None and d.evaluation.manager.persistence_errors == 0


@pytest.mark.anyio
async def test_firing_state_survives_a_restart(tmp_path: Path, fault: FaultServer) -> None:
    fault.vllm_like(PAYLOAD)
    port = free_port()
    cfg = write(tmp_path, fault.url, port)
    base = f"http://127.0.0.1:{port}"
    d, task = await start(cfg)
    async with httpx.AsyncClient() as client:
        (first,) = firing(await wait_for(client, base + "/api/v1/alerts", firing))
        d.stop()
        await asyncio.wait_for(task, 10)
        saved = json.loads((tmp_path / "state" / "alerts.json").read_text())
        assert "Backlog" in json.dumps(saved)
        d, task = await start(cfg)
        try:
            # firing again from the first evaluation after the restart, with the original activeAt
            (again,) = firing(await wait_for(client, base + "/api/v1/alerts", firing))
            assert again["activeAt"] == first["activeAt"]
        finally:
            d.stop()
            await asyncio.wait_for(task, 10)


@pytest.mark.anyio
async def test_reload_keeps_alert_state_and_swaps_rules(running: tuple[Daemon, str, Path]) -> None:
    d, base, cfg = running
    async with httpx.AsyncClient() as client:
        (before,) = firing(await wait_for(client, base + "/api/v1/alerts", firing))
        rules = cfg.parent / "r.yml"
        rules.write_text(RULES.replace("for: 1s", "for: 1h"))  # a longer `for` on reload
        ok, problems = await d.reload()
        assert ok, problems
        await asyncio.sleep(1.5)
        (after,) = firing((await client.get(base + "/api/v1/alerts")).json())
        assert after["activeAt"] == before["activeAt"]  # state carried over, still firing
        rules.write_text("groups: [{name: queue, rules: [{alert: X, expr: 'sum(rate(x[5m])'}]}]")
        ok, problems = await d.reload()
        assert not ok and "could not parse expression" in problems[0]
        assert firing((await client.get(base + "/api/v1/alerts")).json())  # old rules stay in force


def remote_config(url: str) -> Any:
    return parse_config(
        f"rule_backend: {{prometheus: {{url: '{url}', timeout: 2s}}}}\nrule_files: []\n", "/tmp/c.yml"
    )


@pytest.mark.anyio
async def test_remote_backend_drives_the_same_state_machine(fault: FaultServer) -> None:
    answer = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"instance": "vllm-0"}, "value": [1700000000, "5"]}],
        },
    }
    fault.set("/api/v1/query", answer)
    groups = tuple(
        parse_rule_file(
            "groups: [{name: g, rules: [{alert: RemoteBacklog, expr: 'x > 2', for: 1s}]}]", "r.yml"
        )
    )
    ev = RuleEvaluation(remote_config(fault.url), groups, SampleStore(600))
    (key,) = ev.group_keys()
    await ev.evaluate(key, 1_700_000_000.0)
    await ev.evaluate(key, 1_700_000_002.0)
    ((_, alert),) = ev.manager.active_alerts()
    assert str(alert.state) == "firing" and dict(alert.labels)["instance"] == "vllm-0"
    fault.set("/api/v1/query", {"status": "error", "errorType": "bad_data", "error": "boom"}, status=400)
    await ev.evaluate(key, 1_700_000_003.0)
    ((_, still),) = ev.manager.active_alerts()  # a query error leaves state untouched
    assert str(still.state) == "firing"
    (rule,) = ev.manager.rules_json()["data"]["groups"][0]["rules"]
    assert rule["health"] == "err" and "boom" in rule["lastError"]
    assert ev.stats.remote_failures == 1


def test_embedded_evaluation_reads_the_store() -> None:
    store = SampleStore(600)
    labels = make_labels("vllm:num_requests_waiting", {"job": "vllm", "instance": "vllm-0"})
    for t in range(0, 10):
        store.append(labels, 1_700_000_000_000 + t * 1000, 5.0)
    groups = tuple(
        parse_rule_file(
            "groups: [{name: g, rules: [{alert: A, expr: 'vllm:num_requests_waiting > 2'}]}]", "r.yml"
        )
    )
    ev = RuleEvaluation(parse_config("rule_files: []\n", "/tmp/c.yml"), groups, store)
    asyncio.run(ev.evaluate(ev.group_keys()[0], 1_700_000_009.0))
    ((_, alert),) = ev.manager.active_alerts()
    assert str(alert.state) == "firing"  # no `for`: firing at once


def test_query_command(tmp_path: Path, fault: FaultServer) -> None:
    fault.vllm_like(PAYLOAD)
    cfg = tmp_path / "c.yml"
    cfg.write_text(watchdog_yaml(target(fault.url), token=None, global_settings=None))
    run = [sys.executable, "-m", "vllm_watchdog", "query", "--config", str(cfg)]
    out = subprocess.run(
        [*run, "sum by (target) (vllm:num_requests_waiting) * 2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith('{target="vllm-0"} => 6 @[')
    bad = subprocess.run([*run, "sum(rate(x[5m])"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "invalid expression" in bad.stderr and "position" in bad.stderr


def test_test_rules_command_matches_promtool_exit_codes() -> None:
    fixtures = Path(__file__).parent.parent / "fixtures" / "ruletests"
    for path in sorted(fixtures.glob("*.yml")):
        if not (path.name.startswith(("pass_", "fail_"))):
            continue
        ours = subprocess.run(
            [sys.executable, "-m", "vllm_watchdog", "test-rules", str(path)], capture_output=True, timeout=60
        )
        ref = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, timeout=60)
        assert ours.returncode == ref.returncode, path.name


async def _record(cfg: Path, port: int, log: Path) -> None:
    d = Daemon.load(DaemonOptions(str(cfg), env={}, record=str(log)))
    ready = asyncio.Event()
    task = asyncio.create_task(d.run(ready))
    await asyncio.wait_for(ready.wait(), 20)
    async with httpx.AsyncClient() as client:
        await wait_for(client, f"http://127.0.0.1:{port}/api/v1/alerts", firing)
    await asyncio.sleep(3)  # a few more scrapes, so the replay's simulated clock passes `for` too
    d.stop()
    await asyncio.wait_for(task, 10)


def test_run_record_then_replay_shows_the_alert(tmp_path: Path, fault: FaultServer) -> None:
    fault.vllm_like(PAYLOAD)
    port = free_port()
    cfg = write(tmp_path, fault.url, port)
    log = tmp_path / "scrapes"
    asyncio.run(_record(cfg, port, log))
    assert sorted(p.name for p in tmp_path.glob("scrapes.*.gz")) == ["scrapes.000001.gz"]
    out = subprocess.run(
        [sys.executable, "-m", "vllm_watchdog", "replay", "--config", str(cfg), "--input", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(" pending " in f" {line} " and "Backlog{" in line for line in lines), out.stdout
    assert any(" firing " in f" {line} " and "Backlog{" in line for line in lines), out.stdout


def test_reload_to_another_backend_closes_the_old_session(fault: FaultServer) -> None:
    ev = RuleEvaluation(remote_config(fault.url), (), SampleStore(600))
    old = ev.remote
    assert old is not None
    closed: list[bool] = []
    old.session.close = lambda: closed.append(True)  # type: ignore[method-assign]
    ev.apply(remote_config(fault.url + "/prometheus"), ())
    assert closed == [True] and ev.remote is not old
    ev.apply(parse_config("rule_files: []\n", "/tmp/c.yml"), ())  # back to embedded
    assert ev.remote is None


def _vllm_bodies(seed: int, targets: int, seconds: int) -> list[list[str]]:
    """Per second, per target, the real vLLM 0.32 payload with its numbers moved at random: counters grow,
    now and then one starts again from 0 (a restart), gauges wander."""
    fixture = (Path(__file__).parent.parent / "fixtures" / "vllm-0.32.0-metrics.txt").read_text()
    lines = fixture.split("\n")
    rng = random.Random(seed)
    values = [[0.0] * len(lines) for _ in range(targets)]
    out = []
    for _ in range(seconds):
        second = []
        for t in range(targets):
            body = []
            for i, line in enumerate(lines):
                if not line or line.startswith("#"):
                    body.append(line)
                    continue
                v = values[t][i] = (
                    0.0 if rng.random() < 0.002 else values[t][i] + rng.choice((0, 0, 1, 2.5, 7))
                )
                body.append(f"{line.rsplit(' ', 1)[0]} {v}")
            second.append("\n".join(body))
        out.append(second)
    return out


def test_rules_sharing_results_within_a_group_decide_as_rules_that_do_not() -> None:
    """The bundled rules over 2 targets for 150 s of changing samples: the daemon's evaluation (a sum of a
    range function worked out once per group and time) and a rule manager on a plain engine write the same
    recorded samples, bit for bit, and hold the same alerts."""
    config = parse_config("rule_files: ['bundled:vllm.rules.yml']\n", "/tmp/c.yml", env={})
    groups = load_rule_files(config.rule_files)
    stores = SampleStore(900.0), SampleStore(900.0)
    ev = RuleEvaluation(config, groups, stores[0])
    plain = RuleManager(
        groups, RuleManagerOptions(vector_query(Engine(stores[1])), stores[1], default_interval=1.0)
    )
    scrapers = [
        [
            ScrapeTarget(
                url=f"http://127.0.0.1:{8000 + i}/metrics",
                job="vllm",
                instance=f"127.0.0.1:{8000 + i}",
                store=store,
                timeout=1.0,
                sample_limit=20_000,
                body_size_limit=1 << 24,
                extra_labels={"target": f"vllm-{i}"},
            )
            for i in range(2)
        ]
        for store in stores
    ]
    start = 1_700_000_000
    for second, bodies in enumerate(_vllm_bodies(16, 2, 150)):
        now = start + second
        for targets in scrapers:
            for scraper, body in zip(targets, bodies, strict=True):
                scraper.complete(now, body, None, lambda: 0.001)
        for key in ev.group_keys():
            ev._evaluate_embedded(key, now + 0.5)
        plain.evaluate_all(now + 0.5)
    recorded = {r.name for g in groups for r in g.rules if r.kind != "alert"} | {"ALERTS", "ALERTS_FOR_STATE"}

    def written(store: SampleStore) -> dict[object, list[bytes]]:
        return {
            s.labels: [struct.pack("<qd", t, v) for t, v in zip(s.ts, s.vals, strict=True)]
            for name in recorded
            for s in store.select(name)
        }

    assert written(stores[0]) == written(stores[1])
    assert any(len(v) > 140 for v in written(stores[0]).values())  # the recording rules did record
    assert ev.manager.alert_series() == plain.alert_series()
