"""Value types: statuses and the immutable ``Task`` snapshot."""

from __future__ import annotations

from dataclasses import dataclass, fields, make_dataclass
from enum import StrEnum
from typing import Any

from . import _core

__all__ = ["Charge", "DeliveryStatus", "Event", "ReconcilePolicy", "Task", "TaskStatus"]


class TaskStatus(StrEnum):
    """A task's lifecycle status (SPEC §3)."""

    QUEUED = "queued"
    RUNNING = "running"
    BLOCKED = "blocked"
    ESCALATED = "escalated"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """True for succeeded, failed, timed_out and cancelled."""
        return self in _TERMINAL


# The core's table, as it judges statuses.
_TERMINAL = frozenset(TaskStatus(s) for s in _core.TERMINAL_STATUSES)


class DeliveryStatus(StrEnum):
    """Whether a task's result reached its recipient."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
    NOT_APPLICABLE = "not_applicable"


@dataclass(frozen=True, slots=True)
class Task:
    """One task as stored, at the moment it was read.

    The first sixteen fields are task-state-guard 0.1.0's, in its order; the
    rest are taskwarden's: tenant, owner, park code, attempts and budget.
    ``None`` budgets are unlimited. ``park_code`` says why a blocked or
    escalated task waits.
    """

    id: str
    parent_id: str | None
    status: TaskStatus
    delivery_status: DeliveryStatus
    delivery_required: bool
    payload_hash: str | None
    timeout_seconds: float | None
    created_at: float
    started_at: float | None
    updated_at: float
    ended_at: float | None
    deadline_at: float | None
    delivery_updated_at: float
    terminal_code: str | None
    delivery_code: str | None
    version: int
    tenant: str | None = None
    owner: str | None = None
    park_code: str | None = None
    attempt_count: int = 0
    max_attempts: int = 3
    llm_calls_used: int = 0
    llm_calls_budget: int | None = None
    tokens_used: int = 0
    token_budget: int | None = None
    cost_used_micros: int = 0
    cost_budget_micros: int | None = None

    def to_dict(self, *, include_payload_hash: bool = False) -> dict[str, Any]:
        """The task as plain JSON-ready values.

        The payload hash is left out (``has_payload_hash`` says whether there
        is one) unless ``include_payload_hash=True``.
        """
        # Every field in order, so a new one reaches the CLI's JSON too;
        # only the hash itself is swapped for whether there is one.
        out: dict[str, Any] = {}
        for name, value in _plain(self).items():
            if name == "payload_hash":
                out["has_payload_hash"] = value is not None
            else:
                out[name] = value
        if include_payload_hash:
            out["payload_hash"] = self.payload_hash
        return out


@dataclass(frozen=True, slots=True)
class Charge:
    """The budget guard's answer (SPEC §4).

    ``allowed`` says whether the charge was added (for ``budget()``: whether a
    one-call charge would be). ``escalated`` is true when this charge ran out
    of budget and moved the task to ``escalated``. ``exhausted`` names the
    dimension (``"calls"``, ``"tokens"``, ``"cost"``) that ran out on the task
    or an ancestor: for ``charge()``, the one that stopped this charge (``None``
    when it was added, even if it used the last unit); for ``budget()``, and
    for a charge refused because the task is not running or is not the
    caller's claim, the first one already used up. ``exhausted_task_id``
    names the task whose limit that is: this task or an ancestor, the one
    an operator grants more to (``None`` with ``exhausted``). ``refused``
    says why ``allowed`` is false: ``"budget"`` (a limit, see
    ``exhausted``), ``"not_running"`` (the task is queued, parked or ended,
    under the caller's own claim too: a cancel, a block, a reconcile; its
    status says which) or ``"claim_lost"`` (the ``worker=``/``attempt=``
    claim is not the task's: another holds it, or none since it went back
    to the queue); ``None`` when allowed. ``*_remaining``
    is the task's own limit minus its own use, ``None`` where the limit is
    ``None`` (unlimited).
    """

    allowed: bool
    escalated: bool
    exhausted: str | None
    calls_used: int
    calls_budget: int | None
    calls_remaining: int | None
    tokens_used: int
    token_budget: int | None
    tokens_remaining: int | None
    cost_used_micros: int
    cost_budget_micros: int | None
    cost_remaining_micros: int | None
    exhausted_task_id: str | None = None
    refused: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The figures as plain JSON-ready values."""
        return _plain(self)


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a task's history, as ``Ledger.events`` returns it.

    ``kind`` is ``"created"``, ``"task_transition"``, ``"delivery_transition"``
    or ``"budget_granted"``. ``from_state`` and ``to_state`` are task
    statuses, or delivery statuses for a delivery event (a creation and a
    grant have no ``from_state``; a grant's ``to_state`` is the status it
    found). ``at`` is the ledger clock's Unix time, ``code`` the reason
    code, ``worker`` the worker the change was made for, and the
    ``granted_*`` amounts are set on grants only.
    """

    kind: str
    from_state: str | None
    to_state: str
    at: float
    code: str | None
    worker: str | None
    granted_calls: int | None
    granted_tokens: int | None
    granted_cost_micros: int | None

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-ready values."""
        return _plain(self)


@dataclass(frozen=True, slots=True)
class ReconcilePolicy:
    """Grace periods for ``reconcile_restart`` (seconds, inclusive thresholds)."""

    active_grace_seconds: float = 600.0
    delivery_grace_seconds: float = 600.0

    def __post_init__(self) -> None:
        from ._core import non_negative_seconds

        for name in ("active_grace_seconds", "delivery_grace_seconds"):
            object.__setattr__(self, name, non_negative_seconds(getattr(self, name), name))


def _plain(record: Any) -> dict[str, Any]:
    """A dataclass's fields in order, a status as its plain text."""
    return {
        name: value.value if isinstance(value := getattr(record, name), StrEnum) else value
        for name in record.__dataclass_fields__
    }


def _layout_twin(cls: type) -> type:
    """``cls``'s mutable layout twin: the same slots in the same order.

    The core builds each ``Task`` and ``Charge`` as its twin (a plain
    ``__init__``, several times cheaper than a frozen dataclass's, which sets
    every field through ``object.__setattr__``) and then retypes it, which
    CPython allows between classes of identical layout. What callers get is
    an ordinary instance: same type, equality, hash, repr and immutability.
    """
    fields_ = [(f.name, f.type) for f in fields(cls)]
    return make_dataclass(f"_{cls.__name__}Record", fields_, slots=True, repr=False, eq=False)


_TaskRecord = _layout_twin(Task)
_ChargeRecord = _layout_twin(Charge)
