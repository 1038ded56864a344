"""The million-task figures, each step in its own process so wall time and
peak memory (ru_maxrss) are its own. Run by hand:

    python -m benches.run_1m [N_TASKS] [WORK_DIR]

Prints one JSON object: generation, migration, reconcile apply, the
read-only dry run of the whole file (cap raised to 1024 MiB), doctor beside
a bare quick_check and the read-only page walk, the physical floor of the
apply (one plain UPDATE of the same rows on a copy), and a purge of N fully
closed tasks (longest batch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STEP = r"""
import json, resource, sys, time, sqlite3, contextlib
sys.path.insert(0, {root!r})
from benches.ledgers import NOW, DAY, copy_ledger, make_peer_ledger, raw_set_based_timeout
from taskwarden import Ledger
start = time.perf_counter()
extra = {{}}
{body}
wall = time.perf_counter() - start
print(json.dumps({{"wall_s": round(wall, 3),
                  "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  **extra}}))
"""


def step(body: str) -> dict:
    code = STEP.format(root=str(Path(__file__).resolve().parents[1]), body=body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    work = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(tempfile.mkdtemp(prefix="tw-1m-"))
    work.mkdir(mode=0o700, exist_ok=True)
    os.chmod(work, 0o700)
    peer, ours, closed = work / "peer.db", work / "ours.db", work / "closed.db"
    grace = "active_grace_seconds=600.0, delivery_grace_seconds=DAY"
    figures: dict[str, dict] = {"n_tasks": {"value": n}}
    figures["generate_peer_v2"] = step(f"make_peer_ledger({str(peer)!r}, {n})")
    figures["migrate_to_v3"] = step(
        f"copy_ledger({str(peer)!r}, {str(ours)!r}); Ledger({str(ours)!r}).close()"
    )
    figures["file_mib"] = {"value": round(ours.stat().st_size / 2**20, 1)}
    figures["dry_run_read_only"] = step(
        f"r = Ledger({str(ours)!r}, read_only=True, snapshot_max_bytes=1024 * 2**20,"
        f" clock=lambda: NOW).reconcile(dry_run=True, {grace}); extra['report'] = r"
    )
    quick_checks = {"quick_check": f"file:{ours}", "read_only_page_walk": f"file:{ours}?mode=ro"}
    for name, uri in quick_checks.items():
        figures[name] = step(
            f"c = sqlite3.connect({uri!r}, uri=True);"
            " extra['ok'] = c.execute('PRAGMA quick_check').fetchall() == [('ok',)]; c.close()"
        )
    figures["doctor"] = step(f"r = Ledger({str(ours)!r}).doctor(); extra['healthy'] = r['healthy']")
    raw = work / "raw.db"
    figures["raw_set_based_update"] = step(
        f"copy_ledger({str(ours)!r}, {str(raw)!r}); t = time.perf_counter();"
        f" extra['timed_out'] = raw_set_based_timeout({str(raw)!r});"
        " extra['update_only_s'] = round(time.perf_counter() - t, 3)"
    )
    raw.unlink()
    figures["reconcile_apply"] = step(
        f"l = Ledger({str(ours)!r}, clock=lambda: NOW); t = time.perf_counter();"
        f" r = l.reconcile({grace}); extra['apply_only_s'] = round(time.perf_counter() - t, 3);"
        " extra['timed_out'] = r['tasks_timed_out']; l.close()"
    )
    figures["generate_closed"] = step(
        f"make_peer_ledger({str(closed)!r}, {n}, all_closed=True); Ledger({str(closed)!r}).close()"
    )
    figures["purge_all_closed"] = step(
        f"l = Ledger({str(closed)!r}, clock=lambda: NOW); r = l.purge(older_than_seconds=3600);"
        " extra.update(r); l.close()"
    )
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
