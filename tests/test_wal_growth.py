"""The WAL starts over once it has grown past 64 MiB, even while reads
overlap: reads wait for it (and, on a writable handle, start it over
themselves when nothing pins it) instead of pinning it forever. A WAL that
keeps growing fills the disk."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskwarden import Ledger

from .conftest import held_open, run_python

WAL_SIZE_LIMIT = 64 * 1024 * 1024

#: Another library's read in another process (SQLite's locks are the
#: process's: one in this process would pin nothing), started once the WAL
#: holds a commit, so that it reads from the WAL and pins it.
PIN = """
import sqlite3, sys
pin = sqlite3.connect(sys.argv[1], isolation_level=None)
pin.execute("BEGIN")
pin.execute("SELECT count(*) FROM tasks").fetchone()
print("ready", flush=True)
sys.stdin.read()
pin.execute("COMMIT")
"""


def _wal_bytes(db_path: Path) -> int:
    return Path(f"{db_path}-wal").stat().st_size


def _grow_wal_past_the_limit(ledger: Ledger, db_path: Path) -> list[str]:
    ids = []
    while _wal_bytes(db_path) <= WAL_SIZE_LIMIT:
        ids.extend(ledger.create_task().id for _ in range(500))
    return ids


@contextlib.contextmanager
def writes_going_on(db_path: Path, every: float = 0.002) -> Iterator[None]:
    """A writer creating a task every ``every`` seconds (2 ms) for the length
    of the block: a wait for the WAL lasts only while someone writes.
    (Paced: beside a pin the WAL keeps every frame, and a writer going flat
    out fills gigabytes of disk in seconds.)"""
    done = threading.Event()

    def write() -> None:
        with Ledger(db_path, busy_timeout_ms=30_000) as ledger:
            while not done.wait(every):
                ledger.create_task()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        yield
    finally:
        done.set()
        writer.join()


def test_a_read_starts_an_oversized_wal_over_once_nothing_pins_it(db_path: Path) -> None:
    """No write comes after the growth: without the read's own checkpoint
    the WAL would stay at its size until the next write."""
    with Ledger(db_path) as writer, Ledger(db_path) as reader:
        ids = [writer.create_task().id]
        with held_open(PIN, str(db_path)):
            ids += _grow_wal_past_the_limit(writer, db_path)
        assert _wal_bytes(db_path) > WAL_SIZE_LIMIT
        assert reader.get_task(ids[-1]).id == ids[-1]
        assert _wal_bytes(db_path) <= WAL_SIZE_LIMIT
        assert reader.stats()["task_count"] == len(ids)
        assert reader.doctor()["healthy"] is True


@pytest.mark.parametrize("read_only", [False, True])
def test_a_read_beside_a_pin_that_nobody_writes_past_answers_at_once(
    db_path: Path, read_only: bool
) -> None:
    """Another library's read that never ends, and no write: the WAL does
    not grow, so a read waits only a moment (it waited a whole second), and
    the handle's next reads do not wait again."""
    with Ledger(db_path) as writer:
        ids = [writer.create_task().id]
        with held_open(PIN, str(db_path)):
            ids += _grow_wal_past_the_limit(writer, db_path)
            with Ledger(db_path, read_only=read_only) as reader:
                started = time.monotonic()
                assert reader.stats()["task_count"] == len(ids)
                assert time.monotonic() - started < 0.6
                started = time.monotonic()
                for task_id in ids[:50]:
                    assert reader.get_task(task_id).id == task_id
                assert time.monotonic() - started < 0.5  # no second wait each
            assert _wal_bytes(db_path) > WAL_SIZE_LIMIT  # pinned: it could not start over


def test_a_read_beside_a_reader_that_keeps_pinning_the_wal_still_answers(
    db_path: Path,
) -> None:
    """Another library's read that never ends while a writer goes on: the
    read waits a while, answers from the latest commit, and the handle's
    next reads do not wait again."""
    with Ledger(db_path) as writer, Ledger(db_path) as reader:
        ids = [writer.create_task().id]
        with held_open(PIN, str(db_path)):
            ids += _grow_wal_past_the_limit(writer, db_path)
            with writes_going_on(db_path):
                started = time.monotonic()
                assert reader.stats()["task_count"] >= len(ids)
                assert time.monotonic() - started >= 0.5  # it waited for the WAL
                started = time.monotonic()
                for task_id in ids[:50]:
                    assert reader.get_task(task_id).id == task_id
                assert time.monotonic() - started < 1.0  # no second wait of a second each
            assert _wal_bytes(db_path) > WAL_SIZE_LIMIT  # pinned: it could not start over


#: A process that repeats ``{step}`` on a ledger until its standard input
#: closes.
UNTIL_STDIN_CLOSES = """
import sys, threading
from taskwarden import Ledger
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
with Ledger(sys.argv[1], busy_timeout_ms=30_000) as ledger:
    print("ready", flush=True)
    while not done.is_set():
{step}
"""

#: A worker of the README's loop.
WORKER = UNTIL_STDIN_CLOSES.format(
    step="""
        ledger.create_task()
        for task in ledger.claim_next(sys.argv[2]):
            ledger.charge(task.id, worker=sys.argv[2], tokens=100)
            ledger.close_task(task.id, "succeeded", worker=sys.argv[2])"""
)

