"""The task state machine (SPEC §3, §2.2, §2.2.1): every (from, to) pair through
``transition``, the helper moves (block, escalate, requeue, cancel, close_task),
owners, park codes and the reason codes a caller may pass."""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import taskwarden
from taskwarden import (
    TRANSITIONS,
    DeliveryStatus,
    InvalidInput,
    Ledger,
    StateConflict,
    Task,
    TaskStatus,
    can_transition,
)

from .conftest import OF_TASK, FrozenClock, logical_dump

S = TaskStatus
ALL = list(TaskStatus)
TERMINAL = [S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED]
PARKED = [S.BLOCKED, S.ESCALATED]
NON_TERMINAL = [S.QUEUED, S.RUNNING, *PARKED]
TIMEOUT = 30.0
WORKER = "w1"

#: SPEC §3's table, written out independently of the product.
SPEC_TABLE: dict[TaskStatus, frozenset[TaskStatus]] = {
    S.QUEUED: frozenset({S.RUNNING, *TERMINAL}),
    S.RUNNING: frozenset({*TERMINAL, S.BLOCKED, S.ESCALATED, S.QUEUED}),
    S.BLOCKED: frozenset({S.QUEUED, S.CANCELLED}),
    S.ESCALATED: frozenset({S.QUEUED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.TIMED_OUT: frozenset(),
    S.CANCELLED: frozenset(),
}

ALIASES = {"pending": S.QUEUED, "in_progress": S.RUNNING, "completed": S.SUCCEEDED}

PAIRS = list(itertools.product(ALL, ALL))


def _names(status: TaskStatus) -> list[str]:
    """Every input spelling of a status: canonical name plus its aliases."""
    return [status.value] + [alias for alias, s in ALIASES.items() if s is status]


def bring(ledger: Ledger, status: TaskStatus, **create: Any) -> Task:
    """A fresh task brought into ``status`` through the public API."""
    task = ledger.create_task(timeout_seconds=TIMEOUT, **create)
    if status is not S.QUEUED and not status.is_terminal:
        assert ledger.claim(task.id, WORKER) is not None
        if status is S.BLOCKED:
            ledger.block(task.id)
        elif status is S.ESCALATED:
            ledger.escalate(task.id)
    elif status.is_terminal:
        ledger.close_task(task.id, status)
    got = ledger.get_task(task.id)
    assert got.status is status
    return got


def events(path: Path, task_id: str) -> list[tuple[Any, ...]]:
    """(kind, from, to, code, worker) of a task's events, oldest first."""
    uri = f"file:{path}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        return list(
            conn.execute(
                "SELECT event_kind, from_value, to_value, code, worker FROM task_events "
                f"WHERE {OF_TASK} ORDER BY sequence",
                (task_id,),
            )
        )


def assert_refused(
    ledger: Ledger, db_path: Path, task_id: str, exc: type[Exception], call: Any
) -> None:
    """``call()`` raises ``exc`` and neither the task nor the file changes."""
    before_task = ledger.get_task(task_id)
    before_dump = logical_dump(db_path)
    with pytest.raises(exc):
        call()
    assert ledger.get_task(task_id) == before_task
    assert logical_dump(db_path) == before_dump


# -- the table as data ---------------------------------------------------------


def test_transitions_is_exported_with_task_status_keys() -> None:
    assert taskwarden.TRANSITIONS is TRANSITIONS
    assert "TRANSITIONS" in taskwarden.__all__
    assert set(TRANSITIONS) == set(ALL)
    for src, targets in TRANSITIONS.items():
        assert type(src) is TaskStatus
        assert isinstance(targets, frozenset)
        assert all(type(t) is TaskStatus for t in targets)
    assert TRANSITIONS == SPEC_TABLE


def test_transitions_cannot_be_edited() -> None:
    """The exported table is the engine's; an edit could only make it lie."""
    with pytest.raises(TypeError):
        TRANSITIONS[TaskStatus.SUCCEEDED] = frozenset({TaskStatus.QUEUED})  # type: ignore[index]
    with pytest.raises(TypeError):
        del TRANSITIONS[TaskStatus.QUEUED]  # type: ignore[attr-defined]
    assert TRANSITIONS == SPEC_TABLE


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a.value}-{b.value}" for a, b in PAIRS])
def test_can_transition_agrees_with_the_table_including_aliases(
    src: TaskStatus, dst: TaskStatus
) -> None:
    expected = dst in SPEC_TABLE[src]
    for a, b in itertools.product(_names(src), _names(dst)):
        assert can_transition(a, b) is expected, (a, b)
    assert can_transition(src, dst) is expected


