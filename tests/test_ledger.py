"""The lifecycle API: idempotency, terminal states, delivery rules, time."""

from __future__ import annotations

import copy
import dataclasses
import gc
import math
import multiprocessing
import os
import pickle
import threading
import typing
import uuid
import weakref
from pathlib import Path
from typing import Any

import pytest

from taskwarden import (
    Charge,
    DeliveryStatus,
    InvalidInput,
    Ledger,
    StateConflict,
    Task,
    TaskNotFound,
    TaskStatus,
    payload_fingerprint,
)

from .conftest import FrozenClock, logical_dump

HASH = "a" * 64


def test_create_returns_a_queued_task_with_defaults(ledger: Ledger, clock: FrozenClock) -> None:
    task = ledger.create_task(timeout_seconds=30, payload_hash=HASH, tenant="acme")
    assert task.status is TaskStatus.QUEUED
    assert task.delivery_status is DeliveryStatus.PENDING
    assert task.created_at == task.updated_at == task.delivery_updated_at == clock.now
    assert (task.started_at, task.ended_at, task.deadline_at) == (None, None, None)
    assert (task.version, task.attempt_count, task.max_attempts) == (0, 0, 3)
    assert (task.llm_calls_budget, task.token_budget, task.cost_budget_micros) == (25, None, None)
    assert (task.owner, task.tenant) == (None, "acme")
    assert ledger.get_task(task.id) == task


def test_returned_tasks_and_charges_are_ordinary_frozen_instances(ledger: Ledger) -> None:
    """The core builds tasks without running ``Task.__init__``; nothing a
    caller can observe may differ from a task constructed in Python."""
    task = ledger.get_task(ledger.create_task(tenant="acme").id)
    rebuilt = Task(**{f.name: getattr(task, f.name) for f in dataclasses.fields(Task)})
    assert type(task) is Task
    assert task == rebuilt
    assert hash(task) == hash(rebuilt)
    assert repr(task) == repr(rebuilt)
    assert not hasattr(task, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.owner = "someone"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(task)) == task
    assert dataclasses.replace(task, owner="w2").owner == "w2"
    assert dataclasses.asdict(task)["status"] is TaskStatus.QUEUED
    # Charges are built the same way.
    ledger.claim(task.id, "w1")
    charge = ledger.charge(task.id, tokens=5, worker="w1")
    rebuilt_charge = Charge(**{f.name: getattr(charge, f.name) for f in dataclasses.fields(Charge)})
    assert type(charge) is Charge
    assert charge == rebuilt_charge
    assert hash(charge) == hash(rebuilt_charge)
    assert repr(charge) == repr(rebuilt_charge)
    with pytest.raises(dataclasses.FrozenInstanceError):
        charge.allowed = False  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(charge)) == charge
    assert ledger.budget(task.id) == dataclasses.replace(charge, allowed=True)


def test_recreate_with_same_fields_is_idempotent(ledger: Ledger, clock: FrozenClock) -> None:
    first = ledger.create_task(task_id="0A1B2C3D-4E5F-6071-8293-A4B5C6D7E8F9", timeout_seconds=5)
    assert first.id == "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
    ledger.start_task(first.id)
    clock.advance(10)
    again = ledger.create_task(task_id=first.id, timeout_seconds=5.0)
    assert again == ledger.get_task(first.id)
    assert again.status is TaskStatus.RUNNING


def test_a_clock_at_signed_zero_keeps_the_event_chain_whole(db_path: Path) -> None:
    """``-0.0`` is the instant ``0.0``: SQLite stores it unsigned, and the
    events are hashed over what is stored."""
    with Ledger(db_path, clock=lambda: -0.0) as ledger:
        task = ledger.create_task()
        ledger.start_task(task.id)
        assert math.copysign(1.0, ledger.get_task(task.id).created_at) == 1.0
        assert ledger.doctor()["healthy"] is True


