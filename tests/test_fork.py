"""A ledger handle belongs to the process that opened it. A forked child
inherits the parent's connections but not its locks: its inherited handles
are refused and closed without touching the file, and the ledgers it opens
itself take real locks. Each scenario runs in a fresh interpreter, with
real forks, and is judged by a third process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from taskwarden import Ledger

from .conftest import run_python

# Both scenarios start alike: a parent opens the ledger (`path`, the first
# argument), writes once, makes a pipe each way and forks.
_FORK_WITH_A_LEDGER = """
import os, sys
from taskwarden import Ledger
path = sys.argv[1]
ledger = Ledger(path)
ledger.create_task()
to_parent, from_child = os.pipe()
to_child, from_parent = os.pipe()
pid = os.fork()
"""

# The parent opens the ledger and forks. The child uses its inherited
# handle (which opens the child's own connection), closes it, then waits
# while the parent closes the ledger and an outsider acknowledges 20
# creates and crashes, leaving them in the WAL only. Then the child exits
# the ordinary way (finalizers run), which must neither checkpoint the
# parent's stale connection nor unlink that WAL.
_INHERITED = (
    _FORK_WITH_A_LEDGER
    + """
import subprocess
CRASHING_WRITER = (
    "import os, sys; from taskwarden import Ledger; ledger = Ledger(sys.argv[1]); "
    "print(' '.join(ledger.create_task().id for _ in range(20)), flush=True); os._exit(0)"
)
if pid == 0:
    listed = len(ledger.list_tasks(limit=10))
    made = ledger.create_task().id
    ledger.close()
    os.write(from_child, f"{listed} {made}\\n".encode())
    os.read(to_child, 1)
    sys.exit(0)
child_said = os.read(to_parent, 100).decode().split()
ledger.close()
crashed = subprocess.run(
    [sys.executable, "-c", CRASHING_WRITER, path], capture_output=True, text=True, check=True
)
wal_after_crash = os.path.exists(path + "-wal")
os.write(from_parent, b"x")
_, status = os.waitpid(pid, 0)
print(" ".join(child_said), wal_after_crash, os.path.exists(path + "-wal"), status)
print(crashed.stdout.strip())
"""
)

# A forked child opens its own ledger and pauses inside a create (in its
# clock) while the parent closes the ledger it opened before the fork. A
# child whose connection took no real lock would let that close unlink
# the WAL under its write.
_OWN_LEDGER = (
    _FORK_WITH_A_LEDGER
    + """
import time
if pid == 0:
    paused = []
    def clock():
        if not paused:
            paused.append(1)
            os.write(from_child, b"in the write\\n")
            os.read(to_child, 1)  # the parent closes its ledger now
        return time.time()
    own = Ledger(path, clock=clock)
    task = own.create_task()
    os.write(from_child, (task.id + "\\n").encode())
    own.close()
    os._exit(0)
os.read(to_parent, 100)
ledger.close()
os.write(from_parent, b"x")
acknowledged = os.read(to_parent, 100).decode().strip()
os.waitpid(pid, 0)
print(acknowledged)
"""
)


def _private(tmp_path: Path) -> Path:
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    return folder / "ledger.db"


@pytest.mark.skipif(sys.platform != "linux", reason="fork semantics tested on Linux")
def test_a_forked_child_s_inherited_ledger_opens_its_own_connection(
    tmp_path: Path,
) -> None:
    """A program written for task-state-guard hands a module-level ledger to
    forked workers: in the child, the inherited handle serves calls through
    a connection of the child's own (with real locks); the parent's is
    never used or closed there, so the file is left alone."""
    path = _private(tmp_path)
    report, crashed_ids, *_ = run_python(_INHERITED, str(path))
    listed, made, wal_after_crash, wal_after_child, status = report.split()
    assert listed == "1"  # the parent's task, read in the child
    assert (wal_after_crash, wal_after_child, status) == ("True", "True", "0")
    with Ledger(path) as ledger:
        ids = crashed_ids.split()
        assert len(ids) == 20
        assert [ledger.get_task(i).id for i in ids] == ids
        assert ledger.get_task(made).status == "queued"
        assert ledger.stats()["task_count"] == 22
        assert ledger.doctor()["healthy"] is True


@pytest.mark.skipif(sys.platform != "linux", reason="fork semantics tested on Linux")
def test_a_forked_child_s_own_ledger_keeps_its_write_when_the_parent_closes(
    tmp_path: Path,
) -> None:
    path = _private(tmp_path)
    acknowledged = run_python(_OWN_LEDGER, str(path))[0]
    with Ledger(path) as ledger:
        assert ledger.get_task(acknowledged).id == acknowledged
        assert ledger.doctor()["healthy"] is True


# An in-memory ledger has no file and no locks: a forked child goes on with
# its own copy.
_IN_MEMORY = """
import os
from taskwarden import Ledger
ledger = Ledger.in_memory()
first = ledger.create_task().id
pid = os.fork()
if pid == 0:
    ledger.create_task()
    os._exit(len(ledger.list_tasks(limit=10)))
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), len(ledger.list_tasks(limit=10)))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="fork semantics tested on Linux")
def test_a_forked_child_goes_on_with_its_copy_of_an_in_memory_ledger(tmp_path: Path) -> None:
    child_saw, parent_sees = run_python(_IN_MEMORY)[0].split()
    assert (child_saw, parent_sees) == ("2", "1")