@pytest.mark.parametrize("bad", ["Queued", "done", "", "QUEUED", "in-progress"])
def test_can_transition_refuses_unknown_statuses(bad: str) -> None:
    with pytest.raises(InvalidInput):
        can_transition(bad, "queued")
    with pytest.raises(InvalidInput):
        can_transition("queued", bad)


# -- every (from, to) pair through transition -----------------------------------


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a.value}-{b.value}" for a, b in PAIRS])
def test_transition_pair(
    ledger: Ledger, db_path: Path, clock: FrozenClock, src: TaskStatus, dst: TaskStatus
) -> None:
    before = bring(ledger, src)
    n_events = len(events(db_path, before.id))
    clock.advance(5)

    if dst in SPEC_TABLE[src]:
        after = ledger.transition(before.id, src, dst)
        assert after == ledger.get_task(before.id)
        assert after.status is dst
        assert after.version == before.version + 1
        assert after.updated_at == clock.now
        log = events(db_path, before.id)
        assert len(log) == n_events + 1
        assert log[-1][:3] == ("task_transition", src.value, dst.value)
        if dst is S.RUNNING:
            assert after.attempt_count == before.attempt_count + 1 == 1
            assert after.started_at == clock.now
            assert after.deadline_at == clock.now + TIMEOUT
            assert after.owner is None  # no worker given
            assert after.park_code is None
        elif dst is S.QUEUED:
            assert (after.owner, after.started_at, after.deadline_at) == (None, None, None)
            assert after.attempt_count == before.attempt_count
            assert after.park_code is None
            assert after.ended_at is None
        elif dst in PARKED:
            assert after.owner == before.owner == WORKER
            assert after.park_code == ("needs_input" if dst is S.BLOCKED else "escalated_manually")
            assert (after.started_at, after.deadline_at) == (before.started_at, before.deadline_at)
            assert after.attempt_count == before.attempt_count
        else:
            assert dst.is_terminal
            assert after.ended_at == clock.now
            assert after.owner == before.owner
            assert after.park_code is None
            assert after.attempt_count == before.attempt_count
            assert after.started_at == before.started_at
    elif src is dst and src.is_terminal:
        dump = logical_dump(db_path)
        again = ledger.transition(before.id, src, dst)
        assert again == before == ledger.get_task(before.id)
        assert logical_dump(db_path) == dump
    else:
        assert_refused(
            ledger,
            db_path,
            before.id,
            StateConflict,
            lambda: ledger.transition(before.id, src, dst),
        )


def test_the_applied_pairs_are_exactly_transitions(clock: FrozenClock) -> None:
    applied, noop, refused = set(), set(), set()
    with Ledger.in_memory(clock=clock) as ledger:
        for src, dst in PAIRS:
            before = bring(ledger, src)
            clock.advance(1)
            try:
                after = ledger.transition(before.id, src, dst)
            except StateConflict:
                assert ledger.get_task(before.id) == before
                refused.add((src, dst))
                continue
            (applied if after.version == before.version + 1 else noop).add((src, dst))
    edges = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert applied == edges
    assert noop == {(t, t) for t in TERMINAL}
    assert refused == set(PAIRS) - edges - noop


@pytest.mark.parametrize(
    ("src", "expected", "to"),
    [
        ("queued", "pending", "in_progress"),
        ("running", "in_progress", "completed"),
        ("running", "running", "pending"),
        ("blocked", "blocked", "pending"),
        ("queued", "pending", "completed"),
    ],
)
def test_transition_accepts_aliases_and_stores_canonical_names(
    ledger: Ledger, src: str, expected: str, to: str
) -> None:
    task = bring(ledger, S(src))
    after = ledger.transition(task.id, expected, to)
    canonical = ALIASES.get(to) or S(to)
    assert after.status is canonical
    assert ledger.get_task(task.id).status.value == canonical.value
    assert after.to_dict()["status"] == canonical.value


