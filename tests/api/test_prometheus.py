"""The watchdog's Prometheus-compatible API against a real Prometheus 2.42 scraping the same targets.

One fake vLLM (gauges constant, counters and histogram buckets growing linearly with wall-clock time, so that a
rate is the same whichever second a scraper samples) and the dcgm-exporter stand-in are scraped every second by
a real watchdog and by a real Prometheus, the Prometheus target labelled as the watchdog's /api/v1/targets says.
Then every expression of the vLLM and GPU dashboards runs on both, as an instant query and as a range query with
the same times, and the answers must agree: result type, label sets, timestamps, values (to 1e-6 relative; a
value equal in both must also be written the same). What may legitimately differ is left out, with the reason:

* expressions over `vllm_watchdog_*`: the watchdog writes its own series into its store, a Prometheus has them
  only if it scrapes the watchdog (this one does not);
* raw samples (a range selector in an instant query): each scraper stamps its own scrape times;
* a window in which either side's scrape failed (past its 1 s timeout on a loaded machine: the target's series
  go stale there) or was skipped (its deadline missed): the query is asked again for a later window, and fails
  only if every scrape happened and worked;
* a scrape still being read when the query comes: each query waits until both sides have stored a scrape
  begun after its time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.shipped.test_grafana_dashboards import load, queries, substitute, variable_names
from tests.support.configs import AUTH, FAST, target, write_config
from tests.support.dcgm_exporter_fake import dcgm_exporter
from tests.support.faultserver import FaultServer, Reply
from tests.support.prometheus_server import PrometheusServer, running_prometheus
from tests.support.vllm_server import free_port
from tests.support.watchdogproc import poll, start_watchdog

RATE = "4s"  # Grafana's $__rate_interval at a 1 s scrape interval: 4 scrape intervals
RANGE = 5.0  # seconds of range query, 1 s steps
CLIENT = httpx.Client(timeout=10, trust_env=False)

GAUGES = {"vllm:num_requests_running": 3, "vllm:num_requests_waiting": 7, "vllm:kv_cache_usage_perc": 0.25}
COUNTERS = {  # per second
    "vllm:generation_tokens_total": 120.0,
    "vllm:prompt_tokens_total": 900.0,
    "vllm:prefix_cache_hits_total": 30.0,
    "vllm:prefix_cache_queries_total": 40.0,
    "vllm:spec_decode_num_accepted_tokens_total": 6.0,
    "vllm:spec_decode_num_draft_tokens_total": 10.0,
    "vllm:spec_decode_num_drafts_total": 4.0,
    "vllm:num_preemptions_total": 0.5,
}
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
)
BUCKETS = ((0.01, 1.0), (0.1, 3.0), (1.0, 4.5), (10.0, 5.0), (math.inf, 5.0))  # (le, cumulative per second)
START = time.time()


def vllm_metrics() -> bytes:
    """A vLLM /metrics body at this moment: counters are rate x seconds since START, every sample stamped with
    the time it was made (both scrapers keep a sample's own timestamp), so each stored point is on the line."""
    ms = int(time.time() * 1000)
    t = ms / 1000 - START
    m = '{model_name="tiny"'
    out = [f"# TYPE {n} gauge\n{n}{m}}} {v}" for n, v in GAUGES.items()]
    out.append("# TYPE vllm:num_requests_waiting_by_reason gauge")
    out += [
        f'vllm:num_requests_waiting_by_reason{m},reason="{r}"}} {v}'
        for r, v in (("capacity", 5), ("lora", 2))
    ]
    out += [f"# TYPE {n} counter\n{n}{m}}} {rate * t}" for n, rate in COUNTERS.items()]
    out.append("# TYPE vllm:request_success_total counter")
    out += [
        f'vllm:request_success_total{m},finished_reason="{r}"}} {k * t}'
        for r, k in (("stop", 2), ("length", 1))
    ]
    out.append("# TYPE vllm:admission_rejections_total counter")
    out.append(f'vllm:admission_rejections_total{m},reason="full"}} {0.25 * t}')
    out.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
    out += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{m},position="{p}"}} {k * t}'
        for p, k in enumerate((3, 2, 1))
    ]
    for h in HISTOGRAMS:
        out.append(f"# TYPE {h} histogram")
        out += [f'{h}_bucket{m},le="{"+Inf" if math.isinf(le) else le}"}} {k * t}' for le, k in BUCKETS]
        out += [f"{h}_sum{m}}} {0.7 * t}", f"{h}_count{m}}} {5.0 * t}"]
    lines = "\n".join(out).split("\n")
    return "".join(ln + "\n" if ln.startswith("#") else f"{ln} {ms}\n" for ln in lines).encode()


