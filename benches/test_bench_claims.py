"""Claims and the budget guard: claim_next + close_task with 1 and 4
processes, batched claims, charges, and the raw single-UPDATE transaction
rate of Python's sqlite3 measured in the same run as the reference."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from taskwarden import Ledger

from .conftest import raw_update_loop, scaled
from .ledgers import copy_ledger

N_TASKS = scaled(4000)
N_CHARGES = scaled(20000)


def _fill(path: Path, n: int) -> None:
    with Ledger(path) as ledger:
        for _ in range(n):
            ledger.create_task(llm_calls_budget=None)


def _drain(path: str, worker: str, batch: int, ready, go) -> int:
    """Claim and close until the queue is empty; returns tasks done."""
    done = 0
    with Ledger(path, busy_timeout_ms=60_000) as ledger:
        ready.put(worker)
        go.wait()
        while claimed := ledger.claim_next(worker, limit=batch):
            for task in claimed:
                ledger.close_task(task.id, "succeeded", worker=worker)
            done += len(claimed)
    return done


class Fleet:
    """``n`` spawned worker processes, each with its ledger open, waiting for
    the start signal. Starting processes (a spawned child imports the whole
    test runner) is set-up, so the benchmark times the claims alone."""

    def __init__(self, path: Path, n_procs: int, batch: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.manager = ctx.Manager()
        self.pool = ctx.Pool(n_procs)
        ready, self.go = self.manager.Queue(), self.manager.Event()
        self.results = [
            self.pool.apply_async(_drain, (str(path), f"w{i}", batch, ready, self.go))
            for i in range(n_procs)
        ]
        for _ in range(n_procs):
            ready.get(timeout=120)
        self.closed = False

    def run(self) -> int:
        self.go.set()
        return sum(r.get() for r in self.results)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool.close()
            self.pool.join()
            self.manager.shutdown()


# 16 processes on this machine's 2 cores: how a fleet that outnumbers its
# cores fares while its workers wait their turn for the write lock.
@pytest.mark.parametrize("n_procs", [1, 4, 16])
@pytest.mark.benchmark(group="claim-close")
def test_claim_next_close_processes(benchmark, private_dir: Path, n_procs: int) -> None:
    fleets: list[Fleet] = []

    def setup():
        path = private_dir / f"claims-{n_procs}-{len(fleets)}.db"
        _fill(path, N_TASKS)
        fleets.append(Fleet(path, n_procs, 1))
        return (fleets[-1],), {}

    try:
        done = benchmark.pedantic(Fleet.run, setup=setup, teardown=Fleet.close, rounds=3)
    finally:  # a disabled (smoke) run skips the teardown
        for fleet in fleets:
            fleet.close()
    assert done == N_TASKS
    if benchmark.stats is not None:  # --benchmark-disable: a smoke run, no timings
        benchmark.extra_info["tasks_per_second"] = round(N_TASKS / benchmark.stats.stats.mean)


@pytest.mark.benchmark(group="claim-close")
def test_raw_single_update_transactions(benchmark, private_dir: Path) -> None:
    with raw_update_loop(private_dir / "raw.db", N_TASKS) as loop:
        benchmark.pedantic(loop, rounds=3)


# Enough claims for the WAL to pass its checkpoint threshold inside the
# timed loop, as it does for a long-lived worker: a batch writes about 20
# pages, and a checkpoint comes every 10,000.
N_BATCH_TASKS = scaled(40000)


@pytest.fixture(scope="module")
def batch_queue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("batch-queue")
    folder.chmod(0o700)
    path = folder / "queue.db"
    _fill(path, N_BATCH_TASKS)
    return path


@pytest.mark.benchmark(group="claim-batch")
def test_batched_claim_next(benchmark, batch_queue: Path, private_dir: Path) -> None:
    """Steady-state batched claims of a worker that stays open: the timed
    loop includes every checkpoint the claims trigger; the one-off
    checkpoint at close is timed on its own (``close_ms``)."""
    opened: list[Ledger] = []
    closes: list[float] = []

    def setup():
        path = copy_ledger(batch_queue, private_dir / f"batch-{len(opened)}.db")
        opened.append(Ledger(path))
        return (opened[-1],), {}

    def claim_all(ledger: Ledger) -> int:
        claimed = 0
        while batch := ledger.claim_next("w", limit=64):
            claimed += len(batch)
        return claimed

    def close(ledger: Ledger) -> None:
        started = time.perf_counter()
        ledger.close()
        closes.append(time.perf_counter() - started)

    try:
        claimed = benchmark.pedantic(claim_all, setup=setup, teardown=close, rounds=3)
    finally:  # a disabled (smoke) run skips the teardown
        for ledger in opened:
            ledger.close()
    assert claimed == N_BATCH_TASKS
    if benchmark.stats is not None and closes:
        rate = N_BATCH_TASKS / benchmark.stats.stats.mean
        benchmark.extra_info["claims_per_second"] = round(rate)
        benchmark.extra_info["close_ms"] = round(1000 * sum(closes) / len(closes), 1)


@pytest.mark.benchmark(group="charge")
def test_charge_one_thread(benchmark, private_dir: Path) -> None:
    with Ledger(private_dir / "charge.db") as ledger:
        parent = ledger.create_task(llm_calls_budget=None)
        task = ledger.create_task(parent_id=parent.id, llm_calls_budget=None)
        ledger.claim(task.id, "w")
        # Steady state of a long-lived worker: its directory has stood still
        # long enough for per-call checks to trust its times (100 ms where
        # the file system keeps fractions of a second, 2 s where it keeps
        # whole seconds; until then every call looks the names up again).
        time.sleep(2.1)

        def charges() -> None:
            for _ in range(N_CHARGES):
                ledger.charge(task.id, tokens=100, cost_micros=7, worker="w")

        benchmark.pedantic(charges, rounds=3)
        used = ledger.budget(parent.id).calls_used
        assert used > 0 and used % N_CHARGES == 0  # every charge rolled up to the parent
