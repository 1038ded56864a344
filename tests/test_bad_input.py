"""Bad-input campaign: every public entry point refuses wrong values with
``InvalidInput`` (also a ``ValueError``), writes nothing, and never echoes the
value it refused (SPEC §2.1, §2.2.1, §2.4, §8; peer reference §1.5 and §7)."""

from __future__ import annotations

import math
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskwarden import DeliveryStatus, Ledger, ReconcilePolicy, StateConflict, TaskStatus
from taskwarden.errors import InvalidInput, LedgerError

from .conftest import FrozenClock, logical_dump, run_cli

MARKER = "SECRET-MARKER-123"
HASH = "ab" * 32
REFUSED_LINE = '{"error":"InvalidInput","ok":false}\n'


# --------------------------------------------------------------------------
# A ledger that already holds tasks in several states


@dataclass(frozen=True)
class Seeded:
    queued: str
    running: str
    succeeded: str  # terminal, delivery pending, delivery required
    internal: str  # terminal internal task, delivery pending
    closed: str  # terminal and delivered
    child: str  # queued child of ``queued``


def _seed(ledger: Ledger, clock: FrozenClock) -> Seeded:
    queued = ledger.create_task(tenant="acme", payload_hash=HASH, timeout_seconds=60)
    clock.advance(1)
    running = ledger.create_task(tenant="acme", llm_calls_budget=10, token_budget=1000)
    ledger.start_task(running.id)
    clock.advance(1)
    succeeded = ledger.create_task(cost_budget_micros=5_000, max_attempts=2)
    ledger.start_task(succeeded.id)
    ledger.close_task(succeeded.id, "succeeded", code="worker_completed")
    clock.advance(1)
    internal = ledger.create_task(delivery_required=False)
    ledger.close_task(internal.id, "failed", code="worker_failed")
    clock.advance(1)
    closed = ledger.create_task()
    ledger.close_task(closed.id, "cancelled", code="caller_cancelled")
    ledger.set_delivery(closed.id, "delivered", code="transport_acknowledged")
    clock.advance(1)
    child = ledger.create_task(parent_id=queued.id, timeout_seconds=5)
    clock.advance(1)
    return Seeded(queued.id, running.id, succeeded.id, internal.id, closed.id, child.id)


@pytest.fixture(scope="module")
def seeded_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Seeded, float]:
    """One seeded ledger file per module; each test works on its own copy."""
    path = tmp_path_factory.mktemp("template") / "ledger.db"
    clock = FrozenClock()
    with Ledger(path, clock=clock) as opened:
        ids = _seed(opened, clock)
    assert sorted(p.name for p in path.parent.iterdir()) == ["ledger.db"]
    return path, ids, clock.now


@pytest.fixture
def ledger(
    seeded_template: tuple[Path, Seeded, float], db_path: Path, clock: FrozenClock
) -> Iterator[Ledger]:
    """Overrides conftest's ``ledger``: a private copy of the seeded ledger."""
    template, _, now = seeded_template
    shutil.copy2(template, db_path)
    clock.now = now
    with Ledger(db_path, clock=clock) as opened:
        yield opened


@pytest.fixture
def seeded(seeded_template: tuple[Path, Seeded, float], ledger: Ledger) -> Seeded:
    ids = seeded_template[1]
    assert ledger.get_task(ids.queued).status is TaskStatus.QUEUED
    return ids


def _leak_probes(value: Any) -> list[str]:
    """Recognisable renderings of a refused value that must not reach a message."""
    probes = [MARKER]
    if isinstance(value, str) and len(value) >= 4:
        probes.append(value)
    elif isinstance(value, bytes) and len(value) >= 4:
        probes += [repr(value), value.decode("latin-1")]
    elif isinstance(value, int) and not isinstance(value, bool) and len(str(value)) >= 6:
        probes.append(str(value))
    return probes


def assert_refused(db_path: Path, call: Callable[[], object], value: Any = None) -> InvalidInput:
    """``call`` raises InvalidInput (a ValueError), leaks nothing, writes nothing."""
    before = logical_dump(db_path)
    with pytest.raises(InvalidInput) as info:
        call()
    exc = info.value
    assert isinstance(exc, ValueError)
    assert isinstance(exc, LedgerError)
    message = str(exc)
    for probe in _leak_probes(value):
        assert probe not in message
        assert repr(probe) not in message
    assert logical_dump(db_path) == before
    return exc


# --------------------------------------------------------------------------
# Value catalogues

_CANON = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"

WRONG_TYPES: list[Any] = [1, 0, -7, 1.5, b"bytes-value", [], {}, object(), True, False, math.nan]

BAD_IDS: list[Any] = [
    "",
    "abc",
    MARKER,
    "a" * 37,
    _CANON + "0",  # 37 characters
    _CANON[:-1],  # 35 characters
    _CANON[:-1] + "g",  # one non-hex character
    _CANON[:-1] + "Z",
    " " + _CANON,
    _CANON + "\n",
    "\0" + _CANON,
    _CANON.replace("-", "_"),
    *WRONG_TYPES,
    _CANON.encode(),
]

BAD_TASK_STATUSES: list[Any] = [
    "done",
    "QUEUED",
    "SUCCEEDED",
    "Succeeded",
    "",
    "pending ",
    " succeeded",
    "succeeded\n",
    "succeeded\0",
    MARKER,
    None,
    5,
    b"succeeded",
    ["succeeded"],
    DeliveryStatus.DELIVERED,
]
# Valid statuses (and aliases) that are not terminal: close_task must refuse them.
NON_TERMINAL_STATUSES = ["queued", "running", "blocked", "escalated", "pending", "in_progress"]

BAD_DELIVERY_STATUSES: list[Any] = [
    "pending",
    "done",
    "DELIVERED",
    "delivered ",
    "",
    "succeeded",
    MARKER,
    None,
    5,
    b"delivered",
]

BAD_CODES: list[Any] = [
    "Bad Code",
    "nope",
    "x" * 65,
    "created",
    "started",
    "",
    "COMPLETED",
    "-completed",
    "completed\n",
    " completed",
    "completed\0",
    MARKER,
    MARKER.lower(),
    5,
    True,
    b"completed",
]

BAD_HASHES: list[Any] = [
    HASH.upper(),
    "A" * 64,
    "a" * 63,
    "a" * 65,
    "g" * 64,
    "a" * 63 + "\n",
    " " + "a" * 63,
    "\u0660" * 64,  # ARABIC-INDIC DIGIT ZERO
    MARKER,
    "",
    5,
    HASH.encode(),
]

BAD_NAMES: list[Any] = [  # tenant and worker ids
    "",
    "a" * 129,
    "a b",
    "a/b",
    "\u00e9",
    "caf\u00e9",
    "\uff41",  # FULLWIDTH LATIN SMALL LETTER A
    "\u0663",  # ARABIC-INDIC DIGIT THREE
    "a\0b",
    "a\nb",
    "a\tb",
    "a\u200bb",
    MARKER + " ",
    MARKER + "/x",
    5,
    True,
    b"acme",
    ["acme"],
    1.5,
]

BAD_AMOUNTS: list[Any] = [
    True,
    False,
    1.5,
    0.5,
    -0.5,
    "5",
    MARKER,
    b"5",
    [],
    math.nan,
    math.inf,
    -math.inf,
    -1,
    -(2**63),
    2**63,
    2**64,
    float(2**63),
    10**400,
]

