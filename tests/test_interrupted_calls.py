"""Ctrl-C during a long call stops it, and an interrupted write wrote nothing.

A reconcile, a subtree cancel or doctor on a large file runs for a second
or more. SIGINT during it must end the call with ``KeyboardInterrupt``
within moments and roll its transaction back, never run to the commit and
then report an interruption for a write that was made.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from benches.ledgers import make_peer_ledger
from taskwarden import Ledger

TASKS = 60_000


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A task-state-guard file of ``TASKS`` tasks, every one a child of the
    first: half of them running and silent for an hour (reconcile times
    them out)."""
    where = tmp_path_factory.mktemp("peer")
    where.chmod(0o700)
    path = where / "peer.db"
    make_peer_ledger(path, TASKS)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        root = conn.execute("SELECT id FROM tasks WHERE rowid = 1").fetchone()[0]
        conn.execute("UPDATE tasks SET parent_id = ?1 WHERE rowid > 1", (root,))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path, root


@pytest.fixture(scope="module")
def fan(peer: tuple[Path, str]) -> tuple[Path, str]:
    """The same tasks, migrated."""
    source, root = peer
    path = source.with_name("fan.db")
    shutil.copyfile(source, path)
    path.chmod(0o600)
    Ledger(path).close()
    return path, root


INTERRUPTED = r"""
import os, signal, sys, threading
from taskwarden import Ledger
ledger = Ledger(sys.argv[1], clock=lambda: 1_800_000_000.0)
root = sys.argv[2]
calls = {
    "reconcile": lambda: ledger.reconcile(active_grace_seconds=600, delivery_grace_seconds=600),
    "cancel": lambda: ledger.cancel(root, subtree=True),
    "doctor": lambda: ledger.doctor(),
}
threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGINT)).start()
try:
    calls[sys.argv[3]]()
    print("returned")
except KeyboardInterrupt:
    print("interrupted")
"""


@pytest.mark.parametrize("call", ["reconcile", "cancel", "doctor"])
def test_ctrl_c_during_a_long_call_stops_it_and_writes_nothing(
    fan: tuple[Path, str], tmp_path: Path, call: str
) -> None:
    source, root = fan
    tmp_path.chmod(0o700)
    db = tmp_path / "ledger.db"
    shutil.copyfile(source, db)
    db.chmod(0o600)
    with Ledger(db) as ledger:
        before = ledger.stats()
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED, str(db), root, call],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert done.stdout.split() == ["interrupted"], done.stderr
    with Ledger(db) as ledger:
        assert ledger.stats() == before
        assert ledger.get_task(root).status == "running"
        assert ledger.doctor()["healthy"] is True


def test_the_same_calls_uninterrupted_do_their_work(fan: tuple[Path, str], tmp_path: Path) -> None:
    """The control: without the signal the same calls change the file (so
    an unchanged file above means they were stopped, not idle)."""
    source, root = fan
    tmp_path.chmod(0o700)
    db = tmp_path / "ledger.db"
    shutil.copyfile(source, db)
    db.chmod(0o600)
    with Ledger(db, clock=lambda: 1_800_000_000.0) as ledger:
        report = ledger.reconcile(active_grace_seconds=600, delivery_grace_seconds=600)
        assert report["tasks_timed_out"] > 0
        ledger.cancel(root, subtree=True)
        assert ledger.stats()["by_status"]["running"] == 0
        assert ledger.doctor()["healthy"] is True


OPEN = r"""
import os, signal, sys, threading, time
from taskwarden import Ledger, LedgerError
delay = float(sys.argv[2])
if delay:
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
try:
    Ledger(sys.argv[1]).close()
    print("opened", time.monotonic() - started)
except KeyboardInterrupt:
    print("interrupted", 0)
except LedgerError as refused:
    print("refused:" + type(refused).__name__, 0)
"""


def test_ctrl_c_while_a_peer_file_migrates_is_an_interruption_never_a_refusal(
    peer: tuple[Path, str], tmp_path: Path
) -> None:
    """The migration validates the copy with doctor's checks, which read a
    failed statement as damage: Ctrl-C there was reported as "legacy
    database failed validation" and the signal was lost. At every moment
    of the open, the answer is the interruption (or, near the end, the
    migrated file), and the file stays usable."""
    source, _ = peer
    tmp_path.chmod(0o700)

    def attempt(delay: float) -> tuple[str, float, Path]:
        db = tmp_path / f"try-{delay}.db"
        shutil.copyfile(source, db)
        db.chmod(0o600)
        done = subprocess.run(
            [sys.executable, "-c", OPEN, str(db), str(delay)],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        outcome, seconds = done.stdout.split()
        return outcome, float(seconds), db

    outcome, whole, _ = attempt(0.0)
    assert outcome == "opened"
    for step in range(1, 10):
        outcome, _, db = attempt(whole * step / 10)
        assert outcome in ("interrupted", "opened"), (step, outcome)
        with Ledger(db) as ledger:
            assert sum(ledger.stats()["by_status"].values()) == TASKS
            assert ledger.doctor()["healthy"] is True
