"""Claims and the budget guard under real multi-process contention (SPEC §2.2,
§2.3, §4), plus fencing of stale claims.

These are the weak spots of @sockt/fsm (reference §8, items 4, 5, 7, 20) made
into invariants: every task is claimed exactly once by N processes, N processes
charging one budget never overshoot it by a single unit, and a worker whose
claim was superseded cannot write.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger, TaskStatus
from taskwarden.errors import ClaimLost, InvalidInput

from .conftest import EVENT_TASK_ID, FrozenClock, logical_dump, report_outcome

SPAWN = multiprocessing.get_context("spawn")
PROCESSES = 8
CLAIM_TASKS = 10_000
CALLS_BUDGET = 1000
BUSY_MS = 30_000
RESULT_TIMEOUT = 240


# --------------------------------------------------------------------------
# process plumbing: module-level workers, results (or the traceback) via a queue


def _claim_worker(index: int, results: Any, barrier: Any, path: str, limit: int) -> None:
    """Claim oldest-first until the queue is empty, closing each claimed task."""

    def body() -> dict[str, Any]:
        name = f"worker-{index}"
        claimed: list[str] = []
        problems: list[str] = []
        last_key: tuple[float, str] | None = None
        with Ledger(path, busy_timeout_ms=BUSY_MS) as ledger:
            barrier.wait(120)
            while True:
                batch = ledger.claim_next(name, limit=limit)
                if not batch:
                    break
                if len(batch) > limit:
                    problems.append(f"batch of {len(batch)} > limit {limit}")
                keys = [(t.created_at, t.id) for t in batch]
                if keys != sorted(keys):
                    problems.append("batch not oldest first")
                # No task is ever re-queued, so one worker's claims are strictly FIFO.
                if last_key is not None and keys[0] <= last_key:
                    problems.append("a later claim returned an older task")
                last_key = keys[-1]
                for task in batch:
                    if task.status != "running" or task.owner != name or task.attempt_count != 1:
                        problems.append(
                            f"claimed task looks wrong: {task.status} {task.owner} "
                            f"{task.attempt_count}"
                        )
                    done = ledger.close_task(task.id, "succeeded", worker=name)
                    if done.status != "succeeded" or done.owner != name:
                        problems.append(f"close_task returned {done.status} {done.owner}")
                    claimed.append(task.id)
        return {"name": name, "ids": claimed, "problems": problems}

    report_outcome(results, index, body)


def _charge_worker(
    index: int, results: Any, barrier: Any, path: str, task_id: str, worker: str, attempt: int
) -> None:
    """Charge one call at a time until refused; report every answer's gist."""

    def body() -> dict[str, Any]:
        allowed = 0
        seen_used: list[int] = []
        with Ledger(path, busy_timeout_ms=BUSY_MS) as ledger:
            barrier.wait(120)
            while True:
                answer = ledger.charge(task_id, worker=worker, attempt=attempt)
                if not answer.allowed:
                    break
                allowed += 1
                seen_used.append(answer.calls_used)
        return {
            "allowed": allowed,
            "used": seen_used,
            "final": answer.to_dict(),
        }

    report_outcome(results, index, body)


def run_processes(
    target: Callable[..., None], per_process_args: list[tuple[Any, ...]]
) -> list[Any]:
    """Start one spawned process per args tuple behind a common barrier; return
    their payloads in index order. Any exception in any worker fails the test."""
    results = SPAWN.Queue()
    barrier = SPAWN.Barrier(len(per_process_args))
    procs = [
        SPAWN.Process(target=target, args=(i, results, barrier, *args))
        for i, args in enumerate(per_process_args)
    ]
    for proc in procs:
        proc.start()
    try:
        collected: dict[int, Any] = {}
        errors: list[str] = []
        deadline = time.monotonic() + RESULT_TIMEOUT
        while len(collected) + len(errors) < len(procs):
            try:
                kind, index, payload = results.get(timeout=1)
            except queue.Empty:
                # A worker that died without reporting (crash, kill) fails the test
                # instead of hanging it.
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"worker process died with exit codes {dead}"
                assert time.monotonic() < deadline, "workers did not finish in time"
                continue
            if kind == "ok":
                collected[index] = payload
            else:
                errors.append(f"worker {index} failed:\n{payload}")
        for proc in procs:
            proc.join(60)
            assert proc.exitcode == 0, f"worker process exited with {proc.exitcode}"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        results.close()
        results.join_thread()
    assert not errors, "\n".join(errors)
    return [collected[i] for i in range(len(procs))]


