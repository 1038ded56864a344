"""The task-state-guard 0.1.0 helpers, and the state machine as data."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from . import _core
from .ledger import Ledger
from .models import DeliveryStatus, ReconcilePolicy, TaskStatus

__all__ = [
    "DELIVERY_REASON_CODES",
    "REASON_CODES",
    "TASK_REASON_CODES",
    "TRANSITIONS",
    "can_transition",
    "reconcile_restart",
]

#: The reason-code registry: the only codes the ledger stores.
REASON_CODES: frozenset[str] = frozenset(_core.REASON_CODES)

#: The codes a caller may give when moving a task into each status (the
#: peer's table, with ``blocked``, ``escalated`` and ``worker_lost`` added);
#: the ledger writes the others itself. Read-only, like ``TRANSITIONS``.
TASK_REASON_CODES: Mapping[TaskStatus, frozenset[str]] = MappingProxyType(
    {TaskStatus(to): frozenset(codes) for to, codes in _core.TASK_REASON_CODES.items()}
)

#: The codes allowed with each delivery outcome.
DELIVERY_REASON_CODES: Mapping[DeliveryStatus, frozenset[str]] = MappingProxyType(
    {DeliveryStatus(to): frozenset(codes) for to, codes in _core.DELIVERY_REASON_CODES.items()}
)

#: Every allowed edge of the task state machine: ``status -> allowed targets``.
#: Read-only: the core enforces its own table, so an edited copy here could
#: only disagree with it.
TRANSITIONS: Mapping[TaskStatus, frozenset[TaskStatus]] = MappingProxyType(
    {
        TaskStatus(src): frozenset(TaskStatus(dst) for dst in targets)
        for src, targets in _core.TRANSITIONS.items()
    }
)


def can_transition(from_status: TaskStatus | str, to_status: TaskStatus | str) -> bool:
    """True when the state machine allows ``from_status -> to_status``
    (the aliases ``pending``, ``in_progress`` and ``completed`` are accepted)."""
    return _core.can_transition(from_status, to_status)


def reconcile_restart(
    ledger: Ledger, policy: ReconcilePolicy, *, dry_run: bool = False
) -> dict[str, Any]:
    """Run ``ledger.reconcile`` with the policy's grace periods."""
    return ledger.reconcile(
        active_grace_seconds=policy.active_grace_seconds,
        delivery_grace_seconds=policy.delivery_grace_seconds,
        dry_run=dry_run,
    )
