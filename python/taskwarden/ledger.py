"""The ``Ledger``: one SQLite file holding every task's state."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self, SupportsIndex, TypeVar

from . import _core
from ._handle import (
    CLOSED,
    OPEN_FILE_LEDGERS,
    SYSTEM_CLOCKS,
    Clock,
    core_clock,
    effective_uid,
    text_path,
)
from .errors import InvalidInput, StateConflict
from .models import Charge, DeliveryStatus, Event, Task, TaskStatus

__all__ = ["Clock", "Ledger"]


# What a Ledger's __dict__ holds of its own handle (not copied to a copy).
_HANDLE_ATTRIBUTES = frozenset({"_core", "_reopen_args", "path"})


_L = TypeVar("_L", bound="Ledger")


def _reopened(cls: type[_L], path: str, options: dict[str, Any]) -> _L:
    """A copy or an unpickled ``Ledger`` (of a subclass too): a new handle
    on the same file; the subclass's own attributes follow as its state."""
    ledger = cls.__new__(cls)
    Ledger.__init__(ledger, path, **options)
    return ledger


class Ledger:
    """An embedded, crash-honest task-state ledger.

    Parameters (all but ``path`` keyword-only):

    - ``path``: the database file (``str`` or ``os.PathLike``). Created with
      mode 0600 in a private directory; links are refused.
    - ``clock``: returns Unix seconds; ``time.time`` by default. Read at most
      once per write, inside the transaction (a charge that fits reads none:
      it records no time).
    - ``busy_timeout_ms``: how long a writer waits for the lock before
      ``LedgerBusy`` (default 5000). Ctrl-C ends the wait at once: the call
      raises ``KeyboardInterrupt`` and writes nothing.
    - ``allow_external_acl``: confirms an externally secured directory on
      platforms without POSIX modes (accepted and ignored on POSIX).
    - ``read_only``: open an existing ledger without creating, migrating or
      touching anything; reads and dry runs only.
    - ``durability``: ``"normal"`` (``synchronous=NORMAL``, the default) or
      ``"full"`` (every commit reaches the disk before it returns).
    - ``snapshot_max_bytes``: the largest file a read-only open copies into
      memory (64 MiB by default).
    - ``migrate``: a writable open migrates a task-state-guard 0.1.0 file
      to schema v3, and an earlier taskwarden layout to the current one
      (one way: the peer, or that build, cannot open it afterwards); with
      ``False`` such a file is refused (``StateConflict``) and left as it is.
    - ``create``: a writable open makes a missing file (and its missing
      parent directories); with ``False`` a path with no file is refused
      (``InvalidInput``).

    Use it as a context manager, or call ``close()``, to release the file.
    """

    SCHEMA_VERSION: int = _core.SCHEMA_VERSION
    #: The database file, absolute; ``None`` for ``Ledger.in_memory()``.
    path: Path | None
    # What a reopen takes (the path and the options); ``None`` in memory.
    _reopen_args: tuple[str, dict[str, Any]] | None

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock = time.time,
        busy_timeout_ms: int = 5000,
        allow_external_acl: bool = False,
        read_only: bool = False,
        durability: str = "normal",
        snapshot_max_bytes: int = _core.DEFAULT_SNAPSHOT_MAX_BYTES,
        migrate: bool = True,
        create: bool = True,
    ) -> None:
        raw = text_path(path)
        if not callable(clock):
            raise InvalidInput("clock must be callable")
        options: dict[str, Any] = {
            "busy_timeout_ms": busy_timeout_ms,
            "durability": durability,
            "read_only": read_only,
            "allow_external_acl": allow_external_acl,
            "snapshot_max_bytes": snapshot_max_bytes,
            "clock": core_clock(clock),
            "euid": effective_uid(),
            "migrate": migrate,
            "create": create,
        }
        self._core = _core.LedgerCore(raw, **options)
        # Where the core resolved the name: the file this handle opened.
        self.path = self._core.path
        # A reopen (in a forked child, or for a copy) opens that same file
        # whatever the working directory is then, and makes no file the
        # first open did not already make.
        self._reopen_args = (str(self.path), options | {"create": False})
        OPEN_FILE_LEDGERS.add(self)

    @classmethod
    def in_memory(cls, *, clock: Clock = time.time, busy_timeout_ms: int = 5000) -> Self:
        """A private ledger that lives in memory only (for tests)."""
        if not callable(clock):
            raise InvalidInput("clock must be callable")
        ledger = cls.__new__(cls)
        ledger._core = _core.LedgerCore.in_memory(
            busy_timeout_ms=busy_timeout_ms, clock=core_clock(clock)
        )
        ledger.path = None
        ledger._reopen_args = None
        return ledger

    def __enter__(self) -> Self:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        """A copy, or an unpickled ``Ledger`` (a spawned worker's), is a new
        handle on the same file with the same arguments: never one that
        shares this handle's connection."""
        if self._reopen_args is None:
            raise TypeError("an in-memory Ledger cannot be copied or pickled")
        if self._core is CLOSED:
            raise StateConflict("ledger is closed")
        path, options = self._reopen_args
        clock = options["clock"]
        given = {k: v for k, v in options.items() if k not in ("clock", "euid")}
        given["clock"] = SYSTEM_CLOCKS[0] if clock is None else clock
        own = {k: v for k, v in vars(self).items() if k not in _HANDLE_ATTRIBUTES}
        return (_reopened, (type(self), path, given), own or None)

    def __copy__(self) -> Self:
        _, (_, path, options), own = self.__reduce__()
        ledger = _reopened(type(self), path, options)
        vars(ledger).update(own or {})
        return ledger

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        return self.__copy__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Release the connection; later calls raise ``StateConflict``."""
        if self._core is not CLOSED:
            self._core.close()
            self._core = CLOSED

    def create_task(
        self,
        *,
        parent_id: str | None = None,
        payload_hash: str | None = None,
        timeout_seconds: float | None = None,
        delivery_required: bool = True,
        task_id: str | None = None,
        tenant: str | None = None,
        llm_calls_budget: SupportsIndex | None = 25,
        token_budget: SupportsIndex | None = None,
        cost_budget_micros: SupportsIndex | None = None,
        max_attempts: SupportsIndex = 3,
    ) -> Task:
        """Create a queued task, or return it unchanged when the same id is
        created again with the same immutable fields (parent, payload hash,
        timeout, delivery, tenant, max_attempts; budget limits are not
        compared, ``grant`` raises them). A task's limits bound its whole
        subtree, the default 25 calls included: give a parent the limits
        its children need together (``None`` is unlimited)."""
        return self._core.create_task(
            task_id=task_id,
            parent_id=parent_id,
            payload_hash=payload_hash,
            timeout_seconds=timeout_seconds,
            delivery_required=delivery_required,
            tenant=tenant,
            llm_calls_budget=llm_calls_budget,
            token_budget=token_budget,
            cost_budget_micros=cost_budget_micros,
            max_attempts=max_attempts,
        )

    def get_task(self, task_id: str) -> Task:
        """The task with this id."""
        return self._core.get_task(task_id)

    def children_of(self, task_id: str) -> list[Task]:
        """Direct children, oldest first."""
        return self._core.children_of(task_id)

    def events(self, task_id: str) -> list[Event]:
        """The task's history, oldest first: who changed what, when and why.
        Returned only once its hash chain and its path through the state
        machines verify against the task; otherwise ``StateConflict`` (run
        ``doctor``)."""
        return self._core.events(task_id)

    def start_task(self, task_id: str) -> Task:
        """queued -> running without an owner; a running task is returned as is."""
        return self._core.start_task(task_id)

    def heartbeat(
        self, task_id: str, *, worker: str | None = None, attempt: int | None = None
    ) -> Task:
        """Mark a running task alive. ``worker``/``attempt`` fence off stale claims."""
        return self._core.heartbeat(task_id, worker=worker, attempt=attempt)

    def close_task(
        self,
        task_id: str,
        status: TaskStatus | str,
        *,
        code: str | None = None,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """Move a task to a terminal status; the same status again is a no-op."""
        return self._core.close_task(task_id, status, code=code, worker=worker, attempt=attempt)

    def set_delivery(
        self,
        task_id: str,
        status: DeliveryStatus | str,
        *,
        code: str | None = None,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """Record a terminal task's delivery outcome. With ``worker=`` (and
        ``attempt=``) only the claim that held the task last may: a worker
        that lost its task gets ``ClaimLost`` and decides nothing."""
        return self._core.set_delivery(task_id, status, code=code, worker=worker, attempt=attempt)

    # -- claims: one owner per task, across threads and processes ----------

    def claim(self, task_id: str, worker: str) -> Task | None:
        """Atomically ``queued -> running`` owned by ``worker``; ``None`` if not queued."""
        return self._core.claim(task_id, worker)

    def claim_next(self, worker: str, *, tenant: str | None = None, limit: int = 1) -> list[Task]:
        """Claim up to ``limit`` (1 to 10,000) of the oldest queued tasks in
        one transaction."""
        return self._core.claim_next(worker, tenant=tenant, limit=limit)

    def release(self, task_id: str, worker: str, *, attempt: int | None = None) -> Task:
        """The owner gives a running task back: queued again, or escalated
        (``attempts_exhausted``) once the task has been started
        ``max_attempts`` times (claims, ``start_task`` and ``queued ->
        running`` transitions all count).
        ``attempt`` also fences an older claim under a reused worker name."""
        return self._core.release(task_id, worker, attempt=attempt)

    # -- the state machine --------------------------------------------------

    def transition(
        self,
        task_id: str,
        expected: TaskStatus | str,
        to: TaskStatus | str,
        *,
        code: str | None = None,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """Compare-and-set: ``StateConflict`` unless the stored status is
        ``expected`` and ``expected -> to`` is in ``TRANSITIONS``.

        ``running -> queued`` is a release: once the task's attempts are used
        up it is escalated (``attempts_exhausted``) instead, as by
        ``release``."""
        return self._core.transition(
            task_id, expected, to, code=code, worker=worker, attempt=attempt
        )

    def block(
        self,
        task_id: str,
        *,
        code: str = "needs_input",
        worker: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """``running -> blocked`` (waiting for input); the owner is kept.
        ``worker`` and ``attempt`` fence a zombie, as on ``close_task``."""
        return self._core.move_to(task_id, "blocked", code=code, worker=worker, attempt=attempt)

    def escalate(
        self,
        task_id: str,
        *,
        code: str = "escalated_manually",
        worker: str | None = None,
        attempt: int | None = None,
    ) -> Task:
        """``running -> escalated`` (a person must look); the owner is kept.
        ``worker`` and ``attempt`` fence a zombie, as on ``close_task``."""
        return self._core.move_to(task_id, "escalated", code=code, worker=worker, attempt=attempt)

    def requeue(self, task_id: str) -> Task:
        """``blocked|escalated -> queued`` (code ``requeued``); the owner is cleared."""
        return self._core.move_to(task_id, "queued")

    def cancel(self, task_id: str, *, subtree: bool = False) -> Task:
        """Any non-terminal status -> ``cancelled``; cancelling again is a no-op.

        With ``subtree=True``, every task below it that is not terminal yet
        is cancelled too, in the same transaction (each with its own event):
        the stop for a runaway tree, whose running tasks would otherwise go
        on charging against their ancestors. A root that already ended is
        left as it is, and its tree still stopped. Returns the task itself."""
        return self._core.cancel(task_id, subtree=subtree)

    # -- the budget guard ---------------------------------------------------

    def charge(
        self,
        task_id: str,
        *,
        calls: SupportsIndex = 1,
        tokens: SupportsIndex = 0,
        cost_micros: SupportsIndex = 0,
        worker: str | None = None,
        attempt: int | None = None,
    ) -> Charge:
        """Meter one LLM call (or more) before making it: one atomic write.

        Fits the task and every ancestor: added to all of them, ``allowed``.
        Does not fit: nothing is charged and the task is escalated
        (``budget_exhausted``). Not running, or not this worker's claim:
        ``allowed=False`` and nothing changes. Never raises for state reasons.
        """
        return self._core.charge(
            task_id,
            calls=calls,
            tokens=tokens,
            cost_micros=cost_micros,
            worker=worker,
            attempt=attempt,
        )

    def budget(self, task_id: str) -> Charge:
        """The budget figures without charging."""
        return self._core.budget(task_id)

    def grant(
        self,
        task_id: str,
        *,
        calls: SupportsIndex = 0,
        tokens: SupportsIndex = 0,
        cost_micros: SupportsIndex = 0,
    ) -> Task:
        """Raise a task's limits (never lower them); recorded as ``budget_granted``
        with the amounts added. An unlimited limit stays unlimited and is
        added nothing; a grant that adds nothing at all writes nothing."""
        return self._core.grant(task_id, calls=calls, tokens=tokens, cost_micros=cost_micros)

    def list_tasks(
        self,
        *,
        status: TaskStatus | str | None = None,
        tenant: str | None = None,
        owner: str | None = None,
        parent_id: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[Task]:
        """Tasks matching every filter, oldest first, at most ``limit``
        (1 to 10,000); pass the last id as ``after`` for the next page. That
        task must still exist (``TaskNotFound`` otherwise): when deleting
        what you list, fetch the next page before deleting the last task.

        A page reads the tasks' creation order (or the queue's, or one
        parent's children's) from its cursor on, until it holds ``limit``
        matches: a walk costs in proportion to what it passes (0.35 s for
        200,000 closed tasks, 0.16 s for 100,000 children, 100 a page), and
        a page of a rare status or tenant reads to the end once. A page of
        running tasks reads all of them through their index and sorts them
        (they are as many as run at once)."""
        return self._core.list_tasks(
            status=status, tenant=tenant, owner=owner, parent_id=parent_id, limit=limit, after=after
        )

    # -- recovery -------------------------------------------------------------

    def reconcile(
        self,
        *,
        active_grace_seconds: float,
        delivery_grace_seconds: float,
        dry_run: bool = False,
        worker_lost: str | None = None,
        tenant: str | None = None,
    ) -> dict[str, Any]:
        """Time out running tasks past their deadline or silent for
        ``active_grace_seconds`` (or owned by ``worker_lost``), and close
        pending deliveries of tasks that ended ``delivery_grace_seconds``
        ago. ``dry_run=True`` counts the same decisions and writes nothing.
        Returns counts only, never ids."""
        return dict(
            self._core.reconcile(
                active_grace_seconds=active_grace_seconds,
                delivery_grace_seconds=delivery_grace_seconds,
                dry_run=dry_run,
                worker_lost=worker_lost,
                tenant=tenant,
            )
        )

    def delete_task(self, task_id: str) -> None:
        """Delete one fully closed task (terminal, delivery terminal) without
        children, and its events."""
        self._core.delete_task(task_id)

    def purge(
        self, *, older_than_seconds: float, dry_run: bool = False, tenant: str | None = None
    ) -> dict[str, Any]:
        """Remove whole task trees in which every task is fully closed and
        last changed at least ``older_than_seconds`` ago (the cutoff is
        inclusive, like reconcile's thresholds), in short batches. Counts
        only. A signal handler that raises (Ctrl-C) stops it between two
        batches; the batches already committed stay purged."""
        return dict(
            self._core.purge(older_than_seconds=older_than_seconds, dry_run=dry_run, tenant=tenant)
        )

    def stats(self, *, tenant: str | None = None) -> dict[str, Any]:
        """Counts by status, delivery state and tenant; file and WAL size."""
        return dict(self._core.stats(tenant=tenant))

    def doctor(self) -> dict[str, Any]:
        """Is the file a healthy ledger? ``quick_check``, the exact schema,
        foreign keys, state, owner, budget and timestamp rules, parent links
        and each task's hash-chained event history. Counts only, never an
        id; nothing is repaired."""
        return dict(self._core.doctor())

    def storage_info(self) -> dict[str, Any]:
        """Journal mode, busy timeout, foreign keys, permission model,
        durability, and the bytes of the file and its WAL (``None`` in
        memory): cheap enough to poll, where ``stats()`` counts every task."""
        return dict(self._core.storage_info())
