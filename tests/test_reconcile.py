"""Restart reconciliation (SPEC §5, reference §3.4/§3.5): the decisions at
their thresholds, the report, the rows and events written, dry run versus
apply, the peer side by side, concurrent writers and the CLI."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import random
import shutil
import sqlite3
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import task_state_guard as tsg

from taskwarden import Ledger, ReconcilePolicy, reconcile_restart
from taskwarden.errors import InvalidInput, LedgerBusy, StateConflict, TaskNotFound

from .conftest import EVENT_TASK_ID, OF_TASK, FrozenClock, held_open, logical_dump, run_cli

SPAWN = multiprocessing.get_context("spawn")

REPORT_KEYS = (
    "dry_run",
    "applied",
    "active_examined",
    "tasks_timed_out",
    "fresh_active_retained",
    "pending_delivery_examined",
    "deliveries_failed",
    "deliveries_not_applicable",
    "pending_delivery_retained",
)
COUNT_KEYS = REPORT_KEYS[2:]
TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")
BIG = 1e9  # a grace no task in these tests reaches


def counts(report: dict[str, Any]) -> dict[str, int]:
    """The report without its two flags, after checking its shape and invariants."""
    assert tuple(report) == REPORT_KEYS
    assert report["applied"] is (not report["dry_run"])
    out = {k: report[k] for k in COUNT_KEYS}
    assert all(type(v) is int and v >= 0 for v in out.values()), out
    assert out["active_examined"] == out["tasks_timed_out"] + out["fresh_active_retained"]
    assert out["pending_delivery_examined"] == (
        out["deliveries_failed"]
        + out["deliveries_not_applicable"]
        + out["pending_delivery_retained"]
    )
    return out


def expect(
    active: int, timed_out: int, pending: int, failed: int, not_applicable: int
) -> dict[str, int]:
    return {
        "active_examined": active,
        "tasks_timed_out": timed_out,
        "fresh_active_retained": active - timed_out,
        "pending_delivery_examined": pending,
        "deliveries_failed": failed,
        "deliveries_not_applicable": not_applicable,
        "pending_delivery_retained": pending - failed - not_applicable,
    }


def tid(n: int) -> str:
    return str(uuid.UUID(int=n))


def query(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """A short-lived read; only ever called while no Ledger of this process has the file."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return list(conn.execute(sql, params))


def execute(path: Path, sql: str, params: tuple[Any, ...] = ()) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(sql, params)


def events(path: Path, task_id: str | None = None) -> list[tuple[Any, ...]]:
    sql = (
        f"SELECT {EVENT_TASK_ID}, event_kind, from_value, to_value, occurred_at, code "
        "FROM task_events"
    )
    if task_id is None:
        return query(path, sql + " ORDER BY sequence")
    return query(path, sql + f" WHERE {OF_TASK} ORDER BY sequence", (task_id,))


def private_copy(src: Path, tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    directory.mkdir(mode=0o700)
    dst = directory / "ledger.db"
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o600)
    return dst


def set_owner(path: Path, task_id: str, owner: str) -> None:
    """No public claim API yet: give a running task an owner behind the ledger's back."""
    execute(
        path, "UPDATE tasks SET owner = ? WHERE id = ? AND status = 'running'", (owner, task_id)
    )
    assert query(path, "SELECT owner FROM tasks WHERE id = ?", (task_id,)) == [(owner,)]


# ---------------------------------------------------------------------------
# A fixed scenario, written only through the API both packages share.


def build_scenario(ledger: Any, clock: FrozenClock, base: float) -> dict[str, str]:
    """Every kind of row reconcile meets. ``ledger`` is a taskwarden or a peer Ledger."""
    ids: dict[str, str] = {}

    def at(offset: float) -> None:
        clock.now = base + offset

    def make(name: str, n: int, offset: float, **kw: Any) -> str:
        at(offset)
        ids[name] = ledger.create_task(task_id=tid(n), **kw).id
        return ids[name]

    make("q_old", 1, -10_000)
    make("q_new", 2, -10)

    t = make("r_deadline", 3, -5000, timeout_seconds=60.0)
    ledger.start_task(t)
    at(-100)
    ledger.heartbeat(t)

    t = make("r_stale", 4, -3000)
    ledger.start_task(t)

    t = make("r_stale_internal", 5, -2000, delivery_required=False)
    ledger.start_task(t)
    at(-1000)
    ledger.heartbeat(t)

    t = make("r_fresh", 6, -200, timeout_seconds=3600.0)
    ledger.start_task(t)
    at(-50)
    ledger.heartbeat(t)

    t = make("s_old_req", 7, -90_000)
    ledger.start_task(t)
    at(-89_990)
    ledger.close_task(t, "succeeded", code="worker_completed")

    t = make("s_old_int", 8, -80_000, delivery_required=False)
    ledger.close_task(t, "succeeded", code="completed")

    t = make("f_recent", 9, -500)
    ledger.start_task(t)
    at(-400)
    ledger.close_task(t, "failed", code="worker_failed")

    t = make("c_recent_int", 10, -300, delivery_required=False)
    ledger.close_task(t, "cancelled", code="caller_cancelled")

    t = make("delivered", 11, -70_000)
    ledger.start_task(t)
    at(-69_000)
    ledger.close_task(t, "succeeded")
    ledger.set_delivery(t, "delivered", code="transport_acknowledged")

    t = make("na_done", 12, -60_000, delivery_required=False, parent_id=ids["delivered"])
    ledger.close_task(t, "succeeded")
    ledger.set_delivery(t, "not_applicable", code="internal_task")

    t = make("t_manual", 13, -7300, timeout_seconds=10.0)
    ledger.start_task(t)
    at(-7200)
    ledger.close_task(t, "timed_out", code="deadline_exceeded")

    at(0)
    return ids


#: The scenario's counts at ``now = base``, by (active grace, delivery grace).
SCENARIO_EXPECTED = {
    (600.0, 3600.0): expect(6, 3, 8, 2, 1),
    (600.0, 0.0): expect(6, 3, 8, 5, 3),
    (0.0, 0.0): expect(6, 4, 9, 6, 3),
    (BIG, BIG): expect(6, 1, 6, 0, 0),
}


@pytest.fixture
def scenario(db_path: Path, clock: FrozenClock) -> dict[str, str]:
    with Ledger(db_path, clock=clock) as ledger:
        return build_scenario(ledger, clock, clock.now)


# ---------------------------------------------------------------------------
# Thresholds, all inclusive.

DELTAS = [(-1e-3, False), (0.0, True), (1e-3, True)]
DELTA_IDS = ["before", "exactly_at", "after"]


@pytest.mark.parametrize(("delta", "fires"), DELTAS, ids=DELTA_IDS)
def test_deadline_threshold(db_path: Path, clock: FrozenClock, delta: float, fires: bool) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(timeout_seconds=120.0)
        task = ledger.start_task(task.id)
        assert task.deadline_at == clock.now + 120.0
        clock.now = task.deadline_at + delta
        assert (task.deadline_at <= clock.now) is fires
        preview = ledger.reconcile(
            active_grace_seconds=BIG, delivery_grace_seconds=BIG, dry_run=True
        )
        report = ledger.reconcile(active_grace_seconds=BIG, delivery_grace_seconds=BIG)
        after = ledger.get_task(task.id)
    assert counts(preview) == counts(report) == expect(1, int(fires), int(fires), 0, 0)
    if fires:
        assert (after.status, after.terminal_code) == ("timed_out", "deadline_exceeded")
        assert after.ended_at == after.updated_at == clock.now
        assert after.version == task.version + 1
    else:
        assert after == task