def all_tasks(ledger: Ledger) -> list[Any]:
    out: list[Any] = []
    after: str | None = None
    while True:
        page = ledger.list_tasks(limit=1000, after=after)
        if not page:
            return out
        out.extend(page)
        after = page[-1].id


# --------------------------------------------------------------------------
# claim_next: every task exactly once


@pytest.mark.parametrize("limit", [1, 16])
def test_processes_claim_every_task_exactly_once(db_path: Path, limit: int) -> None:
    with Ledger(db_path) as ledger:
        created = {ledger.create_task(llm_calls_budget=None).id for _ in range(CLAIM_TASKS)}
    assert len(created) == CLAIM_TASKS

    payloads = run_processes(_claim_worker, [(str(db_path), limit) for _ in range(PROCESSES)])

    for payload in payloads:
        assert payload["problems"] == [], (payload["name"], payload["problems"][:5])
    owner_of: dict[str, str] = {}
    duplicates: list[str] = []
    for payload in payloads:
        for task_id in payload["ids"]:
            if task_id in owner_of:
                duplicates.append(task_id)
            owner_of[task_id] = payload["name"]
    assert duplicates == []
    assert sum(len(p["ids"]) for p in payloads) == CLAIM_TASKS
    assert set(owner_of) == created, "tasks lost or invented"
    assert sum(1 for p in payloads if p["ids"]) >= 2, "no contention: one worker took everything"

    with Ledger(db_path, busy_timeout_ms=BUSY_MS) as ledger:
        tasks = all_tasks(ledger)
    assert len(tasks) == CLAIM_TASKS
    wrong = [
        (t.id, t.status, t.owner, owner_of.get(t.id), t.attempt_count)
        for t in tasks
        if t.status != "succeeded" or t.owner != owner_of.get(t.id) or t.attempt_count != 1
    ]
    assert wrong == []

    # The audit trail agrees: one claim event per task, by the worker that reported it.
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as conn:
        claims = conn.execute(
            f"SELECT {EVENT_TASK_ID}, worker FROM task_events "
            "WHERE event_kind = 'task_transition' AND from_value = 'queued' "
            "AND to_value = 'running'"
        ).fetchall()
    assert len(claims) == CLAIM_TASKS
    assert dict(claims) == owner_of


# --------------------------------------------------------------------------
# charge: N processes, one budget, zero overshoot


def test_processes_charging_one_task_get_exactly_the_budget(db_path: Path) -> None:
    with Ledger(db_path) as ledger:
        task = ledger.create_task(llm_calls_budget=CALLS_BUDGET)
        claimed = ledger.claim(task.id, "fleet")
        assert claimed is not None and claimed.attempt_count == 1

    payloads = run_processes(
        _charge_worker, [(str(db_path), task.id, "fleet", 1) for _ in range(PROCESSES)]
    )

    assert sum(p["allowed"] for p in payloads) == CALLS_BUDGET
    all_used = [u for p in payloads for u in p["used"]]
    # Every allowed charge saw a distinct counter value in 1..budget: no lost updates.
    assert sorted(all_used) == list(range(1, CALLS_BUDGET + 1))
    for p in payloads:
        assert p["used"] == sorted(p["used"])
    finals = [p["final"] for p in payloads]
    assert sum(f["escalated"] for f in finals) == 1
    escalating = next(f for f in finals if f["escalated"])
    assert escalating["exhausted"] == "calls"
    assert escalating["calls_used"] == CALLS_BUDGET
    for f in finals:
        assert f["allowed"] is False
        assert f["calls_used"] <= CALLS_BUDGET

    with Ledger(db_path) as ledger:
        after = ledger.get_task(task.id)
    assert after.status == "escalated"
    assert after.park_code == "budget_exhausted"
    assert after.llm_calls_used == CALLS_BUDGET
    assert after.owner == "fleet"