#: A supervisor polling with no pause between polls.
SUPERVISOR = UNTIL_STDIN_CLOSES.format(
    step="""
        ledger.list_tasks(limit=200)
        ledger.stats()"""
)


#: The same supervisor through read-only handles (a live file: SQLite's
#: read-only WAL mode).
READ_ONLY_SUPERVISOR = SUPERVISOR.replace("busy_timeout_ms=30_000", "read_only=True")


@pytest.mark.parametrize(
    "supervisor", [SUPERVISOR, READ_ONLY_SUPERVISOR], ids=["writable", "read_only"]
)
def test_the_wal_starts_over_while_supervisors_poll_without_pause(
    db_path: Path, supervisor: str
) -> None:
    """Three supervisors whose reads always overlap, beside two workers:
    the WAL once grew by everything the workers wrote for as long as the
    polling went on (3.3 GiB in 30 s; read-only supervisors, which may not
    checkpoint, 2.3 GiB even with 100 ms between polls). It must come back
    to its limit while they poll."""
    Ledger(db_path).close()
    with contextlib.ExitStack() as running:
        for worker in ("w1", "w2"):
            running.enter_context(held_open(WORKER, str(db_path), worker))
        for _ in range(3):
            running.enter_context(held_open(supervisor, str(db_path)))
        grew_past, started_over = False, False
        deadline = time.monotonic() + 60
        while not started_over and time.monotonic() < deadline:
            size = _wal_bytes(db_path)
            grew_past = grew_past or size > WAL_SIZE_LIMIT
            started_over = grew_past and size <= WAL_SIZE_LIMIT
            time.sleep(0.005)
    assert grew_past, "the workers never wrote 64 MiB in a minute"
    assert started_over
    with Ledger(db_path) as ledger:
        assert ledger.doctor()["healthy"] is True


#: Opens a handle and reads once the WAL is past its limit and pinned while
#: a writer goes on (so a read waits its full second: a read-only handle's
#: first is the open's own), with SIGINT 0.2 s in; prints how long it took
#: and how it ended.
INTERRUPTED_READER = """
import os, signal, sys, threading, time
from taskwarden import Ledger
threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
began = time.monotonic()
try:
    with Ledger(sys.argv[1], read_only=sys.argv[2] == "read_only") as ledger:
        ledger.stats()
    print("answered", time.monotonic() - began)
except KeyboardInterrupt:
    print("interrupted", time.monotonic() - began)
"""


@pytest.mark.parametrize("kind", ["writable", "read_only"])
def test_ctrl_c_ends_the_wait_for_the_wal_at_once(db_path: Path, kind: str) -> None:
    """The wait lasts up to a second; Ctrl-C ends it as it ends a lock
    wait, not when the second is over."""
    with Ledger(db_path) as writer:
        writer.create_task()
        with held_open(PIN, str(db_path)):
            _grow_wal_past_the_limit(writer, db_path)
            with writes_going_on(db_path):
                answer = run_python(INTERRUPTED_READER, str(db_path), kind)
    how, took = answer[0].split()
    assert how == "interrupted"
    assert float(took) < 0.7, took


def test_a_handle_that_may_not_wait_reads_at_once(db_path: Path) -> None:
    """``busy_timeout_ms=0``: the read does not wait for the WAL either,
    not even while a writer goes on (when a wait lasts its second)."""
    with Ledger(db_path) as writer, Ledger(db_path, busy_timeout_ms=0) as reader:
        ids = [writer.create_task().id]
        with held_open(PIN, str(db_path)):
            ids += _grow_wal_past_the_limit(writer, db_path)
            with writes_going_on(db_path):
                started = time.monotonic()
                assert reader.get_task(ids[-1]).id == ids[-1]
                assert time.monotonic() - started < 0.5


def test_a_write_on_the_same_handle_does_not_time_out_behind_the_wait(
    db_path: Path,
) -> None:
    """Calls on one handle queue behind a read's wait for the WAL: it lasts
    at most half the handle's busy timeout, so a write that comes during
    it is not refused for a wait it did not make."""
    with Ledger(db_path) as writer, Ledger(db_path, busy_timeout_ms=400) as shared:
        writer.create_task()
        with held_open(PIN, str(db_path)), writes_going_on(db_path):
            _grow_wal_past_the_limit(writer, db_path)
            reading = threading.Thread(target=shared.stats)
            reading.start()
            time.sleep(0.05)
            created = shared.create_task()  # LedgerBusy if it waited 1 s
            reading.join()
        assert shared.get_task(created.id).status == "queued"


def test_a_handle_waits_again_once_the_pin_is_gone(db_path: Path) -> None:
    """A handle that stopped waiting for a pinned WAL looks now and then
    whether the pin is gone: once it is, its next read starts the WAL over
    (it used to read on without waiting for 5 s, while the WAL grew by up
    to 1 GiB beside busy workers)."""
    with Ledger(db_path) as writer, Ledger(db_path) as reader:
        ids = [writer.create_task().id]
        with held_open(PIN, str(db_path)):
            ids += _grow_wal_past_the_limit(writer, db_path)
            assert reader.stats()["task_count"] == len(ids)  # waits, then stops waiting
        time.sleep(0.3)
        assert reader.get_task(ids[0]).id == ids[0]
        assert _wal_bytes(db_path) <= WAL_SIZE_LIMIT


