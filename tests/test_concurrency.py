"""Threads and processes sharing one ledger file (SPEC §2.3), lock contention
surfacing as ``LedgerBusy`` (SPEC §2.1 weak spots), and a constructor that
takes no write lock."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import sqlite3
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger
from taskwarden.errors import LedgerBusy, StateConflict

from .conftest import EVENT_TASK_ID, run_cli

SPAWN = multiprocessing.get_context("spawn")
PROCESSES = 4
PROCESS_LIFECYCLES = 150
THREADS = 12
THREAD_LIFECYCLES = 100
EXPECTED_EVENTS = [
    ("created", None, "queued"),
    ("task_transition", "queued", "running"),
    ("task_transition", "running", "succeeded"),
    ("delivery_transition", "pending", "delivered"),
]


def _lifecycle(ledger: Ledger) -> str:
    task = ledger.create_task()
    ledger.start_task(task.id)
    ledger.heartbeat(task.id)
    ledger.close_task(task.id, "succeeded")
    ledger.set_delivery(task.id, "delivered")
    return task.id


def _process_worker(path: str, count: int, barrier: Any, results: Any) -> None:
    """Runs in a spawned process: ``count`` full lifecycles on its own Ledger."""
    try:
        with Ledger(path, busy_timeout_ms=60_000) as ledger:
            barrier.wait(timeout=120)
            ids = [_lifecycle(ledger) for _ in range(count)]
        results.put(("ok", os.getpid(), ids))
    except BaseException as exc:
        results.put(("error", os.getpid(), f"{type(exc).__name__}: {exc}"))


def _hold_write_lock(
    path: str, ready: Any, release: Any, hold_seconds: float, exclusive: bool
) -> None:
    """Runs in a spawned process: hold SQLite's write lock with plain
    sqlite3; ``exclusive`` also shuts readers out (and so a ledger's open)."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        if exclusive:
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")
            conn.execute("BEGIN EXCLUSIVE")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        else:
            conn.execute("BEGIN IMMEDIATE")
        ready.set()
        release.wait(hold_seconds)
        conn.execute("ROLLBACK")


@contextlib.contextmanager
def write_lock_held(
    path: Path, hold_seconds: float = 15.0, *, exclusive: bool = False
) -> Iterator[Any]:
    """Another process holds ``BEGIN IMMEDIATE`` (or an exclusive lock) on
    ``path`` inside this block: from before the block runs until it ends
    (``hold_seconds`` at most)."""
    ready, release = SPAWN.Event(), SPAWN.Event()
    holder = SPAWN.Process(
        target=_hold_write_lock, args=(str(path), ready, release, hold_seconds, exclusive)
    )
    holder.start()
    try:
        assert ready.wait(60), "lock holder did not start"
        yield holder
    finally:
        release.set()
        holder.join(60)
        if holder.is_alive():
            holder.kill()
            holder.join()
    assert holder.exitcode == 0


def event_chains(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    chains: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            f"SELECT {EVENT_TASK_ID} AS task_id, event_kind, from_value, to_value "
            "FROM task_events ORDER BY task_id, sequence"
        )
        for task_id, kind, before, after in rows:
            chains[task_id].append((kind, before, after))
    return dict(chains)


def event_counts(path: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return dict(conn.execute(f"SELECT {EVENT_TASK_ID}, COUNT(*) FROM task_events GROUP BY 1"))


def task_count(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]


def assert_all_closed(path: Path, ids: list[str]) -> None:
    assert len(ids) == len(set(ids))
    with Ledger(path) as ledger:
        for task_id in ids:
            task = ledger.get_task(task_id)
            assert (task.status, task.delivery_status, task.version) == (
                "succeeded",
                "delivered",
                4,
            )
            assert task.attempt_count == 1
    assert task_count(path) == len(ids)
    counts = event_counts(path)
    assert set(counts) == set(ids)
    assert set(counts.values()) == {4}
    chains = event_chains(path)
    assert all(chain == EXPECTED_EVENTS for chain in chains.values())


def test_processes_share_one_file(db_path: Path) -> None:
    with Ledger(db_path):
        pass
    barrier = SPAWN.Barrier(PROCESSES)
    results = SPAWN.Queue()
    workers = [
        SPAWN.Process(
            target=_process_worker, args=(str(db_path), PROCESS_LIFECYCLES, barrier, results)
        )
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    outcomes = []
    try:
        for _ in workers:
            outcomes.append(results.get(timeout=120))
    except queue.Empty:
        pytest.fail("a worker process did not report")
    finally:
        for worker in workers:
            worker.join(60)
            if worker.is_alive():
                worker.kill()
                worker.join()
        results.close()
        results.join_thread()
    errors = [o for o in outcomes if o[0] != "ok"]
    assert errors == []
    assert [w.exitcode for w in workers] == [0] * PROCESSES
    assert len({pid for _, pid, _ in outcomes}) == PROCESSES
    ids = [task_id for _, _, chunk in outcomes for task_id in chunk]
    assert len(ids) == PROCESSES * PROCESS_LIFECYCLES
    assert_all_closed(db_path, ids)


def test_threads_share_one_ledger(db_path: Path) -> None:
    barrier = threading.Barrier(THREADS)

    def work(_: int) -> list[str]:
        barrier.wait(timeout=60)
        return [_lifecycle(ledger) for _ in range(THREAD_LIFECYCLES)]

    with Ledger(db_path) as ledger:
        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            chunks = list(pool.map(work, range(THREADS)))
        ids = [task_id for chunk in chunks for task_id in chunk]
        assert len(ids) == THREADS * THREAD_LIFECYCLES
    assert_all_closed(db_path, ids)


def test_lock_timeout_is_ledger_busy_and_writes_nothing(db_path: Path) -> None:
    with Ledger(db_path, busy_timeout_ms=100) as ledger:
        existing = ledger.create_task()
        with write_lock_held(db_path):
            started = time.monotonic()
            with pytest.raises(LedgerBusy) as caught:
                ledger.create_task()
            waited = time.monotonic() - started
            assert isinstance(caught.value, StateConflict)
            assert not isinstance(caught.value, sqlite3.Error)
            assert 0.05 <= waited < 3.0  # the 100 ms budget, not the lock's lifetime
            with pytest.raises(LedgerBusy):
                ledger.start_task(existing.id)
            # Readers are not blocked by a writer in WAL mode.
            assert ledger.get_task(existing.id) == existing
        assert task_count(db_path) == 1
        created = ledger.create_task()
        assert ledger.get_task(created.id) == created
        task = ledger.start_task(existing.id)
        assert (task.status, task.version) == ("running", 1)
    assert task_count(db_path) == 2


def _finish_while_locked(
    db_path: Path, script: str, *, hold_seconds: float = 15.0
) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` (argv[1]: the ledger) to its end in a fresh
    interpreter while another process holds the lock (``hold_seconds`` at
    most); how it ended."""
    with write_lock_held(db_path, hold_seconds):
        return subprocess.run(
            [sys.executable, "-c", script, str(db_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )


def _script_output(db_path: Path, script: str) -> str:
    """Runs ``script`` (argv[1]: the ledger) in a fresh interpreter; its
    standard output."""
    return subprocess.run(
        [sys.executable, "-c", script, str(db_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


def _run_while_locked(db_path: Path, script: str, *, exclusive: bool = False) -> str:
    """Runs ``script`` while another process holds the lock; its standard
    output."""
    with write_lock_held(db_path, exclusive=exclusive):
        return _script_output(db_path, script)


INTERRUPTED_WAIT = r"""
import os, signal, sys, threading, time
from taskwarden import Ledger
ledger = Ledger(sys.argv[1], busy_timeout_ms=60_000)
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    ledger.create_task()
    print("created")
except KeyboardInterrupt:
    print("interrupted after", time.monotonic() - started)
"""


def test_ctrl_c_ends_a_lock_wait_at_once_and_writes_nothing(db_path: Path) -> None:
    """SIGINT during a 60 s lock wait: the call raises KeyboardInterrupt
    within moments, not when the lock or the timeout ends."""
    Ledger(db_path).close()
    word, _, waited = _run_while_locked(db_path, INTERRUPTED_WAIT).strip().rpartition(" ")
    assert word == "interrupted after", waited
    assert float(waited) < 5.0  # the holder keeps the lock for 15 s
    assert task_count(db_path) == 0


SHORT_INTERRUPTED_WAITS = r"""
import os, signal, subprocess, sys, threading
from taskwarden import Ledger
path = sys.argv[1]
ledger = Ledger(path, busy_timeout_ms=60_000)
# Another process takes the write lock at each line read, for 40 ms:
# freed well before the wait's first look for signals (50 ms in).
HOLDER = '''
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
for _ in sys.stdin:
    conn.execute("BEGIN IMMEDIATE")
    print("held", flush=True)
    time.sleep(0.04)
    conn.execute("ROLLBACK")
'''
holder = subprocess.Popen(
    [sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
)
outcomes = []
for _ in range(10):
    before = ledger.stats()["task_count"]
    holder.stdin.write("go\n")
    holder.stdin.flush()
    assert holder.stdout.readline() == "held\n"
    threading.Timer(0.005, os.kill, (os.getpid(), signal.SIGINT)).start()
    outcome = "returned"
    try:
        try:
            ledger.create_task()
        except KeyboardInterrupt:
            outcome = "interrupted"
        threading.Event().wait(0.1)
    except KeyboardInterrupt:
        outcome += " late"
    written = ledger.stats()["task_count"] - before
    outcomes.append(f"{outcome}, wrote {written}")
holder.stdin.close()
holder.wait()
print(";".join(sorted(set(outcomes))))
"""


def test_ctrl_c_during_a_short_lock_wait_writes_nothing(db_path: Path) -> None:
    """SIGINT 5 ms into a wait for a lock that is free again at 40 ms,
    before the wait's first look for signals: the write went ahead once
    the lock came, and KeyboardInterrupt was raised after it had been
    committed (a retry then wrote twice). A call that waited looks for
    signals before its commit."""
    Ledger(db_path).close()
    out = _script_output(db_path, SHORT_INTERRUPTED_WAITS)
    assert out.strip() == "interrupted, wrote 0", out


REENTERING_HANDLER = r"""
import os, signal, sys, threading, time
from taskwarden import Ledger, StateConflict
ledger = Ledger(sys.argv[1], busy_timeout_ms=60_000)
refused = []
def on_term(signum, frame):
    try:
        ledger.stats()  # the same ledger, whose call holds it while it waits
    except StateConflict:
        refused.append(True)
        raise
signal.signal(signal.SIGTERM, on_term)
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
started = time.monotonic()
try:
    ledger.create_task()
except StateConflict:
    print("refused", refused == [True], time.monotonic() - started)
"""


def test_a_signal_handler_calling_back_into_its_waiting_ledger_is_refused(
    db_path: Path,
) -> None:
    """A signal handler runs during a lock wait while the waiting call holds
    its ledger: calling the same ledger from it is a StateConflict (as from
    a clock), never a wait on itself, and the ledger stays usable."""
    Ledger(db_path).close()
    out = _run_while_locked(db_path, REENTERING_HANDLER)
    word, handler_refused, waited = out.split()
    assert (word, handler_refused) == ("refused", "True"), out
    assert float(waited) < 5.0
    assert task_count(db_path) == 0
    with Ledger(db_path) as ledger:
        assert ledger.create_task().status == "queued"


THREADS_BEHIND_A_LOCK_WAIT = r"""
import sys, threading, time
from taskwarden import Ledger, LedgerBusy
ledger = Ledger(sys.argv[1], busy_timeout_ms=400)
waited = []
def write():
    started = time.monotonic()
    try:
        ledger.create_task()
    except LedgerBusy:
        waited.append(time.monotonic() - started)
threads = [threading.Thread(target=write) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(len(waited), max(waited))
"""


def test_threads_behind_a_call_in_a_lock_wait_wait_one_timeout_each(db_path: Path) -> None:
    """Eight threads write through one handle while another process holds
    the lock: each gets LedgerBusy after its own busy_timeout_ms, waiting
    for the handle and the lock together, not one timeout per thread ahead
    of it (3.2 s for the last of eight at 400 ms)."""
    Ledger(db_path).close()
    count, longest = _run_while_locked(db_path, THREADS_BEHIND_A_LOCK_WAIT).split()
    assert int(count) == 8
    assert float(longest) < 1.6
    assert task_count(db_path) == 0


# Two worker threads on the script's `ledger` that read until `stop` is
# set, each noting in `outcomes` how it ended; FIRST runs before a
# worker's first call.
STOPPABLE_WORKERS = r"""
stop, outcomes = threading.Event(), []
def work():
    FIRST
    try:
        while not stop.is_set():
            ledger.stats()
            time.sleep(0.01)
        outcomes.append("stopped")
    except LedgerBusy:
        outcomes.append("busy")
workers = [threading.Thread(target=work) for _ in range(2)]
for w in workers: w.start()
"""

HANDLER_JOINING_WORKERS = (
    r"""
import os, signal, sys, threading, time
from taskwarden import Ledger, LedgerBusy
ledger = Ledger(sys.argv[1], busy_timeout_ms=1_000)
"""
    + STOPPABLE_WORKERS.replace("FIRST", "pass")
    + r"""
def on_term(signum, frame):  # a graceful shutdown: stop the workers, wait for them
    stop.set()
    for w in workers: w.join()
    raise SystemExit(7 if len(outcomes) == 2 else 3)
signal.signal(signal.SIGTERM, on_term)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
ledger.create_task()  # waits for the lock another process holds
"""
)


def test_a_signal_handler_that_joins_the_handles_threads_ends(db_path: Path) -> None:
    """A shutdown handler runs inside the main thread's lock wait, while its
    call holds the handle, and joins worker threads that use the same
    handle. Their wait for the handle is bounded like a lock wait, so they
    give up with LedgerBusy and the join returns: no hang."""
    Ledger(db_path).close()
    done = _finish_while_locked(db_path, HANDLER_JOINING_WORKERS)
    assert done.returncode == 7, done.stderr


CLOSE_BEHIND_A_LOCK_WAIT = r"""
import os, signal, sys, threading, time
from taskwarden import Ledger, LedgerBusy
ledger = Ledger(sys.argv[1], busy_timeout_ms=60_000)
writer = threading.Thread(target=lambda: ledger.create_task(), daemon=True)
writer.start()
time.sleep(0.3)  # the writer's call now holds the handle in its lock wait
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    ledger.get_task("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9")
except KeyboardInterrupt:
    print("interrupted after", time.monotonic() - started)
"""


def test_ctrl_c_ends_a_wait_for_another_threads_call(db_path: Path) -> None:
    """The main thread waits for the handle that a worker thread's call holds
    through a 60 s lock wait: Ctrl-C ends that wait at once."""
    Ledger(db_path).close()
    word, _, waited = _run_while_locked(db_path, CLOSE_BEHIND_A_LOCK_WAIT).strip().rpartition(" ")
    assert word == "interrupted after", waited
    assert float(waited) < 5.0  # the holder keeps the lock for 15 s
    assert task_count(db_path) == 0


HANDLER_CLOSING_WHILE_QUEUED = r"""
import os, signal, sys, threading, time
from taskwarden import Ledger, StateConflict
ledger = Ledger(sys.argv[1], busy_timeout_ms=60_000)
writer = threading.Thread(target=lambda: ledger.create_task(), daemon=True)
writer.start()
time.sleep(0.3)  # the writer's call now holds the handle in its lock wait
def on_term(signum, frame):
    try:
        ledger.close()
    except StateConflict:
        raise SystemExit(5)
signal.signal(signal.SIGTERM, on_term)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
ledger.stats()  # waits in the handle's line behind the writer
"""


def test_a_signal_handler_closing_a_ledger_its_thread_waits_for_is_refused(
    db_path: Path,
) -> None:
    """The main thread waits in the handle's line behind another thread's
    call; a handler run during that wait that closes the same ledger is a
    StateConflict at once. It used to queue behind its own thread's place
    in the line, and close() waits without a bound: the process hung."""
    Ledger(db_path).close()
    done = _finish_while_locked(db_path, HANDLER_CLOSING_WHILE_QUEUED)
    assert done.returncode == 5, done.stderr


HANDLER_JOINING_WHILE_QUEUED = (
    r"""
import os, signal, sys, threading, time
from taskwarden import Ledger, LedgerBusy
ledger = Ledger(sys.argv[1], busy_timeout_ms=4_000)
writer = threading.Thread(target=lambda: ledger.create_task())
writer.start()
time.sleep(0.2)  # the writer's call holds the handle until the lock is freed
"""
    + STOPPABLE_WORKERS.replace(
        "FIRST", "time.sleep(0.1)  # the main thread's call is in the line first"
    )
    + r"""
def on_term(signum, frame):  # a graceful shutdown: stop the workers, wait for them
    stop.set()
    for w in workers: w.join()
    writer.join()
    raise SystemExit(7 if outcomes == ["stopped", "stopped"] else 3)
signal.signal(signal.SIGTERM, on_term)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
ledger.stats()  # waits in the handle's line, ahead of the workers
"""
)


def test_a_handler_run_while_its_thread_waits_in_line_holds_nobody_back(
    db_path: Path,
) -> None:
    """The main thread waits in the handle's line, ahead of two workers; a
    shutdown handler run during that wait stops and joins them. The main
    thread steps out of the line while the handler runs, so once the lock
    is free the workers' calls go through and they stop cleanly. Its place
    at the front used to hold them back until LedgerBusy."""
    Ledger(db_path).close()
    done = _finish_while_locked(db_path, HANDLER_JOINING_WHILE_QUEUED, hold_seconds=1.0)
    assert done.returncode == 7, done.stderr


INTERRUPTED_OPEN = r"""
import os, signal, sys, threading, time
from taskwarden import Ledger
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    Ledger(sys.argv[1], busy_timeout_ms=60_000)
    print("opened")
except KeyboardInterrupt:
    print("interrupted after", time.monotonic() - started)
"""


def test_ctrl_c_ends_a_wait_to_open_a_ledger(db_path: Path) -> None:
    """Opening waits too when another process shuts readers out; Ctrl-C
    ends that wait as a KeyboardInterrupt, not as LedgerBusy."""
    with Ledger(db_path) as ledger:
        ledger.create_task()
    out = _run_while_locked(db_path, INTERRUPTED_OPEN, exclusive=True)
    word, _, waited = out.strip().rpartition(" ")
    assert word == "interrupted after", out
    assert float(waited) < 5.0


def test_cli_reports_lock_timeout_as_ledger_busy(db_path: Path) -> None:
    with Ledger(db_path):
        pass
    with write_lock_held(db_path):
        code, parsed, stdout = run_cli("--db", str(db_path), "--busy-timeout-ms", "100", "create")
        assert code == 2
        assert parsed == {"error": "LedgerBusy", "ok": False}
        assert stdout.count("\n") == 1
    assert task_count(db_path) == 0
    code, parsed, _ = run_cli("--db", str(db_path), "--busy-timeout-ms", "100", "create")
    assert code == 0
    assert parsed["ok"] is True
    assert task_count(db_path) == 1


def test_constructor_takes_no_write_lock(db_path: Path) -> None:
    with Ledger(db_path) as ledger:
        task = ledger.create_task()
    with write_lock_held(db_path):
        started = time.monotonic()
        with Ledger(db_path, busy_timeout_ms=100) as ledger:
            assert ledger.get_task(task.id) == task
            assert ledger.storage_info()["journal_mode"] == "wal"
        assert time.monotonic() - started < 1.0
        code, parsed, _ = run_cli("--db", str(db_path), "--busy-timeout-ms", "100", "get", task.id)
        assert (code, parsed["task"]["id"]) == (0, task.id)


def test_threads_sharing_a_handle_take_fair_turns(db_path: Path) -> None:
    """Four threads write through one handle, each write holding it about
    10 ms (a slow clock): every thread keeps getting its turn well inside
    the busy timeout. Unfair, a thread that had just finished took the
    handle straight back, and the longest waiters timed out."""

    def slow_clock() -> float:
        time.sleep(0.01)
        return time.time()

    waits: list[float] = []
    busy: list[BaseException] = []
    stop = time.monotonic() + 3.0
    with Ledger(db_path, clock=slow_clock, busy_timeout_ms=1000) as ledger:

        def write() -> None:
            while time.monotonic() < stop:
                started = time.monotonic()
                try:
                    ledger.create_task()
                except LedgerBusy as exc:
                    busy.append(exc)
                waits.append(time.monotonic() - started)

        threads = [threading.Thread(target=write) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert busy == []
    assert max(waits) < 0.5, max(waits)
