"""Shared fixtures: ledger paths, a controllable clock, the CLI runner, a
runner for worker scripts in a fresh interpreter and a logical dump of a
ledger file (to prove that refused calls write nothing)."""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger
from taskwarden.cli import main


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run the long campaigns")


#: The longest one test may take before the run stops with every thread's
#: traceback: a hung test fails the run in minutes instead of eating CI's
#: whole budget. The slowest test takes about 20 s on a 2-core machine; the
#: long campaigns (``--run-slow``, ``TASKWARDEN_LONG=1``) get an hour.
HANG_LIMIT_SECONDS = 600
LONG_HANG_LIMIT_SECONDS = 3_600
LONG_ENV = "TASKWARDEN_LONG"
_hang_limit = HANG_LIMIT_SECONDS
_hang_report_fd = 2


def is_long(config: pytest.Config) -> bool:
    """True for the long campaigns (``--run-slow`` or ``TASKWARDEN_LONG=1``)."""
    return bool(config.getoption("--run-slow")) or os.environ.get(LONG_ENV, "") == "1"


def pytest_configure(config: pytest.Config) -> None:
    global _hang_limit, _hang_report_fd
    # A run started in the background by a shell without job control
    # (``nohup pytest &``) inherits SIGINT ignored, and so does every child
    # it starts: the Ctrl-C tests would then test nothing. Python's own
    # handler here makes the children start with the default again.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _hang_limit = LONG_HANG_LIMIT_SECONDS if is_long(config) else HANG_LIMIT_SECONDS
    # The real stderr, before output capture takes fd 2 for each test.
    _hang_report_fd = os.dup(2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    faulthandler.dump_traceback_later(_hang_limit, exit=True, file=_hang_report_fd)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="long campaign: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


#: The sixteen fields of a task-state-guard 0.1.0 ``Task``, in its order.
PEER_TASK_FIELDS = [
    "id",
    "parent_id",
    "status",
    "delivery_status",
    "delivery_required",
    "payload_hash",
    "timeout_seconds",
    "created_at",
    "started_at",
    "updated_at",
    "ended_at",
    "deadline_at",
    "delivery_updated_at",
    "terminal_code",
    "delivery_code",
    "version",
]


class FrozenClock:
    """A clock that stands still until a test moves it."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def ledger(db_path: Path, clock: FrozenClock) -> Iterator[Ledger]:
    with Ledger(db_path, clock=clock) as opened:
        yield opened


def run_cli(*argv: str) -> tuple[int, Any, str]:
    """Run ``taskwarden argv`` in-process: exit code, parsed JSON (or None), raw stdout."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    text = out.getvalue()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return code, parsed, text


@contextlib.contextmanager
def held_open(script: str, *args: str) -> Iterator[None]:
    """``script`` runs in another process for the length of the block: it
    prints ``ready`` once it holds what it holds (the ledger open, a lock),
    and lets go when its standard input closes."""
    with subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        try:
            assert holder.stdout.readline().strip() == "ready"
            yield
        finally:
            holder.stdin.close()
            assert holder.wait(timeout=60) == 0


def run_python(script: str, *args: str) -> list[str]:
    """Run ``script`` in a fresh interpreter (real processes, real crashes);
    its stdout, line by line. A failing script fails the test."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.split("\n")


# What an event row's task is, by its id: an event names its task by the
# task's number, and that number is where the row lives, not content.
EVENT_TASK_ID = "(SELECT id FROM tasks WHERE tasks.task_no = task_events.task_no)"
# The events of the task whose id is bound as ``?``.
OF_TASK = "task_no = (SELECT task_no FROM tasks WHERE id = ?)"


def logical_columns(conn: sqlite3.Connection, table: str) -> str:
    """A table's columns as content: a task without its number, an event
    with its task's id where it holds the number (an earlier layout's rows
    are already so, which makes the layouts' dumps comparable)."""
    names = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
    if table == "tasks":
        names = [n for n in names if n != "task_no"]
    if table == "task_events":
        # An event whose task is missing keeps its number.
        names = [f"coalesce({EVENT_TASK_ID}, task_no)" if n == "task_no" else n for n in names]
    return ", ".join(names)


# The second layout's fingerprint, and what the third changed in its DDL.
SECOND_LAYOUT_FINGERPRINT = "1609c2b5a35dfe830f0f24024f897dcf721bfeee0fc8c3e4bb032f332e545d52"
# The third layout's: the current one adds an index and orders another.
THIRD_LAYOUT_FINGERPRINT = "ba72042b962ea0b717bb5abcba3bf3c99df2063d549ba9ceba3cd77f4c96c626"
CREATION_ORDER_INDEX = "tasks_created_idx"
THIRD_LAYOUT_CHILDREN_INDEX = (
    "CREATE INDEX tasks_parent_idx ON tasks(parent_id) WHERE parent_id IS NOT NULL"
)
SECOND_LAYOUT_SPELLINGS = [
    ("    task_no INTEGER PRIMARY KEY,\n    id TEXT UNIQUE,\n", "    id TEXT PRIMARY KEY,\n"),
    (
        "task_no INTEGER NOT NULL REFERENCES tasks(task_no)",
        "task_id TEXT NOT NULL REFERENCES tasks(id)",
    ),
    ("ON task_events(task_no)", "ON task_events(task_id)"),
]


def as_third_layout(path: Path) -> None:
    """Rewrites a closed ledger as the third layout wrote it: without the
    index of the tasks in creation order, with the children unordered."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN")
        conn.execute(f"DROP INDEX {CREATION_ORDER_INDEX}")
        conn.execute("DROP INDEX tasks_parent_idx")
        conn.execute(THIRD_LAYOUT_CHILDREN_INDEX)
        conn.execute(
            "UPDATE schema_meta SET value = ? WHERE key = 'schema_fingerprint'",
            (THIRD_LAYOUT_FINGERPRINT,),
        )
        conn.execute("COMMIT")
        conn.execute("VACUUM")


def as_second_layout(path: Path) -> None:
    """Rewrites a closed ledger as the second layout wrote it (tasks
    numbered by rowid, events naming their task by id), with plain SQLite:
    a file of that layout of any content, for tests of how such files are
    read and upgraded. Its DDL is today's respelled, as the fingerprint
    proves."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        ddl = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"))
        for name, sql in ddl.items():
            for new, old in SECOND_LAYOUT_SPELLINGS:
                sql = sql.replace(new, old)
            ddl[name] = sql
        indexes = [
            n
            for (n,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            )
        ]
        conn.execute("BEGIN")
        for name in indexes:
            conn.execute(f"DROP INDEX {name}")
        indexes.remove(CREATION_ORDER_INDEX)  # the current layout's addition
        ddl["tasks_parent_idx"] = THIRD_LAYOUT_CHILDREN_INDEX  # and its reordering
        conn.execute("ALTER TABLE task_events RENAME TO current_events")
        conn.execute("ALTER TABLE tasks RENAME TO current_tasks")
        conn.execute(ddl["tasks"])
        conn.execute(ddl["task_events"])
        columns = [r[1] for r in conn.execute("PRAGMA table_info(tasks)")]
        conn.execute(
            f"INSERT INTO tasks (rowid, {', '.join(columns)}) "
            f"SELECT task_no, {', '.join(columns)} FROM current_tasks ORDER BY task_no"
        )
        columns = [r[1] for r in conn.execute("PRAGMA table_info(task_events)")]
        picked = ["t.id" if c == "task_id" else f"e.{c}" for c in columns]
        conn.execute(
            f"INSERT INTO task_events ({', '.join(columns)}) SELECT {', '.join(picked)} "
            "FROM current_events e JOIN current_tasks t ON t.task_no = e.task_no "
            "ORDER BY e.sequence"
        )
        conn.execute("DROP TABLE current_events")
        conn.execute("DROP TABLE current_tasks")
        for name in indexes:
            conn.execute(ddl[name])
        conn.execute(
            "UPDATE schema_meta SET value = ? WHERE key = 'schema_fingerprint'",
            (SECOND_LAYOUT_FINGERPRINT,),
        )
        conn.execute("COMMIT")
        conn.execute("VACUUM")


def logical_dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, ordered: the ledger's logical content."""
    uri = f"file:{path}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        return {
            t: sorted(conn.execute(f'SELECT {logical_columns(conn, t)} FROM "{t}"'), key=repr)
            for t in tables
        }


def report_outcome(results: Any, index: int, body: Callable[[], Any]) -> None:
    """For worker processes: put ``("ok", index, body())`` on the results
    queue, or ``("error", index, traceback)`` if ``body`` raised."""
    try:
        payload = body()
    except BaseException:
        results.put(("error", index, traceback.format_exc()))
    else:
        results.put(("ok", index, payload))
