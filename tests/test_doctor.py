"""doctor (SPEC §6): a catalogue of tampering, one edit per check.

A realistic ledger is built once per module through the public API and
proven healthy with exact counts. Every case then edits a fresh copy of that
file with a short-lived ``sqlite3`` connection (while no ``Ledger`` is open
on it), opens a ``Ledger`` and asks ``doctor()``: the report must say
unhealthy and the named counter must be nonzero. Files that cannot be
opened as a ledger at all are judged through the CLI (exit 2), never a crash
and never healthy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import multiprocessing
import os
import queue
import random
import shutil
import sqlite3
import stat
import struct
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import task_state_guard as tsg

from taskwarden import Ledger
from taskwarden.errors import LedgerError, StateConflict

from .conftest import EVENT_TASK_ID, OF_TASK, FrozenClock, run_cli

SPAWN = multiprocessing.get_context("spawn")

REPORT_KEYS = {
    "healthy",
    "quick_check",
    "schema_version",
    "schema_ok",
    "task_count",
    "event_count",
    "task_status_counts",
    "delivery_status_counts",
    "orphan_count",
    "parent_cycle_count",
    "foreign_key_error_count",
    "state_inconsistency_count",
    "owner_inconsistency_count",
    "budget_inconsistency_count",
    "timestamp_inconsistency_count",
    "event_inconsistency_count",
    "event_chain_break_count",
    "doctor_error_count",
}
PROBLEM_COUNTERS = sorted(
    k for k in REPORT_KEYS if k.endswith("_count") and k not in ("task_count", "event_count")
)

NAMES = [
    "queued",
    "running",
    "blocked",
    "escalated",
    "succeeded",
    "failed",
    "parent",
    "child",
    "child2",
    "granted",
    "cancelled",
    "timed_out",
]


def tid(n: int) -> str:
    """A canonical (lowercase) UUID with hex letters in it, sorting by ``n``."""
    return f"{n:08x}-abcd-4ef0-8abc-{n:012x}"


IDS = {name: tid(i + 1) for i, name in enumerate(NAMES)}
MISSING_ID = tid(999)
MISSING_TASK_NO = 999

HEALTHY_STATUS = {
    "queued": 2,
    "running": 3,
    "blocked": 1,
    "escalated": 1,
    "succeeded": 2,
    "failed": 1,
    "timed_out": 1,
    "cancelled": 1,
}
HEALTHY_DELIVERY = {"pending": 9, "delivered": 1, "failed": 1, "not_applicable": 1}
EVENTS_PER_TASK = {
    "queued": 1,  # created
    "running": 2,  # created, claimed (heartbeats write no event)
    "blocked": 3,  # created, claimed, blocked
    "escalated": 3,  # created, claimed, escalated by budget (charges write none)
    "succeeded": 4,  # created, claimed, succeeded, delivered
    "failed": 4,  # created, started, failed, delivery failed
    "parent": 2,  # created, claimed
    "child": 4,  # created, claimed, succeeded, not_applicable
    "child2": 2,  # created, claimed
    "granted": 5,  # created, claimed, escalated, budget_granted, requeued
    "cancelled": 2,  # created, cancelled
    "timed_out": 3,  # created, claimed, timed_out (worker_lost)
}


# --------------------------------------------------------------------------
# building the healthy ledger


def build_mix(path: Path, clock: FrozenClock) -> None:
    """Every status, every delivery outcome, a budget tree and a grant."""
    with Ledger(path, clock=clock) as lg:
        lg.create_task(task_id=IDS["queued"], tenant="acme")
        clock.advance(1.0)
        lg.create_task(task_id=IDS["running"], timeout_seconds=300.0, tenant="acme")
        assert lg.claim(IDS["running"], "w1") is not None
        clock.advance(1.0)
        lg.heartbeat(IDS["running"], worker="w1")

        lg.create_task(task_id=IDS["blocked"])
        lg.claim(IDS["blocked"], "w2")
        lg.block(IDS["blocked"], worker="w2")
        clock.advance(1.0)

        lg.create_task(task_id=IDS["escalated"], llm_calls_budget=2)
        lg.claim(IDS["escalated"], "w3")
        answers = [lg.charge(IDS["escalated"], worker="w3") for _ in range(3)]
        assert [a.allowed for a in answers] == [True, True, False]
        assert answers[-1].escalated is True
        clock.advance(1.0)

        lg.create_task(task_id=IDS["succeeded"], payload_hash="a" * 64, timeout_seconds=60.0)
        lg.claim(IDS["succeeded"], "w1")
        assert lg.charge(IDS["succeeded"], calls=1, tokens=10, cost_micros=5).allowed
        clock.advance(1.0)
        lg.close_task(IDS["succeeded"], "succeeded", code="completed", worker="w1")
        clock.advance(1.0)
        lg.set_delivery(IDS["succeeded"], "delivered", code="transport_acknowledged")

        lg.create_task(task_id=IDS["failed"])
        lg.start_task(IDS["failed"])
        clock.advance(1.0)
        lg.close_task(IDS["failed"], "failed", code="worker_failed")
        clock.advance(1.0)
        lg.set_delivery(IDS["failed"], "failed", code="transport_failed")

        lg.create_task(
            task_id=IDS["parent"],
            llm_calls_budget=10,
            token_budget=1000,
            cost_budget_micros=10_000,
        )
        lg.claim(IDS["parent"], "w4")
        clock.advance(1.0)
        lg.create_task(
            task_id=IDS["child"], parent_id=IDS["parent"], delivery_required=False, token_budget=500
        )
        lg.claim(IDS["child"], "w5")
        assert lg.charge(IDS["child"], calls=2, tokens=100, cost_micros=1000, worker="w5").allowed
        clock.advance(1.0)
        lg.close_task(IDS["child"], "succeeded", code="worker_completed", worker="w5")
        clock.advance(1.0)
        lg.set_delivery(IDS["child"], "not_applicable", code="internal_task")
        lg.create_task(task_id=IDS["child2"], parent_id=IDS["parent"], tenant="acme")
        lg.claim(IDS["child2"], "w6")
        assert lg.charge(IDS["child2"], calls=1, tokens=7, worker="w6").allowed
        assert lg.charge(IDS["parent"], calls=1, worker="w4").allowed

        lg.create_task(task_id=IDS["granted"], llm_calls_budget=1)
        lg.claim(IDS["granted"], "w7")
        assert lg.charge(IDS["granted"], worker="w7").allowed
        assert lg.charge(IDS["granted"], worker="w7").escalated
        lg.grant(IDS["granted"], calls=5)
        lg.requeue(IDS["granted"])
        clock.advance(1.0)

        lg.create_task(task_id=IDS["cancelled"])
        lg.cancel(IDS["cancelled"])

        lg.create_task(task_id=IDS["timed_out"])
        lg.claim(IDS["timed_out"], "w8")
        clock.advance(1.0)
        report = lg.reconcile(
            active_grace_seconds=600.0, delivery_grace_seconds=600.0, worker_lost="w8"
        )
        assert report["tasks_timed_out"] == 1

        parent = lg.get_task(IDS["parent"])
        assert (parent.llm_calls_used, parent.tokens_used, parent.cost_used_micros) == (
            4,
            107,
            1000,
        )


@pytest.fixture(scope="module")
def healthy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("healthy")
    os.chmod(directory, 0o700)
    path = directory / "ledger.db"
    build_mix(path, FrozenClock())
    assert sorted(os.listdir(directory)) == ["ledger.db"], "sidecars left after close"
    return path


@pytest.fixture
def copy(healthy_file: Path, tmp_path: Path) -> Path:
    """A fresh copy of the healthy ledger, mode 0600 in a private directory."""
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "ledger.db"
    shutil.copyfile(healthy_file, path)
    os.chmod(path, 0o600)
    return path


# --------------------------------------------------------------------------
# helpers


def doctor_of(path: Path) -> dict[str, Any]:
    with Ledger(path) as lg:
        return lg.doctor()


@contextlib.contextmanager
def tampering(path: Path, *, ignore_checks: bool = False) -> Iterator[sqlite3.Connection]:
    """A short-lived plain connection (no Ledger is open), committed on exit."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        if ignore_checks:
            conn.execute("PRAGMA ignore_check_constraints=ON")
        with conn:
            yield conn


