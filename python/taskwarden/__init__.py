"""taskwarden: an embedded, crash-honest task-state ledger for AI-agent fleets."""

from ._core import __version__, payload_fingerprint
from .errors import InvalidInput, LedgerBusy, LedgerError, StateConflict, TaskNotFound
from .ledger import Ledger
from .models import DeliveryStatus, Task, TaskStatus

__all__ = [
    "DeliveryStatus",
    "InvalidInput",
    "Ledger",
    "LedgerBusy",
    "LedgerError",
    "StateConflict",
    "Task",
    "TaskNotFound",
    "TaskStatus",
    "__version__",
    "payload_fingerprint",
]