BAD_TIMEOUTS: list[Any] = [
    True,
    False,
    "abc",
    MARKER,
    "1e400",
    "nan",
    "inf",
    "-1",
    b"abc",
    math.nan,
    math.inf,
    -math.inf,
    -1,
    -0.001,
    -(2**63),
    10**400,
    [],
    {},
    object(),
]

BAD_ATTEMPTS: list[Any] = [-1, 1.5, True, False, "1", MARKER, math.nan, math.inf, 2**63, 2**64]


def _ids(values: list[Any]) -> list[str]:
    return [repr(v)[:40] for v in values]


# --------------------------------------------------------------------------
# Ids on every method


ID_CALLS: dict[str, Callable[[Ledger, Any], object]] = {
    "get_task": lambda led, v: led.get_task(v),
    "children_of": lambda led, v: led.children_of(v),
    "start_task": lambda led, v: led.start_task(v),
    "heartbeat": lambda led, v: led.heartbeat(v),
    "close_task": lambda led, v: led.close_task(v, "succeeded"),
    "set_delivery": lambda led, v: led.set_delivery(v, "delivered"),
    "create_task(task_id)": lambda led, v: led.create_task(task_id=v),
    "create_task(parent_id)": lambda led, v: led.create_task(parent_id=v),
}


@pytest.mark.parametrize("method", list(ID_CALLS))
@pytest.mark.parametrize("bad", BAD_IDS, ids=_ids(BAD_IDS))
def test_bad_ids_are_refused_everywhere(
    ledger: Ledger, seeded: Seeded, db_path: Path, method: str, bad: Any
) -> None:
    assert_refused(db_path, lambda: ID_CALLS[method](ledger, bad), bad)


@pytest.mark.parametrize("method", [m for m in ID_CALLS if not m.startswith("create_task")])
def test_none_id_is_refused(ledger: Ledger, seeded: Seeded, db_path: Path, method: str) -> None:
    assert_refused(db_path, lambda: ID_CALLS[method](ledger, None))


@pytest.mark.parametrize(
    "spell",
    [
        str.upper,
        lambda s: "{" + s.upper() + "}",
        lambda s: "urn:uuid:" + s.upper(),
        lambda s: s.replace("-", ""),
        lambda s: "{" * 200 + s + "}" * 200,
    ],
    ids=["upper", "braced", "urn", "bare-hex", "many-braces"],
)
def test_other_uuid_spellings_are_valid_and_canonicalised(
    ledger: Ledger, seeded: Seeded, db_path: Path, spell: Callable[[str], str]
) -> None:
    before = logical_dump(db_path)
    task = ledger.get_task(spell(seeded.queued))
    assert task.id == seeded.queued
    assert task == ledger.get_task(seeded.queued)
    children = ledger.children_of(spell(seeded.queued))
    assert [c.id for c in children] == [seeded.child]
    assert logical_dump(db_path) == before


@pytest.mark.parametrize(
    "spelling",
    [
        " 0000001000040008000000000000001",
        "+0000001000040008000000000000001",
        "0x000001000040008000000000000001",
        "0000001000040008000000000000001\t",
        "\u0660" + "0000001000040008000000000000001",  # an Arabic-Indic zero
    ],
    ids=["space", "plus", "0x", "tab", "arabic-indic-zero"],
)
def test_the_peers_rarer_uuid_spellings_name_the_same_task(ledger: Ledger, spelling: str) -> None:
    """The peer parses ids with uuid.UUID (int(hex, 16) underneath), which
    takes whitespace, a sign, 0x and any Unicode digit in the 32 places."""
    task = ledger.create_task(task_id="00000001-0000-4000-8000-000000000001")
    assert ledger.get_task(spelling) == task


@pytest.mark.parametrize(
    "spelling",
    ["-0000001000040008000000000000001", "0x00000001000040008000000000000001", "0" * 31 + "g"],
)
def test_what_the_peers_parser_refuses_stays_invalid(ledger: Ledger, spelling: str) -> None:
    with pytest.raises(InvalidInput):
        ledger.get_task(spelling)


def test_upper_case_id_finds_the_task_for_writes_too(ledger: Ledger, seeded: Seeded) -> None:
    started = ledger.start_task(seeded.queued.upper())
    assert started.id == seeded.queued
    assert started.status is TaskStatus.RUNNING
    fresh = "0A1B2C3D-4E5F-6071-8293-A4B5C6D7E8F9"
    created = ledger.create_task(task_id=fresh, parent_id=seeded.queued.upper())
    assert created.id == fresh.lower()
    assert created.parent_id == seeded.queued


# --------------------------------------------------------------------------
# create_task


CREATE_CASES: list[tuple[str, Any]] = [
    *[("payload_hash", v) for v in BAD_HASHES],
    *[("timeout_seconds", v) for v in BAD_TIMEOUTS],
    *[("delivery_required", v) for v in [1, 0, 1.0, "yes", "", None, "True"]],
    *[("tenant", v) for v in BAD_NAMES],
    *[
        (name, v)
        for name in ("llm_calls_budget", "token_budget", "cost_budget_micros", "max_attempts")
        for v in BAD_AMOUNTS
    ],
    ("max_attempts", None),
]


@pytest.mark.parametrize(
    ("field", "bad"), CREATE_CASES, ids=[f"{f}={v!r:.30}" for f, v in CREATE_CASES]
)
def test_create_task_refuses_bad_values(
    ledger: Ledger, seeded: Seeded, db_path: Path, field: str, bad: Any
) -> None:
    assert_refused(db_path, lambda: ledger.create_task(**{field: bad}), bad)


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("tenant", ""),
        ("tenant", MARKER + " "),
        ("llm_calls_budget", -1),
        ("timeout_seconds", math.nan),
        ("payload_hash", HASH.upper()),
        ("delivery_required", 1),
        ("max_attempts", True),
    ],
)
@pytest.mark.parametrize("target", ["queued", "running", "succeeded", "closed"])
def test_recreate_of_an_existing_id_still_validates(
    ledger: Ledger, seeded: Seeded, db_path: Path, target: str, field: str, bad: Any
) -> None:
    """The idempotent path must not skip validation (arguments come first)."""
    task_id = getattr(seeded, target)
    assert_refused(db_path, lambda: ledger.create_task(task_id=task_id, **{field: bad}), bad)


@pytest.mark.parametrize("parent", ["queued", "running", "succeeded", "closed"])
def test_bad_child_of_existing_parent_writes_nothing(
    ledger: Ledger, seeded: Seeded, db_path: Path, parent: str
) -> None:
    parent_id = getattr(seeded, parent)
    assert_refused(db_path, lambda: ledger.create_task(parent_id=parent_id, tenant="a b"))
    assert_refused(db_path, lambda: ledger.create_task(parent_id=parent_id, token_budget=-1))
    assert [c.id for c in ledger.children_of(parent_id)] == (
        [seeded.child] if parent == "queued" else []
    )


# --------------------------------------------------------------------------
# start_task, heartbeat, close_task, set_delivery


