"""Differential test: taskwarden against task-state-guard 0.1.0 on the peer's
public (drop-in) surface.

One peer ``Ledger`` and one taskwarden ``Ledger``, each on its own file in its
own 0700 directory, receive the same random sequence of the peer's public calls
(valid and invalid arguments alike) at the same, fully controlled clock
readings. Every observable is compared after every call:

- the outcome (a value, or the exception's class name and where it sits in the
  hierarchy: ``LedgerError`` / ``ValueError`` / ``LookupError``);
- every field of a returned ``Task`` (the peer's sixteen, by exact ``repr`` for
  floats, so ``-0.0`` and ``5`` versus ``5.0`` count), ``to_dict()`` with and
  without the payload hash (the peer's keys), and its JSON text;
- ``reconcile`` reports, whole;
- ``doctor()`` on the peer's keys (the schema version is 2 versus 3 by design;
  the extra status counts of taskwarden must be 0);
- how many times the call read the clock (a stepping test clock sees that).

Programs also reopen both ledgers, open read-only handles beside them, and
copy the peer's file as it stands to check taskwarden's read-only preview of
it (which must leave the bytes alone) and its migration (the migrated copy
must answer and go on like the peer's own copy). Static checks cover names,
bases, fields, method signatures, ``payload_fingerprint``, ``ReconcilePolicy``
and constructor validation; a second random test drives both CLIs with the
same argv and compares exit codes and JSON (times masked: the CLI reads the
wall clock).

Differences that taskwarden documents on purpose (README, "Compatibility with
task-state-guard 0.1.0") are not exercised: its generated ids are UUIDv7
(compared through labels, never by value), ``str()`` of a status, slots, the
schema version, read-only handles answering from their opening snapshot. Its
added surface is kept out too: the status aliases (``completed`` would close a
task where the peer refuses) and the added ``worker_lost`` code for
``timed_out``.

Where the peer crashes (a raw ``OverflowError`` from ``float(10**400)``, a
``UnicodeEncodeError`` for a lone surrogate, a ``busy_timeout_ms`` SQLite
silently turns into 0) taskwarden's ``InvalidInput`` is accepted (SPEC §2.4).

Run: ``python -m pytest tests/test_peer_differential.py``. ``TW_DIFF_EXAMPLES`` sets the
number of random programs (default 150), ``TW_DIFF_CLI_EXAMPLES`` the CLI
programs (default 40); ``TW_DIFF_RANDOM=1`` draws new ones instead of the
fixed, derandomized set.
"""

from __future__ import annotations

import contextlib
import decimal
import fractions
import json
import math
import os
import shutil
import tempfile
import uuid
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

tsg = pytest.importorskip("task_state_guard")
import taskwarden as tw  # noqa: E402

from .conftest import PEER_TASK_FIELDS  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)

PEER, OURS = "peer", "ours"
LIBS = {PEER: tsg, OURS: tw}

