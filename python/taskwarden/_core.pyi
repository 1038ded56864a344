"""Type stubs for the Rust core. Use ``taskwarden.Ledger``; this is its engine."""

from collections.abc import Callable
from pathlib import Path
from typing import Any, final

from .models import Charge, Event, Task

__all__ = [
    "DEFAULT_SNAPSHOT_MAX_BYTES",
    "DELIVERY_REASON_CODES",
    "REASON_CODES",
    "SCHEMA_VERSION",
    "STATUS_ALIASES",
    "TASK_REASON_CODES",
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "LedgerCore",
    "__version__",
    "can_transition",
    "non_negative_seconds",
    "payload_fingerprint",
    "resolve_path",
]

__version__: str
SCHEMA_VERSION: int
DEFAULT_SNAPSHOT_MAX_BYTES: int
REASON_CODES: tuple[str, ...]
TRANSITIONS: dict[str, tuple[str, ...]]
TERMINAL_STATUSES: tuple[str, ...]
STATUS_ALIASES: dict[str, str]
TASK_REASON_CODES: dict[str, tuple[str, ...]]
DELIVERY_REASON_CODES: dict[str, tuple[str, ...]]

def payload_fingerprint(payload: str | bytes) -> str:
    """SHA-256 of a payload (``str`` as UTF-8, or ``bytes``), lowercase hex."""

def can_transition(from_status: str, to_status: str) -> bool:
    """True when the state machine has the edge (aliases accepted)."""

def non_negative_seconds(value: object, name: str) -> float:
    """A finite number of seconds >= 0 (anything ``float()`` takes but a bool);
    a refusal names ``name`` if it is one of ``ReconcilePolicy``'s fields."""

def resolve_path(path: str) -> Path:
    """The file an open of ``path`` would use; refuses (``InvalidInput``)
    what an open refuses for the path alone, and touches nothing."""

@final
class LedgerCore:
    """One open ledger; every method runs with the interpreter released."""

    def __new__(
        cls,
        path: object,
        *,
        busy_timeout_ms: object,
        durability: object,
        read_only: object,
        allow_external_acl: object,
        snapshot_max_bytes: object,
        clock: Callable[[], float] | None,
        euid: int,
        migrate: object,
        create: object,
    ) -> LedgerCore: ...
    @staticmethod
    def in_memory(*, busy_timeout_ms: object, clock: Callable[[], float] | None) -> LedgerCore:
        """A private in-memory ledger."""
    def close(self) -> None:
        """Release the connection."""
    def create_task(
        self,
        *,
        task_id: object,
        parent_id: object,
        payload_hash: object,
        timeout_seconds: object,
        delivery_required: object,
        tenant: object,
        llm_calls_budget: object,
        token_budget: object,
        cost_budget_micros: object,
        max_attempts: object,
    ) -> Task:
        """Create (or idempotently return) a task."""
    def get_task(self, task_id: object) -> Task: ...
    @property
    def path(self) -> Path | None:
        """The database file as the open resolved it (``None`` in memory)."""
    def children_of(self, task_id: object) -> list[Task]: ...
    def events(self, task_id: object) -> list[Event]:
        """The task's events, oldest first, once they verify."""
    def start_task(self, task_id: object) -> Task: ...
    def heartbeat(
        self, task_id: object, *, worker: object = None, attempt: object = None
    ) -> Task: ...
    def close_task(
        self,
        task_id: object,
        status: object,
        *,
        code: object = None,
        worker: object = None,
        attempt: object = None,
    ) -> Task: ...
    def set_delivery(
        self,
        task_id: object,
        status: object,
        *,
        code: object = None,
        worker: object = None,
        attempt: object = None,
    ) -> Task: ...
    def reconcile(
        self,
        *,
        active_grace_seconds: object,
        delivery_grace_seconds: object,
        dry_run: object,
        worker_lost: object = None,
        tenant: object = None,
    ) -> dict[str, Any]:
        """Time out lost running tasks and expire pending deliveries (or count them)."""
    def claim(self, task_id: object, worker: object) -> Task | None:
        """queued -> running owned by ``worker``; None if not queued."""
    def claim_next(self, worker: object, *, tenant: object = None, limit: object) -> list[Task]:
        """Claim up to ``limit`` oldest queued tasks in one transaction."""
    def release(self, task_id: object, worker: object, *, attempt: object = None) -> Task:
        """The owner gives a running task back (or it escalates)."""
    def transition(
        self,
        task_id: object,
        expected: object,
        to: object,
        *,
        code: object = None,
        worker: object = None,
        attempt: object = None,
    ) -> Task:
        """Compare-and-set along the transition table."""
    def cancel(self, task_id: object, *, subtree: object) -> Task:
        """Cancels a task; with ``subtree``, every task below it that is not
        terminal yet too."""
    def move_to(
        self,
        task_id: object,
        to: object,
        *,
        code: object = None,
        worker: object = None,
        attempt: object = None,
    ) -> Task:
        """block / escalate / requeue from the current status."""
    def grant(self, task_id: object, *, calls: object, tokens: object, cost_micros: object) -> Task:
        """Raise a task's limits."""
    def charge(
        self,
        task_id: object,
        *,
        calls: object,
        tokens: object,
        cost_micros: object,
        worker: object = None,
        attempt: object = None,
    ) -> Charge:
        """The budget guard's atomic charge."""
    def budget(self, task_id: object) -> Charge:
        """Budget figures without charging."""
    def list_tasks(
        self,
        *,
        status: object = None,
        tenant: object = None,
        owner: object = None,
        parent_id: object = None,
        limit: object,
        after: object = None,
    ) -> list[Task]:
        """Keyset-paged listing, oldest first."""
    def delete_task(self, task_id: object) -> None:
        """Delete one fully closed task without children."""
    def purge(
        self, *, older_than_seconds: object, dry_run: object, tenant: object = None
    ) -> dict[str, Any]:
        """Purge fully closed old task trees in batches."""
    def stats(self, *, tenant: object = None) -> dict[str, Any]:
        """Counts by status, delivery and tenant; file sizes."""
    def doctor(self) -> dict[str, Any]:
        """Integrity and consistency report, counts only."""
    def storage_info(self) -> dict[str, Any]: ...