def test_create_answers_with_the_stored_row(ledger: Ledger) -> None:
    """A timeout of ``-0.0`` is zero and stored as ``0.0``; the answer says so."""
    task = ledger.create_task(timeout_seconds=-0.0)
    assert repr(task) == repr(ledger.get_task(task.id))
    assert math.copysign(1.0, task.timeout_seconds) == 1.0


@pytest.mark.parametrize(
    "change",
    [
        {"timeout_seconds": 6},
        {"payload_hash": HASH},
        {"delivery_required": False},
        {"tenant": "other"},
        {"max_attempts": 7},
    ],
)
def test_recreate_with_different_fields_conflicts(ledger: Ledger, change: dict) -> None:
    task = ledger.create_task(timeout_seconds=5)
    with pytest.raises(StateConflict):
        ledger.create_task(task_id=task.id, **{"timeout_seconds": 5, **change})


def test_recreate_after_a_grant_is_still_a_retry(ledger: Ledger) -> None:
    """Limits are not part of a task's identity: ``grant`` raises them, so a
    retried create with the original limits returns the granted task."""
    task = ledger.create_task(llm_calls_budget=2, token_budget=100)
    granted = ledger.grant(task.id, calls=3, tokens=50)
    again = ledger.create_task(task_id=task.id, llm_calls_budget=2, token_budget=100)
    assert again == granted
    assert (again.llm_calls_budget, again.token_budget) == (5, 150)


def test_parent_must_exist(ledger: Ledger) -> None:
    with pytest.raises(TaskNotFound):
        ledger.create_task(parent_id="0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9")


def test_an_unknown_parent_filter_is_task_not_found(ledger: Ledger) -> None:
    """Like ``children_of``: a valid id that names no task is TaskNotFound."""
    parent = ledger.create_task()
    child = ledger.create_task(parent_id=parent.id)
    assert ledger.list_tasks(parent_id=parent.id) == [child]
    assert ledger.list_tasks(parent_id=child.id) == []
    with pytest.raises(TaskNotFound):
        ledger.list_tasks(parent_id="0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9")


def test_a_task_named_as_its_own_parent_gets_the_peer_errors(ledger: Ledger) -> None:
    """New: its parent does not exist yet. Existing: a different parent."""
    own = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
    with pytest.raises(TaskNotFound):
        ledger.create_task(task_id=own, parent_id=own)
    ledger.create_task(task_id=own)
    with pytest.raises(StateConflict):
        ledger.create_task(task_id=own, parent_id=own.upper())
    assert ledger.get_task(own).parent_id is None


def test_children_are_ordered_oldest_first(ledger: Ledger, clock: FrozenClock) -> None:
    parent = ledger.create_task()
    ids = []
    for _ in range(3):
        clock.advance(1)
        ids.append(ledger.create_task(parent_id=parent.id).id)
    assert [c.id for c in ledger.children_of(parent.id)] == ids
    assert ledger.children_of(ids[0]) == []


def test_start_sets_deadline_and_is_idempotent(ledger: Ledger, clock: FrozenClock) -> None:
    task = ledger.create_task(timeout_seconds=30)
    clock.advance(2)
    running = ledger.start_task(task.id)
    assert running.status is TaskStatus.RUNNING
    assert running.started_at == clock.now
    assert running.deadline_at == clock.now + 30
    assert (running.version, running.attempt_count) == (1, 1)
    clock.advance(5)
    assert ledger.start_task(task.id) == running


def test_heartbeat_needs_running_and_writes_no_event(ledger: Ledger, clock: FrozenClock) -> None:
    task = ledger.create_task()
    with pytest.raises(StateConflict):
        ledger.heartbeat(task.id)
    ledger.start_task(task.id)
    clock.advance(3)
    beat = ledger.heartbeat(task.id)
    assert beat.updated_at == clock.now
    assert beat.version == 2


