"""The error hierarchy and its promise: messages never carry caller values."""

from __future__ import annotations

import contextlib
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
