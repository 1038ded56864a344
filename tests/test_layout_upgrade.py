"""Files of taskwarden's earlier layouts of schema v3 are rebuilt in the
current layout on their first writable open, losing nothing, and read
through an upgraded private copy by read-only handles and reading commands,
which leave them as they are.

Two files, each written through the public API by the build of its time:

- ``data/first_layout_v3.db``: the first layout (builds up to commit
  9f84333, whose CHECK constraints listed values with ``IN``), ten tasks in
  every status family, with owners, charges, a grant, a block, a budget
  escalation, a delivery and a cancellation;
- ``data/second_layout_v3.db``: the second layout (builds up to commit
  0c69365, whose events named their task by its id), eleven tasks: a tree
  under a budgeted root, tenants, a charge, a budget escalation, a block and
  a grant, a release and a second claim, a cancellation, a delivery, and
  two running tasks timed out by reconcile;
- ``data/third_layout_v3.db``: the third layout (builds up to commit
  9ea011b, which had no index of the tasks in creation order), ten tasks:
  a tree under a budgeted root whose calls ran out (an escalation, then a
  grant), three tenants, a release and a second claim, a success with its
  delivery, a block, a cancellation, a failure, and two running tasks timed
  out by reconcile. Its upgrade only adds the index.
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
from taskwarden.errors import StateConflict

from .conftest import FrozenClock, as_second_layout, as_third_layout, logical_dump, run_cli

DATA = Path(__file__).parent / "data"
# Each file, its fingerprint, and how many of its tasks are queued and in all.
FIXTURES = {
    "first_layout": (
        DATA / "first_layout_v3.db",
        "982ad3385d1ee3cb3bf59c616f18e2eb60bbc49373064357ea19cce3eca06f27",
        3,
        10,
    ),
    "second_layout": (
        DATA / "second_layout_v3.db",
        "1609c2b5a35dfe830f0f24024f897dcf721bfeee0fc8c3e4bb032f332e545d52",
        4,
        11,
    ),
    "third_layout": (
        DATA / "third_layout_v3.db",
        "ba72042b962ea0b717bb5abcba3bf3c99df2063d549ba9ceba3cd77f4c96c626",
        3,
        10,
    ),
}
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


@pytest.fixture(params=list(FIXTURES))
def earlier(request: pytest.FixtureRequest, db_path: Path) -> Path:
    shutil.copyfile(FIXTURES[request.param][0], db_path)
    db_path.chmod(0o600)
    return db_path


def fixture_of(path: Path) -> tuple[Path, str, int, int]:
    """The fixture entry the file was copied from."""
    (entry,) = [f for f in FIXTURES.values() if f[0].read_bytes() == path.read_bytes()]
    return entry


@pytest.fixture
def fresh(tmp_path: Path) -> Path:
    directory = tmp_path / "fresh"
    directory.mkdir(mode=0o700)
    with Ledger(directory / "fresh.db"):
        pass
    return directory / "fresh.db"


def test_the_fixtures_are_of_the_earlier_layouts(earlier: Path, fresh: Path) -> None:
    _, fingerprint, _, tasks = fixture_of(earlier)
    meta = dict(query(earlier, "SELECT key, value FROM schema_meta"))
    assert meta == {"schema_version": "3", "schema_fingerprint": fingerprint}
    assert query(earlier, SCHEMA_SQL) != query(fresh, SCHEMA_SQL)
    assert len(query(earlier, "SELECT id FROM tasks")) == tasks


def test_first_writable_open_rebuilds_a_fresh_schema_keeping_every_row(
    earlier: Path, fresh: Path
) -> None:
    before = rows(earlier)
    numbers = query(earlier, "SELECT rowid, id FROM tasks ORDER BY rowid")
    with Ledger(earlier) as ledger:
        assert ledger.doctor()["healthy"] is True
    assert rows(earlier) == before
    # Each task keeps its rowid as its number, and its events name it.
    assert query(earlier, "SELECT task_no, id FROM tasks ORDER BY task_no") == numbers
    assert query(earlier, SCHEMA_SQL) == query(fresh, SCHEMA_SQL)
    assert query(earlier, "SELECT * FROM schema_meta ORDER BY key") == query(
        fresh, "SELECT * FROM schema_meta ORDER BY key"
    )
    assert query(earlier, "PRAGMA integrity_check") == [("ok",)]
    assert query(earlier, "PRAGMA foreign_key_check") == []
    with Ledger(earlier) as again:  # a second open finds nothing to do
        assert again.doctor()["healthy"] is True
    assert rows(earlier) == before


def test_an_upgraded_file_keeps_its_tasks_working(earlier: Path) -> None:
    _, _, queued_count, _ = fixture_of(earlier)
    clock = FrozenClock(1_900_000_000.0)
    with Ledger(earlier, clock=clock) as ledger:
        queued = {t.id for t in ledger.list_tasks(status="queued", limit=100)}
        assert len(queued) == queued_count
        histories = {t.id: ledger.events(t.id) for t in ledger.list_tasks(limit=100)}
        claimed = ledger.claim_next("w9", limit=10)
        assert {t.id for t in claimed} == queued
        for task in claimed:
            assert ledger.charge(task.id, tokens=10, worker="w9").allowed
            ledger.close_task(task.id, "succeeded", worker="w9")
            # The history read before goes on: three more events.
            assert ledger.events(task.id)[: len(histories[task.id])] == histories[task.id]
            assert len(ledger.events(task.id)) == len(histories[task.id]) + 2
        # The budget-escalated task still refuses charges, and the blocked
        # task still waits for input.
        statuses = {t.status for t in ledger.list_tasks(limit=100)}
        assert TaskStatus.ESCALATED in statuses and TaskStatus.BLOCKED in statuses
        assert ledger.doctor()["healthy"] is True
    # The CHECKs hold for a writer that skips the API, too.
    with (
        contextlib.closing(sqlite3.connect(earlier)) as conn,
        pytest.raises(sqlite3.IntegrityError, match="CHECK"),
    ):
        conn.execute("UPDATE tasks SET status = 'bogus'")


def test_a_connection_open_across_the_upgrade_reads_the_new_schema(earlier: Path) -> None:
    """Another SQLite user that read the earlier tables before reads the new ones
    after (the rebuild changes the schema cookie)."""
    with contextlib.closing(sqlite3.connect(earlier)) as other:
        assert other.execute("SELECT count(*) FROM tasks").fetchone()[0] > 0
        with Ledger(earlier):
            pass
        assert other.execute("SELECT count(*) FROM tasks WHERE task_no > 0").fetchone()[0] > 0
        with pytest.raises(sqlite3.IntegrityError, match="status = 'queued' OR"):
            other.execute("UPDATE tasks SET status = 'bogus'")


FIRST_OPEN = Path(__file__).parent / "reliability" / "_first_open.py"


def test_processes_opening_an_earlier_layout_at_once_upgrade_it_once(
    tmp_path: Path, fresh: Path
) -> None:
    """Four fresh processes open each of six earlier-layout files at once,
    each creating a task: every open succeeds, the file ends in the current
    layout with every task, and doctor is healthy."""
    directory = tmp_path / "race"
    directory.mkdir(mode=0o700)
    paths = []
    for i, (source, _, _, _) in enumerate([*FIXTURES.values()] * 2):
        path = directory / f"earlier-{i}.db"
        shutil.copyfile(source, path)
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
    assert [r["outcome"] for r in results] == ["ok"] * (4 * len(paths))
    for path, (_, _, _, tasks) in zip(paths, [*FIXTURES.values()] * 2, strict=True):
        assert query(path, SCHEMA_SQL) == query(fresh, SCHEMA_SQL)
        with Ledger(path) as ledger:
            assert ledger.stats()["task_count"] == tasks + 4
            assert ledger.doctor()["healthy"] is True


def disk_state(path: Path) -> tuple[bytes, int, list[str]]:
    return path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(path.parent))


def test_read_only_open_reads_an_earlier_layout_without_touching_it(earlier: Path) -> None:
    _, _, _, tasks = fixture_of(earlier)
    before = disk_state(earlier)
    with Ledger(earlier, read_only=True) as ledger:
        assert len(ledger.list_tasks(limit=100)) == tasks
        for task in ledger.list_tasks(limit=100):
            assert ledger.events(task.id)[0].kind == "created"
        doctor = ledger.doctor()
        assert doctor["healthy"] is True and doctor["schema_version"] == 3
        report = ledger.reconcile(active_grace_seconds=60, delivery_grace_seconds=60, dry_run=True)
        assert report["dry_run"] is True
    assert disk_state(earlier) == before


def test_an_open_that_may_not_migrate_refuses_an_earlier_layout(earlier: Path) -> None:
    before = disk_state(earlier)
    with pytest.raises(StateConflict, match="earlier taskwarden layout"):
        Ledger(earlier, migrate=False)
    assert disk_state(earlier) == before


def test_reading_commands_read_an_earlier_layout_as_it_is(earlier: Path, fresh: Path) -> None:
    """`list` and `doctor` never migrate (so an older build can still open the
    file): they read a private copy; a writing command upgrades it."""
    _, _, _, tasks = fixture_of(earlier)
    before = disk_state(earlier)
    code, out, _ = run_cli("--db", str(earlier), "list", "--limit", "100")
    assert code == 0 and len(out["tasks"]) == tasks
    code, out, _ = run_cli("--db", str(earlier), "doctor")
    assert code == 0 and out["healthy"] is True and out["schema_version"] == 3
    assert disk_state(earlier) == before
    code, out, _ = run_cli("--db", str(earlier), "create")
    assert code == 0 and out["task"]["status"] == "queued"
    assert query(earlier, SCHEMA_SQL) == query(fresh, SCHEMA_SQL)


def build_ledger(path: Path, clock: FrozenClock) -> None:
    """Tasks in many states, some stale enough for reconcile."""
    with Ledger(path, clock=clock) as ledger:
        root = ledger.create_task(tenant="acme", token_budget=1_000)
        for i in range(12):
            task = ledger.create_task(parent_id=root.id if i % 3 else None, tenant="acme")
            if i % 4 == 0:
                continue
            ledger.claim(task.id, f"w{i}")
            ledger.charge(task.id, tokens=10, worker=f"w{i}")
            if i % 4 == 2:
                ledger.close_task(task.id, "succeeded", worker=f"w{i}")
        clock.advance(7_200)
        ledger.create_task()


AS_LAYOUT = {"second_layout": as_second_layout, "third_layout": as_third_layout}


@pytest.mark.parametrize("layout", sorted(AS_LAYOUT))
def test_the_helpers_layout_file_has_the_fixtures_schema(
    db_path: Path, tmp_path: Path, layout: str
) -> None:
    build_ledger(db_path, FrozenClock(1_800_000_000.0))
    AS_LAYOUT[layout](db_path)
    # A copy: even a read-only open of a WAL-mode file writes its `-shm`,
    # and the fixture lives in the source tree.
    fixture = shutil.copyfile(FIXTURES[layout][0], tmp_path / "fixture.db")
    assert query(db_path, SCHEMA_SQL) == query(fixture, SCHEMA_SQL)
    with Ledger(db_path, read_only=True) as ledger:
        assert ledger.doctor()["schema_version"] == 3


@pytest.mark.parametrize("layout", sorted(AS_LAYOUT))
def test_an_earlier_layout_reconciles_as_its_current_twin(tmp_path: Path, layout: str) -> None:
    """The same ledger, one copy rewritten in an earlier layout: opened,
    reconciled and worked on alike, the two files end with the same content."""
    directory = tmp_path / "twins"
    directory.mkdir(mode=0o700)
    current, second = directory / "current.db", directory / "earlier.db"
    build_ledger(current, FrozenClock(1_800_000_000.0))
    shutil.copyfile(current, second)
    AS_LAYOUT[layout](second)
    reports = []
    for path in (current, second):
        clock = FrozenClock(1_800_010_000.0)
        with Ledger(path, clock=clock) as ledger:
            reports.append(ledger.reconcile(active_grace_seconds=600, delivery_grace_seconds=60))
            (task,) = ledger.claim_next("w", limit=1)
            ledger.close_task(task.id, "failed", worker="w")
            assert ledger.doctor()["healthy"] is True
    assert reports[0] == reports[1] and reports[0]["tasks_timed_out"] > 0
    assert logical_dump(second) == logical_dump(current)
    numbers = "SELECT task_no, id FROM tasks"
    assert query(second, numbers) == query(current, numbers)


def test_an_earlier_layout_with_metadata_of_its_own_is_refused(db_path: Path) -> None:
    """An extra ``schema_meta`` row makes a current file unknown; so it does a
    second-layout file, which is then refused, not rebuilt (the rebuild
    would drop that row) and left byte for byte as it was."""
    path = db_path
    build_ledger(path, FrozenClock(1_800_000_000.0))
    as_second_layout(path)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("INSERT INTO schema_meta VALUES ('owner_note', 'keep me')")
    before = path.read_bytes(), sorted(os.listdir(path.parent))
    with pytest.raises(StateConflict, match="schema does not match"):
        Ledger(path)
    with pytest.raises(StateConflict, match="schema does not match"):
        Ledger(path, read_only=True)
    assert (path.read_bytes(), sorted(os.listdir(path.parent))) == before
    assert query(path, "SELECT value FROM schema_meta WHERE key = 'owner_note'") == [("keep me",)]
