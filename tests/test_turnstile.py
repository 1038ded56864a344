"""Writers that share a file take turns for the write lock (an exclusive
``flock`` on each handle's own descriptor of the WAL) instead of polling
SQLite for it: a lone writer takes none, a bulk rewrite takes none, a wait
for a turn ends at ``busy_timeout_ms`` with ``LedgerBusy``, and Ctrl-C
ends it at once.

Another writer in the middle of its turn is played here by another process
holding both the WAL's ``flock`` (on a descriptor of its own, as a writer's
is) and SQLite's write lock. A turn held by no writer (the ``flock`` alone)
holds writers up only briefly."""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskwarden import Ledger
from taskwarden.errors import LedgerBusy

from .conftest import held_open

# Holds SQLite's write lock with plain sqlite3 for a moment, in its own
# process: the ledger's next write meets a busy lock and starts taking turns.
# The moment is well inside the shortest busy timeout used here (300 ms).
BRIEF_LOCK = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(0.1)
conn.execute("ROLLBACK")
conn.close()
"""

# Another writer in the middle of its turn, in its own process: the WAL's
# flock on a descriptor of its own, then SQLite's write lock, until told.
LIVE_TURN = r"""
import fcntl, sqlite3, sys
wal = open(sys.argv[1] + "-wal", "rb")
fcntl.flock(wal, fcntl.LOCK_EX)
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN IMMEDIATE")
print("ready", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
conn.close()
fcntl.flock(wal, fcntl.LOCK_UN)
"""

TURN_WAIT_INTERRUPTED = r"""
import os, signal, sys, threading, time
from taskwarden import Ledger
sys.path.insert(0, sys.argv[2])
from tests.test_turnstile import contend, live_turn
ledger = Ledger(sys.argv[1], busy_timeout_ms=60_000)
contend(ledger, sys.argv[1])
with live_turn(sys.argv[1]):
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    try:
        ledger.create_task()
        print("created")
    except KeyboardInterrupt:
        print("interrupted after", time.monotonic() - started)
"""


def contend(ledger: Ledger, path: str) -> None:
    """Makes ``ledger`` meet another writer: its next writes take turns.
    Leaves exactly one task behind."""
    with subprocess.Popen(
        [sys.executable, "-c", BRIEF_LOCK, path], stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        try:
            ledger.create_task()  # waits in the busy handler until the rollback
            created = True
        except LedgerBusy:
            # A loaded machine kept the holder past the busy timeout: the
            # write met the lock all the same, which is all this is for.
            created = False
        assert holder.wait(timeout=60) == 0
    if not created:
        ledger.create_task()


def live_turn(path: Path | str) -> contextlib.AbstractContextManager[None]:
    """Another writer in the middle of its turn (see ``LIVE_TURN``)."""
    return held_open(LIVE_TURN, str(path))


@contextlib.contextmanager
def turn_held(path: Path) -> Iterator[None]:
    """A turn held by no writer: the WAL's ``flock`` alone, on a descriptor
    of its own (a dead writer's, kept open by a forked child, say)."""
    with open(f"{path}-wal", "rb") as wal:
        fcntl.flock(wal, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(wal, fcntl.LOCK_UN)


def timed_in_thread(call, seconds: float) -> tuple[bool, float]:
    """Runs ``call`` in a thread: whether it finished within ``seconds``,
    and how long it took (or had taken by then)."""
    done = threading.Event()
    started = time.monotonic()

    def run() -> None:
        call()
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    finished = done.wait(seconds)
    return finished, time.monotonic() - started


def test_a_writer_that_met_others_waits_for_its_turn(db_path: Path) -> None:
    with Ledger(db_path, busy_timeout_ms=60_000) as ledger, Ledger(db_path) as reader:
        contend(ledger, str(db_path))
        with live_turn(db_path):
            finished, _ = timed_in_thread(ledger.create_task, 0.5)
            assert not finished, "wrote while another writer had its turn"
            assert reader.stats()["task_count"] == 1  # contend()'s task alone
        # The turn is free: the waiting write goes through.
        deadline = time.monotonic() + 30
        while reader.stats()["task_count"] == 1:
            assert time.monotonic() < deadline, "the write never went through"
            time.sleep(0.01)
        assert reader.stats()["task_count"] == 2


def test_a_wait_for_a_turn_ends_at_the_busy_timeout(db_path: Path) -> None:
    """A turn held for ever (its writer stopped mid-write, say) costs a
    waiter its busy timeout and a LedgerBusy, as SQLite's own lock does;
    nothing is written, and the handle works once the turn is free."""
    with Ledger(db_path, busy_timeout_ms=300) as ledger:
        contend(ledger, str(db_path))
        with live_turn(db_path):
            for _ in range(2):  # the second wait reuses the first's thread
                started = time.monotonic()
                with pytest.raises(LedgerBusy):
                    ledger.create_task()
                waited = time.monotonic() - started
                assert 0.25 <= waited < 5.0, waited
            assert ledger.stats()["task_count"] == 1  # contend()'s task alone
        assert ledger.create_task().status == "queued"
        assert ledger.stats()["task_count"] == 2


# A writer whose turn ends (at 0.7 s) while SQLite's lock stays taken, as
# when another program takes the lock the moment the turn's holder commits.
TURN_THEN_LOCK = r"""
import fcntl, sqlite3, sys, time
wal = open(sys.argv[1] + "-wal", "rb")
fcntl.flock(wal, fcntl.LOCK_EX)
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN IMMEDIATE")
print("ready", flush=True)
time.sleep(0.7)
fcntl.flock(wal, fcntl.LOCK_UN)
sys.stdin.read()
conn.execute("ROLLBACK")
conn.close()
"""


def test_a_wait_for_the_turn_and_then_the_lock_shares_one_timeout(db_path: Path) -> None:
    """A write that waited for its turn and then meets SQLite's lock taken
    waits one busy timeout in all (1 s here), not one for each (1.7 s)."""
    with Ledger(db_path, busy_timeout_ms=1000) as ledger:
        contend(ledger, str(db_path))
        with held_open(TURN_THEN_LOCK, str(db_path)):
            started = time.monotonic()
            with pytest.raises(LedgerBusy):
                ledger.create_task()
            waited = time.monotonic() - started
        assert 0.9 <= waited < 1.5, waited
        assert ledger.stats()["task_count"] == 1  # contend()'s task alone


def test_a_turn_held_by_no_writer_holds_writers_up_only_briefly(db_path: Path) -> None:
    """A turn whose holder does not write (SQLite's lock stays free) would
    cost every writer its busy timeout: a writer that waited a moment and
    found SQLite's lock free goes on without it, and later writes of the
    handle take no turn while it lasts."""
    with Ledger(db_path, busy_timeout_ms=1000) as ledger:
        contend(ledger, str(db_path))
        with turn_held(db_path):
            for _ in range(20):
                ledger.create_task()
        assert ledger.stats()["task_count"] == 21


def test_a_lone_writer_takes_no_turn(db_path: Path) -> None:
    """A handle that never met another writer makes no extra call: a held
    turn does not hold it up."""
    with Ledger(db_path) as ledger, turn_held(db_path):
        finished, took = timed_in_thread(ledger.create_task, 30)
        assert finished, f"a lone writer waited for a turn ({took:.1f} s)"


def test_a_bulk_rewrite_takes_no_turn(db_path: Path) -> None:
    """reconcile may hold the lock for seconds: it waits for SQLite's lock in
    the busy handler (with its timeout), never in the turnstile's queue."""
    with Ledger(db_path, busy_timeout_ms=60_000) as ledger:
        contend(ledger, str(db_path))
        with turn_held(db_path):
            finished, took = timed_in_thread(
                lambda: ledger.reconcile(active_grace_seconds=600, delivery_grace_seconds=600),
                30,
            )
            assert finished, f"reconcile waited for a turn ({took:.1f} s)"


def test_ctrl_c_ends_a_wait_for_the_turn(db_path: Path) -> None:
    Ledger(db_path).close()
    out = subprocess.run(
        [sys.executable, "-c", TURN_WAIT_INTERRUPTED, str(db_path), str(Path(__file__).parents[1])],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    word, _, waited = out.strip().rpartition(" ")
    assert word == "interrupted after", out
    assert float(waited) < 5.0
    with Ledger(db_path) as ledger:
        assert ledger.stats()["task_count"] == 1  # contend()'s task; nothing else
