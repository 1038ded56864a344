"""A process that lives for days keeps its descriptors bounded.

Fleet supervisors keep one handle open while jobs open and close their own
on the same file. Each closed handle's WAL descriptor used to wait in the
sync helper's queue until that handle's own sync came round: hundreds at
once, up to the process's descriptor limit.
"""

from __future__ import annotations

from .conftest import run_python

WAL_DESCRIPTORS = r"""
import os, sys
from taskwarden import Ledger
path = sys.argv[1]
def wal_descriptors():
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == path + "-wal"
        except OSError:
            pass
    return count
supervisor = Ledger(path)
supervisor.create_task()
peak = 0
for _ in range(1500):
    with Ledger(path) as job:
        job.create_task()
    peak = max(peak, wal_descriptors())
print(peak)
"""


def test_short_lived_handles_beside_a_long_lived_one_keep_wal_descriptors_bounded(
    tmp_path,
) -> None:
    tmp_path.chmod(0o700)
    (peak,) = [line for line in run_python(WAL_DESCRIPTORS, str(tmp_path / "l.db")) if line]
    # The supervisor's two (SQLite's and the ledger's), one job's two, and
    # at most one queued and one being synced by the helper.
    assert int(peak) <= 6, peak