@dataclass
class Pair:
    """The same query API twice: the watchdog's and Prometheus'."""

    watchdog: str
    prometheus: str

    def get(self, path: str, params: dict[str, str]) -> tuple[httpx.Response, httpx.Response]:
        """GET both."""
        return CLIENT.get(self.watchdog + path, params=params), CLIENT.get(
            self.prometheus + path, params=params
        )


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """A watchdog and a Prometheus scraping one fake vLLM and the dcgm-exporter stand-in, each with 8 s of data."""
    tmp = tmp_path_factory.mktemp("promapi")
    vllm = FaultServer()
    vllm.vllm_like("")
    vllm.replies["/metrics"] = Reply(render=vllm_metrics)
    with dcgm_exporter() as dcgm:
        port = free_port()
        cfg = write_config(
            tmp,
            target(vllm.url, health_probe=False),
            port=port,
            global_settings={**FAST, "keep_unreferenced": True},
            rest=f'gpus: {{dcgm_url: "{dcgm.url}/metrics"}}\n',
        )
        log = tmp / "watchdog.log"
        wd = start_watchdog(cfg, log)
        try:
            api = f"http://127.0.0.1:{port}"
            listing = poll(api + "/api/v1/targets", _all_up, 30, "both targets scraped", log)
            prom_config = _prometheus_config(listing["data"]["activeTargets"])
            with running_prometheus(prom_config, tmp / "prometheus") as prom:
                _wait_for_data(api, prom, log)
                yield Pair(api, prom.url)
        finally:
            wd.terminate()
            wd.wait(20)
            vllm.close()


def _all_up(answer: Any) -> bool:
    active = answer["data"]["activeTargets"]
    return len(active) == 2 and all(t["health"] == "up" for t in active)


def _prometheus_config(active: list[dict[str, Any]]) -> str:
    """Prometheus scraping each of the watchdog's targets under the labels the watchdog gives it."""
    lines = ["global: {scrape_interval: 1s, evaluation_interval: 1s}", "scrape_configs:"]
    for t in active:
        labels = {k: v for k, v in t["labels"].items() if k != "job"}
        address, path = t["discoveredLabels"]["__address__"], t["discoveredLabels"]["__metrics_path__"]
        lines += [
            f"  - job_name: {t['scrapePool']}",
            f"    metrics_path: {path}",
            f"    static_configs: [{{targets: ['{address}'], labels: {labels!r}}}]",
        ]
    return "\n".join(lines).replace("'", '"') + "\n"


def _wait_for_data(api: str, prom: PrometheusServer, log: Path) -> None:
    """Until Prometheus (started last) holds RANGE + rate window + 3 s of both targets' samples."""
    need = RANGE + 4 + 3
    expr = f"count_over_time(vllm:num_requests_running[{need:g}s]) >= {need - 1:g}"
    poll(f"{prom.url}/api/v1/query?query={expr}", lambda j: j["data"]["result"], 60, "prometheus data", log)


def _exprs() -> list[tuple[str, str]]:
    out = []
    for name in ("vllm-serving.json", "gpu.json"):
        doc = load(name)
        for q in queries(name, doc):
            if "vllm_watchdog_" not in q.expr:  # the watchdog's own series: only it has them (see the top)
                out.append((f"{name} {q.where}", substitute(q.expr, variable_names(doc), RATE)))
    return out


