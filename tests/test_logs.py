"""Log lines: bounded in size whatever a target sends, secrets masked before cutting, repeats summarised."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from tests.support.clock import Clock
from vllm_watchdog import logs
from vllm_watchdog.logs import MAX_CHANGES, MAX_FIELD_CHARS, Recurring, bound, span

HUGE = "a" * (4 << 20)  # the 4 MiB label name of the issue


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """The root logger writing JSON lines to a buffer, as the daemon sets it up; restored afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = io.StringIO()
    logs.setup("info", stream=stream, fmt="json")
    yield stream
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_bound_cuts_with_a_marker_of_the_whole_size() -> None:
    assert bound("short") == "short"
    assert bound("x" * MAX_FIELD_CHARS) == "x" * MAX_FIELD_CHARS
    assert bound("é" * 600, 10) == "é" * 10 + "…(1200 bytes)"
    assert bound(bound(HUGE, 1000), 10) == "a" * 10 + f"…({4 << 20} bytes)"  # the first size is kept


def test_a_4_mib_label_name_gives_bounded_lines(lines: io.StringIO) -> None:
    log = logging.getLogger("vllm_watchdog.test")
    log.warning("scrape failed: %s", HUGE, extra={"target": "t", "error": HUGE, "labels": {HUGE: HUGE}})
    log.warning(HUGE, extra={"items": [HUGE] * 10_000, "deep": [[[[[[[[HUGE]]]]]]]]})
    try:
        raise ValueError(HUGE)
    except ValueError:
        log.exception("crashed")
    text = lines.getvalue()
    assert len(text) < 3 * 8192 + 2 * 64 * 600, len(text)
    first, second, third = records(lines)
    assert first["msg"] == "scrape failed: " + "a" * (MAX_FIELD_CHARS - 15) + f"…({(4 << 20) + 15} bytes)"
    assert first["error"] == "a" * MAX_FIELD_CHARS + f"…({4 << 20} bytes)"
    assert isinstance(second["items"], list) and len(second["items"]) == 65
    assert second["items"][-1] == "…(10000 items)"
    assert len(str(third["exc"])) <= logs.MAX_TRACEBACK_CHARS + 20


def test_text_lines_are_bounded_too() -> None:
    root = logging.getLogger()
    saved = root.handlers[:]
    stream = io.StringIO()
    try:
        logs.setup("info", stream=stream, fmt="text")
        logging.getLogger("vllm_watchdog.test").warning(HUGE, extra={"error": HUGE})
    finally:
        root.handlers[:] = saved
    assert len(stream.getvalue()) < 3 * MAX_FIELD_CHARS


def test_a_secret_is_masked_before_the_line_is_cut(lines: io.StringIO) -> None:
    secret = "s3cr3t-token-" + "z" * 40
    logs.use_secrets([secret])
    try:
        at_the_cut = "x" * (MAX_FIELD_CHARS - 20) + secret + "y" * 10_000  # the cut falls inside the secret
        logging.getLogger("vllm_watchdog.test").warning(at_the_cut, extra={"url": at_the_cut})
    finally:
        logs.use_secrets([])
    text = lines.getvalue()
    assert "s3cr3t" not in text
    assert "<redacted>" in text


def test_recurring_logs_once_per_change_and_a_summary_every_period(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = logging.getLogger("vllm_watchdog.test.recurring")
    warnings = Recurring(log, every=300.0, clock=clock)
    caplog.set_level(logging.INFO, logger=log.name)
    for _ in range(1199):  # 20 minutes of 1 s scrapes of a target that is down
        warnings.failed(("scrape", "t"), "connection", "scrape failed", {"target": "t", "error": "refused"})
        clock.advance(1.0)
    got = [r.getMessage() for r in caplog.records]
    summary = "1 conditions hold: scrape failed (t: refused, {})"
    assert got == ["scrape failed", *(summary.format(f"{m}m00s") for m in (5, 10, 15))]
    caplog.clear()
    warnings.failed(("scrape", "t"), "timeout", "scrape failed", {"target": "t"})  # another kind: a change
    warnings.failed(("scrape", "other"), "connection", "scrape failed", {"target": "other"})  # its own key
    warnings.recovered(("scrape", "t"), "scrape recovered", {"target": "t"})
    warnings.recovered(("scrape", "t"), "scrape recovered", {"target": "t"})  # was fine already: silent
    assert [(r.levelname, r.getMessage(), r.__dict__.get("target")) for r in caplog.records] == [
        ("WARNING", "scrape failed (changed)", "t"),
        ("WARNING", "scrape failed", "other"),
        ("INFO", "scrape recovered", "t"),
    ]
    assert caplog.records[-1].__dict__["failing_for"] == "19m59s"


def test_recurring_logs_a_state_seen_before_in_the_episode_once(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = logging.getLogger("vllm_watchdog.test.recurring")
    warnings = Recurring(log, every=300.0, clock=clock)
    caplog.set_level(logging.INFO, logger=log.name)
    for i in range(100):  # an error that flips between texts: each text once, and at most MAX_CHANGES
        warnings.failed("k", f"error {i % 3 if i < 50 else i}", "probe failed", {})
    got = [r.getMessage() for r in caplog.records]
    assert got == ["probe failed", *["probe failed (changed)"] * (MAX_CHANGES - 1)]


def test_span_reads_as_an_operator_writes_it() -> None:
    assert [span(s) for s in (0, 45, 312, 7380.5)] == ["0s", "45s", "5m12s", "2h03m"]