def test_processes_charging_children_share_the_parent_budget(db_path: Path) -> None:
    with Ledger(db_path) as ledger:
        parent = ledger.create_task(llm_calls_budget=CALLS_BUDGET)
        ledger.claim(parent.id, "lead")
        children = []
        for i in range(PROCESSES):
            child = ledger.create_task(parent_id=parent.id, llm_calls_budget=None)
            assert ledger.claim(child.id, f"w{i}") is not None
            children.append(child.id)

    payloads = run_processes(
        _charge_worker,
        [(str(db_path), children[i], f"w{i}", 1) for i in range(PROCESSES)],
    )

    assert sum(p["allowed"] for p in payloads) == CALLS_BUDGET
    for p in payloads:
        final = p["final"]
        # Each child is running until its own refusal, which escalates it.
        assert final["allowed"] is False
        assert final["escalated"] is True
        assert final["exhausted"] == "calls"
        assert final["calls_budget"] is None and final["calls_remaining"] is None

    with Ledger(db_path) as ledger:
        parent_after = ledger.get_task(parent.id)
        kids = [ledger.get_task(c) for c in children]
    assert parent_after.llm_calls_used == CALLS_BUDGET
    assert sum(k.llm_calls_used for k in kids) == CALLS_BUDGET
    assert [k.llm_calls_used for k in kids] == [p["allowed"] for p in payloads]
    for k in kids:
        assert k.status == "escalated"
        assert k.park_code == "budget_exhausted"
    # The parent itself was never charged directly and is still running.
    assert parent_after.status == "running"


# --------------------------------------------------------------------------
# tokens and cost: mixed sizes, in-process


def _expected_dims(task: Any, calls: int, tokens: int, cost: int) -> list[str]:
    over = []
    if task.llm_calls_budget is not None and task.llm_calls_used + calls > task.llm_calls_budget:
        over.append("calls")
    if task.token_budget is not None and task.tokens_used + tokens > task.token_budget:
        over.append("tokens")
    if task.cost_budget_micros is not None and (
        task.cost_used_micros + cost > task.cost_budget_micros
    ):
        over.append("cost")
    return over


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_token_and_cost_budgets_with_mixed_charges(ledger: Ledger, seed: int) -> None:
    rng = random.Random(seed)
    token_budget = rng.randint(0, 5000)
    cost_budget = rng.randint(0, 50_000)
    task = ledger.create_task(
        llm_calls_budget=None, token_budget=token_budget, cost_budget_micros=cost_budget
    )
    ledger.claim(task.id, "w")
    while True:
        before = ledger.get_task(task.id)
        calls = rng.choice([0, 1, 1, 2])
        tokens = rng.choice([0, 1, rng.randint(0, 400), rng.randint(0, 2000)])
        cost = rng.choice([0, 1, rng.randint(0, 4000), rng.randint(0, 20_000)])
        over = _expected_dims(before, calls, tokens, cost)
        answer = ledger.charge(task.id, calls=calls, tokens=tokens, cost_micros=cost, worker="w")
        after = ledger.get_task(task.id)
        assert after.tokens_used <= token_budget
        assert after.cost_used_micros <= cost_budget
        if not over:
            assert answer.allowed, (calls, tokens, cost, before)
            assert answer.escalated is False and answer.exhausted is None
            assert after.tokens_used == before.tokens_used + tokens
            assert after.cost_used_micros == before.cost_used_micros + cost
            assert after.llm_calls_used == before.llm_calls_used + calls
            assert answer.tokens_remaining == token_budget - after.tokens_used
            assert answer.cost_remaining_micros == cost_budget - after.cost_used_micros
            continue
        assert answer.allowed is False
        assert answer.escalated is True
        assert answer.exhausted in over, (answer.exhausted, over)
        assert (after.tokens_used, after.cost_used_micros, after.llm_calls_used) == (
            before.tokens_used,
            before.cost_used_micros,
            before.llm_calls_used,
        )
        assert after.status == "escalated" and after.park_code == "budget_exhausted"
        break