def sequences(conn: sqlite3.Connection, task: str) -> list[int]:
    """The event sequence numbers of a task, by its fixture name or its id."""
    rows = conn.execute(
        f"SELECT sequence FROM task_events WHERE {OF_TASK} ORDER BY sequence",
        (IDS.get(task, task),),
    )
    return [r[0] for r in rows]


EVENT_FIELDS = (
    "event_kind, from_value, to_value, occurred_at, code, worker, "
    "grant_calls, grant_tokens, grant_cost_micros, event_hash"
)
# An event as its hash reads it: its task's id first.
EVENT_COLS = f"{EVENT_TASK_ID}, {EVENT_FIELDS}"
# An event as stored: its task's number first.
STORED_EVENT_COLS = f"task_no, {EVENT_FIELDS}"


def chain_hash(prev: bytes, row: tuple[Any, ...]) -> bytes:
    """Recompute one event's chain hash the way a forger who read the source
    would (task_id .. grant_cost_micros as in ``EVENT_COLS``)."""
    task_id, kind, frm, to, at, code, worker, gc, gt, gm = row[:10]
    grant = None if None in (gc, gt, gm) else f"{gc}/{gt}/{gm}"
    bits = struct.unpack(">Q", struct.pack(">d", at))[0]
    h = hashlib.sha256(b"taskwarden-event-v1")
    h.update(prev)
    for value in (task_id, kind, frm, to, f"{bits:016x}", code, worker, grant):
        h.update(b"\x1f")
        h.update(b"\x00" if value is None else value.encode())
    return h.digest()


def rechain(conn: sqlite3.Connection, task: str) -> None:
    """Recompute every hash of one task's chain and its head, so only the
    state-machine replay can notice what was done to the events."""
    prev = bytes(32)
    for seq in sequences(conn, task):
        row = conn.execute(
            f"SELECT {EVENT_COLS} FROM task_events WHERE sequence = ?", (seq,)
        ).fetchone()
        prev = chain_hash(prev, row)
        conn.execute("UPDATE task_events SET event_hash = ? WHERE sequence = ?", (prev, seq))
    conn.execute("UPDATE tasks SET event_head = ? WHERE id = ?", (prev, IDS.get(task, task)))


def forger_reproduces_chain(path: Path) -> bool:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        heads: dict[str, bytes] = {}
        for row in conn.execute(f"SELECT {EVENT_COLS} FROM task_events ORDER BY 1, sequence"):
            if chain_hash(heads.get(row[0], bytes(32)), row) != row[10]:
                return False
            heads[row[0]] = row[10]
    return True


def swap_events(conn: sqlite3.Connection, a: int, b: int) -> None:
    """Exchange the whole contents (hash included) of events ``a`` and ``b``."""
    row_a = conn.execute(
        f"SELECT {STORED_EVENT_COLS} FROM task_events WHERE sequence = ?", (a,)
    ).fetchone()
    row_b = conn.execute(
        f"SELECT {STORED_EVENT_COLS} FROM task_events WHERE sequence = ?", (b,)
    ).fetchone()
    assignments = ", ".join(f"{c.strip()} = ?" for c in STORED_EVENT_COLS.split(","))
    conn.execute(f"UPDATE task_events SET {assignments} WHERE sequence = ?", (*row_b, a))
    conn.execute(f"UPDATE task_events SET {assignments} WHERE sequence = ?", (*row_a, b))


def file_state(path: Path) -> tuple[str, int, int, list[str]]:
    st = path.stat()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest, st.st_size, st.st_mtime_ns, sorted(os.listdir(path.parent))


# --------------------------------------------------------------------------
# the healthy baseline


def test_healthy_ledger_has_exact_counts(copy: Path) -> None:
    report = doctor_of(copy)
    assert set(report) == REPORT_KEYS
    assert report["healthy"] is True
    assert report["quick_check"] == "ok"
    assert report["schema_ok"] is True and report["schema_version"] == 3
    assert report["task_count"] == len(NAMES)
    assert report["event_count"] == sum(EVENTS_PER_TASK.values()) == 35
    assert report["task_status_counts"] == HEALTHY_STATUS
    assert report["delivery_status_counts"] == HEALTHY_DELIVERY
    assert {k: report[k] for k in PROBLEM_COUNTERS} == dict.fromkeys(PROBLEM_COUNTERS, 0)
    with contextlib.closing(sqlite3.connect(copy)) as conn:
        per_task = dict(
            conn.execute(f"SELECT {EVENT_TASK_ID}, count(*) FROM task_events GROUP BY 1")
        )
    assert per_task == {IDS[name]: n for name, n in EVENTS_PER_TASK.items()}


def test_in_memory_ledger_is_healthy_and_counts() -> None:
    clock = FrozenClock()
    lg = Ledger.in_memory(clock=clock)
    try:
        empty = lg.doctor()
        assert empty["healthy"] is True and empty["task_count"] == 0
        assert empty["event_count"] == 0
        t = lg.create_task()
        lg.claim(t.id, "w1")
        report = lg.doctor()
        assert report["healthy"] is True
        assert (report["task_count"], report["event_count"]) == (1, 2)
        assert report["task_status_counts"]["running"] == 1
        assert report["quick_check"] == "ok"
    finally:
        lg.close()


# --------------------------------------------------------------------------
# the tampering catalogue: one edit, one counter


@dataclass(frozen=True)
class Tamper:
    name: str
    counter: str
    edit: Callable[[sqlite3.Connection], None]
    ignore_checks: bool = False
    exact: int | None = None


def _sql(statement: str, *params: Any) -> Callable[[sqlite3.Connection], None]:
    def edit(conn: sqlite3.Connection) -> None:
        cursor = conn.execute(statement, params)
        assert cursor.rowcount >= 1, "the tamper changed nothing"

    return edit


def _event_at(task: str, index: int, statement: str) -> Callable[[sqlite3.Connection], None]:
    """Run ``statement`` with ``?`` bound to the sequence of ``task``'s ``index``-th event."""

    def edit(conn: sqlite3.Connection) -> None:
        seq = sequences(conn, task)[index]
        assert conn.execute(statement, (seq,)).rowcount == 1

    return edit


def _swap(task: str, i: int, j: int) -> Callable[[sqlite3.Connection], None]:
    def edit(conn: sqlite3.Connection) -> None:
        seqs = sequences(conn, task)
        swap_events(conn, seqs[i], seqs[j])

    return edit


def _insert_copy_of_last(task: str) -> Callable[[sqlite3.Connection], None]:
    def edit(conn: sqlite3.Connection) -> None:
        seq = sequences(conn, task)[-1]
        conn.execute(
            f"INSERT INTO task_events ({STORED_EVENT_COLS}) "
            f"SELECT {STORED_EVENT_COLS} FROM task_events WHERE sequence = ?",
            (seq,),
        )

    return edit


def _orphan_event(conn: sqlite3.Connection) -> None:
    conn.execute(
        f"INSERT INTO task_events ({STORED_EVENT_COLS}) "
        "VALUES (?, 'created', NULL, 'queued', 1800000000.0, 'created', NULL, NULL, NULL, NULL, ?)",
        (MISSING_TASK_NO, hashlib.sha256(b"orphan").digest()),
    )


def _uppercase_id(conn: sqlite3.Connection) -> None:
    # Its events name it by number, and so follow it.
    conn.execute("UPDATE tasks SET id = upper(id) WHERE id = ?", (IDS["queued"],))
    assert IDS["queued"].upper() != IDS["queued"]


