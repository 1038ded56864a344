"""doctor and purge at scale, side by side with task-state-guard 0.1.0 and
a bare ``PRAGMA quick_check`` on the same file in the same run.

Two quick_checks are timed. The reference is the bare one as SQLite runs it
by default (the sqlite3 shell, ``sqlite3.connect(path)``): pages, records,
NOT NULL and CHECK constraints, which is what doctor's ``quick_check``
verdict covers. On a read-only connection SQLite does not load CHECK
constraints at all, so the same pragma there only walks pages and records:
a lower floor that checks less, timed for context."""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskwarden import Ledger

from .conftest import scaled
from .ledgers import NOW, copy_ledger, make_peer_ledger

N_TASKS = scaled(100_000)
#: The generated file's tasks a purge takes: succeeded and delivered days ago.
PURGEABLE = sum(1 for k in range(N_TASKS) if k % 10 == 9)


def _peer_and_ours(
    factory: pytest.TempPathFactory, name: str, n_tasks: int, chain_length: int = 1
) -> tuple[Path, Path]:
    """A peer v2 file and taskwarden's migrated copy of it."""
    pytest.importorskip("task_state_guard")
    folder = factory.mktemp(name)
    folder.chmod(0o700)
    peer = folder / "peer.db"
    make_peer_ledger(peer, n_tasks, chain_length=chain_length)
    ours = copy_ledger(peer, folder / "ours.db")
    Ledger(ours).close()
    return peer, ours


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _peer_and_ours(tmp_path_factory, "doctor", N_TASKS)


@pytest.mark.benchmark(group="doctor-100k")
def test_taskwarden_doctor(benchmark, files: tuple[Path, Path]) -> None:
    with Ledger(files[1]) as ledger:
        report = benchmark.pedantic(ledger.doctor, rounds=5, warmup_rounds=1)
    assert report["healthy"] is True and report["task_count"] == N_TASKS


def _time_quick_check(benchmark, uri: str) -> None:
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        rows = benchmark.pedantic(
            lambda: conn.execute("PRAGMA quick_check").fetchall(), rounds=5, warmup_rounds=1
        )
    assert rows == [("ok",)]


@pytest.mark.benchmark(group="doctor-100k")
def test_bare_quick_check(benchmark, files: tuple[Path, Path]) -> None:
    """The reference: SQLite's default connection, CHECK constraints included."""
    _time_quick_check(benchmark, f"file:{files[1]}")


@pytest.mark.benchmark(group="doctor-100k")
def test_read_only_page_walk(benchmark, files: tuple[Path, Path]) -> None:
    """The same pragma read-only: no CHECK constraints, pages and records only."""
    _time_quick_check(benchmark, f"file:{files[1]}?mode=ro")


@pytest.mark.benchmark(group="doctor-100k")
def test_peer_doctor(benchmark, files: tuple[Path, Path]) -> None:
    import task_state_guard

    ledger = task_state_guard.Ledger(files[0], read_only=True)
    report = benchmark.pedantic(ledger.doctor, rounds=2)
    assert report["healthy"] is True


@pytest.fixture(scope="module")
def chained_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """20,000 tasks in parent chains 1,000 deep (doctor walks every link)."""
    return _peer_and_ours(tmp_path_factory, "chains", scaled(20_000), scaled(1_000))


@pytest.mark.benchmark(group="doctor-chains")
def test_taskwarden_doctor_deep_chains(benchmark, chained_files: tuple[Path, Path]) -> None:
    with Ledger(chained_files[1]) as ledger:
        report = benchmark.pedantic(ledger.doctor, rounds=3, warmup_rounds=1)
    assert report["healthy"] is True and report["parent_cycle_count"] == 0


@pytest.mark.benchmark(group="doctor-chains")
def test_peer_doctor_deep_chains(benchmark, chained_files: tuple[Path, Path]) -> None:
    import task_state_guard

    ledger = task_state_guard.Ledger(chained_files[0], read_only=True)
    report = benchmark.pedantic(ledger.doctor, rounds=2)
    assert report["healthy"] is True


@pytest.mark.benchmark(group="purge-100k")
def test_purge_closed_tasks(benchmark, files: tuple[Path, Path]) -> None:
    counter = [0]

    def setup():
        counter[0] += 1
        return (copy_ledger(files[1], files[1].with_name(f"purge-{counter[0]}.db")),), {}

    def purge(path: Path) -> dict:
        with Ledger(path, clock=lambda: NOW) as ledger:
            return ledger.purge(older_than_seconds=3600)

    report = benchmark.pedantic(purge, setup=setup, rounds=2)
    benchmark.extra_info["longest_batch_ms"] = report["longest_batch_ms"]
    assert report["tasks_purged"] == PURGEABLE


WRITER = r"""
import sys, time
from pathlib import Path
from taskwarden import Ledger
ledger = Ledger(sys.argv[1], busy_timeout_ms=60_000)
stop, acks = Path(sys.argv[2]), []
ledger.create_task(delivery_required=False)
print("writing", flush=True)
while not stop.exists():
    ledger.create_task(delivery_required=False)
    acks.append(time.monotonic())
ledger.close()
print(*acks)
"""


class Writers:
    """Four processes creating tasks back to back on ``path`` until told to
    stop; each keeps the time of every write it was answered."""

    def __init__(self, path: Path) -> None:
        self.stop = path.with_name(path.name + ".stop")
        command = [sys.executable, "-c", WRITER, str(path), str(self.stop)]
        self.procs = [
            subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(4)
        ]
        for proc in self.procs:
            assert proc.stdout is not None and proc.stdout.readline() == "writing\n"

    def acks(self) -> list[list[float]]:
        """Stops them; each one's answer times."""
        self.stop.touch()
        return [[float(at) for at in proc.communicate()[0].split()] for proc in self.procs]


@pytest.mark.benchmark(group="purge-beside-writers")
def test_purge_beside_four_writers(benchmark, files: tuple[Path, Path]) -> None:
    """A purge while four processes write: how long it takes, and how the
    writers fare meanwhile (between batches the purge makes way for them)."""
    counter, windows, answered = [0], [], []
    fleets: dict[Path, Writers] = {}

    def setup():
        counter[0] += 1
        path = copy_ledger(files[1], files[1].with_name(f"beside-{counter[0]}.db"))
        fleets[path] = Writers(path)
        return (path,), {}

    def stop(path: Path) -> None:
        # Each round's writers stop with it: left running, they would load
        # the machine through the next round.
        answered.append(fleets.pop(path).acks())

    def purge(path: Path) -> dict:
        with Ledger(path, clock=lambda: NOW, busy_timeout_ms=60_000) as ledger:
            began = time.monotonic()
            report = ledger.purge(older_than_seconds=3600)
            windows.append((began, time.monotonic()))
        return report

    try:
        report = benchmark.pedantic(purge, setup=setup, teardown=stop, rounds=2)
    finally:  # a disabled (smoke) run skips the teardown
        for path in list(fleets):
            stop(path)
    assert report["tasks_purged"] == PURGEABLE
    (began, ended), last = windows[-1], answered[-1]
    inside = [[began, *(at for at in one if began < at < ended), ended] for one in last]
    benchmark.extra_info["writes_per_second_during"] = round(
        sum(len(one) - 2 for one in inside) / (ended - began)
    )
    benchmark.extra_info["longest_writer_wait_ms"] = round(
        1000 * max(b - a for one in inside for a, b in itertools.pairwise(one)), 1
    )