@pytest.mark.parametrize(("delta", "fires"), DELTAS, ids=DELTA_IDS)
def test_stale_threshold(db_path: Path, clock: FrozenClock, delta: float, fires: bool) -> None:
    clock.now = 1_800_000_000.0
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(timeout_seconds=BIG)
        ledger.start_task(task.id)
        clock.now = 1_800_000_100.0
        task = ledger.heartbeat(task.id)
        assert task.updated_at == 1_800_000_100.0
        clock.now = 1_800_000_700.0 + delta
        assert (task.updated_at <= clock.now - 600.0) is fires
        preview = ledger.reconcile(
            active_grace_seconds=600.0, delivery_grace_seconds=BIG, dry_run=True
        )
        report = ledger.reconcile(active_grace_seconds=600.0, delivery_grace_seconds=BIG)
        after = ledger.get_task(task.id)
    assert counts(preview) == counts(report) == expect(1, int(fires), int(fires), 0, 0)
    if fires:
        assert (after.status, after.terminal_code) == ("timed_out", "restart_stale")
        assert after.ended_at == after.updated_at == clock.now
    else:
        assert after == task


@pytest.mark.parametrize("required", [True, False], ids=["required", "internal"])
@pytest.mark.parametrize(("delta", "fires"), DELTAS, ids=DELTA_IDS)
def test_delivery_grace_threshold(
    db_path: Path, clock: FrozenClock, delta: float, fires: bool, required: bool
) -> None:
    clock.now = 1_800_000_000.0
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(delivery_required=required)
        ledger.start_task(task.id)
        clock.now = 1_800_000_050.0
        task = ledger.close_task(task.id, "succeeded")
        clock.now = 1_800_003_650.0 + delta
        assert (task.ended_at <= clock.now - 3600.0) is fires
        preview = ledger.reconcile(
            active_grace_seconds=600.0, delivery_grace_seconds=3600.0, dry_run=True
        )
        report = ledger.reconcile(active_grace_seconds=600.0, delivery_grace_seconds=3600.0)
        after = ledger.get_task(task.id)
    closed = int(fires)
    assert counts(preview) == counts(report)
    assert counts(report) == expect(0, 0, 1, closed * required, closed * (not required))
    if not fires:
        assert after == task
        return
    target = (
        ("failed", "delivery_grace_expired") if required else ("not_applicable", "internal_task")
    )
    assert (after.delivery_status, after.delivery_code) == target
    assert after.delivery_updated_at == clock.now
    assert after.status == "succeeded"
    assert after.updated_at == after.ended_at == 1_800_000_050.0
    assert after.version == task.version + 1


def _owned_running(
    db_path: Path, clock: FrozenClock, specs: list[tuple[float | None, float, str | None]]
) -> list[str]:
    """Running tasks from (timeout, age of last update, owner); now stays at clock.now."""
    now = clock.now
    ids = []
    with Ledger(db_path, clock=clock) as ledger:
        for timeout, age, _ in specs:
            clock.now = now - age
            task = ledger.create_task(timeout_seconds=timeout)
            ledger.start_task(task.id)
            ids.append(task.id)
    clock.now = now
    for task_id, (_, _, owner) in zip(ids, specs, strict=True):
        if owner is not None:
            set_owner(db_path, task_id, owner)
    return ids


def test_code_precedence_deadline_then_stale_then_worker_lost(
    db_path: Path, clock: FrozenClock
) -> None:
    ids = _owned_running(
        db_path,
        clock,
        [
            (60.0, 1000.0, "w1"),  # deadline and stale and lost worker
            (60.0, 100.0, "w1"),  # deadline and lost worker, not stale
            (None, 1000.0, "w1"),  # stale and lost worker
            (None, 100.0, "w1"),  # lost worker only
            (3600.0, 100.0, "w2"),  # another worker: fresh
            (None, 100.0, None),  # no owner: fresh
        ],
    )
    with Ledger(db_path, clock=clock) as ledger:
        report = ledger.reconcile(
            active_grace_seconds=600.0, delivery_grace_seconds=BIG, worker_lost="w1"
        )
        tasks = [ledger.get_task(t) for t in ids]
    assert counts(report) == expect(6, 4, 4, 0, 0)
    assert [(t.status.value, t.terminal_code) for t in tasks] == [
        ("timed_out", "deadline_exceeded"),
        ("timed_out", "deadline_exceeded"),
        ("timed_out", "restart_stale"),
        ("timed_out", "worker_lost"),
        ("running", None),
        ("running", None),
    ]
    assert [t.owner for t in tasks] == ["w1", "w1", "w1", "w1", "w2", None]
    for task_id, task in zip(ids, tasks, strict=True):
        if task.status == "timed_out":
            assert events(db_path, task_id)[-1][1:] == (
                "task_transition",
                "running",
                "timed_out",
                clock.now,
                task.terminal_code,
            )


def test_queued_tasks_are_never_timed_out(db_path: Path, clock: FrozenClock) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        old = ledger.create_task(timeout_seconds=1.0)
        internal = ledger.create_task(delivery_required=False)
        clock.advance(10 * 365 * 86_400.0)
        for kwargs in ({}, {"dry_run": True}):
            report = ledger.reconcile(
                active_grace_seconds=0.0, delivery_grace_seconds=0.0, **kwargs
            )
            assert counts(report) == expect(2, 0, 0, 0, 0)
        assert ledger.get_task(old.id) == old
        assert ledger.get_task(internal.id) == internal
    assert [e[1] for e in events(db_path)] == ["created", "created"]


def test_terminal_statuses_are_never_rewritten(db_path: Path, clock: FrozenClock) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        before = {}
        for status in TERMINAL:
            for required in (True, False):
                task = ledger.create_task(timeout_seconds=1.0, delivery_required=required)
                ledger.start_task(task.id)
                clock.advance(5.0)
                before[task.id] = ledger.close_task(task.id, status)
        done = ledger.create_task()
        ledger.close_task(done.id, "failed")
        before[done.id] = ledger.set_delivery(done.id, "delivered")
        clock.advance(86_400.0)
        report = ledger.reconcile(active_grace_seconds=0.0, delivery_grace_seconds=0.0)
        assert counts(report) == expect(0, 0, 8, 4, 4)
        for task_id, old in before.items():
            new = ledger.get_task(task_id)
            assert (new.status, new.terminal_code, new.updated_at, new.ended_at) == (
                old.status,
                old.terminal_code,
                old.updated_at,
                old.ended_at,
            )
            if old.delivery_status == "delivered":
                assert new == old
            else:
                assert new.version == old.version + 1
        again = ledger.reconcile(active_grace_seconds=0.0, delivery_grace_seconds=0.0)
        assert counts(again) == expect(0, 0, 0, 0, 0)


# ---------------------------------------------------------------------------
# The report on the fixed scenario.


@pytest.mark.parametrize(("graces", "expected"), list(SCENARIO_EXPECTED.items()))
def test_mixed_scenario_exact_counts(
    db_path: Path,
    clock: FrozenClock,
    scenario: dict[str, str],
    graces: tuple[float, float],
    expected: dict[str, int],
) -> None:
    grace = {"active_grace_seconds": graces[0], "delivery_grace_seconds": graces[1]}
    with Ledger(db_path, read_only=True, clock=clock) as reader:
        preview = reader.reconcile(dry_run=True, **grace)
    with Ledger(db_path, clock=clock) as ledger:
        writable_preview = ledger.reconcile(dry_run=True, **grace)
        applied = ledger.reconcile(**grace)
        recheck = ledger.reconcile(**grace)
    assert (preview["dry_run"], preview["applied"]) == (True, False)
    assert (writable_preview["dry_run"], writable_preview["applied"]) == (True, False)
    assert (applied["dry_run"], applied["applied"]) == (False, True)
    assert counts(preview) == counts(writable_preview) == counts(applied) == expected
    left_active = expected["active_examined"] - expected["tasks_timed_out"]
    left_pending = expected["pending_delivery_examined"] - (
        expected["deliveries_failed"] + expected["deliveries_not_applicable"]
    )
    assert counts(recheck) == expect(left_active, 0, left_pending, 0, 0)


