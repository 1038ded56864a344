"""taskwarden: an embedded, crash-honest task-state ledger for AI-agent fleets."""

from ._core import __version__, payload_fingerprint
from .compat import (
    DELIVERY_REASON_CODES,
    REASON_CODES,
    TASK_REASON_CODES,
    TRANSITIONS,
    can_transition,
    reconcile_restart,
)
from .errors import ClaimLost, InvalidInput, LedgerBusy, LedgerError, StateConflict, TaskNotFound
from .ledger import Ledger
from .models import Charge, DeliveryStatus, Event, ReconcilePolicy, Task, TaskStatus

__all__ = [
    "DELIVERY_REASON_CODES",
    "REASON_CODES",
    "TASK_REASON_CODES",
    "TRANSITIONS",
    "Charge",
    "ClaimLost",
    "DeliveryStatus",
    "Event",
    "InvalidInput",
    "Ledger",
    "LedgerBusy",
    "LedgerError",
    "ReconcilePolicy",
    "StateConflict",
    "Task",
    "TaskNotFound",
    "TaskStatus",
    "__version__",
    "can_transition",
    "payload_fingerprint",
    "reconcile_restart",
]
