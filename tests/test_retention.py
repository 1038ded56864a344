"""Retention (SPEC §2.2): ``delete_task``, ``purge`` and ``stats``.

A task is *fully closed* when its status is terminal and its delivery is
terminal. ``purge`` removes only whole task trees in which every task is
fully closed and last changed (``max(updated_at, delivery_updated_at)``) at
or before ``now - older_than_seconds``. Reports are counts only.

Files are compared with ``logical_dump`` only while no ``Ledger`` is open.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger
from taskwarden.errors import InvalidInput, StateConflict, TaskNotFound

from .conftest import FrozenClock, logical_dump, run_cli, run_python

STATUSES = [
    "queued",
    "running",
    "blocked",
    "escalated",
    "succeeded",
    "failed",
    "timed_out",
    "cancelled",
]
DELIVERIES = ["pending", "delivered", "failed", "not_applicable"]
PURGE_KEYS = {
    "dry_run",
    "trees_purged",
    "tasks_purged",
    "events_purged",
    "batches",
    "longest_batch_ms",
}
STATS_KEYS = {
    "task_count",
    "event_count",
    "by_status",
    "by_delivery",
    "by_tenant",
    "file_bytes",
    "wal_bytes",
}
BATCH = 256
MISSING = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


@contextmanager
def opened(path: Path, clock: FrozenClock) -> Iterator[Ledger]:
    with Ledger(path, clock=clock) as lg:
        yield lg


def close_fully(
    lg: Ledger,
    task_id: str,
    *,
    status: str = "succeeded",
    delivery: str | None = None,
    worker: str = "w1",
) -> None:
    """Claim (when queued), close and settle the delivery of one task."""
    task = lg.get_task(task_id)
    if status != "cancelled" and task.status == "queued":
        lg.claim(task_id, worker)
    code = {
        "succeeded": "worker_completed",
        "failed": "worker_failed",
        "timed_out": "worker_lost",
        "cancelled": "caller_cancelled",
    }[status]
    lg.close_task(task_id, status, code=code)
    if delivery is None:
        delivery = "delivered" if task.delivery_required else "not_applicable"
    delivery_code = {
        "delivered": "transport_acknowledged",
        "failed": "transport_failed",
        "not_applicable": "internal_task",
    }[delivery]
    lg.set_delivery(task_id, delivery, code=delivery_code)


def closed_task(lg: Ledger, **create: Any) -> str:
    task = lg.create_task(**create)
    close_fully(lg, task.id)
    return task.id


def events_of(dump: dict[str, list[tuple[Any, ...]]], ids: set[str]) -> int:
    # task_events columns: sequence, task_id, ...
    return sum(1 for row in dump["task_events"] if row[1] in ids)


def task_ids(dump: dict[str, list[tuple[Any, ...]]]) -> set[str]:
    return {row[0] for row in dump["tasks"]}


# --------------------------------------------------------------------------
# delete_task


def test_delete_fully_closed_task_removes_it_and_its_events(
    db_path: Path, clock: FrozenClock
) -> None:
    with opened(db_path, clock) as lg:
        keep = closed_task(lg)
        gone = lg.create_task(timeout_seconds=30.0, tenant="acme").id
        lg.claim(gone, "w1")
        lg.charge(gone, worker="w1")
        clock.advance(5)
        close_fully(lg, gone, status="failed", delivery="failed")
    before = logical_dump(db_path)
    assert events_of(before, {gone}) == 4

    with opened(db_path, clock) as lg:
        assert lg.delete_task(gone) is None
        with pytest.raises(TaskNotFound):
            lg.get_task(gone)
        assert lg.get_task(keep).status == "succeeded"
        assert lg.doctor()["healthy"] is True
        # Deleting again: the task is gone.
        with pytest.raises(TaskNotFound):
            lg.delete_task(gone)
    after = logical_dump(db_path)
    assert task_ids(after) == {keep}
    assert events_of(after, {gone}) == 0
    assert after["task_events"] == [r for r in before["task_events"] if r[1] != gone]
    assert after["schema_meta"] == before["schema_meta"]


def test_delete_accepts_an_upper_case_id(ledger: Ledger) -> None:
    tid = closed_task(ledger)
    ledger.delete_task(tid.upper())
    with pytest.raises(TaskNotFound):
        ledger.get_task(tid)


def _queued(lg: Ledger) -> str:
    return lg.create_task().id


def _running(lg: Ledger) -> str:
    tid = lg.create_task().id
    lg.claim(tid, "w1")
    return tid


def _blocked(lg: Ledger) -> str:
    tid = _running(lg)
    lg.block(tid)
    return tid


def _escalated(lg: Ledger) -> str:
    tid = lg.create_task(llm_calls_budget=0).id
    lg.claim(tid, "w1")
    assert lg.charge(tid, worker="w1").escalated
    return tid


def _terminal_delivery_pending(lg: Ledger) -> str:
    tid = _running(lg)
    lg.close_task(tid, "succeeded", code="worker_completed")
    return tid


def _cancelled_delivery_pending(lg: Ledger) -> str:
    tid = lg.create_task(delivery_required=False).id
    lg.cancel(tid)
    return tid


def _closed_parent_with_closed_child(lg: Ledger) -> str:
    parent = lg.create_task().id
    lg.create_task(parent_id=parent, delivery_required=False)
    for child in lg.children_of(parent):
        close_fully(lg, child.id)
    close_fully(lg, parent)
    return parent


NOT_DELETABLE = {
    "queued": _queued,
    "running": _running,
    "blocked": _blocked,
    "escalated": _escalated,
    "terminal_delivery_pending": _terminal_delivery_pending,
    "cancelled_delivery_pending": _cancelled_delivery_pending,
    "closed_parent_with_closed_child": _closed_parent_with_closed_child,
}


@pytest.mark.parametrize("make", list(NOT_DELETABLE), ids=list(NOT_DELETABLE))
def test_delete_refuses_what_is_not_a_closed_leaf(
    make: str, db_path: Path, clock: FrozenClock
) -> None:
    with opened(db_path, clock) as lg:
        tid = NOT_DELETABLE[make](lg)
        closed_task(lg)
    before = logical_dump(db_path)
    clock.advance(10)
    with opened(db_path, clock) as lg:
        with pytest.raises(StateConflict):
            lg.delete_task(tid)
        assert lg.get_task(tid).id == tid
    assert logical_dump(db_path) == before


def test_delete_child_first_then_parent(ledger: Ledger) -> None:
    parent = _closed_parent_with_closed_child(ledger)
    (child,) = ledger.children_of(parent)
    with pytest.raises(StateConflict):
        ledger.delete_task(parent)
    ledger.delete_task(child.id)
    assert ledger.children_of(parent) == []
    ledger.delete_task(parent)
    assert ledger.stats()["task_count"] == 0
    assert ledger.stats()["event_count"] == 0
    assert ledger.doctor()["healthy"] is True


def test_delete_unknown_and_malformed_ids(ledger: Ledger) -> None:
    with pytest.raises(TaskNotFound):
        ledger.delete_task(MISSING)
    for bad in ("not-a-uuid", "", 42, None):
        with pytest.raises(InvalidInput):
            ledger.delete_task(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# purge: a scenario of trees, old and recent, closed and living

OLDER_THAN = 900.0


@dataclass
class Scenario:
    """Task ids by tree, and which trees a purge at ``now`` must remove."""

    t0: float
    now: float
    trees: dict[str, set[str]] = field(default_factory=dict)
    purgeable: set[str] = field(default_factory=set)
    tenants: dict[str, str | None] = field(default_factory=dict)

    def ids(self, names: set[str]) -> set[str]:
        return set().union(*(self.trees[n] for n in names)) if names else set()


def build_scenario(path: Path, clock: FrozenClock) -> Scenario:
    """Old trees are settled in [t0, t0+20]; recent changes come at t0+500;
    the purge runs at t0+1000 with older_than 900 (cutoff t0+100)."""
    t0 = clock.now
    sc = Scenario(t0=t0, now=t0 + 1000.0)
    with opened(path, clock) as lg:

        def tree(name: str, root: str, *rest: str, purge: bool, tenant: str | None) -> None:
            sc.trees[name] = {root, *rest}
            sc.tenants[name] = tenant
            if purge:
                sc.purgeable.add(name)

        # A: one old closed task.
        a = closed_task(lg, tenant="acme")
        tree("single", a, purge=True, tenant="acme")
        clock.advance(1)

        # B: an old closed tree of four (child, grandchild, internal child).
        b = lg.create_task(tenant="acme").id
        b1 = lg.create_task(parent_id=b, delivery_required=False, tenant="acme").id
        b11 = lg.create_task(parent_id=b1, delivery_required=False, tenant="acme").id
        b2 = lg.create_task(parent_id=b, tenant="acme").id
        lg.claim(b, "w1")
        lg.claim(b1, "w2")
        lg.charge(b1, calls=2, tokens=10, worker="w2")
        close_fully(lg, b11, status="cancelled")
        close_fully(lg, b1)
        close_fully(lg, b2, status="failed", delivery="failed")
        close_fully(lg, b)
        tree("deep", b, b1, b11, b2, purge=True, tenant="acme")
        clock.advance(1)

        # C: a closed root with a closed child and a living (running) child.
        c = lg.create_task(tenant="acme").id
        c1 = lg.create_task(parent_id=c, tenant="acme").id
        c2 = lg.create_task(parent_id=c, tenant="acme").id
        close_fully(lg, c1)
        lg.claim(c2, "w3")
        close_fully(lg, c)
        tree("living_child", c, c1, c2, purge=False, tenant="acme")

        # D: closed root, child terminal but its delivery still pending.
        d = lg.create_task(tenant="beta").id
        d1 = lg.create_task(parent_id=d, tenant="beta").id
        lg.claim(d1, "w1")
        lg.close_task(d1, "succeeded", code="worker_completed")
        close_fully(lg, d)
        tree("pending_delivery_child", d, d1, purge=False, tenant="beta")

        # E: a queued root with an old closed child: the child is no root.
        e = lg.create_task(tenant="beta").id
        e1 = closed_task(lg, parent_id=e, tenant="beta")
        tree("queued_root", e, e1, purge=False, tenant="beta")

        # F: other living roots: blocked, escalated, parked forever.
        f = _blocked(lg)
        g = _escalated(lg)
        tree("blocked", f, purge=False, tenant=None)
        tree("escalated", g, purge=False, tenant=None)

        # H: old closed tree without a tenant.
        h = lg.create_task().id
        h1 = closed_task(lg, parent_id=h, delivery_required=False)
        close_fully(lg, h, status="timed_out", delivery="failed")
        tree("no_tenant", h, h1, purge=True, tenant=None)

        # I: root closed old, but its delivery was settled recently.
        i = lg.create_task(tenant="beta").id
        lg.claim(i, "w1")
        lg.close_task(i, "succeeded", code="worker_completed")
        clock.advance(1)

        # J: root closed old, its child closed recently.
        j = lg.create_task(tenant="acme").id
        j1 = lg.create_task(parent_id=j, tenant="acme").id
        close_fully(lg, j)
        lg.claim(j1, "w1")

        # K: the boundary: last change exactly at the cutoff is purged ...
        k = lg.create_task(tenant="beta").id
        lg.claim(k, "w1")
        # ... L: and a hair after it is kept.
        ell = lg.create_task(tenant="beta").id
        lg.claim(ell, "w1")
        assert clock.now <= t0 + 20

        clock.now = t0 + 100.0
        close_fully(lg, k)
        tree("at_cutoff", k, purge=True, tenant="beta")
        clock.now = t0 + 100.25
        close_fully(lg, ell)
        tree("after_cutoff", ell, purge=False, tenant="beta")

        clock.now = t0 + 500.0
        lg.set_delivery(i, "delivered", code="transport_acknowledged")
        tree("recent_delivery", i, purge=False, tenant="beta")
        close_fully(lg, j1)
        tree("recent_child", j, j1, purge=False, tenant="acme")

        # M: a recent closed tree.
        m = closed_task(lg, tenant="acme")
        tree("recent", m, purge=False, tenant="acme")
        # N: a recent living task.
        n = lg.create_task(tenant="acme").id
        tree("recent_queued", n, purge=False, tenant="acme")

        assert lg.doctor()["healthy"] is True
    clock.now = sc.now
    return sc


def expected_report(before: dict[str, Any], sc: Scenario, names: set[str], dry: bool) -> dict:
    ids = sc.ids(names)
    return {
        "dry_run": dry,
        "trees_purged": len(names),
        "tasks_purged": len(ids),
        "events_purged": events_of(before, ids),
    }


def counts(report: dict[str, Any]) -> dict[str, Any]:
    return {k: report[k] for k in ("dry_run", "trees_purged", "tasks_purged", "events_purged")}


def test_purge_removes_exactly_the_old_fully_closed_trees(
    db_path: Path, clock: FrozenClock
) -> None:
    sc = build_scenario(db_path, clock)
    before = logical_dump(db_path)
    assert task_ids(before) == sc.ids(set(sc.trees))

    with opened(db_path, clock) as lg:
        report = lg.purge(older_than_seconds=OLDER_THAN)
    assert set(report) == PURGE_KEYS
    assert counts(report) == expected_report(before, sc, sc.purgeable, dry=False)
    assert report["trees_purged"] == 4 and report["tasks_purged"] == 8
    assert report["batches"] >= 1
    assert isinstance(report["longest_batch_ms"], float) and report["longest_batch_ms"] >= 0

    after = logical_dump(db_path)
    gone = sc.ids(sc.purgeable)
    assert task_ids(after) == task_ids(before) - gone
    assert after["task_events"] == [r for r in before["task_events"] if r[1] not in gone]
    # Every kept tree is whole: a parent with a living child keeps all its children.
    for name in set(sc.trees) - sc.purgeable:
        assert sc.trees[name] <= task_ids(after), name
    # Nothing kept was rewritten.
    assert [r for r in before["tasks"] if r[0] not in gone] == after["tasks"]

    with opened(db_path, clock) as lg:
        assert lg.doctor()["healthy"] is True
        again = lg.purge(older_than_seconds=OLDER_THAN)
    assert counts(again) == {
        "dry_run": False,
        "trees_purged": 0,
        "tasks_purged": 0,
        "events_purged": 0,
    }
    assert logical_dump(db_path) == after


def test_purge_dry_run_counts_the_same_and_deletes_nothing(
    db_path: Path, clock: FrozenClock
) -> None:
    sc = build_scenario(db_path, clock)
    before = logical_dump(db_path)
    with opened(db_path, clock) as lg:
        dry = lg.purge(older_than_seconds=OLDER_THAN, dry_run=True)
        dry_again = lg.purge(older_than_seconds=OLDER_THAN, dry_run=True)
    assert logical_dump(db_path) == before
    assert counts(dry) == expected_report(before, sc, sc.purgeable, dry=True)
    assert counts(dry_again) == counts(dry)

    # A read-only ledger previews the same numbers and cannot purge.
    with Ledger(db_path, clock=clock, read_only=True) as ro:
        assert counts(ro.purge(older_than_seconds=OLDER_THAN, dry_run=True)) == counts(dry)
        with pytest.raises(StateConflict):
            ro.purge(older_than_seconds=OLDER_THAN)
    assert logical_dump(db_path) == before

    with opened(db_path, clock) as lg:
        real = lg.purge(older_than_seconds=OLDER_THAN)
    assert {**counts(real), "dry_run": True} == counts(dry)


def test_purge_cutoff_follows_older_than(db_path: Path, clock: FrozenClock) -> None:
    sc = build_scenario(db_path, clock)
    before = logical_dump(db_path)
    with opened(db_path, clock) as lg:
        # Nothing is 2000 s old.
        assert lg.purge(older_than_seconds=2000.0)["trees_purged"] == 0
        # older_than 0: every fully closed tree, however recent.
        everything = lg.purge(older_than_seconds=0, dry_run=True)
    closed = sc.purgeable | {"after_cutoff", "recent_delivery", "recent_child", "recent"}
    assert counts(everything) == expected_report(before, sc, closed, dry=True)
    assert logical_dump(db_path) == before


def test_a_grant_after_the_cutoff_keeps_a_closed_tree(db_path: Path, clock: FrozenClock) -> None:
    """A grant changes a closed task without moving its row times; its event
    is a change all the same, so the tree is not old enough to purge."""
    with opened(db_path, clock) as lg:
        granted = lg.create_task()
        lg.cancel(granted.id)
        lg.set_delivery(granted.id, "failed")
        parent = lg.create_task()
        child = lg.create_task(parent_id=parent.id)
        for task in (child, parent):
            lg.cancel(task.id)
            lg.set_delivery(task.id, "failed")
        clock.advance(300)
        lg.grant(granted.id, calls=1)
        lg.grant(child.id, calls=1)
        clock.advance(100)
        for dry_run in (True, False):
            report = lg.purge(older_than_seconds=200, dry_run=dry_run)
            assert (report["trees_purged"], report["tasks_purged"]) == (0, 0)
        assert lg.purge(older_than_seconds=50)["tasks_purged"] == 3
        assert lg.doctor()["healthy"] is True


@pytest.mark.parametrize("tenant", ["acme", "beta"])
def test_purge_is_scoped_to_a_tenant(tenant: str, db_path: Path, clock: FrozenClock) -> None:
    sc = build_scenario(db_path, clock)
    before = logical_dump(db_path)
    mine = {n for n in sc.purgeable if sc.tenants[n] == tenant}
    assert mine
    with opened(db_path, clock) as lg:
        dry = lg.purge(older_than_seconds=OLDER_THAN, dry_run=True, tenant=tenant)
        report = lg.purge(older_than_seconds=OLDER_THAN, tenant=tenant)
    assert counts(dry) == expected_report(before, sc, mine, dry=True)
    assert counts(report) == expected_report(before, sc, mine, dry=False)
    after = logical_dump(db_path)
    assert task_ids(after) == task_ids(before) - sc.ids(mine)

    # The rest goes with an unscoped purge.
    with opened(db_path, clock) as lg:
        rest = lg.purge(older_than_seconds=OLDER_THAN)
        assert lg.doctor()["healthy"] is True
    assert counts(rest) == expected_report(before, sc, sc.purgeable - mine, dry=False)


def test_a_tenant_s_purge_leaves_old_tasks_without_a_tenant(
    db_path: Path, clock: FrozenClock
) -> None:
    """Old, fully closed single tasks of tenant "acme", of no tenant and of
    "other": a purge scoped to "acme" takes its own task alone, in the dry
    run too. A root search that read a NULL tenant as a match (a CASE, not
    a WHERE) took the task with no tenant as well."""
    with opened(db_path, clock) as lg:
        ids = {
            tenant: closed_task(lg, tenant=tenant, delivery_required=False)
            for tenant in ("acme", None, "other")
        }
    clock.advance(3600)
    with opened(db_path, clock) as lg:
        dry = lg.purge(older_than_seconds=60, dry_run=True, tenant="acme")
        report = lg.purge(older_than_seconds=60, tenant="acme")
        left = {task.id for task in lg.list_tasks()}
    assert (report["trees_purged"], report["tasks_purged"]) == (1, 1)
    assert counts(dry) == {**counts(report), "dry_run": True}
    assert left == {ids[None], ids["other"]}


def test_purge_refuses_bad_arguments(db_path: Path, clock: FrozenClock) -> None:
    with opened(db_path, clock) as lg:
        closed_task(lg)
    before = logical_dump(db_path)
    with opened(db_path, clock) as lg:
        for bad in (-1.0, float("nan"), float("inf"), True, "soon", None):
            with pytest.raises(InvalidInput):
                lg.purge(older_than_seconds=bad)  # type: ignore[arg-type]
        for tenant in ("", "a b", "x" * 129, 7):
            with pytest.raises(InvalidInput):
                lg.purge(older_than_seconds=0, tenant=tenant)  # type: ignore[arg-type]
        for flag in (1, "yes", None):
            with pytest.raises(InvalidInput):
                lg.purge(older_than_seconds=0, dry_run=flag)  # type: ignore[arg-type]
    assert logical_dump(db_path) == before


def test_purge_more_than_one_batch(db_path: Path, clock: FrozenClock) -> None:
    """More purgeable trees than one batch holds, interleaved with roots that
    must stay: all purgeable trees go, in several batches."""
    trees = BATCH + 60
    kept: set[str] = set()
    with opened(db_path, clock) as lg:
        for n in range(trees):
            root = lg.create_task(tenant="bulk").id
            if n % 3 == 0:
                closed_task(lg, parent_id=root, delivery_required=False)
                close_fully(lg, root)
            else:
                lg.cancel(root)
                lg.set_delivery(root, "failed", code="transport_failed")
            if n % 10 == 0:
                kept.add(lg.create_task(tenant="bulk").id)
                living = lg.create_task(tenant="bulk").id
                lg.create_task(parent_id=living, tenant="bulk")
                close_fully(lg, living)
                kept.add(living)
    before = logical_dump(db_path)
    purgeable = task_ids(before) - kept - {row[0] for row in before["tasks"] if row[1] in kept}
    clock.advance(3600)
    with opened(db_path, clock) as lg:
        dry = lg.purge(older_than_seconds=60, dry_run=True)
        report = lg.purge(older_than_seconds=60)
        stats = lg.stats()
        assert lg.doctor()["healthy"] is True
    assert report["trees_purged"] == trees
    assert report["tasks_purged"] == len(purgeable)
    assert report["events_purged"] == events_of(before, purgeable)
    assert report["batches"] > 1
    assert report["longest_batch_ms"] >= 0
    assert counts(dry) == {**counts(report), "dry_run": True}
    after = logical_dump(db_path)
    assert task_ids(after) == task_ids(before) - purgeable
    assert stats["task_count"] == len(after["tasks"])
    assert stats["event_count"] == len(after["task_events"])


def test_purge_batches_are_bounded_by_tasks_not_only_by_trees(
    db_path: Path, clock: FrozenClock
) -> None:
    """A batch takes whole trees while they fit in 4,096 tasks: a single
    task, then a tree of exactly 4,096 in a batch of its own, then the last
    task (and a last, empty batch finds nothing more). Counted by trees
    alone, all three went in one write transaction: 256 large trees held
    the write lock for seconds."""
    sizes = (1, 4_096, 1)
    with opened(db_path, clock) as lg:
        for size in sizes:
            root = lg.create_task(delivery_required=False).id
            child = {"parent_id": root, "delivery_required": False}
            tree = [root, *(lg.create_task(**child).id for _ in range(size - 1))]
            for task_id in tree:
                lg.cancel(task_id)
                lg.set_delivery(task_id, "not_applicable", code="internal_task")
    clock.advance(3600)
    with opened(db_path, clock) as lg:
        dry = lg.purge(older_than_seconds=60, dry_run=True)
        report = lg.purge(older_than_seconds=60)
        assert lg.stats()["task_count"] == 0
        assert lg.doctor()["healthy"] is True
    assert (report["trees_purged"], report["tasks_purged"]) == (3, sum(sizes))
    assert report["batches"] == 4
    assert counts(dry) == {**counts(report), "dry_run": True}


SCAN_ROWS = 8192


def test_purge_reads_a_bounded_window_of_rows_per_batch(db_path: Path, clock: FrozenClock) -> None:
    """On a file where few trees are old enough, a batch reads at most
    8,192 rows looking for roots, and the next batch reads on from there:
    20,000 open tasks before two purgeable ones take three windows and a
    last, empty batch. One unbounded search (two batches) held the write
    lock for seconds on a file of millions."""
    open_tasks = 20_000
    with opened(db_path, clock) as lg:
        for _ in range(open_tasks):
            lg.create_task(delivery_required=False)
        purgeable = {closed_task(lg, delivery_required=False) for _ in range(2)}
    clock.advance(3600)
    with opened(db_path, clock) as lg:
        dry = lg.purge(older_than_seconds=60, dry_run=True)
        report = lg.purge(older_than_seconds=60)
        assert lg.stats()["task_count"] == open_tasks
        assert lg.doctor()["healthy"] is True
    windows = -(-(open_tasks + len(purgeable)) // SCAN_ROWS)
    assert (report["trees_purged"], report["tasks_purged"]) == (2, 2)
    assert report["batches"] == windows + 1
    assert counts(dry) == {**counts(report), "dry_run": True}
    assert purgeable.isdisjoint(task_ids(logical_dump(db_path)))


SWAPPING_WRITER = """
import sys, time
from taskwarden import Ledger
with Ledger(sys.argv[1], clock=lambda: float(sys.argv[2])) as lg:
    closed = [t.id for t in lg.list_tasks(status="succeeded", limit=1000)]
    old, pending = closed[:256], closed[256:]
    print("ready", flush=True)
    sys.stdin.readline()
    for gone, delivered in zip(old, pending):
        lg.delete_task(gone)  # 256 purgeable trees, then 255
        lg.set_delivery(delivered, "delivered", code="transport_acknowledged")  # 256 again
        time.sleep(0.005)
