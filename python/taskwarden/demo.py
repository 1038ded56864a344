"""``taskwarden demo``: a service restarts and leaves lies behind.

A fresh ledger is filled with what a crashed worker fleet typically leaves:
tasks still marked running (past their deadline, silent, or alive), a task
still queued, and finished tasks whose delivery was never confirmed. The
demo previews the reconcile (read-only), applies it, and applies it again to
show that nothing changes the second time.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from . import _core
from ._handle import text_path
from .errors import InvalidInput, StateConflict
from .ledger import Ledger

__all__ = ["ACTIVE_GRACE", "DELIVERY_GRACE", "explain", "run_demo"]

ACTIVE_GRACE = 600.0
DELIVERY_GRACE = 86_400.0

HOUR = 3600.0
DAY = 86_400.0


class _ScriptClock:
    """The demo's own clock, moved by hand so the scenario is reproducible."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _populate(ledger: Ledger, clock: _ScriptClock, now: float) -> None:
    """The state a crash leaves: written at times in the past."""
    clock.now = now - 2 * DAY
    answered = ledger.create_task()
    ledger.start_task(answered.id)
    ledger.close_task(answered.id, "succeeded", code="worker_completed")
    child = ledger.create_task(parent_id=answered.id, delivery_required=False)
    ledger.close_task(child.id, "succeeded", code="completed")

    clock.now = now - DAY
    ledger.create_task()  # queued: never started, never timed out

    clock.now = now - HOUR
    late = ledger.create_task(timeout_seconds=120)
    ledger.start_task(late.id)  # its deadline passed long ago
    silent = ledger.create_task()
    ledger.start_task(silent.id)  # no heartbeat for an hour

    clock.now = now - 300
    receipt = ledger.create_task()
    ledger.close_task(receipt.id, "succeeded", code="worker_completed")  # delivery still in grace
    confirmed = ledger.create_task()
    ledger.close_task(confirmed.id, "succeeded", code="worker_completed")
    ledger.set_delivery(confirmed.id, "delivered", code="transport_acknowledged")

    clock.now = now - 60
    alive = ledger.create_task(timeout_seconds=900)
    ledger.start_task(alive.id)
    ledger.heartbeat(alive.id)  # alive: a minute ago


def run_demo(
    db: str | Path | None = None,
    *,
    busy_timeout_ms: int = 5000,
    allow_external_acl: bool = False,
) -> dict[str, Any]:
    """Build the scenario and return the preview, apply and recheck reports.

    ``db`` must not exist yet: the demo reconciles everything in its ledger,
    and a real ledger's tasks are not the demo's to time out. It is built
    under a temporary name beside ``db`` and given its name only when the
    recheck is done, by a link that refuses an existing file: an
    interrupted demo leaves nothing at ``db``, and of two demos given one
    path, one gets it. The keywords are the ledger's own, for each open.
    """
    options: dict[str, Any] = {
        "busy_timeout_ms": busy_timeout_ms,
        "allow_external_acl": allow_external_acl,
    }
    if db is None:
        with tempfile.TemporaryDirectory(prefix="taskwarden-demo-") as tmp:
            return _run(Path(tmp) / "private" / "demo.db", options)
    # The name as an open resolves it (refused as an open refuses it,
    # before anything is made): the temporary name goes in the very
    # directory the link is made in, whatever links and `..` the path has.
    final = _core.resolve_path(text_path(db))
    if any(os.path.lexists(f"{final}{s}") for s in ("", "-wal", "-journal")):
        raise InvalidInput(_EXISTS)
    # Short and of fixed length, so any name the ledger takes fits it too.
    building = final.with_name(f".tw-demo-{uuid.uuid4().hex[:16]}")
    try:
        reports = _run(building, options)
        _give_name(building, final)
        return reports
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(OSError):  # never in place of the real error
                os.unlink(f"{building}{suffix}")
        _sync_folder(final.parent)