# -- expected is checked first ---------------------------------------------------


@pytest.mark.parametrize("stored", NON_TERMINAL)
def test_expected_mismatch_conflicts_even_when_to_is_the_stored_status(
    ledger: Ledger, db_path: Path, stored: TaskStatus
) -> None:
    task = bring(ledger, stored)
    for expected in ALL:
        if expected is stored:
            continue
        assert_refused(
            ledger,
            db_path,
            task.id,
            StateConflict,
            lambda e=expected: ledger.transition(task.id, e, stored),
        )


@pytest.mark.parametrize("stored", TERMINAL)
def test_terminal_same_status_is_a_noop_only_when_expected_matches(
    ledger: Ledger, db_path: Path, clock: FrozenClock, stored: TaskStatus
) -> None:
    task = bring(ledger, stored)
    clock.advance(3)
    dump = logical_dump(db_path)
    assert ledger.transition(task.id, stored, stored) == task
    assert ledger.close_task(task.id, stored) == task
    # The no-op ignores its code, however odd, as close_task does (peer rule).
    for code in ("worker_failed", "not a code!"):
        assert ledger.transition(task.id, stored, stored, code=code) == task
        assert ledger.close_task(task.id, stored, code=code) == task
    assert logical_dump(db_path) == dump
    for expected in ALL:
        if expected is not stored:
            assert_refused(
                ledger,
                db_path,
                task.id,
                StateConflict,
                lambda e=expected: ledger.transition(task.id, e, stored),
            )


def test_expected_is_checked_before_the_table(ledger: Ledger, db_path: Path) -> None:
    # queued -> running is an edge, but the task is blocked: the mismatch decides.
    task = bring(ledger, S.BLOCKED)
    assert_refused(
        ledger,
        db_path,
        task.id,
        StateConflict,
        lambda: ledger.transition(task.id, "queued", "running"),
    )


# -- owners and attempts through transition --------------------------------------


def test_transition_queued_to_running_with_worker_sets_owner(
    ledger: Ledger, db_path: Path, clock: FrozenClock
) -> None:
    task = bring(ledger, S.QUEUED)
    clock.advance(2)
    running = ledger.transition(task.id, "queued", "running", worker="w9")
    assert (running.owner, running.attempt_count, running.version) == ("w9", 1, 1)
    assert running.started_at == clock.now and running.deadline_at == clock.now + TIMEOUT
    assert events(db_path, task.id)[-1] == ("task_transition", "queued", "running", "claimed", "w9")
    assert ledger.list_tasks(owner="w9") == [running]

    back = ledger.transition(task.id, "running", "queued", worker="w9")
    assert (back.owner, back.started_at, back.deadline_at) == (None, None, None)
    assert back.attempt_count == 1
    again = ledger.transition(task.id, "queued", "running", worker="w8")
    assert (again.owner, again.attempt_count) == ("w8", 2)


@pytest.mark.parametrize("worker", ["w1", None])
def test_transition_back_to_the_queue_is_a_release_with_its_attempts_rule(
    worker: str | None, db_path: Path, clock: FrozenClock
) -> None:
    """``running -> queued`` is the release edge (SPEC 3), so it applies
    release's attempts rule too: once the attempts are used up the task is
    escalated (``attempts_exhausted``), whoever asks. It used to go back to
    the queue every time, and a worker looped a task of ``max_attempts=1``
    for ever."""
    with Ledger(db_path, clock=clock) as lg:
        task = lg.create_task(max_attempts=2)
        for attempt in (1, 2):
            running = lg.claim(task.id, "w1")
            assert running is not None and running.attempt_count == attempt
            back = lg.transition(task.id, "in_progress", "pending", worker=worker)
            if attempt == 1:
                assert (back.status, back.owner) == (S.QUEUED, None)
        assert (back.status, back.park_code, back.owner) == (
            S.ESCALATED,
            "attempts_exhausted",
            "w1",
        )
        assert lg.claim(task.id, "w2") is None
    assert events(db_path, task.id)[-1] == (
        "task_transition",
        "running",
        "escalated",
        "attempts_exhausted",
        worker,
    )


