"""`GET /api/v1/targets` shows each target's known answers and quarantine, read from the sample store where the
known-answer check writes `vllm_watchdog_known_answer_*` under the target's labels (integrity/metrics.py's
names) and the own feed writes `vllm_watchdog_target_quarantined{target}`."""

from __future__ import annotations

from typing import Any

from vllm_watchdog.api.targets import QUARANTINED, targets_json
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.integrity import metrics as series
from vllm_watchdog.sources.monitor import Monitor, MonitorOptions
from vllm_watchdog.store import make_labels

T0 = 1_700_000_000.0
NAMES = ("learning", "right", "wrong", "unchecked", "relearning")


def _monitor() -> Monitor:
    targets = "".join(
        f"  - {{name: {name}, url: 'http://192.0.2.{i + 1}:8000', canary: false}}\n"
        for i, name in enumerate(NAMES)
    )
    return Monitor(parse_config(f"targets:\n{targets}", "c.yml", env={}), MonitorOptions())


def _write(mon: Monitor, name: str, metric: str, value: float, extra: dict[str, str] | None = None) -> None:
    labels = {**mon.targets[name].labels, **(extra or {})}
    mon.store.append(make_labels(metric, labels), int(T0 * 1000), value)


def _answers(mon: Monitor) -> dict[str, dict[str, Any]]:
    return {t["watchdog"]["name"]: t["watchdog"] for t in targets_json(mon)["activeTargets"]}


def test_each_target_shows_its_known_answer_state_and_quarantine() -> None:
    mon = _monitor()
    _write(mon, "learning", series.BASELINE, 1, {"state": "learning", "identity": "k1"})
    _write(mon, "learning", series.TOLERANCE, 0.01)
    for name, ok, divergence in (("right", 1, 0.002), ("wrong", 0, 0.31)):
        _write(mon, name, series.BASELINE, 1, {"state": "learnt", "identity": "k2"})
        _write(mon, name, series.OK, ok)
        _write(mon, name, series.DIVERGENCE, divergence)
        _write(mon, name, series.TOLERANCE, 0.01)
        _write(mon, name, series.GREEDY, 1 - ok)
        _write(mon, name, series.LAST_CHECK, T0 - 5)
    own = {"job": "vllm-watchdog", "instance": "127.0.0.1:9460"}
    for name in ("wrong", "right"):
        labels = {**own, "target": name}
        mon.store.append(make_labels(QUARANTINED, labels), int(T0 * 1000), int(name == "wrong"))
    got = _answers(mon)
    assert got["learning"]["knownAnswers"] == {
        "state": "learning",
        "baseline": "learning",
        "identity": "k1",
        "divergence": None,
        "tolerance": 0.01,
        "greedyMismatches": None,
        "lastCheck": None,
    }
    assert got["right"]["knownAnswers"]["state"] == "ok" and not got["right"]["quarantined"]
    wrong = got["wrong"]["knownAnswers"]
    assert (wrong["state"], wrong["divergence"], wrong["tolerance"]) == ("diverged", 0.31, 0.01)
    assert wrong["greedyMismatches"] == 1 and wrong["lastCheck"] == "2023-11-14T22:13:15Z"
    assert got["wrong"]["quarantined"] is True
    assert got["unchecked"]["knownAnswers"] is None and got["unchecked"]["quarantined"] is False


def test_a_stale_verdict_is_no_verdict_and_other_targets_series_are_not_mixed_in() -> None:
    mon = _monitor()
    _write(mon, "relearning", series.BASELINE, 1, {"state": "learning", "identity": "k3"})
    ok = make_labels(series.OK, mon.targets["relearning"].labels)
    mon.store.append(ok, int(T0 * 1000) - 60_000, 0.0)
    mon.store.get(ok).mark_stale(int(T0 * 1000))  # the check learns again: its verdict went stale
    # a series of another target behind the same job and instance (a second name for one server)
    other = {**mon.targets["right"].labels, "target": "alias"}
    mon.store.append(make_labels(series.BASELINE, {**other, "state": "learnt"}), int(T0 * 1000), 1)
    mon.store.append(make_labels(series.OK, other), int(T0 * 1000), 0.0)
    got = _answers(mon)
    assert got["relearning"]["knownAnswers"]["state"] == "learning"
    assert got["right"]["knownAnswers"] is None


def test_a_verdict_that_could_not_tell_is_unknown() -> None:
    mon = _monitor()
    _write(mon, "right", series.BASELINE, 1, {"state": "pinned", "identity": "k4"})
    _write(mon, "right", series.DIVERGENCE, float("nan"))
    answers = _answers(mon)["right"]["knownAnswers"]
    assert (answers["state"], answers["baseline"], answers["divergence"]) == ("unknown", "pinned", None)