EXPRS = _exprs()
EXTRA = [  # each result type and Prometheus' number formatting
    ("scalar", "1 + 2.5"),
    ("scalar NaN", "scalar(vector(0) / 0)"),
    ("string", '"ok"'),
    ("+Inf and -Inf", "vllm:num_requests_running / 0 or -vllm:num_requests_waiting_by_reason / 0"),
    ("tiny and huge", "vllm:kv_cache_usage_perc * 1e-9 or vllm:num_requests_waiting_by_reason * 1e22"),
    ("time", "time() - time() + 1"),
]


def _same(a: Any, b: Any, where: str) -> None:
    """Two `[t, "v"]` points agree: time exactly, values within 1e-6 (the same text if equal)."""
    assert a[0] == b[0], where
    x, y = float(a[1]), float(b[1])
    if math.isnan(x) or math.isnan(y):
        assert math.isnan(x) and math.isnan(y), (where, a, b)
        return
    assert math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9), (where, a, b)
    if x == y:
        assert a[1] == b[1], (where, a, b)


def _compare(ours: httpx.Response, theirs: httpx.Response, where: str) -> None:
    assert theirs.status_code == 200, (where, theirs.text)
    assert ours.status_code == 200, (where, ours.text)
    a, b = ours.json()["data"], theirs.json()["data"]
    assert a["resultType"] == b["resultType"], where
    if a["resultType"] in ("scalar", "string"):
        assert a["result"][0] == b["result"][0] and a["result"][1] == b["result"][1], (where, a, b)
        return
    key: Callable[[dict[str, Any]], str] = lambda s: repr(sorted(s["metric"].items()))  # noqa: E731
    mine, real = sorted(a["result"], key=key), sorted(b["result"], key=key)
    assert [s["metric"] for s in mine] == [s["metric"] for s in real], where
    for s, r in zip(mine, real, strict=True):
        if "value" in s:
            _same(s["value"], r["value"], where)
        else:
            assert len(s["values"]) == len(r["values"]), (where, s, r)
            for p, q in zip(s["values"], r["values"], strict=True):
                _same(p, q, where)


def _now() -> float:
    return round(time.time() - 1.0)  # a whole second both have scraped past


def _every_scrape_worked(pair: Pair, at: float) -> bool:
    """Whether both scraped every target at each interval of the RANGE + rate window + 2 s before `at`, and
    each scrape worked: up summed over the window is its number of 1 s intervals. A scrape skipped (its
    deadline missed on a loaded machine) leaves a gap, and a rate over it extrapolates less, as it should."""
    params = {"query": f"sum_over_time(up[{RANGE + 6:g}s])", "time": str(at)}
    answers = pair.get("/api/v1/query", params)
    return all(float(s["value"][1]) == RANGE + 6 for a in answers for s in a.json()["data"]["result"])


def _caught_up(pair: Pair, at: float) -> bool:
    """Whether both sides have stored a scrape of every target that began after `at`. A target's scrapes run
    one at a time on both, so then every sample stamped up to `at` is in both stores. Without this wait a
    scrape that began before `at` but was still being read when the query came (0.6 s on a loaded machine)
    leaves its newest point out of one side's window, and that side's rate extrapolates less (CI saw 0.42
    against 0.5)."""
    answers = pair.get("/api/v1/query", {"query": "min(timestamp(up))"})
    return all(
        a.status_code == 200 and any(float(s["value"][1]) > at for s in a.json()["data"]["result"])
        for a in answers
    )


def _agree(pair: Pair, path: str, params: Callable[[float], dict[str, str]], where: str) -> None:
    """The same query answered alike, once both have stored every scrape up to its time; asked again at a
    later time while a scrape failed on either side in its window (a scrape past its 1 s timeout on a loaded
    machine marks the target's series stale there)."""
    for _ in range(10):
        at = _now()
        for _wait in range(50):  # a scrape is over in 1 s (its timeout): normally caught up at once
            if _caught_up(pair, at):
                break
            time.sleep(0.1)
        try:
            _compare(*pair.get(path, params(at)), where)
            return
        except AssertionError:
            if _every_scrape_worked(pair, at):
                raise
        time.sleep(2)  # a later window
    pytest.fail(f"{where}: scrapes kept failing on one side, nothing to compare")


