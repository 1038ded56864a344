"""The read-only snapshot of a closed ledger (SPEC §5, rust/src/snapshot.rs):
each test holds a rule that a hand-made mutant of snapshot.rs broke without
any test noticing before (the mutant is named in its docstring)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from taskwarden import Ledger
from taskwarden.errors import StateConflict

from .conftest import FrozenClock, run_cli
from .test_dry_run import BASE, disk_state, private_dir

#: The snapshot reads (and hashes) a file a mebibyte at a time.
CHUNK = 1 << 20


def build_large_file(directory: Path, low_hash: str, high_hash: str) -> tuple[Path, str, str]:
    """A cleanly closed ledger of more than two read chunks: the first task
    made holds ``low_hash``, the last ``high_hash`` (near the end of the file)."""
    path = directory / "ledger.db"
    with Ledger(path, clock=FrozenClock(BASE)) as ledger:
        first = ledger.create_task(payload_hash=low_hash).id
        for _ in range(3000):
            ledger.create_task(tenant="t" * 128)
        last = ledger.create_task(payload_hash=high_hash).id
    assert sorted(os.listdir(directory)) == ["ledger.db"]
    assert path.stat().st_size > 2 * CHUNK
    return path, first, last


# ---------------------------------------------------------------------------
# Refusals say why, in the words a writable open uses.


def test_an_empty_file_is_refused_read_only_as_holding_no_ledger_yet(tmp_path: Path) -> None:
    """Kills M12 (an empty file refused as corrupt). Nothing was ever
    written to a 0-byte file: not damage, and the read-only refusal says so
    in the words a writable open uses (``test_ledger``'s create=False)."""
    path = private_dir(tmp_path, "subject") / "ledger.db"
    path.touch(mode=0o600)
    os.chmod(path, 0o600)
    before = disk_state(path)
    with pytest.raises(StateConflict, match="holds no ledger yet") as refused:
        Ledger(path, read_only=True)
    assert "corrupt" not in str(refused.value)
    assert disk_state(path) == before


@pytest.mark.parametrize(
    "content",
    [b"not a database at all" * 100, b"root:x:0:0:root:/root:/bin/bash\n", b"SQLite"],
    ids=["junk", "passwd", "short"],
)
def test_a_file_that_is_no_database_is_refused_read_only_as_no_ledger(
    tmp_path: Path, content: bytes
) -> None:
    """Kills M06 (the "SQLite format 3" magic check dropped): a file that is
    no SQLite database is refused by a read-only open as a writable open
    refuses it (``test_storage_safety``), not as a database in the wrong
    journal mode."""
    path = private_dir(tmp_path, "subject") / "ledger.db"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    before = disk_state(path)
    with pytest.raises(StateConflict, match="corrupt or not a ledger") as refused:
        Ledger(path, read_only=True)
    assert "journal" not in str(refused.value)
    code, _, text = run_cli("--db", str(path), "--format", "text", "stats", "--read-only")
    assert code == 2 and "corrupt or not a ledger" in text
    assert disk_state(path) == before


# ---------------------------------------------------------------------------
# A file of several read chunks.


def test_a_closed_ledger_of_several_read_chunks_is_previewed_whole(tmp_path: Path) -> None:
    """Kills M03 (the first pass stopping after its first chunk) within the
    dry-run tests; the suite kills it only through test_cli's peer file with
    free pages. Every byte of a file larger than a read chunk is read, by
    both passes, and the cap still holds to the byte."""
    path, first, last = build_large_file(private_dir(tmp_path, "subject"), "a" * 64, "b" * 64)
    size = path.stat().st_size
    before = disk_state(path)
    with Ledger(path, read_only=True) as reader:
        assert reader.storage_info()["journal_mode"] == "memory"
        assert reader.get_task(first).payload_hash == "a" * 64
        assert reader.get_task(last).payload_hash == "b" * 64
        assert reader.doctor()["healthy"] is True
    with pytest.raises(StateConflict, match="snapshot cap"):
        Ledger(path, read_only=True, snapshot_max_bytes=size - 1)
    with Ledger(path, read_only=True, snapshot_max_bytes=size) as reader:
        assert reader.get_task(last).payload_hash == "b" * 64
    code, out, _ = run_cli("--db", str(path), "get", last, "--read-only")
    assert code == 0, out
    assert disk_state(path) == before


# ---------------------------------------------------------------------------
# A writer that leaves the time stamps alone.

#: Moves two counters, in two task rows more than a read chunk apart, on
#: through a shared writable mapping: the low one first, then the high one,
#: so at every instant low - high is 0 or 1. Each counter is a Gray code in
#: 16 hex digits: one step changes one byte, so a read (however it tears)
#: always finds a value the counter had. Once a page of a mapping is dirty,
#: stores to it change neither mtime nor ctime until writeback (nor does a
#: write within one tick of a coarse clock): only the content changes.
GRAY_WRITER = """
import mmap, os, sys
path, stop, low, high = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_RDWR)
view = mmap.mmap(fd, 0)
os.close(fd)
def put(n):
    text = b"%016x" % (n ^ (n >> 1))
    view[low:low + 16] = text
    view[high:high + 16] = text
n = 0
put(n)
print("ready", flush=True)
while not os.path.exists(stop):
    for _ in range(1000):
        n += 1
        put(n)
view.close()
print(n, flush=True)
"""


def gray_counter(payload_hash: str) -> int:
    gray = int(payload_hash[-16:], 16)
    n = 0
    while gray:
        n ^= gray
        gray >>= 1
    return n


def test_a_snapshot_is_never_torn_by_a_writer_that_leaves_the_time_stamps_alone(
    tmp_path: Path,
) -> None:
    """Kills M09 (the two passes' SHA-256 not compared; its warning-free
    form M09b compares only the digests' lengths). Identity, size and times
    cannot see a change that moves no time stamp; the digests can. So every
    snapshot taken while such a writer runs is either refused or one
    instant of the file, never the second pass's torn copy: the two
    counters are read as the writer keeps them (low - high is 0 or 1).
    The assertion holds whatever the scheduling: it bounds what is
    accepted, not how often."""
    low_text, high_text = "a" * 48 + "0" * 16, "b" * 48 + "0" * 16
    path, first, last = build_large_file(private_dir(tmp_path, "subject"), low_text, high_text)
    data = path.read_bytes()
    assert data.count(low_text.encode()) == data.count(high_text.encode()) == 1
    low, high = data.find(low_text.encode()) + 48, data.find(high_text.encode()) + 48
    assert high - low > CHUNK  # a read chunk and more between the two counters
    stop = tmp_path / "stop"
    accepted = refused = 0
    with subprocess.Popen(
        [sys.executable, "-c", GRAY_WRITER, str(path), str(stop), str(low), str(high)],
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        assert writer.stdout is not None
        try:
            assert writer.stdout.readline().strip() == "ready"
            for _ in range(150):
                try:
                    with Ledger(path, read_only=True, busy_timeout_ms=0) as reader:
                        seen = (
                            gray_counter(reader.get_task(first).payload_hash),
                            gray_counter(reader.get_task(last).payload_hash),
                        )
                except StateConflict:
                    refused += 1
                    continue
                accepted += 1
                assert seen[0] - seen[1] in (0, 1), seen
        finally:
            stop.touch()
            steps_done = int(writer.stdout.read().strip() or 0)
            assert writer.wait(timeout=60) == 0
    assert steps_done > 0, "the writer never ran"
    assert accepted + refused == 150