def test_close_same_status_is_a_noop_and_ignores_the_code(
    ledger: Ledger, clock: FrozenClock
) -> None:
    task = ledger.create_task()
    ledger.start_task(task.id)
    closed = ledger.close_task(task.id, "succeeded", code="worker_completed")
    assert closed.ended_at == closed.updated_at == clock.now
    assert closed.terminal_code == "worker_completed"
    clock.advance(1)
    assert ledger.close_task(task.id, TaskStatus.SUCCEEDED, code="not a code") == closed


@pytest.mark.parametrize("first", ["succeeded", "failed", "timed_out", "cancelled"])
def test_a_different_terminal_status_conflicts(ledger: Ledger, first: str) -> None:
    task = ledger.create_task()
    ledger.close_task(task.id, first)
    for other in {"succeeded", "failed", "timed_out", "cancelled"} - {first}:
        with pytest.raises(StateConflict):
            ledger.close_task(task.id, other)
    with pytest.raises(StateConflict):
        ledger.start_task(task.id)


def test_close_refuses_non_terminal_status_and_wrong_code(ledger: Ledger) -> None:
    task = ledger.create_task()
    with pytest.raises(InvalidInput):
        ledger.close_task(task.id, "running")
    with pytest.raises(InvalidInput):
        ledger.close_task(task.id, "succeeded", code="worker_failed")
    with pytest.raises(InvalidInput):
        ledger.close_task(task.id, "succeeded", code="created")
    assert ledger.get_task(task.id).status is TaskStatus.QUEUED


def test_status_aliases_are_accepted(ledger: Ledger) -> None:
    task = ledger.create_task()
    closed = ledger.close_task(task.id, "completed")
    assert closed.status is TaskStatus.SUCCEEDED


def test_delivery_only_after_terminal(ledger: Ledger) -> None:
    task = ledger.create_task()
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, "delivered")
    ledger.close_task(task.id, "succeeded")
    done = ledger.set_delivery(task.id, "delivered", code="transport_acknowledged")
    assert done.delivery_status is DeliveryStatus.DELIVERED
    assert done.delivery_code == "transport_acknowledged"
    assert ledger.set_delivery(task.id, "delivered", code="bogus") == done
    with pytest.raises(StateConflict):
        ledger.set_delivery(task.id, "failed")


def test_delivery_kind_rules(ledger: Ledger) -> None:
    external = ledger.create_task()
    internal = ledger.create_task(delivery_required=False)
    for t in (external, internal):
        ledger.close_task(t.id, "failed")
    with pytest.raises(StateConflict):
        ledger.set_delivery(external.id, "not_applicable")
    for status in ("delivered", "failed"):
        with pytest.raises(StateConflict):
            ledger.set_delivery(internal.id, status)
    assert ledger.set_delivery(internal.id, "not_applicable").delivery_code is None
    with pytest.raises(InvalidInput):
        ledger.set_delivery(external.id, "pending")
    with pytest.raises(InvalidInput):
        ledger.set_delivery(external.id, "delivered", code="internal_task")


def test_delivery_does_not_move_updated_at(ledger: Ledger, clock: FrozenClock) -> None:
    task = ledger.create_task()
    closed = ledger.close_task(task.id, "succeeded")
    clock.advance(7)
    delivered = ledger.set_delivery(task.id, "failed", code="transport_failed")
    assert delivered.updated_at == closed.updated_at
    assert delivered.delivery_updated_at == clock.now
    assert delivered.version == closed.version + 1


def test_time_only_moves_forward(ledger: Ledger, clock: FrozenClock) -> None:
    task = ledger.create_task()
    ledger.start_task(task.id)
    clock.advance(-1)
    for call in (
        lambda: ledger.heartbeat(task.id),
        lambda: ledger.close_task(task.id, "succeeded"),
        lambda: ledger.create_task(parent_id=task.id),
    ):
        with pytest.raises(StateConflict):
            call()
    # A task without a parent may be older than existing ones (peer rule).
    assert ledger.create_task().created_at == clock.now
    clock.advance(1)
    assert ledger.close_task(task.id, "succeeded").ended_at == clock.now


