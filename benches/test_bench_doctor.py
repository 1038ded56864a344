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
import sqlite3
from pathlib import Path

import pytest

from taskwarden import Ledger

from .conftest import scaled
from .ledgers import NOW, copy_ledger, make_peer_ledger

N_TASKS = scaled(100_000)


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
    assert report["tasks_purged"] == sum(1 for k in range(N_TASKS) if k % 10 == 9)