def test_scenario_rows_after_apply(
    db_path: Path, clock: FrozenClock, scenario: dict[str, str]
) -> None:
    now = clock.now
    with Ledger(db_path, clock=clock) as ledger:
        before = {name: ledger.get_task(t) for name, t in scenario.items()}
    events_before = events(db_path)
    with Ledger(db_path, clock=clock) as ledger:
        ledger.reconcile(active_grace_seconds=600.0, delivery_grace_seconds=3600.0)
        after = {name: ledger.get_task(t) for name, t in scenario.items()}
    new_events = events(db_path)[len(events_before) :]
    assert events(db_path)[: len(events_before)] == events_before

    timed_out = {"r_deadline": "deadline_exceeded", "r_stale": "restart_stale"}
    timed_out["r_stale_internal"] = "restart_stale"
    delivered = {"s_old_req": "failed", "t_manual": "failed", "s_old_int": "not_applicable"}
    expected_events = []
    for name, code in timed_out.items():
        old, new = before[name], after[name]
        assert (new.status, new.terminal_code) == ("timed_out", code)
        assert new.ended_at == new.updated_at == now
        assert new.version == old.version + 1
        assert (new.delivery_status, new.delivery_code) == ("pending", None)
        assert new.delivery_updated_at == old.delivery_updated_at
        assert (new.started_at, new.deadline_at, new.created_at) == (
            old.started_at,
            old.deadline_at,
            old.created_at,
        )
        expected_events.append((old.id, "task_transition", "running", "timed_out", now, code))
    for name, target in delivered.items():
        old, new = before[name], after[name]
        code = "delivery_grace_expired" if target == "failed" else "internal_task"
        assert (new.delivery_status, new.delivery_code) == (target, code)
        assert new.delivery_updated_at == now
        assert (new.status, new.updated_at, new.ended_at, new.terminal_code) == (
            old.status,
            old.updated_at,
            old.ended_at,
            old.terminal_code,
        )
        assert new.version == old.version + 1
        expected_events.append((old.id, "delivery_transition", "pending", target, now, code))
    for name in set(scenario) - set(timed_out) - set(delivered):
        assert after[name] == before[name], name
    assert sorted(new_events) == sorted(expected_events)
    assert len(new_events) == len({e[0] for e in new_events})


def test_applying_twice_changes_nothing_the_second_time(
    db_path: Path, clock: FrozenClock, scenario: dict[str, str]
) -> None:
    grace = {"active_grace_seconds": 0.0, "delivery_grace_seconds": 0.0}
    with Ledger(db_path, clock=clock) as ledger:
        first = ledger.reconcile(**grace)
    assert counts(first) == SCENARIO_EXPECTED[(0.0, 0.0)]
    dump = logical_dump(db_path)
    with Ledger(db_path, clock=clock) as ledger:
        second = ledger.reconcile(**grace)
    assert counts(second) == expect(2, 0, 0, 0, 0)
    assert logical_dump(db_path) == dump
    clock.advance(1e6)  # later still: nothing left to decide
    with Ledger(db_path, clock=clock) as ledger:
        third = ledger.reconcile(**grace)
    assert counts(third) == expect(2, 0, 0, 0, 0)
    assert logical_dump(db_path) == dump


def test_delivery_grace_zero_closes_the_just_timed_out_in_the_same_pass(
    db_path: Path, clock: FrozenClock
) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        required = ledger.create_task(timeout_seconds=5.0)
        internal = ledger.create_task(timeout_seconds=5.0, delivery_required=False)
        for t in (required, internal):
            ledger.start_task(t.id)
        clock.advance(10.0)
        # A grace of a millisecond keeps them pending: they ended `now`.
        tiny = ledger.reconcile(active_grace_seconds=BIG, delivery_grace_seconds=1e-3, dry_run=True)
        assert counts(tiny) == expect(2, 2, 2, 0, 0)
        report = ledger.reconcile(active_grace_seconds=BIG, delivery_grace_seconds=0.0)
        assert counts(report) == expect(2, 2, 2, 1, 1)
        req, inter = ledger.get_task(required.id), ledger.get_task(internal.id)
    now = clock.now
    assert (req.status, req.delivery_status, req.delivery_code) == (
        "timed_out",
        "failed",
        "delivery_grace_expired",
    )
    assert (inter.status, inter.delivery_status, inter.delivery_code) == (
        "timed_out",
        "not_applicable",
        "internal_task",
    )
    for task in (req, inter):
        assert task.ended_at == task.updated_at == task.delivery_updated_at == now
        assert task.version == 3
        assert [e[1:] for e in events(db_path, task.id)][1:] == [
            ("task_transition", "queued", "running", now - 10.0, "started"),
            ("task_transition", "running", "timed_out", now, "deadline_exceeded"),
            ("delivery_transition", "pending", task.delivery_status.value, now, task.delivery_code),
        ]


def test_worker_lost_times_out_only_that_workers_running_tasks(
    db_path: Path, clock: FrozenClock
) -> None:
    ids = _owned_running(
        db_path, clock, [(None, 1.0, "w1"), (None, 1.0, "w1"), (None, 1.0, "w2"), (None, 1.0, None)]
    )
    with Ledger(db_path, clock=clock) as ledger:
        queued = ledger.create_task()
        closed = ledger.create_task()
        ledger.close_task(closed.id, "cancelled")
        grace = {"active_grace_seconds": 600.0, "delivery_grace_seconds": 600.0}
        assert counts(ledger.reconcile(**grace)) == expect(5, 0, 1, 0, 0)
        for lost in ("nobody", "w3"):
            assert counts(ledger.reconcile(worker_lost=lost, **grace)) == expect(5, 0, 1, 0, 0)
        preview = ledger.reconcile(worker_lost="w1", dry_run=True, **grace)
        report = ledger.reconcile(worker_lost="w1", **grace)
        assert counts(preview) == counts(report) == expect(5, 2, 3, 0, 0)
        tasks = [ledger.get_task(t) for t in ids]
        assert ledger.get_task(queued.id) == queued
    assert [(t.status.value, t.terminal_code, t.owner) for t in tasks] == [
        ("timed_out", "worker_lost", "w1"),
        ("timed_out", "worker_lost", "w1"),
        ("running", None, "w2"),
        ("running", None, None),
    ]
    dump = logical_dump(db_path)
    with Ledger(db_path, clock=clock) as ledger:
        for bad in ("a b", "", "x" * 129, "naïve", 7):
            with pytest.raises(InvalidInput):
                ledger.reconcile(
                    active_grace_seconds=0.0, delivery_grace_seconds=0.0, worker_lost=bad
                )
            with pytest.raises(InvalidInput):
                ledger.reconcile(active_grace_seconds=0.0, delivery_grace_seconds=0.0, tenant=bad)
    assert logical_dump(db_path) == dump


def test_tenant_scoping(db_path: Path, clock: FrozenClock) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        by_tenant: dict[str | None, list[str]] = defaultdict(list)
        for tenant in ("acme", "globex", None):
            for required in (True, False):
                running = ledger.create_task(tenant=tenant, delivery_required=required)
                ledger.start_task(running.id)
                ended = ledger.create_task(tenant=tenant, delivery_required=required)
                ledger.close_task(ended.id, "failed")
                queued = ledger.create_task(tenant=tenant)
                by_tenant[tenant] += [running.id, ended.id, queued.id]
        clock.advance(3600.0)
        grace = {"active_grace_seconds": 600.0, "delivery_grace_seconds": 600.0}
        before = {t: ledger.get_task(t) for ids in by_tenant.values() for t in ids}
        preview = ledger.reconcile(tenant="acme", dry_run=True, **grace)
        report = ledger.reconcile(tenant="acme", **grace)
        # acme: 2 running + 2 queued active; 2 ended pending + 2 timed out now.
        assert counts(preview) == counts(report) == expect(4, 2, 4, 1, 1)
        for tenant, ids in by_tenant.items():
            for t in ids:
                if tenant != "acme":
                    assert ledger.get_task(t) == before[t]
        assert counts(ledger.reconcile(tenant="acme", **grace)) == expect(2, 0, 2, 0, 0)
        assert counts(ledger.reconcile(tenant="nobody", **grace)) == expect(0, 0, 0, 0, 0)
        # Unscoped: the other two tenants (and no tenant) are still to do.
        assert counts(ledger.reconcile(**grace)) == expect(10, 4, 10, 2, 2)
        with pytest.raises(InvalidInput):
            ledger.reconcile(tenant="no spaces", **grace)


