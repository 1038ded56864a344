"""Peer files (task-state-guard 0.1.0, schema v1 and v2) open in taskwarden and
migrate to schema v3 on the first writable open, losing nothing (SPEC §2.1).

The peer files are made with the real ``task_state_guard`` package, used only
as a library; the expected values are read back through its own API.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import task_state_guard as tsg

from taskwarden import Ledger
from taskwarden.errors import StateConflict

from .conftest import EVENT_TASK_ID, PEER_TASK_FIELDS, FrozenClock, held_open, logical_dump

EVENT_FIELDS = "event_kind, from_value, to_value, occurred_at, code FROM task_events"
# A peer's event names its task by id; taskwarden's by the task's number.
PEER_EVENT_SQL = f"SELECT sequence, task_id, {EVENT_FIELDS} ORDER BY sequence"
EVENT_SQL = f"SELECT sequence, {EVENT_TASK_ID}, {EVENT_FIELDS} ORDER BY sequence"
SCHEMA_SQL = (
    "SELECT type, name, tbl_name, sql FROM sqlite_master "
    "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
)


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def peer_fields(task: Any) -> tuple[Any, ...]:
    """The sixteen task-state-guard fields of a peer or taskwarden ``Task``."""
    return tuple(_plain(getattr(task, name)) for name in PEER_TASK_FIELDS)


def query(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return list(conn.execute(sql, params))


def execute(path: Path, *statements: str) -> None:
    """Run statements in one committed transaction, as a hostile or older tool would."""
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        for sql in statements:
            conn.execute(sql)


def schema_meta(path: Path) -> dict[str, str]:
    return dict(query(path, "SELECT key, value FROM schema_meta"))


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table. Unlike a read-only reader, a normal connection
    leaves no -wal/-shm behind when it closes."""
    tables = [r[0] for r in query(path, "SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {t: sorted(query(path, f'SELECT * FROM "{t}"'), key=repr) for t in sorted(tables)}


def file_state(path: Path) -> tuple[bytes, int, list[str], int]:
    """Bytes, mtime, directory listing and mode: anything a write would touch."""
    st = path.stat()
    return path.read_bytes(), st.st_mtime_ns, sorted(os.listdir(path.parent)), st.st_mode


@dataclass
class PeerFile:
    path: Path
    version: int
    ids: dict[str, str] = field(default_factory=dict)
    tasks: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    children: dict[str, list[str]] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)
    events: list[tuple[Any, ...]] = field(default_factory=list)


def build_peer_file(path: Path, clock: FrozenClock, version: int) -> PeerFile:
    """A realistic peer ledger: every status, both delivery kinds, a task tree."""
    clock.now = 1_800_000_000.123456
    peer = tsg.Ledger(path, clock=clock)
    ids: dict[str, str] = {}

    def fp(text: str) -> str:
        return tsg.payload_fingerprint(text)

    # A running task left behind by a crash, timed out by the peer's reconcile.
    ids["stale"] = peer.create_task(payload_hash=fp("stale")).id
    peer.start_task(ids["stale"])
    clock.advance(700.25)
    report = peer.reconcile(active_grace_seconds=600.0, delivery_grace_seconds=86_400.0)
    assert report["tasks_timed_out"] == 1

    clock.advance(0.1)
    ids["deadline"] = peer.create_task(timeout_seconds=0.75).id
    peer.start_task(ids["deadline"])
    clock.advance(1.5)
    peer.close_task(ids["deadline"], "timed_out", code="deadline_exceeded")
    clock.advance(0.3)
    peer.set_delivery(ids["deadline"], "failed", code="delivery_grace_expired")

    clock.advance(0.7)
    ids["queued"] = peer.create_task(payload_hash=fp("queued work")).id

    clock.advance(1.1)
    ids["running"] = peer.create_task(timeout_seconds=3600.5, payload_hash=fp("run")).id
    clock.advance(0.2)
    peer.start_task(ids["running"])
    clock.advance(2.9)
    peer.heartbeat(ids["running"])

    clock.advance(0.4)
    ids["parent"] = peer.create_task(payload_hash=fp("parent"), timeout_seconds=60.0).id
    peer.start_task(ids["parent"])
    clock.advance(3.3)
    peer.close_task(ids["parent"], "succeeded", code="worker_completed")
    clock.advance(0.01)
    peer.set_delivery(ids["parent"], "delivered", code="transport_acknowledged")

    clock.advance(0.6)
    ids["child_a"] = peer.create_task(parent_id=ids["parent"], delivery_required=False).id
    peer.start_task(ids["child_a"])
    clock.advance(0.9)
    peer.close_task(ids["child_a"], "succeeded", code="completed")
    peer.set_delivery(ids["child_a"], "not_applicable", code="internal_task")

    # Two children created at the same instant: children_of orders them by id.
    clock.advance(0.5)
    ids["child_b"] = peer.create_task(parent_id=ids["parent"], delivery_required=False).id
    ids["child_c"] = peer.create_task(
        parent_id=ids["parent"], delivery_required=False, payload_hash=fp("c")
    ).id
    clock.advance(0.25)
    peer.close_task(ids["child_b"], "failed", code="worker_failed")
    peer.set_delivery(ids["child_b"], "not_applicable")

    clock.advance(0.05)
    ids["grandchild"] = peer.create_task(parent_id=ids["child_a"], delivery_required=False).id
    peer.close_task(ids["grandchild"], "cancelled", code="caller_cancelled")

    clock.advance(1.75)
    ids["failed"] = peer.create_task(payload_hash=fp("failed")).id
    peer.start_task(ids["failed"])
    clock.advance(4.0)
    peer.close_task(ids["failed"], "failed", code="worker_failed")
    clock.advance(0.5)
    peer.set_delivery(ids["failed"], "failed", code="transport_failed")

    clock.advance(0.33)
    ids["cancelled"] = peer.create_task().id
    peer.close_task(ids["cancelled"], "cancelled", code="caller_cancelled")

    clock.advance(0.125)
    upper = "ABCDEF01-2345-4678-9ABC-DEF012345678"
    ids["upper"] = peer.create_task(task_id=upper).id
    assert ids["upper"] == upper.lower()
    peer.close_task(ids["upper"], "succeeded")

    out = PeerFile(path=path, version=version, ids=ids)
    for task_id in ids.values():
        out.tasks[task_id] = peer_fields(peer.get_task(task_id))
    for parent in ("parent", "child_a"):
        out.children[ids[parent]] = [t.id for t in peer.children_of(ids[parent])]
    out.started = {ids[k] for k in ("stale", "deadline", "running", "parent", "child_a", "failed")}

    statuses = {t[2] for t in out.tasks.values()}
    assert statuses == {"queued", "running", "succeeded", "failed", "timed_out", "cancelled"}
    assert len(out.children[ids["parent"]]) == 3

    if version == 1:
        execute(
            path,
            "DELETE FROM schema_meta WHERE key = 'schema_fingerprint'",
            "UPDATE schema_meta SET value = '1' WHERE key = 'schema_version'",
        )
    out.events = query(path, PEER_EVENT_SQL)
    assert len(out.events) >= 30
    assert schema_meta(path)["schema_version"] == str(version)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return out


@pytest.fixture(params=[1, 2], ids=["peer_v1", "peer_v2"])
def peer_file(request: pytest.FixtureRequest, db_path: Path, clock: FrozenClock) -> PeerFile:
    return build_peer_file(db_path, clock, request.param)


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    """A ledger file created by taskwarden itself, in its own private directory."""
    directory = tmp_path / "fresh"
    directory.mkdir(mode=0o700)
    path = directory / "fresh.db"
    with Ledger(path):
        pass
    return path


def test_peer_file_is_migrated_to_v3_with_every_task_kept(
    peer_file: PeerFile, clock: FrozenClock
) -> None:
    with Ledger(peer_file.path, clock=clock) as ledger:
        for task_id, expected in peer_file.tasks.items():
            task = ledger.get_task(task_id)
            assert peer_fields(task) == expected
            for name in ("created_at", "updated_at", "delivery_updated_at"):
                assert type(getattr(task, name)) is float
            assert task.owner is None
            assert task.tenant is None
            assert task.park_code is None
            assert task.attempt_count == (1 if task_id in peer_file.started else 0)
            assert task.llm_calls_budget is None
            assert task.token_budget is None
            assert task.cost_budget_micros is None
            assert (task.llm_calls_used, task.tokens_used, task.cost_used_micros) == (0, 0, 0)
        for parent, children in peer_file.children.items():
            assert [t.id for t in ledger.children_of(parent)] == children
    assert schema_meta(peer_file.path)["schema_version"] == "3"
    assert stat.S_IMODE(peer_file.path.stat().st_mode) == 0o600


def test_migration_keeps_every_event_row(peer_file: PeerFile) -> None:
    with Ledger(peer_file.path):
        pass
    assert query(peer_file.path, EVENT_SQL) == peer_file.events


def test_migrated_schema_is_exactly_a_fresh_schema(peer_file: PeerFile, fresh: Path) -> None:
    with Ledger(peer_file.path):
        pass
    assert query(peer_file.path, SCHEMA_SQL) == query(fresh, SCHEMA_SQL)
    assert schema_meta(peer_file.path) == schema_meta(fresh)
    assert schema_meta(peer_file.path)["schema_version"] == str(Ledger.SCHEMA_VERSION) == "3"
    assert query(peer_file.path, "PRAGMA integrity_check") == [("ok",)]
    assert query(peer_file.path, "PRAGMA foreign_key_check") == []


def test_lifecycle_continues_on_migrated_and_new_tasks(
    peer_file: PeerFile, clock: FrozenClock
) -> None:
    ids = peer_file.ids
    old_running = peer_file.tasks[ids["running"]]
    max_sequence = peer_file.events[-1][0]
    with Ledger(peer_file.path, clock=clock) as ledger:
        now = clock.advance(10.5)
        task = ledger.heartbeat(ids["running"])
        assert (task.updated_at, task.version) == (now, old_running[-1] + 1)
        assert task.deadline_at == old_running[PEER_TASK_FIELDS.index("deadline_at")]
        now = clock.advance(1.0)
        task = ledger.close_task(ids["running"], "succeeded", code="worker_completed")
        assert (task.status, task.ended_at, task.terminal_code) == (
            "succeeded",
            now,
            "worker_completed",
        )
        now = clock.advance(0.5)
        task = ledger.set_delivery(ids["running"], "delivered", code="transport_acknowledged")
        assert (task.delivery_status, task.delivery_updated_at) == ("delivered", now)
        assert task.version == old_running[-1] + 3
        assert task.attempt_count == 1

        task = ledger.start_task(ids["queued"])
        assert (task.status, task.started_at, task.attempt_count) == ("running", now, 1)
        task = ledger.close_task(ids["queued"], "failed", code="worker_failed")
        task = ledger.set_delivery(ids["queued"], "failed", code="transport_failed")
        assert (task.status, task.delivery_status, task.version) == ("failed", "failed", 3)

        # A terminal task with a pending delivery, and a queued internal child.
        task = ledger.set_delivery(ids["cancelled"], "delivered")
        assert task.delivery_status == "delivered"
        task = ledger.close_task(ids["child_c"], "cancelled", code="caller_cancelled")
        task = ledger.set_delivery(ids["child_c"], "not_applicable", code="internal_task")
        assert (task.status, task.delivery_status) == ("cancelled", "not_applicable")

        # Terminal peer rows stay immutable; the same status again is a no-op.
        parent = ledger.close_task(ids["parent"], "succeeded")
        assert peer_fields(parent) == peer_file.tasks[ids["parent"]]
        with pytest.raises(StateConflict):
            ledger.close_task(ids["parent"], "failed")
        with pytest.raises(StateConflict):
            ledger.start_task(ids["stale"])

        # A new task in the old tree, and a new top-level task.
        clock.advance(0.75)
        child = ledger.create_task(parent_id=ids["parent"], tenant="acme", delivery_required=False)
        assert child.llm_calls_budget == 25
        assert [t.id for t in ledger.children_of(ids["parent"])] == [
            *peer_file.children[ids["parent"]],
            child.id,
        ]
        fresh = ledger.create_task(timeout_seconds=5.0)
        ledger.start_task(fresh.id)
        ledger.heartbeat(fresh.id)
        ledger.close_task(fresh.id, "succeeded")
        fresh = ledger.set_delivery(fresh.id, "delivered")
        assert (fresh.status, fresh.delivery_status, fresh.version) == ("succeeded", "delivered", 4)

    events = query(peer_file.path, EVENT_SQL)
    assert events[: len(peer_file.events)] == peer_file.events
    new_events = events[len(peer_file.events) :]
    assert all(e[0] > max_sequence for e in new_events)
    by_task = [(e[1], e[2], e[3], e[4]) for e in new_events]
    assert (ids["running"], "task_transition", "running", "succeeded") in by_task
    assert (ids["running"], "delivery_transition", "pending", "delivered") in by_task
    assert (ids["queued"], "task_transition", "queued", "running") in by_task

    # The writes persisted: a new handle sees them.
    with Ledger(peer_file.path, clock=clock) as ledger:
        assert ledger.get_task(ids["running"]).delivery_status == "delivered"
        assert ledger.get_task(fresh.id) == fresh


def _switch_to_rollback_journal(path: Path) -> None:
    """What another tool (or an operator's `PRAGMA journal_mode=DELETE`)
    leaves behind: the file's header says rollback journal, no sidecars."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    assert path.read_bytes()[18:20] == bytes([1, 1])


@pytest.mark.parametrize("origin", ["peer_v1", "peer_v2", "taskwarden"])
def test_a_file_in_rollback_journal_mode_opens_in_wal_mode(
    db_path: Path, clock: FrozenClock, origin: str
) -> None:
    """The peer switches such a file back to WAL and goes on; so does a
    writable open here, migrating a peer file on the way. The first open
    works, and its close leaves no sidecars."""
    if origin == "taskwarden":
        with Ledger(db_path, clock=clock) as ledger:
            task_id = ledger.create_task().id
    else:
        task_id = build_peer_file(db_path, clock, int(origin[-1])).ids["queued"]
    _switch_to_rollback_journal(db_path)
    with Ledger(db_path, clock=clock) as ledger:
        assert ledger.storage_info()["journal_mode"] == "wal"
        assert ledger.claim(task_id, "w1").status.value == "running"
        assert ledger.doctor()["healthy"]
    assert db_path.read_bytes()[18:20] == bytes([2, 2])
    assert sorted(os.listdir(db_path.parent)) == [db_path.name]
    assert schema_meta(db_path)["schema_version"] == "3"


def test_second_open_changes_nothing(peer_file: PeerFile, clock: FrozenClock) -> None:
    with Ledger(peer_file.path, clock=clock):
        pass
    migrated = logical_dump(peer_file.path)
    clock.advance(3600.0)
    with Ledger(peer_file.path, clock=clock) as ledger:
        ledger.get_task(peer_file.ids["running"])
    assert logical_dump(peer_file.path) == migrated
    assert schema_meta(peer_file.path)["schema_version"] == "3"


def _assert_read_only_preview(peer_file: PeerFile) -> None:
    before_meta = schema_meta(peer_file.path)
    before = file_state(peer_file.path)
    with Ledger(peer_file.path, read_only=True) as ledger:
        for task_id, expected in peer_file.tasks.items():
            assert peer_fields(ledger.get_task(task_id)) == expected
        for parent, children in peer_file.children.items():
            assert [t.id for t in ledger.children_of(parent)] == children
        with pytest.raises(StateConflict):
            ledger.create_task()
    assert file_state(peer_file.path) == before
    assert schema_meta(peer_file.path) == before_meta
    assert before_meta["schema_version"] == str(peer_file.version)
    assert query(peer_file.path, PEER_EVENT_SQL) == peer_file.events


def test_read_only_open_never_migrates_yet_reads_correctly(peer_file: PeerFile) -> None:
    _assert_read_only_preview(peer_file)


READER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("SELECT count(*) FROM tasks").fetchall()
print("ready", flush=True)
sys.stdin.read()
conn.close()
"""


def test_read_only_open_previews_peer_file_while_another_process_reads_it(
    peer_file: PeerFile,
) -> None:
    """Another process's open connection leaves live -wal/-shm files beside the
    peer file; the peer's own read-only open copes with that, and so must ours."""
    with held_open(READER, str(peer_file.path)):
        names = os.listdir(peer_file.path.parent)
        assert {"ledger.db-wal", "ledger.db-shm"} <= set(names)
        _assert_read_only_preview(peer_file)


def _assert_refused_unchanged(path: Path, *, damaged_rows: bool = False) -> None:
    """A writable open refuses the file and changes nothing. A read-only
    open refuses it too, unless only its rows are damaged: then it previews
    a private migrated copy, whose doctor reports the damage."""
    before_dump = dump(path)
    before_schema = query(path, SCHEMA_SQL)
    before = file_state(path)
    with pytest.raises(StateConflict), Ledger(path):
        pass
    if damaged_rows:
        with Ledger(path, read_only=True) as preview:
            assert preview.doctor()["healthy"] is False
    else:
        with pytest.raises(StateConflict), Ledger(path, read_only=True):
            pass
    assert file_state(path) == before
    assert query(path, SCHEMA_SQL) == before_schema
    assert dump(path) == before_dump


def test_extra_schema_object_is_refused_and_left_unchanged(
    db_path: Path, clock: FrozenClock
) -> None:
    build_peer_file(db_path, clock, 2)
    execute(db_path, "CREATE INDEX extra ON tasks(status)")
    _assert_refused_unchanged(db_path)
    assert schema_meta(db_path)["schema_version"] == "2"


def test_unsupported_schema_version_is_refused(db_path: Path, clock: FrozenClock) -> None:
    build_peer_file(db_path, clock, 2)
    execute(db_path, "UPDATE schema_meta SET value = '9' WHERE key = 'schema_version'")
    _assert_refused_unchanged(db_path)
    assert schema_meta(db_path)["schema_version"] == "9"


# Rows the peer's own API never writes, made by hand. Migrated, each would
# be a file doctor calls unhealthy (and free text would be stored), so
# the migration refuses the file and leaves it the peer's.
ROW_DAMAGE = {
    "free_text_in_an_event": (
        "UPDATE task_events SET from_value = 'summarise the board minutes' "
        "WHERE task_id = '{running}' AND event_kind = 'task_transition'"
    ),
    "text_in_a_timestamp": "UPDATE tasks SET updated_at = 'yesterday' WHERE id = '{queued}'",
    "updated_before_created": (
        "UPDATE tasks SET updated_at = created_at - 1 WHERE id = '{queued}'"
    ),
    "task_without_events": "DELETE FROM task_events WHERE task_id = '{queued}'",
    # Codes taskwarden knows and the peer's registry does not: the peer
    # refuses such a file, so its migration must too.
    "a_code_taskwarden_alone_knows": (
        "UPDATE tasks SET terminal_code = 'worker_lost' WHERE id = '{deadline}'"
    ),
    "an_event_taskwarden_alone_writes": (
        "UPDATE task_events SET code = 'claimed' "
        "WHERE task_id = '{running}' AND to_value = 'running'"
    ),
}


@pytest.mark.parametrize("damage", sorted(ROW_DAMAGE))
def test_peer_file_with_rows_taskwarden_never_writes_is_refused_and_left_unchanged(
    peer_file: PeerFile, damage: str
) -> None:
    execute(peer_file.path, ROW_DAMAGE[damage].format(**peer_file.ids))
    _assert_refused_unchanged(peer_file.path, damaged_rows=True)
    assert schema_meta(peer_file.path)["schema_version"] == str(peer_file.version)


def test_a_foreign_sqlite_file_keeps_every_byte_and_its_journal_mode(db_path: Path) -> None:
    """Another program's database is refused before anything is switched:
    it is not even put into WAL mode (header bytes 18-19)."""
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('hello')")
        conn.commit()
    db_path.chmod(0o600)
    assert db_path.read_bytes()[18:20] == bytes([1, 1])
    _assert_refused_unchanged(db_path)
    assert db_path.read_bytes()[18:20] == bytes([1, 1])


@pytest.mark.parametrize(
    ("role", "column", "value"),
    [
        ("failed", "terminal_code", "made_up_reason"),
        ("parent", "delivery_code", "made_up_reason"),
        # Registered, but not allowed for the stored status.
        ("parent", "terminal_code", "worker_failed"),
        ("queued", "terminal_code", "completed"),
    ],
)
def test_v1_file_with_unsafe_code_is_refused_and_stays_v1(
    db_path: Path, clock: FrozenClock, role: str, column: str, value: str
) -> None:
    peer = build_peer_file(db_path, clock, 1)
    execute(db_path, f"UPDATE tasks SET {column} = '{value}' WHERE id = '{peer.ids[role]}'")
    before = file_state(db_path)
    with pytest.raises(StateConflict), Ledger(db_path):
        pass
    assert file_state(db_path) == before
    assert schema_meta(db_path) == {"schema_version": "1"}
    # The peer refuses it too: taskwarden is no more permissive than the original.
    with pytest.raises(tsg.StateConflict):
        tsg.Ledger(db_path)
    assert schema_meta(db_path) == {"schema_version": "1"}


def test_v1_file_with_unsafe_event_code_is_refused_and_stays_v1(
    db_path: Path, clock: FrozenClock
) -> None:
    peer = build_peer_file(db_path, clock, 1)
    execute(
        db_path,
        "UPDATE task_events SET code = 'made_up_reason' "
        f"WHERE task_id = '{peer.ids['failed']}' AND to_value = 'failed' "
        "AND event_kind = 'task_transition'",
    )
    before = file_state(db_path)
    with pytest.raises(StateConflict), Ledger(db_path):
        pass
    assert file_state(db_path) == before
    assert schema_meta(db_path) == {"schema_version": "1"}


def test_an_open_told_not_to_migrate_refuses_a_peer_file_and_leaves_it(
    peer_file: PeerFile, tmp_path: Path
) -> None:
    before = file_state(peer_file.path)
    with pytest.raises(StateConflict), Ledger(peer_file.path, migrate=False):
        pass
    assert file_state(peer_file.path) == before
    assert schema_meta(peer_file.path)["schema_version"] == str(peer_file.version)
    # Its own files, new or current, open as usual.
    fresh = tmp_path / "fresh.db"
    with Ledger(fresh, migrate=False) as ledger:
        ledger.create_task()
    with Ledger(fresh, migrate=False) as ledger:
        assert ledger.stats()["task_count"] == 1


def test_peer_refuses_a_migrated_file(peer_file: PeerFile) -> None:
    with Ledger(peer_file.path):
        pass
    with pytest.raises(tsg.StateConflict):
        tsg.Ledger(peer_file.path)
    with pytest.raises(tsg.StateConflict):
        tsg.Ledger(peer_file.path, read_only=True)
    assert schema_meta(peer_file.path)["schema_version"] == "3"