@pytest.mark.parametrize(("where", "expr"), EXPRS + EXTRA, ids=[w for w, _ in EXPRS + EXTRA])
def test_instant_queries_answer_as_prometheus(pair: Pair, where: str, expr: str) -> None:
    _agree(pair, "/api/v1/query", lambda at: {"query": expr, "time": str(at)}, where)


@pytest.mark.parametrize(
    ("where", "expr"), [*EXPRS, *EXTRA[:2], *EXTRA[3:]], ids=[w for w, _ in [*EXPRS, *EXTRA[:2], *EXTRA[3:]]]
)
def test_range_queries_answer_as_prometheus(pair: Pair, where: str, expr: str) -> None:
    _agree(
        pair,
        "/api/v1/query_range",
        lambda end: {"query": expr, "start": str(end - RANGE), "end": str(end), "step": "1"},
        where,
    )


def test_a_posted_form_needs_no_token_and_answers_as_a_get(pair: Pair) -> None:
    form = {"query": "sum(vllm:num_requests_waiting)", "time": str(_now())}
    posted = CLIENT.post(pair.watchdog + "/api/v1/query", data=form)
    _compare(posted, CLIENT.post(pair.prometheus + "/api/v1/query", data=form), "POST")
    assert posted.json() == CLIENT.get(pair.watchdog + "/api/v1/query", params=form).json()
    assert CLIENT.post(pair.watchdog + "/-/reload").status_code == 401  # other POSTs still need it
    assert CLIENT.post(pair.watchdog + "/-/reload", headers=AUTH).status_code == 200


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/api/v1/query", {}),
        ("/api/v1/query", {"query": "sum("}),
        ("/api/v1/query", {"query": "up", "time": "yesterday"}),
        ("/api/v1/query", {"query": "up", "timeout": "soon"}),
        ("/api/v1/query_range", {"query": "up", "start": "0", "end": "11001", "step": "1"}),
        ("/api/v1/query_range", {"query": "up", "start": "10", "end": "0", "step": "1"}),
        ("/api/v1/query_range", {"query": "up", "start": "0", "end": "10", "step": "0"}),
        ("/api/v1/query_range", {"query": "up", "start": "0", "end": "10"}),
        ("/api/v1/query_range", {"query": "up[1m]", "start": "0", "end": "10", "step": "1"}),
        ("/api/v1/series", {}),
        ("/api/v1/series", {"match[]": '{job=~".*"}'}),
        ("/api/v1/series", {"match[]": "up{"}),
    ],
)
def test_refusals_are_prometheus_errors(pair: Pair, path: str, params: dict[str, str]) -> None:
    ours, theirs = pair.get(path, params)
    assert ours.status_code == theirs.status_code, (ours.text, theirs.text)
    a, b = ours.json(), theirs.json()
    assert (a["status"], a["errorType"]) == (b["status"], b["errorType"]), (a, b)
    if path == "/api/v1/query_range" and "11001" in params.get("end", ""):
        assert a["error"] == b["error"]
    elif params.get("query") not in ("sum(", "up[1m]"):  # parse errors: our parser words them its own way
        assert a["error"].split(":")[0] == b["error"].split(":")[0], (a, b)


def test_series_are_label_sets_as_prometheus(pair: Pair) -> None:
    params = {"match[]": "vllm:request_success_total", "start": str(_now() - 5), "end": str(_now())}
    ours, theirs = pair.get("/api/v1/series", params)
    assert ours.status_code == 200 and theirs.status_code == 200
    key = lambda s: sorted(s.items())  # noqa: E731
    assert sorted(ours.json()["data"], key=key) == sorted(theirs.json()["data"], key=key)
    assert len(ours.json()["data"]) == 2 and all("__name__" in s for s in ours.json()["data"])
    both = CLIENT.get(
        pair.watchdog + "/api/v1/series",
        params=[
            ("match[]", "vllm:num_requests_running"),
            ("match[]", '{__name__="vllm:num_requests_running"}'),
        ],
    )
    assert len(both.json()["data"]) == 1  # the same series matched twice is listed once
    many = [("match[]", "up")] * 65
    assert CLIENT.get(pair.watchdog + "/api/v1/series", params=many).json()["errorType"] == "bad_data"