@pytest.mark.parametrize("target", ["queued", "running", "succeeded"])
@pytest.mark.parametrize("bad", BAD_NAMES, ids=_ids(BAD_NAMES))
def test_bad_worker_is_refused(
    ledger: Ledger, seeded: Seeded, db_path: Path, target: str, bad: Any
) -> None:
    task_id = getattr(seeded, target)
    assert_refused(db_path, lambda: ledger.heartbeat(task_id, worker=bad), bad)
    status = "succeeded" if target == "succeeded" else "failed"
    assert_refused(db_path, lambda: ledger.close_task(task_id, status, worker=bad), bad)


@pytest.mark.parametrize("target", ["queued", "running", "succeeded"])
@pytest.mark.parametrize("bad", BAD_ATTEMPTS, ids=_ids(BAD_ATTEMPTS))
def test_bad_attempt_is_refused(
    ledger: Ledger, seeded: Seeded, db_path: Path, target: str, bad: Any
) -> None:
    task_id = getattr(seeded, target)
    assert_refused(db_path, lambda: ledger.heartbeat(task_id, attempt=bad), bad)
    status = "succeeded" if target == "succeeded" else "failed"
    assert_refused(db_path, lambda: ledger.close_task(task_id, status, attempt=bad), bad)


@pytest.mark.parametrize("target", ["queued", "running", "succeeded", "closed"])
@pytest.mark.parametrize(
    "bad",
    BAD_TASK_STATUSES + NON_TERMINAL_STATUSES,
    ids=_ids(BAD_TASK_STATUSES) + NON_TERMINAL_STATUSES,
)
def test_close_task_refuses_bad_status(
    ledger: Ledger, seeded: Seeded, db_path: Path, target: str, bad: Any
) -> None:
    task_id = getattr(seeded, target)
    assert_refused(db_path, lambda: ledger.close_task(task_id, bad), bad)


@pytest.mark.parametrize("target", ["queued", "running"])
@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled", "timed_out"])
@pytest.mark.parametrize("bad", BAD_CODES, ids=_ids(BAD_CODES))
def test_close_task_refuses_bad_code_on_active_tasks(
    ledger: Ledger, seeded: Seeded, db_path: Path, target: str, status: str, bad: Any
) -> None:
    task_id = getattr(seeded, target)
    assert_refused(db_path, lambda: ledger.close_task(task_id, status, code=bad), bad)
    assert ledger.get_task(task_id).status is TaskStatus(target)


@pytest.mark.parametrize(
    ("status", "code"),
    [
        ("succeeded", "worker_failed"),
        ("succeeded", "caller_cancelled"),
        ("failed", "completed"),
        ("cancelled", "worker_completed"),
        ("timed_out", "transport_acknowledged"),
        ("succeeded", "internal_task"),
    ],
)
def test_close_task_refuses_code_of_another_status(
    ledger: Ledger, seeded: Seeded, db_path: Path, status: str, code: str
) -> None:
    assert_refused(db_path, lambda: ledger.close_task(seeded.running, status, code=code))


@pytest.mark.parametrize("target", ["queued", "running", "succeeded", "internal", "closed"])
@pytest.mark.parametrize("bad", BAD_DELIVERY_STATUSES, ids=_ids(BAD_DELIVERY_STATUSES))
def test_set_delivery_refuses_bad_status(
    ledger: Ledger, seeded: Seeded, db_path: Path, target: str, bad: Any
) -> None:
    task_id = getattr(seeded, target)
    assert_refused(db_path, lambda: ledger.set_delivery(task_id, bad), bad)


@pytest.mark.parametrize(
    ("target", "status"),
    [("succeeded", "delivered"), ("succeeded", "failed"), ("internal", "not_applicable")],
)
@pytest.mark.parametrize(
    "bad",
    [*BAD_CODES, "internal_task", "worker_completed"],
    ids=_ids([*BAD_CODES, "internal_task", "worker_completed"]),
)
def test_set_delivery_refuses_bad_code(
    ledger: Ledger, seeded: Seeded, db_path: Path, target: str, status: str, bad: Any
) -> None:
    task_id = getattr(seeded, target)
    if (status, bad) == ("not_applicable", "internal_task"):
        bad = "transport_acknowledged"
    assert_refused(db_path, lambda: ledger.set_delivery(task_id, status, code=bad), bad)
    assert ledger.get_task(task_id).delivery_status is DeliveryStatus.PENDING


@pytest.mark.parametrize("odd", [5, b"x", 1.5], ids=repr)
def test_a_code_that_is_not_text_is_ignored_or_outranked_like_the_peer(
    ledger: Ledger, seeded: Seeded, db_path: Path, odd: Any
) -> None:
    """The same terminal status again ignores the code, whatever it is; a
    state conflict is reported before the code is judged (peer rules)."""
    closed = ledger.get_task(seeded.closed)
    assert ledger.close_task(seeded.closed, closed.status, code=odd) == closed
    assert ledger.set_delivery(seeded.closed, closed.delivery_status, code=odd) == closed
    other = "failed" if closed.status is not TaskStatus.FAILED else "succeeded"
    before = logical_dump(db_path)
    with pytest.raises(StateConflict):
        ledger.close_task(seeded.closed, other, code=odd)
    with pytest.raises(StateConflict):
        ledger.set_delivery(seeded.running, "delivered", code=odd)
    assert logical_dump(db_path) == before
    assert_refused(db_path, lambda: ledger.close_task(seeded.running, "failed", code=odd))


def test_accepted_aliases_and_enums_are_not_bad_input(ledger: Ledger, seeded: Seeded) -> None:
    """``completed`` is an alias of ``succeeded``: a positive control for the lists above."""
    done = ledger.close_task(seeded.queued, "completed", code="completed")
    assert done.status is TaskStatus.SUCCEEDED
    again = ledger.close_task(seeded.running, TaskStatus.FAILED)
    assert again.status is TaskStatus.FAILED
    assert ledger.set_delivery(seeded.succeeded, DeliveryStatus.FAILED).delivery_status is (
        DeliveryStatus.FAILED
    )


# --------------------------------------------------------------------------
# A misbehaving clock


class _Raising:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __call__(self) -> float:
        raise self.exc


BAD_CLOCKS: list[tuple[str, Callable[[], Any]]] = [
    ("nan", lambda: math.nan),
    ("inf", lambda: math.inf),
    ("-inf", lambda: -math.inf),
    ("str-abc", lambda: "abc"),
    ("str-marker", lambda: MARKER),
    ("str-nan", lambda: "nan"),
    ("none", lambda: None),
    ("list", lambda: []),
    ("object", object),
    ("huge-int", lambda: 10**400),
]

WRITES: dict[str, Callable[[Ledger, Seeded], object]] = {
    "create": lambda led, s: led.create_task(),
    "create-child": lambda led, s: led.create_task(parent_id=s.queued),
    "start": lambda led, s: led.start_task(s.queued),
    "heartbeat": lambda led, s: led.heartbeat(s.running),
    "close-queued": lambda led, s: led.close_task(s.queued, "cancelled"),
    "close-running": lambda led, s: led.close_task(s.running, "failed", code="worker_failed"),
    "delivery": lambda led, s: led.set_delivery(s.succeeded, "delivered"),
    "delivery-internal": lambda led, s: led.set_delivery(s.internal, "not_applicable"),
}


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize(("label", "bad_clock"), BAD_CLOCKS, ids=[c[0] for c in BAD_CLOCKS])
def test_bad_clock_value_is_invalid_input_and_writes_nothing(
    seeded: Seeded,
    db_path: Path,
    write: str,
    label: str,
    bad_clock: Callable[[], Any],
) -> None:
    with Ledger(db_path, clock=bad_clock) as other:
        assert_refused(db_path, lambda: WRITES[write](other, seeded))


