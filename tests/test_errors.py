"""The error hierarchy and its promise: messages never carry caller values."""

from __future__ import annotations

import contextlib
import math
import sqlite3
from pathlib import Path

import pytest

from taskwarden import (
    InvalidInput,
    Ledger,
    LedgerBusy,
    LedgerError,
    StateConflict,
    TaskNotFound,
)


def test_hierarchy() -> None:
    assert issubclass(InvalidInput, LedgerError) and issubclass(InvalidInput, ValueError)
    assert issubclass(TaskNotFound, LedgerError) and issubclass(TaskNotFound, LookupError)
    assert issubclass(StateConflict, LedgerError)
    assert issubclass(LedgerBusy, StateConflict)


def test_messages_carry_no_ids_or_paths(ledger: Ledger, db_path) -> None:
    task = ledger.create_task()
    ledger.close_task(task.id, "failed")
    failures = []
    for call, kind in (
        (lambda: ledger.close_task(task.id, "succeeded"), StateConflict),
        (lambda: ledger.get_task("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"), TaskNotFound),
        (lambda: ledger.create_task(task_id=task.id, timeout_seconds=1), StateConflict),
        (lambda: ledger.heartbeat(task.id), StateConflict),
        (lambda: ledger.create_task(tenant="0a1b2c3d\n"), InvalidInput),
    ):
        with pytest.raises(kind) as info:
            call()
        failures.append(str(info.value))
    for message in failures:
        assert task.id not in message
        assert "0a1b2c3d" not in message
        assert str(db_path) not in message
        assert message


WRITES_OF_A_RUNNING_TASK = {
    "heartbeat": lambda lg, tid: lg.heartbeat(tid, worker="w"),
    "charge": lambda lg, tid: lg.charge(tid, tokens=1, worker="w"),
    "grant": lambda lg, tid: lg.grant(tid, calls=1),
    "set_delivery": lambda lg, tid: lg.set_delivery(tid, "delivered"),
    "close_task": lambda lg, tid: lg.close_task(tid, "succeeded", worker="w"),
}


@pytest.mark.parametrize("write", sorted(WRITES_OF_A_RUNNING_TASK))
def test_a_row_at_the_last_version_is_damage_for_every_write(db_path: Path, write: str) -> None:
    """A stored version of ``i64::MAX`` can only be damage: every write of the
    row refuses it as the same conflict as any other bad row (never an
    internal error, CLI exit 3), and writes nothing."""
    with Ledger(db_path) as ledger:
        task = ledger.create_task(llm_calls_budget=5, delivery_required=True)
        ledger.claim(task.id, "w")
        if write == "set_delivery":  # delivery is recorded on a closed task
            ledger.close_task(task.id, "succeeded", worker="w")
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("UPDATE tasks SET version = ? WHERE id = ?", (2**63 - 1, task.id))
    with Ledger(db_path) as ledger:
        before = ledger.get_task(task.id)
        with pytest.raises(StateConflict, match="stored task metadata failed validation"):
            WRITES_OF_A_RUNNING_TASK[write](ledger, task.id)
        assert ledger.get_task(task.id) == before


def test_reconcile_passes_over_rows_no_write_could_make(db_path: Path) -> None:
    """Rows every other write refuses as damage: one at the last version
    (``version + 1`` stored a REAL no read accepted, so the apply turned a
    file doctor called healthy into an unhealthy one), one whose start time
    is text (SQL sorts text after every number, so the whole pass was
    refused as a clock behind the row). The pass leaves both as they are
    and decides the rest; the dry run counts the same."""
    from .conftest import FrozenClock

    clock = FrozenClock(1_000.0)
    with Ledger(db_path, clock=clock) as ledger:
        at_last, text_time, minus_inf, lost = (ledger.create_task() for _ in range(4))
        for task in (at_last, text_time, minus_inf, lost):
            ledger.claim(task.id, "w1")
        closed = ledger.create_task()
        ledger.claim(closed.id, "w2")
        ledger.close_task(closed.id, "succeeded", worker="w2")
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        for task in (at_last, closed):
            conn.execute("UPDATE tasks SET version = ? WHERE id = ?", (2**63 - 1, task.id))
        conn.execute("UPDATE tasks SET started_at = 'x' WHERE id = ?", (text_time.id,))
        # -inf would read as stale, and its evidence be overwritten.
        conn.execute("UPDATE tasks SET updated_at = ? WHERE id = ?", (-math.inf, minus_inf.id))
    clock.advance(100_000)
    graces = {"active_grace_seconds": 600, "delivery_grace_seconds": 600}
    with Ledger(db_path, clock=clock) as ledger:
        healthy_before = ledger.doctor()
        dry = ledger.reconcile(**graces, dry_run=True)
        applied = ledger.reconcile(**graces)
        assert ledger.reconcile(**graces, worker_lost="w1")["tasks_timed_out"] == 0
        assert ledger.get_task(lost.id).status == "timed_out"
        assert ledger.get_task(at_last.id).status == "running"
        after = ledger.doctor()
        damage = [k for k in after if k.endswith("_count") and k != "event_count"]
        assert {k: after[k] for k in damage} == {k: healthy_before[k] for k in damage}
        assert after["healthy"] == healthy_before["healthy"]
    assert (applied["tasks_timed_out"], applied["deliveries_failed"]) == (1, 0)
    flags = ("dry_run", "applied")
    assert {k: v for k, v in dry.items() if k not in flags} == {
        k: v for k, v in applied.items() if k not in flags
    }
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        stored = conn.execute(
            "SELECT typeof(version), status, delivery_status FROM tasks WHERE id IN (?, ?, ?, ?)",
            (at_last.id, closed.id, text_time.id, minus_inf.id),
        ).fetchall()
    assert sorted(stored) == [
        ("integer", "running", "pending"),
        ("integer", "running", "pending"),
        ("integer", "running", "pending"),
        ("integer", "succeeded", "pending"),
    ]


