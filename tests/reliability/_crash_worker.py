"""A crash-campaign worker: mixed ledger operations until it is SIGKILLed.

Run as a script: ``python _crash_worker.py DB JOURNAL WORKER SEED DURABILITY [LOST...]``.

After every call that RETURNED it appends one JSON line to its own journal
and makes it durable (flush + fsync) before the next call, so the parent
knows which writes were committed before the kill. A call that raised a
legitimate ``StateConflict`` (a fenced write lost to reconcile, or a
delivery already closed by reconcile) or ``LedgerBusy`` is journalled as
such and proves nothing. Any other exception is journalled as
``unexpected`` and the worker exits with code 3.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback
import uuid
from typing import Any

from taskwarden import Ledger
from taskwarden.errors import LedgerBusy, StateConflict, TaskNotFound

DURABLE = "keep"  # never purged: every create must survive forever
SCRATCH = "scratch"  # purged by the workers once fully closed
MAX_SECONDS = 60.0  # a worker the parent forgot to kill stops on its own


class Journal:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, **record: Any) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        os.write(self._fd, line)  # unbuffered: the "flush"
        os.fsync(self._fd)


class _Gone(Exception):
    """A scratch task this worker held was purged (reconcile closed it first)."""


def _task_fields(task: Any) -> dict[str, Any]:
    return {"id": task.id, "v": task.version, "status": str(task.status)}


def main(argv: list[str]) -> int:
    db, journal_path, worker, seed, durability, *lost = argv
    rng = random.Random(int(seed))
    journal = Journal(journal_path)
    mine: dict[str, tuple[int, str]] = {}  # claimed running tasks -> (attempt, tenant)
    closed: dict[str, tuple[bool, str]] = {}  # closed tasks -> (delivery_required, tenant)
    durable_ids: list[str] = []
    deadline = time.monotonic() + MAX_SECONDS
    print("ready", flush=True)
    ledger = Ledger(db, durability=durability, busy_timeout_ms=5000)
    journal.write(op="open")
    try:
        while time.monotonic() < deadline:
            op = rng.choices(
                [
                    "create",
                    "claim_next",
                    "charge",
                    "heartbeat",
                    "close",
                    "release",
                    "set_delivery",
                    "reconcile",
                    "purge",
                ],
                weights=[22, 14, 22, 8, 10, 3, 8, 2, 2],
            )[0]
            try:
                _step(op, rng, ledger, journal, worker, mine, closed, durable_ids, lost)
            except LedgerBusy:
                journal.write(op="busy", call=op)
            except StateConflict:
                journal.write(op="conflict", call=op)
            except _Gone:
                journal.write(op="gone", call=op)
    except BaseException as exc:
        journal.write(op="unexpected", type=type(exc).__name__, trace=traceback.format_exc())
        return 3
    finally:
        ledger.close()
    return 0


def _step(
    op: str,
    rng: random.Random,
    ledger: Ledger,
    journal: Journal,
    worker: str,
    mine: dict[str, tuple[int, str]],
    closed: dict[str, tuple[bool, str]],
    durable_ids: list[str],
    lost: list[str],
) -> None:
    if op == "create":
        tenant = DURABLE if rng.random() < 0.6 else SCRATCH
        parent = None
        if tenant == DURABLE and durable_ids and rng.random() < 0.3:
            parent = rng.choice(durable_ids)
        required = rng.random() < 0.7
        task = ledger.create_task(
            task_id=str(uuid.uuid4()),
            parent_id=parent,
            tenant=tenant,
            delivery_required=required,
            llm_calls_budget=rng.choice([3, 5, 8, None]),
            token_budget=rng.choice([None, 500, 2000]),
            cost_budget_micros=rng.choice([None, 10_000]),
            max_attempts=rng.choice([1, 2, 3]),
        )
        if tenant == DURABLE:
            durable_ids.append(task.id)
        journal.write(op="create", tenant=tenant, parent=parent, **_task_fields(task))
        return
    if op == "claim_next":
        tasks = ledger.claim_next(worker, limit=rng.randint(1, 3))
        for task in tasks:
            mine[task.id] = (task.attempt_count, task.tenant or "")
        journal.write(
            op="claim",
            worker=worker,
            tasks=[
                [t.id, t.attempt_count, t.version, t.owner, str(t.status), t.tenant] for t in tasks
            ],
        )
        return
    if op in ("charge", "heartbeat", "close", "release") and mine:
        task_id = rng.choice(list(mine))
        attempt, tenant = mine[task_id]
        try:
            _owned_step(op, rng, ledger, journal, worker, task_id, attempt, mine, closed)
        except TaskNotFound:
            # Only a scratch task can vanish: timed out by reconcile, its
            # delivery expired, then purged by another worker.
            if tenant != SCRATCH:
                raise
            mine.pop(task_id, None)
            raise _Gone() from None
        return
    if op == "set_delivery" and closed:
        task_id = rng.choice(list(closed))
        required, tenant = closed.pop(task_id)
        status = rng.choice(["delivered", "failed"] if required else ["not_applicable", "failed"])
        try:
            task = ledger.set_delivery(task_id, status)
        except TaskNotFound:
            if tenant != SCRATCH:
                raise
            raise _Gone() from None
        journal.write(op="delivery", delivery=str(task.delivery_status), **_task_fields(task))
        return
    if op == "reconcile":
        report = ledger.reconcile(
            active_grace_seconds=rng.uniform(2.0, 6.0),
            delivery_grace_seconds=rng.uniform(0.5, 3.0),
            worker_lost=rng.choice(lost) if lost and rng.random() < 0.5 else None,
        )
        journal.write(op="reconcile", timed_out=report["tasks_timed_out"])
        return
    if op == "purge":
        report = ledger.purge(older_than_seconds=rng.uniform(0.0, 2.0), tenant=SCRATCH)
        journal.write(op="purge", purged=report["tasks_purged"])
        return


def _owned_step(
    op: str,
    rng: random.Random,
    ledger: Ledger,
    journal: Journal,
    worker: str,
    task_id: str,
    attempt: int,
    mine: dict[str, tuple[int, str]],
    closed: dict[str, tuple[bool, str]],
) -> None:
    if op == "charge":
        result = ledger.charge(
            task_id,
            calls=1,
            tokens=rng.choice([0, 10, 100, 400]),
            cost_micros=rng.choice([0, 0, 1000, 4000]),
            worker=worker,
            attempt=attempt,
        )
        if result.escalated or not result.allowed:
            mine.pop(task_id)
        journal.write(
            op="charge",
            id=task_id,
            allowed=result.allowed,
            escalated=result.escalated,
            calls=result.calls_used,
            tokens=result.tokens_used,
            cost=result.cost_used_micros,
        )
        return
    if op == "heartbeat":
        try:
            task = ledger.heartbeat(task_id, worker=worker, attempt=attempt)
        except StateConflict:
            mine.pop(task_id)  # reconcile timed it out: the claim is gone
            raise
        journal.write(op="heartbeat", **_task_fields(task))
        return
    mine.pop(task_id)
    if op == "release":
        task = ledger.release(task_id, worker)
        journal.write(op="release", **_task_fields(task))
        return
    status = rng.choice(["succeeded", "succeeded", "failed"])
    task = ledger.close_task(task_id, status, worker=worker, attempt=attempt)
    closed[task.id] = (task.delivery_required, task.tenant or "")
    journal.write(op="close", **_task_fields(task))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
