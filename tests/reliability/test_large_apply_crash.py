"""A reconcile of a large file killed at random moments (SPEC §5, §7).

A file over 128 MiB is rewritten with the everyday page cache: its apply
writes changed pages to the WAL before its commit, and a kill can land
among those frames, in the commit or in the checkpoint after it. Whatever
the moment, the restarted ledger must hold the whole apply or none of it
(every timeout and expired delivery with its event, or no change at all)
and doctor must find it healthy.

Long campaign only (``--run-slow`` / ``TASKWARDEN_LONG=1``): the file
takes about 15 s to make.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benches.ledgers import DAY, NOW, make_peer_ledger
from taskwarden import Ledger

# Half of them running and silent (timed out by the apply), a tenth with a
# delivery pending for two days (failed by it): see `make_peer_ledger`.
TASKS = 330_000
TIMED_OUT, FAILED = TASKS // 2, TASKS // 10
BULK_IN_MEMORY_MAX = 128 * 2**20
KILLS = 12

APPLY = f"""
import sys
from taskwarden import Ledger
ledger = Ledger(sys.argv[1], clock=lambda: {NOW!r})
print("open", flush=True)
ledger.reconcile(active_grace_seconds=600.0, delivery_grace_seconds={DAY!r})
print("applied", flush=True)
ledger.close()
"""


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory, long_campaign: bool) -> Path:
    if not long_campaign:
        pytest.skip("long campaign: run with --run-slow")
    where = tmp_path_factory.mktemp("large")
    where.chmod(0o700)
    path = where / "large.db"
    make_peer_ledger(path, TASKS)
    Ledger(path).close()  # migrated once, outside the kills
    assert path.stat().st_size > BULK_IN_MEMORY_MAX
    return path


def _killed_apply(source: Path, target: Path, delay: float | None) -> tuple[bool, float]:
    """Applies reconcile to a copy, killed `delay` seconds after the open
    (never, for None). Returns whether the call had returned first, and
    the seconds from the open to the process's end."""
    shutil.copyfile(source, target)
    target.chmod(0o600)
    with subprocess.Popen(
        [sys.executable, "-c", APPLY, str(target)], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "open"
        started = time.monotonic()
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        ended = time.monotonic() - started
        return "applied" in proc.stdout.read(), ended


def test_a_killed_large_apply_is_all_or_nothing(large: Path, figures) -> None:
    with Ledger(large) as ledger:
        events_before = ledger.stats()["event_count"]
    whole = (TIMED_OUT, FAILED, TIMED_OUT + FAILED)
    # One apply left alone times the call on this machine; the kills then
    # fall anywhere in it, the commit and its checkpoint included.
    untouched = large.with_name("untouched.db")
    returned, seconds = _killed_apply(large, untouched, None)
    assert returned
    for leftover in untouched.parent.glob(f"{untouched.name}*"):
        leftover.unlink()
    rng = random.Random(20261203)
    rolled_back = 0
    for kill in range(KILLS):
        target = large.with_name(f"kill-{kill}.db")
        returned, _ = _killed_apply(large, target, rng.uniform(0.0, 1.1 * seconds))
        with Ledger(target) as ledger:
            stats = ledger.stats()
            report = ledger.doctor()
        found = (
            stats["by_status"]["timed_out"],
            stats["by_delivery"]["failed"],
            stats["event_count"] - events_before,
        )
        figures.record(
            "large_apply_crash",
            kills=1,
            tasks=TASKS if kill == 0 else 0,
            returned=int(returned),
            applied=int(found == whole),
            rolled_back=int(found == (0, 0, 0)),
            unhealthy=int(not report["healthy"]),
        )
        assert report["healthy"], report
        assert found in {(0, 0, 0), whole}, (kill, found)
        assert found == whole or not returned
        rolled_back += found == (0, 0, 0)
        for leftover in target.parent.glob(f"{target.name}*"):
            leftover.unlink()
    # Kills before the commit are the case in point: their frames were in
    # the WAL, and had to count for nothing.
    assert rolled_back > 0