"""


def test_a_dry_run_beside_a_writer_counts_one_snapshot(db_path: Path, clock: FrozenClock) -> None:
    """A writer deletes one purgeable tree, then makes another purgeable,
    over and over: the ledger always holds 256 or 255 of them. A read-only
    dry run beside it counts one snapshot, however many batches it reads
    (the 256 oldest roots, then 10,000 open tasks, then the newest roots).
    Counted in one read transaction per batch, it answered 257: a count the
    ledger never held."""
    with opened(db_path, clock) as lg:
        for _ in range(256):
            closed_task(lg)
        for _ in range(10_000):
            lg.create_task()
        for _ in range(60):
            task = lg.create_task().id
            lg.start_task(task)
            lg.close_task(task, "succeeded")
    clock.advance(3600)
    seen: set[int] = set()
    with subprocess.Popen(
        [sys.executable, "-c", SWAPPING_WRITER, str(db_path), repr(clock.now)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as writer:
        assert writer.stdin is not None and writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        # An hour after the writer's changes: they are old enough too.
        later = clock.now + 3600
        with Ledger(db_path, read_only=True, clock=lambda: later) as reader:
            assert reader.storage_info()["journal_mode"] == "wal"
            writer.stdin.write("go\n")
            writer.stdin.flush()
            while writer.poll() is None:
                seen.add(reader.purge(older_than_seconds=60, dry_run=True)["trees_purged"])
        assert writer.wait(timeout=60) == 0, writer.stderr.read() if writer.stderr else ""
    assert len(seen) > 0 and seen <= {255, 256}, seen


PURGE_IN_A_CHILD = """
import sys
from taskwarden import Ledger, LedgerError
with Ledger(sys.argv[1]) as lg:
    for dry_run in (True, False):
        try:
            print(lg.purge(older_than_seconds=0, dry_run=dry_run)["tasks_purged"], flush=True)
        except LedgerError as refused:
            print(type(refused).__name__, flush=True)