EXAMPLES = int(os.environ.get("TW_DIFF_EXAMPLES", "150"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=os.environ.get("TW_DIFF_RANDOM") != "1",
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

PEER_DOCTOR_SKIP = {"schema_version"}  # 2 versus 3, by design

START = 1_800_000_000.0
POOL = [str(uuid.UUID(int=(0x5EED << 96) + i * 0x1_0001_0001 + 1)) for i in range(4)]
UNKNOWN = "0badc0de-0000-4000-8000-000000000000"
HEX = "ab" * 32


# -- the clock ---------------------------------------------------------------


class _Raise:
    """A clock reading that raises (a fresh exception each time)."""

    def __init__(self, kind: type[BaseException]) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"raises {self.kind.__name__}"


class Clock:
    """Returns ``now`` (or, for one call of the ledger, ``glitch``); counts reads."""

    _NONE = object()

    def __init__(self) -> None:
        self.now = START
        self.reads = 0
        self.glitch: Any = self._NONE

    def __call__(self) -> Any:
        self.reads += 1
        if self.glitch is self._NONE:
            return self.now
        if isinstance(self.glitch, _Raise):
            raise self.glitch.kind("clock unavailable")
        return self.glitch


# -- argument vocabularies -----------------------------------------------------


def _forms(canonical: str) -> dict[str, str]:
    bare = canonical.replace("-", "")
    return {
        "canonical": canonical,
        "upper": canonical.upper(),
        "braces": "{" + canonical + "}",
        "urn": "urn:uuid:" + canonical,
        "bare": bare,
    }


ID_FORMS = list(_forms(POOL[0]))
RAW_IDS: list[Any] = [
    UNKNOWN,
    UNKNOWN.upper(),
    "not-a-uuid",
    "",
    " ",
    POOL[0] + "0",
    POOL[0][:-1],
    "urn:uuid:",
    None,
    7,
    b"\x00" * 16,
    uuid.UUID(POOL[0]),
    ["x"],
]


class Enumerated:
    """A status given as the library's own enum member (resolved per library)."""

    def __init__(self, kind: str, name: str) -> None:
        self.kind, self.name = kind, name

    def resolve(self, lib: Any) -> Any:
        return getattr(getattr(lib, self.kind), self.name)

    def __repr__(self) -> str:
        return f"{self.kind}.{self.name}"


class Foreign(Enumerated):
    """A status given as the *other* library's enum member (both are ``str``)."""

    def resolve(self, lib: Any) -> Any:
        other = tw if lib is tsg else tsg
        return getattr(getattr(other, self.kind), self.name)

    def __repr__(self) -> str:
        return f"other.{self.kind}.{self.name}"


TASK_STATUSES: list[Any] = [
    "succeeded",
    "failed",
    "timed_out",
    "cancelled",
    "queued",
    "running",
    "blocked",
    "escalated",
    "pending",
    "in_progress",
    "SUCCEEDED",
    "Succeeded",
    " succeeded",
    "bogus",
    "",
    None,
    3,
    *(
        Enumerated("TaskStatus", n)
        for n in ("SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "QUEUED", "RUNNING")
    ),
    Foreign("TaskStatus", "FAILED"),
]
DELIVERY_STATUSES: list[Any] = [
    "delivered",
    "failed",
    "not_applicable",
    "pending",
    "DELIVERED",
    "bogus",
    "",
    None,
    0,
    *(
        Enumerated("DeliveryStatus", n)
        for n in ("DELIVERED", "FAILED", "NOT_APPLICABLE", "PENDING")
    ),
    Foreign("DeliveryStatus", "NOT_APPLICABLE"),
]
CODES: list[Any] = [
    None,
    *sorted(tsg.model.ALLOWED_REASON_CODES),
    "worker_lost",
    "claimed",
    "needs_input",
    "budget_exhausted",  # taskwarden's own
    "Worker_Completed",
    "not a code",
    "",
    "x" * 65,
    "unknown_code",
    5,
    b"completed",
]
TIMEOUTS: list[Any] = [
    None,
    0,
    0.0,
    -0.0,
    0.5,
    5,
    5.0,
    120.0,
    600,
    3600.0,
    1e308,
    2**63,
    2**64 + 1,
    "5",
    " 7 ",
    "1_0",
    "1e3",
    "nan",
    "inf",
    "-1",
    "five",
    "",
    True,
    False,
    -1,
    -0.5,
    math.nan,
    math.inf,
    -math.inf,
    10**400,
    decimal.Decimal("2.5"),
    fractions.Fraction(1, 3),
    [],
    b"5",
]
HASHES: list[Any] = [
    None,
    HEX,
    "cd" * 32,
    HEX.upper(),
    HEX[:-1],
    HEX + "0",
    "g" * 64,
    HEX.encode(),
    5,
    "",
]
FLAGS: list[Any] = [True, False, 1, 0, None, "yes"]
GRACES: list[Any] = [
    0,
    0.0,
    -0.0,
    0.5,
    1,
    30.0,
    599.0,
    600,
    600.0,
    601.0,
    86400.0,
    1e9,
    1e308,
    "5",
    "600",
    True,
    False,
    -1,
    -1e-9,
    math.nan,
    math.inf,
    None,
    10**400,
    "x",
    [],
    decimal.Decimal("1.5"),
]
CLOCK_STEPS = [
    0.0,
    0.001,
    0.5,
    1.0,
    59.0,
    119.0,
    120.0,
    121.0,
    599.0,
    600.0,
    601.0,
    3600.0,
    86400.0,
    -0.001,
    -1.0,
    -700.0,
]
CLOCK_SETS: list[float] = [0.0, -0.0, -100.0, 5e-324, START, 1e12, 1e300, 1.7e308]


class FloatRaises:
    """A value whose ``float()`` raises ``kind`` (the peer lets all but
    TypeError, ValueError and OverflowError through)."""

    def __init__(self, kind: type[Exception]) -> None:
        self.kind = kind

    def __float__(self) -> float:
        raise self.kind("conversion failed")

    def __repr__(self) -> str:
        return f"<float() raises {self.kind.__name__}>"


CLOCK_GLITCHES: list[Any] = [
    None,
    math.nan,
    math.inf,
    -math.inf,
    "12.5",
    "abc",
    True,
    10**400,
    7,
    [],
    decimal.Decimal("1.5"),
    b"12",
    _Raise(RuntimeError),
    _Raise(ValueError),
    _Raise(TypeError),
    _Raise(OverflowError),
    FloatRaises(ValueError),
    FloatRaises(TypeError),
    FloatRaises(RuntimeError),
    FloatRaises(ZeroDivisionError),
]


# -- operations ----------------------------------------------------------------

refs = st.one_of(
    st.tuples(st.just("pool"), st.integers(0, len(POOL) - 1), st.sampled_from(ID_FORMS)),
    st.tuples(st.just("gen"), st.integers(0, 2), st.sampled_from(ID_FORMS)),
    st.tuples(st.just("raw"), st.sampled_from(RAW_IDS)),
)
# Mostly pool ids, so that programs act on tasks that exist.
task_refs = st.one_of(
    st.tuples(st.just("pool"), st.integers(0, len(POOL) - 1), st.just("canonical")),
    st.tuples(st.just("pool"), st.integers(0, len(POOL) - 1), st.just("canonical")),
    refs,
)
opt_refs = st.one_of(st.none(), task_refs)


def _status_text(value: Any) -> str | None:
    if isinstance(value, Enumerated):
        return value.resolve(tsg).value
    return value if isinstance(value, str) else None


@st.composite
def close_ops(draw: Any) -> tuple[Any, ...]:
    status = draw(st.sampled_from(TASK_STATUSES))
    code = draw(st.sampled_from(CODES))
    if _status_text(status) == "timed_out" and code == "worker_lost":
        code = None  # taskwarden's added code (SPEC §3): a superset, not a divergence
    return ("close", draw(task_refs), status, code)


# Arbitrary fractions too: a threshold computed as ``updated + grace <= now``
# instead of the peer's ``updated <= now - grace`` rounds differently.
fractions_of_seconds = st.floats(min_value=0.0, max_value=5000.0, allow_nan=False)
VALID_TIMEOUTS: list[Any] = [None, None, 0, 0.5, 5, 5.0, 120.0, 600, 3600.0]
VALID_GRACES: list[Any] = [0, 0.0, 1.0, 30.0, 120.0, 599.0, 600, 600.0, 601.0, 86400.0]
VALID_CLOSE: dict[str, list[Any]] = {
    "succeeded": [None, "completed", "worker_completed"],
    "failed": [None, "worker_failed"],
    "timed_out": [None, "deadline_exceeded", "restart_stale"],
    "cancelled": [None, "caller_cancelled"],
}
VALID_DELIVERY: dict[str, list[Any]] = {
    "delivered": [None, "transport_acknowledged"],
    "failed": [None, "transport_failed", "delivery_grace_expired"],
    "not_applicable": [None, "internal_task"],
}
pool_refs = st.tuples(st.just("pool"), st.integers(0, len(POOL) - 1), st.just("canonical"))

valid_create = st.tuples(
    st.just("create"),
    st.fixed_dictionaries(
        {"task_id": st.one_of(pool_refs, pool_refs, pool_refs, st.none())},
        optional={
            "parent_id": st.one_of(st.none(), pool_refs),
            "payload_hash": st.sampled_from([None, HEX, "cd" * 32]),
            "timeout_seconds": st.sampled_from(VALID_TIMEOUTS),
            "delivery_required": st.booleans(),
        },
    ),
)
any_create = st.tuples(
    st.just("create"),
    st.fixed_dictionaries(
        {},
        optional={
            "task_id": st.one_of(st.none(), task_refs, task_refs),
            "parent_id": opt_refs,
            "payload_hash": st.sampled_from(HASHES),
            "timeout_seconds": st.sampled_from(TIMEOUTS),
            "delivery_required": st.sampled_from(FLAGS),
        },
    ),
)
valid_close = st.sampled_from(sorted(VALID_CLOSE)).flatmap(
    lambda status: st.tuples(
        st.just("close"), task_refs, st.just(status), st.sampled_from(VALID_CLOSE[status])
    )
)
valid_delivery = st.sampled_from(sorted(VALID_DELIVERY)).flatmap(
    lambda status: st.tuples(
        st.just("delivery"), task_refs, st.just(status), st.sampled_from(VALID_DELIVERY[status])
    )
)
# The delivery outcome the task allows (found at run time: delivered or failed
# for a delivery-required task, not_applicable for an internal one).
fitting_delivery = st.tuples(
    st.just("delivery"),
    pool_refs,
    st.sampled_from(["fit:delivered", "fit:failed"]),
    st.just("fit"),
)
valid_reconcile = st.tuples(
    st.just("reconcile"),
    st.one_of(st.sampled_from(VALID_GRACES), fractions_of_seconds),
    st.one_of(st.sampled_from(VALID_GRACES), fractions_of_seconds),
    st.booleans(),
    st.booleans(),
)
any_reconcile = st.tuples(
    st.just("reconcile"),
    st.sampled_from(GRACES),
    st.sampled_from(GRACES),
    st.sampled_from([False, True, None, 1, 0, "yes", "default"]),
    st.booleans(),
)
clock_moves = st.one_of(
    st.tuples(st.just("advance"), st.sampled_from(CLOCK_STEPS)),
    st.tuples(st.just("advance"), st.sampled_from(CLOCK_STEPS[:13])),
    st.tuples(st.just("advance"), fractions_of_seconds),
)

# Valid calls outnumber the others about three to one, so that programs reach
# every state; hypothesis shrinks towards the first alternatives.
ops = st.one_of(
    valid_create,
    valid_create,
    any_create,
    st.tuples(st.just("start"), task_refs),
    st.tuples(st.just("start"), pool_refs),
    st.tuples(st.just("start"), pool_refs),
    st.tuples(st.just("heartbeat"), pool_refs),
    st.tuples(st.just("heartbeat"), pool_refs),
    st.tuples(st.just("heartbeat"), task_refs),
    valid_close,
    valid_close,
    valid_close,
    close_ops(),
    fitting_delivery,
    fitting_delivery,
    fitting_delivery,
    valid_delivery,
    st.tuples(
        st.just("delivery"),
        task_refs,
        st.sampled_from(DELIVERY_STATUSES),
        st.sampled_from(CODES),
    ),
    valid_reconcile,
    valid_reconcile,
    any_reconcile,
    clock_moves,
    clock_moves,
    clock_moves,
    st.tuples(st.just("set_clock"), st.sampled_from(CLOCK_SETS)),
    st.tuples(st.just("glitch"), st.sampled_from(CLOCK_GLITCHES)),
    st.tuples(st.just("get"), task_refs),
    st.tuples(st.just("children"), task_refs),
    st.tuples(st.just("doctor")),
    st.tuples(st.just("storage_info")),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("read_only")),
    st.tuples(st.just("migrate")),
)


# -- normalisation ---------------------------------------------------------------


class Side:
    """One library's ledger, clock and id labels."""

    def __init__(
        self, name: str, base: Path, *, copy_of: Side | None = None, read_only: bool = False
    ) -> None:
        self.name = name
        self.lib = LIBS[name]
        self.dir = Path(tempfile.mkdtemp(prefix=name + "-", dir=base))
        os.chmod(self.dir, 0o700)
        self.path = self.dir / "ledger.db"
        self.clock = Clock()
        self.generated: list[str] = []
        if copy_of is not None:  # a copy of another side's (closed, sidecar-free) file
            shutil.copy2(copy_of.path, self.path)
            self.clock.now = copy_of.clock.now
            self.generated = list(copy_of.generated)
        self.ledger = self.lib.Ledger(self.path, clock=self.clock, read_only=read_only)

    def close(self) -> None:
        closer = getattr(self.ledger, "close", None)
        if closer is not None:
            closer()

    def resolve(self, ref: Any) -> Any:
        if ref is None:
            return None
        kind = ref[0]
        if kind == "pool":
            return _forms(POOL[ref[1]])[ref[2]]
        if kind == "gen":
            canonical = self.generated[ref[1]] if ref[1] < len(self.generated) else UNKNOWN
            return _forms(canonical)[ref[2]]
        return ref[1]

    def label(self, value: Any) -> Any:
        if isinstance(value, str):
            if value in POOL:
                return f"P{POOL.index(value)}"
            if value in self.generated:
                return f"G{self.generated.index(value)}"
        return value


def value_key(value: Any) -> Any:
    """Type and value, exact for floats (``repr`` tells -0.0 and 0.0 apart)."""
    if isinstance(value, Enum):
        return ("enum", value.value, isinstance(value, str))
    if type(value) is float:
        return ("float", repr(value))
    return (type(value).__name__, value)


def task_key(side: Side, task: Any) -> dict[str, Any]:
    out = {}
    for name in PEER_TASK_FIELDS:
        value = getattr(task, name)
        if name in ("id", "parent_id"):
            value = side.label(value)
        out[name] = value_key(value)
    for include in (False, True):
        data = task.to_dict(include_payload_hash=include)
        keys = [k for k in data if k in _PEER_DICT_KEYS[include]]
        subset = {k: data[k] for k in keys}
        for k in ("id", "parent_id"):
            subset[k] = side.label(subset[k])
        out[f"to_dict({include})"] = {k: value_key(v) for k, v in subset.items()}
        out[f"json({include})"] = json.dumps(subset, sort_keys=True)
        out[f"missing({include})"] = sorted(_PEER_DICT_KEYS[include] - set(data))
    return out


def _peer_dict_keys(include: bool) -> set[str]:
    sample = tsg.Task(
        id=POOL[0],
        parent_id=None,
        status=tsg.TaskStatus.QUEUED,
        delivery_status=tsg.DeliveryStatus.PENDING,
        delivery_required=True,
        payload_hash=None,
        timeout_seconds=None,
        created_at=0.0,
        started_at=None,
        updated_at=0.0,
        ended_at=None,
        deadline_at=None,
        delivery_updated_at=0.0,
        terminal_code=None,
        delivery_code=None,
        version=0,
    )
    return set(sample.to_dict(include_payload_hash=include))


_PEER_DICT_KEYS = {False: _peer_dict_keys(False), True: _peer_dict_keys(True)}


def error_key(side: Side, exc: BaseException) -> tuple[Any, ...]:
    return (
        "raise",
        type(exc).__name__,
        isinstance(exc, side.lib.LedgerError),
        isinstance(exc, ValueError),
        isinstance(exc, LookupError),
        # The clock's own exception is passed on with its text.
        None if isinstance(exc, side.lib.LedgerError) else str(exc),
    )


def doctor_key(side: Side, report: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in report.items():
        if key in PEER_DOCTOR_SKIP:
            continue
        if key.endswith("_status_counts"):
            extra = {k: v for k, v in value.items() if k not in _PEER_COUNT_KEYS[key]}
            assert not any(extra.values()), (side.name, key, extra)  # only peer statuses here
            value = {k: v for k, v in value.items() if k in _PEER_COUNT_KEYS[key]}
        elif side.name == OURS and key not in _PEER_DOCTOR_KEYS:
            assert value == 0, (key, value)  # taskwarden's own checks find nothing
            continue
        out[key] = value
    return out


_PEER_COUNT_KEYS = {
    "task_status_counts": {s.value for s in tsg.TaskStatus},
    "delivery_status_counts": {s.value for s in tsg.DeliveryStatus},
}
_PEER_DOCTOR_KEYS = {
    "healthy",
    "quick_check",
    "schema_version",
    "schema_ok",
    "task_count",
    "event_count",
    "task_status_counts",
    "delivery_status_counts",
    "orphan_count",
    "parent_cycle_count",
    "foreign_key_error_count",
    "state_inconsistency_count",
    "timestamp_inconsistency_count",
    "event_inconsistency_count",
    "doctor_error_count",
}


def result_key(side: Side, value: Any) -> Any:
    if isinstance(value, side.lib.Task):
        return ("task", task_key(side, value))
    if isinstance(value, list):
        # children_of orders by (created_at, id): ids differ between the two
        # libraries only for generated ids, so compare in label order and
        # check each side's own order separately.
        own = [(t.created_at, t.id) for t in value]
        assert own == sorted(own), (side.name, "children_of order")
        keys = [task_key(side, t) for t in value]
        return ("list", sorted(keys, key=lambda k: (k["created_at"], str(k["id"]))))
    if isinstance(value, dict):
        return ("dict", {k: value_key(v) for k, v in value.items()})
    return ("value", value_key(value))


# -- running one call on both sides ----------------------------------------------------


def call(side: Side, op: tuple[Any, ...]) -> Any:
    name = op[0]
    led = side.ledger
    if name == "create":
        kwargs = dict(op[1])
        for key in ("task_id", "parent_id"):
            if key in kwargs:
                kwargs[key] = side.resolve(kwargs[key])
        task = led.create_task(**kwargs)
        if "task_id" not in kwargs or kwargs["task_id"] is None:
            side.generated.append(task.id)
        return task
    if name == "get":
        return led.get_task(side.resolve(op[1]))
    if name == "children":
        return led.children_of(side.resolve(op[1]))
    if name == "start":
        return led.start_task(side.resolve(op[1]))
    if name == "heartbeat":
        return led.heartbeat(side.resolve(op[1]))
    if name == "close":
        status = op[2].resolve(side.lib) if isinstance(op[2], Enumerated) else op[2]
        return led.close_task(side.resolve(op[1]), status, code=op[3])
    if name == "delivery":
        status, code = op[2], op[3]
        if isinstance(status, Enumerated):
            status = status.resolve(side.lib)
        elif isinstance(status, str) and status.startswith("fit:"):
            internal = not led.get_task(side.resolve(op[1])).delivery_required
            status = "not_applicable" if internal else status[4:]
            code = None if code == "fit" else code
        return led.set_delivery(side.resolve(op[1]), status, code=code)
    if name == "reconcile":
        _, active, delivery, dry_run, via_policy = op
        extra = {} if dry_run == "default" else {"dry_run": dry_run}
        if via_policy:
            policy = side.lib.ReconcilePolicy(
                active_grace_seconds=active, delivery_grace_seconds=delivery
            )
            return side.lib.reconcile_restart(led, policy, **extra)
        return led.reconcile(active_grace_seconds=active, delivery_grace_seconds=delivery, **extra)
    if name == "doctor":
        return doctor_key(side, led.doctor())
    if name == "storage_info":
        info = led.storage_info()
        return {
            k: info[k]
            for k in ("journal_mode", "busy_timeout_ms", "foreign_keys", "permission_model")
        }
    raise AssertionError(name)


def outcome(side: Side, op: tuple[Any, ...]) -> tuple[Any, int]:
    before = side.clock.reads
    try:
        value = call(side, op)
    except Exception as exc:
        got: Any = error_key(side, exc)
    else:
        got = ("ok", result_key(side, value))
    finally:
        side.clock.glitch = Clock._NONE
    return got, side.clock.reads - before


def peer_crash_fixed(peer: Any, ours: Any) -> bool:
    """The peer lets a raw ``OverflowError`` out of its number validation
    (``float(10**400)``); SPEC §2.4 wants ``InvalidInput`` for bad input, and
    a superset may fix a crash. Only that pair is accepted."""
    return (
        peer[:3] == ("raise", "OverflowError", False)
        and peer[5] == "int too large to convert to float"
        and ours[:3] == ("raise", "InvalidInput", True)
    )


def compare(sides: dict[str, Side], op: tuple[Any, ...], trace: list[Any]) -> None:
    (peer, peer_reads), (ours, our_reads) = (outcome(sides[n], op) for n in (PEER, OURS))
    trace.append(op)
    if peer_crash_fixed(peer, ours):
        peer = ours
    if currently_in_test_context():
        event(f"{op[0]}: {peer[1] if peer[0] == 'raise' else 'ok'}")
    assert ours == peer, f"divergence after {trace!r}:\n  peer: {peer!r}\n  ours: {ours!r}"
    assert our_reads == peer_reads, (
        f"clock reads differ after {trace!r}: peer {peer_reads}, ours {our_reads}"
    )


def snapshot(sides: dict[str, Side], trace: list[Any]) -> None:
    """Every known id read back, with its children, and a doctor report."""
    n_gen = max(len(s.generated) for s in sides.values())
    for ref in [("pool", i, "canonical") for i in range(len(POOL))] + [
        ("gen", k, "canonical") for k in range(n_gen)
    ]:
        compare(sides, ("get", ref), trace)
        compare(sides, ("children", ref), trace)
        trace.pop()
        trace.pop()
    compare(sides, ("doctor",), trace)
    trace.pop()


def read_only_round(sides: dict[str, Side], trace: list[Any]) -> None:
    """A fresh read-only handle on each file answers like the other."""
    handles: dict[str, Any] = {}
    results = {}
    for name, side in sides.items():
        try:
            handles[name] = side.lib.Ledger(side.path, clock=side.clock, read_only=True)
            results[name] = ("ok",)
        except Exception as exc:
            results[name] = error_key(side, exc)
    assert results[OURS] == results[PEER], (trace, results)
    if len(handles) < 2:
        return
    saved = {name: side.ledger for name, side in sides.items()}
    try:
        for name, side in sides.items():
            side.ledger = handles[name]
        probes: list[tuple[Any, ...]] = [
            ("reconcile", 0.0, 0.0, True, False),
            ("reconcile", 600.0, 600.0, True, True),
            ("reconcile", 0.0, 0.0, False, False),
            ("create", {}),
            ("create", {"timeout_seconds": -1}),
            ("start", ("pool", 0, "canonical")),
            ("close", ("pool", 1, "canonical"), "cancelled", None),
            ("delivery", ("pool", 2, "canonical"), "failed", "bogus"),
            ("reconcile", -1.0, 0.0, False, False),
            ("reconcile", 0.0, 0.0, "yes", False),
            ("start", ("raw", UNKNOWN)),
            ("heartbeat", ("raw", "not-a-uuid")),
            ("close", ("raw", UNKNOWN), "succeeded", "bogus"),
            ("close", ("pool", 0, "canonical"), "running", None),
            ("delivery", ("raw", UNKNOWN), "delivered", None),
            ("delivery", ("pool", 0, "canonical"), "pending", None),
            ("create", {"task_id": ("pool", 0, "canonical")}),
            ("create", {"parent_id": ("raw", UNKNOWN)}),
        ]
        for probe in probes:
            compare(sides, probe, trace)
            trace.pop()
        snapshot(sides, trace)
    finally:
        for name, side in sides.items():
            side.ledger = saved[name]
            closer = getattr(handles[name], "close", None)
            if closer is not None:
                closer()


def file_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


MIGRATION_PROBES: list[tuple[Any, ...]] = [
    *[("start", ("pool", i, "canonical")) for i in range(len(POOL))],
    ("advance", 30.0),
    ("heartbeat", ("pool", 0, "canonical")),
    ("close", ("pool", 1, "canonical"), "succeeded", "worker_completed"),
    ("delivery", ("pool", 1, "canonical"), "fit:delivered", "fit"),
    ("create", {"task_id": ("pool", 3, "canonical"), "parent_id": ("pool", 0, "canonical")}),
    (
        "create",
        {"task_id": "0badc0de-0000-4000-8000-000000000001", "parent_id": ("pool", 2, "canonical")},
    ),
    ("advance", 600.0),
    ("reconcile", 600.0, 0.0, True, False),
    ("reconcile", 600.0, 0.0, False, False),
    ("reconcile", 600.0, 0.0, False, True),
    ("delivery", ("pool", 2, "canonical"), "fit:failed", "fit"),
]


def migration_round(sides: dict[str, Side], trace: list[Any]) -> None:
    """The peer's file as it stands, copied twice: previewed read-only by
    both libraries (taskwarden must not migrate it), then opened writable
    (taskwarden migrates it to v3) and driven on by both."""
    peer = sides[PEER]
    root = peer.dir.parent
    before = file_digest(peer.path)
    pair: dict[str, Side] = {}
    try:
        for name in (PEER, OURS):
            pair[name] = Side(name, root, copy_of=peer, read_only=True)
        for probe in [("reconcile", 600.0, 0.0, True, False), ("reconcile", 0.0, 0.0, True, True)]:
            compare(pair, probe, trace)
            trace.pop()
        snapshot(pair, trace)
        for name, side in pair.items():
            side.close()
            assert file_digest(side.path) == before, (name, "a read-only open changed the file")
            assert sorted(p.name for p in side.dir.iterdir()) == ["ledger.db"], name
            side.ledger = side.lib.Ledger(side.path, clock=side.clock)
        trace.append(("migrated",))
        snapshot(pair, trace)
        for probe in MIGRATION_PROBES:
            if probe[0] == "advance":
                for side in pair.values():
                    side.clock.now += probe[1]
                continue
            compare(pair, probe, trace)
            trace.pop()
        snapshot(pair, trace)
        trace.pop()
    finally:
        for side in pair.values():
            side.close()
            shutil.rmtree(side.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("differential")
    os.chmod(path, 0o700)
    return path


@st.composite
def setups(draw: Any) -> list[tuple[Any, ...]]:
    """Creates of the pool's first tasks (a parent always precedes its child),
    so that the random program finds tasks to act on."""
    out = []
    for i in range(draw(st.integers(1, len(POOL)))):
        kwargs = {
            "task_id": ("pool", i, "canonical"),
            "timeout_seconds": draw(
                st.one_of(st.sampled_from(VALID_TIMEOUTS), fractions_of_seconds)
            ),
            "delivery_required": draw(st.booleans()),
        }
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        if parent is not None:
            kwargs["parent_id"] = ("pool", parent, "canonical")
        out.append(("create", kwargs))
        if draw(st.booleans()):
            out.append(
                (
                    "advance",
                    draw(st.one_of(st.sampled_from(CLOCK_STEPS[:13]), fractions_of_seconds)),
                )
            )
    return out


@SETTINGS
@given(setup=setups(), program=st.lists(ops, min_size=8, max_size=40))
def test_same_calls_same_answers(
    base: Path, setup: list[tuple[Any, ...]], program: list[tuple[Any, ...]]
) -> None:
    program = setup + program
    root = Path(tempfile.mkdtemp(dir=base))
    sides = {name: Side(name, root) for name in (PEER, OURS)}
    trace: list[Any] = []
    try:
        for op in program:
            kind = op[0]
            if kind == "advance":
                for side in sides.values():
                    side.clock.now += op[1]
                trace.append(op)
            elif kind == "set_clock":
                for side in sides.values():
                    side.clock.now = op[1]
                trace.append(op)
            elif kind == "glitch":
                for side in sides.values():
                    side.clock.glitch = op[1]
                trace.append(op)
            elif kind == "snapshot":
                trace.append(op)
                snapshot(sides, trace)
            elif kind == "reopen":
                for side in sides.values():
                    side.close()
                    side.ledger = side.lib.Ledger(side.path, clock=side.clock)
                trace.append(op)
            elif kind == "read_only":
                trace.append(op)
                read_only_round(sides, trace)
            elif kind == "migrate":
                trace.append(op)
                migration_round(sides, trace)
            else:
                compare(sides, op, trace)
        for side in sides.values():
            side.clock.glitch = Clock._NONE
        trace.append(("final snapshot",))
        snapshot(sides, trace)
    finally:
        for side in sides.values():
            with contextlib.suppress(Exception):
                side.close()
        shutil.rmtree(root, ignore_errors=True)


# -- the static surface ------------------------------------------------------------


def test_peer_names_exist_with_the_same_bases() -> None:
    for name in tsg.__all__:
        assert hasattr(tw, name), name
    for name in ("LedgerError", "InvalidInput", "TaskNotFound", "StateConflict"):
        peer_cls, our_cls = getattr(tsg, name), getattr(tw, name)
        peer_bases = {c.__name__ for c in peer_cls.__mro__}
        our_bases = {c.__name__ for c in our_cls.__mro__}
        assert peer_bases <= our_bases, name
        for builtin in (ValueError, LookupError, Exception):
            assert issubclass(peer_cls, builtin) == issubclass(our_cls, builtin), (name, builtin)


def test_task_fields_and_enum_values() -> None:
    import dataclasses

    ours = [f.name for f in dataclasses.fields(tw.Task)]
    assert ours[: len(PEER_TASK_FIELDS)] == PEER_TASK_FIELDS
    assert [f.name for f in dataclasses.fields(tsg.Task)] == PEER_TASK_FIELDS
    for enum_name in ("TaskStatus", "DeliveryStatus"):
        peer_values = {m.name: m.value for m in getattr(tsg, enum_name)}
        our_values = {m.name: m.value for m in getattr(tw, enum_name)}
        assert peer_values.items() <= our_values.items()
        for member in getattr(tw, enum_name):
            assert member == member.value  # compares with strings as the peer's do


@pytest.mark.parametrize(
    "name",
    [
        "__init__",
        "create_task",
        "get_task",
        "children_of",
        "start_task",
        "heartbeat",
        "close_task",
        "set_delivery",
        "reconcile",
        "doctor",
        "storage_info",
    ],
)
def test_method_signatures_take_every_peer_call(name: str) -> None:
    """Each peer parameter exists with its kind and default; anything added
    is keyword-only with a default, so every peer call binds the same way."""
    import inspect

    peer = inspect.signature(getattr(tsg.Ledger, name)).parameters
    ours = inspect.signature(getattr(tw.Ledger, name)).parameters
    for pname, param in peer.items():
        assert pname in ours, pname
        assert (ours[pname].kind, ours[pname].default) == (param.kind, param.default), pname
    for pname, param in ours.items():
        if pname not in peer:
            assert param.kind is param.KEYWORD_ONLY and param.default is not param.empty, pname


def _both(fn: Any) -> dict[str, Any]:
    out = {}
    for name, lib in LIBS.items():
        try:
            value = fn(lib)
        except Exception as exc:
            out[name] = ("raise", type(exc).__name__, isinstance(exc, lib.LedgerError))
        else:
            out[name] = ("ok", value_key(value) if not isinstance(value, dict) else value)
    return out


@settings(max_examples=min(EXAMPLES, 200), deadline=None, derandomize=True)
@given(
    payload=st.one_of(
        st.text(max_size=20),
        st.binary(max_size=20),
        st.none(),
        st.integers(),
        st.binary(max_size=4).map(bytearray),
        st.binary(max_size=4).map(memoryview),
        st.sampled_from(["\ud800", "é", ""]),
    )
)
def test_payload_fingerprint(payload: Any) -> None:
    got = _both(lambda lib: lib.payload_fingerprint(payload))
    if got[PEER][:2] == ("raise", "UnicodeEncodeError"):
        # The peer crashes on a lone surrogate; SPEC §2.4 wants InvalidInput.
        assert got[OURS][:2] == ("raise", "InvalidInput")
        return
    assert got[OURS] == got[PEER]


@pytest.mark.parametrize("active", GRACES, ids=repr)
def test_reconcile_policy_validation(active: Any) -> None:
    def build(lib: Any) -> Any:
        policy = lib.ReconcilePolicy(active_grace_seconds=active, delivery_grace_seconds=active)
        return (value_key(policy.active_grace_seconds), value_key(policy.delivery_grace_seconds))

    got = _both(build)
    if got[PEER][:2] == ("raise", "OverflowError"):  # the peer's crash; SPEC §2.4
        assert got[OURS][:2] == ("raise", "InvalidInput")
        return
    assert got[OURS] == got[PEER]


CONSTRUCTOR_CASES: list[tuple[str, Any, dict[str, Any]]] = [
    ("empty path", "", {}),
    ("memory path", ":memory:", {}),
    ("bytes path", b"ledger.db", {}),
    ("nul in path", "led\x00ger.db", {}),
    ("int path", 5, {}),
    ("none path", None, {}),
    ("busy bool", "ok.db", {"busy_timeout_ms": True}),
    ("busy negative", "ok.db", {"busy_timeout_ms": -1}),
    ("busy float", "ok.db", {"busy_timeout_ms": 1.5}),
    ("busy whole float", "ok.db", {"busy_timeout_ms": 5.0}),
    ("busy str", "ok.db", {"busy_timeout_ms": "5"}),
    ("busy none", "ok.db", {"busy_timeout_ms": None}),
    ("busy zero", "ok.db", {"busy_timeout_ms": 0}),
    ("busy large", "ok.db", {"busy_timeout_ms": 2**40}),
    ("busy int32 max", "ok.db", {"busy_timeout_ms": 2**31 - 1}),
    ("relative dots", "adir/../ok.db", {}),
    ("nested dots", "adir/./x/../ok.db", {}),
    ("linked parent", "link/ok.db", {}),
    ("dots after a linked parent", "link/../ok.db", {}),
    ("link as the file", "link", {}),
    ("clock not callable", "ok.db", {"clock": 5}),
    ("clock none", "ok.db", {"clock": None}),
    ("acl int", "ok.db", {"allow_external_acl": 1}),
    ("acl none", "ok.db", {"allow_external_acl": None}),
    ("acl true", "ok.db", {"allow_external_acl": True}),
    ("read_only int", "ok.db", {"read_only": 1}),
    ("read_only missing file", "missing.db", {"read_only": True}),
    ("read_only missing dir", "nodir/missing.db", {"read_only": True}),
    ("new subdirectory", "sub/dir/new.db", {}),
    ("directory as file", "adir", {}),
]


@pytest.mark.parametrize(
    ("case", "path", "kwargs"), CONSTRUCTOR_CASES, ids=[c[0] for c in CONSTRUCTOR_CASES]
)
def test_constructor_validation(base: Path, case: str, path: Any, kwargs: dict[str, Any]) -> None:
    results = {}
    for name, lib in LIBS.items():
        root = Path(tempfile.mkdtemp(dir=base))
        (root / "adir").mkdir(mode=0o700)
        (root / "link").symlink_to("adir")
        full = root / path if isinstance(path, str) and path not in ("", ":memory:") else path
        if isinstance(path, str) and "\x00" in path:
            full = str(root) + "/" + path
        try:
            ledger = lib.Ledger(full, **kwargs)
        except Exception as exc:
            results[name] = ("raise", type(exc).__name__, isinstance(exc, lib.LedgerError))
        else:
            results[name] = (
                "ok",
                ledger.storage_info()["busy_timeout_ms"],
                str(Path(ledger.path).relative_to(root.resolve())),
            )
            getattr(ledger, "close", lambda: None)()
        results[name + " files"] = sorted(
            str(p.relative_to(root)) for p in root.rglob("*") if p.name not in ("adir", "link")
        )
        shutil.rmtree(root, ignore_errors=True)
    asked = kwargs.get("busy_timeout_ms")
    if results[PEER][:2] == ("ok", 0) and isinstance(asked, int) and asked > 2**31 - 1:
        # The peer hands SQLite a timeout it cannot hold: it silently becomes
        # 0 (no wait at all). taskwarden refuses it instead (README, differences).
        assert results[OURS][:2] == ("raise", "InvalidInput"), results
        return
    assert results[OURS] == results[PEER], results
    assert results[OURS + " files"] == results[PEER + " files"], results


# -- the CLI: same argv, same exit code and JSON ------------------------------------

CLI_TIME_KEYS = {name for name in PEER_TASK_FIELDS if name.endswith("_at")}
# Spellings of a number both CLIs must refuse (or, for "nan", judge alike).
CLI_BAD_NUMBERS = ["nan", "inf", "-1", "1e400", "abc", "", " 5"]
CLI_FLOATS = ["0", "3600", "600", "86400", "0.0", "0", "600", "86400", "1e9"]
CLI_FLOATS += [*CLI_BAD_NUMBERS, "1_0", "0x10"]
CLI_TIMEOUTS = ["0", "3600", "3600.0", "0", "3600", "-0", "1e9", *CLI_BAD_NUMBERS]
cli_ids = st.one_of(
    st.sampled_from([f"P{i}" for i in range(len(POOL))]),
    st.sampled_from([f"P{i}" for i in range(len(POOL))]),
    st.sampled_from([f"P{i}" for i in range(len(POOL))]),
    st.sampled_from(["G0", "G1"]),
    st.sampled_from([UNKNOWN, POOL[0].upper(), "{" + POOL[1] + "}", "nope", "", "-x"]),
)


@st.composite
def cli_commands(draw: Any) -> list[str]:
    command = draw(
        st.sampled_from(
            [
                "init",
                "create",
                "create",
                "create",
                "start",
                "start",
                "heartbeat",
                "close",
                "close",
                "delivery",
                "delivery",
                "reconcile",
                "reconcile",
                "doctor",
                "bogus",
            ]
        )
    )
    argv = [command]
    if command == "create":
        if draw(st.booleans()):
            argv += ["--task-id", draw(cli_ids)]
        if draw(st.booleans()):
            argv += ["--parent-id", draw(cli_ids)]
        if draw(st.booleans()):
            argv += ["--payload-sha256", draw(st.sampled_from([HEX, HEX, HEX.upper(), "x"]))]
        if draw(st.booleans()):
            argv += ["--timeout-seconds", draw(st.sampled_from(CLI_TIMEOUTS))]
        if draw(st.booleans()):
            argv += ["--internal"]
    elif command in ("start", "heartbeat"):
        argv += [draw(cli_ids)]
    elif command in ("close", "delivery"):
        statuses = (
            ["succeeded", "failed", "timed_out", "cancelled"]
            if command == "close"
            else ["delivered", "failed", "not_applicable"]
        )
        argv += [draw(cli_ids)]
        if draw(st.integers(0, 5)):
            argv += ["--status", draw(st.sampled_from([*statuses, *statuses, "pending", "x"]))]
        if draw(st.integers(0, 3)) == 0:
            argv += ["--code", draw(st.sampled_from([c for c in CODES if isinstance(c, str)]))]
    elif command == "reconcile":
        if draw(st.booleans()):
            argv += ["--active-grace-seconds", draw(st.sampled_from(CLI_FLOATS))]
        if draw(st.booleans()):
            argv += ["--delivery-grace-seconds", draw(st.sampled_from(CLI_FLOATS))]
        if draw(st.booleans()):
            argv += ["--dry-run"]
    if draw(st.integers(0, 19)) == 0:
        argv.insert(
            draw(st.integers(0, len(argv))),
            draw(st.sampled_from(["--unknown", "--allow-external-acl", "--dry-run"])),
        )
    return argv


def run_cli(lib: Any, argv: list[str]) -> tuple[Any, str, str]:
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = lib.cli.main(argv)
        except SystemExit as exc:  # pragma: no cover - argparse's own exits
            code = ("SystemExit", exc.code)
    return code, out.getvalue(), err.getvalue()


def cli_key(labels: dict[str, str], stdout: str) -> Any:
    lines = stdout.splitlines()
    assert len(lines) == 1 and stdout.endswith("\n"), stdout
    data = json.loads(lines[0])
    assert lines[0] == json.dumps(data, sort_keys=True, separators=(",", ":")), lines[0]
    if "task" in data:
        task = data["task"]
        for key in ("id", "parent_id"):
            task[key] = labels.get(task[key], task[key])
        data["task"] = {
            k: (("time" if v is not None else None) if k in CLI_TIME_KEYS else v)
            for k, v in task.items()
            if k in _PEER_DICT_KEYS[False]
        }
    if "storage" in data:
        data["storage"] = {
            k: data["storage"][k]
            for k in ("busy_timeout_ms", "foreign_keys", "journal_mode", "permission_model")
        }
    if "task_status_counts" in data:  # doctor
        data.pop("schema_version")
        for key in list(data):
            if key not in _PEER_DOCTOR_KEYS:
                assert data.pop(key) == 0, key
        data["task_status_counts"] = {
            k: v
            for k, v in data["task_status_counts"].items()
            if k in _PEER_COUNT_KEYS["task_status_counts"] or v
        }
    return data


@settings(
    max_examples=int(os.environ.get("TW_DIFF_CLI_EXAMPLES", "40")),
    deadline=None,
    derandomize=os.environ.get("TW_DIFF_RANDOM") != "1",
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    setup=st.lists(
        st.sampled_from(
            [[], ["--internal"], ["--timeout-seconds", "0"], ["--timeout-seconds", "3600"]]
        ),
        min_size=len(POOL),
        max_size=len(POOL),
    ),
    program=st.lists(cli_commands(), min_size=1, max_size=12),
)
def test_cli_same_argv_same_answer(
    base: Path, setup: list[list[str]], program: list[list[str]]
) -> None:
    program = [["create", "--task-id", f"P{i}", *extra] for i, extra in enumerate(setup)] + program
    import task_state_guard.cli  # noqa: F401

    import taskwarden.cli  # noqa: F401

    root = Path(tempfile.mkdtemp(dir=base))
    dbs = {name: root / name / "ledger.db" for name in LIBS}
    labels: dict[str, dict[str, str]] = {name: {} for name in LIBS}
    generated: dict[str, list[str]] = {name: [] for name in LIBS}
    trace = []
    try:
        for argv in program:
            got = {}
            for name, lib in LIBS.items():

                def real(word: str, name: str = name) -> str:
                    if word in {f"P{i}" for i in range(len(POOL))}:
                        return POOL[int(word[1:])]
                    if word in ("G0", "G1"):
                        k = int(word[1:])
                        return generated[name][k] if k < len(generated[name]) else UNKNOWN
                    return word

                full = ["--db", str(dbs[name]), *[real(w) for w in argv]]
                code, out, err = run_cli(lib, full)
                assert err == "", (name, argv, err)
                if code == 0 and "create" in argv and "--task-id" not in argv:
                    new_id = json.loads(out)["task"]["id"]
                    if new_id not in generated[name]:
                        generated[name].append(new_id)
                labels[name] = {POOL[i]: f"P{i}" for i in range(len(POOL))} | {
                    g: f"G{k}" for k, g in enumerate(generated[name])
                }
                got[name] = (code, cli_key(labels[name], out))
            trace.append(argv)
            event(f"cli {argv[0] if argv[0] != '--unknown' else argv[1]}: exit {got[PEER][0]}")
            assert got[OURS] == got[PEER], f"after {trace}:\n  peer {got[PEER]}\n  ours {got[OURS]}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- edges where the two once differed ------------------------------------------


def test_a_clock_value_whose_conversion_fails_raises_as_in_the_peer(base: Path) -> None:
    """The peer reads ``float(clock())`` and turns only TypeError, ValueError
    and OverflowError into InvalidInput; any other error of either step
    reaches the caller as raised."""
    got = {}
    for name, lib in LIBS.items():
        root = Path(tempfile.mkdtemp(dir=base))
        ledger = lib.Ledger(root / "ledger.db", clock=lambda: FloatRaises(RuntimeError))
        try:
            ledger.create_task()
        except Exception as exc:
            got[name] = type(exc).__name__
        getattr(ledger, "close", lambda: None)()
    assert got[OURS] == got[PEER] == "RuntimeError"


def test_read_only_doctor_of_a_v1_file_reports_its_preview(base: Path) -> None:
    """A documented difference (README): the peer reports a v1 file's old
    schema as unhealthy; taskwarden's read-only doctor judges the migrated
    preview, as a writable open would make it, and leaves the file v1."""
    import sqlite3

    root = Path(tempfile.mkdtemp(dir=base))
    path = root / "ledger.db"
    tsg.Ledger(path, clock=lambda: START).create_task()
    con = sqlite3.connect(path)
    con.execute("DELETE FROM schema_meta WHERE key = 'schema_fingerprint'")
    con.execute("UPDATE schema_meta SET value = '1' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    peer = tsg.Ledger(path, read_only=True).doctor()
    with tw.Ledger(path, read_only=True) as ours:
        report = ours.doctor()
    assert (peer["healthy"], peer["schema_ok"]) == (False, False)
    keys = ("healthy", "schema_version", "schema_ok", "task_count", "doctor_error_count")
    assert {k: report[k] for k in keys} == {
        "healthy": True,
        "schema_version": 1,
        "schema_ok": True,
        "task_count": 1,
        "doctor_error_count": 0,
    }


@pytest.mark.parametrize("argv", [["start", 5], ["close", "x", "--code", None]], ids=repr)
def test_cli_main_with_a_non_text_argument_answers_like_the_peer(
    base: Path, argv: list[Any]
) -> None:
    import task_state_guard.cli  # noqa: F401

    import taskwarden.cli  # noqa: F401

    root = Path(tempfile.mkdtemp(dir=base))
    got = {}
    for name, lib in LIBS.items():
        try:
            got[name] = run_cli(lib, ["--db", str(root / name / "l.db"), *argv])[:2]
        except Exception as exc:
            got[name] = ("raised", type(exc).__name__)
    assert got[OURS] == got[PEER]


# -- the refusals' words ------------------------------------------------------------

# Each refusal the peer documents as fixed text, made the same way on both
# ledgers (``ids``: a queued, a running and a closed task; ``clock``: the
# ledger's clock, in seconds).
REFUSALS: dict[str, Any] = {
    "unknown task": lambda lg, ids, clock: lg.get_task(UNKNOWN),
    "unknown parent": lambda lg, ids, clock: lg.create_task(parent_id=UNKNOWN),
    "id that is no UUID": lambda lg, ids, clock: lg.get_task("not-a-uuid"),
    "id that is no text": lambda lg, ids, clock: lg.get_task(12),
    "another terminal status": lambda lg, ids, clock: lg.close_task(ids["closed"], "failed"),
    "starting a closed task": lambda lg, ids, clock: lg.start_task(ids["closed"]),
    "heartbeat of a queued task": lambda lg, ids, clock: lg.heartbeat(ids["queued"]),
    "unknown status": lambda lg, ids, clock: lg.close_task(ids["running"], "done"),
    "code of the wrong shape": lambda lg, ids, clock: lg.close_task(
        ids["running"], "failed", code="Bad Code"
    ),
    "code outside the registry": lambda lg, ids, clock: lg.close_task(
        ids["running"], "failed", code="no_such_code"
    ),
    "code of another status": lambda lg, ids, clock: lg.close_task(
        ids["running"], "failed", code="worker_completed"
    ),
    "code of another delivery": lambda lg, ids, clock: lg.set_delivery(
        ids["closed"], "failed", code="transport_acknowledged"
    ),
    "delivery of an open task": lambda lg, ids, clock: lg.set_delivery(
        ids["running"], "delivered", code="transport_acknowledged"
    ),
    "negative timeout": lambda lg, ids, clock: lg.create_task(timeout_seconds=-1),
    "infinite timeout": lambda lg, ids, clock: lg.create_task(timeout_seconds=math.inf),
    "payload hash of the wrong shape": lambda lg, ids, clock: lg.create_task(payload_hash="AB"),
    "negative grace": lambda lg, ids, clock: lg.reconcile(
        active_grace_seconds=-1, delivery_grace_seconds=1
    ),
    "grace that is no number": lambda lg, ids, clock: lg.reconcile(
        active_grace_seconds="soon", delivery_grace_seconds=1
    ),
    "clock behind a stored change": lambda lg, ids, clock: (
        setattr(clock, "glitch", START - 3600),
        lg.heartbeat(ids["running"]),
    ),
    "a deadline past every float": lambda lg, ids, clock: (
        setattr(clock, "now", 1.7e308),
        lg.start_task(lg.create_task(timeout_seconds=1.7e308).id),
    ),
    "another immutable field": lambda lg, ids, clock: lg.create_task(
        task_id=ids["queued"], timeout_seconds=5
    ),
    "a delivery that is no outcome": lambda lg, ids, clock: lg.set_delivery(
        ids["closed"], "pending"
    ),
    "not applicable to a delivered kind": lambda lg, ids, clock: lg.set_delivery(
        ids["closed"], "not_applicable", code="internal_task"
    ),
    "delivered for an internal task": lambda lg, ids, clock: lg.set_delivery(
        ids["internal"], "delivered", code="transport_acknowledged"
    ),
    "a memory path": lambda lg, ids, clock: type(lg)(":memory:"),
    "an empty path": lambda lg, ids, clock: type(lg)(""),
    "a path that is no path": lambda lg, ids, clock: type(lg)(5),
    "a path with a NUL": lambda lg, ids, clock: type(lg)(str(ids["home"] / "a\0b.db")),
    "a file with two names": lambda lg, ids, clock: (
        os.link(ids["home"] / "ledger.db", ids["home"] / "second.db"),
        type(lg)(ids["home"] / "ledger.db"),
    ),
    "negative busy timeout": lambda lg, ids, clock: type(lg)(
        ids["home"] / "other.db", busy_timeout_ms=-1
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refusal_is_worded_as_the_peer_words_it(base: Path, case: str) -> None:
    """The peer's refusals are fixed strings that callers match on (its own
    tests do): each reaches a taskwarden caller in the same class and the
    same words."""
    said = {}
    for side, lib in LIBS.items():
        home = base / f"words-{side}-{len(said)}-{abs(hash(case))}"
        home.mkdir(mode=0o700)
        clock = Clock()
        lg = lib.Ledger(home / "ledger.db", clock=clock)  # the peer's has no close()
        ids: dict[str, Any] = {n: lg.create_task().id for n in ("queued", "running", "closed")}
        ids["internal"] = lg.create_task(delivery_required=False).id
        ids["home"] = home
        for name in ("running", "closed", "internal"):
            lg.start_task(ids[name])
        for name in ("closed", "internal"):
            lg.close_task(ids[name], "succeeded")
        clock.now += 60
        with pytest.raises(lib.LedgerError) as refused:
            REFUSALS[case](lg, ids, clock)
        clock.glitch = Clock._NONE
        if side == OURS:
            lg.close()
        said[side] = (type(refused.value).__name__, str(refused.value))
    assert said[OURS] == said[PEER]