# The peer reads its clock as ``float(clock())`` and takes a TypeError,
# ValueError or OverflowError from either step for a bad time: InvalidInput.
BAD_VALUE_ERRORS = [ValueError, TypeError, OverflowError]
# Anything else reaches the caller as raised: Ctrl-C stays a
# KeyboardInterrupt that no retry loop catching InvalidInput swallows.
RAISED = [RuntimeError, ZeroDivisionError, KeyboardInterrupt, SystemExit]


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("raised", BAD_VALUE_ERRORS, ids=[r.__name__ for r in BAD_VALUE_ERRORS])
def test_a_clock_raising_a_bad_value_error_is_invalid_input_as_in_the_peer(
    seeded: Seeded, db_path: Path, write: str, raised: type[BaseException]
) -> None:
    with Ledger(db_path, clock=_Raising(raised(MARKER))) as other:
        refusal = assert_refused(db_path, lambda: WRITES[write](other, seeded))
    assert str(refusal) == "clock returned an invalid timestamp"


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("raised", RAISED, ids=[r.__name__ for r in RAISED])
def test_a_raising_clock_passes_its_own_exception_and_writes_nothing(
    seeded: Seeded, db_path: Path, write: str, raised: type[BaseException]
) -> None:
    """As from any Python callable (and as in the peer): the caller gets the
    clock's exception itself; nothing is written."""
    before = logical_dump(db_path)
    with (
        Ledger(db_path, clock=_Raising(raised(MARKER))) as other,
        pytest.raises(raised, match=MARKER),
    ):
        WRITES[write](other, seeded)
    assert logical_dump(db_path) == before