"""


def test_purge_ends_on_a_tree_whose_ids_a_flipped_bit_duplicated(db_path: Path) -> None:
    """One bit flipped in the table's copy of a grandchild's id (the id
    index does not see it) gives it the root's id: a parent cycle the tree
    walk once followed for ever, in a write transaction Ctrl-C could not
    end. The walk now stops where an id repeats."""
    root_id = "00000000-0000-4000-8000-000000000001"
    twin_id = "00000000-0000-4000-8000-000000000003"  # one bit from root_id
    with Ledger(db_path) as lg:
        root = lg.create_task(task_id=root_id, delivery_required=False).id
        child = lg.create_task(parent_id=root, delivery_required=False).id
        twin = lg.create_task(task_id=twin_id, parent_id=child, delivery_required=False).id
        for task_id in (twin, child, root):
            lg.cancel(task_id)
            lg.set_delivery(task_id, "not_applicable", code="internal_task")
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        table_page = conn.execute(
            "SELECT rootpage FROM sqlite_schema WHERE name = 'tasks'"
        ).fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(db_path.read_bytes())
    start = (table_page - 1) * page_size  # three rows: the table is one leaf page
    at = data.find(twin_id.encode(), start, start + page_size)
    assert at > 0 and data.find(twin_id.encode(), at + 1, start + page_size) == -1
    data[at + 35] ^= 0x02  # '3' -> '1'
    db_path.write_bytes(bytes(data))
    # Ends (the run fails the test after 120 s): the dry run counts, the
    # apply purges or refuses the damaged tree cleanly.
    dry, applied = run_python(PURGE_IN_A_CHILD, str(db_path))[:2]
    assert int(dry) <= 3 and applied in (dry, "StateConflict")
    with Ledger(db_path) as lg:
        assert lg.doctor()["healthy"] is False


class Stopped(Exception):
    """What the test's signal handler raises."""