@pytest.mark.parametrize("dry_run", [False, True], ids=["apply", "dry_run"])
def test_backwards_clock_refuses_the_whole_call(
    db_path: Path, clock: FrozenClock, dry_run: bool
) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        good = ledger.create_task()
        ledger.start_task(good.id)  # stale: would be timed out
        late = ledger.create_task(timeout_seconds=10.0)
        ledger.start_task(late.id)
        clock.advance(1000.0)
        ledger.heartbeat(late.id)  # updated in the "future" below
        done = ledger.create_task()
        ledger.close_task(done.id, "succeeded")
        clock.advance(-500.0)  # deadline passed, yet late.updated_at > now
    dump = logical_dump(db_path)
    grace = {"active_grace_seconds": 100.0, "delivery_grace_seconds": 0.0}
    with Ledger(db_path, clock=clock) as ledger:
        with pytest.raises(StateConflict):
            ledger.reconcile(dry_run=dry_run, **grace)
        assert ledger.get_task(good.id).status == "running"
    if dry_run:
        with Ledger(db_path, clock=clock, read_only=True) as reader, pytest.raises(StateConflict):
            reader.reconcile(dry_run=True, **grace)
    assert logical_dump(db_path) == dump


@pytest.mark.parametrize("refused", [False, True], ids=["applied", "refused"])
def test_an_apply_hands_back_a_handle_that_checks_foreign_keys(
    db_path: Path, clock: FrozenClock, refused: bool
) -> None:
    """The apply's statements run without foreign key checks (its events
    belong to the rows it reads); the handle checks them again afterwards,
    and the file holds no broken reference."""
    with Ledger(db_path, clock=clock) as ledger:
        parent = ledger.create_task()
        child = ledger.create_task(parent_id=parent.id)
        ledger.start_task(child.id)
        ended = ledger.create_task()
        ledger.close_task(ended.id, "succeeded")
        if refused:  # past its deadline, updated after `now`: refused
            late = ledger.create_task(timeout_seconds=10.0)
            ledger.start_task(late.id)
            clock.advance(1000.0)
            ledger.heartbeat(late.id)
            clock.advance(-500.0)
        else:
            clock.advance(1000.0)
        grace = {"active_grace_seconds": 100.0, "delivery_grace_seconds": 0.0}
        if refused:
            with pytest.raises(StateConflict):
                ledger.reconcile(**grace)
        else:
            assert ledger.reconcile(**grace)["tasks_timed_out"] == 1
        assert ledger.storage_info()["foreign_keys"] is True
        assert ledger.doctor()["healthy"] is True
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


@pytest.mark.parametrize("dry_run", [False, True], ids=["apply", "dry_run"])
def test_future_rows_it_would_not_time_out_are_no_reason_to_refuse(
    db_path: Path, clock: FrozenClock, dry_run: bool
) -> None:
    now = clock.now
    with Ledger(db_path, clock=clock) as ledger:
        clock.now = now + 1000.0
        queued = ledger.create_task(timeout_seconds=1.0)
        running = ledger.create_task()
        ledger.start_task(running.id)
        ended = ledger.create_task()
        ledger.close_task(ended.id, "succeeded")
        clock.now = now
        report = ledger.reconcile(
            dry_run=dry_run, active_grace_seconds=600.0, delivery_grace_seconds=0.0
        )
        assert counts(report) == expect(2, 0, 1, 0, 0)
        assert ledger.get_task(queued.id) == queued


def test_backwards_clock_for_a_lost_workers_task(db_path: Path, clock: FrozenClock) -> None:
    (task_id,) = _owned_running(db_path, clock, [(None, -50.0, "w1")])  # started after now
    dump = logical_dump(db_path)
    with Ledger(db_path, clock=clock) as ledger:
        grace = {"active_grace_seconds": 600.0, "delivery_grace_seconds": 600.0}
        assert counts(ledger.reconcile(**grace)) == expect(1, 0, 0, 0, 0)
        with pytest.raises(StateConflict):
            ledger.reconcile(worker_lost="w1", dry_run=True, **grace)
        with pytest.raises(StateConflict):
            ledger.reconcile(worker_lost="w1", **grace)
        assert ledger.get_task(task_id).status == "running"
    assert logical_dump(db_path) == dump


# Each damage leaves the row's status and times readable; ``?`` is its id.
ROW_DAMAGES: dict[str, tuple[str, tuple[Any, ...]]] = {
    "version_below_its_floor": ("UPDATE tasks SET version = 0 WHERE id = ?", ()),
    "event_head_stored_as_text": ("UPDATE tasks SET event_head = ? WHERE id = ?", ("x" * 32,)),
    "event_head_cut_short": ("UPDATE tasks SET event_head = ? WHERE id = ?", (b"\x01" * 31,)),
    "owner_stored_as_a_blob": ("UPDATE tasks SET owner = CAST(owner AS BLOB) WHERE id = ?", ()),
    "id_stored_as_a_blob": ("UPDATE tasks SET id = CAST(id AS BLOB) WHERE id = ?", ()),
}


@pytest.mark.parametrize("damage", sorted(ROW_DAMAGES))
def test_a_damaged_row_does_not_block_the_pass(
    db_path: Path, clock: FrozenClock, damage: str
) -> None:
    """Unlike the peer, where one bad row aborts the whole reconcile, the pass
    decides each row by its status, times and delivery: a running row that
    is damaged elsewhere (one flipped bit turns a stored text into a blob) is
    timed out with the others, dry run and apply alike, and doctor still
    counts the damage."""
    with Ledger(db_path, clock=clock) as ledger:
        damaged, sound = (ledger.create_task(timeout_seconds=30.0) for _ in range(2))
        for task in (damaged, sound):
            ledger.claim(task.id, "w1")
    statement, values = ROW_DAMAGES[damage]
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        rowid = conn.execute("SELECT rowid FROM tasks WHERE id = ?", (damaged.id,)).fetchone()[0]
        conn.execute(statement, (*values, damaged.id))
    clock.advance(60.0)
    grace = {"active_grace_seconds": 600.0, "delivery_grace_seconds": 600.0}
    with Ledger(db_path, clock=clock) as ledger:
        with pytest.raises((StateConflict, TaskNotFound)):
            ledger.get_task(damaged.id)
        preview = ledger.reconcile(dry_run=True, **grace)
        assert preview["tasks_timed_out"] == 2
        assert preview == ledger.reconcile(**grace) | {"dry_run": True, "applied": False}
        assert ledger.get_task(sound.id).status == "timed_out"
        assert ledger.doctor()["healthy"] is False
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        row = conn.execute("SELECT status FROM tasks WHERE rowid = ?", (rowid,)).fetchone()
    assert row == ("timed_out",)