def test_label_names_and_values_as_prometheus(pair: Pair) -> None:
    match = {"match[]": '{__name__=~"vllm:request_success_total|vllm:num_requests_waiting_by_reason"}'}
    ours, theirs = pair.get("/api/v1/labels", match)
    assert ours.json() == theirs.json() and "finished_reason" in ours.json()["data"]
    for name in ("finished_reason", "__name__"):
        ours, theirs = pair.get(f"/api/v1/label/{name}/values", match)
        assert ours.json() == theirs.json() and len(ours.json()["data"]) == 2
    everything = CLIENT.get(pair.watchdog + "/api/v1/label/__name__/values").json()["data"]
    assert {"vllm:num_requests_running", "DCGM_FI_DEV_GPU_TEMP", "up"} <= set(everything)
    ours, theirs = pair.get("/api/v1/label/0bad/values", {})
    assert ours.status_code == theirs.status_code == 400
    assert ours.json()["errorType"] == theirs.json()["errorType"] == "bad_data"


def test_targets_have_prometheus_fields_and_the_watchdogs_beside_them(pair: Pair) -> None:
    ours = CLIENT.get(pair.watchdog + "/api/v1/targets").json()["data"]
    theirs = CLIENT.get(pair.prometheus + "/api/v1/targets").json()["data"]
    assert set(ours) == set(theirs) == {"activeTargets", "droppedTargets"}
    by_pool = {t["scrapePool"]: t for t in theirs["activeTargets"]}
    for t in ours["activeTargets"]:
        real = by_pool[t["scrapePool"]]
        assert set(real) <= set(t) and set(t) - set(real) <= {"watchdog"}, set(t) ^ set(real)
        assert (t["labels"], t["scrapeUrl"], t["health"]) == (
            real["labels"],
            real["scrapeUrl"],
            real["health"],
        )
        assert (t["scrapeInterval"], t["scrapeTimeout"]) == (real["scrapeInterval"], real["scrapeTimeout"])
        assert (
            t["lastError"] == ""
            and abs(datetime.fromisoformat(t["lastScrape"]).timestamp() - time.time()) < 60
        )
    (vllm,) = [t for t in ours["activeTargets"] if "watchdog" in t]
    assert vllm["watchdog"]["name"] == "vllm-0" and vllm["watchdog"]["samples"] > 20
    dropped = CLIENT.get(pair.watchdog + "/api/v1/targets", params={"state": "dropped"}).json()["data"]
    assert dropped == {"activeTargets": [], "droppedTargets": []}


def test_buildinfo_health_readiness_and_json_errors(pair: Pair) -> None:
    ours = CLIENT.get(pair.watchdog + "/api/v1/status/buildinfo").json()
    theirs = CLIENT.get(pair.prometheus + "/api/v1/status/buildinfo").json()
    assert set(ours["data"]) == set(theirs["data"]) and ours["data"]["goVersion"].startswith("cpython3.")
    for path in ("/-/healthy", "/-/ready"):
        assert (
            CLIENT.get(pair.watchdog + path).status_code
            == CLIENT.get(pair.prometheus + path).status_code
            == 200
        )
    missing = CLIENT.get(pair.watchdog + "/api/v1/no-such-thing")
    assert missing.status_code == 404 and missing.json() == {
        "status": "error",
        "errorType": "not_found",
        "error": "not found",
    }
    wrong = CLIENT.delete(pair.watchdog + "/api/v1/targets", headers=AUTH)
    assert wrong.status_code == 405 and wrong.json()["errorType"] == "method_not_allowed"
    metrics = CLIENT.get(pair.watchdog + "/metrics").text
    assert "\nprocess_resident_memory_bytes " in metrics and "\nprocess_open_fds " in metrics