def test_transition_fences_other_workers_and_stale_attempts(ledger: Ledger, db_path: Path) -> None:
    task = bring(ledger, S.RUNNING)
    assert_refused(
        ledger,
        db_path,
        task.id,
        StateConflict,
        lambda: ledger.transition(task.id, "running", "succeeded", worker="w2"),
    )
    assert_refused(
        ledger,
        db_path,
        task.id,
        StateConflict,
        lambda: ledger.transition(task.id, "running", "succeeded", attempt=2),
    )
    done = ledger.transition(task.id, "running", "succeeded", worker=WORKER, attempt=1)
    assert (done.status, done.owner) == (S.SUCCEEDED, WORKER)


def test_transition_fences_a_stale_worker_on_a_requeued_task(ledger: Ledger, db_path: Path) -> None:
    """A worker whose task went back to the queue holds no claim: its fenced
    transitions are refused exactly as its ``close_task`` is."""
    task = bring(ledger, S.RUNNING)
    ledger.release(task.id, WORKER)
    for to in (S.SUCCEEDED, S.CANCELLED):
        assert_refused(
            ledger,
            db_path,
            task.id,
            StateConflict,
            lambda to=to: ledger.transition(task.id, "queued", to, worker=WORKER, attempt=1),
        )
    assert_refused(
        ledger,
        db_path,
        task.id,
        StateConflict,
        lambda: ledger.close_task(task.id, "succeeded", worker=WORKER, attempt=1),
    )


def test_a_claim_by_transition_compares_only_the_attempt(ledger: Ledger, db_path: Path) -> None:
    """queued -> running with ``worker`` makes it the owner; an ``attempt``
    that is not the task's current one is a stale view and is refused."""
    task = bring(ledger, S.QUEUED)
    assert_refused(
        ledger,
        db_path,
        task.id,
        StateConflict,
        lambda: ledger.transition(task.id, "queued", "running", worker="w2", attempt=99),
    )
    claimed = ledger.transition(task.id, "queued", "running", worker="w2", attempt=0)
    assert (claimed.owner, claimed.attempt_count) == ("w2", 1)


def test_owner_is_kept_through_running_parked_and_terminal(ledger: Ledger) -> None:
    task = bring(ledger, S.QUEUED)
    assert ledger.claim(task.id, "w5").owner == "w5"
    assert ledger.block(task.id).owner == "w5"
    requeued = ledger.requeue(task.id)
    assert requeued.owner is None and requeued.started_at is None
    assert ledger.claim(task.id, "w6").owner == "w6"
    assert ledger.escalate(task.id).owner == "w6"
    cancelled = ledger.cancel(task.id)
    assert (cancelled.status, cancelled.owner, cancelled.attempt_count) == (S.CANCELLED, "w6", 2)


# -- block / escalate / requeue / cancel -----------------------------------------


@pytest.mark.parametrize(
    ("method", "status", "park"),
    [("block", S.BLOCKED, "needs_input"), ("escalate", S.ESCALATED, "escalated_manually")],
)
def test_block_and_escalate_park_a_running_task(
    ledger: Ledger, db_path: Path, clock: FrozenClock, method: str, status: TaskStatus, park: str
) -> None:
    task = bring(ledger, S.RUNNING)
    clock.advance(1)
    parked = getattr(ledger, method)(task.id)
    assert (parked.status, parked.park_code, parked.owner) == (status, park, WORKER)
    assert parked.version == task.version + 1
    assert parked.terminal_code is None
    assert events(db_path, task.id)[-1][:4] == ("task_transition", "running", status.value, park)


@pytest.mark.parametrize("method", ["block", "escalate"])
@pytest.mark.parametrize("src", [s for s in ALL if s is not S.RUNNING])
def test_block_and_escalate_act_on_running_only(
    ledger: Ledger, db_path: Path, method: str, src: TaskStatus
) -> None:
    task = bring(ledger, src)
    assert_refused(
        ledger, db_path, task.id, StateConflict, lambda: getattr(ledger, method)(task.id)
    )


@pytest.mark.parametrize("method", ["block", "escalate"])
def test_block_and_escalate_fence_the_worker(ledger: Ledger, db_path: Path, method: str) -> None:
    task = bring(ledger, S.RUNNING)
    assert_refused(
        ledger,
        db_path,
        task.id,
        StateConflict,
        lambda: getattr(ledger, method)(task.id, worker="w2"),
    )
    stale = task.attempt_count + 1
    for who in ({"attempt": stale}, {"worker": WORKER, "attempt": stale}):
        park = functools.partial(getattr(ledger, method), task.id, **who)
        assert_refused(ledger, db_path, task.id, StateConflict, park)
    parked = getattr(ledger, method)(task.id, worker=WORKER, attempt=task.attempt_count)
    assert parked.owner == WORKER


