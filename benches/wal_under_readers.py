"""The WAL beside workers and supervisors that poll without pause. Run by
hand (it takes SECONDS plus a few):

    python -m benches.wal_under_readers [WORKERS] [SUPERVISORS] [SECONDS] [DB]

Each worker runs the README's loop (create, claim_next, charge, heartbeat,
close_task); each supervisor polls ``list_tasks(limit=200)`` and ``stats()``
with no pause, so their reads overlap. Prints one JSON object: the WAL's
peak size (sampled every 10 ms), the workers' loops a second with their
p99 and longest loop, and the supervisors' polls a second with theirs.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _percentiles(times: list[float]) -> tuple[float, float]:
    """p99 and longest, in ms."""
    if not times:
        return 0.0, 0.0
    times.sort()
    return times[int(len(times) * 0.99)] * 1e3, times[-1] * 1e3


def _agent_loop(ledger: Any, name: str) -> None:
    ledger.create_task(llm_calls_budget=10)
    for task in ledger.claim_next(name):
        ledger.charge(task.id, worker=name, tokens=100, cost_micros=1)
        ledger.heartbeat(task.id, worker=name)
        ledger.close_task(task.id, "succeeded", worker=name)


def _poll(ledger: Any, name: str) -> None:
    ledger.list_tasks(limit=200)
    ledger.stats()


def _timed(role: str, path: str, stop_at: float, results: Any, name: str) -> None:
    """One process: the role's step over and over until ``stop_at``."""
    from taskwarden import Ledger

    step = _agent_loop if role == "worker" else _poll
    times: list[float] = []
    with Ledger(path, busy_timeout_ms=30_000) as ledger:
        while time.time() < stop_at:
            began = time.perf_counter()
            step(ledger, name)
            times.append(time.perf_counter() - began)
    results.put((role, len(times), *_percentiles(times)))


def run(workers: int, supervisors: int, seconds: float, path: Path) -> dict[str, float]:
    from taskwarden import Ledger

    with Ledger(path) as ledger:
        for _ in range(2_000):
            ledger.create_task(llm_calls_budget=10)
    results: Any = multiprocessing.Queue()
    stop_at = time.time() + seconds
    roles = [("worker", f"w{i}") for i in range(workers)]
    roles += [("supervisor", f"s{i}") for i in range(supervisors)]
    procs = [
        multiprocessing.Process(target=_timed, args=(role, str(path), stop_at, results, name))
        for role, name in roles
    ]
    for proc in procs:
        proc.start()
    peak = 0
    while time.time() < stop_at:
        with contextlib.suppress(FileNotFoundError):
            peak = max(peak, os.stat(f"{path}-wal").st_size)
        time.sleep(0.01)
    found = [results.get() for _ in procs]
    for proc in procs:
        proc.join()

    def summary(role: str, unit: str) -> dict[str, float]:
        mine = [r for r in found if r[0] == role]
        return {
            f"{role}_{unit}_per_s": round(sum(r[1] for r in mine) / seconds),
            f"{role}_p99_ms": round(max((r[2] for r in mine), default=0.0), 1),
            f"{role}_longest_ms": round(max((r[3] for r in mine), default=0.0), 1),
        }

    return {
        "peak_wal_mib": round(peak / 2**20, 1),
        **summary("worker", "loops"),
        **summary("supervisor", "polls"),
    }


def main(argv: list[str]) -> None:
    workers = int(argv[0]) if argv else 4
    supervisors = int(argv[1]) if len(argv) > 1 else 4
    seconds = float(argv[2]) if len(argv) > 2 else 30.0
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(argv[3]) if len(argv) > 3 else Path(scratch) / "wal.db"
        print(json.dumps(run(workers, supervisors, seconds, path)))


if __name__ == "__main__":
    main(sys.argv[1:])
