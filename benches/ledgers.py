"""Fast generation of large ledgers in task-state-guard 0.1.0's v2 format.

The peer creates the empty schema; every row is then made by SQLite itself
from a recursive CTE, so a million tasks take seconds, not a Python loop
over the public API. The mix is what a crashed fleet leaves behind:

- 50% running and silent for an hour (reconcile times them out),
- 10% running and fresh, 20% queued,
- 10% succeeded two days ago with a delivery still pending (it fails),
- 10% succeeded and delivered.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from pathlib import Path

NOW = 1_800_000_000.0
HOUR = 3600.0
DAY = 86_400.0

UUID_SQL = (
    "lower(substr(h,1,8)||'-'||substr(h,9,4)||'-4'||substr(h,14,3)||'-a'||substr(h,18,3)"
    "||'-'||substr(h,21,12))"
)


def make_peer_ledger(
    path: Path, n_tasks: int, *, all_closed: bool = False, chain_length: int = 1
) -> None:
    """A task-state-guard v2 file holding ``n_tasks`` tasks and their events
    (with ``all_closed``: every task succeeded and delivered two days ago).
    With ``chain_length`` above 1, the tasks form parent chains that long,
    each task the child of the one created before it."""
    import task_state_guard

    task_state_guard.Ledger(path)  # the peer writes its own schema
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("BEGIN")
        conn.execute(
            f"""
            WITH RECURSIVE seq(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM seq WHERE k + 1 < ?),
            rows AS (SELECT k, CASE WHEN :closed THEN 9 ELSE k % 10 END AS kind,
                            hex(randomblob(16)) AS h FROM seq)
            INSERT INTO tasks (id, parent_id, status, delivery_status, delivery_required,
                payload_hash, timeout_seconds, created_at, started_at, updated_at, ended_at,
                deadline_at, delivery_updated_at, terminal_code, delivery_code, version)
            SELECT {UUID_SQL}, NULL,
                CASE WHEN kind < 6 THEN 'running' WHEN kind < 8 THEN 'queued' ELSE 'succeeded' END,
                CASE WHEN kind = 9 THEN 'delivered' ELSE 'pending' END,
                1, NULL, NULL,
                :now - 3 * :day + k * 1e-6,
                CASE WHEN kind < 5 THEN :now - :hour WHEN kind = 5 THEN :now - 10
                     WHEN kind >= 8 THEN :now - 2.5 * :day END,
                CASE WHEN kind < 5 THEN :now - :hour WHEN kind = 5 THEN :now - 10
                     WHEN kind >= 8 THEN :now - 2 * :day ELSE :now - 3 * :day + k * 1e-6 END,
                CASE WHEN kind >= 8 THEN :now - 2 * :day END,
                NULL,
                CASE WHEN kind = 9 THEN :now - 2 * :day ELSE :now - 3 * :day + k * 1e-6 END,
                CASE WHEN kind >= 8 THEN 'worker_completed' END,
                CASE WHEN kind = 9 THEN 'transport_acknowledged' END,
                CASE WHEN kind < 6 THEN 1 WHEN kind < 8 THEN 0 WHEN kind = 8 THEN 2 ELSE 3 END
            FROM rows
            """.replace(":now", repr(NOW))
            .replace(":day", repr(DAY))
            .replace(":hour", repr(HOUR))
            .replace(":closed", "1" if all_closed else "0"),
            (n_tasks,),
        )
        conn.execute(
            "UPDATE tasks SET parent_id = (SELECT id FROM tasks p WHERE p.rowid = tasks.rowid - 1) "
            "WHERE (rowid - 1) % ? <> 0",
            (chain_length,),
        )
        conn.execute(
            """INSERT INTO task_events
            (task_id, event_kind, from_value, to_value, occurred_at, code)
            SELECT id, 'created', NULL, 'queued', created_at, 'created' FROM tasks
            UNION ALL
            SELECT id, 'task_transition', 'queued', 'running', started_at, 'started'
              FROM tasks WHERE started_at IS NOT NULL
            UNION ALL
            SELECT id, 'task_transition', 'running', status, ended_at, terminal_code
              FROM tasks WHERE ended_at IS NOT NULL
            UNION ALL
            SELECT id, 'delivery_transition', 'pending', delivery_status, delivery_updated_at,
                   delivery_code FROM tasks WHERE delivery_status <> 'pending'
            ORDER BY 1"""
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    os.chmod(path, 0o600)


def copy_ledger(src: Path, dst: Path) -> Path:
    """A private copy of a cleanly closed ledger."""
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o600)
    return dst


def raw_set_based_timeout(path: Path) -> int:
    """The physical floor of a reconcile apply: the same stale rows timed
    out by one plain-SQLite UPDATE, without events or checks. Returns the
    rows changed."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        changed = conn.execute(
            "UPDATE tasks SET status = 'timed_out', updated_at = ?1, ended_at = ?1, "
            "terminal_code = 'restart_stale', version = version + 1 "
            "WHERE status = 'running' AND updated_at <= ?2",
            (NOW, NOW - 600.0),
        ).rowcount
        conn.execute("COMMIT")
        return changed