@pytest.mark.parametrize(
    ("budgets", "charges", "dimension"),
    [
        # Exactly reaching a limit is allowed; one more unit is not.
        ({"token_budget": 100}, [{"tokens": 60}, {"tokens": 40}, {"tokens": 1}], "tokens"),
        ({"cost_budget_micros": 999}, [{"cost_micros": 500}, {"cost_micros": 500}], "cost"),
        # Tokens ran out while cost still had room, and the other way round.
        (
            {"token_budget": 10, "cost_budget_micros": 1_000_000},
            [{"tokens": 10, "cost_micros": 5}, {"tokens": 1, "cost_micros": 5}],
            "tokens",
        ),
        (
            {"token_budget": 1_000_000, "cost_budget_micros": 10},
            [{"tokens": 5, "cost_micros": 10}, {"tokens": 5, "cost_micros": 1}],
            "cost",
        ),
        # Calls still fit (budget 25) but tokens do not.
        ({"token_budget": 3}, [{"calls": 1, "tokens": 4}], "tokens"),
        # Tokens and cost fit, calls do not.
        (
            {"llm_calls_budget": 2, "token_budget": 100, "cost_budget_micros": 100},
            [{"calls": 2}, {"calls": 1, "tokens": 1, "cost_micros": 1}],
            "calls",
        ),
    ],
)
def test_exhausted_names_the_dimension_that_ran_out(
    ledger: Ledger, budgets: dict[str, int], charges: list[dict[str, int]], dimension: str
) -> None:
    task = ledger.create_task(**budgets)
    ledger.claim(task.id, "w")
    *fitting, last = charges
    for amounts in fitting:
        assert ledger.charge(task.id, **amounts).allowed
    before = ledger.get_task(task.id)
    answer = ledger.charge(task.id, **last)
    assert (answer.allowed, answer.escalated, answer.exhausted) == (False, True, dimension)
    after = ledger.get_task(task.id)
    assert (after.llm_calls_used, after.tokens_used, after.cost_used_micros) == (
        before.llm_calls_used,
        before.tokens_used,
        before.cost_used_micros,
    )


def test_parent_token_and_cost_limits_bind_children(ledger: Ledger) -> None:
    parent = ledger.create_task(llm_calls_budget=None, token_budget=500, cost_budget_micros=700)
    a = ledger.create_task(parent_id=parent.id, llm_calls_budget=None)
    b = ledger.create_task(parent_id=parent.id, llm_calls_budget=None)
    ledger.claim(a.id, "a")
    ledger.claim(b.id, "b")
    assert ledger.charge(a.id, tokens=300, cost_micros=100, worker="a").allowed
    assert ledger.charge(b.id, tokens=200, cost_micros=100, worker="b").allowed
    # The parent has no tokens left; b's own (unlimited) budget does not save it.
    refused = ledger.charge(b.id, tokens=1, worker="b")
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "tokens")
    assert refused.tokens_remaining is None  # b's own limit is unlimited
    # a may still spend cost (tokens zero) until the parent's cost runs out.
    assert ledger.charge(a.id, calls=0, cost_micros=500, worker="a").allowed
    refused = ledger.charge(a.id, calls=0, cost_micros=1, worker="a")
    assert (refused.allowed, refused.escalated, refused.exhausted) == (False, True, "cost")
    p = ledger.get_task(parent.id)
    assert (p.tokens_used, p.cost_used_micros) == (500, 700)


# --------------------------------------------------------------------------
# fencing: a superseded claim cannot write


def _assert_fenced(ledger: Ledger, task_id: str, **who: Any) -> None:
    before = ledger.get_task(task_id)
    with pytest.raises(ClaimLost):
        ledger.heartbeat(task_id, **who)
    answer = ledger.charge(task_id, **who)
    assert answer.allowed is False
    assert answer.escalated is False
    with pytest.raises(ClaimLost):
        ledger.close_task(task_id, "succeeded", **who)
    with pytest.raises(ClaimLost):
        ledger.transition(task_id, "running", "failed", **who)
    if "worker" in who:
        with pytest.raises(ClaimLost):
            ledger.release(task_id, who["worker"], attempt=who.get("attempt"))
    with pytest.raises(ClaimLost):
        ledger.set_delivery(task_id, "delivered", **who)
    assert ledger.get_task(task_id) == before, "a fenced call changed the task"


def test_released_and_reclaimed_task_fences_the_old_owner(
    db_path: Path, clock: FrozenClock
) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(llm_calls_budget=10)
        first = ledger.claim(task.id, "A")
        assert first is not None and first.attempt_count == 1
        assert ledger.charge(task.id, worker="A", attempt=1).allowed
        released = ledger.release(task.id, "A")
        assert released.status == "queued" and released.owner is None
        clock.advance(1)
        second = ledger.claim(task.id, "B")
        assert second is not None
        assert (second.owner, second.attempt_count) == ("B", 2)
        # A cannot release B's claim either.
        with pytest.raises(ClaimLost):
            ledger.release(task.id, "A")

    before = logical_dump(db_path)
    with Ledger(db_path, clock=clock) as ledger:
        clock.advance(1)
        _assert_fenced(ledger, task.id, worker="A")
        _assert_fenced(ledger, task.id, attempt=1)
        _assert_fenced(ledger, task.id, worker="A", attempt=2)
        _assert_fenced(ledger, task.id, worker="B", attempt=1)
        _assert_fenced(ledger, task.id, worker="A", attempt=1)
    assert logical_dump(db_path) == before, "fenced calls wrote to the ledger"

    with Ledger(db_path, clock=clock) as ledger:
        clock.advance(1)
        beat = ledger.heartbeat(task.id, worker="B", attempt=2)
        assert beat.updated_at == clock.now
        charged = ledger.charge(task.id, worker="B", attempt=2)
        assert charged.allowed and charged.calls_used == 2
        # attempt alone (no worker) is accepted when it is the current one.
        assert ledger.charge(task.id, attempt=2).allowed
        done = ledger.close_task(task.id, "succeeded", worker="B", attempt=2)
        assert done.status == "succeeded" and done.owner == "B"
        assert done.llm_calls_used == 3


