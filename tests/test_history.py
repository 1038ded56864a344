"""A task's history (``Ledger.events``, CLI ``events``): every change the
ledger made, oldest first, returned only once its hash chain and its path
through the state machines verify against the task."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest
import task_state_guard as tsg

from taskwarden import Event, Ledger, StateConflict, TaskNotFound
from taskwarden.errors import InvalidInput

from .conftest import OF_TASK, FrozenClock, run_cli
from .test_doctor import EVENT_COLS, chain_hash

T0 = 1_800_000_000.0


def _moves(events: list[Event]) -> list[tuple[str, str | None, str, str | None, str | None]]:
    return [(e.kind, e.from_state, e.to_state, e.code, e.worker) for e in events]


def test_the_history_tells_every_change_in_order(ledger: Ledger, clock: FrozenClock) -> None:
    task = ledger.create_task(llm_calls_budget=1)
    clock.advance(1)
    ledger.claim(task.id, "w1")
    clock.advance(1)
    ledger.charge(task.id, worker="w1")
    clock.advance(1)
    assert ledger.charge(task.id, worker="w1").escalated
    clock.advance(1)
    ledger.grant(task.id, calls=2, tokens=5)
    clock.advance(1)
    ledger.requeue(task.id)
    clock.advance(1)
    ledger.claim(task.id, "w2")
    clock.advance(1)
    ledger.close_task(task.id, "succeeded", code="worker_completed", worker="w2")
    clock.advance(1)
    ledger.set_delivery(task.id, "delivered", code="transport_acknowledged")

    history = ledger.events(task.id)
    assert _moves(history) == [
        ("created", None, "queued", "created", None),
        ("task_transition", "queued", "running", "claimed", "w1"),
        ("task_transition", "running", "escalated", "budget_exhausted", "w1"),
        ("budget_granted", None, "escalated", "budget_granted", None),
        ("task_transition", "escalated", "queued", "requeued", None),
        ("task_transition", "queued", "running", "claimed", "w2"),
        ("task_transition", "running", "succeeded", "worker_completed", "w2"),
        ("delivery_transition", "pending", "delivered", "transport_acknowledged", None),
    ]
    assert [e.at - T0 for e in history] == [0, 1, 3, 4, 5, 6, 7, 8]
    grant = history[3]
    # What it added: the task's tokens are unlimited, so none to them.
    assert (grant.granted_calls, grant.granted_tokens, grant.granted_cost_micros) == (2, 0, 0)
    assert all(e.granted_calls is None for e in history if e is not grant)
    assert history[0].to_dict() == {
        "kind": "created",
        "from_state": None,
        "to_state": "queued",
        "at": T0,
        "code": "created",
        "worker": None,
        "granted_calls": None,
        "granted_tokens": None,
        "granted_cost_micros": None,
    }


def test_reconcile_s_set_based_writes_make_a_history_that_verifies(
    ledger: Ledger, clock: FrozenClock
) -> None:
    stale, delivered_late = ledger.create_task(), ledger.create_task()
    ledger.claim(stale.id, "w1")
    ledger.close_task(delivered_late.id, "succeeded")
    clock.advance(3600)
    ledger.reconcile(active_grace_seconds=60, delivery_grace_seconds=60)
    assert _moves(ledger.events(stale.id))[-1] == (
        "task_transition",
        "running",
        "timed_out",
        "restart_stale",
        None,
    )
    assert _moves(ledger.events(delivered_late.id))[-1] == (
        "delivery_transition",
        "pending",
        "failed",
        "delivery_grace_expired",
        None,
    )


def test_an_unknown_or_malformed_id(ledger: Ledger) -> None:
    with pytest.raises(TaskNotFound):
        ledger.events("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9")
    with pytest.raises(InvalidInput):
        ledger.events("not-an-id")


# Each edit leaves the file a valid SQLite file; ``?`` is the task's id.
EDITS = {
    "code_rewritten": "UPDATE task_events SET code = 'worker_failed' "
    f"WHERE {OF_TASK} AND code = 'worker_completed'",
    "worker_turned_into_free_text": "UPDATE task_events SET worker = 'SECRET PROMPT TEXT' "
    f"WHERE {OF_TASK} AND worker IS NOT NULL",
    "last_event_deleted": "DELETE FROM task_events WHERE sequence = "
    f"(SELECT max(sequence) FROM task_events WHERE {OF_TASK})",
    "times_rewritten": f"UPDATE task_events SET occurred_at = -occurred_at WHERE {OF_TASK}",
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edited_history_is_refused_never_returned(
    db_path: Path, clock: FrozenClock, edit: str
) -> None:
    """Whatever text an edit left is never handed out: the whole history is
    refused with a fixed reason, and doctor counts the damage."""
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task()
        ledger.claim(task.id, "w1")
        ledger.close_task(task.id, "succeeded", code="worker_completed", worker="w1")
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        assert conn.execute(EDITS[edit], (task.id,)).rowcount >= 1
    with Ledger(db_path, clock=clock) as ledger:
        with pytest.raises(StateConflict, match="failed verification") as refused:
            ledger.events(task.id)
        assert task.id not in str(refused.value)
        assert ledger.doctor()["healthy"] is False
    for form in ([], ["--format", "text"]):
        code, _, out = run_cli("--db", str(db_path), "events", task.id, *form)
        assert code == 2 and "SECRET" not in out and "worker_failed" not in out


def test_the_cli_shows_a_history_and_reads_a_peer_file_without_migrating(
    tmp_path: Path,
) -> None:
    peer_file = tmp_path / "peer.db"
    peer = tsg.Ledger(peer_file)
    task = peer.create_task()
    peer.start_task(task.id)
    before = peer_file.read_bytes()
    code, out, _ = run_cli("--db", str(peer_file), "events", task.id)
    assert code == 0 and out["ok"] is True
    assert [(e["kind"], e["to_state"], e["code"]) for e in out["events"]] == [
        ("created", "queued", "created"),
        ("task_transition", "running", "started"),
    ]
    assert peer_file.read_bytes() == before  # read from a private copy
    code, _, text = run_cli("--db", str(peer_file), "events", task.id, "--format", "text")
    assert code == 0 and text.startswith("events: 2\nAT ")
    with Ledger(peer_file, read_only=True) as reader:
        assert [e.code for e in reader.events(task.id)] == ["created", "started"]


def test_free_text_in_a_rehashed_chain_is_refused_too(db_path: Path, clock: FrozenClock) -> None:
    """Someone who rewrites a worker name to free text and recomputes every
    hash (the chain has no key) still gets no history back: each worker is
    held to the name rule as it is read."""
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task()
        ledger.claim(task.id, "w1")
        ledger.close_task(task.id, "succeeded", code="worker_completed", worker="w1")
    with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
        conn.execute(
            f"UPDATE task_events SET worker = 'SECRET PROMPT TEXT' WHERE {OF_TASK}", (task.id,)
        )
        prev = bytes(32)
        for row in conn.execute(
            f"SELECT {EVENT_COLS}, sequence FROM task_events WHERE {OF_TASK} ORDER BY sequence",
            (task.id,),
        ).fetchall():
            prev = chain_hash(prev, row)
            rehash = "UPDATE task_events SET event_hash = ? WHERE sequence = ?"
            conn.execute(rehash, (prev, row[-1]))
        conn.execute("UPDATE tasks SET event_head = ? WHERE id = ?", (prev, task.id))
    with Ledger(db_path, clock=clock) as ledger:
        with pytest.raises(StateConflict, match="failed verification"):
            ledger.events(task.id)
        assert ledger.doctor()["healthy"] is False
