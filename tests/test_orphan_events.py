"""Events whose task is missing (damage: SQLite refuses to write one while
foreign keys are on): each is one foreign-key error and one event to
doctor, and nothing else; an upgrade of an earlier layout carries such an
event with a number below every task's, so it never becomes another task's.

Every file is written through the public API and then edited with plain
``sqlite3`` while no ``Ledger`` is open on it, as tests/test_doctor.py does.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger

from .conftest import FrozenClock, as_second_layout
from .test_doctor import PROBLEM_COUNTERS


def build(path: Path) -> None:
    """A small healthy ledger: six tasks, some claimed, one closed."""
    with Ledger(path, clock=FrozenClock()) as ledger:
        for i in range(6):
            task = ledger.create_task()
            if i % 2:
                ledger.claim(task.id, f"w{i}")
            if i == 3:
                ledger.close_task(task.id, "succeeded", worker=f"w{i}")
        assert ledger.doctor()["healthy"] is True


def scalar(path: Path, sql: str, *args: Any) -> Any:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return conn.execute(sql, args).fetchone()[0]


def problems(report: dict[str, Any]) -> dict[str, int]:
    return {k: report[k] for k in PROBLEM_COUNTERS if report[k]}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    directory = tmp_path / "gaps"
    directory.mkdir(mode=0o700)
    path = directory / "ledger.db"
    build(path)
    return path


def test_each_orphan_event_is_one_foreign_key_error_and_one_event(path: Path) -> None:
    """Two events whose task is missing, one with a number past every task's
    and one with the negative stand-in an upgrade gives such an event: each
    counts once as a foreign-key error (as ``PRAGMA foreign_key_check`` does)
    and once as an event, and neither makes the events' index look at odds
    with its table (it is not: the events are where their index says)."""
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        for task_no in (999, -7):
            conn.execute(
                "INSERT INTO task_events (task_no, event_kind, to_value, occurred_at, event_hash)"
                " VALUES (?, 'created', 'queued', 1800000000.0, ?)",
                (task_no, hashlib.sha256(str(task_no).encode()).digest()),
            )
        assert len(conn.execute("PRAGMA foreign_key_check").fetchall()) == 2
    events = scalar(path, "SELECT count(*) FROM task_events")
    with Ledger(path) as ledger:
        report = ledger.doctor()
    assert report["healthy"] is False
    assert report["event_count"] == events
    assert problems(report) == {"foreign_key_error_count": 2}, report
    with Ledger(path, read_only=True) as ledger:
        assert ledger.doctor() == report


@pytest.mark.parametrize("sign", [1, -1], ids=["its_sequence", "minus_its_sequence"])
def test_an_upgrade_carries_an_orphan_event_as_the_damage_it_was(path: Path, sign: int) -> None:
    """A second-layout file with an event whose task is missing, and a task
    whose rowid (edited by hand) is the event's sequence or minus it: the
    upgrade keeps the event, numbers it below every task, so it never
    becomes that task's, and doctor counts it alike before the upgrade
    (read-only, through a private copy) and after it."""
    as_second_layout(path)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        (sequence,) = conn.execute("SELECT max(sequence) + 1 FROM task_events").fetchone()
        (task_id,) = conn.execute("SELECT id FROM tasks WHERE status = 'queued' LIMIT 1").fetchone()
        conn.execute("UPDATE tasks SET rowid = ? WHERE id = ?", (sign * sequence, task_id))
        conn.execute(
            "INSERT INTO task_events (sequence, task_id, event_kind, to_value, occurred_at,"
            " event_hash) VALUES (?, ?, 'created', 'queued', 1800000000.0, ?)",
            (sequence, "ffffffff-ffff-4fff-8fff-ffffffffffff", hashlib.sha256(b"x").digest()),
        )
    events = scalar(path, "SELECT count(*) FROM task_events")
    with Ledger(path, read_only=True) as ledger:
        before = ledger.doctor()
    with Ledger(path) as ledger:
        after = ledger.doctor()
        assert len(ledger.events(task_id)) == 1  # its own created event, no more
    assert after == before
    assert after["event_count"] == events
    assert problems(after) == {"foreign_key_error_count": 1}, after
    stand_in = scalar(path, "SELECT task_no FROM task_events WHERE sequence = ?", sequence)
    assert stand_in < min(0, scalar(path, "SELECT min(task_no) FROM tasks"))
    assert scalar(path, "SELECT task_no FROM tasks WHERE id = ?", task_id) == sign * sequence