def test_requeued_after_escalation_and_reclaimed_fences_the_old_owner(ledger: Ledger) -> None:
    task = ledger.create_task(llm_calls_budget=1)
    ledger.claim(task.id, "A")
    assert ledger.charge(task.id, worker="A", attempt=1).allowed
    spent = ledger.charge(task.id, worker="A", attempt=1)
    assert spent.escalated
    parked = ledger.get_task(task.id)
    assert parked.status == "escalated" and parked.owner == "A"
    ledger.grant(task.id, calls=5)
    queued = ledger.requeue(task.id)
    assert queued.status == "queued" and queued.owner is None
    # Even the same worker name cannot reuse its stale attempt number.
    reclaimed = ledger.claim(task.id, "B")
    assert reclaimed is not None and (reclaimed.owner, reclaimed.attempt_count) == ("B", 2)

    _assert_fenced(ledger, task.id, worker="A")
    _assert_fenced(ledger, task.id, worker="A", attempt=1)
    _assert_fenced(ledger, task.id, attempt=1)
    assert ledger.get_task(task.id).llm_calls_used == 1

    assert ledger.charge(task.id, worker="B", attempt=2).allowed
    assert ledger.heartbeat(task.id, worker="B", attempt=2).status == "running"
    assert ledger.close_task(task.id, "failed", worker="B", attempt=2).status == "failed"


def test_same_worker_name_with_stale_attempt_is_fenced(ledger: Ledger) -> None:
    task = ledger.create_task()
    ledger.claim(task.id, "A")
    ledger.release(task.id, "A")
    again = ledger.claim(task.id, "A")
    assert again is not None and again.attempt_count == 2
    _assert_fenced(ledger, task.id, worker="A", attempt=1)
    assert ledger.charge(task.id, worker="A", attempt=2).allowed
    assert ledger.release(task.id, "A", attempt=2).status is TaskStatus.QUEUED


def test_a_zombie_is_not_told_its_close_succeeded_after_the_new_owner_closed(
    ledger: Ledger,
) -> None:
    """Closing again with the same status is a no-op for the claim that
    closed it; a zombie whose claim ended must still hear ClaimLost,
    or it would deliver its result as if it had been accepted."""
    task = ledger.create_task()
    ledger.claim(task.id, "A")
    ledger.escalate(task.id)
    ledger.requeue(task.id)
    ledger.claim(task.id, "B")
    done = ledger.close_task(task.id, "succeeded", worker="B", attempt=2)
    for who in ({"worker": "A"}, {"worker": "A", "attempt": 1}, {"attempt": 1}):
        with pytest.raises(ClaimLost):
            ledger.close_task(task.id, "succeeded", **who)
        with pytest.raises(ClaimLost):
            ledger.transition(task.id, "succeeded", "succeeded", **who)
    # The owner's retry is still the no-op it was.
    assert ledger.close_task(task.id, "succeeded", worker="B", attempt=2) == done
    assert ledger.transition(task.id, "succeeded", "succeeded", worker="B") == done
    assert ledger.get_task(task.id) == done


def test_a_requeued_task_fences_every_ended_claim_before_the_next_one(ledger: Ledger) -> None:
    """Requeue clears the owner but leaves the attempt count until the next
    claim: a fence by attempt alone must not close a task nobody holds."""
    task = ledger.create_task()
    ledger.claim(task.id, "A")
    ledger.block(task.id)
    queued = ledger.requeue(task.id)
    assert (queued.status, queued.attempt_count) == ("queued", 1)
    for who in ({"attempt": 1}, {"worker": "A"}, {"worker": "A", "attempt": 1}):
        with pytest.raises(ClaimLost):
            ledger.close_task(task.id, "succeeded", **who)
        with pytest.raises(ClaimLost):
            ledger.transition(task.id, "queued", "cancelled", **who)
    assert ledger.get_task(task.id) == queued
    # A claim through transition still compares the attempt it expects.
    claimed = ledger.transition(task.id, "queued", "running", worker="B", attempt=1)
    assert (claimed.owner, claimed.attempt_count) == ("B", 2)


