"""SPEC §7: private modes, no links, private parents, replaced files, durability,
and no free text stored."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskwarden import InvalidInput, Ledger, StateConflict, TaskNotFound

from .conftest import FrozenClock, held_open, run_cli, run_python


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_new_file_and_parents_are_private(tmp_path: Path) -> None:
    db = tmp_path / "a" / "b" / "ledger.db"
    with Ledger(db) as ledger:
        ledger.create_task()
        assert mode(db) == 0o600
        assert mode(db.parent) == 0o700
        assert mode(db.parent.parent) == 0o700
        for side in ("-wal", "-shm"):
            assert mode(Path(f"{db}{side}")) == 0o600
    assert sorted(p.name for p in db.parent.iterdir()) == ["ledger.db"]


@pytest.mark.parametrize("loose", [0o644, 0o4600, 0o2600, 0o1600])
def test_loose_file_mode_is_tightened(db_path: Path, loose: int) -> None:
    db_path.touch()
    db_path.chmod(loose)
    with pytest.raises(InvalidInput):
        Ledger(db_path, read_only=True)
    Ledger(db_path).close()
    assert mode(db_path) == 0o600


@pytest.mark.parametrize("content", [b"root:x:0:0:root:/root:/bin/bash\n", b"SQLite"])
def test_a_file_that_is_no_database_keeps_its_mode(db_path: Path, content: bytes) -> None:
    """A mistyped path (``--db /etc/passwd``) is refused as no ledger
    before anything changes: its mode stays as it was, for the API and for
    every CLI command, reading or writing."""
    db_path.write_bytes(content)
    db_path.chmod(0o644)
    with pytest.raises(StateConflict, match="corrupt or not a ledger"):
        Ledger(db_path)
    for command in (["stats"], ["doctor"], ["list"], ["init"]):
        code, _, _ = run_cli("--db", str(db_path), *command)
        assert code == 2
    assert mode(db_path) == 0o644
    assert db_path.read_bytes() == content
    assert sorted(p.name for p in db_path.parent.iterdir()) == [db_path.name]


def test_symlink_at_the_database_name_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "real.db"
    Ledger(target).close()
    link = tmp_path / "link.db"
    link.symlink_to(target)
    with pytest.raises(InvalidInput):
        Ledger(link)
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "nowhere.db")
    with pytest.raises(InvalidInput):
        Ledger(dangling)
    assert not (tmp_path / "nowhere.db").exists()


def test_dot_dot_after_a_linked_directory_goes_back_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``link/../x.db`` is ``x.db`` beside the link (as ``os.path.abspath``
    reads it, and task-state-guard 0.1.0 opens it), not a file in the parent
    of the link's target; ``Ledger.path`` names the file really opened."""
    (tmp_path / "real" / "deep").mkdir(parents=True)
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "link").symlink_to(tmp_path / "real" / "deep")
    monkeypatch.chdir(tmp_path / "cwd")
    with Ledger("link/../x.db") as ledger:
        ledger.create_task()
        assert ledger.path == tmp_path.resolve() / "cwd" / "x.db"
    assert (tmp_path / "cwd" / "x.db").is_file()
    assert not (tmp_path / "real" / "x.db").exists()
    code, out, _ = run_cli("--db", str(tmp_path / "cwd" / "link" / ".." / "x.db"), "stats")
    assert (code, out["stats"]["task_count"]) == (0, 1)
    assert not (tmp_path / "real" / "x.db").exists()


def test_hard_link_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    Ledger(db).close()
    os.link(db, tmp_path / "second-name.db")
    with pytest.raises(InvalidInput):
        Ledger(db)


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_linked_sidecars_are_refused(tmp_path: Path, suffix: str) -> None:
    db = tmp_path / "ledger.db"
    Ledger(db).close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"")
    elsewhere.chmod(0o600)
    Path(f"{db}{suffix}").symlink_to(elsewhere)
    with pytest.raises(StateConflict):
        Ledger(db)
    Path(f"{db}{suffix}").unlink()
    os.link(elsewhere, f"{db}{suffix}")
    with pytest.raises(StateConflict):
        Ledger(db)


