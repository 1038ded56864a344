"""A worker that lost its task hears ``ClaimLost``, and nothing else does.

A fenced write (``worker=`` or ``attempt=`` given, or a ``release``) whose
claim is over gets ``ClaimLost``, a ``StateConflict`` that is never
``LedgerBusy``: the worker can stop working on the task without mistaking
a busy ledger for a lost claim. The delivery outcome is fenced too, and the
README's agent loop, run as written, survives a lost claim.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from taskwarden import ClaimLost, InvalidInput, Ledger, LedgerBusy, StateConflict

from .conftest import FrozenClock, logical_dump, run_cli

README = Path(__file__).resolve().parents[1] / "README.md"


def test_claim_lost_is_a_state_conflict_and_never_busy() -> None:
    assert issubclass(ClaimLost, StateConflict)
    assert not issubclass(ClaimLost, LedgerBusy)
    assert not issubclass(LedgerBusy, ClaimLost)


def _timed_out_under_a(ledger: Ledger, clock: FrozenClock) -> str:
    """A task that worker A claimed and that reconcile timed out."""
    task = ledger.create_task(llm_calls_budget=5)
    ledger.claim(task.id, "A")
    clock.advance(3600)
    assert (
        ledger.reconcile(active_grace_seconds=60, delivery_grace_seconds=86_400)["tasks_timed_out"]
        == 1
    )
    return task.id


def test_a_worker_whose_task_reconcile_timed_out_hears_claim_lost(
    db_path: Path, clock: FrozenClock
) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        task_id = _timed_out_under_a(ledger, clock)
    before = logical_dump(db_path)
    with Ledger(db_path, clock=clock) as ledger:
        for who in ({"worker": "A"}, {"worker": "A", "attempt": 1}, {"attempt": 1}):
            with pytest.raises(ClaimLost):
                ledger.heartbeat(task_id, **who)
            with pytest.raises(ClaimLost):
                ledger.close_task(task_id, "succeeded", **who)
            with pytest.raises(ClaimLost):
                ledger.transition(task_id, "running", "failed", **who)
            with pytest.raises(ClaimLost):
                ledger.block(task_id, **who)
            with pytest.raises(ClaimLost):
                ledger.escalate(task_id, **who)
            assert ledger.charge(task_id, **who).allowed is False
        with pytest.raises(ClaimLost):
            ledger.release(task_id, "A")
    assert logical_dump(db_path) == before


def test_unfenced_refusals_stay_plain_state_conflicts(ledger: Ledger) -> None:
    """Without a claim to lose, a refusal says only that the state does not
    allow the call."""
    task = ledger.create_task()
    refusals = (
        lambda: ledger.heartbeat(task.id),
        lambda: ledger.transition(task.id, "running", "failed"),
        lambda: ledger.block(task.id),
        lambda: ledger.set_delivery(task.id, "delivered"),
    )
    for call in refusals:
        with pytest.raises(StateConflict) as refused:
            call()
        assert type(refused.value) is StateConflict
    ledger.close_task(task.id, "cancelled")
    with pytest.raises(StateConflict) as refused:
        ledger.close_task(task.id, "succeeded")
    assert type(refused.value) is StateConflict


def test_a_claim_made_through_transition_is_refused_as_a_conflict(ledger: Ledger) -> None:
    """``queued -> running`` with a worker makes a claim rather than writing
    for one: a task another worker took first is a plain conflict."""
    task = ledger.create_task()
    ledger.claim(task.id, "A")
    with pytest.raises(StateConflict) as refused:
        ledger.transition(task.id, "queued", "running", worker="B")
    assert type(refused.value) is StateConflict


def test_an_owners_own_mistake_is_not_a_lost_claim(ledger: Ledger) -> None:
    """The owner still holds the running claim: delivering before closing
    is a conflict, not a reason to drop the task."""
    task = ledger.create_task()
    ledger.claim(task.id, "A")
    with pytest.raises(StateConflict) as refused:
        ledger.set_delivery(task.id, "delivered", worker="A", attempt=1)
    assert type(refused.value) is StateConflict


def test_a_run_started_without_a_claim_is_fenced_by_its_attempt_alone(ledger: Ledger) -> None:
    """``start_task`` sets no owner: SPEC 2.2 refuses a fenced write only for
    another owner or another attempt, so the current attempt is accepted and
    a worker name (which no claim gave) is not."""
    task = ledger.create_task(llm_calls_budget=5)
    ledger.start_task(task.id)
    assert ledger.heartbeat(task.id, attempt=1).status == "running"
    assert ledger.charge(task.id, attempt=1).allowed
    for who in ({"attempt": 2}, {"worker": "A"}, {"worker": "A", "attempt": 1}):
        with pytest.raises(ClaimLost):
            ledger.heartbeat(task.id, **who)
        assert ledger.charge(task.id, **who).allowed is False
    done = ledger.close_task(task.id, "succeeded", attempt=1)
    assert (done.status, done.owner, done.llm_calls_used) == ("succeeded", None, 1)
    # The run goes on naming itself after it ended: its retry, its delivery.
    assert ledger.close_task(task.id, "succeeded", attempt=1) == done
    assert ledger.set_delivery(task.id, "delivered", attempt=1).delivery_status == "delivered"
    with pytest.raises(ClaimLost):
        ledger.close_task(task.id, "succeeded", attempt=2)
    # Parked, it is still that run's to close.
    parked = ledger.create_task()
    ledger.start_task(parked.id)
    ledger.block(parked.id, attempt=1)
    assert ledger.close_task(parked.id, "cancelled", attempt=1).status == "cancelled"


def test_a_task_given_back_to_the_queue_is_held_by_no_run(ledger: Ledger) -> None:
    """Back in the queue, the attempt count stays until the next run: a fence
    by that attempt must not close a task nobody runs."""
    task = ledger.create_task()
    ledger.start_task(task.id)
    ledger.transition(task.id, "running", "queued")
    with pytest.raises(ClaimLost):
        ledger.close_task(task.id, "cancelled", attempt=1)
    assert ledger.get_task(task.id).status == "queued"


def test_a_move_the_owner_gets_wrong_is_not_a_lost_claim(ledger: Ledger) -> None:
    """The owner still runs the task: a compare-and-set it got wrong is a
    conflict, and the README's loop, which moves on at ClaimLost, must not
    drop a task it owns."""
    task = ledger.create_task()
    ledger.claim(task.id, "A")
    for expected, to in (("blocked", "cancelled"), ("running", "running")):
        with pytest.raises(StateConflict) as refused:
            ledger.transition(task.id, expected, to, worker="A", attempt=1)
        assert type(refused.value) is StateConflict
    assert ledger.heartbeat(task.id, worker="A", attempt=1).owner == "A"


def test_a_claim_through_transition_with_a_stale_attempt_is_a_conflict(ledger: Ledger) -> None:
    task = ledger.create_task()
    ledger.claim(task.id, "A")
    ledger.block(task.id)
    ledger.requeue(task.id)
    for who in ({"worker": "B", "attempt": 0}, {"attempt": 0}):
        with pytest.raises(StateConflict) as refused:
            ledger.transition(task.id, "queued", "running", **who)
        assert type(refused.value) is StateConflict


def test_a_worker_that_lost_its_task_cannot_decide_its_delivery(
    db_path: Path, clock: FrozenClock
) -> None:
    """A stalls; its task is given back and B runs it to the end. A's late
    delivery outcome must not become B's for good (terminal deliveries are
    never rewritten)."""
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task()
        ledger.claim(task.id, "A")
        ledger.transition(task.id, "running", "queued")
        ledger.claim(task.id, "B")
        ledger.close_task(task.id, "succeeded", worker="B", attempt=2)
    before = logical_dump(db_path)
    with Ledger(db_path, clock=clock) as ledger:
        for who in ({"worker": "A"}, {"worker": "A", "attempt": 1}, {"attempt": 1}):
            with pytest.raises(ClaimLost):
                ledger.set_delivery(task.id, "failed", code="transport_failed", **who)
    assert logical_dump(db_path) == before
    with Ledger(db_path, clock=clock) as ledger:
        done = ledger.set_delivery(
            task.id, "delivered", code="transport_acknowledged", worker="B", attempt=2
        )
        assert done.delivery_status == "delivered"
        last = ledger.events(task.id)[-1]
        assert (last.kind, last.to_state, last.worker) == ("delivery_transition", "delivered", "B")
        # The same outcome again is the owner's no-op; the peer's unfenced
        # call is unchanged.
        assert ledger.set_delivery(task.id, "delivered", worker="B") == done
        assert ledger.set_delivery(task.id, "delivered") == done
        assert ledger.doctor()["healthy"] is True


def test_the_cli_names_a_lost_claim(db_path: Path) -> None:
    # The CLI reads the wall clock: the ledger's times must be behind it.
    with Ledger(db_path, clock=FrozenClock(1_700_000_000.0)) as ledger:
        task = ledger.create_task()
        ledger.claim(task.id, "A")
        ledger.transition(task.id, "running", "queued")
        ledger.claim(task.id, "B")
        ledger.close_task(task.id, "succeeded", worker="B")
    before = logical_dump(db_path)
    for argv in (
        ("heartbeat", task.id, "--worker", "A"),
        ("close", task.id, "--status", "failed", "--worker", "A"),
        ("delivery", task.id, "--status", "failed", "--worker", "A", "--attempt", "1"),
    ):
        code, out, raw = run_cli("--db", str(db_path), *argv)
        assert (code, out) == (2, {"error": "ClaimLost", "ok": False}), raw
    assert logical_dump(db_path) == before
    code, out, raw = run_cli(
        "--db", str(db_path), "delivery", task.id, "--status", "delivered",
        "--worker", "B", "--attempt", "2",
    )  # fmt: skip
    assert code == 0 and out["task"]["delivery_status"] == "delivered", raw


LOOP = next(
    block
    for block in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    if "claim_next(worker" in block
)
LLM_CALL = "# ... make the LLM call, act on the result ..."

# Stands in for the LLM call: the first time, an operator gives the task
# back and another worker claims it, as after a stall.
STALL = """
import taskwarden
stolen = []
def stall(ledger, task):
    if not stolen:
        ledger.transition(task.id, "running", "queued")
        ledger.claim(task.id, "someone-else")
        stolen.append(task.id)
