"""What a ``Ledger`` holds of its file besides the API: the stand-ins for
its core handle once closed or inherited by a forked child, the clock the
core is given, and the path argument as the text the core resolves."""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from . import _core
from .errors import InvalidInput, StateConflict

if TYPE_CHECKING:
    from .ledger import Ledger

Clock = Callable[[], float]


def effective_uid() -> int:
    return os.geteuid() if hasattr(os, "geteuid") else 0


class ClosedCore:
    """What a closed ledger's calls reach: each is a ``StateConflict``,
    before any argument is looked at (a closed ledger is closed for all)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise StateConflict("ledger is closed")

        return refuse


CLOSED: Any = ClosedCore()


class InheritedCore:
    """What a forked child's inherited file ledger holds until its first
    call: the parent's connection is never used in the child (it holds
    none of the parent's locks), so that call opens the child's own, with
    the same arguments, and the inherited one is set aside untouched.
    One thread opens it; a close meanwhile waits for it and closes it."""

    def __init__(self, ledger: Ledger, inherited: Any) -> None:
        self._ledger = ledger
        self._inherited = inherited  # dropped only once the child's own is open
        self._opening = threading.Lock()
        self._opener: int | None = None  # the thread inside the open, if any

    def __getattr__(self, name: str) -> Any:
        self._refuse_the_opener()
        with self._opening:
            current: Any = self._ledger._core
            if current is self:
                assert self._ledger._reopen_args is not None  # file ledgers only
                path, options = self._ledger._reopen_args
                self._opener = threading.get_ident()
                try:
                    current = _core.LedgerCore(path, **options)
                finally:
                    self._opener = None
                self._ledger._core = current
        return getattr(current, name)

    def close(self) -> None:
        """Closing before any call opens nothing; during the first call,
        it closes what that call opened."""
        self._refuse_the_opener()
        with self._opening:
            current: Any = self._ledger._core
            if current is not self:
                current.close()

    def _refuse_the_opener(self) -> None:
        """The open runs signal handlers while it waits for a lock; one
        that calls this ledger would wait for its own thread for ever."""
        if self._opener == threading.get_ident():
            raise StateConflict(
                "the ledger was called from inside one of its own calls "
                "(its clock, or a signal handler during a lock wait)"
            )


# The system clock as it was at import, which the core reads itself
# (fast, no Python call). Compared by identity: a test that patches
# `time.time` and passes `clock=time.time` hands over its own function,
# which is then called like any other clock, as the peer calls it. Kept in
# a tuple: freezegun replaces every module attribute that holds the real
# `time.time`, and would swap this one for its fake too.
SYSTEM_CLOCKS = (time.time,)

# time-machine moves time without replacing `time.time`: it patches the
# function in place, so the identity test above cannot see it, and a core
# reading the system clock itself would ignore every travel (the peer,
# calling `time.time`, follows them). In a process that has imported it,
# the clock is called as Python's; other processes keep the fast read.
TIME_TRAVEL_MODULES = ("time_machine",)


def text_path(path: Any) -> str:
    """A path argument as the text the core resolves (the peer's refusals)."""
    try:
        raw = os.fspath(path)
    except Exception:
        raise InvalidInput("database path must be path-like") from None
    if not isinstance(raw, str):
        raise InvalidInput("database path must be a nonempty text path")
    return raw


def core_clock(clock: Clock) -> Clock | None:
    """What the core is given: None for the system clock it reads itself,
    otherwise the callable, called for every reading."""
    if clock is not SYSTEM_CLOCKS[0]:
        return clock
    if any(name in sys.modules for name in TIME_TRAVEL_MODULES):
        return clock
    return None


# The file ledgers of this process that may be open, for the fork hook.
OPEN_FILE_LEDGERS: weakref.WeakSet[Ledger] = weakref.WeakSet()


def after_fork_in_child() -> None:
    # No SQLite here: a thread that did not survive the fork may hold its
    # locks. The inherited handles are only swapped for placeholders.
    for ledger in list(OPEN_FILE_LEDGERS):
        if ledger._core is not CLOSED and not isinstance(ledger._core, InheritedCore):
            ledger._core = cast(_core.LedgerCore, InheritedCore(ledger, ledger._core))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=after_fork_in_child)
