"""Files of the first v3 layout (taskwarden builds up to commit 9f84333, whose
CHECK constraints listed values with ``IN``) are read as they are and
upgraded in place on their first writable open, losing nothing.

``data/first_layout_v3.db`` was written by that build through its public
API: ten tasks in every status family, with owners, charges, a grant, a
block, a budget escalation, a delivery and a cancellation.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger, TaskStatus

from .conftest import FrozenClock, logical_dump

FIXTURE = Path(__file__).parent / "data" / "first_layout_v3.db"
FIRST_LAYOUT_FINGERPRINT = "982ad3385d1ee3cb3bf59c616f18e2eb60bbc49373064357ea19cce3eca06f27"
SCHEMA_SQL = (
    "SELECT type, name, tbl_name, sql FROM sqlite_master "
    "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
)


def query(path: Path, sql: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return list(conn.execute(sql))


def rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row but the schema metadata, which the upgrade rewrites."""
    content = logical_dump(path)
    del content["schema_meta"]
    return content


@pytest.fixture
def first_layout(db_path: Path) -> Path:
    shutil.copyfile(FIXTURE, db_path)
    db_path.chmod(0o600)
    return db_path


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    directory = tmp_path / "fresh"
    directory.mkdir(mode=0o700)
    with Ledger(directory / "fresh.db"):
        pass
    return directory / "fresh.db"


def test_the_fixture_is_a_first_layout_file(first_layout: Path, fresh: Path) -> None:
    meta = dict(query(first_layout, "SELECT key, value FROM schema_meta"))
    assert meta == {"schema_version": "3", "schema_fingerprint": FIRST_LAYOUT_FINGERPRINT}
    assert query(first_layout, SCHEMA_SQL) != query(fresh, SCHEMA_SQL)
    assert len(query(first_layout, "SELECT id FROM tasks")) == 10


def test_first_writable_open_upgrades_to_a_fresh_schema_keeping_every_row(
    first_layout: Path, fresh: Path
) -> None:
    before = rows(first_layout)
    with Ledger(first_layout) as ledger:
        assert ledger.doctor()["healthy"] is True
    assert rows(first_layout) == before
    assert query(first_layout, SCHEMA_SQL) == query(fresh, SCHEMA_SQL)
    assert query(first_layout, "SELECT * FROM schema_meta ORDER BY key") == query(
        fresh, "SELECT * FROM schema_meta ORDER BY key"
    )
    assert query(first_layout, "PRAGMA integrity_check") == [("ok",)]
    with Ledger(first_layout) as again:  # a second open finds nothing to do
        assert again.doctor()["healthy"] is True
    assert rows(first_layout) == before


def test_an_upgraded_file_keeps_its_tasks_working(first_layout: Path) -> None:
    clock = FrozenClock(1_800_000_000.0)
    with Ledger(first_layout, clock=clock) as ledger:
        queued = {t.id for t in ledger.list_tasks(status="queued", limit=100)}
        assert len(queued) == 3
        claimed = ledger.claim_next("w9", limit=10)
        assert {t.id for t in claimed} == queued
        for task in claimed:
            assert ledger.charge(task.id, tokens=10, worker="w9").allowed
            ledger.close_task(task.id, "succeeded", worker="w9")
        # The budget-escalated task still refuses charges, and the blocked
        # task still waits for input.
        statuses = {t.status for t in ledger.list_tasks(limit=100)}
        assert TaskStatus.ESCALATED in statuses and TaskStatus.BLOCKED in statuses
        assert ledger.doctor()["healthy"] is True
    # The new CHECKs hold for a writer that skips the API, too.
    with (
        contextlib.closing(sqlite3.connect(first_layout)) as conn,
        pytest.raises(sqlite3.IntegrityError, match="CHECK"),
    ):
        conn.execute("UPDATE tasks SET status = 'bogus'")


def test_a_connection_open_across_the_upgrade_reads_the_new_schema(first_layout: Path) -> None:
    """The upgrade bumps the schema cookie, so a connection that read the
    old CHECKs before it reloads them (here: another SQLite user)."""
    with contextlib.closing(sqlite3.connect(first_layout)) as other:
        assert other.execute("SELECT count(*) FROM tasks").fetchone() == (10,)
        with Ledger(first_layout):
            pass
        with pytest.raises(sqlite3.IntegrityError, match="status = 'queued' OR"):
            other.execute("UPDATE tasks SET status = 'bogus'")


FIRST_OPEN = Path(__file__).parent / "reliability" / "_first_open.py"


def test_processes_opening_a_first_layout_file_at_once_upgrade_it_once(
    tmp_path: Path, fresh: Path
) -> None:
    """Four fresh processes open each of three first-layout files at the same
    moments, each creating a task: every open succeeds, the file ends in the
    current layout with every task, and doctor is healthy."""
    directory = tmp_path / "race"
    directory.mkdir(mode=0o700)
    paths = []
    for i in range(3):
        path = directory / f"first-{i}.db"
        shutil.copyfile(FIXTURE, path)
        path.chmod(0o600)
        paths.append(path)
    start = time.time() + 1.0  # after every interpreter has started
    targets = [arg for i, p in enumerate(paths) for arg in (str(p), repr(start + 0.5 * i))]
    procs = [
        subprocess.Popen(
            [sys.executable, str(FIRST_OPEN), "10000", "0.002", str(k), *targets],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for k in range(4)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, outputs[0][1][-2000:]
    results = [json.loads(line) for out, _ in outputs for line in out.decode().splitlines()]
    assert [r["outcome"] for r in results] == ["ok"] * 12
    for path in paths:
        assert query(path, SCHEMA_SQL) == query(fresh, SCHEMA_SQL)
        with Ledger(path) as ledger:
            assert ledger.stats()["task_count"] == 10 + 4
            assert ledger.doctor()["healthy"] is True


def test_read_only_open_reads_a_first_layout_file_without_touching_it(first_layout: Path) -> None:
    def state() -> tuple[bytes, int, list[str]]:
        return (
            first_layout.read_bytes(),
            first_layout.stat().st_mtime_ns,
            sorted(os.listdir(first_layout.parent)),
        )

    before = state()
    with Ledger(first_layout, read_only=True) as ledger:
        assert len(ledger.list_tasks(limit=100)) == 10
        assert ledger.doctor()["healthy"] is True
        report = ledger.reconcile(active_grace_seconds=60, delivery_grace_seconds=60, dry_run=True)
        assert report["dry_run"] is True
    assert state() == before