@pytest.mark.parametrize("read_only", [False, True])
def test_unsafe_parent_is_refused_at_open_and_later(tmp_path: Path, read_only: bool) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    db = shared / "ledger.db"
    with Ledger(db) as writer:
        task = writer.create_task()
    ledger = Ledger(db, read_only=read_only)
    shared.chmod(0o777)
    try:
        with pytest.raises(InvalidInput):
            ledger.get_task(task.id)
        with pytest.raises(InvalidInput):
            Ledger(db)
    finally:
        shared.chmod(0o700)
        ledger.close()


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("name", ["dir/.", "dir/..", "dir/", "x" * 248])
def test_a_path_that_cannot_name_a_ledger_file_is_invalid_input(
    tmp_path: Path, name: str, read_only: bool
) -> None:
    """``dir/.`` is not a file called ``dir``, and a name whose ``-journal``
    sidecar would not fit the file system is refused up front (clean
    ``InvalidInput``, nothing created), not as a storage failure later."""
    os.chmod(tmp_path, 0o700)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(InvalidInput):
        Ledger(f"{tmp_path}/{name}", read_only=read_only)  # a str: pathlib drops the "."
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    code, out, raw = run_cli("--db", f"{tmp_path}/{name}", "init")
    assert code == 2 and out["error"] == "InvalidInput", raw
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_the_longest_name_that_fits_opens(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    with Ledger(tmp_path / ("x" * 247)) as ledger:
        assert ledger.create_task().status == "queued"


def test_parent_that_is_a_file_or_link_is_refused(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(InvalidInput):
        Ledger(blocker / "ledger.db")


def test_replaced_database_is_detected(tmp_path: Path, clock: FrozenClock) -> None:
    db = tmp_path / "ledger.db"
    ledger = Ledger(db, clock=clock)
    ledger.create_task()
    impostor = tmp_path / "impostor.db"
    Ledger(impostor).close()
    os.replace(impostor, db)
    try:
        with pytest.raises(StateConflict):
            ledger.create_task()
    finally:
        ledger.close()


@pytest.mark.parametrize("change", ["replaced", "deleted", "hard_linked"])
@pytest.mark.parametrize("live_wal", [False, True], ids=["snapshot", "live_wal"])
def test_a_read_only_handle_notices_its_file_changing_identity(
    tmp_path: Path, change: str, live_wal: bool
) -> None:
    """Like a writable one: the next call after the file was replaced,
    deleted or given a second name is a StateConflict, not a quiet answer
    from a file that is no longer the one opened."""
    db = tmp_path / "ledger.db"
    writer = Ledger(db)
    task = writer.create_task()
    if not live_wal:
        writer.close()
    reader = Ledger(db, read_only=True)
    assert reader.get_task(task.id) == task
    if change == "replaced":
        impostor = tmp_path / "impostor.db"
        Ledger(impostor).close()
        os.replace(impostor, db)
    elif change == "deleted":
        db.unlink()
    else:
        os.link(db, tmp_path / "second-name.db")
    try:
        with pytest.raises(StateConflict):
            reader.get_task(task.id)
    finally:
        reader.close()
        writer.close()


def _replace(db: Path) -> None:
    impostor = db.with_name("impostor.db")
    Ledger(impostor).close()
    os.replace(impostor, db)


def _link_from_another_directory(db: Path) -> None:
    elsewhere = db.parent.parent / f"{db.parent.name}-elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.link(db, elsewhere / "second-name.db")


_NAME_CHANGES = {
    "replaced": _replace,
    "deleted": lambda db: db.unlink(),
    "renamed_away": lambda db: db.rename(db.with_name("moved.db")),
    "linked_beside": lambda db: os.link(db, db.with_name("second-name.db")),
    "linked_from_another_directory": _link_from_another_directory,
}


def test_a_directory_that_stood_still_still_reveals_every_change_of_name(
    tmp_path: Path,
) -> None:
    """The names in the directory are looked up again only when its times
    move; once they have stood still long enough to be trusted, a file
    replaced, deleted, renamed or linked is still refused on the next call,
    and a WAL unlinked by another copy of SQLite is still replaced before
    the next write."""
    import sqlite3
    import time

    ledgers = {}
    for name in [*_NAME_CHANGES, "wal_unlinked"]:
        folder = tmp_path / name
        folder.mkdir(mode=0o700)
        ledgers[name] = (Ledger(folder / "ledger.db"), folder / "ledger.db")
        ledgers[name][0].create_task()
    time.sleep(2.5)  # longer than the directory must stand still
    for ledger, _ in ledgers.values():
        ledger.list_tasks(limit=1)  # checks the names, trusts the directory
    for name, change in _NAME_CHANGES.items():
        ledger, db = ledgers[name]
        change(db)
        with pytest.raises(StateConflict):
            ledger.create_task()
        ledger.close()
    ledger, db = ledgers["wal_unlinked"]
    inspect = sqlite3.connect(db)
    inspect.execute("SELECT count(*) FROM tasks").fetchone()
    inspect.close()  # takes itself for the last connection: unlinks the WAL
    assert not Path(f"{db}-wal").exists()
    task = ledger.create_task()
    with Ledger(db, read_only=True) as other:
        assert other.get_task(task.id) == task
    ledger.close()


def test_sidecar_changes_made_while_open_are_refused_or_undone(tmp_path: Path) -> None:
    """Sidecars are held to the rules of an open while the ledger lives: a
    second name for the WAL is refused at the next call (its pages, ids
    included, would outlive the ledger under that name), and a loosened mode
    is tightened again within the second that names are trusted."""
    import time

    db = tmp_path / "ledger.db"
    with Ledger(db) as ledger:
        ledger.create_task()
        wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
        os.link(wal, tmp_path / "wal-copy")
        with pytest.raises(StateConflict):
            ledger.create_task()
        (tmp_path / "wal-copy").unlink()
        ledger.create_task()
        wal.chmod(0o644)
        shm.chmod(0o666)
        time.sleep(1.1)  # longer than unchanged names are trusted
        assert len(ledger.list_tasks()) == 2
        assert (mode(wal), mode(shm)) == (0o600, 0o600)


def test_a_database_moved_away_from_its_wal_is_refused_and_never_overwritten(
    tmp_path: Path,
) -> None:
    """The directory is moved away and the file alone put back at its name:
    the open ledger's WAL is no longer beside it, so its calls are refused,
    and its close copies nothing into the file that others now write
    without that WAL. What it committed before stays in the moved WAL."""
    folder = tmp_path / "ledgers"
    folder.mkdir(mode=0o700)
    db = folder / "ledger.db"
    ledger = Ledger(db)
    ledger.create_task()
    folder.rename(tmp_path / "moved")
    folder.mkdir(mode=0o700)
    (tmp_path / "moved" / "ledger.db").rename(db)
    with pytest.raises(StateConflict):
        ledger.create_task()
    # Another process (in this one, SQLite would share the open file's
    # state with the stale connection).
    script = (
        "import sys; from taskwarden import Ledger; print(Ledger(sys.argv[1]).create_task().id)"
    )
    written = run_python(script, str(db))[0]
    ledger.close()
    with Ledger(db) as check:
        assert check.get_task(written).id == written
        assert check.doctor()["healthy"] is True
    assert Path(tmp_path / "moved" / "ledger.db-wal").stat().st_size > 0


def test_durability_full_switches_synchronous(tmp_path: Path) -> None:
    with Ledger(tmp_path / "n.db") as normal:
        assert normal.storage_info()["synchronous"] == "normal"
        with Ledger(tmp_path / "n.db", read_only=True) as live_wal:
            assert live_wal.storage_info()["synchronous"] == "normal"
    with Ledger(tmp_path / "n.db", read_only=True) as snapshot:
        assert snapshot.storage_info()["synchronous"] == "normal"
    with Ledger(tmp_path / "f.db", durability="full") as full:
        info = full.storage_info()
        assert (info["synchronous"], info["durability"]) == ("full", "full")
    with pytest.raises(InvalidInput):
        Ledger(tmp_path / "x.db", durability="fast")


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to see the syncs")
def test_each_folder_a_new_ledger_makes_is_synced_into_its_parent(tmp_path: Path) -> None:
    """A folder's name lives in its parent, which SQLite never syncs: a
    power cut could take the new folders, and every commit `durability=
    "full"` reported on disk with them. Only a trace of the system calls
    shows the syncs (a killed process still leaves the page cache)."""
    os.chmod(tmp_path, 0o700)
    db = tmp_path / "a" / "b" / "c" / "ledger.db"
    script = "import sys; from taskwarden import Ledger; Ledger(sys.argv[1]).close()"
    trace = subprocess.run(
        ["strace", "-f", "-y", "-e", "trace=mkdir,fsync", sys.executable, "-c", script, str(db)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert trace.returncode == 0, trace.stderr[-2000:]
    made: list[str] = []
    synced_after: dict[str, set[str]] = {}
    # Matched without their results: a call another thread interrupts is
    # printed "<unfinished ...>", its result on a later line.
    for line in trace.stderr.splitlines():
        if (found := re.search(r'mkdir\("([^"]+)", 0700', line)) is not None:
            made.append(found.group(1))
            synced_after[found.group(1)] = set()
        elif (found := re.search(r"fsync\(\d+<([^>]+)>", line)) is not None:
            for folder in made:
                synced_after[folder].add(found.group(1))
    assert made == [str(tmp_path / "a"), str(tmp_path / "a" / "b"), str(db.parent)]
    for folder in made:
        assert str(Path(folder).parent) in synced_after[folder], folder


def test_storage_info_has_the_peer_keys(ledger: Ledger) -> None:
    info = ledger.storage_info()
    assert info["journal_mode"] == "wal"
    assert info["busy_timeout_ms"] == 5000
    assert info["foreign_keys"] is True
    assert info["permission_model"] == "posix_mode"


def test_storage_info_gives_the_file_and_wal_sizes_without_counting(db_path: Path) -> None:
    """What a supervisor watching the WAL polls: the sizes `stats()` gives,
    from two file sizes, not a count of every task."""
    with Ledger(db_path) as ledger:
        ledger.create_task()
        info, stats = ledger.storage_info(), ledger.stats()
        wal = Path(f"{db_path}-wal")
        assert (info["file_bytes"], info["wal_bytes"]) == (
            db_path.stat().st_size,
            wal.stat().st_size,
        )
        assert info["wal_bytes"] > 0
        assert (info["file_bytes"], info["wal_bytes"]) == (stats["file_bytes"], stats["wal_bytes"])
    with Ledger.in_memory() as mem:
        info = mem.storage_info()
        assert (info["file_bytes"], info["wal_bytes"]) == (None, None)


def test_read_only_open_requires_an_existing_private_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(InvalidInput):
        Ledger(missing, read_only=True)
    assert not missing.exists()
    db = tmp_path / "ledger.db"
    Ledger(db).close()
    db.chmod(0o640)
    with pytest.raises(InvalidInput):
        Ledger(db, read_only=True)
    assert mode(db) == 0o640


def test_read_only_handle_refuses_writes_and_touches_nothing(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with Ledger(db) as writer:
        task = writer.create_task()
    before = (db.read_bytes(), db.stat().st_mtime_ns, sorted(os.listdir(tmp_path)))
    with Ledger(db, read_only=True) as reader:
        assert reader.get_task(task.id) == Ledger(db, read_only=True).get_task(task.id)
        for call in (
            lambda: reader.create_task(),
            lambda: reader.start_task(task.id),
            lambda: reader.close_task(task.id, "failed"),
        ):
            with pytest.raises(StateConflict):
                call()
        assert reader.storage_info()["journal_mode"] == "memory"
    after = (db.read_bytes(), db.stat().st_mtime_ns, sorted(os.listdir(tmp_path)))
    assert after == before


def test_no_free_text_reaches_the_file(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    marker = "SECRET-MARKER-7731"
    with Ledger(db) as ledger:
        task = ledger.create_task(tenant="acme")
        for bad in (
            lambda: ledger.create_task(tenant=marker + " x"),
            lambda: ledger.close_task(task.id, "failed", code=marker),
            lambda: ledger.get_task(marker),
        ):
            with pytest.raises(InvalidInput) as info:
                bad()
            assert marker not in str(info.value)
    blob = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert marker.encode() not in blob
    assert str(tmp_path).encode() not in blob


# A worker that also opens the ledger through Python's own sqlite3 (a second
# copy of SQLite in one process), then crashes without closing.
_SECOND_COPY_WORKER = """
import os, sqlite3, sys
from taskwarden import Ledger
ledger = Ledger(sys.argv[1])
ids = [ledger.create_task().id]
inspect = sqlite3.connect(sys.argv[1])
inspect.execute("SELECT count(*) FROM tasks").fetchone()
inspect.close()  # thinks it is the last connection: checkpoints, unlinks the WAL
ids += [ledger.create_task().id for _ in range(4)]
with Ledger(sys.argv[1], read_only=True) as other:  # what everyone else sees
    seen = sum(1 for i in ids if other.get_task(i))
print(" ".join(ids), seen, flush=True)
os._exit(0)  # a crash: no close, no final checkpoint
"""


def test_a_second_sqlite_copy_in_the_process_loses_no_acknowledged_write(
    tmp_path: Path,
) -> None:
    """Python's sqlite3 closing its connection unlinks the WAL under the
    ledger's; the ledger notices before its next call and reconnects, so
    every acknowledged create is visible at once and survives the crash."""
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    path = folder / "ledger.db"
    *ids, seen = run_python(_SECOND_COPY_WORKER, str(path))[0].split()
    assert (len(ids), int(seen)) == (5, 5)
    with Ledger(path) as ledger:
        assert [ledger.get_task(i).id for i in ids] == ids
        assert ledger.doctor()["healthy"] is True


# A worker with two handles on one ledger (a writer, and a read-only view
# or a second writer). SQLite's locks are the process's, per file: closing
# any descriptor of the ledger file drops them all. Mid-create (inside the
# write transaction, from the clock), another process opens the ledger with
# plain sqlite3 and closes it; without the worker's locks it takes itself
# for the last user, checkpoints and unlinks the WAL under the writer.
_TWO_HANDLE_WORKER = """
import os, sqlite3, subprocess, sys, time
from taskwarden import Ledger
path, second = sys.argv[1], sys.argv[2]
OUTSIDER = (
    "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
    "c.execute('SELECT 1 FROM tasks'); c.close()"
)
ticks = []
def clock():
    if len(ticks) == 1:
        subprocess.run([sys.executable, "-c", OUTSIDER, path], check=True)
    ticks.append(1)
    return 1_800_000_000.0 + len(ticks)
writer = Ledger(path, clock=clock)
first = writer.create_task().id
other = Ledger(path, read_only=(second == "read_only"))
late = writer.create_task().id  # the outsider runs inside this write
print(first, late, os.path.exists(path + "-wal"), flush=True)
os._exit(0)  # a crash: no close, no final checkpoint
"""


@pytest.mark.parametrize("second", ["read_only", "writable"])
def test_a_second_handle_in_the_process_keeps_the_writers_locks(
    tmp_path: Path, second: str
) -> None:
    """Opening another handle on the same file must not drop the locks the
    first handle's connection holds: another process closing the ledger
    then leaves the WAL alone, and the create acknowledged across that
    close survives the crash."""
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    path = folder / "ledger.db"
    first, late, wal_kept = run_python(_TWO_HANDLE_WORKER, str(path), second)[0].split()
    assert wal_kept == "True"
    with Ledger(path) as ledger:
        assert [ledger.get_task(i).id for i in (first, late)] == [first, late]
        assert ledger.doctor()["healthy"] is True


@pytest.mark.parametrize(
    ("layout", "rule"),
    [
        ("parent-of-another-user", "database parent must be owned by the current user"),
        ("group-writable-parent", "database parent must not be group/world writable"),
        ("open-ancestor", "database ancestor permits unsafe replacement"),
    ],
)
def test_an_unsafe_parent_is_refused_with_its_rule_as_the_peer_words_it(
    tmp_path: Path, layout: str, rule: str
) -> None:
    import task_state_guard as tsg

    if layout == "parent-of-another-user" and os.geteuid() != 0:
        pytest.skip("needs root to give the directory away")
    os.chmod(tmp_path, 0o700)
    outer = tmp_path / "outer"
    parent = outer / "inner"
    parent.mkdir(parents=True)
    os.chmod(outer, 0o777 if layout == "open-ancestor" else 0o700)
    os.chmod(parent, 0o770 if layout == "group-writable-parent" else 0o700)
    if layout == "parent-of-another-user":
        os.chown(parent, 65534, 65534)
    for opener, refusal in ((Ledger, InvalidInput), (tsg.Ledger, tsg.InvalidInput)):
        with pytest.raises(refusal) as refused:
            opener(parent / "ledger.db")
        assert str(refused.value) == rule, opener
    assert list(parent.iterdir()) == []


SWAP_NAME_WITH_A_LINK = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
name, other, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
link = name + ".link"
os.symlink(other, link)
print("ready", flush=True)
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for _ in range(2):  # the name becomes the link, then the file again
        libc.renameat2(-100, name.encode(), -100, link.encode(), 2)  # RENAME_EXCHANGE
os.unlink(link)
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "renameat2"), reason="needs renameat2")
def test_a_link_swapped_in_at_the_name_between_the_checks_and_sqlite_is_not_followed(
    tmp_path: Path,
) -> None:
    """A neighbour of the same user swaps the name for a symlink to another
    ledger and back, over and over, while a worker opens, writes and
    closes. The checks look at the name before SQLite opens it, so SQLite
    must refuse a link there itself: every acknowledged write is in the
    ledger at the name, none in the other one (a quarter of them went
    there before)."""
    tmp_path.chmod(0o700)
    path, other = tmp_path / "l.db", tmp_path / "other.db"
    Ledger(path).close()
    Ledger(other).close()
    other_bytes = other.read_bytes()
    acked: list[str] = []
    with subprocess.Popen(
        [sys.executable, "-c", SWAP_NAME_WITH_A_LINK, str(path), str(other), "3"],
        stdout=subprocess.PIPE,
        text=True,
    ) as swapper:
        assert swapper.stdout is not None and swapper.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                with Ledger(path) as ledger:
                    acked.append(ledger.create_task().id)
            except (InvalidInput, StateConflict):
                pass  # a refusal is fine; a write elsewhere is not
        assert swapper.wait(timeout=60) == 0
    assert acked
    missing = []
    with Ledger(path) as ledger:
        for task_id in acked:
            try:
                ledger.get_task(task_id)
            except TaskNotFound:
                missing.append(task_id)
    assert missing == [], f"{len(missing)} of {len(acked)} acknowledged writes went elsewhere"
    assert other.read_bytes() == other_bytes


def _bind_mount(source: Path, target: Path) -> bool:
    """Mounts ``source`` over ``target``; False where this user may not
    (or the machine has no `mount`)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(
        ["mount", "--bind", str(source), str(target)], capture_output=True, check=False
    )
    return done.returncode == 0


@pytest.mark.parametrize("read_only", [False, True])
def test_a_ledger_file_mounted_on_its_own_is_refused(tmp_path: Path, read_only: bool) -> None:
    """A container given the file alone (`-v /host/t.db:/app/t.db`) would
    keep its WAL and locks beside its own name, unseen by the host's
    workers: two WALs over one file. Its open is refused; the host's
    name, no mount point, still opens."""
    host, app = tmp_path / "host", tmp_path / "app"
    for folder in (host, app):
        folder.mkdir(mode=0o700)
    with Ledger(host / "t.db") as ledger:
        ledger.create_task()
    (app / "t.db").touch(mode=0o600)
    if not _bind_mount(host / "t.db", app / "t.db"):
        pytest.skip("needs root and mount --bind")
    try:
        with pytest.raises(StateConflict, match="mounted on its own"):
            Ledger(app / "t.db", read_only=read_only)
        assert sorted(p.name for p in app.iterdir()) == ["t.db"]
        with Ledger(host / "t.db", read_only=read_only) as ledger:
            assert ledger.stats()["task_count"] == 1
    finally:
        subprocess.run(["umount", str(app / "t.db")], check=True)


def test_a_read_only_file_system_says_so_and_read_only_handles_still_read(
    tmp_path: Path,
) -> None:
    """A `:ro` volume: a writable open says the file system is read-only
    (it said only that an operation failed), a read-only one reads, and so
    do the CLI's reading commands, as on any file a writable open refuses."""
    host, view = tmp_path / "host", tmp_path / "view"
    for folder in (host, view):
        folder.mkdir(mode=0o700)
    with Ledger(host / "t.db") as ledger:
        ledger.create_task()
    if not _bind_mount(host, view):
        pytest.skip("needs root and mount --bind")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        with pytest.raises(StateConflict, match="file system is read-only"):
            Ledger(view / "t.db")
        with Ledger(view / "t.db", read_only=True) as ledger:
            assert ledger.stats()["task_count"] == 1
        # The CLI's reading commands fall back to a read-only open.
        code, answer, _ = run_cli("--db", str(view / "t.db"), "stats")
        assert code == 0 and answer["stats"]["task_count"] == 1
    finally:
        subprocess.run(["umount", str(view)], check=True)


@pytest.mark.parametrize("ancestor_mode", [0o770, 0o730])
def test_a_group_writable_ancestor_without_the_sticky_bit_is_refused(
    tmp_path: Path, ancestor_mode: int
) -> None:
    """Not only a world-writable ancestor: one the group may write (and
    without the sticky bit) lets a group member rename the private parent
    away and put another in its place. The peer refuses it in the same
    words; a writable open, a read-only one and the CLI all refuse it."""
    import task_state_guard as tsg

    os.chmod(tmp_path, 0o700)
    outer = tmp_path / "outer"
    parent = outer / "inner"
    parent.mkdir(parents=True, mode=0o700)
    os.chmod(outer, 0o700)
    db = parent / "ledger.db"
    with Ledger(db) as ledger:
        ledger.create_task()
    os.chmod(outer, ancestor_mode)
    rule = "database ancestor permits unsafe replacement"
    try:
        for opener, refusal in ((Ledger, InvalidInput), (tsg.Ledger, tsg.InvalidInput)):
            with pytest.raises(refusal) as refused:
                opener(db)
            assert str(refused.value) == rule, opener
        with pytest.raises(InvalidInput, match=rule):
            Ledger(db, read_only=True)
        code, out, raw = run_cli("--db", str(db), "stats")
        assert code == 2 and out["error"] == "InvalidInput", raw
        # The sticky bit makes the same group-writable ancestor safe again.
        os.chmod(outer, ancestor_mode | stat.S_ISVTX)
        with Ledger(db) as ledger:
            assert ledger.stats()["task_count"] == 1
    finally:
        os.chmod(outer, 0o700)


@pytest.mark.parametrize("loose", [0o4600, 0o2600, 0o1600])
@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_set_id_and_sticky_bits_on_a_sidecar_count_as_a_loose_mode(
    tmp_path: Path, suffix: str, loose: int
) -> None:
    """A sidecar's mode is judged whole, as the database file's is (and as
    the peer reads it): 0600 exactly. A read-only open refuses one with a
    set-id or sticky bit and leaves it as it is; a writable open makes it
    0600."""
    db = tmp_path / "ledger.db"
    with Ledger(db) as writer:
        task = writer.create_task()
        side = Path(f"{db}{suffix}")
        side.chmod(loose)
        if mode(side) != loose:
            pytest.skip("this file system or user cannot set that bit")
        with pytest.raises(StateConflict):
            Ledger(db, read_only=True)
        assert mode(side) == loose
        with Ledger(db) as second:  # a writable open of the same live ledger
            assert second.get_task(task.id) == task
        assert mode(side) == 0o600


# Another process opens the ledger at its name and keeps it open, its WAL
# and -shm at the sidecar names, until its standard input closes.
_HOLDER = """
import sys
from taskwarden import Ledger
ledger = Ledger(sys.argv[1])
ledger.create_task()
print("ready", flush=True)
sys.stdin.read()
ledger.close()
"""


def test_a_wal_at_the_name_that_is_not_the_one_held_is_refused(tmp_path: Path) -> None:
    """The directory is moved away and the file alone put back, and then
    another process opens the ledger there: a WAL is beside the database
    again, but not the one this handle writes (its commits are in the moved
    one). Its next call is refused, as when no WAL is at the name, not
    carried on over a new connection as if nothing had been lost."""
    folder = tmp_path / "ledgers"
    folder.mkdir(mode=0o700)
    db = folder / "ledger.db"
    ledger = Ledger(db)
    first = ledger.create_task()
    folder.rename(tmp_path / "moved")
    folder.mkdir(mode=0o700)
    (tmp_path / "moved" / "ledger.db").rename(db)
    try:
        with held_open(_HOLDER, str(db)):
            assert Path(f"{db}-wal").exists() and Path(f"{db}-shm").exists()
            with pytest.raises(StateConflict):
                ledger.create_task()
            with pytest.raises(StateConflict):
                ledger.get_task(first.id)
    finally:
        ledger.close()
    with Ledger(db) as check:
        assert check.stats()["task_count"] == 1  # the holder's task alone
        assert check.doctor()["healthy"] is True