def _signal_once_the_purge_commits(wal: Path, started: threading.Event) -> None:
    """Sends SIGUSR1 to this process once the purge's first batch is in the
    WAL (so the signal lands inside the purge, not before it)."""
    started.wait(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if wal.exists() and wal.stat().st_size > 0:
            os.kill(os.getpid(), signal.SIGUSR1)
            return
        time.sleep(0.001)


def test_a_signal_stops_a_long_purge_between_batches(db_path: Path, clock: FrozenClock) -> None:
    """Ctrl-C (any Python signal handler that raises) ends a purge of a large
    file between two batches, not after the last one: the handler's own
    exception reaches the caller, the batches already committed stay purged,
    the file is healthy, and the next purge takes the rest."""
    trees = 24_000  # about a quarter of a second of purging here
    with opened(db_path, clock) as lg:
        for _ in range(trees):
            task = lg.create_task(delivery_required=False)
            lg.cancel(task.id)
            lg.set_delivery(task.id, "not_applicable", code="internal_task")
    clock.advance(3600)

    def stop(signum: int, frame: Any) -> None:
        raise Stopped

    previous = signal.signal(signal.SIGUSR1, stop)
    started = threading.Event()
    sender = threading.Thread(
        target=_signal_once_the_purge_commits, args=(Path(f"{db_path}-wal"), started)
    )
    sender.start()
    try:
        with opened(db_path, clock) as lg:
            started.set()
            with pytest.raises(Stopped):
                lg.purge(older_than_seconds=60)
            left = lg.stats()["task_count"]
            assert 0 < left < trees, "the purge ran to its end before stopping"
            assert lg.doctor()["healthy"] is True
            assert lg.purge(older_than_seconds=60)["trees_purged"] == left
            assert lg.stats()["task_count"] == 0
    finally:
        sender.join()
        signal.signal(signal.SIGUSR1, previous)


# --------------------------------------------------------------------------
# stats


def test_stats_counts_by_status_delivery_and_tenant(db_path: Path, clock: FrozenClock) -> None:
    sc = build_scenario(db_path, clock)
    dump = logical_dump(db_path)
    with opened(db_path, clock) as lg:
        stats = lg.stats()
        wal = Path(f"{db_path}-wal")
        sizes = (db_path.stat().st_size, wal.stat().st_size if wal.exists() else 0)
        by_tenant = {t: lg.stats(tenant=t) for t in ("acme", "beta", "nobody")}
        doctor = lg.doctor()
    assert set(stats) == STATS_KEYS
    assert stats["task_count"] == len(dump["tasks"]) == len(sc.ids(set(sc.trees)))
    assert stats["event_count"] == len(dump["task_events"])
    assert stats["by_status"] == doctor["task_status_counts"]
    assert stats["by_delivery"] == doctor["delivery_status_counts"]
    assert set(stats["by_status"]) == set(STATUSES)
    assert set(stats["by_delivery"]) == set(DELIVERIES)

    # Columns of tasks: id(0), parent_id, status(2), delivery_status(3), ... tenant(16).
    def tally(rows: list[tuple[Any, ...]], col: int, keys: list[str]) -> dict[str, int]:
        out = dict.fromkeys(keys, 0)
        for row in rows:
            out[row[col]] += 1
        return out

    assert stats["by_status"] == tally(dump["tasks"], 2, STATUSES)
    assert stats["by_delivery"] == tally(dump["tasks"], 3, DELIVERIES)
    tenants: dict[str, int] = {}
    for row in dump["tasks"]:
        key = row[16] if row[16] is not None else "(none)"
        tenants[key] = tenants.get(key, 0) + 1
    assert stats["by_tenant"] == tenants
    assert set(tenants) == {"acme", "beta", "(none)"}

    assert isinstance(stats["file_bytes"], int) and isinstance(stats["wal_bytes"], int)
    assert (stats["file_bytes"], stats["wal_bytes"]) == sizes
    assert stats["file_bytes"] > 0

    for tenant, scoped in by_tenant.items():
        rows = [r for r in dump["tasks"] if r[16] == tenant]
        ids = {r[0] for r in rows}
        assert scoped["task_count"] == len(rows)
        assert scoped["by_tenant"] == ({tenant: len(rows)} if rows else {})
        assert scoped["by_status"] == tally(rows, 2, STATUSES)
        assert scoped["by_delivery"] == tally(rows, 3, DELIVERIES)
        assert scoped["event_count"] == events_of(dump, ids)
        assert isinstance(scoped["file_bytes"], int)


def test_stats_count_a_damaged_tenant_without_echoing_it(db_path: Path) -> None:
    """A stored tenant that is no valid name (an edited or damaged file) is
    counted under ``(invalid)``: the text is never returned or printed, as
    every other read refuses such a row."""
    secret = "PROMPT SECRET 42 \x1b[2J"
    with Ledger(db_path) as lg:
        edited, blob = lg.create_task(tenant="acme").id, lg.create_task(tenant="acme").id
        lg.create_task(tenant="beta")
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute("UPDATE tasks SET tenant = ? WHERE id = ?", (secret, edited))
        conn.execute("UPDATE tasks SET tenant = CAST(tenant AS BLOB) WHERE id = ?", (blob,))
    with Ledger(db_path) as lg:
        assert lg.stats()["by_tenant"] == {"(invalid)": 2, "beta": 1}
        assert lg.stats(tenant="beta")["by_tenant"] == {"beta": 1}
    for form in ([], ["--format", "text"]):
        code, _, out = run_cli("--db", str(db_path), "stats", *form)
        assert code == 0
        assert "(invalid)" in out and "SECRET" not in out and "\x1b" not in out


def test_stats_of_an_empty_and_an_in_memory_ledger(ledger: Ledger) -> None:
    stats = ledger.stats()
    assert stats["task_count"] == 0 and stats["event_count"] == 0
    assert stats["by_status"] == dict.fromkeys(STATUSES, 0)
    assert stats["by_delivery"] == dict.fromkeys(DELIVERIES, 0)
    assert stats["by_tenant"] == {}
    assert isinstance(stats["file_bytes"], int) and stats["file_bytes"] > 0
    assert isinstance(stats["wal_bytes"], int)

    mem = Ledger.in_memory()
    try:
        mem.create_task(tenant="acme")
        mem.create_task()
        stats = mem.stats()
        assert stats["file_bytes"] is None and stats["wal_bytes"] is None
        assert stats["task_count"] == 2 and stats["event_count"] == 2
        assert stats["by_tenant"] == {"acme": 1, "(none)": 1}
        assert stats["by_status"]["queued"] == 2
    finally:
        mem.close()


def test_stats_refuses_a_bad_tenant(ledger: Ledger) -> None:
    for bad in ("", "a b", "(none)", 5):
        with pytest.raises(InvalidInput):
            ledger.stats(tenant=bad)  # type: ignore[arg-type]


def test_stats_follow_purge(db_path: Path, clock: FrozenClock) -> None:
    sc = build_scenario(db_path, clock)
    with opened(db_path, clock) as lg:
        before = lg.stats()
        report = lg.purge(older_than_seconds=OLDER_THAN)
        after = lg.stats()
    assert after["task_count"] == before["task_count"] - report["tasks_purged"]
    assert after["event_count"] == before["event_count"] - report["events_purged"]
    assert report["tasks_purged"] == len(sc.ids(sc.purgeable))


# --------------------------------------------------------------------------
# the CLI


def _cli_ledger(path: Path) -> tuple[set[str], set[str]]:
    """Old closed trees and living tasks, in the real past (the CLI uses
    ``time.time``)."""
    clock = FrozenClock(time.time() - 100_000)
    closed: set[str] = set()
    living: set[str] = set()
    with opened(path, clock) as lg:
        for _ in range(3):
            closed.add(closed_task(lg, tenant="acme"))
        root = lg.create_task().id
        closed.add(closed_task(lg, parent_id=root, delivery_required=False))
        close_fully(lg, root)
        closed.add(root)
        living.add(lg.create_task(tenant="acme").id)
        living.add(_running(lg))
    return closed, living


def test_cli_purge_dry_run_then_purge(db_path: Path) -> None:
    closed, living = _cli_ledger(db_path)
    db = str(db_path)
    before = logical_dump(db_path)

    code, out, raw = run_cli("--db", db, "purge", "--older-than-seconds", "3600", "--dry-run")
    assert code == 0, raw
    assert out["ok"] is True and set(out["purge"]) == PURGE_KEYS
    assert counts(out["purge"]) == {
        "dry_run": True,
        "trees_purged": 4,
        "tasks_purged": 5,
        "events_purged": events_of(before, closed),
    }
    assert logical_dump(db_path) == before
    assert raw.count("\n") == 1

    # A cutoff newer than everything: nothing qualifies.
    code, out, _ = run_cli("--db", db, "purge", "--older-than-seconds", "1000000")
    assert code == 0 and out["purge"]["trees_purged"] == 0
    assert logical_dump(db_path) == before

    code, out, _ = run_cli("--db", db, "purge", "--older-than-seconds", "3600", "--tenant", "acme")
    assert code == 0 and counts(out["purge"])["trees_purged"] == 3
    code, out, _ = run_cli("--db", db, "purge", "--older-than-seconds", "3600")
    assert code == 0 and counts(out["purge"]) == {
        "dry_run": False,
        "trees_purged": 1,
        "tasks_purged": 2,
        "events_purged": 8,
    }
    assert task_ids(logical_dump(db_path)) == living
    for task_id in closed | living:
        assert task_id not in raw

    code, out, _ = run_cli("--db", db, "doctor")
    assert code == 0 and out["healthy"] is True


@pytest.mark.parametrize(
    "args",
    [
        ["purge"],
        ["purge", "--older-than-seconds", "-5"],
        ["purge", "--older-than-seconds", "nan"],
        ["purge", "--older-than-seconds", "soon"],
        ["purge", "--older-than-seconds", "10", "--tenant", "a b"],
        ["stats", "--tenant", "a b"],
    ],
)
def test_cli_purge_and_stats_bad_arguments_exit_2(args: list[str], db_path: Path) -> None:
    _cli_ledger(db_path)
    before = logical_dump(db_path)
    code, out, raw = run_cli("--db", str(db_path), *args)
    assert code == 2, raw
    assert out == {"ok": False, "error": "InvalidInput"}
    assert "a b" not in raw and "soon" not in raw
    assert logical_dump(db_path) == before


def test_cli_stats(db_path: Path) -> None:
    closed, living = _cli_ledger(db_path)
    dump = logical_dump(db_path)
    db = str(db_path)
    code, out, raw = run_cli("--db", db, "stats")
    assert code == 0, raw
    assert out["ok"] is True
    stats = out["stats"]
    assert set(stats) == STATS_KEYS
    assert stats["task_count"] == len(closed | living) == 7
    assert stats["event_count"] == len(dump["task_events"])
    assert stats["by_tenant"] == {"acme": 4, "(none)": 3}
    assert stats["by_status"]["succeeded"] == 5
    assert stats["by_status"]["queued"] == 1 and stats["by_status"]["running"] == 1
    assert stats["by_delivery"] == {"pending": 2, "delivered": 4, "failed": 0, "not_applicable": 1}
    assert isinstance(stats["file_bytes"], int) and isinstance(stats["wal_bytes"], int)
    assert 0 < stats["file_bytes"] <= os.path.getsize(db_path) + stats["wal_bytes"]
    for task_id in closed | living:
        assert task_id not in raw

    code, out, _ = run_cli("--db", db, "stats", "--tenant", "acme")
    assert code == 0
    assert out["stats"]["task_count"] == 4 and out["stats"]["by_tenant"] == {"acme": 4}

    code, _, text = run_cli("--db", db, "stats", "--format", "text")
    assert code == 0 and not text.lstrip().startswith("{")
    assert "7" in text


def test_a_parent_is_refused_by_its_own_rule_and_nothing_is_written(ledger: Ledger) -> None:
    parent = _closed_parent_with_closed_child(ledger)
    path = ledger.path
    before = logical_dump(path)
    with pytest.raises(StateConflict, match="a task with children cannot be deleted"):
        ledger.delete_task(parent)
    assert logical_dump(path) == before
    assert len(ledger.events(parent)) >= 1


def test_a_tenant_s_purge_leaves_a_tree_holding_another_tenant_s_task(
    db_path: Path, clock: FrozenClock
) -> None:
    with opened(db_path, clock) as lg:
        root = lg.create_task(tenant="acme", delivery_required=False).id
        mine = lg.create_task(parent_id=root, tenant="acme", delivery_required=False).id
        theirs = lg.create_task(parent_id=root, tenant="beta", delivery_required=False).id
        for task in (mine, theirs, root):
            close_fully(lg, task)
    clock.advance(3600)
    with opened(db_path, clock) as lg:
        dry = lg.purge(older_than_seconds=60, dry_run=True, tenant="acme")
        report = lg.purge(older_than_seconds=60, tenant="acme")
        assert (report["trees_purged"], report["tasks_purged"]) == (0, 0)
        assert counts(dry) == {**counts(report), "dry_run": True}
        assert {t.id for t in lg.list_tasks()} == {root, mine, theirs}
        assert lg.purge(older_than_seconds=60, tenant="beta")["tasks_purged"] == 0
        # Unscoped, the whole tree goes.
        assert lg.purge(older_than_seconds=60)["tasks_purged"] == 3