@pytest.mark.parametrize("version", [2**63 - 3, 2**63 - 2])
def test_a_task_timed_out_at_its_next_to_last_version_keeps_its_delivery(
    db_path: Path, version: int
) -> None:
    """With a delivery grace of 0, a task timed out in the pass has its
    delivery closed in the same pass, which takes one more write. One
    version short of the last, the timeout is the row's last write: the
    apply leaves its delivery pending, and the dry run once counted it
    closed (a file doctor calls healthy, two different reports)."""
    from .conftest import FrozenClock

    clock = FrozenClock(1_000.0)
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task()
        ledger.claim(task.id, "w1")
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("UPDATE tasks SET version = ? WHERE id = ?", (version, task.id))
    clock.advance(100_000)
    graces = {"active_grace_seconds": 600, "delivery_grace_seconds": 0}
    with Ledger(db_path, clock=clock) as ledger:
        assert ledger.doctor()["healthy"]
        dry = ledger.reconcile(**graces, dry_run=True)
        applied = ledger.reconcile(**graces)
        after = ledger.get_task(task.id)
        assert ledger.doctor()["healthy"]
    closed = version < 2**63 - 2
    assert (after.status, after.delivery_status) == (
        "timed_out",
        "failed" if closed else "pending",
    )
    assert (applied["tasks_timed_out"], applied["deliveries_failed"]) == (1, int(closed))
    flags = ("dry_run", "applied")
    assert {k: v for k, v in dry.items() if k not in flags} == {
        k: v for k, v in applied.items() if k not in flags
    }


@pytest.mark.parametrize(
    ("column", "value"),
    [("tenant", "ac me"), ("version", 2**63 - 1), ("attempt_count", 2**63 - 1)],
    ids=["tenant", "version", "attempt_count"],
)
def test_claim_next_passes_over_a_damaged_queued_row(
    db_path: Path, column: str, value: object
) -> None:
    """One queued row no write accepts (a tenant edited to 'ac me', a
    version at its last value) once stopped claim_next for every worker:
    the tasks behind it were never handed out. It is passed over, and
    stays as it is."""
    with Ledger(db_path) as ledger:
        tasks = [ledger.create_task(tenant="acme") for _ in range(5)]
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute(f"UPDATE tasks SET {column} = ? WHERE id = ?", (value, tasks[2].id))
    with Ledger(db_path) as ledger:
        claimed = [t.id for t in ledger.claim_next("w1", limit=10)]
        assert claimed == [t.id for i, t in enumerate(tasks) if i != 2]
        assert ledger.claim_next("w2") == []
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        stored = conn.execute(
            f"SELECT status, {column} FROM tasks WHERE id = ?", (tasks[2].id,)
        ).fetchone()
    assert stored == ("queued", value)


@pytest.mark.parametrize(
    ("column", "value"), [("tenant", "ac me"), ("version", 2**63 - 1)], ids=["tenant", "version"]
)
def test_a_subtree_cancel_passes_over_a_damaged_descendant(
    db_path: Path, column: str, value: object
) -> None:
    """The emergency stop was refused whole for one damaged sub-agent row,
    and the rest of the tree went on charging. The damaged row is left for
    doctor; the root and every other descendant are cancelled."""
    with Ledger(db_path) as ledger:
        root = ledger.create_task(llm_calls_budget=100)
        children = [ledger.create_task(parent_id=root.id) for _ in range(4)]
        for child in children:
            ledger.claim(child.id, "w")
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute(f"UPDATE tasks SET {column} = ? WHERE id = ?", (value, children[1].id))
    with Ledger(db_path) as ledger:
        assert ledger.cancel(root.id, subtree=True).status == "cancelled"
        healthy = [c for i, c in enumerate(children) if i != 1]
        assert {ledger.get_task(c.id).status for c in healthy} == {"cancelled"}
        assert ledger.charge(healthy[0].id, worker="w").allowed is False
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        stored = conn.execute("SELECT status FROM tasks WHERE id = ?", (children[1].id,)).fetchone()
    assert stored == ("running",)


def test_a_queued_row_with_an_owner_is_damage_that_no_read_or_claim_takes(
    db_path: Path,
) -> None:
    with Ledger(db_path) as ledger:
        task = ledger.create_task()
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("UPDATE tasks SET owner = 'w9' WHERE id = ?", (task.id,))
    with Ledger(db_path) as ledger:
        with pytest.raises(StateConflict, match="stored task metadata failed validation"):
            ledger.get_task(task.id)
        assert ledger.claim_next("w2") == []  # passed over, not claimed
        report = ledger.doctor()
    assert report["owner_inconsistency_count"] == 1
    assert report["healthy"] is False
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("SELECT status, owner FROM tasks").fetchall() == [("queued", "w9")]
