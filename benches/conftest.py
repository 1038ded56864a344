"""Shared helpers for benchmarks: private ledger directories and a scale knob.

``TASKWARDEN_BENCH_SCALE`` (default 1.0) multiplies every workload size, so
CI can smoke the benchmarks quickly with a small scale.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SCALE = float(os.environ.get("TASKWARDEN_BENCH_SCALE", "1.0"))


def scaled(n: int) -> int:
    """A workload size after the scale knob (at least 1)."""
    return max(1, int(n * SCALE))


@pytest.fixture
def private_dir(tmp_path: Path) -> Path:
    path = tmp_path / "private"
    path.mkdir(mode=0o700)
    return path


@contextlib.contextmanager
def raw_update_loop(path: Path, n: int) -> Iterator[Callable[[], None]]:
    """The physical reference of every write benchmark: ``n`` transactions of
    one single-row UPDATE each, in plain SQLite at the ledger's durability."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
        conn.execute("INSERT INTO t VALUES (1, 0)")

        def loop() -> None:
            for _ in range(n):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("UPDATE t SET v = v + 1 WHERE id = 1")
                conn.execute("COMMIT")

        yield loop