class _FloatRaises:
    """A value whose conversion to a number raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __float__(self) -> float:
        raise self.exc

    def __index__(self) -> int:
        raise self.exc


INTERRUPTS = [KeyboardInterrupt, SystemExit]


@pytest.mark.parametrize("raised", INTERRUPTS, ids=[r.__name__ for r in INTERRUPTS])
def test_a_conversion_interrupted_passes_the_interrupt_through(
    seeded: Seeded, db_path: Path, raised: type[BaseException]
) -> None:
    """A clock's value, a number of seconds or an amount whose conversion
    is interrupted (Ctrl-C) is not bad input: the exception itself reaches
    the caller, as in the peer, and nothing is written."""
    value = _FloatRaises(raised(MARKER))
    before = logical_dump(db_path)
    clocked = Ledger(db_path, clock=lambda: value)
    calls: list[Callable[[Ledger], object]] = [
        lambda led: clocked.create_task(),
        lambda led: led.create_task(timeout_seconds=value),
        lambda led: led.reconcile(active_grace_seconds=value, delivery_grace_seconds=1),
        lambda led: led.charge(seeded.running, tokens=value),
    ]
    with Ledger(db_path) as ledger:
        for call in calls:
            with pytest.raises(raised, match=MARKER):
                call(ledger)
    clocked.close()
    assert logical_dump(db_path) == before


class _IntComparisonRaises(int):
    """A busy timeout whose own comparison raises ``exc``."""

    exc: BaseException = KeyboardInterrupt()

    def __lt__(self, other: object) -> bool:
        raise self.exc


@pytest.mark.parametrize("raised", INTERRUPTS, ids=[r.__name__ for r in INTERRUPTS])
def test_a_busy_timeout_whose_comparison_is_interrupted_passes_it_through(
    db_path: Path, raised: type[BaseException]
) -> None:
    """As in the peer, which compares the value with 0 itself; nothing is
    made. A raising comparison was taken for bad input."""
    value = _IntComparisonRaises(5)
    value.exc = raised(MARKER)
    with pytest.raises(raised, match=MARKER):
        Ledger(db_path, busy_timeout_ms=value)
    assert not db_path.exists()


class _InterruptedSpelling(str):
    """A task id in a rarer spelling the peer accepts (a leading sign),
    whose parsing by ``uuid.UUID`` is interrupted."""

    def replace(self, *args: Any, **kwargs: Any) -> str:
        raise KeyboardInterrupt(MARKER)


def test_an_interrupted_task_id_parse_passes_the_interrupt_through(
    seeded: Seeded, db_path: Path
) -> None:
    """Ctrl-C while an id in a rarer spelling is parsed is no bad input:
    it reaches the caller (a retry loop catching InvalidInput must not
    swallow it), as in the peer."""
    spelled = _InterruptedSpelling("+" + seeded.queued[1:])
    with Ledger(db_path) as ledger, pytest.raises(KeyboardInterrupt, match=MARKER):
        ledger.get_task(spelled)


CONVERSION_ERRORS = [*BAD_VALUE_ERRORS, RuntimeError, ZeroDivisionError]


@pytest.mark.parametrize("raised", CONVERSION_ERRORS, ids=[r.__name__ for r in CONVERSION_ERRORS])
def test_a_conversion_raising_an_error_is_invalid_input(
    seeded: Seeded, db_path: Path, raised: type[BaseException]
) -> None:
    """An argument that cannot become a number is bad input, whatever error
    its conversion raises (for a TypeError, ValueError or OverflowError, as
    in the peer; the peer passes other errors of a value through: README,
    differences)."""
    value = _FloatRaises(raised(MARKER))
    with Ledger(db_path) as ledger:
        assert_refused(db_path, lambda: ledger.create_task(timeout_seconds=value))
        assert_refused(db_path, lambda: ledger.charge(seeded.running, tokens=value))


@pytest.mark.parametrize("raised", CONVERSION_ERRORS, ids=[r.__name__ for r in CONVERSION_ERRORS])
def test_a_clock_value_whose_conversion_fails_is_judged_as_the_clock_is(
    seeded: Seeded, db_path: Path, raised: type[BaseException]
) -> None:
    """The peer converts the clock's value in the same ``try`` as the call:
    a TypeError, ValueError or OverflowError is InvalidInput, any other
    error reaches the caller as raised. Nothing is written either way."""
    value = _FloatRaises(raised(MARKER))
    with Ledger(db_path, clock=lambda: value) as other:
        if raised in BAD_VALUE_ERRORS:
            assert_refused(db_path, other.create_task)
        else:
            before = logical_dump(db_path)
            with pytest.raises(raised, match=MARKER):
                other.create_task()
            assert logical_dump(db_path) == before


def test_deadline_overflow_at_start_is_invalid_input(
    ledger: Ledger, clock: FrozenClock, db_path: Path
) -> None:
    task = ledger.create_task(timeout_seconds=1.7976931348623157e308)
    clock.now = 1e308
    assert_refused(db_path, lambda: ledger.start_task(task.id))
    assert ledger.get_task(task.id).status is TaskStatus.QUEUED


# --------------------------------------------------------------------------
# The constructor


class _BytesPath:
    def __fspath__(self) -> bytes:
        return b"ledger.db"


CTOR_PATHS: list[Any] = [
    None,
    b"bytes.db",
    "",
    ":memory:",
    "a\0b.db",
    Path("nul\0.db"),
    5,
    object(),
    _BytesPath(),
]

CTOR_KWARGS: list[dict[str, Any]] = [
    *[
        {"busy_timeout_ms": v}
        for v in [-1, True, False, 1.5, 5.0, "100", None, math.nan, 2**63, 2**64, -(2**63)]
    ],
    *[{"read_only": v} for v in [1, 0, "yes", None]],
    *[{"allow_external_acl": v} for v in [1, 0, "yes", None]],
    *[{"durability": v} for v in ["fast", "FULL", "", "normal ", MARKER, 5, None]],
    *[{"snapshot_max_bytes": v} for v in [-1, True, 1.5, "1", math.inf, 2**64]],
    *[{"clock": v} for v in [5, MARKER, None, 1.5]],
]


@pytest.fixture
def fresh_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "fresh"
    directory.mkdir(mode=0o700)
    monkeypatch.chdir(directory)
    yield directory


def _open_and_close(path: Any, **kwargs: Any) -> None:
    with Ledger(path, **kwargs):
        pass


@pytest.mark.parametrize("path", CTOR_PATHS, ids=_ids(CTOR_PATHS))
def test_constructor_refuses_bad_paths(fresh_dir: Path, path: Any) -> None:
    before = sorted(os.listdir(fresh_dir))
    with pytest.raises(InvalidInput) as info:
        _open_and_close(path)
    assert isinstance(info.value, ValueError)
    assert MARKER not in str(info.value)
    assert sorted(os.listdir(fresh_dir)) == before == []


def test_a_path_too_long_for_sqlite_is_refused_before_any_folder_is_made(
    fresh_dir: Path,
) -> None:
    """SQLite opens full paths of up to 512 bytes, sidecar suffix included:
    the longest such path works, one byte more is bad input, and the missing
    folders on the way to it are not created first."""
    folders = "/".join(["d" * 100] * 4)
    longest = f"{fresh_dir}/{folders}/"
    longest += "x" * (512 - len("-journal") - len(longest))
    with pytest.raises(InvalidInput, match="too long"):
        _open_and_close(longest + "x")
    assert os.listdir(fresh_dir) == []
    _open_and_close(longest)
    assert os.path.exists(longest)


@pytest.mark.parametrize("kwargs", CTOR_KWARGS, ids=[repr(k)[:40] for k in CTOR_KWARGS])
def test_constructor_refuses_bad_options(fresh_dir: Path, kwargs: dict[str, Any]) -> None:
    target = fresh_dir / "ledger.db"
    with pytest.raises(InvalidInput) as info:
        _open_and_close(target, **kwargs)
    assert isinstance(info.value, ValueError)
    assert MARKER not in str(info.value)
    assert os.listdir(fresh_dir) == []


@pytest.mark.parametrize("kwargs", CTOR_KWARGS[:13], ids=[repr(k)[:40] for k in CTOR_KWARGS[:13]])
def test_constructor_refuses_bad_options_on_an_existing_ledger(
    seeded: Seeded, db_path: Path, kwargs: dict[str, Any]
) -> None:
    before_files = sorted(os.listdir(db_path.parent))
    assert_refused(db_path, lambda: _open_and_close(db_path, **kwargs))
    assert sorted(os.listdir(db_path.parent)) == before_files


def test_read_only_open_of_a_missing_file_creates_nothing(fresh_dir: Path) -> None:
    with pytest.raises(InvalidInput):
        _open_and_close(fresh_dir / "missing.db", read_only=True)
    assert os.listdir(fresh_dir) == []


BAD_BUSY_TIMEOUTS = CTOR_KWARGS[:11]


@pytest.mark.parametrize("kwargs", BAD_BUSY_TIMEOUTS, ids=[repr(k)[:40] for k in BAD_BUSY_TIMEOUTS])
def test_in_memory_ledger_judges_the_busy_timeout_like_a_file_ledger(
    fresh_dir: Path, kwargs: dict[str, Any]
) -> None:
    """A test suite on ``Ledger.in_memory()`` must not accept a value that
    ``Ledger(path)`` then refuses in production: same rule, same message."""
    with pytest.raises(InvalidInput) as on_file:
        _open_and_close(fresh_dir / "ledger.db", **kwargs)
    with pytest.raises(InvalidInput) as in_memory:
        Ledger.in_memory(**kwargs)
    assert str(in_memory.value) == str(on_file.value)
    assert str(on_file.value).startswith("busy_timeout_ms ")


# Each integer or seconds argument, a value it refuses, and the call.
NAMED_REFUSALS: list[tuple[str, Callable[[Ledger, Seeded, Any], Any], Any]] = [
    ("max_attempts", lambda lg, s, v: lg.create_task(max_attempts=v), None),
    ("llm_calls_budget", lambda lg, s, v: lg.create_task(llm_calls_budget=v), -1),
    ("token_budget", lambda lg, s, v: lg.create_task(token_budget=v), 1.5),
    ("cost_budget_micros", lambda lg, s, v: lg.create_task(cost_budget_micros=v), True),
    ("timeout_seconds", lambda lg, s, v: lg.create_task(timeout_seconds=v), -1),
    ("timeout_seconds", lambda lg, s, v: lg.create_task(timeout_seconds=v), math.nan),
    ("calls", lambda lg, s, v: lg.charge(s.running, calls=v), "2"),
    ("tokens", lambda lg, s, v: lg.charge(s.running, tokens=v), -5),
    ("cost_micros", lambda lg, s, v: lg.grant(s.running, cost_micros=v), 2**64),
    ("attempt", lambda lg, s, v: lg.heartbeat(s.running, attempt=v), -1),
    ("limit", lambda lg, s, v: lg.claim_next("w", limit=v), "10"),
    ("limit", lambda lg, s, v: lg.list_tasks(limit=v), 1.5),
    (
        "active_grace_seconds",
        lambda lg, s, v: lg.reconcile(active_grace_seconds=v, delivery_grace_seconds=1),
        -1,
    ),
    (
        "delivery_grace_seconds",
        lambda lg, s, v: lg.reconcile(active_grace_seconds=1, delivery_grace_seconds=v),
        True,
    ),
    ("older_than_seconds", lambda lg, s, v: lg.purge(older_than_seconds=v), math.inf),
]


@pytest.mark.parametrize(
    ("name", "call", "value"),
    NAMED_REFUSALS,
    ids=[f"{n}={v!r}" for n, _, v in NAMED_REFUSALS],
)
def test_a_refused_number_names_its_argument_not_its_value(
    ledger: Ledger,
    seeded: Seeded,
    db_path: Path,
    name: str,
    call: Callable[[Ledger, Seeded, Any], Any],
    value: Any,
) -> None:
    """With four integer arguments on ``create_task``, the message must say
    which one was refused (and still never echo the value)."""
    refused = assert_refused(db_path, lambda: call(ledger, seeded, value), value)
    assert str(refused).startswith(f"{name} "), str(refused)


def test_a_reconcile_policy_names_its_refused_field() -> None:
    refusal = r"^delivery_grace_seconds must be a finite nonnegative number$"
    with pytest.raises(InvalidInput, match=refusal):
        ReconcilePolicy(delivery_grace_seconds=-1)


@pytest.mark.parametrize("value", [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1])
def test_huge_busy_timeout_is_refused_or_kept_exactly(fresh_dir: Path, value: int) -> None:
    """A timeout beyond SQLite's C int must be InvalidInput or honoured, never a
    panic or a silent wrap."""
    target = fresh_dir / "ledger.db"
    try:
        with Ledger(target, busy_timeout_ms=value) as opened:
            assert opened.storage_info()["busy_timeout_ms"] == value
    except InvalidInput:
        assert os.listdir(fresh_dir) == []


# --------------------------------------------------------------------------
# The CLI


def _cli_refused(capfd: pytest.CaptureFixture[str], db_path: Path | None, argv: list[str]) -> None:
    before = logical_dump(db_path) if db_path is not None and db_path.exists() else None
    capfd.readouterr()
    code, parsed, text = run_cli(*argv)
    captured = capfd.readouterr()
    assert code == 2
    assert parsed == {"error": "InvalidInput", "ok": False}
    assert text == REFUSED_LINE
    assert MARKER not in text
    assert MARKER not in captured.out
    assert MARKER not in captured.err
    assert captured.err == ""
    if db_path is not None and before is not None:
        assert logical_dump(db_path) == before


CLI_CASES: list[list[str]] = [
    # global arguments and subcommands
    [],
    [MARKER],
    ["--" + MARKER, "init"],
    ["--busy-timeout-ms", "-1", "init"],
    ["--busy-timeout-ms", MARKER, "init"],
    ["--busy-timeout-ms", "1.5", "init"],
    ["--busy-timeout-ms", "99999999999999999999", "init"],
    ["init", MARKER],
    ["init", "--" + MARKER],
    ["init", "--allow-external-acl"],  # global flag after the subcommand
    # create
    ["create", "--task-id", MARKER],
    ["create", "--task-id", "abc"],
    ["create", "--task-id", _CANON[:-1] + "g"],
    ["create", "--parent-id", MARKER],
    ["create", "--payload-sha256", MARKER],
    ["create", "--payload-sha256", HASH.upper()],
    ["create", "--payload-sha256", "a" * 63],
    ["create", "--timeout-seconds", "nan"],
    ["create", "--timeout-seconds", "inf"],
    ["create", "--timeout-seconds", "-1"],
    ["create", "--timeout-seconds", "1e400"],
    ["create", "--timeout-seconds", MARKER],
    ["create", "--tenant", "a b"],
    ["create", "--tenant", MARKER + " "],
    ["create", "--tenant", MARKER + "/x"],
    ["create", "--tenant", ""],
    ["create", "--tenant", "a" * 129],
    ["create", "--tenant", "caf\u00e9"],
    ["create", "--llm-calls-budget", "-1"],
    ["create", "--llm-calls-budget", "99999999999999999999"],
    ["create", "--llm-calls-budget", "1.5"],
    ["create", "--llm-calls-budget", MARKER],
    ["create", "--token-budget", "-1"],
    ["create", "--token-budget", str(2**63)],
    ["create", "--cost-budget-micros", "-1"],
    ["create", "--cost-budget-micros", MARKER],
    ["create", "--max-attempts", "-1"],
    ["create", "--max-attempts", "nan"],
    ["create", "--internal", "yes"],
    ["create", "--" + MARKER],
    ["create", "--format", MARKER],
    # start / get / heartbeat
    *[[cmd, bad] for cmd in ("start", "get", "heartbeat") for bad in (MARKER, "abc", "")],
    ["start"],
    ["get"],
    ["heartbeat"],
    ["get", "{queued}", MARKER],
    ["start", "{queued}", "--" + MARKER],
    ["heartbeat", "{running}", "--worker", "a b"],
    ["heartbeat", "{running}", "--worker", MARKER + "/x"],
    ["heartbeat", "{running}", "--worker", ""],
    ["heartbeat", "{running}", "--attempt", "-1"],
    ["heartbeat", "{running}", "--attempt", "1.5"],
    ["heartbeat", "{running}", "--attempt", MARKER],
    # close
    ["close", MARKER, "--status", "failed"],
    ["close", "{queued}"],
    ["close", "{queued}", "--status", "bogus"],
    ["close", "{queued}", "--status", MARKER],
    ["close", "{queued}", "--status", "queued"],
    ["close", "{queued}", "--status", "SUCCEEDED"],
    ["close", "{queued}", "--status", "succeeded", "--code", "Bad Code"],
    ["close", "{queued}", "--status", "succeeded", "--code", MARKER],
    ["close", "{queued}", "--status", "succeeded", "--code", "created"],
    ["close", "{queued}", "--status", "succeeded", "--code", "x" * 65],
    ["close", "{running}", "--status", "failed", "--code", "nope"],
    ["close", "{running}", "--status", "failed", "--worker", "a b"],
    ["close", "{running}", "--status", "failed", "--worker", MARKER + " "],
    ["close", "{running}", "--status", "failed", "--attempt", "-1"],
    ["close", "{running}", "--status", "failed", "--attempt", MARKER],
    # delivery
    ["delivery", MARKER, "--status", "delivered"],
    ["delivery", "{succeeded}"],
    ["delivery", "{succeeded}", "--status", "pending"],
    ["delivery", "{succeeded}", "--status", MARKER],
    ["delivery", "{succeeded}", "--status", "delivered", "--code", "Bad Code"],
    ["delivery", "{succeeded}", "--status", "delivered", "--code", MARKER],
    ["delivery", "{succeeded}", "--status", "delivered", "--code", "created"],
    ["delivery", "{internal}", "--status", "not_applicable", "--code", "nope"],
]


@pytest.mark.parametrize("argv", CLI_CASES, ids=[" ".join(a)[:60] or "<none>" for a in CLI_CASES])
def test_cli_refuses_bad_arguments(
    seeded: Seeded, db_path: Path, capfd: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    ids = {f: getattr(seeded, f) for f in ("queued", "running", "succeeded", "internal")}
    filled = [a.format(**ids) if a.startswith("{") else a for a in argv]
    _cli_refused(capfd, db_path, ["--db", str(db_path), *filled])


@pytest.mark.parametrize(
    "argv",
    [
        ["get", _CANON],
        ["create"],
        ["init"],
        ["start", _CANON],
    ],
)
def test_cli_without_db_is_refused_and_creates_nothing(
    fresh_dir: Path, capfd: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    _cli_refused(capfd, None, argv)
    assert os.listdir(fresh_dir) == []


@pytest.mark.parametrize(
    "db",
    ["", ":memory:", "a\0b.db"],
    ids=["empty", "memory", "nul"],
)
def test_cli_refuses_bad_db_paths(
    fresh_dir: Path, capfd: pytest.CaptureFixture[str], db: str
) -> None:
    _cli_refused(capfd, None, ["--db", db, "init"])
    assert os.listdir(fresh_dir) == []


PARSE_ERRORS: list[list[str]] = [
    [],
    [MARKER],
    ["--" + MARKER, "init"],
    ["--busy-timeout-ms", MARKER, "init"],
    ["--busy-timeout-ms", "-1", "init"],
    ["create", "--llm-calls-budget", MARKER],
    ["create", "--timeout-seconds", MARKER],
    ["close", _CANON, "--status", MARKER],
    ["delivery", _CANON, "--status", "pending"],
    ["heartbeat", _CANON, "--attempt", MARKER],
]


@pytest.mark.parametrize(
    "argv", PARSE_ERRORS, ids=[" ".join(a)[:60] or "<none>" for a in PARSE_ERRORS]
)
def test_cli_argument_errors_create_no_file(
    fresh_dir: Path, capfd: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    target = fresh_dir / "ledger.db"
    _cli_refused(capfd, None, ["--db", str(target), *argv])
    assert os.listdir(fresh_dir) == []


@pytest.mark.parametrize("value", ["2147483648", "4294967295"])
def test_cli_huge_busy_timeout_is_a_clean_answer(
    fresh_dir: Path, capfd: pytest.CaptureFixture[str], value: str
) -> None:
    """Past SQLite's int: the InvalidInput line with exit 2, never a crash,
    and no file made."""
    target = fresh_dir / "ledger.db"
    code, _, text = run_cli("--db", str(target), "--busy-timeout-ms", value, "init")
    captured = capfd.readouterr()
    assert captured.err == ""
    assert (code, text) == (2, REFUSED_LINE)
    assert os.listdir(fresh_dir) == []


def test_cli_text_format_errors_do_not_echo_either(
    seeded: Seeded, db_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    before = logical_dump(db_path)
    code, _, text = run_cli("--db", str(db_path), "get", MARKER, "--format", "text")
    captured = capfd.readouterr()
    assert code == 2
    assert "InvalidInput" in text
    assert MARKER not in text + captured.out + captured.err
    assert logical_dump(db_path) == before


def test_cli_accepts_an_upper_case_id(seeded: Seeded, db_path: Path) -> None:
    code, parsed, _ = run_cli("--db", str(db_path), "get", seeded.queued.upper())
    assert code == 0
    assert parsed["ok"] is True
    assert parsed["task"]["id"] == seeded.queued


# --------------------------------------------------------------------------
# Property: random values on create_task

_NAME_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
_HASH_RE = re.compile(r"[0-9a-f]{64}")
_I64 = 2**63

VALID, INVALID, EITHER = "valid", "invalid", "either"

_marked_text = st.text(max_size=12).map(lambda s: s + MARKER)
_strings = st.one_of(st.text(max_size=140), _marked_text)
_numbers = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=0, max_value=10**6),
    st.floats(),
    st.floats(min_value=0, max_value=1e6),
    st.text(max_size=8),
    st.sampled_from(["5", "1e400", "nan", "-1", "inf", " 7 ", MARKER, 10**400]),
)

_SPELLINGS: dict[str, Callable[[str], str]] = {
    "canonical": str,
    "upper": str.upper,
    "braced": lambda s: "{" + s + "}",
    "urn": lambda s: "urn:uuid:" + s,
    "hex": lambda s: s.replace("-", ""),
}


def _amount_validity(value: Any) -> str:
    if value is None:
        return VALID
    if isinstance(value, bool):
        return INVALID
    if isinstance(value, int):
        return VALID if 0 <= value < _I64 else INVALID
    if isinstance(value, float):
        if value == 0 and math.copysign(1.0, value) < 0:
            return EITHER  # -0.0: neither clearly negative nor clearly fine
        ok = math.isfinite(value) and value.is_integer() and 0 <= value < _I64
        return VALID if ok else INVALID
    return INVALID


def _timeout_validity(value: Any) -> str:
    if value is None:
        return VALID
    if isinstance(value, bool):
        return INVALID
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return INVALID
    if not math.isfinite(number) or number < 0:
        return INVALID
    return VALID


def _pattern_validity(value: Any, pattern: re.Pattern[str]) -> str:
    if value is None:
        return VALID
    if isinstance(value, str) and pattern.fullmatch(value):
        return VALID
    return INVALID


@st.composite
def _create_kwargs(draw: st.DrawFn, parents: list[str]) -> tuple[dict[str, Any], list[str], str]:
    kwargs: dict[str, Any] = {}
    verdicts: list[str] = []
    text_values: list[str] = []

    id_kind = draw(st.sampled_from(["absent", "fresh", "text"]))
    if id_kind == "fresh":
        spell = draw(st.sampled_from(sorted(_SPELLINGS)))
        kwargs["task_id"] = _SPELLINGS[spell](str(uuid.uuid4()))
        verdicts.append(VALID)
    elif id_kind == "text":
        kwargs["task_id"] = draw(_strings)
        verdicts.append(INVALID)

    parent_kind = draw(st.sampled_from(["absent", "existing", "text"]))
    if parent_kind == "existing":
        spell = draw(st.sampled_from(sorted(_SPELLINGS)))
        kwargs["parent_id"] = _SPELLINGS[spell](draw(st.sampled_from(parents)))
        verdicts.append(VALID)
    elif parent_kind == "text":
        kwargs["parent_id"] = draw(_strings)
        verdicts.append(INVALID)

    if draw(st.booleans()):
        tenant = draw(st.one_of(st.from_regex(_NAME_RE, fullmatch=True), _strings, _numbers))
        kwargs["tenant"] = tenant
        verdicts.append(_pattern_validity(tenant, _NAME_RE))
    if draw(st.booleans()):
        digest = draw(st.one_of(st.from_regex(_HASH_RE, fullmatch=True), _strings, _numbers))
        kwargs["payload_hash"] = digest
        verdicts.append(_pattern_validity(digest, _HASH_RE))
    if draw(st.booleans()):
        timeout = draw(_numbers)
        kwargs["timeout_seconds"] = timeout
        verdicts.append(_timeout_validity(timeout))
    if draw(st.booleans()):
        flag = draw(st.one_of(st.booleans(), _numbers))
        kwargs["delivery_required"] = flag
        verdicts.append(VALID if isinstance(flag, bool) else INVALID)
    for name in ("llm_calls_budget", "token_budget", "cost_budget_micros", "max_attempts"):
        if draw(st.booleans()):
            amount = draw(_numbers)
            kwargs[name] = amount
            verdict = _amount_validity(amount)
            if name == "max_attempts" and amount is None:
                verdict = INVALID
            elif name == "max_attempts" and verdict == VALID and amount == 0:
                verdict = EITHER  # the spec sets no lower bound above zero
            verdicts.append(verdict)

    for value in kwargs.values():
        if isinstance(value, str) and MARKER in value:
            text_values.append(value)
    if INVALID in verdicts:
        overall = INVALID
    elif EITHER in verdicts:
        overall = EITHER
    else:
        overall = VALID
    return kwargs, text_values, overall


def test_create_task_random_values_succeed_or_are_refused_cleanly(
    ledger: Ledger, seeded: Seeded, db_path: Path
) -> None:
    parents = [seeded.queued, seeded.running, seeded.succeeded, seeded.closed]

    @settings(max_examples=150, deadline=None, database=None)
    @given(case=_create_kwargs(parents))
    def run(case: tuple[dict[str, Any], list[str], str]) -> None:
        kwargs, marked, expected = case
        before = logical_dump(db_path)
        try:
            task = ledger.create_task(**kwargs)
        except InvalidInput as exc:
            assert expected != VALID, f"valid arguments refused: {kwargs!r}"
            assert MARKER not in str(exc)
            for value in marked:
                assert value not in str(exc)
            assert logical_dump(db_path) == before
        else:
            assert expected != INVALID, f"invalid arguments accepted: {kwargs!r}"
            assert ledger.get_task(task.id) == task

    run()


_REGISTRY = [
    "caller_cancelled",
    "completed",
    "created",
    "deadline_exceeded",
    "delivery_grace_expired",
    "internal_task",
    "restart_stale",
    "started",
    "transport_acknowledged",
    "transport_failed",
    "worker_completed",
    "worker_failed",
    "claimed",
    "released",
    "requeued",
    "needs_input",
    "escalated_manually",
    "budget_exhausted",
    "attempts_exhausted",
    "worker_lost",
    "budget_granted",
]
_ALLOWED = {
    "succeeded": {"completed", "worker_completed"},
    "failed": {"worker_failed"},
    "timed_out": {"deadline_exceeded", "restart_stale"},
    "cancelled": {"caller_cancelled"},
}


def test_close_task_random_codes_succeed_or_are_refused_cleanly(
    ledger: Ledger, db_path: Path
) -> None:
    @settings(max_examples=120, deadline=None, database=None)
    @given(
        status=st.sampled_from(sorted(_ALLOWED)),
        code=st.one_of(
            st.none(),
            st.sampled_from(_REGISTRY),
            _strings,
            st.from_regex(r"[a-z0-9_]{1,20}", fullmatch=True),
        ),
        start=st.booleans(),
    )
    def run(status: str, code: Any, start: bool) -> None:
        task = ledger.create_task()
        if start:
            ledger.start_task(task.id)
        before = logical_dump(db_path)
        if code is None or code in _ALLOWED[status]:
            expected = VALID
        elif status == "timed_out" and code == "worker_lost":
            expected = EITHER
        else:
            expected = INVALID
        try:
            closed = ledger.close_task(task.id, status, code=code)
        except InvalidInput as exc:
            assert expected != VALID, f"valid code refused: {status} {code!r}"
            assert MARKER not in str(exc)
            assert logical_dump(db_path) == before
        except StateConflict:
            pytest.fail(f"StateConflict for {status} {code!r}")
        else:
            assert expected != INVALID, f"invalid code accepted: {status} {code!r}"
            assert closed.status is TaskStatus(status)
            assert closed.terminal_code == code

    run()


# --------------------------------------------------------------------------
# Flags take a bool, and a refusal names the flag in the peer's words


OPEN_FLAGS = ("read_only", "allow_external_acl", "create", "migrate")
CALL_FLAGS: dict[str, Callable[[Ledger], Any]] = {
    "delivery_required": lambda lg: lg.create_task(delivery_required=1),
    "dry_run": lambda lg: lg.reconcile(
        active_grace_seconds=1.0, delivery_grace_seconds=1.0, dry_run=1
    ),
}


@pytest.mark.parametrize("value", [1, None])
@pytest.mark.parametrize("flag", OPEN_FLAGS)
def test_an_open_flag_that_is_not_a_bool_is_named(tmp_path: Path, flag: str, value: Any) -> None:
    with pytest.raises(InvalidInput, match=rf"^{flag} must be bool$"):
        Ledger(tmp_path / "flags.db", **{flag: value})
    assert not (tmp_path / "flags.db").exists()


@pytest.mark.parametrize("flag", sorted(CALL_FLAGS))
def test_a_call_flag_that_is_not_a_bool_is_named(tmp_path: Path, flag: str) -> None:
    path = tmp_path / "flags.db"
    with Ledger(path) as ledger:
        ledger.create_task()
        before = logical_dump(path)
        with pytest.raises(InvalidInput, match=rf"^{flag} must be bool$"):
            CALL_FLAGS[flag](ledger)
    assert logical_dump(path) == before


# --------------------------------------------------------------------------
# taskwarden's own arguments of one kind are told apart by name

NAMED_REFUSALS: dict[str, tuple[Callable[[Ledger, str], Any], str]] = {
    "expected": (lambda lg, t: lg.transition(t, expected="bogus", to="running"), "expected"),
    "to": (lambda lg, t: lg.transition(t, expected="queued", to="bogus"), "to"),
    "status": (lambda lg, t: lg.list_tasks(status="bogus"), "status"),
    "tenant": (lambda lg, t: lg.list_tasks(tenant="a b"), "tenant"),
    "owner": (lambda lg, t: lg.list_tasks(owner="a b"), "owner"),
    "parent_id": (lambda lg, t: lg.list_tasks(parent_id="x"), "parent_id"),
    "after": (lambda lg, t: lg.list_tasks(after="x"), "after"),
    "worker_lost": (
        lambda lg, t: lg.reconcile(
            active_grace_seconds=1.0, delivery_grace_seconds=1.0, worker_lost="a b"
        ),
        "worker_lost",
    ),
}


@pytest.mark.parametrize("argument", sorted(NAMED_REFUSALS))
def test_a_refusal_names_which_argument_of_its_kind(argument: str) -> None:
    call, name = NAMED_REFUSALS[argument]
    with Ledger.in_memory() as mem:
        task = mem.create_task()
        with pytest.raises(InvalidInput, match=rf"^{name} (is not|must be) "):
            call(mem, task.id)


def _grace(lg: Ledger, task_id: str, name: Any) -> Any:
    return lg.reconcile(active_grace_seconds=1.0, delivery_grace_seconds=1.0, tenant=name)


# Every call that takes a tenant or worker name: a refusal says which one.
NAME_ARGUMENTS: dict[str, tuple[Callable[[Ledger, str, Any], Any], str]] = {
    "create_task(tenant)": (lambda lg, t, n: lg.create_task(tenant=n), "tenant"),
    "claim(worker)": (lambda lg, t, n: lg.claim(t, n), "worker"),
    "claim_next(worker)": (lambda lg, t, n: lg.claim_next(n), "worker"),
    "claim_next(tenant)": (lambda lg, t, n: lg.claim_next("w", tenant=n), "tenant"),
    "release(worker)": (lambda lg, t, n: lg.release(t, n), "worker"),
    "heartbeat(worker)": (lambda lg, t, n: lg.heartbeat(t, worker=n), "worker"),
    "charge(worker)": (lambda lg, t, n: lg.charge(t, worker=n), "worker"),
    "close_task(worker)": (lambda lg, t, n: lg.close_task(t, "failed", worker=n), "worker"),
    "list_tasks(tenant)": (lambda lg, t, n: lg.list_tasks(tenant=n), "tenant"),
    "list_tasks(owner)": (lambda lg, t, n: lg.list_tasks(owner=n), "owner"),
    "reconcile(tenant)": (_grace, "tenant"),
    "purge(tenant)": (lambda lg, t, n: lg.purge(older_than_seconds=1, tenant=n), "tenant"),
    "stats(tenant)": (lambda lg, t, n: lg.stats(tenant=n), "tenant"),
}


@pytest.mark.parametrize("bad", ["a b", "", 5], ids=["space", "empty", "int"])
@pytest.mark.parametrize("call", sorted(NAME_ARGUMENTS))
def test_a_refused_name_says_whether_it_was_the_tenant_or_the_worker(
    tmp_path: Path, call: str, bad: Any
) -> None:
    run, name = NAME_ARGUMENTS[call]
    path = tmp_path / "names.db"
    with Ledger(path) as ledger:
        task = ledger.create_task()
        before = logical_dump(path)
        with pytest.raises(InvalidInput, match=rf"^{name} must be 1-128 characters of "):
            run(ledger, task.id, bad)
    assert logical_dump(path) == before
