"""Reconcile at scale, side by side with task-state-guard 0.1.0 on the same
ledger in the same run.

The ledger is generated in the peer's v2 format (``ledgers.py``); taskwarden
migrates a copy (timed too). Every round works on a fresh copy, so apply is
always measured on the same starting state. The physical reference is one
set-based ``UPDATE`` of the same rows with plain SQLite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from taskwarden import Ledger

from .conftest import scaled
from .ledgers import DAY, NOW, copy_ledger, make_peer_ledger, raw_set_based_timeout

N_TASKS = scaled(100_000)
GRACE = {"active_grace_seconds": 600.0, "delivery_grace_seconds": DAY}
EXPECTED_TIMEOUTS = sum(1 for k in range(N_TASKS) if k % 10 < 5)


def frozen() -> float:
    return NOW


@pytest.fixture(scope="module")
def peer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("task_state_guard")
    folder = tmp_path_factory.mktemp("peer")
    folder.chmod(0o700)
    path = folder / "peer.db"
    make_peer_ledger(path, N_TASKS)
    return path


@pytest.fixture(scope="module")
def ours_file(peer_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ours")
    folder.chmod(0o700)
    path = copy_ledger(peer_file, folder / "ours.db")
    Ledger(path).close()  # migrates to the current schema
    return path


def _fresh_copy(src: Path, n: list[int]) -> tuple[tuple[Path], dict]:
    n[0] += 1
    return (copy_ledger(src, src.with_name(f"round-{n[0]}.db")),), {}


@pytest.mark.benchmark(group="migrate-100k")
def test_taskwarden_migrates_peer_file(benchmark, peer_file: Path) -> None:
    counter = [0]

    def migrate(path: Path) -> None:
        Ledger(path).close()

    benchmark.pedantic(migrate, setup=lambda: _fresh_copy(peer_file, counter), rounds=2)


@pytest.mark.benchmark(group="apply-100k")
def test_taskwarden_apply(benchmark, ours_file: Path) -> None:
    counter = [0]

    def apply(path: Path) -> dict:
        with Ledger(path, clock=frozen) as ledger:
            return ledger.reconcile(**GRACE)

    report = benchmark.pedantic(apply, setup=lambda: _fresh_copy(ours_file, counter), rounds=3)
    assert report["tasks_timed_out"] == EXPECTED_TIMEOUTS


@pytest.mark.benchmark(group="apply-100k")
def test_peer_apply(benchmark, peer_file: Path) -> None:
    import task_state_guard

    counter = [0]

    def apply(path: Path) -> dict:
        return task_state_guard.Ledger(path, clock=frozen).reconcile(**GRACE)

    report = benchmark.pedantic(apply, setup=lambda: _fresh_copy(peer_file, counter), rounds=2)
    assert report["tasks_timed_out"] == EXPECTED_TIMEOUTS


@pytest.mark.benchmark(group="apply-100k")
def test_raw_set_based_update(benchmark, ours_file: Path) -> None:
    """The physical floor: the same rows timed out by one UPDATE, no events."""
    counter = [0]

    changed = benchmark.pedantic(
        raw_set_based_timeout, setup=lambda: _fresh_copy(ours_file, counter), rounds=3
    )
    assert changed == EXPECTED_TIMEOUTS


@pytest.mark.benchmark(group="dry-run-100k")
def test_taskwarden_read_only_dry_run(benchmark, ours_file: Path) -> None:
    def preview() -> dict:
        with Ledger(ours_file, clock=frozen, read_only=True, snapshot_max_bytes=1 << 30) as r:
            return r.reconcile(dry_run=True, **GRACE)

    report = benchmark.pedantic(preview, rounds=5, warmup_rounds=1)
    assert report["tasks_timed_out"] == EXPECTED_TIMEOUTS


@pytest.mark.benchmark(group="dry-run-100k")
def test_peer_read_only_dry_run(benchmark, peer_file: Path) -> None:
    import task_state_guard

    def preview() -> dict:
        ledger = task_state_guard.Ledger(peer_file, clock=frozen, read_only=True)
        return ledger.reconcile(dry_run=True, **GRACE)

    report = benchmark.pedantic(preview, rounds=3, warmup_rounds=1)
    assert report["tasks_timed_out"] == EXPECTED_TIMEOUTS