def test_claim_next_passes_over_tasks_dated_after_its_clock(db_path: Path) -> None:
    """A process whose clock ran ahead wrote two tasks: one it created, one
    it released. Claiming them now would move time backwards, so the
    worker claims the others and leaves those two queued, instead of
    failing every batch that reaches them."""
    worker_clock, ahead_clock = FrozenClock(1_000.0), FrozenClock(2_000.0)
    with Ledger(db_path, clock=worker_clock) as worker, Ledger(db_path, clock=ahead_clock) as ahead:
        released = worker.create_task()  # the oldest: the head of the queue
        ahead.claim(released.id, "fast")
        ahead.release(released.id, "fast")  # queued again, updated at 2,000
        behind = [worker.create_task() for _ in range(3)]
        created_ahead = ahead.create_task()

        first = worker.claim_next("w", limit=2)
        assert [t.id for t in first] == [t.id for t in behind[:2]]
        assert [t.id for t in worker.claim_next("w", limit=10)] == [behind[2].id]
        assert worker.claim_next("w", limit=10) == []
        for task in (released, created_ahead):
            assert worker.get_task(task.id).status == "queued"

        worker_clock.advance(1_000.0)  # now 2,000: neither is in the future
        later = worker.claim_next("w", limit=10)
        assert [t.id for t in later] == [released.id, created_ahead.id]
        assert all(t.started_at == 2_000.0 for t in later)


def test_claim_next_passes_over_a_task_it_could_give_no_finite_deadline(
    ledger: Ledger, clock: FrozenClock
) -> None:
    """A timeout so long that the clock's time plus it is not finite: that
    task cannot be started (a claim of it alone is refused as the peer's
    start is), and one such task in the queue failed every worker's whole
    batch. It is passed over and stays queued; the tasks behind it are
    handed out."""
    stuck = ledger.create_task(timeout_seconds=1.7976931348623157e308)
    behind = [ledger.create_task(timeout_seconds=60) for _ in range(2)]
    clock.now = 1e300
    claimed = ledger.claim_next("w", limit=10)
    assert [t.id for t in claimed] == [t.id for t in behind]
    assert all(t.deadline_at == 1e300 + 60 for t in claimed)
    assert ledger.get_task(stuck.id).status == "queued"
    assert ledger.claim_next("w") == []
    with pytest.raises(InvalidInput):
        ledger.claim(stuck.id, "w")
    assert ledger.get_task(stuck.id).status == "queued"


def test_a_task_closed_while_queued_fences_every_ended_claim(ledger: Ledger) -> None:
    """An operator closes a requeued task: no claim closed it, so a zombie
    fencing by attempt alone must not hear that its close was the no-op."""
    task = ledger.create_task()
    ledger.claim(task.id, "A")
    ledger.block(task.id)
    ledger.requeue(task.id)
    closed = ledger.close_task(task.id, "succeeded")
    assert (closed.owner, closed.attempt_count) == (None, 1)
    for who in ({"attempt": 1}, {"worker": "A", "attempt": 1}):
        with pytest.raises(ClaimLost):
            ledger.close_task(task.id, "succeeded", **who)
        with pytest.raises(ClaimLost):
            ledger.transition(task.id, "succeeded", "succeeded", **who)
    assert ledger.close_task(task.id, "succeeded") == closed  # the unfenced retry


def test_claim_next_stops_reading_at_the_first_task_created_after_its_clock(
    db_path: Path,
) -> None:
    """The queue is in creation order, so the first task created after the
    clock ends the batch. Tasks created later still but with an earlier
    clock never sort before it."""
    with Ledger(db_path, clock=FrozenClock(1_000.0)) as worker:
        with Ledger(db_path, clock=FrozenClock(5_000.0)) as ahead:
            future = [ahead.create_task() for _ in range(50)]
        assert worker.claim_next("w", limit=10) == []
        assert all(worker.get_task(t.id).status == "queued" for t in future)