@pytest.mark.parametrize("src", PARKED)
def test_requeue_returns_a_parked_task_to_the_queue(
    ledger: Ledger, db_path: Path, clock: FrozenClock, src: TaskStatus
) -> None:
    task = bring(ledger, src)
    clock.advance(1)
    queued = ledger.requeue(task.id)
    assert queued.status is S.QUEUED
    assert (queued.owner, queued.park_code, queued.started_at, queued.deadline_at) == (
        None,
        None,
        None,
        None,
    )
    assert queued.attempt_count == task.attempt_count
    assert queued.version == task.version + 1
    assert events(db_path, task.id)[-1][:4] == ("task_transition", src.value, "queued", "requeued")
    # a human requeue buys another claim
    assert ledger.claim(task.id, "w2").attempt_count == 2


@pytest.mark.parametrize("src", [S.QUEUED, S.RUNNING, *TERMINAL])
def test_requeue_acts_on_parked_tasks_only(ledger: Ledger, db_path: Path, src: TaskStatus) -> None:
    task = bring(ledger, src)
    assert_refused(ledger, db_path, task.id, StateConflict, lambda: ledger.requeue(task.id))


@pytest.mark.parametrize("src", NON_TERMINAL)
def test_cancel_any_non_terminal(
    ledger: Ledger, db_path: Path, clock: FrozenClock, src: TaskStatus
) -> None:
    task = bring(ledger, src)
    clock.advance(1)
    done = ledger.cancel(task.id)
    assert (done.status, done.terminal_code, done.park_code) == (
        S.CANCELLED,
        "caller_cancelled",
        None,
    )
    assert done.owner == task.owner
    assert done.ended_at == clock.now and done.version == task.version + 1
    assert events(db_path, task.id)[-1][2:4] == ("cancelled", "caller_cancelled")
    dump = logical_dump(db_path)
    clock.advance(1)
    assert ledger.cancel(task.id) == done
    assert logical_dump(db_path) == dump


@pytest.mark.parametrize("src", [S.SUCCEEDED, S.FAILED, S.TIMED_OUT])
def test_cancel_of_another_terminal_conflicts(
    ledger: Ledger, db_path: Path, src: TaskStatus
) -> None:
    task = bring(ledger, src)
    assert_refused(ledger, db_path, task.id, StateConflict, lambda: ledger.cancel(task.id))


@pytest.mark.parametrize("src", PARKED)
@pytest.mark.parametrize("to", TERMINAL)
def test_close_task_from_parked_only_cancelled(
    ledger: Ledger, db_path: Path, src: TaskStatus, to: TaskStatus
) -> None:
    task = bring(ledger, src)
    if to is S.CANCELLED:
        done = ledger.close_task(task.id, to)
        assert (done.status, done.park_code, done.owner) == (S.CANCELLED, None, WORKER)
        assert done.version == task.version + 1
    else:
        assert_refused(
            ledger, db_path, task.id, StateConflict, lambda: ledger.close_task(task.id, to)
        )


@pytest.mark.parametrize("src", [S.QUEUED, S.RUNNING])
@pytest.mark.parametrize("to", TERMINAL)
def test_close_task_from_active_reaches_every_terminal(
    ledger: Ledger, src: TaskStatus, to: TaskStatus
) -> None:
    task = bring(ledger, src)
    done = ledger.close_task(task.id, to)
    assert done.status is to and done.owner == task.owner
    assert done.version == task.version + 1


@pytest.mark.parametrize(
    ("first", "second"), [(a, b) for a in TERMINAL for b in TERMINAL if a != b]
)
def test_close_task_to_another_terminal_conflicts(
    ledger: Ledger, db_path: Path, first: TaskStatus, second: TaskStatus
) -> None:
    task = bring(ledger, first)
    assert_refused(
        ledger, db_path, task.id, StateConflict, lambda: ledger.close_task(task.id, second)
    )