@pytest.mark.parametrize("stage", ["running", "awaiting_delivery"])
def test_a_row_below_the_first_version_is_left_to_doctor(
    db_path: Path, clock: FrozenClock, stage: str
) -> None:
    """A row whose version was set below zero by hand (its CHECK broken) is
    neither counted nor written, by the dry run and the apply alike: the
    apply would make it ``version + 1``, and -1 would become a valid 0 that
    hides the damage from doctor."""
    with Ledger(db_path, clock=clock) as ledger:
        damaged, sound = (ledger.create_task(timeout_seconds=30.0) for _ in range(2))
        for task in (damaged, sound):
            ledger.claim(task.id, "w1")
            if stage == "awaiting_delivery":
                ledger.close_task(task.id, "succeeded", worker="w1")
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute("UPDATE tasks SET version = -1 WHERE id = ?", (damaged.id,))
    clock.advance(60.0)
    grace = {"active_grace_seconds": 0.0, "delivery_grace_seconds": 0.0}
    with Ledger(db_path, clock=clock) as ledger:
        preview = ledger.reconcile(dry_run=True, **grace)
        assert preview == ledger.reconcile(**grace) | {"dry_run": True, "applied": False}
        changed = ("tasks_timed_out", "deliveries_failed")[stage == "awaiting_delivery"]
        assert preview[changed] == 1
        assert ledger.doctor()["healthy"] is False
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        rows = dict(
            conn.execute("SELECT id, status || ' ' || delivery_status || ' ' || version FROM tasks")
        )
    before = ("running pending -1", "succeeded pending -1")[stage == "awaiting_delivery"]
    after = ("timed_out failed", "succeeded failed")[stage == "awaiting_delivery"]
    assert rows[damaged.id] == before
    assert rows[sound.id].rsplit(" ", 1)[0] == after


# ---------------------------------------------------------------------------
# Dry run equals apply on a random ledger, checked against a model of the rules.


@dataclass(frozen=True)
class Row:
    status: str
    required: bool
    delivery: str
    updated: float
    ended: float | None
    deadline: float | None
    owner: str | None
    tenant: str | None


def read_rows(path: Path) -> list[Row]:
    return [
        Row(s, bool(r), d, u, e, dl, o, t)
        for s, r, d, u, e, dl, o, t in query(
            path,
            "SELECT status, delivery_required, delivery_status, updated_at, ended_at, "
            "deadline_at, owner, tenant FROM tasks",
        )
    ]


def model(
    rows: list[Row],
    now: float,
    active_grace_seconds: float,
    delivery_grace_seconds: float,
    worker_lost: str | None = None,
    tenant: str | None = None,
) -> dict[str, int]:
    """The decision rules of reference §3.4 and SPEC §5, written independently."""
    rows = [r for r in rows if tenant is None or r.tenant == tenant]
    active = [r for r in rows if r.status in ("queued", "running")]
    timed_out = [
        r
        for r in active
        if r.status == "running"
        and (
            (r.deadline is not None and r.deadline <= now)
            or r.updated <= now - active_grace_seconds
            or (worker_lost is not None and r.owner == worker_lost)
        )
    ]
    candidates = [
        (r.required, r.ended) for r in rows if r.status in TERMINAL and r.delivery == "pending"
    ]
    candidates += [(r.required, now) for r in timed_out]
    expired = [req for req, ended in candidates if ended <= now - delivery_grace_seconds]
    return expect(
        len(active), len(timed_out), len(candidates), sum(expired), len(expired) - sum(expired)
    )


def build_random_ledger(path: Path, clock: FrozenClock, seed: int, count: int = 200) -> float:
    """``count`` tasks in varied states and times, all before the returned ``now``."""
    rng = random.Random(seed)
    now = clock.now
    running = []
    with Ledger(path, clock=clock) as ledger:
        roots: list[tuple[str, float]] = []
        for _ in range(count):
            t = now - rng.uniform(0.0, 20_000.0)
            clock.now = t
            parent = None
            if roots and rng.random() < 0.15:
                parent, parent_last = rng.choice(roots)
                clock.now = t = max(t, parent_last)
            task = ledger.create_task(
                timeout_seconds=rng.choice([None, 30.0, 600.0, 7200.0, 50_000.0]),
                delivery_required=rng.random() < 0.6,
                tenant=rng.choice([None, "acme", "globex"]),
                parent_id=parent,
            )
            kind = rng.choice(
                ["queued", "running", "running", "beat", "closed", "closed", "closed", "direct"]
            )
            last = t

            def step(max_step: float) -> None:
                nonlocal last
                last = min(now, last + rng.uniform(0.0, max_step))
                clock.now = last

            if kind in ("running", "beat", "closed"):
                step(2000.0)
                ledger.start_task(task.id)
                if kind != "running":
                    step(3000.0)
                    ledger.heartbeat(task.id)
            if kind in ("closed", "direct"):
                step(3000.0)
                status = rng.choice(TERMINAL)
                ledger.close_task(task.id, status)
                if rng.random() < 0.3:
                    step(1000.0)
                    target = "delivered" if task.delivery_required else "not_applicable"
                    if task.delivery_required and rng.random() < 0.4:
                        target = "failed"
                    ledger.set_delivery(task.id, target)
            if kind in ("running", "beat"):
                running.append(task.id)
            if parent is None and rng.random() < 0.5:
                roots.append((task.id, last))
    for task_id in running:
        roll = rng.random()
        if roll < 0.4:
            set_owner(path, task_id, "w1" if roll < 0.25 else "w2")
    clock.now = now
    return now


def timeout_events(path: Path) -> int:
    sql = (
        "SELECT count(*) FROM task_events WHERE event_kind = 'task_transition' "
        "AND from_value = 'running' AND to_value = 'timed_out'"
    )
    return query(path, sql)[0][0]


RANDOM_POLICIES = [
    {"active_grace_seconds": 600.0, "delivery_grace_seconds": 3600.0},
    {"active_grace_seconds": 0.0, "delivery_grace_seconds": 0.0},
    {"active_grace_seconds": 5000.0, "delivery_grace_seconds": 0.0},
    {"active_grace_seconds": 3000.0, "delivery_grace_seconds": 9000.0, "worker_lost": "w1"},
    {"active_grace_seconds": 2000.0, "delivery_grace_seconds": 2000.0, "tenant": "acme"},
    {"active_grace_seconds": BIG, "delivery_grace_seconds": BIG, "worker_lost": "w2"},
]


@pytest.mark.parametrize("seed", [7, 2024])
def test_dry_run_counts_equal_apply_counts_on_a_random_ledger(
    tmp_path: Path, db_path: Path, clock: FrozenClock, seed: int
) -> None:
    now = build_random_ledger(db_path, clock, seed)
    rows = read_rows(db_path)
    assert len(rows) == 200
    assert {r.status for r in rows} == {"queued", "running", *TERMINAL}
    assert {r.owner for r in rows} == {None, "w1", "w2"}
    seen = set()
    for i, policy in enumerate(RANDOM_POLICIES):
        path = private_copy(db_path, tmp_path, f"policy{i}")
        expected = model(rows, now, **policy)
        with Ledger(path, read_only=True, clock=clock) as reader:
            preview = reader.reconcile(dry_run=True, **policy)
        dump = logical_dump(path)
        with Ledger(path, clock=clock) as ledger:
            writable_preview = ledger.reconcile(dry_run=True, **policy)
        assert logical_dump(path) == dump
        with Ledger(path, clock=clock) as ledger:
            applied = ledger.reconcile(**policy)
            recheck = ledger.reconcile(**policy)
        assert counts(preview) == counts(writable_preview) == counts(applied) == expected, policy
        assert recheck["tasks_timed_out"] == 0
        assert recheck["deliveries_failed"] == recheck["deliveries_not_applicable"] == 0
        seen.add(tuple(expected.values()))
        after = read_rows(path)
        new_timeouts = timeout_events(path) - timeout_events(db_path)
        assert new_timeouts == expected["tasks_timed_out"]
        assert (
            sum(r.status == "timed_out" for r in after) - sum(r.status == "timed_out" for r in rows)
            == expected["tasks_timed_out"]
        )
    assert len(seen) == len(RANDOM_POLICIES)  # the policies really differ