def test_a_handle_that_stopped_waiting_for_a_pin_waits_again_later(db_path: Path) -> None:
    """While another library's read pins the WAL and a writer goes on, a
    handle stops waiting for a while (5 s), then waits once more: the pin
    it saw may have been no pin at all."""
    with Ledger(db_path) as writer, Ledger(db_path) as reader:
        writer.create_task()
        with held_open(PIN, str(db_path)):
            _grow_wal_past_the_limit(writer, db_path)
            with writes_going_on(db_path):
                reader.stats()  # waits its second, then stops waiting
                started = time.monotonic()
                reader.stats()
                assert time.monotonic() - started < 0.5
                time.sleep(5.2)
                started = time.monotonic()
                reader.stats()
                assert time.monotonic() - started >= 0.5


#: In one process, a writable handle and then a read-only one on a live
#: file whose WAL is past its limit and pinned (so the read-only handle's
#: reads look into the ``-shm``); prints how many POSIX locks the process
#: still holds on the ``-shm`` afterwards (SQLite's own, for its writer).
SHM_LOCKS = """
import os, sys
from taskwarden import Ledger
shm = os.stat(sys.argv[1] + "-shm")
with Ledger(sys.argv[1]) as writer, Ledger(sys.argv[1], read_only=True) as reader:
    for _ in range(3):
        reader.stats()
    with open("/proc/locks") as table:
        fields = [line.split() for line in table if "->" not in line]
    print(sum(f[4] == str(os.getpid()) and f[5].endswith(f":{shm.st_ino}") for f in fields))
"""


def test_looking_into_the_shm_keeps_sqlites_locks(db_path: Path) -> None:
    """POSIX locks belong to the process: closing any descriptor of the
    ``-shm`` drops SQLite's locks there, a writer's too. A read-only handle
    that opened and closed it for each look let another process commit
    inside a writer's transaction, and corrupted the file in a review."""
    with Ledger(db_path) as writer:
        writer.create_task()
        with held_open(PIN, str(db_path)):
            _grow_wal_past_the_limit(writer, db_path)
            held = run_python(SHM_LOCKS, str(db_path))
    assert int(held[0]) >= 1


@pytest.mark.parametrize("read_only", [False, True])
def test_a_slow_writer_beside_a_pin_does_not_make_every_read_wait(
    db_path: Path, read_only: bool
) -> None:
    """Another library's read pins the WAL while a writer commits every
    0.4 s: the WAL stands still between commits, and each commit used to
    make the next read wait a quarter of a second again (13 of 20 s spent
    waiting). Reads now stop waiting as for any pin."""
    with Ledger(db_path) as writer:
        writer.create_task()
        with held_open(PIN, str(db_path)):
            _grow_wal_past_the_limit(writer, db_path)
            with (
                writes_going_on(db_path, every=0.4),
                Ledger(db_path, read_only=read_only) as reader,
            ):
                waited, until = 0.0, time.monotonic() + 3.0
                while time.monotonic() < until:
                    started = time.monotonic()
                    reader.stats()
                    waited += time.monotonic() - started
                    time.sleep(0.02)
    assert waited < 1.0, waited


@pytest.mark.parametrize("read_only", [False, True])
def test_a_short_busy_timeout_waits_once_for_a_pin(db_path: Path, read_only: bool) -> None:
    """``busy_timeout_ms=10`` leaves a wait of 5 ms: it must still see the
    pin, or every read waits its 5 ms for good."""
    with Ledger(db_path) as writer:
        ids = [writer.create_task().id]
        with held_open(PIN, str(db_path)):
            ids += _grow_wal_past_the_limit(writer, db_path)
            with (
                writes_going_on(db_path),
                Ledger(db_path, read_only=read_only, busy_timeout_ms=10) as reader,
            ):
                started = time.monotonic()
                for task_id in ids[:300]:
                    assert reader.get_task(task_id).id == task_id
                assert time.monotonic() - started < 0.5


def test_a_read_only_open_on_an_idle_oversized_wal_hardly_waits(db_path: Path) -> None:
    """Nothing pins the WAL and nobody writes: a read-only handle, which
    cannot start the WAL over itself, waits only long enough to see that
    no commit comes (each open paid 250 ms)."""
    with Ledger(db_path) as writer:
        ids = [writer.create_task().id]
        with held_open(PIN, str(db_path)):
            ids += _grow_wal_past_the_limit(writer, db_path)
        ids.append(writer.create_task().id)  # its checkpoint copies the WAL back whole
        assert _wal_bytes(db_path) > WAL_SIZE_LIMIT
        for _ in range(3):
            started = time.monotonic()
            with Ledger(db_path, read_only=True) as reader:
                assert reader.stats()["task_count"] == len(ids)
            assert time.monotonic() - started < 0.2