def _sync_folder(folder: Path) -> None:
    """Makes the link and the unlinks survive a power cut: the ledger at
    its name, the temporary name gone (a file left with both names is
    refused by every open). A folder some file system cannot sync is
    left as it is, as the ledger itself does."""
    with contextlib.suppress(OSError):
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


_EXISTS = "the demo builds a new ledger; that path already exists"


def _run(path: Path, options: dict[str, Any]) -> dict[str, Any]:
    now = time.time()
    clock = _ScriptClock(now)
    with Ledger(path, clock=clock, **options) as ledger:
        _populate(ledger, clock, now)
        clock.now = now
    with Ledger(path, clock=clock, read_only=True, **options) as reader:
        preview = _reconcile(reader, dry_run=True)
    with Ledger(path, clock=clock, **options) as ledger:
        applied = _reconcile(ledger)
        recheck = _reconcile(ledger)
    return {"preview": preview, "apply": applied, "recheck": recheck}


def _give_name(built: Path, final: Path) -> None:
    """Links the finished ledger in at ``final`` (never replacing a file
    that appeared there meanwhile). Its last handle was writable, so its
    last close folded the WAL back into the file: the file is the ledger."""
    if os.path.lexists(f"{built}-wal"):
        raise StateConflict("the demo's ledger was not closed cleanly")
    try:
        os.link(built, final)
    except FileExistsError:
        raise InvalidInput(_EXISTS) from None
    except OSError:  # a file system without hard links: checked, then moved
        if os.path.lexists(final):
            raise InvalidInput(_EXISTS) from None
        os.rename(built, final)


def _reconcile(ledger: Ledger, *, dry_run: bool = False) -> dict[str, Any]:
    return ledger.reconcile(
        active_grace_seconds=ACTIVE_GRACE, delivery_grace_seconds=DELIVERY_GRACE, dry_run=dry_run
    )


def explain(reports: dict[str, Any]) -> list[str]:
    """The three reports in plain words."""
    p, a, r = reports["preview"], reports["apply"], reports["recheck"]
    closed_again = r["deliveries_failed"] + r["deliveries_not_applicable"]
    return [
        "A worker fleet crashed. Its ledger still says some tasks are running.",
        "",
        "Preview (read-only, nothing written): "
        f"{_count(p['active_examined'], 'active task', 'active tasks')} examined, "
        f"{p['tasks_timed_out']} would time out, {p['fresh_active_retained']} kept; "
        f"{_count(p['pending_delivery_examined'], 'pending delivery', 'pending deliveries')} "
        "examined, "
        f"{p['deliveries_failed']} would fail, {p['deliveries_not_applicable']} would close as "
        f"not applicable, {p['pending_delivery_retained']} kept.",
        f"Apply: {_count(a['tasks_timed_out'], 'running task', 'running tasks')} timed out "
        f"(past their deadline or silent for over {ACTIVE_GRACE:.0f} s); "
        f"{_count(a['deliveries_failed'], 'delivery', 'deliveries')} marked failed and "
        f"{_count(a['deliveries_not_applicable'], 'internal one', 'internal ones')} "
        "not applicable after "
        f"{DELIVERY_GRACE / HOUR:.0f} h without a receipt. The task that is still alive and the "
        "queued one were left alone, and no success was guessed. (These graces are the "
        "demo's: `taskwarden reconcile` waits 600 s for both unless told otherwise, with "
        "--active-grace-seconds and --delivery-grace-seconds.)",
        f"Recheck: {r['tasks_timed_out']} timed out, "
        f"{_count(closed_again, 'delivery', 'deliveries')} closed: "
        "applying again changes nothing.",
        "",
        *_side_by_side(reports),
    ]


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _side_by_side(reports: dict[str, Any]) -> list[str]:
    keys = [k for k in reports["preview"] if k not in ("dry_run", "applied")]
    width = max(len(k) for k in keys)
    lines = [f"{'':{width}}  {'preview':>8}  {'apply':>8}  {'recheck':>8}"]
    for key in keys:
        cells = "  ".join(f"{reports[r][key]:>8}" for r in ("preview", "apply", "recheck"))
        lines.append(f"{key:{width}}  {cells}")
    return lines