def _parent_cycle(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE tasks SET parent_id = ? WHERE id = ?", (IDS["cancelled"], IDS["queued"]))
    conn.execute("UPDATE tasks SET parent_id = ? WHERE id = ?", (IDS["queued"], IDS["cancelled"]))


TAMPERS = [
    # statuses and codes
    Tamper(
        "status_edit_row_self_consistent",
        "event_inconsistency_count",
        _sql(
            "UPDATE tasks SET status = 'succeeded', terminal_code = 'completed' WHERE id = ?",
            IDS["failed"],
        ),
    ),
    Tamper(
        "status_running_to_blocked",
        "event_inconsistency_count",
        _sql("UPDATE tasks SET status = 'blocked' WHERE id = ?", IDS["running"]),
    ),
    Tamper(
        "status_unknown_value",
        "state_inconsistency_count",
        _sql("UPDATE tasks SET status = 'paused' WHERE id = ?", IDS["queued"]),
        ignore_checks=True,
    ),
    Tamper(
        "terminal_code_other_registered_code_for_status",
        "event_inconsistency_count",
        _sql("UPDATE tasks SET terminal_code = 'worker_completed' WHERE id = ?", IDS["succeeded"]),
    ),
    Tamper(
        "terminal_code_registered_but_wrong_status",
        "state_inconsistency_count",
        _sql("UPDATE tasks SET terminal_code = 'worker_failed' WHERE id = ?", IDS["succeeded"]),
    ),
    Tamper(
        "delivery_code_other_allowed_code",
        "event_inconsistency_count",
        _sql(
            "UPDATE tasks SET delivery_code = 'delivery_grace_expired' WHERE id = ?", IDS["failed"]
        ),
    ),
    Tamper(
        "delivery_code_wrong_for_delivery_status",
        "state_inconsistency_count",
        _sql("UPDATE tasks SET delivery_code = 'internal_task' WHERE id = ?", IDS["succeeded"]),
    ),
    Tamper(
        "delivery_status_edit",
        "event_inconsistency_count",
        _sql(
            "UPDATE tasks SET delivery_status = 'failed', delivery_code = 'transport_failed' "
            "WHERE id = ?",
            IDS["succeeded"],
        ),
    ),
    # timestamps
    Tamper(
        "updated_at_before_created_at",
        "timestamp_inconsistency_count",
        _sql("UPDATE tasks SET updated_at = created_at - 1 WHERE id = ?", IDS["queued"]),
    ),
    Tamper(
        "deadline_not_start_plus_timeout",
        "timestamp_inconsistency_count",
        _sql("UPDATE tasks SET deadline_at = deadline_at + 1 WHERE id = ?", IDS["running"]),
    ),
    Tamper(
        "child_created_before_parent",
        "timestamp_inconsistency_count",
        _sql("UPDATE tasks SET parent_id = ? WHERE id = ?", IDS["cancelled"], IDS["queued"]),
    ),
    # row times the events contradict (every timestamp rule still holds)
    Tamper(
        "created_at_moved_with_its_row",  # reorders the claim queue
        "event_inconsistency_count",
        _sql(
            "UPDATE tasks SET created_at = created_at - 3600, updated_at = updated_at - 3600, "
            "delivery_updated_at = delivery_updated_at - 3600 WHERE id = ?",
            IDS["queued"],
        ),
        exact=1,
    ),
    Tamper(
        "parked_updated_at_after_its_event",
        "event_inconsistency_count",
        _sql("UPDATE tasks SET updated_at = updated_at + 0.5 WHERE id = ?", IDS["blocked"]),
        exact=1,
    ),
    Tamper(
        "requeued_updated_at_after_its_event",
        "event_inconsistency_count",
        _sql("UPDATE tasks SET updated_at = updated_at + 0.5 WHERE id = ?", IDS["granted"]),
        exact=1,
    ),
    # the event chain
    Tamper(
        "event_code_edit",
        "event_chain_break_count",
        _event_at("running", 1, "UPDATE task_events SET code = 'started' WHERE sequence = ?"),
    ),
    Tamper(
        "event_occurred_at_edit",
        "event_chain_break_count",
        _event_at(
            "queued", 0, "UPDATE task_events SET occurred_at = occurred_at + 0.5 WHERE sequence = ?"
        ),
    ),
    Tamper(
        "event_hash_edit",
        "event_chain_break_count",
        _event_at(
            "succeeded",
            1,
            "UPDATE task_events SET event_hash = zeroblob(32) WHERE sequence = ?",
        ),
    ),
    Tamper(
        "event_head_edit",
        "event_chain_break_count",
        _sql("UPDATE tasks SET event_head = zeroblob(32) WHERE id = ?", IDS["parent"]),
    ),
    Tamper(
        "event_deleted_first",
        "event_chain_break_count",
        _event_at("succeeded", 0, "DELETE FROM task_events WHERE sequence = ?"),
    ),
    Tamper(
        "event_deleted_middle",
        "event_chain_break_count",
        _event_at("succeeded", 1, "DELETE FROM task_events WHERE sequence = ?"),
    ),
    Tamper(
        "event_deleted_last",
        "event_chain_break_count",
        _event_at("succeeded", -1, "DELETE FROM task_events WHERE sequence = ?"),
    ),
    Tamper("events_reordered", "event_chain_break_count", _swap("succeeded", 1, 2)),
    # A grant amount on an event that is no grant, or on a grant only in
    # part, is not in the hash: the event's shape must tell.
    Tamper(
        "grant_amount_on_a_claim_event",
        "event_inconsistency_count",
        _event_at("running", 1, "UPDATE task_events SET grant_calls = 9 WHERE sequence = ?"),
        exact=1,
    ),
    Tamper(
        "grant_amounts_on_a_claim_event",
        "event_chain_break_count",
        _event_at(
            "running",
            1,
            "UPDATE task_events SET grant_calls = 9, grant_tokens = 0, grant_cost_micros = 0 "
            "WHERE sequence = ?",
        ),
    ),
    Tamper(
        "grant_amount_cleared_in_part",
        "event_chain_break_count",
        _event_at("granted", 3, "UPDATE task_events SET grant_tokens = NULL WHERE sequence = ?"),
    ),
    Tamper("event_inserted", "event_chain_break_count", _insert_copy_of_last("running")),
    # budgets, owners
    Tamper(
        "usage_above_limit",
        "budget_inconsistency_count",
        _sql(
            "UPDATE tasks SET llm_calls_used = llm_calls_budget + 1 WHERE id = ?", IDS["escalated"]
        ),
    ),
    Tamper(
        "tokens_above_limit",
        "budget_inconsistency_count",
        _sql("UPDATE tasks SET tokens_used = token_budget + 1 WHERE id = ?", IDS["child"]),
    ),
    Tamper(
        "parent_usage_below_children_sum",
        "budget_inconsistency_count",
        _sql("UPDATE tasks SET llm_calls_used = 2 WHERE id = ?", IDS["parent"]),
    ),
    Tamper(
        "parent_cost_below_children_sum",
        "budget_inconsistency_count",
        _sql("UPDATE tasks SET cost_used_micros = 999 WHERE id = ?", IDS["parent"]),
    ),
    Tamper(
        "owner_on_queued_task",
        "owner_inconsistency_count",
        _sql("UPDATE tasks SET owner = 'w9' WHERE id = ?", IDS["queued"]),
    ),
    Tamper(
        "malformed_owner",
        "owner_inconsistency_count",
        _sql("UPDATE tasks SET owner = 'w 1' WHERE id = ?", IDS["running"]),
    ),
    # Self-consistent row edits: only the events tell the truth.
    Tamper(
        "owner_swapped_to_another_worker",
        "owner_inconsistency_count",
        _sql("UPDATE tasks SET owner = 'w9' WHERE id = ?", IDS["running"]),
        exact=1,
    ),
    Tamper(
        "attempt_count_reset",
        "owner_inconsistency_count",
        _sql("UPDATE tasks SET attempt_count = 0 WHERE id = ?", IDS["granted"]),
        exact=1,
    ),
    # links and ids
    Tamper(
        "parent_link_to_missing_task",
        "orphan_count",
        _sql("UPDATE tasks SET parent_id = ? WHERE id = ?", MISSING_ID, IDS["queued"]),
        exact=1,
    ),
    Tamper("parent_cycle", "parent_cycle_count", _parent_cycle, exact=1),
    Tamper("orphan_event", "foreign_key_error_count", _orphan_event, exact=1),
    Tamper("uppercase_id", "state_inconsistency_count", _uppercase_id),
]


@pytest.mark.parametrize("tamper", TAMPERS, ids=[t.name for t in TAMPERS])
def test_tamper_is_detected(tamper: Tamper, copy: Path) -> None:
    with tampering(copy, ignore_checks=tamper.ignore_checks) as conn:
        tamper.edit(conn)

    report = doctor_of(copy)
    assert set(report) == REPORT_KEYS
    assert report["healthy"] is False, report
    assert report[tamper.counter] >= 1, (tamper.counter, report)
    if tamper.exact is not None:
        assert report[tamper.counter] == tamper.exact, report
    # The schema and the pages are intact: only the logical check fires
    # (a CHECK violation is quick_check's business too: see the test below).
    assert report["schema_ok"] is True
    if not tamper.ignore_checks:
        assert report["quick_check"] == "ok"
    assert report["doctor_error_count"] == 0
    assert report["task_count"] == len(NAMES)

    # The CLI says the same, exits 1 (never 3), and so does a read-only doctor.
    code, out, _ = run_cli("--db", str(copy), "doctor")
    assert (code, out) == (1, report)
    code, out, _ = run_cli("--db", str(copy), "doctor", "--read-only")
    assert code == 1
    if tamper.ignore_checks:
        out.pop("quick_check")
        report.pop("quick_check")
    assert out == report


@pytest.mark.parametrize("mode", [[], ["--read-only"]])
def test_cli_doctor_refuses_a_negative_snapshot_cap(copy: Path, mode: list[str]) -> None:
    """A bad number is bad input whether or not this run would use it."""
    before = copy.read_bytes()
    code, out, _ = run_cli("--db", str(copy), "doctor", *mode, "--snapshot-max-mib", "-1")
    assert (code, out) == (2, {"error": "InvalidInput", "ok": False})
    assert copy.read_bytes() == before


CHECK_BREAKS = {
    # a row that no longer decodes: SQLite judges its CHECKs
    "unknown_status": ("UPDATE tasks SET status = 'paused' WHERE id = ?", "queued"),
    "short_event_hash": (
        f"UPDATE task_events SET event_hash = zeroblob(31) WHERE {OF_TASK}",
        "queued",
    ),
    # rows that decode: doctor's scan judges the CHECKs itself
    "negative_usage": ("UPDATE tasks SET llm_calls_used = -1 WHERE id = ?", "running"),
    "empty_tenant": ("UPDATE tasks SET tenant = '' WHERE id = ?", "queued"),
    "unknown_event_kind": (
        f"UPDATE task_events SET event_kind = 'paused' WHERE {OF_TASK}",
        "queued",
    ),
}


def _break_a_check_constraint(path: Path, how: str = "unknown_status") -> None:
    sql, name = CHECK_BREAKS[how]
    with tampering(path, ignore_checks=True) as conn:
        conn.execute(sql, (IDS[name],))
    # Ground truth from SQLite itself, on a normal connection.
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA quick_check").fetchall() != [("ok",)]


@pytest.mark.parametrize("how", sorted(CHECK_BREAKS))
def test_quick_check_reports_a_check_constraint_violation(copy: Path, how: str) -> None:
    """SQLite's ``quick_check`` verifies CHECK constraints on a normal
    connection (the peer's doctor runs it there). doctor's ``quick_check``
    verdict must say the same, whether the row still decodes (the scan
    judges the CHECKs) or not (SQLite judges them for that row), writable
    and read-only alike."""
    _break_a_check_constraint(copy, how)
    code_ro, out_ro, _ = run_cli("--db", str(copy), "doctor", "--read-only")
    report = doctor_of(copy)
    assert report["healthy"] is False
    assert out_ro["quick_check"] == "failed"
    assert report["quick_check"] == "failed", "writable doctor's quick_check missed it"
    code, out, _ = run_cli("--db", str(copy), "doctor")
    assert (code, out) == (code_ro, out_ro) == (1, report)


@pytest.mark.parametrize("how", ["negative_usage", "unknown_status"])
def test_read_only_quick_check_skips_check_constraints(copy: Path, how: str) -> None:
    """Why the benchmarks take SQLite's default connection as the bare
    ``quick_check`` to compare doctor with: on a read-only connection SQLite
    does not load CHECK constraints, so there the pragma passes a row that
    breaks one. doctor's verdict, read-only too, does not."""
    _break_a_check_constraint(copy, how)
    with contextlib.closing(sqlite3.connect(f"file:{copy}?mode=ro", uri=True)) as conn:
        assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    with Ledger(copy, read_only=True) as ledger:
        assert ledger.doctor()["quick_check"] == "failed"


def test_unreadable_task_row_does_not_orphan_its_children_and_events(copy: Path) -> None:
    """A task row with an unknown status is one state inconsistency. Its two
    children still have their parent row and its events still have their
    task: no orphan and no foreign-key error (``PRAGMA foreign_key_check``,
    the peer's definition of that counter, finds none)."""
    with tampering(copy, ignore_checks=True) as conn:
        conn.execute("UPDATE tasks SET status = 'paused' WHERE id = ?", (IDS["parent"],))
    with contextlib.closing(sqlite3.connect(copy)) as conn:
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    report = doctor_of(copy)
    assert report["healthy"] is False
    assert report["state_inconsistency_count"] == 1
    assert report["orphan_count"] == 0, report
    assert report["foreign_key_error_count"] == 0, report


def test_malformed_value_in_one_row_does_not_stop_the_scan(copy: Path) -> None:
    """A parent's created_at stored as text: unhealthy, and every task is
    still counted (the scan does not stop at the first odd value)."""
    with tampering(copy) as conn:
        conn.execute("UPDATE tasks SET created_at = 'yesterday' WHERE id = ?", (IDS["parent"],))
    report = doctor_of(copy)
    assert report["healthy"] is False
    assert report["state_inconsistency_count"] >= 1
    assert report["task_count"] == len(NAMES), report
    # The odd row too is counted under the statuses it stores.
    assert sum(report["task_status_counts"].values()) == len(NAMES)
    assert sum(report["delivery_status_counts"].values()) == len(NAMES)
    assert report["event_count"] == 35


# Damage that leaves a row unreadable as a whole but its statuses sound.
UNREADABLE_ROWS = {
    "delivery_required_2": "UPDATE tasks SET delivery_required = 2 WHERE id = ?",
    "created_at_text": "UPDATE tasks SET created_at = 'abc' WHERE id = ?",
    "unknown_status": "UPDATE tasks SET status = 'bogus' WHERE id = ?",
}


@pytest.mark.parametrize("damage", sorted(UNREADABLE_ROWS))
def test_status_counts_of_a_damaged_peer_file_are_the_peer_s(tmp_path: Path, damage: str) -> None:
    """The peer counts statuses by their columns alone; a row the scan
    could not read whole once went missing from both counts here (their
    sums short of task_count), whatever statuses it stored."""
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "peer.db"
    peer = tsg.Ledger(path)
    queued = peer.create_task().id
    peer.start_task(peer.create_task().id)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute(UNREADABLE_ROWS[damage], (queued,))
        conn.commit()
    theirs = tsg.Ledger(path, read_only=True).doctor()
    with Ledger(path, read_only=True) as ledger:
        ours = ledger.doctor()
    assert ours["healthy"] is theirs["healthy"] is False
    for counts in ("task_status_counts", "delivery_status_counts"):
        assert {k: v for k, v in ours[counts].items() if v} == {
            k: v for k, v in theirs[counts].items() if v
        }


def _chain(ledger: Ledger, ids: Iterator[str], length: int, parent: str | None = None) -> list[str]:
    chain = []
    for _ in range(length):
        parent = ledger.create_task(task_id=next(ids), parent_id=parent).id
        chain.append(parent)
    return chain


@pytest.mark.parametrize("order", ["members_first", "tails_first", "mixed"])
def test_each_parent_cycle_counts_once_however_deep_the_trees(tmp_path: Path, order: str) -> None:
    """Doctor walks the tasks in id order. The ids are dealt so that the
    cycles are met first from a member, first from a tail hanging below
    one, or in no particular order."""
    rng = random.Random(order)
    pool = sorted(str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(800))
    if order == "mixed":
        rng.shuffle(pool)
    if order == "tails_first":
        tails, members = iter(pool[:497]), iter(pool[497:])
    else:
        members, tails = iter(pool[:303]), iter(pool[303:])
    path = tmp_path / "trees.db"
    with Ledger(path) as ledger:
        ring = _chain(ledger, members, 300)  # its root will point at its leaf
        for at in (0, 150, 299):
            _chain(ledger, tails, 20, parent=ring[at])
        loop = _chain(ledger, members, 1)  # it will be its own parent
        _chain(ledger, tails, 50, parent=loop[0])
        pair = _chain(ledger, members, 2)  # a two-task cycle with tails under both
        for member in pair:
            _chain(ledger, tails, 10, parent=member)
        _chain(ledger, tails, 300)  # a deep chain with no cycle
    with tampering(path, ignore_checks=True) as conn:
        for child, parent in [(ring[0], ring[-1]), (loop[0], loop[0]), (pair[0], pair[1])]:
            conn.execute("UPDATE tasks SET parent_id = ? WHERE id = ?", (parent, child))
    report = doctor_of(path)
    assert report["parent_cycle_count"] == 3
    assert report["orphan_count"] == 0
    assert not report["healthy"]


def test_orphan_link_is_a_foreign_key_error_too(copy: Path) -> None:
    with tampering(copy) as conn:
        conn.execute("UPDATE tasks SET parent_id = ? WHERE id = ?", (MISSING_ID, IDS["queued"]))
    report = doctor_of(copy)
    assert report["orphan_count"] == 1
    assert report["foreign_key_error_count"] >= 1
    assert report["parent_cycle_count"] == 0


@pytest.mark.parametrize("forgery", ["extra_delivery_event", "reordered_events"], ids=lambda s: s)
def test_forged_chain_is_caught_by_the_replay(forgery: str, copy: Path) -> None:
    """A forger who recomputes every hash keeps the chain intact; the replay of
    the state machine must still see the events disagree."""
    if not forger_reproduces_chain(copy):
        pytest.skip("the event hash format is not the one this forger knows")
    with tampering(copy) as conn:
        seqs = sequences(conn, "succeeded")
        if forgery == "extra_delivery_event":
            # A second delivery outcome after the first one.
            conn.execute(
                f"INSERT INTO task_events ({STORED_EVENT_COLS}) "
                f"SELECT {STORED_EVENT_COLS} FROM task_events WHERE sequence = ?",
                (seqs[-1],),
            )
        else:
            # claimed and succeeded exchanged: succeeded straight from queued,
            # then queued -> running after a terminal status.
            swap_events(conn, seqs[1], seqs[2])
        rechain(conn, "succeeded")
    report = doctor_of(copy)
    assert report["event_chain_break_count"] == 0, report
    assert report["event_inconsistency_count"] == 1, report
    assert report["healthy"] is False


@pytest.mark.parametrize("at", [math.inf, -math.inf, -5.0], ids=["inf", "-inf", "before-created"])
def test_a_grant_dated_out_of_bounds_is_inconsistent(db_path: Path, at: float) -> None:
    """A grant's time is in its event alone, so the replay bounds it: a
    finite time, not before the task. Unbounded, a rehashed chain carried
    ``Infinity`` into events() and the CLI's JSON."""
    with Ledger(db_path, clock=FrozenClock(1_000.0)) as lg:
        task = lg.create_task(llm_calls_budget=1)
        lg.grant(task.id, calls=1)
    if not forger_reproduces_chain(db_path):
        pytest.skip("the event hash format is not the one this forger knows")
    with tampering(db_path) as conn:
        grant = sequences(conn, task.id)[-1]
        conn.execute("UPDATE task_events SET occurred_at = ? WHERE sequence = ?", (at, grant))
        rechain(conn, task.id)
    report = doctor_of(db_path)
    assert (report["event_chain_break_count"], report["event_inconsistency_count"]) == (0, 1)
    with Ledger(db_path) as lg, pytest.raises(StateConflict):
        lg.events(task.id)


def test_a_usage_counter_that_is_no_integer_is_damage_not_a_crash(db_path: Path) -> None:
    """A child's counter stored as 0.5 (CHECKs pass it) beside a charged
    sibling: the children's sum once overflowed and doctor panicked (a
    BaseException, CLI exit 1 as if unhealthy). It is a budget
    inconsistency, read-only or not."""
    with Ledger(db_path) as lg:
        parent = lg.create_task()
        charged, damaged = (lg.create_task(parent_id=parent.id) for _ in range(2))
        lg.claim(charged.id, "w")
        assert lg.charge(charged.id, worker="w").allowed
    with tampering(db_path) as conn:
        conn.execute("UPDATE tasks SET llm_calls_used = 0.5 WHERE id = ?", (damaged.id,))
    for read_only in (False, True):
        with Ledger(db_path, read_only=read_only) as lg:
            report = lg.doctor()
        assert report["healthy"] is False and report["budget_inconsistency_count"] >= 1
    code, out, _ = run_cli("--db", str(db_path), "doctor")
    assert (code, out["healthy"]) == (1, False)


# --------------------------------------------------------------------------
# files that are not (or no longer) a taskwarden ledger


def _extra_index(path: Path) -> None:
    with tampering(path) as conn:
        conn.execute("CREATE INDEX tasks_tenant_extra_idx ON tasks(tenant)")


RESET_CALLS = (
    "AFTER UPDATE OF llm_calls_used ON tasks "
    "BEGIN UPDATE tasks SET llm_calls_used = 0 WHERE id = new.id; END"
)


def _lookalike_trigger(path: Path) -> None:
    """Plain SQL may name a trigger ``sqlitex``: the peer's fingerprint
    skips every name LIKE 'sqlite_%', so it was left out of the check."""
    with tampering(path) as conn:
        conn.execute(f"CREATE TRIGGER sqlitex_reset {RESET_CALLS}")


def _planted(kind: str, sql: str) -> Callable[[Path], None]:
    """An object under SQLite's own prefix, written into the schema table."""

    def plant(path: Path) -> None:
        with tampering(path) as conn:
            conn.execute("PRAGMA writable_schema = ON")
            name = f"sqlite_{kind}_x"
            table = name if kind == "view" else "tasks"  # what a view or trigger is on
            conn.execute(
                "INSERT INTO sqlite_master (type, name, tbl_name, rootpage, sql) "
                "VALUES (?, ?, ?, 0, ?)",
                (kind, name, table, sql.format(name=name)),
            )
            version = conn.execute("PRAGMA schema_version").fetchone()[0]
            conn.execute(f"PRAGMA schema_version = {version + 1}")

    return plant


def _planted_table(name: str, sql: str) -> Callable[[Path], None]:
    """A table of free text renamed into SQLite's reserved prefix (a name
    SQLite itself no longer makes, in other words than its own)."""

    def plant(path: Path) -> None:
        with tampering(path) as conn:
            conn.execute("CREATE TABLE planted (note TEXT)")
            conn.execute("INSERT INTO planted VALUES ('a prompt left in the file')")
        with tampering(path) as conn:
            conn.execute("PRAGMA writable_schema = ON")
            conn.execute(
                "UPDATE sqlite_master SET name = ?1, tbl_name = ?1, sql = ?2 "
                "WHERE name = 'planted'",
                (name, sql),
            )
            version = conn.execute("PRAGMA schema_version").fetchone()[0]
            conn.execute(f"PRAGMA schema_version = {version + 1}")

    return plant


def _extra_meta(path: Path) -> None:
    with tampering(path) as conn:
        conn.execute("INSERT INTO schema_meta(key, value) VALUES ('note', 'x')")


def _version(value: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        with tampering(path) as conn:
            conn.execute("UPDATE schema_meta SET value = ? WHERE key = 'schema_version'", (value,))

    return edit


def _truncate_half(path: Path) -> None:
    size = path.stat().st_size
    os.truncate(path, size // 2)


def _garbage(path: Path) -> None:
    size = path.stat().st_size
    path.write_bytes(random.Random(1234).randbytes(size))


FILE_DAMAGE: dict[str, Callable[[Path], None]] = {
    "extra_schema_object": _extra_index,
    "lookalike_trigger": _lookalike_trigger,
    "planted_sqlite_trigger": _planted("trigger", f"CREATE TRIGGER {{name}} {RESET_CALLS}"),
    "planted_sqlite_view": _planted("view", "CREATE VIEW {name} AS SELECT 'free text' AS note"),
    "planted_stat_table": _planted_table("sqlite_stat3", "CREATE TABLE sqlite_stat3(note TEXT)"),
    "extra_schema_meta_key": _extra_meta,
    "schema_version_4": _version("4"),
    "schema_version_2": _version("2"),
    "schema_version_not_a_number": _version("three"),
    "truncated_to_half": _truncate_half,
    "garbage_bytes": _garbage,
}


@pytest.mark.parametrize("damage", list(FILE_DAMAGE), ids=list(FILE_DAMAGE))
def test_file_that_is_not_a_ledger_is_never_healthy(damage: str, copy: Path) -> None:
    FILE_DAMAGE[damage](copy)
    before = file_state(copy)
    # A truncated file may still open (its first pages are intact); it must
    # then be reported unhealthy. Every other damage here is refused outright.
    may_open = damage == "truncated_to_half"

    try:
        opened = Ledger(copy)
    except LedgerError:
        refused = True
    else:
        refused = False
        try:
            assert may_open, "a file that is not a ledger opened as one"
            assert opened.doctor()["healthy"] is False
        finally:
            opened.close()

    code, out, raw = run_cli("--db", str(copy), "doctor")
    if refused:
        assert code == 2, raw
        assert out == {"ok": False, "error": "StateConflict"}
    else:
        assert code in (1, 2), raw
        assert out.get("healthy") is not True
    code, out, raw = run_cli("--db", str(copy), "doctor", "--read-only")
    assert code in (1, 2), raw
    if code == 1:
        assert out["healthy"] is False
        if damage not in ("truncated_to_half", "garbage_bytes"):
            assert out["schema_ok"] is False
    if refused:
        # A refused doctor repairs nothing.
        assert file_state(copy)[:2] == before[:2]
        assert sorted(os.listdir(copy.parent)) == before[3]


def test_analyze_statistics_leave_a_ledger_healthy(copy: Path) -> None:
    """``ANALYZE`` adds SQLite's own tables under the reserved prefix: a
    ledger someone analysed is still a ledger."""
    with tampering(copy) as conn:
        conn.execute("ANALYZE")
        stats = "SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_stat1'"
        assert conn.execute(stats).fetchone() == (1,)
    assert doctor_of(copy)["healthy"] is True


def test_damaged_page_fails_quick_check(copy: Path) -> None:
    """Overwrite the root page of the events table with random bytes. The
    schema pages are intact, so the file still opens as a ledger; doctor's job
    is then to *report* the damage (quick_check failed, exit 1), not to give
    up with an error."""
    with contextlib.closing(sqlite3.connect(copy)) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        root = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'task_events'"
        ).fetchone()[0]
    assert pages > root
    with open(copy, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(random.Random(7).randbytes(page_size))

    with Ledger(copy) as lg:  # the schema still reads: it opens
        assert lg.stats()["task_count"] == len(NAMES)
        report = lg.doctor()
    assert report["healthy"] is False
    assert report["quick_check"] == "failed"
    code, out, raw = run_cli("--db", str(copy), "doctor")
    assert (code, out) == (1, report), raw
    code, out, raw = run_cli("--db", str(copy), "doctor", "--read-only")
    assert code == 1, raw
    assert out["healthy"] is False and out["quick_check"] == "failed"


def _system_checks(path: Path) -> tuple[list[Any], list[Any]]:
    """``quick_check`` and ``integrity_check`` of the system SQLite."""
    uri = f"file:{path}?immutable=1"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        return (
            conn.execute("PRAGMA quick_check").fetchall(),
            conn.execute("PRAGMA integrity_check").fetchall(),
        )


@pytest.mark.parametrize(
    "index", ["tasks_queue_idx", "tasks_tenant_queue_idx", "tasks_created_idx"]
)
def test_an_index_entry_that_disagrees_with_its_row_is_unhealthy(copy: Path, index: str) -> None:
    """One byte of one key inside an index changes (the id that breaks ties
    between equal creation times, so the index stays in order). SQLite's
    ``quick_check`` cannot see it; a lying queue index can hide a queued task
    from ``claim_next``, a lying creation order lists a task that does not
    exist, so doctor must."""
    with contextlib.closing(sqlite3.connect(copy)) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)
        ).fetchone()[0]
        (queued,) = conn.execute(
            f"SELECT id FROM tasks INDEXED BY {index} WHERE status = 'queued' "
            "AND tenant IS NOT NULL ORDER BY created_at DESC, id DESC LIMIT 1"
        ).fetchone()
    key = queued.encode()
    raw = bytearray(copy.read_bytes())
    page = slice((root - 1) * page_size, root * page_size)
    assert raw[page].count(key) == 1, "the key is stored once, in the index's root page"
    at = page.start + raw[page].index(key) + len(key) - 1
    raw[at] = ord("f") if raw[at] != ord("f") else ord("e")
    copy.write_bytes(bytes(raw))
    quick, integrity = _system_checks(copy)
    assert quick == [("ok",)] and integrity != [("ok",)], (
        "ground truth: only integrity_check sees it"
    )

    report = doctor_of(copy)
    assert report["healthy"] is False
    assert report["quick_check"] == "ok"
    assert report["state_inconsistency_count"] == 1
    code, out, _ = run_cli("--db", str(copy), "doctor", "--read-only")
    assert (code, out) == (1, report)


def test_empty_file_read_only_doctor_refuses_and_writes_nothing(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "ledger.db"
    path.touch(mode=0o600)
    code, out, _ = run_cli("--db", str(path), "doctor", "--read-only")
    assert code == 2 and out["ok"] is False
    assert path.stat().st_size == 0
    assert sorted(os.listdir(tmp_path)) == ["ledger.db"]


def test_doctor_refuses_an_empty_or_missing_file_and_leaves_it_as_it_is(tmp_path: Path) -> None:
    """The peer's doctor (a writable open) gives a 0-byte file a schema and
    calls it healthy, and makes a missing one: an operator's evidence
    overwritten, and a mistyped path in a nightly check green for ever.
    Ours refuses both (exit 2) and writes nothing."""
    os.chmod(tmp_path, 0o700)
    empty, theirs = tmp_path / "emptied.db", tmp_path / "peer.db"
    for path in (empty, theirs):
        path.touch(mode=0o600)
    assert tsg.Ledger(theirs).doctor()["healthy"] is True  # the peer's answer
    for path in (empty, tmp_path / "mistyped.db", tmp_path / "no" / "such" / "dir.db"):
        for argv in (["doctor"], ["doctor", "--format", "text"]):
            code, _, raw = run_cli("--db", str(path), *argv)
            assert code == 2, raw
    assert empty.stat().st_size == 0
    assert sorted(os.listdir(tmp_path)) == ["emptied.db", "peer.db"]


# --------------------------------------------------------------------------
# the CLI around doctor


def test_cli_exit_codes_and_no_ids_in_output(copy: Path) -> None:
    db = str(copy)
    code, out, raw = run_cli("--db", db, "doctor")
    assert code == 0 and out["healthy"] is True
    assert set(out) == REPORT_KEYS
    assert raw.strip() == json.dumps(out, sort_keys=True, separators=(",", ":"))
    code_text, _, text = run_cli("--db", db, "doctor", "--format", "text")
    assert code_text == 0

    # Unhealthy in several ways at once: still exit 1, still no id anywhere.
    with tampering(copy) as conn:
        _parent_cycle(conn)
        _orphan_event(conn)
        conn.execute("UPDATE tasks SET owner = 'w9' WHERE id = ?", (IDS["granted"],))
    code_bad, out_bad, raw_bad = run_cli("--db", db, "doctor")
    assert code_bad == 1 and out_bad["healthy"] is False
    _, _, text_bad = run_cli("--db", db, "doctor", "--format", "text")
    _, _, raw_ro = run_cli("--db", db, "doctor", "--read-only")

    every_output = raw + text + raw_bad + text_bad + raw_ro
    for task_id in [*IDS.values(), MISSING_ID]:
        for form in (task_id, task_id.upper(), task_id.replace("-", "")):
            assert form not in every_output
    for worker in ("w1", "w9", "acme"):
        assert worker not in every_output


def test_two_runs_on_unchanged_data_give_identical_output(copy: Path) -> None:
    db = str(copy)
    for args in (["doctor"], ["doctor", "--read-only"], ["doctor", "--format", "text"]):
        first = run_cli("--db", db, *args)
        second = run_cli("--db", db, *args)
        assert first == second
    with tampering(copy) as conn:
        conn.execute(
            "UPDATE tasks SET deadline_at = deadline_at + 1 WHERE id = ?", (IDS["running"],)
        )
    first = run_cli("--db", db, "doctor")
    assert first[0] == 1
    assert run_cli("--db", db, "doctor") == first
    assert run_cli("--db", db, "doctor", "--read-only") == first


def test_text_format_names_the_problem(copy: Path) -> None:
    code, _, text = run_cli("--db", str(copy), "doctor", "--format", "text")
    assert code == 0
    assert text.startswith("ledger: healthy")
    assert "12 tasks" in text and "35 events" in text
    assert "UNHEALTHY" not in text
    assert not text.lstrip().startswith("{")

    with tampering(copy) as conn:
        _parent_cycle(conn)
    code, _, text = run_cli("--db", str(copy), "doctor", "--format", "text")
    assert code == 1
    assert "UNHEALTHY" in text
    assert "parent cycle: 1" in text
    assert not text.lstrip().startswith("{")


def test_text_format_names_a_chain_break(copy: Path) -> None:
    with tampering(copy) as conn:
        conn.execute("UPDATE task_events SET code = 'started' WHERE code = 'claimed'")
    code, _, text = run_cli("--db", str(copy), "doctor", "--format", "text")
    assert code == 1
    assert "UNHEALTHY" in text and "event chain break" in text


def test_read_only_doctor_never_creates_a_missing_file(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    missing = tmp_path / "absent.db"
    code, out, raw = run_cli("--db", str(missing), "doctor", "--read-only")
    assert code == 2 and out["ok"] is False, raw
    assert os.listdir(tmp_path) == []
    with pytest.raises(LedgerError):
        Ledger(missing, read_only=True)
    assert os.listdir(tmp_path) == []


def test_read_only_doctor_never_touches_a_healthy_file(copy: Path) -> None:
    before = file_state(copy)
    mode = stat.S_IMODE(copy.stat().st_mode)
    for _ in range(2):
        code, out, _ = run_cli("--db", str(copy), "doctor", "--read-only")
        assert code == 0 and out["healthy"] is True and out["task_count"] == len(NAMES)
    assert file_state(copy) == before
    assert stat.S_IMODE(copy.stat().st_mode) == mode


def test_read_only_doctor_never_migrates_a_peer_v2_file(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "peer.db"
    clock = FrozenClock()
    peer = tsg.Ledger(path, clock=clock)  # a connection per call: nothing to close
    queued = peer.create_task()
    clock.advance(1.0)
    done = peer.create_task(parent_id=queued.id)
    peer.start_task(done.id)
    clock.advance(1.0)
    peer.close_task(done.id, "succeeded", code="worker_completed")
    peer.set_delivery(done.id, "delivered", code="transport_acknowledged")
    running = peer.create_task(timeout_seconds=30.0)
    peer.start_task(running.id)
    peer_report = peer.doctor()
    del peer
    assert peer_report["healthy"] is True and peer_report["schema_version"] == 2
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        version_before = dict(conn.execute("SELECT key, value FROM schema_meta"))
    assert version_before["schema_version"] == "2"
    before = file_state(path)

    code, out, raw = run_cli("--db", str(path), "doctor", "--read-only")
    assert code == 0, raw
    assert out["healthy"] is True
    assert out["task_count"] == 3
    assert out["task_status_counts"]["running"] == 1
    assert out["task_status_counts"]["succeeded"] == 1
    assert out["delivery_status_counts"]["delivered"] == 1

    assert file_state(path) == before
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        assert dict(conn.execute("SELECT key, value FROM schema_meta")) == version_before
    # The peer can still open its own file.
    assert tsg.Ledger(path, read_only=True).doctor()["healthy"] is True


PEER_DAMAGE = {
    # damage -> the count doctor must raise
    "event_code_off_registry": (
        "UPDATE task_events SET code = 'made_up_reason' WHERE code = 'started'",
        "event_inconsistency_count",
    ),
    "terminal_code_wrong_for_status": (
        "UPDATE tasks SET terminal_code = 'worker_failed' WHERE status = 'succeeded'",
        "state_inconsistency_count",
    ),
    "parent_row_deleted": (
        "DELETE FROM tasks WHERE id IN (SELECT parent_id FROM tasks)",
        "orphan_count",
    ),
    # A code taskwarden writes and the peer's registry refuses: v3's rules
    # alone would find the migrated copy sound.
    "event_code_only_taskwarden_writes": (
        "UPDATE task_events SET code = 'claimed' WHERE code = 'started'",
        "event_inconsistency_count",
    ),
    # Damage the peer's migration rules let through and only doctor's
    # checks find: the read-only open gates its private copy on them too.
    "terminal_row_updated_after_it_ended": (
        "UPDATE tasks SET updated_at = updated_at + 1 WHERE status = 'succeeded'",
        "timestamp_inconsistency_count",
    ),
    "version_below_its_floor": (
        "UPDATE tasks SET version = 0 WHERE status = 'succeeded'",
        "state_inconsistency_count",
    ),
    # Damage the migration cannot even carry over: doctor reports the
    # copy it could not migrate.
    "event_time_as_text": (
        "UPDATE task_events SET occurred_at = 'yesterday' WHERE code = 'started'",
        "doctor_error_count",
    ),
}


@pytest.mark.parametrize("damage", list(PEER_DAMAGE), ids=list(PEER_DAMAGE))
def test_a_damaged_peer_file_is_reported_unhealthy_and_left_alone(
    tmp_path: Path, damage: str
) -> None:
    """The peer reports such a file unhealthy (exit 1), and so does doctor:
    a writable open still refuses to migrate it, but doctor reads a private
    migrated copy, damage and all."""
    os.chmod(tmp_path, 0o700)
    path = tmp_path / "peer.db"
    peer = tsg.Ledger(path, clock=FrozenClock())
    parent = peer.create_task()
    peer.start_task(parent.id)
    peer.close_task(parent.id, "succeeded", code="worker_completed")
    peer.create_task(parent_id=parent.id)
    del peer
    statement, count = PEER_DAMAGE[damage]
    with tampering(path) as conn:
        conn.execute(statement)
    before = file_state(path)
    with pytest.raises(StateConflict):
        Ledger(path)
    for read_only in ([], ["--read-only"]):
        code, out, raw = run_cli("--db", str(path), "doctor", *read_only)
        assert code == 1, raw
        assert out["healthy"] is False and out["schema_version"] == 2
        assert out[count] >= 1, out
    # Any other answer would be one the file's own writable open refuses
    # to give: a preview must not decide what the apply never will.
    for argv in (
        ["reconcile", "--dry-run"],
        ["reconcile"],
        ["stats", "--read-only"],
        ["list", "--read-only"],
    ):
        code, out, raw = run_cli("--db", str(path), *argv)
        assert (code, out) == (2, {"ok": False, "error": "StateConflict"}), (argv, raw)
    with Ledger(path, read_only=True) as preview:
        with pytest.raises(StateConflict):
            preview.stats()
        assert preview.doctor()["healthy"] is False
    assert file_state(path) == before
    assert tsg.Ledger(path, read_only=True).doctor()["healthy"] is False


# --------------------------------------------------------------------------
# a concurrent writer never makes a healthy ledger look unhealthy

WRITERS = 3
DOCTOR_RUNS = 50


def _writer(index: int, path: str, ready: Any, stop: Any, results: Any) -> None:
    """Lifecycles, claims, budget trees and charges until told to stop."""
    try:
        me = f"writer-{index}"
        rounds = 0
        with Ledger(path, busy_timeout_ms=30_000) as lg:
            while True:
                parent = lg.create_task(llm_calls_budget=6, tenant=f"t{index}")
                lg.claim(parent.id, me)
                kids = [
                    lg.create_task(parent_id=parent.id, delivery_required=False, timeout_seconds=60)
                    for _ in range(2)
                ]
                for kid in kids:
                    lg.claim(kid.id, me)
                    lg.charge(kid.id, calls=2, tokens=3, worker=me)
                # The next charge overruns the parent: the child escalates.
                lg.charge(kids[0].id, calls=5, worker=me)
                lg.grant(kids[0].id, calls=1)
                lg.requeue(kids[0].id)
                lg.claim(kids[0].id, me)
                lg.release(kids[0].id, me)
                lg.cancel(kids[0].id)
                lg.set_delivery(kids[0].id, "not_applicable", code="internal_task")
                lg.close_task(kids[1].id, "succeeded", code="worker_completed", worker=me)
                lg.set_delivery(kids[1].id, "not_applicable", code="internal_task")
                lg.block(parent.id, worker=me)
                lg.requeue(parent.id)
                lg.claim(parent.id, me)
                lg.charge(parent.id, worker=me)
                lg.close_task(parent.id, "failed", code="worker_failed", worker=me)
                lg.set_delivery(parent.id, "failed", code="transport_failed")
                for _ in range(2):
                    lg.create_task(tenant=f"q{index}", timeout_seconds=30)
                for task in lg.claim_next(me, tenant=f"q{index}", limit=2):
                    lg.close_task(task.id, "timed_out", code="worker_lost", worker=me)
                rounds += 1
                if rounds == 1:
                    ready.put(index)
                if stop.is_set():
                    break
        results.put(("ok", index, rounds))
    except BaseException:
        results.put(("error", index, traceback.format_exc()))


def test_concurrent_writers_never_make_doctor_unhealthy(db_path: Path) -> None:
    with Ledger(db_path) as lg:
        lg.create_task()
    ready, results = SPAWN.Queue(), SPAWN.Queue()
    stop = SPAWN.Event()
    procs = [
        SPAWN.Process(target=_writer, args=(i, str(db_path), ready, stop, results))
        for i in range(WRITERS)
    ]
    for proc in procs:
        proc.start()
    reports: list[dict[str, Any]] = []
    outcomes: list[tuple[str, int, Any]] = []
    try:
        for _ in range(WRITERS):
            try:
                ready.get(timeout=60)
            except queue.Empty:
                while not results.empty():
                    outcomes.append(results.get())
                pytest.fail(f"writers did not start: {outcomes}")
        with Ledger(db_path, busy_timeout_ms=30_000) as lg:
            for _ in range(DOCTOR_RUNS):
                reports.append(lg.doctor())
        stop.set()
        deadline = time.monotonic() + 60
        while len(outcomes) < WRITERS and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                outcomes.append(results.get(timeout=1))
        for proc in procs:
            proc.join(30)
    finally:
        stop.set()
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        for q in (ready, results):
            q.close()
            q.join_thread()

    errors = [o for o in outcomes if o[0] != "ok"]
    assert not errors, errors
    assert len(outcomes) == WRITERS
    assert all(p.exitcode == 0 for p in procs)
    unhealthy = [r for r in reports if r["healthy"] is not True]
    assert not unhealthy, unhealthy[0]
    assert len(reports) == DOCTOR_RUNS
    # The writers really were writing while doctor ran.
    counts = [r["task_count"] for r in reports]
    assert counts == sorted(counts) and counts[-1] > counts[0]
    with Ledger(db_path) as lg:
        final = lg.doctor()
    assert final["healthy"] is True
    assert final["task_count"] >= counts[-1]


def test_status_counts_keep_the_peer_s_order(tmp_path: Path) -> None:
    """A program that prints doctor's counts sees the peer's statuses in the
    peer's order (the state machine's order, parked statuses among them),
    not an alphabetical one; stats() follows the same order."""
    peer = tsg.Ledger(tmp_path / "peer.db").doctor()
    with Ledger.in_memory() as mem:
        ours, stats = mem.doctor(), mem.stats()
    for key in ("task_status_counts", "delivery_status_counts"):
        assert [k for k in ours[key] if k in peer[key]] == list(peer[key])
    assert list(stats["by_status"]) == list(ours["task_status_counts"])
    assert list(stats["by_delivery"]) == list(ours["delivery_status_counts"])


@pytest.mark.parametrize(("name", "code"), [("running", "claimed"), ("queued", "requeued")])
def test_a_park_code_on_a_task_that_is_not_parked_is_detected(
    copy: Path, name: str, code: str
) -> None:
    with tampering(copy) as conn:
        conn.execute("UPDATE tasks SET park_code = ? WHERE id = ?", (code, IDS[name]))
    report = doctor_of(copy)
    assert report["healthy"] is False
    assert report["state_inconsistency_count"] >= 1, report
    with Ledger(copy) as lg, pytest.raises(StateConflict, match="failed validation"):
        lg.get_task(IDS[name])


def test_an_edited_start_time_of_a_task_without_a_timeout_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    clock = FrozenClock(1_000.0)
    with Ledger(path, clock=clock) as ledger:
        task = ledger.create_task()  # no timeout: no deadline to give it away
        clock.advance(5)
        ledger.claim(task.id, "w1")
        clock.advance(5)
        ledger.heartbeat(task.id, worker="w1")
    assert doctor_of(path)["healthy"] is True
    with tampering(path) as conn:
        conn.execute("UPDATE tasks SET started_at = 1002.0 WHERE id = ?", (task.id,))
    report = doctor_of(path)
    assert report["event_inconsistency_count"] == 1, report
    assert report["healthy"] is False


def test_a_parent_cycle_alone_makes_the_ledger_unhealthy(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path, clock=FrozenClock()) as ledger:  # one instant for both
        a, b = ledger.create_task(), ledger.create_task()
    with tampering(path) as conn:
        conn.execute("UPDATE tasks SET parent_id = ? WHERE id = ?", (b.id, a.id))
        conn.execute("UPDATE tasks SET parent_id = ? WHERE id = ?", (a.id, b.id))
    report = doctor_of(path)
    assert report["parent_cycle_count"] == 1
    others = {k: v for k, v in report.items() if k.endswith("_count") and k not in (
        "parent_cycle_count", "task_count", "event_count")}  # fmt: skip
    assert set(others.values()) == {0}, others  # nothing else sees it
    assert report["healthy"] is False