# ---------------------------------------------------------------------------
# ReconcilePolicy and reconcile_restart.


def test_reconcile_restart_gives_the_same_report(
    db_path: Path, tmp_path: Path, clock: FrozenClock, scenario: dict[str, str]
) -> None:
    copy = private_copy(db_path, tmp_path, "copy")
    policy = ReconcilePolicy(active_grace_seconds=600.0, delivery_grace_seconds=3600.0)
    assert (policy.active_grace_seconds, policy.delivery_grace_seconds) == (600.0, 3600.0)
    assert ReconcilePolicy() == ReconcilePolicy(600.0, 600.0)
    grace = {"active_grace_seconds": 600.0, "delivery_grace_seconds": 3600.0}
    with Ledger(db_path, clock=clock) as ledger:
        preview = reconcile_restart(ledger, policy, dry_run=True)
        assert preview == ledger.reconcile(dry_run=True, **grace)
        applied = reconcile_restart(ledger, policy)
    with Ledger(copy, clock=clock) as ledger:
        assert applied == ledger.reconcile(**grace)
    assert preview["dry_run"] is True and applied["applied"] is True
    assert counts(applied) == SCENARIO_EXPECTED[(600.0, 3600.0)]
    assert logical_dump(db_path) == logical_dump(copy)


@pytest.mark.parametrize(
    "value",
    [math.nan, -1, -1e-9, True, False, math.inf, "abc", None, "nan", 1e400],
    ids=repr,
)
def test_reconcile_policy_refuses_bad_values(value: Any) -> None:
    for name in ("active_grace_seconds", "delivery_grace_seconds"):
        with pytest.raises(InvalidInput):
            ReconcilePolicy(**{name: value})
        with pytest.raises(tsg.InvalidInput):  # the peer agrees
            tsg.ReconcilePolicy(**{name: value})


@pytest.mark.parametrize("value", [0, 5, 0.25, "5", "1e3", 1e300], ids=repr)
def test_reconcile_policy_accepts_what_the_peer_accepts(value: Any) -> None:
    ours = ReconcilePolicy(active_grace_seconds=value, delivery_grace_seconds=value)
    peer = tsg.ReconcilePolicy(active_grace_seconds=value, delivery_grace_seconds=value)
    assert type(ours.active_grace_seconds) is float
    assert ours.active_grace_seconds == peer.active_grace_seconds == float(value)
    assert ours.delivery_grace_seconds == peer.delivery_grace_seconds


def test_reconcile_refuses_bad_graces_and_flags(ledger: Ledger) -> None:
    ledger.create_task()
    for bad in (math.nan, -1.0, True, math.inf):
        with pytest.raises(InvalidInput):
            ledger.reconcile(active_grace_seconds=bad, delivery_grace_seconds=1.0)
        with pytest.raises(InvalidInput):
            ledger.reconcile(active_grace_seconds=1.0, delivery_grace_seconds=bad)
    with pytest.raises(InvalidInput):
        ledger.reconcile(active_grace_seconds=1.0, delivery_grace_seconds=1.0, dry_run=1)


_NOW = object()


class CountingClock(FrozenClock):
    """Counts its calls; returns ``value`` instead of ``now`` when one is given."""

    def __init__(self, now: float, value: Any = _NOW) -> None:
        super().__init__(now)
        self.calls = 0
        self.value = value

    def __call__(self) -> Any:
        self.calls += 1
        return self.now if self.value is _NOW else self.value


@pytest.mark.parametrize("dry_run", [False, True], ids=["apply", "dry_run"])
def test_the_clock_is_read_once_per_call_like_the_peer(tmp_path: Path, dry_run: bool) -> None:
    ours_clock, peer_clock = CountingClock(1_800_000_000.0), CountingClock(1_800_000_000.0)
    with Ledger(tmp_path / "ours" / "ledger.db", clock=ours_clock) as ledger:
        build_scenario(ledger, ours_clock, ours_clock.now)
        peer = tsg.Ledger(tmp_path / "peer" / "ledger.db", clock=peer_clock)
        build_scenario(peer, peer_clock, peer_clock.now)
        ours_clock.calls = peer_clock.calls = 0
        grace = {"active_grace_seconds": 600.0, "delivery_grace_seconds": 0.0}
        assert ledger.reconcile(dry_run=dry_run, **grace) == peer.reconcile(
            dry_run=dry_run, **grace
        )
        assert ours_clock.calls == peer_clock.calls == 1


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, "soon", None],
    ids=["nan", "inf", "-inf", "str", "none"],
)
@pytest.mark.parametrize("dry_run", [False, True], ids=["apply", "dry_run"])
def test_a_bad_clock_value_is_invalid_input_and_writes_nothing(
    db_path: Path, clock: FrozenClock, value: Any, dry_run: bool
) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        build_scenario(ledger, clock, clock.now)
    dump = logical_dump(db_path)
    bad = CountingClock(clock.now, value)
    with Ledger(db_path, clock=bad) as ledger, pytest.raises(InvalidInput):
        ledger.reconcile(active_grace_seconds=0.0, delivery_grace_seconds=0.0, dry_run=dry_run)
    assert bad.calls == 1
    assert logical_dump(db_path) == dump


@pytest.mark.parametrize(
    ("raised", "caught"), [(RuntimeError, RuntimeError), (ValueError, InvalidInput)]
)
def test_a_raising_clock_changes_nothing(
    db_path: Path, clock: FrozenClock, raised: type[Exception], caught: type[Exception]
) -> None:
    """As in the peer: a clock's ValueError (or TypeError, OverflowError)
    means it had no valid time, InvalidInput; anything else is its own
    exception, as from any callable."""

    def broken() -> float:
        raise raised("clock unavailable")

    with Ledger(db_path, clock=clock) as ledger:
        build_scenario(ledger, clock, clock.now)
    dump = logical_dump(db_path)
    with Ledger(db_path, clock=broken) as ledger:
        for dry_run in (False, True):
            with pytest.raises(caught):
                ledger.reconcile(
                    active_grace_seconds=0.0, delivery_grace_seconds=0.0, dry_run=dry_run
                )
    assert logical_dump(db_path) == dump


LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("ready", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
conn.close()
"""


def test_dry_run_needs_no_write_lock_and_apply_waits_for_it(
    db_path: Path, clock: FrozenClock
) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        build_scenario(ledger, clock, clock.now)
    dump = logical_dump(db_path)
    grace = {"active_grace_seconds": 600.0, "delivery_grace_seconds": 3600.0}
    with (
        held_open(LOCK_HOLDER, str(db_path)),
        Ledger(db_path, clock=clock, busy_timeout_ms=100) as ledger,
    ):
        preview = ledger.reconcile(dry_run=True, **grace)  # no LedgerBusy
        assert counts(preview) == SCENARIO_EXPECTED[600.0, 3600.0]
        with pytest.raises(LedgerBusy):
            ledger.reconcile(**grace)
        assert ledger.reconcile(dry_run=True, **grace) == preview
    assert logical_dump(db_path) == dump
    with Ledger(db_path, clock=clock) as ledger:
        assert ledger.reconcile(**grace) == {**preview, "dry_run": False, "applied": True}


def test_in_memory_ledger_reconciles(clock: FrozenClock) -> None:
    ledger = Ledger.in_memory(clock=clock)
    with ledger:
        build_scenario(ledger, clock, clock.now)
        for graces, expected in SCENARIO_EXPECTED.items():
            grace = {"active_grace_seconds": graces[0], "delivery_grace_seconds": graces[1]}
            assert counts(ledger.reconcile(dry_run=True, **grace)) == expected


# ---------------------------------------------------------------------------
# The peer's own fixture, and the peer side by side.


def test_peer_demo_fixture(db_path: Path, clock: FrozenClock) -> None:
    """Reference §3.4 "Demo fixture": created in 2000, reconciled at wall time."""
    clock.now = 946_684_800.0
    with Ledger(db_path, clock=clock) as ledger:
        ledger.create_task()
        running = ledger.create_task(timeout_seconds=120.0)
        ledger.start_task(running.id)
        parent = ledger.create_task()
        ledger.close_task(parent.id, "succeeded")
        child = ledger.create_task(parent_id=parent.id, delivery_required=False)
        ledger.close_task(child.id, "succeeded")
    grace = {"active_grace_seconds": 600.0, "delivery_grace_seconds": 86_400.0}
    with Ledger(db_path, read_only=True) as reader:
        preview = reader.reconcile(dry_run=True, **grace)
    with Ledger(db_path) as ledger:
        applied = ledger.reconcile(**grace)
        recheck = ledger.reconcile(**grace)
        assert ledger.get_task(running.id).terminal_code == "deadline_exceeded"
        assert ledger.get_task(parent.id).delivery_status == "failed"
        assert ledger.get_task(child.id).delivery_status == "not_applicable"
    assert preview == {**applied, "dry_run": True, "applied": False}
    assert counts(applied) == expect(2, 1, 3, 1, 1)
    assert counts(recheck) == expect(1, 0, 1, 0, 0)
    assert query(db_path, "SELECT count(*) FROM tasks") == [(4,)]
    assert query(db_path, "SELECT count(*) FROM task_events") == [(10,)]


def plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


@pytest.mark.parametrize(
    ("active", "delivery", "offset"),
    [
        (600.0, 3600.0, 0.0),
        (0.0, 0.0, 0.0),
        (600.0, 0.0, 0.0),
        (BIG, BIG, 0.0),
        (1000.0, 86_400.0, 4_000.0),
        (2500.0, 500.0, -40.0),
    ],
)
def test_side_by_side_with_the_peer(
    tmp_path: Path, active: float, delivery: float, offset: float
) -> None:
    base = 1_800_000_000.0
    ours_dir, peer_dir = tmp_path / "ours", tmp_path / "peer"
    ours_clock, peer_clock = FrozenClock(base), FrozenClock(base)
    with Ledger(ours_dir / "ledger.db", clock=ours_clock) as ledger:
        ids = build_scenario(ledger, ours_clock, base)
    peer = tsg.Ledger(peer_dir / "ledger.db", clock=peer_clock)
    assert build_scenario(peer, peer_clock, base) == ids
    grace = {"active_grace_seconds": active, "delivery_grace_seconds": delivery}
    ours_clock.now = peer_clock.now = base + offset

    with Ledger(ours_dir / "ledger.db", read_only=True, clock=ours_clock) as reader:
        ours_preview = reader.reconcile(dry_run=True, **grace)
    peer_preview = tsg.Ledger(peer_dir / "ledger.db", read_only=True, clock=peer_clock).reconcile(
        dry_run=True, **grace
    )
    assert ours_preview == peer_preview
    with Ledger(ours_dir / "ledger.db", clock=ours_clock) as ledger:
        assert ledger.reconcile(dry_run=True, **grace) == peer.reconcile(dry_run=True, **grace)
        ours_applied = ledger.reconcile(**grace)
        peer_applied = peer.reconcile(**grace)
        assert ours_applied == peer_applied
        assert ledger.reconcile(**grace) == peer.reconcile(**grace)
        fields = (
            "status",
            "delivery_status",
            "terminal_code",
            "delivery_code",
            "updated_at",
            "ended_at",
            "delivery_updated_at",
            "deadline_at",
            "version",
        )
        for task_id in ids.values():
            ours, theirs = ledger.get_task(task_id), peer.get_task(task_id)
            assert [plain(getattr(ours, f)) for f in fields] == [
                plain(getattr(theirs, f)) for f in fields
            ]
    assert counts(ours_applied) == counts(ours_preview)
    if offset == 0.0 and (active, delivery) in SCENARIO_EXPECTED:
        assert counts(ours_applied) == SCENARIO_EXPECTED[(active, delivery)]


# ---------------------------------------------------------------------------
# Three processes keep writing while reconcile applies.

WORKERS = 3
RECONCILE_PASSES = 20


def _writer(path: str, stop: Any, ready: Any, results: Any) -> None:
    """Runs in a spawned process: lifecycles until told to stop; reconcile may
    time out its tasks (and close their deliveries) underneath it."""
    ids: list[str] = []
    conflicts = 0
    try:
        with Ledger(path, busy_timeout_ms=60_000) as ledger:
            ready.release()
            while not stop.is_set() or len(ids) < 5:
                task = ledger.create_task(delivery_required=len(ids) % 3 != 0)
                ids.append(task.id)
                try:
                    ledger.start_task(task.id)
                    time.sleep(0.002)
                    ledger.heartbeat(task.id)
                    time.sleep(0.002)
                    ledger.close_task(task.id, "succeeded")
                    target = "delivered" if task.delivery_required else "not_applicable"
                    ledger.set_delivery(task.id, target)
                except StateConflict:
                    conflicts += 1
        results.put(("ok", ids, conflicts))
    except BaseException as exc:
        results.put(("error", ids, f"{type(exc).__name__}: {exc}"))


def check_event_paths(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Each task's events form a valid path through the two state machines."""
    chains: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for task_id, kind, before, after, _, code in events(path):
        chains[task_id].append((kind, before, after, code))
    statuses = dict(query(path, "SELECT id, status FROM tasks"))
    deliveries = dict(query(path, "SELECT id, delivery_status FROM tasks"))
    assert set(chains) == set(statuses)
    for task_id, chain in chains.items():
        assert chain[0] == ("created", None, "queued", "created"), chain
        status, delivery = "queued", "pending"
        for kind, before, after, _ in chain[1:]:
            if kind == "task_transition":
                assert before == status, chain
                assert status not in TERMINAL, chain
                assert delivery == "pending", chain
                status = after
            else:
                assert kind == "delivery_transition", chain
                assert (before, delivery) == ("pending", "pending"), chain
                assert status in TERMINAL, chain
                delivery = after
        assert (status, delivery) == (statuses[task_id], deliveries[task_id]), chain
    return chains


def test_reconcile_while_three_processes_write(db_path: Path) -> None:
    with Ledger(db_path):
        pass
    stop, ready, results = SPAWN.Event(), SPAWN.Semaphore(0), SPAWN.Queue()
    workers = [
        SPAWN.Process(target=_writer, args=(str(db_path), stop, ready, results))
        for _ in range(WORKERS)
    ]
    for w in workers:
        w.start()
    reports = []
    outcomes = []
    try:
        for _ in range(WORKERS):
            assert ready.acquire(timeout=120), "writer did not start"
        with Ledger(db_path, busy_timeout_ms=60_000) as ledger:
            for i in range(RECONCILE_PASSES):
                time.sleep(0.03)
                reports.append(
                    ledger.reconcile(
                        active_grace_seconds=0.0, delivery_grace_seconds=0.0 if i % 2 else 600.0
                    )
                )
        stop.set()
        outcomes = [results.get(timeout=120) for _ in workers]
    finally:
        stop.set()
        for w in workers:
            w.join(60)
            if w.is_alive():
                w.kill()
                w.join()
        results.close()
        results.join_thread()
    errors = [o for o in outcomes if o[0] != "ok"]
    assert not errors, errors
    assert all(w.exitcode == 0 for w in workers)
    ids = [t for o in outcomes for t in o[1]]
    assert len(ids) == len(set(ids))
    for report in reports:
        counts(report)

    with Ledger(db_path) as ledger:
        tasks = [ledger.get_task(t) for t in ids]  # every row still validates
    chains = check_event_paths(db_path)
    assert set(chains) == set(ids)
    timed_out = [t for t in tasks if t.status == "timed_out"]
    assert timeout_events(db_path) == len(timed_out) == sum(r["tasks_timed_out"] for r in reports)
    assert all(t.terminal_code == "restart_stale" for t in timed_out)
    closed_by_reconcile = sum(
        1 for chain in chains.values() for e in chain
        if e[0] == "delivery_transition" and e[3] in ("delivery_grace_expired", "internal_task")
    )  # fmt: skip
    assert closed_by_reconcile == sum(
        r["deliveries_failed"] + r["deliveries_not_applicable"] for r in reports
    )
    assert {t.status for t in tasks} <= {"queued", "running", "succeeded", "timed_out"}
    assert len(timed_out) > 0, "no pass caught a running task: the race was not exercised"
    # Every task timed out under a worker made that worker's next write conflict.
    assert sum(o[2] for o in outcomes) >= len(timed_out)


# ---------------------------------------------------------------------------
# The CLI.


@pytest.fixture
def past_scenario(db_path: Path) -> dict[str, str]:
    """The fixed scenario, long in the past: wall-clock CLI runs see it all stale."""
    clock = FrozenClock(1_000_000_000.0)
    with Ledger(db_path, clock=clock) as ledger:
        return build_scenario(ledger, clock, clock.now)


def test_cli_reconcile_json(db_path: Path, past_scenario: dict[str, str]) -> None:
    db = str(db_path)
    code, out, raw = run_cli("--db", db, "reconcile", "--dry-run")
    assert code == 0
    assert set(out) == {"ok", "reconcile"} and out["ok"] is True
    assert list(out["reconcile"]) == sorted(REPORT_KEYS)
    assert raw.count("\n") == 1 and past_scenario["r_stale"] not in raw
    preview = out["reconcile"]
    assert (preview["dry_run"], preview["applied"]) == (True, False)
    # Defaults 600/600; the timed-out ones ended "now" and keep their delivery.
    assert counts({k: preview[k] for k in REPORT_KEYS}) == expect(6, 4, 9, 3, 2)

    code, out, _ = run_cli("--db", db, "reconcile")
    assert code == 0
    applied = out["reconcile"]
    assert applied == {**preview, "dry_run": False, "applied": True}
    code, out, _ = run_cli(
        "--db", db, "reconcile", "--active-grace-seconds", "0", "--delivery-grace-seconds", "0"
    )
    assert code == 0
    assert counts({k: out["reconcile"][k] for k in REPORT_KEYS}) == expect(2, 0, 4, 3, 1)
    with Ledger(db_path) as ledger:
        assert ledger.get_task(past_scenario["r_stale"]).delivery_code == "delivery_grace_expired"
        assert ledger.get_task(past_scenario["q_old"]).status == "queued"


def test_cli_reconcile_worker_lost_and_tenant(db_path: Path) -> None:
    db = str(db_path)
    clock = FrozenClock(time.time() - 10.0)
    with Ledger(db_path, clock=clock) as ledger:
        mine = ledger.create_task(tenant="acme")
        ledger.start_task(mine.id)
        other = ledger.create_task(tenant="globex")
        ledger.start_task(other.id)
    set_owner(db_path, mine.id, "w1")
    set_owner(db_path, other.id, "w1")
    code, out, _ = run_cli("--db", db, "reconcile", "--worker-lost", "w1", "--tenant", "acme")
    assert code == 0
    assert counts({k: out["reconcile"][k] for k in REPORT_KEYS}) == expect(1, 1, 1, 0, 0)
    with Ledger(db_path) as ledger:
        assert ledger.get_task(mine.id).terminal_code == "worker_lost"
        assert ledger.get_task(other.id).status == "running"
    code, out, _ = run_cli("--db", db, "reconcile", "--worker-lost", "bad worker")
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert "bad worker" not in run_cli("--db", db, "reconcile", "--tenant", "bad tenant")[2]


def test_cli_reconcile_text(db_path: Path, past_scenario: dict[str, str]) -> None:
    code, _, raw = run_cli("--db", str(db_path), "reconcile", "--dry-run", "--format", "text")
    assert code == 0
    assert not raw.lstrip().startswith("{")
    lines = raw.splitlines()
    assert lines[0].startswith("reconcile")
    for key, value in (("tasks_timed_out", "4"), ("pending_delivery_examined", "9")):
        assert any(line.split() == [key, value] for line in lines), raw
    assert any(line.split() == ["dry_run", "yes"] for line in lines), raw


def test_cli_reconcile_refuses_bad_graces(db_path: Path, past_scenario: dict[str, str]) -> None:
    dump = logical_dump(db_path)
    for flags in (
        ["--active-grace-seconds", "nan"],
        ["--delivery-grace-seconds", "-1"],
        ["--active-grace-seconds", "ten"],
        ["--snapshot-max-mib", "-1"],
    ):
        code, out, raw = run_cli("--db", str(db_path), "reconcile", *flags)
        assert (code, out) == (2, {"error": "InvalidInput", "ok": False}), flags
        assert flags[1] not in raw
    assert logical_dump(db_path) == dump


def test_cli_demo_never_touches_an_existing_ledger(tmp_path: Path) -> None:
    """The demo times out whatever runs in its ledger: pointed at a real
    one it refuses (exit 2) and the file keeps every byte."""
    real = tmp_path / "real.db"
    with Ledger(real) as ledger:
        ledger.start_task(ledger.create_task().id)
    before = real.read_bytes()
    for argv in (["demo", "--keep-db", str(real)], ["--db", str(real), "demo"]):
        code, out, _ = run_cli(*argv)
        assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert real.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real.db"]


def test_cli_demo(tmp_path: Path) -> None:
    keep = tmp_path / "kept" / "demo.db"
    code, out, raw = run_cli("demo", "--keep-db", str(keep))
    assert code == 0 and out["ok"] is True and raw.count("\n") == 1
    demo = out["demo"]
    assert set(demo) == {"preview", "apply", "recheck"}
    preview, applied, recheck = demo["preview"], demo["apply"], demo["recheck"]
    assert (preview["dry_run"], applied["dry_run"], recheck["dry_run"]) == (True, False, False)
    assert {k: preview[k] for k in COUNT_KEYS} == {k: applied[k] for k in COUNT_KEYS}
    assert preview["tasks_timed_out"] > 0
    assert recheck["tasks_timed_out"] == 0
    assert recheck["deliveries_failed"] == recheck["deliveries_not_applicable"] == 0
    for report in demo.values():
        counts({k: report[k] for k in REPORT_KEYS})
    assert keep.exists()
    with Ledger(keep, read_only=True) as reader:
        again = reader.reconcile(
            active_grace_seconds=600.0, delivery_grace_seconds=86_400.0, dry_run=True
        )
    assert again["tasks_timed_out"] == 0
    assert again["active_examined"] == recheck["active_examined"]


def test_cli_demo_builds_its_ledger_at_the_global_db(tmp_path: Path) -> None:
    target = tmp_path / "here" / "demo.db"
    code, out, _ = run_cli("--db", str(target), "demo")
    assert code == 0 and out["demo"]["apply"]["tasks_timed_out"] > 0
    with Ledger(target, read_only=True) as reader:
        assert reader.doctor()["healthy"] is True
    other = tmp_path / "other.db"
    code, out, _ = run_cli("--db", str(target.with_name("x.db")), "demo", "--keep-db", str(other))
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert not other.exists()


def test_cli_demo_text() -> None:
    code, _, raw = run_cli("demo", "--format", "text")
    assert code == 0
    assert not raw.lstrip().startswith("{")
    assert "Preview" in raw and "Recheck" in raw
    table = {line.split()[0]: line.split()[1:] for line in raw.splitlines() if line.strip()}
    assert table["tasks_timed_out"][2] == "0"
    assert table["tasks_timed_out"][0] == table["tasks_timed_out"][1] != "0"
