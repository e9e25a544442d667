"""The action state database: audit log, specs, drains, silences, pause, values; crash safety and corruption."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_watchdog.actions.store.actionstore import ActionStore, parse_silence_matchers
from vllm_watchdog.actions.store.statedb import MIGRATIONS, SCHEMA_VERSION, NewerSchemaError, migrate

LABELS = {"alertname": "VLLMHung", "target": "gpu0"}


@pytest.fixture
def store() -> Iterator[ActionStore]:
    s = ActionStore(None)
    yield s
    s.close()


def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "state" / "actions.db")


def test_begin_step_finish_round_trip(store: ActionStore) -> None:
    aid = store.begin("restart-hung", "restart", "gpu0", "alert:VLLMHung", LABELS, False, 1000.0)
    [running] = store.unfinished()
    assert (running.id, running.outcome, running.finished_at, running.step) == (aid, "running", None, "")
    store.step(aid, "drain", 1001.0)
    store.step(aid, "stop", 1002.5, {"timeout": 90.0})
    assert store.unfinished()[0].step == "stop"
    store.finish(aid, "succeeded", 1060.0, "ready again", {"ready_after": 58})
    assert store.unfinished() == []
    [rec] = store.history()
    assert rec.outcome == "succeeded" and rec.reason == "ready again" and rec.finished_at == 1060.0
    assert [(s.step, s.at, s.details) for s in rec.steps] == [
        ("drain", 1001.0, None),
        ("stop", 1002.5, {"timeout": 90.0}),
    ]
    doc = rec.to_json()
    assert json.loads(json.dumps(doc)) == doc  # JSON-clean for the API
    assert doc["labels"] == LABELS and doc["details"] == {"ready_after": 58} and doc["dry_run"] is False
    assert doc["steps"][1] == {"step": "stop", "at": 1002.5, "details": {"timeout": 90.0}}
    assert doc["needed_at"] is None and rec.need_time == 1000.0
    late = store.record(
        "a", "restart", "gpu0", "alert", {}, "skipped", "cooldown", False, 2000.0, needed_at=1500.0
    )
    assert store.history(limit=1)[0].id == late and store.history(limit=1)[0].need_time == 1500.0
    assert (doc["action"], doc["type"], doc["target"], doc["trigger"]) == (
        "restart-hung",
        "restart",
        "gpu0",
        "alert:VLLMHung",
    )


def test_finish_merges_details_and_refuses_twice(store: ActionStore) -> None:
    aid = store.begin("a", "restart", "t", "manual", {}, True, 1.0)
    store.finish(aid, "would_do", 2.0, details={"plan": "restart"})
    assert store.history()[0].details == {"plan": "restart"} and store.history()[0].dry_run
    with pytest.raises(ValueError, match="already finished"):
        store.finish(aid, "failed", 3.0)
    with pytest.raises(ValueError, match="already finished"):
        store.step(aid, "late", 3.0)
    with pytest.raises(ValueError, match="no action"):
        store.finish(aid + 100, "failed", 3.0)
    other = store.begin("a", "restart", "t", "manual", {}, False, 4.0)
    with pytest.raises(ValueError, match="unknown outcome"):
        store.finish(other, "exploded", 5.0)
    with pytest.raises(ValueError, match="unknown outcome"):
        store.record("a", "restart", "t", "manual", {}, "running", "", False, 5.0)
    assert store.unfinished()[0].id == other  # a rejected finish changed nothing


def test_step_details_that_json_cannot_encode_are_kept_as_text(store: ActionStore) -> None:
    aid = store.begin("a", "restart", "t", "manual", {}, False, 1.0)
    store.step(aid, "stop", 2.0, {"path": Path("/x")})
    assert store.unfinished()[0].steps[0].details == {"path": "/x"}


def test_record_and_history_filters(store: ActionStore) -> None:
    ids = [
        store.record("restart", "restart", "gpu0", "alert", LABELS, "skipped", "in cooldown", False, 10.0),
        store.record("restart", "restart", "gpu1", "alert", LABELS, "would_do", "", True, 20.0),
        store.record(
            "shrink", "reconfigure", "gpu0", "manual", {}, "refused", "unknown container", False, 30.0
        ),
        store.begin("restart", "restart", "gpu0", "alert", LABELS, False, 40.0),
    ]
    assert [r.id for r in store.history()] == ids[::-1]  # newest first
    assert [r.id for r in store.history(limit=2)] == ids[:1:-1]
    assert [r.id for r in store.history(target="gpu0")] == [ids[3], ids[2], ids[0]]
    assert [r.id for r in store.history(target="gpu0", action="restart")] == [ids[3], ids[0]]
    assert [r.id for r in store.history(dry_run=True)] == [ids[1]]
    assert [r.id for r in store.history(outcomes=("skipped", "running"))] == [ids[3], ids[0]]
    assert store.history(outcomes=()) == []
    assert [r.id for r in store.history(started_after=20.0)] == [ids[3], ids[2]]
    assert [r.id for r in store.history(after_id=ids[1])] == [ids[3], ids[2]]
    assert [r.id for r in store.history(None)] == ids[::-1]
    skipped = store.history(target="gpu1")[0]
    assert skipped.started_at == skipped.finished_at == 20.0


def test_history_steps_follow_limit_and_can_be_left_out(store: ActionStore) -> None:
    for i in range(5):
        aid = store.begin("a", "restart", "t", "alert", {}, False, float(i))
        for step in ("drain", "stop", "start"):
            store.step(aid, step, float(i))
        store.finish(aid, "succeeded", i + 0.5)
    recent = store.history(limit=2)
    assert [len(r.steps) for r in recent] == [3, 3] and [s.step for s in recent[0].steps] == [
        "drain",
        "stop",
        "start",
    ]
    assert all(r.steps == () for r in store.history(steps=False))


def test_specs(store: ActionStore) -> None:
    assert store.load_spec("gpu0", "original") is None
    store.save_spec("gpu0", "original", '{"kind": "docker"}', 1.0)
    store.save_spec("gpu0", "original", '{"kind": "docker", "args": ["--x"]}', 2.0)
    store.save_spec("gpu1", "original", "other", 2.0)
    assert store.load_spec("gpu0", "original") == '{"kind": "docker", "args": ["--x"]}'
    store.drop_spec("gpu0", "original")
    store.drop_spec("gpu0", "original")  # a second drop is fine
    assert store.load_spec("gpu0", "original") is None and store.load_spec("gpu1", "original") == "other"


def test_drains(store: ActionStore) -> None:
    assert store.drains() == {}
    store.set_drain("gpu0", True, 100.0, action_id=7)
    store.set_drain("gpu0", True, 150.0, action_id=8)  # still draining since 100
    store.set_drain("gpu1", True, 120.0)
    assert store.drains() == {"gpu0": 100.0, "gpu1": 120.0}
    store.set_drain("gpu0", False, 200.0)
    store.set_drain("gpu2", False, 200.0)
    assert store.drains() == {"gpu1": 120.0}


def test_silences_lifecycle(store: ActionStore) -> None:
    sid = store.add_silence(
        [{"name": "alertname", "op": "=~", "value": "VLLM.*"}, {"name": "target", "value": "gpu0"}],
        starts_at=1000.0,
        ends_at=2000.0,
        comment="maintenance",
        created_by="ops",
        now=900.0,
    )
    assert store.silences(999.0) == []  # pending
    assert [s.id for s in store.silences(999.0, active_only=False)] == [sid]
    [s] = store.silences(1000.0)
    assert s.state(999.0) == "pending" and s.state(1000.0) == "active" and s.state(2000.0) == "expired"
    assert s.matches(LABELS) and not s.matches({**LABELS, "target": "gpu1"})
    assert not s.matches({"alertname": "XVLLMHung", "target": "gpu0"})  # regexes are anchored
    assert store.silences(1999.999) and store.silences(2000.0) == []  # expires by itself
    doc = s.to_json(1500.0)
    assert doc["state"] == "active" and doc["matchers"][0] == {
        "name": "alertname",
        "op": "=~",
        "value": "VLLM.*",
    }
    assert (doc["comment"], doc["created_by"], doc["created_at"]) == ("maintenance", "ops", 900.0)
    assert json.loads(json.dumps(doc)) == doc
    assert "state" not in s.to_json()


def test_expire_silence(store: ActionStore) -> None:
    sid = store.add_silence([{"name": "action", "op": "=", "value": "restart"}], 0.0, 3600.0, "", "api", 0.0)
    pending = store.add_silence(
        [{"name": "action", "op": "=", "value": "restart"}], 500.0, 900.0, "", "api", 0.0
    )
    assert store.expire_silence(sid, 100.0)
    assert not store.expire_silence(sid, 200.0)  # already over
    assert not store.expire_silence("no-such-id", 200.0)
    assert store.expire_silence(pending, 200.0)
    kept = {s.id: s for s in store.silences(300.0, active_only=False)}
    assert (
        kept[sid].ends_at == 100.0 and kept[sid].updated_at == 100.0 and kept[sid].state(100.0) == "expired"
    )
    assert kept[pending].starts_at == kept[pending].ends_at == 200.0
    assert store.silences(150.0) == []


@pytest.mark.parametrize(
    ("matchers", "message"),
    [
        ([], "at least one matcher"),
        ([{"name": "a", "op": "==", "value": "x"}], "matcher 0"),
        ([{"name": "a", "op": "=", "value": "x"}, {"name": "", "op": "=", "value": "x"}], "matcher 1"),
        ([{"name": "a", "op": "=", "value": 3}], "matcher 0"),
        ([{"name": "a", "op": "=~", "value": "("}], "matcher 0: invalid regular expression"),
    ],
)
def test_bad_silences_are_refused(
    store: ActionStore, matchers: list[dict[str, object]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        store.add_silence(matchers, 0.0, 10.0, "", "api", 0.0)
    assert store.silences(5.0, active_only=False) == []


def test_silence_must_end_after_it_starts(store: ActionStore) -> None:
    with pytest.raises(ValueError, match="end after"):
        store.add_silence([{"name": "a", "value": "b"}], 10.0, 10.0, "", "api", 0.0)
    assert parse_silence_matchers([{"name": "a", "value": "b"}])[0].op == "="


def test_pause(store: ActionStore) -> None:
    assert store.paused() == (False, "", None)
    store.set_paused(True, "GPU maintenance", 50.0)
    assert store.paused() == (True, "GPU maintenance", 50.0)
    store.set_paused(False, "done", 80.0)
    assert store.paused() == (False, "done", 80.0)


def test_values(store: ActionStore) -> None:
    assert store.get("power/gpu0/0") is None
    store.put("power/gpu0/0", 350.0)
    store.put("restore_after", {"gpu0": {"action": "shrink", "at": 12.5}})
    assert store.get("power/gpu0/0") == 350.0
    assert store.get("restore_after") == {"gpu0": {"action": "shrink", "at": 12.5}}
    store.put("power/gpu0/0", None)
    assert store.get("power/gpu0/0") is None
    with pytest.raises(TypeError):
        store.put("bad", object())


def test_prune_keeps_real_runs(store: ActionStore) -> None:
    real = store.begin("a", "restart", "t", "alert", {}, False, 1.0)
    store.step(real, "stop", 1.0)
    store.finish(real, "failed", 2.0)
    store.record("a", "restart", "t", "alert", {}, "skipped", "cooldown", False, 3.0)
    store.record("a", "restart", "t", "alert", {}, "would_do", "", True, 4.0)
    dry = store.begin("a", "restart", "t", "alert", {}, True, 5.0)
    store.step(dry, "plan", 5.0)
    store.finish(dry, "would_do", 5.0)
    late = store.record("a", "restart", "t", "alert", {}, "skipped", "cooldown", False, 100.0)
    store.add_silence([{"name": "a", "value": "b"}], 0.0, 10.0, "", "api", 0.0)
    assert store.prune(before=50.0) == 3
    assert [r.id for r in store.history()] == [late, real] and len(store.history()[1].steps) == 1
    assert store.silences(0.0, active_only=False) == []


def test_state_survives_reopening_and_uses_wal(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    first = ActionStore(path)
    aid = first.begin("a", "restart", "gpu0", "alert", LABELS, False, 1.0)
    first.step(aid, "stop", 2.0)
    first.save_spec("gpu0", "original", "spec", 2.0)
    first.set_drain("gpu0", True, 2.0, aid)
    sid = first.add_silence([{"name": "target", "value": "gpu0"}], 0.0, 100.0, "c", "me", 0.0)
    first.set_paused(True, "why", 3.0)
    first.put("k", [1, 2])
    first.close()
    again = ActionStore(path)
    assert again.moved_aside is None
    [rec] = again.unfinished()
    assert rec.id == aid and rec.step == "stop" and rec.labels == LABELS
    assert again.load_spec("gpu0", "original") == "spec" and again.drains() == {"gpu0": 2.0}
    assert [s.id for s in again.silences(50.0)] == [sid] and again.paused() == (True, "why", 3.0)
    assert again.get("k") == [1, 2]
    again.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw.close()


def test_two_stores_on_one_file(tmp_path: Path) -> None:
    """The reconcile case: a second ActionStore opens the file the first still has open."""
    path = db_path(tmp_path)
    live = ActionStore(path)
    aid = live.begin("a", "restart", "gpu0", "alert", {}, False, 1.0)
    live.step(aid, "stop", 2.0)
    other = ActionStore(path)
    assert other.moved_aside is None and [r.id for r in other.unfinished()] == [aid]
    other.finish(aid, "failed", 3.0, "the watchdog restarted mid-action")
    assert live.unfinished() == [] and live.history()[0].reason == "the watchdog restarted mid-action"
    with pytest.raises(ValueError, match="already finished"):
        live.finish(aid, "succeeded", 4.0)
    ids = set()
    for i in range(20):  # interleaved writers never collide
        ids.add(
            (live if i % 2 else other).record(
                "a", "restart", "gpu0", "alert", {}, "skipped", "", False, 5.0 + i
            )
        )
    assert len(ids) == 20 and len(live.history(None)) == 21 == len(other.history(None))
    live.close()
    other.close()


_CHILD = """
import sys
from vllm_watchdog.actions.store.actionstore import ActionStore

