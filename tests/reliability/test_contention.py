"""Contention campaign (SPEC §2.3, §2.4, §4): 16 processes hammer one ledger
with ``busy_timeout_ms=5``.

Fourteen workers claim, heartbeat, charge (fenced by worker and attempt),
close and release; two saboteurs cancel and fail random tasks and declare
random workers lost. The only exceptions a caller may ever see:

- ``LedgerBusy`` from any call (the lock was held longer than 5 ms);
- ``StateConflict`` only for a race the caller legitimately lost, checked by
  re-reading the task right after the refusal (a later state can never
  restore the earlier one, so the check is exact):

  * fenced ``heartbeat``/``close_task`` and ``release`` by the owner: the
    claim must be gone (not running, another owner or a newer attempt);
  * ``cancel``: the task is terminal with another status than cancelled;
  * unfenced ``close_task(..., "failed")``: the task is terminal with another
    status than failed, or parked (from parked only ``cancelled`` is allowed).

``create_task``, ``claim_next``, ``charge``, ``reconcile`` and reads never
raise ``StateConflict``; ``sqlite3.Error`` or any other type never escapes.
Afterwards the ledger is healthy and its counters equal exactly what the
callers were told: every allowed charge is in the counters (a ``LedgerBusy``
charge wrote nothing), every claim's attempt is unique, every returned close
holds, parents hold the sum of their children, no limit is exceeded.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taskwarden import Ledger, Task
from taskwarden.errors import ClaimLost, LedgerBusy, StateConflict

from ..conftest import report_outcome

SPAWN = multiprocessing.get_context("spawn")
PROCESSES, SABOTEURS = 16, 2
BUSY_MS = 5
ROOTS, CHILDREN_PER_ROOT = 20, 10
ROOT_CALLS, CHILD_CALLS = 30, 5
SHORT_SECONDS, LONG_SECONDS = 8.0, 150.0
TERMINAL = {"succeeded", "failed", "timed_out", "cancelled"}


class _Calls:
    """Runs ledger calls, retrying on ``LedgerBusy`` and sorting every outcome."""

    def __init__(self, ledger: Ledger, rng: random.Random) -> None:
        self.ledger = ledger
        self.rng = rng
        self.busy: Counter[str] = Counter()
        self.conflicts: Counter[str] = Counter()
        self.bad: list[str] = []  # exceptions a caller must never see

    def once(self, name: str, call: Callable[[], Any]) -> tuple[str, Any]:
        try:
            return "ok", call()
        except LedgerBusy:
            self.busy[name] += 1
            return "busy", None
        except StateConflict as exc:
            if type(exc) not in (StateConflict, ClaimLost):
                self.bad.append(f"{name}: {type(exc).__name__} (a StateConflict subclass)")
            return "conflict", exc
        except Exception as exc:
            self.bad.append(f"{name}: {type(exc).__module__}.{type(exc).__name__}: {exc}")
            return "bad", exc

    def retry(self, name: str, call: Callable[[], Any]) -> tuple[str, Any]:
        while True:
            outcome, value = self.once(name, call)
            if outcome != "busy":
                return outcome, value
            time.sleep(self.rng.random() / 1000)

    def read(self, task_id: str) -> Task:
        outcome, task = self.retry("get_task", lambda: self.ledger.get_task(task_id))
        if outcome != "ok":
            raise AssertionError(f"get_task: {outcome}")
        return task

    def conflict(self, name: str, legitimate: bool, detail: str) -> None:
        self.conflicts[name] += 1
        if not legitimate:
            self.bad.append(f"{name}: StateConflict although {detail}")


def _worker(index: int, results: Any, barrier: Any, path: str, seconds: float) -> None:
    def body() -> dict[str, Any]:
        name = f"worker-{index}"
        rng = random.Random(index)
        log: dict[str, list[Any]] = {"claims": [], "charges": [], "closes": [], "releases": []}
        with Ledger(path, busy_timeout_ms=BUSY_MS) as ledger:
            calls = _Calls(ledger, rng)
            barrier.wait(120)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                outcome, batch = calls.retry(
                    "claim_next",
                    lambda: ledger.claim_next(name, tenant="work", limit=rng.randint(1, 2)),
                )
                if outcome != "ok":
                    calls.bad.append(f"claim_next: {outcome}")
                    continue
                if not batch:
                    break
                for task in batch:
                    log["claims"].append([task.id, task.attempt_count, task.owner, task.status])
                    _work_on(calls, rng, name, task, log)
        return {"log": log, "busy": calls.busy, "conflicts": calls.conflicts, "bad": calls.bad}

    report_outcome(results, index, body)


def _work_on(
    calls: _Calls, rng: random.Random, name: str, task: Task, log: dict[str, list[Any]]
) -> None:
    ledger, task_id, attempt = calls.ledger, task.id, task.attempt_count

    def claim_gone() -> tuple[bool, str]:
        now = calls.read(task_id)
        held = now.status == "running" and now.owner == name and now.attempt_count == attempt
        return not held, f"the claim still holds ({now.status})"

    for _ in range(rng.randint(0, 7)):
        outcome, charge = calls.retry(
            "charge",
            lambda: ledger.charge(task_id, calls=1, tokens=7, worker=name, attempt=attempt),
        )
        if outcome == "conflict":
            calls.conflict("charge", False, "charge never raises for state reasons")
        if outcome != "ok":
            continue
        if charge.allowed:
            log["charges"].append(task_id)
        if not charge.allowed:
            return
        if rng.random() < 0.2:
            outcome, _ = calls.retry(
                "heartbeat", lambda: ledger.heartbeat(task_id, worker=name, attempt=attempt)
            )
            if outcome == "conflict":
                calls.conflict("heartbeat", *claim_gone())
                return
    if rng.random() < 0.15:
        outcome, released = calls.retry("release", lambda: ledger.release(task_id, name))
        if outcome == "ok":
            log["releases"].append([task_id, released.status])
        elif outcome == "conflict":
            calls.conflict("release", *claim_gone())
        return
    status = rng.choice(["succeeded", "failed"])
    outcome, closed = calls.retry(
        "close_task",
        lambda: ledger.close_task(task_id, status, worker=name, attempt=attempt),
    )
    if outcome == "ok":
        log["closes"].append([task_id, closed.status])
    elif outcome == "conflict":
        calls.conflict("close_task", *claim_gone())


def _saboteur(
    index: int, results: Any, barrier: Any, path: str, seconds: float, ids: list[str]
) -> None:
    def body() -> dict[str, Any]:
        rng = random.Random(1000 + index)
        log: dict[str, list[Any]] = {"cancels": [], "fails": []}
        with Ledger(path, busy_timeout_ms=BUSY_MS) as ledger:
            calls = _Calls(ledger, rng)
            barrier.wait(120)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(0.0, 0.01))
                task_id = rng.choice(ids)
                kind = rng.random()
                if kind < 0.45:
                    outcome, task = calls.retry("cancel", lambda t=task_id: ledger.cancel(t))
                    if outcome == "ok":
                        log["cancels"].append([task_id, task.status])
                    elif outcome == "conflict":
                        now = calls.read(task_id).status
                        calls.conflict(
                            "cancel", now in TERMINAL and now != "cancelled", f"it is {now}"
                        )
                elif kind < 0.9:
                    outcome, task = calls.retry(
                        "close_task", lambda t=task_id: ledger.close_task(t, "failed")
                    )
                    if outcome == "ok":
                        log["fails"].append([task_id, task.status])
                    elif outcome == "conflict":
                        now = calls.read(task_id).status
                        legit = (now in TERMINAL and now != "failed") or now in (
                            "blocked",
                            "escalated",
                        )
                        calls.conflict("close_task", legit, f"it is {now}")
                else:
                    lost = f"worker-{rng.randrange(PROCESSES)}"
                    calls.retry(
                        "reconcile",
                        lambda lost=lost: ledger.reconcile(
                            active_grace_seconds=600, delivery_grace_seconds=600, worker_lost=lost
                        ),
                    )
        return {"log": log, "busy": calls.busy, "conflicts": calls.conflicts, "bad": calls.bad}

    report_outcome(results, index, body)


def _seed(path: Path, tasks: int) -> tuple[list[str], list[str]]:
    roots, children = [], []
    with Ledger(path) as ledger:
        for _ in range(ROOTS):
            roots.append(ledger.create_task(tenant="roots", llm_calls_budget=ROOT_CALLS).id)
        for i in range(tasks):
            children.append(
                ledger.create_task(
                    tenant="work",
                    parent_id=roots[i % ROOTS],
                    llm_calls_budget=CHILD_CALLS,
                    max_attempts=2,
                ).id
            )
    return roots, children


def test_sixteen_processes_see_only_busy_or_legitimate_conflicts(
    tmp_path: Path, long_campaign: bool, figures: Any
) -> None:
    path = tmp_path / "ledger.db"
    seconds = LONG_SECONDS if long_campaign else SHORT_SECONDS
    roots, children = _seed(path, ROOTS * CHILDREN_PER_ROOT * (20 if long_campaign else 2))
    results = SPAWN.Queue()
    barrier = SPAWN.Barrier(PROCESSES)
    procs = [
        SPAWN.Process(target=_worker, args=(i, results, barrier, str(path), seconds))
        for i in range(PROCESSES - SABOTEURS)
    ] + [
        SPAWN.Process(target=_saboteur, args=(i, results, barrier, str(path), seconds, children))
        for i in range(PROCESSES - SABOTEURS, PROCESSES)
    ]
    started = time.monotonic()
    for proc in procs:
        proc.start()
    outcomes = []
    try:
        for _ in procs:
            outcomes.append(results.get(timeout=seconds + 240))
    except queue.Empty:
        raise AssertionError("a contention process hung") from None
    finally:
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()
        results.close()
        results.join_thread()
    elapsed = time.monotonic() - started
    errors = [text for kind, _, text in outcomes if kind == "error"]
    assert errors == [], errors[0] if errors else ""
    payloads = [payload for _, _, payload in outcomes]
    assert all(proc.exitcode == 0 for proc in procs)

    busy: Counter[str] = Counter()
    conflicts: Counter[str] = Counter()
    bad: list[str] = []
    claims: Counter[tuple[str, int]] = Counter()
    claims_per_task: Counter[str] = Counter()
    charges: Counter[str] = Counter()
    final: dict[str, str] = {}  # task -> terminal status a call returned
    problems: list[str] = []
    for payload in payloads:
        busy.update(payload["busy"])
        conflicts.update(payload["conflicts"])
        bad += payload["bad"]
        log = payload["log"]
        for task_id, attempt, owner, status in log.get("claims", []):
            claims[task_id, attempt] += 1
            claims_per_task[task_id] += 1
            if status != "running" or owner is None:
                problems.append(f"a claim returned {status} owned by {owner}")
        charges.update(log.get("charges", []))
        for key in ("closes", "cancels", "fails", "releases"):
            for task_id, status in log.get(key, []):
                if status in TERMINAL and final.setdefault(task_id, status) != status:
                    problems.append(f"{key} returned {status} after {final[task_id]}")

    with Ledger(path) as ledger:
        report = ledger.doctor()
        tasks = {t.id: t for t in ledger.list_tasks(limit=10_000)}
        page = list(tasks)
        while len(page) == 10_000:
            more = ledger.list_tasks(limit=10_000, after=page[-1])
            tasks.update((t.id, t) for t in more)
            page = [t.id for t in more]

    for (_, attempt), count in claims.items():
        if count != 1:
            problems.append(f"attempt {attempt} of a task claimed {count} times")
    for task_id in children:
        task = tasks[task_id]
        if task.attempt_count != claims_per_task[task_id]:
            problems.append(f"attempt_count {task.attempt_count} != {claims_per_task[task_id]}")
        if task.llm_calls_used != charges[task_id] or task.tokens_used != 7 * charges[task_id]:
            problems.append(f"counter {task.llm_calls_used} != allowed charges {charges[task_id]}")
        if task_id in final and task.status != final[task_id]:
            problems.append(f"returned {final[task_id]} but stored {task.status}")
    for root in roots:
        kids = [t for t in tasks.values() if t.parent_id == root]
        if tasks[root].llm_calls_used != sum(k.llm_calls_used for k in kids):
            problems.append("a root's counter differs from the sum of its children")
    for task in tasks.values():
        if task.status == "running" and task.owner is None:
            problems.append("a running task without owner")
        if task.llm_calls_budget is not None and task.llm_calls_used > task.llm_calls_budget:
            problems.append(f"calls {task.llm_calls_used} above limit {task.llm_calls_budget}")

    figures.record(
        "contention",
        processes=PROCESSES,
        busy_timeout_ms=BUSY_MS,
        seconds=round(elapsed, 1),
        claims=sum(claims.values()),
        allowed_charges=sum(charges.values()),
        ledger_busy_seen=sum(busy.values()),
        legitimate_conflicts=sum(conflicts.values()),
        illegitimate_exceptions=len(bad),
        invariant_violations=len(problems),
    )
    assert bad == [], bad[:10]
    assert report["healthy"] is True, report
    assert problems == [], problems[:10]
    # The campaign really contended and really worked.
    assert sum(busy.values()) > 0
    assert sum(claims.values()) >= 50 and sum(charges.values()) >= 50
    assert conflicts["cancel"] + conflicts["close_task"] > 0


FIRST_OPEN = Path(__file__).with_name("_first_open.py")
FIRST_OPEN_BUSY_MS = 2000


def _race_to_create(path: Path, racers: int) -> list[dict[str, Any]]:
    """Fresh processes (cold, as a fleet starting up) open one new file at once."""
    start = time.time() + 1.0  # after all the interpreters have started
    argv = [str(FIRST_OPEN), str(FIRST_OPEN_BUSY_MS), "0"]
    procs = [
        subprocess.Popen(
            [sys.executable, *argv, str(k), str(path), repr(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for k in range(racers)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * racers, outputs[0][1][-2000:]
    return [json.loads(line) for out, _ in outputs for line in out.decode().splitlines()]


def test_processes_creating_one_new_ledger_at_once_wait_instead_of_busy(
    tmp_path: Path, long_campaign: bool, figures: Any
) -> None:
    """SPEC §2.3: any number of processes may open the same file; a writer
    waits up to ``busy_timeout_ms`` before ``LedgerBusy``. Four freshly started
    processes open (and so create) one new ledger file at the same moment,
    again and again: every open must succeed, or fail with ``LedgerBusy`` only
    after waiting (nearly) the full timeout. Each file ends healthy with
    exactly one task per successful open."""
    races = 120 if long_campaign else 16
    racers = 4
    directory = tmp_path / "fresh"
    directory.mkdir(mode=0o700)
    results: list[dict[str, Any]] = []
    for i in range(races):
        results += _race_to_create(directory / f"new-{i}.db", racers)
    assert len(results) == races * racers
    limit = FIRST_OPEN_BUSY_MS / 1000 * 0.9
    early_busy = [r for r in results if r["outcome"] != "ok" and r["seconds"] < limit]
    figures.record(
        "contention",
        first_open_races=races,
        first_open_attempts=len(results),
        first_open_failed_early=len(early_busy),
    )
    unexpected = {r["outcome"] for r in results} - {"ok", "taskwarden.errors.LedgerBusy"}
    assert unexpected == set()
    for i in range(races):
        with Ledger(directory / f"new-{i}.db") as ledger:
            assert ledger.doctor()["healthy"] is True
            ok = sum(r["outcome"] == "ok" for r in results if r["path"].endswith(f"/new-{i}.db"))
            assert ledger.stats()["task_count"] == ok
    assert early_busy == [], (
        f"{len(early_busy)} of {len(results)} opens of a new file failed after "
        f"{max(r['seconds'] for r in early_busy) * 1000:.1f} ms or less with "
        f"{early_busy[0]['outcome']} (busy_timeout_ms={FIRST_OPEN_BUSY_MS})"
    )