# A writer hands its WAL to a helper thread that syncs it ahead of the
# checkpoint. The helper is stopped before every os.fork(), so the fork
# copies a process without it (Python 3.12+ warns about forking a
# multi-threaded process: the DeprecationWarning is made an error here),
# and the next write, in either process, starts a new one.
_HELPER_AROUND_FORK = """
import os, sys, time, warnings
from taskwarden import Ledger

def helper_threads():
    names = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as comm:
            names.append(comm.read().strip())
    return sum(name.startswith("taskwarden-wal") for name in names)

def wait_for_helper():
    deadline = time.monotonic() + 10
    while helper_threads() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return helper_threads()

ledger = Ledger(sys.argv[1])
ledger.create_task()
print("after a write", wait_for_helper())
with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    pid = os.fork()
if pid == 0:
    child = Ledger(sys.argv[1] + "-child.db")
    child.create_task()
    os._exit(0 if wait_for_helper() == 1 else 1)
print("at the fork", helper_threads())
_, status = os.waitpid(pid, 0)
print("child's own helper", "yes" if os.waitstatus_to_exitcode(status) == 0 else "no")
time.sleep(0.06)
ledger.create_task()
print("after the next write", wait_for_helper())
ledger.close()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_wal_helper_is_stopped_before_a_fork_and_restarted_after(tmp_path: Path) -> None:
    out = run_python(_HELPER_AROUND_FORK, str(tmp_path / "ledger.db"))
    assert out[:4] == [
        "after a write 1",
        "at the fork 0",
        "child's own helper yes",
        "after the next write 1",
    ]


# A forked child: one thread makes the inherited ledger's first call (which
# opens the child's own connection) while the main thread closes it.
_CLOSE_DURING_FIRST_CALL = """
import os, sys, threading, time
from taskwarden import Ledger, StateConflict
ledger = Ledger(sys.argv[1])
task = ledger.create_task().id
served_after_close = 0
for _ in range(10):
    pid = os.fork()
    if pid == 0:
        both = threading.Barrier(2)
        def first_call():
            both.wait()
            try:
                ledger.get_task(task)
            except StateConflict:
                pass
        thread = threading.Thread(target=first_call)
        thread.start()
        both.wait()
        time.sleep(0.0003)
        ledger.close()
        thread.join()
        try:
            ledger.get_task(task)
            os._exit(7)
        except StateConflict:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    served_after_close += os.waitstatus_to_exitcode(status) == 7
print(served_after_close)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="fork semantics tested on Linux")
def test_a_child_s_close_during_the_first_call_still_closes(tmp_path: Path) -> None:
    """close() returns a closed ledger even while another thread of the
    child is opening the child's own connection: that connection is closed
    too, never installed behind close()'s back."""
    path = _private(tmp_path)
    assert run_python(_CLOSE_DURING_FIRST_CALL, str(path))[0] == "0"
    with Ledger(path) as ledger:
        assert ledger.doctor()["healthy"] is True


# A forked child's first call opens its own connection and waits there:
# another process holds the file exclusively. A SIGTERM handler run during
# that wait closes the ledger.
_HANDLER_CLOSING_DURING_THE_OPEN = """
import os, signal, subprocess, sys, threading
from taskwarden import Ledger, StateConflict
path = sys.argv[1]
ledger = Ledger(path, busy_timeout_ms=30_000)
ledger.create_task()
ready_r, ready_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(ready_r, 1)
    def on_term(signum, frame):
        try:
            ledger.close()
        except StateConflict:
            os._exit(5)
        os._exit(6)
    signal.signal(signal.SIGTERM, on_term)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    ledger.stats()
    os._exit(7)
ledger.close()
holder = subprocess.Popen(
    [sys.executable, "-c",
     "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
     "c.execute('PRAGMA locking_mode=EXCLUSIVE'); c.execute('BEGIN EXCLUSIVE'); "
     "c.execute('SELECT count(*) FROM sqlite_master').fetchone(); "
     "print('locked', flush=True); sys.stdin.read()", path],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
)
assert holder.stdout.readline() == "locked\\n"
os.write(ready_w, b"x")
_, status = os.waitpid(pid, 0)
holder.stdin.close()
holder.wait()
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="fork semantics tested on Linux")
def test_a_child_s_handler_closing_during_the_first_call_s_open_is_refused(
    tmp_path: Path,
) -> None:
    """The open that a forked child's first call makes runs signal handlers
    while it waits for a lock. A handler that closes the ledger then is a
    StateConflict at once; it used to wait for the open its own thread was
    making, for ever."""
    path = _private(tmp_path)
    assert run_python(_HANDLER_CLOSING_DURING_THE_OPEN, str(path))[0] == "5"
    with Ledger(path) as ledger:
        assert ledger.doctor()["healthy"] is True
