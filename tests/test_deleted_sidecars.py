"""Sidecars deleted by hand while a ledger is open (a clean-up of "stale lock
files" while workers run): no task gets two owners, no acknowledged write is
lost where the file still holds it, and the file stays healthy for doctor."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from taskwarden import ClaimLost, Ledger, StateConflict

from .conftest import run_cli

# A second worker process: opens the ledger after the deletion, tells the
# test it is ready, then claims one task at a time when told to.
_SECOND_WORKER = """
import json, sys
from taskwarden import ClaimLost, Ledger, StateConflict
claimed = []
with Ledger(sys.argv[1]) as ledger:
    print("ready", flush=True)
    for line in sys.stdin:
        claimed += [t.id for t in ledger.claim_next("second")]
        print("claimed", flush=True)
print(json.dumps(claimed), flush=True)
"""


def _healthy(db: Path) -> bool:
    code, report, _ = run_cli("--db", str(db), "doctor")
    return code == 0 and report["healthy"] is True


def _owners(db: Path, ids: list[str]) -> list[str | None]:
    with Ledger(db, read_only=True) as reader:
        return [reader.get_task(i).owner for i in ids]


class _Child:
    """A process running ``script`` on the ledger, told what to do line by
    line; it prints ``ready`` once it has opened the ledger."""

    def __init__(self, script: str, db: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.ask(None) == "ready"

    def ask(self, line: str | None) -> str:
        """Sends ``line`` (if any); the child's next line of answer."""
        pipes = self.process.stdin, self.process.stdout
        assert pipes[0] is not None and pipes[1] is not None
        if line is not None:
            pipes[0].write(line + "\n")
            pipes[0].flush()
        return pipes[1].readline().strip()

    def finish(self) -> str:
        """Closes its input; its last line of answer, once it has exited."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        last = self.process.stdout.readline().strip()
        assert self.process.wait(timeout=60) == 0
        self.process.stdout.close()
        return last


def _claims_beside_a_second_process(db: Path, first: Ledger) -> tuple[list[str], list[str]]:
    """``first`` and a process that opens the ledger now claim one task
    each, in turn, 30 times: what each was told it claimed."""
    second = _Child(_SECOND_WORKER, db)
    mine: list[str] = []
    for _ in range(30):
        mine += [t.id for t in first.claim_next("first")]
        assert second.ask("next") == "claimed"
    return mine, json.loads(second.finish())


def _took_turns(db: Path, mine: list[str], theirs: list[str]) -> None:
    assert len(mine) == len(theirs) == 30
    assert not set(mine) & set(theirs)
    assert _owners(db, mine) == ["first"] * 30
    assert _owners(db, theirs) == ["second"] * 30
    assert _healthy(db)


def test_a_deleted_shm_does_not_let_two_workers_claim_one_task(tmp_path: Path) -> None:
    """The second process makes a new `-shm` and no longer sees the first
    handle's locks; the first handle notices at its next call and opens
    again, so the two still take turns."""
    db = tmp_path / "ledger.db"
    first = Ledger(db)
    for _ in range(60):
        first.create_task()
    Path(f"{db}-shm").unlink()
    mine, theirs = _claims_beside_a_second_process(db, first)
    first.close()
    _took_turns(db, mine, theirs)


def test_a_deleted_shm_stops_a_process_with_two_handles_until_one_is_left(
    tmp_path: Path,
) -> None:
    """SQLite maps a file's `-shm` once per process: a handle opening again
    beside another would map the deleted one again. Both refuse, loudly,
    until one is left; it then opens again and takes turns."""
    db = tmp_path / "ledger.db"
    first, beside = Ledger(db), Ledger(db)
    for _ in range(60):
        first.create_task()
    Path(f"{db}-shm").unlink()
    for handle in (first, beside):
        with pytest.raises(StateConflict, match="other handles in this process"):
            handle.claim_next("first")
    # A handle opened anew beside the one still open would get SQLite's
    # mapping of the deleted file too: refused as well.
    first.close()
    with pytest.raises(StateConflict, match="other handles in this process"):
        Ledger(db)
    beside.close()
    first = Ledger(db)
    mine, theirs = _claims_beside_a_second_process(db, first)
    first.close()
    _took_turns(db, mine, theirs)


def _claims_in_a_deleted_wal(db: Path, deleted: list[str]) -> tuple[Ledger, list[str]]:
    """A worker's open handle and the ten claims it made, which live in its
    WAL alone (the tasks themselves are in the file), once ``deleted``
    sidecars are gone."""
    with Ledger(db) as setup:
        for _ in range(20):
            setup.create_task()
    worker = Ledger(db)
    claimed = [t.id for t in worker.claim_next("w", limit=10)]
    assert Path(f"{db}-wal").stat().st_size > 0
    for suffix in deleted:
        Path(f"{db}{suffix}").unlink()
    return worker, claimed


@pytest.mark.parametrize("then", ["call", "close"])
def test_claims_in_a_wal_deleted_alone_are_kept(tmp_path: Path, then: str) -> None:
    """Claims committed to a WAL someone deletes (its `-shm` left) are
    copied into the file by the handle that wrote them, at its next call or
    at its close."""
    db = tmp_path / "ledger.db"
    worker, claimed = _claims_in_a_deleted_wal(db, ["-wal"])
    if then == "call":
        assert worker.heartbeat(claimed[0], worker="w").status == "running"
    worker.close()
    assert _owners(db, claimed) == ["w"] * 10
    assert _healthy(db)


# A process that opens the ledger, reads it, then claims when told to.
_NEWCOMER = """
import json, sys
from taskwarden import Ledger
with Ledger(sys.argv[1]) as ledger:
    ledger.stats()
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps([t.id for t in ledger.claim_next("newcomer", limit=5)]), flush=True)
"""


def _claims_by_a_newcomer(db: Path, before_it_claims: Callable[[], None]) -> list[str]:
    """A newcomer opens and reads the ledger; ``before_it_claims`` runs;
    then it claims five tasks. Returns their ids."""
    newcomer = _Child(_NEWCOMER, db)
    before_it_claims()
    claimed = json.loads(newcomer.ask("claim"))
    newcomer.finish()
    return claimed


def test_both_sidecars_deleted_a_newcomers_cached_pages_stay_true(tmp_path: Path) -> None:
    """WAL and `-shm` deleted, a process opens and reads the ledger (its
    own new sidecars, pages in its cache), then the old handle notices and
    closes: nothing is copied under the newcomer's cache, whose claims are
    then made on a file that stays healthy. (The old handle's claims, only
    in the deleted WAL, are lost: nobody shares its view any more.)"""
    db = tmp_path / "ledger.db"
    worker, claimed = _claims_in_a_deleted_wal(db, ["-wal", "-shm"])

    def old_handle_notices() -> None:
        with pytest.raises(ClaimLost):
            worker.heartbeat(claimed[0], worker="w")
        worker.close()

    theirs = _claims_by_a_newcomer(db, old_handle_notices)
    assert len(theirs) == 5
    assert _owners(db, theirs) == ["newcomer"] * 5
    assert _healthy(db)


def test_a_wal_deleted_alone_is_copied_once_not_over_a_new_one(tmp_path: Path) -> None:
    """Only the WAL deleted, two handles open (both share its `-shm`): the
    first to notice copies it in, opens again and writes a new WAL at the
    name. The other must not copy its old file's frames at the places the
    shared index now gives to the new ones; its claims were copied by the
    first, as they lived in the same WAL."""
    db = tmp_path / "ledger.db"
    other = Ledger(db)  # opened before the deletion, idle until it closes
    worker, claimed = _claims_in_a_deleted_wal(db, ["-wal"])
    more = [t.id for t in worker.claim_next("w", limit=5)]  # copies, opens again, writes
    assert Path(f"{db}-wal").stat().st_size > 32
    other.close()
    worker.close()
    assert _owners(db, claimed + more) == ["w"] * 15
    assert _healthy(db)


@pytest.mark.parametrize("then", ["call", "close"])
def test_a_deleted_wal_is_not_copied_over_a_file_written_since(tmp_path: Path, then: str) -> None:
    """WAL and `-shm` both deleted, then another process writes the ledger
    (into sidecars of its own): copying the first handle's older pages
    under its commit would damage the file, so they are not copied, at its
    next call or at its close (where SQLite, as the last connection, would
    also have deleted the newcomer's WAL). Its claims are lost (as
    documented), the other process's task is kept and the file stays
    healthy."""
    db = tmp_path / "ledger.db"
    worker, claimed = _claims_in_a_deleted_wal(db, ["-wal", "-shm"])
    done = subprocess.run(
        [sys.executable, "-m", "taskwarden", "--db", str(db), "create"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    answer = json.loads(done.stdout)
    if then == "call":
        with pytest.raises(ClaimLost):  # its claim went with the WAL
            worker.heartbeat(claimed[0], worker="w")
    worker.close()
    with Ledger(db, read_only=True) as reader:
        assert reader.get_task(answer["task"]["id"]).status == "queued"
    assert _owners(db, claimed) == [None] * 10
    assert _healthy(db)