@pytest.mark.parametrize("status", NON_TERMINAL)
def test_close_task_refuses_non_terminal_targets(
    ledger: Ledger, db_path: Path, status: TaskStatus
) -> None:
    task = bring(ledger, S.RUNNING)
    assert_refused(
        ledger, db_path, task.id, InvalidInput, lambda: ledger.close_task(task.id, status)
    )


# -- reason codes ------------------------------------------------------------------

#: target -> (source to reach it from, codes a caller may pass)
CALLER_CODES: dict[TaskStatus, tuple[TaskStatus, list[str]]] = {
    S.SUCCEEDED: (S.RUNNING, ["completed", "worker_completed"]),
    S.FAILED: (S.RUNNING, ["worker_failed"]),
    S.TIMED_OUT: (S.RUNNING, ["deadline_exceeded", "restart_stale", "worker_lost"]),
    S.CANCELLED: (S.RUNNING, ["caller_cancelled"]),
    S.BLOCKED: (S.RUNNING, ["needs_input"]),
    S.ESCALATED: (S.RUNNING, ["escalated_manually"]),
    S.QUEUED: (S.BLOCKED, []),
    S.RUNNING: (S.QUEUED, []),
}

REGISTERED = [
    "attempts_exhausted",
    "budget_exhausted",
    "budget_granted",
    "caller_cancelled",
    "claimed",
    "completed",
    "created",
    "deadline_exceeded",
    "delivery_grace_expired",
    "escalated_manually",
    "internal_task",
    "needs_input",
    "released",
    "requeued",
    "restart_stale",
    "started",
    "transport_acknowledged",
    "transport_failed",
    "worker_completed",
    "worker_failed",
    "worker_lost",
]

ALLOWED_CODE_CASES = [(to, code) for to, (_, codes) in CALLER_CODES.items() for code in codes]
REFUSED_CODE_CASES = [
    (to, code)
    for to, (_, codes) in CALLER_CODES.items()
    for code in [*REGISTERED, "not_a_code", "Bad Code", ""]
    if code not in codes
]


@pytest.mark.parametrize(("to", "code"), ALLOWED_CODE_CASES)
def test_allowed_codes_are_stored(ledger: Ledger, db_path: Path, to: TaskStatus, code: str) -> None:
    src, _ = CALLER_CODES[to]
    task = bring(ledger, src)
    after = ledger.transition(task.id, src, to, code=code)
    assert after.status is to
    if to.is_terminal:
        assert (after.terminal_code, after.park_code) == (code, None)
    else:
        assert (after.park_code, after.terminal_code) == (code, None)
    assert events(db_path, task.id)[-1][3] == code


@pytest.mark.parametrize(("to", "code"), REFUSED_CODE_CASES)
def test_refused_codes_write_nothing(
    ledger: Ledger, db_path: Path, to: TaskStatus, code: str
) -> None:
    src, _ = CALLER_CODES[to]
    task = bring(ledger, src)
    assert_refused(
        ledger,
        db_path,
        task.id,
        InvalidInput,
        lambda: ledger.transition(task.id, src, to, code=code),
    )


@pytest.mark.parametrize("code", ["budget_exhausted", "attempts_exhausted", "created", "nope"])
def test_escalate_refuses_ledger_only_codes(ledger: Ledger, db_path: Path, code: str) -> None:
    task = bring(ledger, S.RUNNING)
    assert_refused(
        ledger, db_path, task.id, InvalidInput, lambda: ledger.escalate(task.id, code=code)
    )


@pytest.mark.parametrize("code", ["escalated_manually", "requeued", "released", "BAD"])
def test_block_refuses_other_codes(ledger: Ledger, db_path: Path, code: str) -> None:
    task = bring(ledger, S.RUNNING)
    assert_refused(ledger, db_path, task.id, InvalidInput, lambda: ledger.block(task.id, code=code))


@pytest.mark.parametrize(
    ("to", "code"),
    [
        (S.SUCCEEDED, "worker_failed"),
        (S.FAILED, "completed"),
        (S.TIMED_OUT, "created"),
        (S.CANCELLED, "budget_exhausted"),
        (S.SUCCEEDED, "unregistered_code"),
    ],
)
def test_close_task_refuses_codes_of_other_targets(
    ledger: Ledger, db_path: Path, to: TaskStatus, code: str
) -> None:
    task = bring(ledger, S.RUNNING)
    assert_refused(
        ledger, db_path, task.id, InvalidInput, lambda: ledger.close_task(task.id, to, code=code)
    )


