"""Shared helpers for benchmarks: private ledger directories and a scale knob.

``TASKWARDEN_BENCH_SCALE`` (default 1.0) multiplies every workload size, so
CI can smoke the benchmarks quickly with a small scale.
"""

from __future__ import annotations

import os
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
