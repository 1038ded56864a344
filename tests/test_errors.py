"""The error hierarchy and its promise: messages never carry caller values."""

from __future__ import annotations

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
    for call in (
        lambda: ledger.close_task(task.id, "succeeded"),
        lambda: ledger.get_task("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"),
        lambda: ledger.create_task(task_id=task.id, timeout_seconds=1),
        lambda: ledger.heartbeat(task.id),
    ):
        with pytest.raises(LedgerError) as info:
            call()
        failures.append(str(info.value))
    for message in failures:
        assert task.id not in message
        assert "0a1b2c3d" not in message
        assert str(db_path) not in message
        assert message
