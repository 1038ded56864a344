"""Probe damaged ledger files, one case after another, in a child process.

Run as a script: ``python _corrupt_probe.py CASE_DIR...``. Each case directory
holds ``ledger.db`` (and maybe ``ledger.db-wal``). For each case it prints
``start N`` and then one JSON line:

- ``sqlite``: what the system SQLite (``immutable=1``, nothing touched) sees:
  ``quick_check`` and ``integrity_check`` results (or the error) and a SHA-256
  of each table's rows, so the parent can tell whether the flip hit live data;
- ``read_only`` and ``writable``: what taskwarden answers, opening the file
  read-only and then writable, and running ``doctor()``: ``{"healthy": bool}``
  or ``{"error": "<LedgerError subclass>"}``; any other exception (including
  a Rust panic) is reported as ``{"bad": ...}``.

A crash or a hang shows as a missing JSON line after ``start N``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from taskwarden import Ledger
from taskwarden.errors import LedgerError

TABLES = ("sqlite_master", "schema_meta", "tasks", "task_events")


def _step(view: dict[str, Any], key: str, run: Any) -> None:
    try:
        view[key] = run()
    except Exception as exc:  # the system SQLite could not do this step
        view[key] = f"error: {type(exc).__name__}"


def system_view(db: Path) -> dict[str, Any]:
    """The damage as seen by the system SQLite, without touching the file:
    ``quick_check`` and ``integrity_check`` (a list of messages, or
    ``"error: ..."`` when SQLite gave up), and each table's row digest (or
    ``"error: ..."``); ``"open"`` is an error when the file cannot be opened."""
    view: dict[str, Any] = {}
    try:
        uri = f"file:{db}?immutable=1"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            conn.text_factory = bytes  # a flipped byte may make text invalid UTF-8

            def pragma(name: str) -> list[str]:
                return [r[0].decode(errors="replace") for r in conn.execute(f"PRAGMA {name}")]

            def digest(table: str) -> str:
                rows = sorted(repr(r) for r in conn.execute(f'SELECT * FROM "{table}"'))
                return hashlib.sha256("\n".join(rows).encode()).hexdigest()

            _step(view, "quick_check", lambda: pragma("quick_check"))
            _step(view, "integrity_check", lambda: pragma("integrity_check"))
            for table in TABLES:
                _step(view, table, lambda t=table: digest(t))
    except Exception as exc:
        view["open"] = f"error: {type(exc).__name__}"
    return view


def taskwarden_view(db: Path, read_only: bool) -> dict[str, Any]:
    try:
        with Ledger(db, read_only=read_only, busy_timeout_ms=2000) as ledger:
            report = ledger.doctor()
        return {"healthy": report["healthy"]}
    except LedgerError as exc:
        return {"error": type(exc).__name__}
    except BaseException as exc:  # a panic is a BaseException
        return {"bad": f"{type(exc).__module__}.{type(exc).__name__}: {exc}"[:300]}


def main(case_dirs: list[str]) -> int:
    for number, case in enumerate(case_dirs):
        db = Path(case) / "ledger.db"
        print(f"start {number}", flush=True)
        result: dict[str, Any] = {"case": number}
        if not (Path(case) / "ledger.db-wal").exists():
            result["sqlite"] = system_view(db)
        result["read_only"] = taskwarden_view(db, read_only=True)
        result["writable"] = taskwarden_view(db, read_only=False)
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