store = ActionStore(sys.argv[1])
base = len(store.history(None))
for i in range(base, base + 100_000):
    aid = store.begin("restart", "restart", "gpu0", "alert", {"i": str(i)}, False, float(i))
    print("begun", aid, flush=True)
    store.step(aid, "stop", i + 0.25, {"i": i})
    print("stepped", aid, flush=True)
    store.put("last", i)
    store.finish(aid, "succeeded", i + 0.5)
    print("finished", aid, flush=True)
"""


@pytest.mark.parametrize("rounds", [(4, 17, 29, 60, 91)])
def test_kill_9_at_any_moment_loses_no_committed_change(tmp_path: Path, rounds: tuple[int, ...]) -> None:
    """A writer killed with SIGKILL after a varying number of commits; every reported commit is there."""
    path = db_path(tmp_path)
    ActionStore(path).close()
    begun: set[int] = set()
    stepped: set[int] = set()
    finished: set[int] = set()
    reconciled: set[int] = set()
    for lines in rounds:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, path], stdout=subprocess.PIPE, text=True)
        guard = threading.Timer(60.0, proc.kill)  # bounded even if the child hangs
        guard.start()
        try:
            assert proc.stdout is not None
            for _ in range(lines):
                line = proc.stdout.readline()
                assert line, "the writer died before it was killed"
                what, aid = line.split()
                {"begun": begun, "stepped": stepped, "finished": finished}[what].add(int(aid))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        finally:
            guard.cancel()
        store = ActionStore(path)  # what a restarted watchdog does: open, then reconcile
        assert store.moved_aside is None
        rows = {r.id: r for r in store.history(None)}
        assert begun <= rows.keys() and all(rows[a].steps for a in stepped)
        assert all(rows[a].outcome == "succeeded" for a in finished)
        unfinished = store.unfinished()
        assert len(unfinished) <= 1 and all(r.id == max(rows) for r in unfinished)
        for rec in unfinished:
            store.finish(rec.id, "failed", rec.started_at + 1, "watchdog restarted")
            reconciled.add(rec.id)
        assert {a for a, r in rows.items() if r.outcome != "succeeded"} <= reconciled
        store.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    raw.close()


def test_garbage_file_is_moved_aside_and_replaced(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = db_path(tmp_path)
    Path(path).parent.mkdir(parents=True)
    Path(path).write_bytes(b"this is not a database, but someone's notes" * 100)
    Path(path + "-wal").write_bytes(b"stale wal")
    with caplog.at_level(logging.ERROR):
        store = ActionStore(path)
    assert store.moved_aside == Path(path + ".corrupt-1")
    assert Path(path + ".corrupt-1").read_bytes().startswith(b"this is not a database")
    assert Path(path + ".corrupt-1-wal").read_bytes() == b"stale wal"
    assert "corrupt" in caplog.text and ".corrupt-1" in caplog.text
    store.put("fresh", True)
    assert store.get("fresh") is True
    store.close()
    Path(path).write_bytes(b"\x00garbage again" * 500)
    second = ActionStore(path)
    assert second.moved_aside == Path(path + ".corrupt-2") and Path(path + ".corrupt-1").exists()
    second.close()


def test_damaged_pages_are_detected(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = db_path(tmp_path)
    store = ActionStore(path)
    for i in range(300):
        store.record(
            "a", "restart", "gpu0", "alert", {"n": "x" * 50}, "skipped", "reason " * 10, False, float(i)
        )
    store.close()
    data = bytearray(Path(path).read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[2 * page : 4 * page] = bytes((i * 7 + 3) % 256 for i in range(2 * page))
    Path(path).write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR):
        fresh = ActionStore(path)
    assert fresh.moved_aside is not None and fresh.moved_aside.read_bytes() == bytes(data)
    assert fresh.history(None) == [] and "corrupt" in caplog.text
    fresh.close()


def test_unopenable_path_is_an_error_not_corruption(tmp_path: Path) -> None:
    path = tmp_path / "a-directory"
    path.mkdir()
    store = ActionStore(str(path))  # not corruption: nothing moved aside; the store works in memory
    assert store.degraded and store.moved_aside is None
    store.record("restart", "restart", "vllm-0", "manual", {}, "skipped", "test", False, 1.0)
    assert [r.reason for r in store.history(None)] == ["test"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-directory"]


def test_newer_schema_is_moved_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = db_path(tmp_path)
    ActionStore(path).close()
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    raw.commit()
    raw.close()
    with caplog.at_level(logging.ERROR):
        store = ActionStore(path)
    assert store.moved_aside == Path(path + ".newer-1") and "newer" in caplog.text
    store.put("ok", 1)
    store.close()


def test_migration_hook(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    store = ActionStore(path)
    store.put("kept", "yes")
    store.close()

    def backfill(db: sqlite3.Connection) -> None:
        db.execute("UPDATE kv SET note = 'migrated'")

    newer = {
        **MIGRATIONS,
        SCHEMA_VERSION + 1: ["ALTER TABLE kv ADD COLUMN note TEXT"],
        SCHEMA_VERSION + 2: backfill,
    }
    raw = sqlite3.connect(path, isolation_level=None)
    assert migrate(raw, path, newer) == SCHEMA_VERSION + 2
    assert raw.execute("SELECT value, note FROM kv").fetchall() == [('"yes"', "migrated")]
    assert migrate(raw, path, newer) == SCHEMA_VERSION + 2  # nothing left to do
    broken = {**newer, SCHEMA_VERSION + 3: ["CREATE TABLE half (a)", "THIS IS NOT SQL"]}
    with pytest.raises(sqlite3.OperationalError):
        migrate(raw, path, broken)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 2  # rolled back whole
    assert raw.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchall() == []
    with pytest.raises(NewerSchemaError):
        migrate(raw, path)
    raw.close()
