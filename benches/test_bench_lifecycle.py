"""create -> start -> close -> deliver throughput, side by side with
task-state-guard 0.1.0 and a raw sqlite3 single-UPDATE loop, same durability
(WAL, ``synchronous=NORMAL``), same machine, same run.

Each round runs ``N`` full lifecycles (4 write operations each); the figure
that matters is ops/s = 4 * N / round time, stored in ``extra_info``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from taskwarden import Ledger

from .conftest import raw_update_loop, scaled

N_OURS = scaled(2000)
N_PEER = scaled(150)
N_RAW = scaled(20000)


def _lifecycles(ledger, n: int) -> None:
    for _ in range(n):
        task = ledger.create_task(timeout_seconds=60)
        ledger.start_task(task.id)
        ledger.close_task(task.id, "succeeded", code="worker_completed")
        ledger.set_delivery(task.id, "delivered", code="transport_acknowledged")


def _record(benchmark, ops_per_round: int) -> None:
    if benchmark.stats is None:  # --benchmark-disable: a smoke run, no timings
        return
    mean = benchmark.stats.stats.mean
    benchmark.extra_info["ops_per_second"] = round(ops_per_round / mean)


@pytest.mark.benchmark(group="lifecycle")
def test_taskwarden_lifecycle(benchmark, private_dir: Path) -> None:
    with Ledger(private_dir / "tw.db") as ledger:
        assert ledger.storage_info()["synchronous"] == "normal"
        benchmark.pedantic(_lifecycles, args=(ledger, N_OURS), rounds=5, warmup_rounds=1)
    _record(benchmark, 4 * N_OURS)


@pytest.mark.benchmark(group="lifecycle")
def test_peer_lifecycle(benchmark, private_dir: Path) -> None:
    peer = pytest.importorskip("task_state_guard")
    ledger = peer.Ledger(private_dir / "peer.db")
    benchmark.pedantic(_lifecycles, args=(ledger, N_PEER), rounds=3, warmup_rounds=1)
    _record(benchmark, 4 * N_PEER)


@pytest.mark.benchmark(group="lifecycle")
def test_raw_sqlite_update_loop(benchmark, private_dir: Path) -> None:
    """The physical reference: one UPDATE per transaction, nothing else."""
    with raw_update_loop(private_dir / "raw.db", N_RAW) as loop:
        benchmark.pedantic(loop, rounds=5, warmup_rounds=1)
    _record(benchmark, N_RAW)


@pytest.mark.benchmark(group="read")
def test_taskwarden_get_task(benchmark, private_dir: Path) -> None:
    with Ledger(private_dir / "tw.db") as ledger:
        ids = [ledger.create_task().id for _ in range(scaled(1000))]

        def reads() -> None:
            for tid in ids:
                ledger.get_task(tid)

        benchmark.pedantic(reads, rounds=5, warmup_rounds=1)
    _record(benchmark, len(ids))
