"""The exception classes of taskwarden.

Messages are fixed strings: they never contain ids, paths, hashes or values
that a caller passed in, so they are safe to log.
"""

from __future__ import annotations

__all__ = [
    "ClaimLost",
    "InvalidInput",
    "LedgerBusy",
    "LedgerError",
    "StateConflict",
    "TaskNotFound",
]


class LedgerError(Exception):
    """Base class of every error the ledger raises on purpose."""


class InvalidInput(LedgerError, ValueError):
    """A caller value was refused; nothing was written."""


class TaskNotFound(LedgerError, LookupError):
    """The task (or the parent named at creation) does not exist."""


class StateConflict(LedgerError):
    """The stored state does not allow the operation."""


class LedgerBusy(StateConflict):
    """The call waited longer than ``busy_timeout_ms``: for another writer's
    lock (a stalled or stopped process, a long reconcile), for another
    thread's call on a shared handle, or, on a read-only handle, for a
    read that kept meeting a writer. Nothing was written; the call can be
    made again."""


class ClaimLost(StateConflict):
    """A write made for a claim (``worker=`` or ``attempt=`` given, or a
    ``release``) found that claim over: the task was released, requeued,
    claimed again, parked or ended by someone else (``reconcile`` included).
    Nothing was written; the worker should stop working on the task.

    Unlike its base class it never means "busy" (``LedgerBusy`` is a
    ``StateConflict`` too), nor a move the caller got wrong while its claim
    still runs the task."""
