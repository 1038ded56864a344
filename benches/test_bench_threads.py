"""Threads: the core detaches from the interpreter around every SQLite call,
so two threads with a handle each read one file on both cores at once.
Two handles count a 40,000-task file (``stats()``: one scan in SQLite)
one after the other, then in two threads: with the GIL held through a
call, the threaded round would take as long as the other. The figure that
matters is ``speedup`` (one-thread time / two-thread time, up to 2 on a
2-core machine), in ``extra_info`` of the threaded case. (doctor is no
good for this: it already runs its page walk beside its scan.)"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from taskwarden import Ledger

from .conftest import scaled

N_TASKS = scaled(40000)
ROUNDS = 10
_means: dict[str, float] = {}


@pytest.fixture(scope="module")
def checked_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("detach")
    folder.chmod(0o700)
    path = folder / "ledger.db"
    with Ledger(path) as ledger:
        for _ in range(N_TASKS):
            ledger.create_task()
    return path


def _counts(handles: list[Ledger], threaded: bool) -> list[int]:
    counted: list[int] = [0] * len(handles)

    def check(i: int) -> None:
        counted[i] = handles[i].stats()["task_count"]

    if threaded:
        threads = [threading.Thread(target=check, args=(i,)) for i in range(len(handles))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(len(handles)):
            check(i)
    return counted


@pytest.mark.parametrize("threaded", [False, True], ids=["one_thread", "two_threads"])
@pytest.mark.benchmark(group="detach")
def test_two_counts(benchmark, checked_file: Path, threaded: bool) -> None:
    handles = [Ledger(checked_file) for _ in range(2)]
    try:
        counted = benchmark.pedantic(_counts, args=(handles, threaded), rounds=ROUNDS)
    finally:
        for handle in handles:
            handle.close()
    assert counted == [N_TASKS, N_TASKS]
    if benchmark.stats is None:  # --benchmark-disable: a smoke run, no timings
        return
    _means["threads" if threaded else "one"] = benchmark.stats.stats.mean
    if threaded and "one" in _means:
        benchmark.extra_info["speedup"] = round(_means["one"] / _means["threads"], 2)