"""

REPORT = """
with Ledger("./state/tasks.db") as ledger:
    lost = ledger.get_task(stolen[0])
    print("stolen", lost.status, lost.owner)
    print("done", len(ledger.list_tasks(status="succeeded")))
"""


def test_the_readmes_agent_loop_survives_a_lost_claim(tmp_path: Path) -> None:
    """Run as written, with one stall: the loop moves on to the other tasks,
    never closes or charges the task it lost, and ends without an error."""
    assert LLM_CALL in LOOP
    hooked = LOOP.replace(LLM_CALL, "stall(ledger, task)")
    tmp_path.chmod(0o700)
    (tmp_path / "state").mkdir(mode=0o700)
    done = subprocess.run(
        [sys.executable, "-c", STALL + hooked + REPORT],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["stolen running someone-else", "done 3"]


def test_a_lost_claim_closing_with_a_bad_code_is_bad_input_first(ledger: Ledger) -> None:
    task = ledger.create_task()
    ledger.claim(task.id, "w1")
    ledger.release(task.id, "w1")
    ledger.claim(task.id, "w2")  # w1's claim is over
    before = ledger.get_task(task.id)
    for code in ("Not-A-Code", "no_such_code", "worker_failed"):  # format, registry, status
        with pytest.raises(InvalidInput):
            ledger.close_task(task.id, "succeeded", code=code, worker="w1")
    with pytest.raises(ClaimLost):
        ledger.close_task(task.id, "succeeded", code="worker_completed", worker="w1")
    assert ledger.get_task(task.id) == before
