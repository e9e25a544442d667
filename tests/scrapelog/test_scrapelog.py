from __future__ import annotations

import gzip
import json
import logging
import math
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.clock import T0, Clock
from vllm_watchdog.scrapelog import (
    ForgetRecord,
    GpuRecord,
    ProbeRecord,
    ScrapeLog,
    ScrapeLogError,
    ScrapeRecord,
    decode_delta,
    encode_delta,
    iter_records,
    segment_paths,
)


def perturb(body: str, rng: random.Random, frac: float) -> str:
    """Change the value of about `frac` of the sample lines, as traffic does."""
    out = []
    for line in body.split("\n"):
        if line and not line.startswith("#") and rng.random() < frac:
            series, _, value = line.rpartition(" ")
            out.append(f"{series} {float(value) + rng.randint(1, 9)}")
        else:
            out.append(line)
    return "\n".join(out)


def scrape(log: ScrapeLog, t: float, body: str | None, **kw: Any) -> None:
    args: dict[str, Any] = dict(t=t, job="vllm", instance="vllm-0", labels={"env": "x"}, body=body)
    log.record_scrape(**(args | kw))


def test_every_record_kind_round_trips(tmp_path: Path, vllm_payload: str) -> None:
    path = str(tmp_path / "rec")
    log = ScrapeLog(path, clock=Clock())
    rng = random.Random(1)
    second = perturb(vllm_payload, rng, 0.3)
    scrape(log, T0, vllm_payload, duration=0.01)
    scrape(log, T0 + 1, second)
    scrape(log, T0 + 2, None, error="timeout after 1s", kind="timeout")
    scrape(log, T0 + 3, "a 1\n")
    log.record_probe(
        t=T0 + 3.5,
        probe="canary",
        job="vllm",
        instance="vllm-0",
        labels={},
        ok=False,
        latency=2.5,
        error="boom",
    )
    log.record_gpu(
        t=T0 + 4, instance="host", up=True, samples=[("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0"}, math.inf)]
    )
    log.record_forget(t=T0 + 5, job="vllm", instance="vllm-0")
    scrape(log, T0 + 6, "b 2")
    log.close()
    recs = list(iter_records(path))
    assert [type(r) for r in recs] == [ScrapeRecord] * 4 + [
        ProbeRecord,
        GpuRecord,
        ForgetRecord,
        ScrapeRecord,
    ]
    assert recs[0] == ScrapeRecord(T0, "vllm", "vllm-0", {"env": "x"}, 0.01, vllm_payload)
    assert isinstance(recs[1], ScrapeRecord) and recs[1].body == second
    assert recs[2] == ScrapeRecord(
        T0 + 2, "vllm", "vllm-0", {"env": "x"}, 0.0, None, "timeout after 1s", "timeout"
    )
    assert isinstance(recs[3], ScrapeRecord) and recs[3].body == "a 1\n"
    assert recs[4] == ProbeRecord(T0 + 3.5, "canary", "vllm", "vllm-0", {}, False, 2.5, "boom")
    assert recs[5] == GpuRecord(T0 + 4, "host", True, (("DCGM_FI_DEV_GPU_TEMP", {"gpu": "0"}, math.inf),))
    assert isinstance(recs[7], ScrapeRecord) and recs[7].body == "b 2"
    # A closed segment is a plain gzip file of JSON lines (zcat | jq works); bodies after the first are deltas.
    (seg,) = segment_paths(path)
    lines = [json.loads(x) for x in gzip.decompress(Path(seg).read_bytes()).splitlines()]
    assert lines[0] | {"created": 0} == {
        "type": "header",
        "format": "vllm-watchdog-scrapelog",
        "version": 1,
        "segment": 1,
        "created": 0,
    }
    assert "body" in lines[1] and "delta" in lines[2] and "body" not in lines[2]


@given(
    st.lists(st.sampled_from(["a 1", "b 2", "# HELP x y", "", "c 3", "a 1"]), max_size=12),
    st.lists(st.sampled_from(["a 1", "b 2", "# HELP x y", "", "c 4", "d 5"]), max_size=12),
)
@settings(max_examples=300)
def test_delta_is_exact(prev: list[str], lines: list[str]) -> None:
    assert decode_delta(prev, encode_delta(prev, lines)) == lines


def test_bytes_per_scrape_of_the_vllm_fixture(tmp_path: Path, vllm_payload: str) -> None:
    clock, rng = Clock(), random.Random(7)
    log = ScrapeLog(str(tmp_path / "idle"), clock=clock)
    for i in range(60):
        clock.now = T0 + i
        scrape(log, clock.now, vllm_payload)
    log.close()
    busy = ScrapeLog(str(tmp_path / "busy"), clock=clock)
    body = vllm_payload
    for i in range(60):
        clock.now = T0 + i
        body = perturb(body, rng, 0.3)
        scrape(busy, clock.now, body)
    busy.close()
    assert log.bytes_written / 60 < 200  # an unchanged body costs a few dozen bytes
    assert busy.bytes_written / 60 < 2500  # 30% of the values changing: about 1.3 kB vs 5.7 kB gzipped whole