def test_a_patched_time_time_given_as_the_clock_is_called(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen-time test (monkeypatch, freezegun) that passes
    ``clock=time.time`` hands over its own function: the ledger calls it,
    as the peer does, instead of reading the system clock itself."""
    import time

    import taskwarden._handle
    import taskwarden.ledger

    real, frozen = time.time, (lambda: 1_000_000.0)
    monkeypatch.setattr(time, "time", frozen)
    # freezegun also replaces every module attribute holding the real one.
    for module in (taskwarden._handle, taskwarden.ledger):
        for name, value in list(vars(module).items()):
            if value is real:
                monkeypatch.setattr(module, name, frozen)
    with Ledger(db_path, clock=time.time) as ledger:
        assert ledger.create_task().created_at == 1_000_000.0
    assert Ledger.in_memory(clock=time.time).create_task().created_at == 1_000_000.0


@pytest.mark.parametrize("imported", [False, True], ids=["plain", "time_machine"])
def test_the_system_clock_is_called_as_python_s_where_time_travel_is_loaded(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, imported: bool
) -> None:
    """time-machine moves time by patching `time.time` in place, so the
    function is still the one the ledger knows; a core reading the system
    clock itself ignored every travel. In a process that imported it, the
    core calls `time.time` as the peer does; elsewhere it reads the clock
    itself (no Python call per write)."""
    import sys
    import time
    import types

    import taskwarden.ledger

    if imported:
        monkeypatch.setitem(sys.modules, "time_machine", types.ModuleType("time_machine"))
    else:
        monkeypatch.delitem(sys.modules, "time_machine", raising=False)
    given: list[object] = []
    real = taskwarden.ledger._core.LedgerCore

    class Recording:
        def __new__(cls, path: str, **options: Any) -> Any:
            given.append(options["clock"])
            return real(path, **options)

        @staticmethod
        def in_memory(**options: Any) -> Any:
            given.append(options["clock"])
            return real.in_memory(**options)

    monkeypatch.setattr(taskwarden.ledger._core, "LedgerCore", Recording)
    with Ledger(db_path) as ledger:
        before = time.time()
        assert before - 5 < ledger.create_task().created_at <= time.time()
    Ledger.in_memory().close()
    assert given == [time.time if imported else None] * 2


@pytest.mark.parametrize(
    ("now", "id_millis"),
    [
        (1_800_000_000.25, 1_800_000_000_250),
        (-203_799_499.5, 0),  # before 1970: the id holds 0, the task its time
        (1e308, 2**48 - 1),  # past what an id can hold: the latest it can
    ],
)
def test_new_ids_carry_the_ledgers_clock_and_never_fail(
    db_path: Path, now: float, id_millis: int
) -> None:
    """A new id is a version 7 UUID stamped by the ledger's clock, so it
    agrees with the task's created_at; a time the UUID cannot hold is
    clamped rather than failing (a system clock before 1970 once made id
    generation panic). Ids made at one frozen time still sort in order.
    (A thread's ids never sort backwards, whatever its clocks do: each case
    runs in a thread of its own.)"""
    import uuid as uuid_module

    made: list[Task] = []

    def create() -> None:
        with Ledger(db_path, clock=FrozenClock(now)) as ledger:
            made.extend(ledger.create_task() for _ in range(50))

    worker = threading.Thread(target=create)
    worker.start()
    worker.join()
    assert len(made) == 50 and {t.created_at for t in made} == {now}
    ids = [uuid_module.UUID(t.id) for t in made]
    assert {i.version for i in ids} == {7}
    assert {i.int >> 80 for i in ids} == {id_millis}
    assert [str(i) for i in sorted(ids)] == [t.id for t in made]
    with Ledger(db_path) as ledger:
        assert ledger.doctor()["healthy"] is True


def test_unknown_task_is_not_found(ledger: Ledger) -> None:
    missing = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
    for call in (
        lambda: ledger.get_task(missing),
        lambda: ledger.children_of(missing),
        lambda: ledger.start_task(missing),
        lambda: ledger.heartbeat(missing),
        lambda: ledger.close_task(missing, "failed"),
        lambda: ledger.set_delivery(missing, "failed"),
    ):
        with pytest.raises(TaskNotFound):
            call()


@pytest.mark.parametrize("reentry", ["get_task", "close"])
def test_a_clock_that_calls_back_into_its_ledger_fails_instead_of_hanging(
    db_path, reentry: str
) -> None:
    """The clock runs inside a call that holds the ledger; calling the same
    ledger from it is refused (the outer call sees the clock's exception),
    never a wait on itself. Other ledgers stay usable from a clock."""
    other = Ledger.in_memory()
    seen: list[BaseException] = []
    state: dict = {}

    def clock() -> float:
        other.get_task(state["other"])  # another ledger: fine
        if state.pop("reenter", False):
            try:
                if reentry == "get_task":
                    state["ledger"].get_task(state["id"])
                else:
                    state["ledger"].close()
            except StateConflict as exc:
                seen.append(exc)
                raise
        return 1_800_000_000.0

    state["other"] = other.create_task().id
    ledger = state["ledger"] = Ledger(db_path, clock=clock)
    state["id"] = ledger.create_task().id
    state["reenter"] = True
    outcome: list[BaseException | Task] = []

    def call() -> None:
        try:
            outcome.append(ledger.start_task(state["id"]))
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "the re-entering clock deadlocked the ledger"
    assert len(seen) == 1
    assert outcome[0] is seen[0]  # the clock's own exception
    assert ledger.get_task(state["id"]).status is TaskStatus.QUEUED
    assert ledger.start_task(state["id"]).status is TaskStatus.RUNNING
    ledger.close()
    other.close()


def test_calls_after_close_conflict(db_path, clock: FrozenClock) -> None:
    ledger = Ledger(db_path, clock=clock)
    task = ledger.create_task()
    ledger.close()
    with pytest.raises(StateConflict):
        ledger.get_task(task.id)
    # Closed is closed for every call, bad arguments included, and closing
    # again is harmless.
    for call in (
        lambda: ledger.get_task("not an id"),
        lambda: ledger.claim_next("bad worker!"),
        lambda: ledger.charge(task.id, calls=-1),
        ledger.storage_info,
        ledger.doctor,
    ):
        with pytest.raises(StateConflict):
            call()
    ledger.close()
    assert sorted(p.name for p in db_path.parent.iterdir()) == ["ledger.db"]


def test_a_ledger_whose_clock_refers_back_to_its_owner_is_collected(db_path: Path) -> None:
    """An owner that gives the ledger its own bound method as the clock
    makes a cycle (owner -> ledger -> clock -> owner). Dropped unclosed, it
    is freed by the collector, and the file is closed like any dropped
    ledger: no sidecars left. The handle used to hide the clock from the
    collector, so such owners lived until the process ended."""

    class Worker:
        def __init__(self) -> None:
            self.ledger = Ledger(db_path, clock=self.now)

        def now(self) -> float:
            return 1_700_000_000.0

    refs = []
    for _ in range(3):
        worker = Worker()
        worker.ledger.create_task()
        refs.append(weakref.ref(worker))
        del worker
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]
    assert sorted(p.name for p in db_path.parent.iterdir()) == ["ledger.db"]


def test_task_is_frozen_and_to_dict_hides_the_hash(ledger: Ledger) -> None:
    task = ledger.create_task(payload_hash=HASH)
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.status = TaskStatus.FAILED  # type: ignore[misc]
    d = task.to_dict()
    assert d["has_payload_hash"] is True
    assert "payload_hash" not in d
    assert HASH not in repr(d)
    assert task.to_dict(include_payload_hash=True)["payload_hash"] == HASH
    assert isinstance(task, Task)
    # Every field, in the dataclass's order, the hash swapped in place;
    # statuses as plain text, for JSON.
    names = [f.name for f in dataclasses.fields(Task)]
    assert list(d) == [n if n != "payload_hash" else "has_payload_hash" for n in names]
    assert type(d["status"]) is str and type(d["delivery_status"]) is str


def test_payload_fingerprint() -> None:
    assert payload_fingerprint("abc") == payload_fingerprint(b"abc")
    assert payload_fingerprint(b"").startswith("e3b0c442")
    for bad in (bytearray(b"x"), 1, None):
        with pytest.raises(InvalidInput):
            payload_fingerprint(bad)  # type: ignore[arg-type]


def test_in_memory_ledger_works_and_memory_path_is_refused(clock: FrozenClock) -> None:
    with Ledger.in_memory(clock=clock) as mem:
        task = mem.create_task()
        assert mem.close_task(task.id, "cancelled").status is TaskStatus.CANCELLED
    with pytest.raises(InvalidInput):
        Ledger(":memory:")


def test_path_is_typed_as_optional_and_none_in_memory(tmp_path: Path) -> None:
    """An in-memory ledger has no file: its type must say so, or a type
    checker passes ``ledger.path.name`` that fails at run time."""
    assert typing.get_type_hints(Ledger)["path"] == Path | None
    with Ledger.in_memory() as mem:
        assert mem.path is None
    with Ledger(tmp_path / "private" / "t.db") as on_disk:
        assert on_disk.path == (tmp_path / "private" / "t.db").resolve()


COPIERS = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": lambda ledger: pickle.loads(pickle.dumps(ledger)),
}


@pytest.mark.parametrize("copier", sorted(COPIERS))
def test_a_copied_or_pickled_ledger_is_a_new_handle_on_the_same_file(
    db_path: Path, copier: str
) -> None:
    """As with task-state-guard, a ledger can be copied or pickled (handed to
    a spawned worker, say): the copy opens its own connection to the same
    file with the same arguments, so closing one leaves the other open."""
    original = Ledger(db_path, busy_timeout_ms=1234, durability="full")
    task = original.create_task()
    twin = COPIERS[copier](original)
    assert twin is not original and twin.path == original.path
    assert twin.storage_info()["busy_timeout_ms"] == 1234
    assert twin.storage_info()["durability"] == "full"
    twin.close()
    assert original.get_task(task.id).id == task.id
    again = COPIERS[copier](original)
    original.close()
    assert again.create_task().status is TaskStatus.QUEUED
    with pytest.raises(StateConflict, match="ledger is closed"):
        COPIERS[copier](original)
    again.close()


def test_a_pickled_ledger_opens_the_same_file_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path is resolved where the ledger was opened: the copy a
    worker unpickles elsewhere opens that file, not one of the same name."""
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    monkeypatch.chdir(folder)
    with Ledger("ledger.db") as original:
        task = original.create_task()
        shipped = pickle.dumps(original)
    monkeypatch.chdir(tmp_path)
    with pickle.loads(shipped) as copy_:
        assert copy_.path == folder / "ledger.db"
        assert copy_.get_task(task.id).id == task.id
    assert not (tmp_path / "ledger.db").exists()


@pytest.mark.parametrize("copier", sorted(COPIERS))
def test_an_in_memory_ledger_cannot_be_copied(copier: str) -> None:
    """Its memory is its own: a copy would share it, so closing the copy
    would close the original."""
    with Ledger.in_memory() as mem:
        with pytest.raises(TypeError, match="in-memory"):
            COPIERS[copier](mem)
        assert mem.create_task().status is TaskStatus.QUEUED


def _claim_in_worker(ledger: Ledger, task_id: str) -> str:
    with ledger:
        return str(ledger.claim(task_id, f"w{os.getpid()}").status)


# A module-level ledger, as task-state-guard programs keep one: a forked
# worker inherits it.
_FLEET_LEDGER: Ledger | None = None


def _claim_with_the_inherited_ledger(task_id: str) -> str:
    assert _FLEET_LEDGER is not None
    return str(_FLEET_LEDGER.claim(task_id, f"w{os.getpid()}").status)


@pytest.mark.parametrize("how", ["pickled_to_spawned", "inherited_by_forked"])
def test_a_ledger_handed_to_worker_processes_serves_them(db_path: Path, how: str) -> None:
    """A program written for task-state-guard gives its ledger to a process
    pool, pickled (spawn) or inherited (fork): each worker claims through a
    connection of its own, and every claim is in the file."""
    global _FLEET_LEDGER
    with Ledger(db_path) as ledger:
        ids = [ledger.create_task().id for _ in range(4)]
        if how == "pickled_to_spawned":
            with multiprocessing.get_context("spawn").Pool(2) as pool:
                statuses = pool.starmap(_claim_in_worker, [(ledger, i) for i in ids])
        else:
            _FLEET_LEDGER = ledger
            try:
                with multiprocessing.get_context("fork").Pool(2) as pool:
                    statuses = pool.map(_claim_with_the_inherited_ledger, ids)
            finally:
                _FLEET_LEDGER = None
        assert statuses == ["running"] * 4
        assert {ledger.get_task(i).status for i in ids} == {TaskStatus.RUNNING}
        assert ledger.doctor()["healthy"] is True


def test_reason_code_registry_is_exported() -> None:
    from taskwarden import REASON_CODES

    peer = {
        "caller_cancelled", "completed", "created", "deadline_exceeded",
        "delivery_grace_expired", "internal_task", "restart_stale", "started",
        "transport_acknowledged", "transport_failed", "worker_completed", "worker_failed",
    }  # fmt: skip
    added = {
        "claimed", "released", "requeued", "needs_input", "escalated_manually",
        "budget_exhausted", "attempts_exhausted", "worker_lost", "budget_granted",
    }  # fmt: skip
    assert peer | added == REASON_CODES


class _TaggedLedger(Ledger):
    """A program's own kind of ledger, as a peer user might write one."""

    def __init__(self, path: Path, tag: str) -> None:
        super().__init__(path)
        self.tag = tag

    def hello(self) -> str:
        return f"{self.tag} at {self.path.name if self.path else '-'}"


@pytest.mark.parametrize("copier", sorted(COPIERS))
def test_a_copied_subclass_keeps_its_class_and_attributes(db_path: Path, copier: str) -> None:
    """As with task-state-guard, a subclass comes back as itself, with its
    own attributes, and on a handle of its own."""
    with _TaggedLedger(db_path, "pool-a") as original:
        twin = COPIERS[copier](original)
        try:
            assert type(twin) is _TaggedLedger
            assert twin.hello() == "pool-a at ledger.db"
            assert twin._core is not original._core
        finally:
            twin.close()


def test_an_open_that_may_not_create_refuses_an_empty_file(db_path: Path) -> None:
    """create=False refuses a path with no ledger, an existing empty file
    included (it once got a whole schema), and leaves it as it was."""
    db_path.touch(mode=0o644)
    with pytest.raises(StateConflict, match="holds no ledger yet"):
        Ledger(db_path, create=False)
    assert db_path.stat().st_size == 0 and db_path.stat().st_mode & 0o777 == 0o644
    with Ledger(db_path) as ledger:  # a creating open makes it a ledger
        assert ledger.create_task().status == TaskStatus.QUEUED


def test_children_are_ordered_by_creation_time_before_id(
    ledger: Ledger, clock: FrozenClock
) -> None:
    """SPEC 2.2: children_of orders by (created_at, id). Caller-given ids
    need not sort in creation order."""
    parent = ledger.create_task()
    ids = [str(uuid.UUID(int=n)) for n in (5, 2, 9, 1)]
    for i, child in enumerate(ids):
        if i != 2:
            clock.advance(1)  # the 3rd and 2nd children share an instant
        ledger.create_task(task_id=child, parent_id=parent.id)
    expected = sorted(ids, key=lambda c: (ledger.get_task(c).created_at, c))
    assert [c.id for c in ledger.children_of(parent.id)] == expected
    assert expected != sorted(ids)  # creation order is not id order here
    assert [t.id for t in ledger.list_tasks(parent_id=parent.id)] == expected


def test_nothing_is_dated_before_a_tasks_delivery(ledger: Ledger, clock: FrozenClock) -> None:
    task = ledger.create_task(delivery_required=True)
    ledger.close_task(task.id, "succeeded")
    clock.advance(10)
    ledger.set_delivery(task.id, "delivered")
    clock.advance(-5)  # after the task ended, before its delivery
    for call in (
        lambda: ledger.grant(task.id, calls=1),
        lambda: ledger.create_task(parent_id=task.id),
    ):
        with pytest.raises(StateConflict, match="clock moved backwards"):
            call()
    assert ledger.children_of(task.id) == []
    clock.advance(5)
    assert ledger.grant(task.id, calls=1).llm_calls_budget == 26  # the default 25, plus 1


def test_a_grant_never_dates_before_the_tasks_last_change(db_path, clock: FrozenClock) -> None:
    with Ledger(db_path, clock=clock) as ledger:
        task = ledger.create_task(llm_calls_budget=1)
        ledger.start_task(task.id)
        clock.advance(-1)
    before = logical_dump(db_path)
    with (
        Ledger(db_path, clock=clock) as ledger,
        pytest.raises(StateConflict, match="clock moved backwards"),
    ):
        ledger.grant(task.id, calls=5)
    assert logical_dump(db_path) == before  # nothing written
    clock.advance(1)
    with Ledger(db_path, clock=clock) as ledger:
        granted = ledger.grant(task.id, calls=5)
        assert granted.llm_calls_budget == 6
        assert [e.at for e in ledger.events(task.id)][-1] == clock.now


def test_list_pages_walk_every_task_once_in_creation_then_id_order(
    ledger: Ledger, clock: FrozenClock
) -> None:
    """`after=` is a keyset cursor on (created_at, id): walking pages of any
    size visits every matching task exactly once, oldest first, ties by id,
    whichever index the filter reads (none, the queue's, a tenant's queue)."""
    ids = [str(uuid.UUID(int=n)) for n in (9, 3, 7, 1, 8, 2, 6)]
    created = {}
    for i, task_id in enumerate(ids):
        if i % 3 == 0:
            clock.advance(1.0)  # groups of tasks share a creation time
        created[task_id] = clock.now
        ledger.create_task(task_id=task_id, tenant="acme" if i % 2 else None)
    clock.advance(1.0)
    ledger.claim(ids[2], "w")  # one task leaves the queue
    expected_all = sorted(ids, key=lambda t: (created[t], t))
    for filters, expected in (
        ({}, expected_all),
        ({"status": "queued"}, [t for t in expected_all if t != ids[2]]),
        (
            {"status": "queued", "tenant": "acme"},
            [t for t in expected_all if t != ids[2] and ids.index(t) % 2],
        ),
    ):
        for limit in (1, 2, 3, len(ids) + 1):
            walked: list[str] = []
            after = None
            for _ in range(len(ids) + 2):
                page = ledger.list_tasks(limit=limit, after=after, **filters)
                assert len(page) <= limit
                walked += [t.id for t in page]
                if len(page) < limit:
                    break
                after = page[-1].id
            assert walked == expected, (filters, limit)