@pytest.mark.parametrize(("to", "code"), [(t, c) for t, c in ALLOWED_CODE_CASES if t.is_terminal])
def test_close_task_stores_allowed_codes(ledger: Ledger, to: TaskStatus, code: str) -> None:
    task = bring(ledger, S.RUNNING)
    assert ledger.close_task(task.id, to, code=code).terminal_code == code


def test_ledger_written_codes_for_claim_release_requeue(ledger: Ledger, db_path: Path) -> None:
    task = bring(ledger, S.QUEUED, max_attempts=2)
    ledger.claim(task.id, "w1")
    ledger.release(task.id, "w1")
    ledger.claim(task.id, "w1")
    exhausted = ledger.release(task.id, "w1")
    assert (exhausted.status, exhausted.park_code, exhausted.owner) == (
        S.ESCALATED,
        "attempts_exhausted",
        "w1",
    )
    ledger.requeue(task.id)
    codes = [e[3] for e in events(db_path, task.id)]
    assert codes == ["created", "claimed", "released", "claimed", "attempts_exhausted", "requeued"]


# ---------------------------------------------------------------------------
# The per-status code tables are the ones the core enforces


def _accepts(call: Any, *args: Any, **kwargs: Any) -> bool:
    try:
        call(*args, **kwargs)
    except InvalidInput:
        return False
    return True


@pytest.mark.parametrize("to", sorted(s.value for s in TaskStatus if s.is_terminal))
def test_the_task_code_table_is_what_close_accepts(to: str) -> None:
    """Every registered code is accepted for a terminal status exactly when
    TASK_REASON_CODES lists it (closing with no code is always allowed)."""
    allowed = taskwarden.TASK_REASON_CODES[TaskStatus(to)]
    with Ledger.in_memory() as mem:
        for code in sorted(taskwarden.REASON_CODES):
            task = mem.create_task()
            assert _accepts(mem.close_task, task.id, to, code=code) == (code in allowed), code


@pytest.mark.parametrize("outcome", ["delivered", "failed", "not_applicable"])
def test_the_delivery_code_table_is_what_set_delivery_accepts(outcome: str) -> None:
    allowed = taskwarden.DELIVERY_REASON_CODES[DeliveryStatus(outcome)]
    with Ledger.in_memory() as mem:
        for code in sorted(taskwarden.REASON_CODES):
            task = mem.create_task(delivery_required=outcome != "not_applicable")
            mem.close_task(task.id, "succeeded")
            accepted = _accepts(mem.set_delivery, task.id, outcome, code=code)
            assert accepted == (code in allowed), code


def test_the_cli_help_lists_the_codes_each_status_allows() -> None:
    from taskwarden.cli import build_parser

    subcommands = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    close_help = " ".join(subcommands.choices["close"].format_help().split())
    for to, codes in taskwarden.TASK_REASON_CODES.items():
        if to.is_terminal:
            assert f"{to}: {', '.join(sorted(codes))}" in close_help


@pytest.mark.parametrize("worker", ["w1", None])
def test_transition_back_to_the_queue_records_released_like_release(
    worker: str | None, db_path: Path, clock: FrozenClock
) -> None:
    with Ledger(db_path, clock=clock) as lg:
        via_release = lg.create_task()
        via_transition = lg.create_task()
        for task in (via_release, via_transition):
            assert lg.claim(task.id, "w1") is not None
        lg.release(via_release.id, "w1")
        back = lg.transition(via_transition.id, "running", "queued", worker=worker)
        assert (back.status, back.owner, back.park_code) == (S.QUEUED, None, None)
        # A parked task goes back with `requeued`, the operator's code.
        parked = lg.create_task()
        lg.claim(parked.id, "w1")
        lg.block(parked.id)
        lg.transition(parked.id, "blocked", "queued")
    assert events(db_path, via_transition.id)[-1] == (
        "task_transition", "running", "queued", "released", worker,
    )  # fmt: skip
    assert events(db_path, via_release.id)[-1][3] == "released"
    assert events(db_path, parked.id)[-1][3] == "requeued"