def test_flushes_once_a_second_and_a_torn_tail_reads_up_to_the_last_whole_record(tmp_path: Path) -> None:
    path = str(tmp_path / "rec")
    clock = Clock()
    log = ScrapeLog(path, clock=clock)
    scrape(log, T0, "a 1\n")
    (seg,) = segment_paths(path)
    assert os.path.getsize(seg) == 0  # buffered: nothing written within the second
    clock.advance(1.0)
    scrape(log, clock.now, "a 2\n")
    size = os.path.getsize(seg)
    assert size > 0
    assert [r.t for r in iter_records(path)] == [T0, T0 + 1]  # readable while open: no gzip trailer yet
    for i in range(2, 40):
        clock.now = T0 + i
        scrape(log, clock.now, f"a {i}\nb {i * 2}\n")
    log.flush()  # what the process had before it crashed (no close, no trailer)
    data = Path(seg).read_bytes()
    full = [r.t for r in iter_records(path)]
    assert full == [T0 + i for i in range(40)]
    for cut in range(0, len(data), 7):
        Path(seg).write_bytes(data[:cut])
        got = [r.t for r in iter_records(path)]
        assert got == full[: len(got)]
    Path(seg).write_bytes(data[:-3] + b"\xff\xff\xff")  # corrupt, not just short
    assert [r.t for r in iter_records(path)] == full[: len(list(iter_records(path)))]


def test_rotates_by_size_keeps_n_and_never_appends_to_an_old_segment(
    tmp_path: Path, vllm_payload: str
) -> None:
    path = str(tmp_path / "rec")
    clock = Clock()
    log = ScrapeLog(path, clock=clock, max_bytes=20_000, keep=3)
    rng = random.Random(3)
    body = vllm_payload
    for i in range(80):
        clock.now = T0 + i
        body = perturb(body, rng, 0.3)
        scrape(log, clock.now, body)
    log.close()
    segs = segment_paths(path)
    assert len(segs) == 3 and segs[-1].endswith(".gz")
    first_kept = int(segs[0].rsplit(".", 2)[1])
    assert first_kept > 1  # older segments were deleted
    recs = list(iter_records(path))
    ts = [r.t for r in recs]
    assert ts == sorted(ts) and ts[-1] == T0 + 79
    assert isinstance(recs[-1], ScrapeRecord) and recs[-1].body == body  # deltas decode in every segment
    again = ScrapeLog(path, clock=clock, keep=3)  # a restart starts the next segment
    scrape(again, clock.now + 1, "x 1")
    again.close()
    assert int(segment_paths(path)[-1].rsplit(".", 2)[1]) == int(segs[-1].rsplit(".", 2)[1]) + 1
    assert [r.t for r in iter_records(path)][-1] == clock.now + 1


class BrokenFile:
    name = "broken"

    def write(self, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_io_errors_are_counted_logged_once_and_never_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    caplog.set_level(logging.ERROR, logger="vllm_watchdog.scrapelog")
    missing = ScrapeLog(str(tmp_path / "no" / "such" / "dir" / "rec"), clock=clock)
    for i in range(5):
        clock.now = T0 + i
        scrape(missing, clock.now, "a 1")
    assert missing.errors >= 1 and missing.dropped == 5 and missing.records == 0
    assert len(caplog.records) == 1
    caplog.clear()
    log = ScrapeLog(str(tmp_path / "rec"), clock=clock)
    scrape(log, clock.now, "a 0")
    log._fh.close()
    log._fh = BrokenFile()
    for i in range(5, 8):
        clock.now = T0 + i
        scrape(log, clock.now, f"a {i}")
    log.close()
    assert log.errors >= 1 and log.dropped >= 1
    assert len(caplog.records) == 1
    clock.advance(5)
    scrape(log, clock.now, "late")  # after close: ignored, no error


def test_reader_rejects_missing_and_newer_recordings(tmp_path: Path) -> None:
    with pytest.raises(ScrapeLogError, match="no scrape log segments"):
        list(iter_records(str(tmp_path / "nothing")))
    seg = tmp_path / "rec.000001.gz"
    seg.write_bytes(gzip.compress(b'{"type":"header","format":"vllm-watchdog-scrapelog","version":99}\n'))
    with pytest.raises(ScrapeLogError, match="newer"):
        list(iter_records(str(tmp_path / "rec")))
    with pytest.raises(ScrapeLogError, match="newer"):
        list(iter_records(str(seg)))  # one segment named directly
