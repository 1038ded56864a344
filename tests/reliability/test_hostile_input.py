"""Hostile input (SPEC §2.2.1, §2.4, §8): hypothesis throws random values at
every public ``Ledger`` method, the constructor, ``Ledger.in_memory`` and the
CLI's argv.

For every input:

- the only exceptions are the documented ones: ``InvalidInput``,
  ``TaskNotFound``, ``StateConflict`` (with its ``LedgerBusy``); ``charge``
  and ``budget`` never raise ``StateConflict`` (state reasons give
  ``allowed=False``); CLI exit codes are 0, 2 (and 1 only from ``doctor``);
- a refused call wrote nothing, and a read wrote nothing even when it
  succeeded: the files' sizes, mtimes and headers (the WAL header's salts
  change whenever the WAL restarts) are compared before and after, and when
  they differ the ``logical_dump`` must equal the one taken after the last
  accepted write (so a checkpoint is fine, a changed row is not);
- nothing is echoed: every free-text value carries ``MARKER`` (spaces, so no
  field can accept it), and neither it nor a task id nor the database path
  ever appears in an exception message or in CLI stdout/stderr;
- the ledger stays healthy (``doctor()``) whatever sequence of accepted calls
  the fuzzer made.

Inputs tried: a few thousand in the short campaign, >= 100,000 in the long one.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import taskwarden
from taskwarden import Ledger
from taskwarden.cli import main
from taskwarden.errors import InvalidInput, LedgerBusy, LedgerError, StateConflict, TaskNotFound

from ..conftest import FrozenClock, logical_dump

MARKER = "PROMPT SECRET 42"
DOCUMENTED = (InvalidInput, TaskNotFound, StateConflict, LedgerBusy)
RESEED_EVERY = 300
SHORT = {"api": 2500, "constructor": 1000, "cli": 600}
LONG = {"api": 70_000, "constructor": 20_000, "cli": 12_000}

STATUSES = [s.value for s in taskwarden.TaskStatus] + ["pending", "in_progress", "completed"]
DELIVERIES = [s.value for s in taskwarden.DeliveryStatus]
CODES = list(taskwarden._core.REASON_CODES)
WORKERS = ["w1", "w2", "worker-7", "agent@host:1"]
TENANTS = ["acme", "globex"]


class Hostile:
    """A value whose every conversion fails and whose rendering is the marker."""

    def __str__(self) -> str:
        return MARKER

    __repr__ = __str__

    def __float__(self) -> float:
        raise RuntimeError("hostile conversion")

    def __index__(self) -> int:
        raise RuntimeError("hostile conversion")

    __int__ = __index__

    def __fspath__(self) -> str:
        raise RuntimeError("hostile conversion")


class Sneaky:
    """Converts fine (to 3), but renders as the marker."""

    def __str__(self) -> str:
        return MARKER

    __repr__ = __str__

    def __float__(self) -> float:
        return 3.0

    def __index__(self) -> int:
        return 3


# --------------------------------------------------------------------------
# the arena: one file ledger with tasks in every state, re-seeded now and then


@dataclass
class Arena:
    directory: Path
    clock: FrozenClock = field(default_factory=FrozenClock)
    ledger: Ledger | None = None
    ids: list[str] = field(default_factory=list)
    dump: dict[str, Any] | None = None
    generation: int = 0
    calls: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.directory / f"arena-{self.generation}.db"

    def open(self) -> Ledger:
        if self.ledger is not None and self.calls % RESEED_EVERY:
            return self.ledger
        if self.ledger is not None:
            self.problems += self.check_health()
            self.ledger.close()
            for p in self.directory.glob(f"arena-{self.generation}.db*"):
                p.unlink()
            self.generation += 1
        self.ledger = Ledger(self.path, clock=self.clock)
        self.ids = _seed(self.ledger, self.clock)
        self.dump = None
        return self.ledger

    def snapshot(self) -> dict[str, Any]:
        if self.dump is None:
            self.dump = logical_dump(self.path)
        return self.dump

    def wrote(self, before: tuple[Any, ...]) -> bool:
        """Did the logical content change since ``before`` (a fingerprint)?"""
        return fingerprint(self.path) != before and logical_dump(self.path) != self.snapshot()

    def accepted(self, before: tuple[Any, ...]) -> None:
        """An accepted call may have written: refresh the reference dump."""
        if fingerprint(self.path) != before:
            self.dump = None

    def check_health(self) -> list[str]:
        assert self.ledger is not None
        report = self.ledger.doctor()
        if report["healthy"] is True:
            return []
        bad = {k: v for k, v in report.items() if k.endswith("_count") and v}
        return [f"ledger unhealthy after accepted calls: {bad}"]

    def close(self) -> None:
        if self.ledger is not None:
            self.problems += self.check_health()
            self.ledger.close()
            self.ledger = None

    def secrets(self) -> list[str]:
        return [MARKER, str(self.directory), *self.ids]


def fingerprint(path: Path) -> tuple[Any, ...]:
    """Size, mtime and header bytes of the database and its WAL: unchanged
    unless something was written to them."""
    parts: list[Any] = []
    for name in (path, Path(f"{path}-wal")):
        try:
            info = name.stat()
            with open(name, "rb") as handle:
                head = handle.read(100)
        except FileNotFoundError:
            parts.append(None)
        else:
            parts.append((info.st_size, info.st_mtime_ns, head))
    return tuple(parts)


def _seed(ledger: Ledger, clock: FrozenClock) -> list[str]:
    """Tasks in every state; returns their ids (first the parents)."""
    root = ledger.create_task(tenant="acme", llm_calls_budget=10, token_budget=1000)
    child = ledger.create_task(parent_id=root.id, tenant="acme", timeout_seconds=30)
    queued = ledger.create_task(payload_hash="ab" * 32, max_attempts=1)
    running = ledger.create_task(tenant="globex", cost_budget_micros=5000)
    ledger.claim(running.id, "w1")
    ledger.claim(child.id, "w2")
    blocked = ledger.create_task()
    ledger.claim(blocked.id, "w1")
    ledger.block(blocked.id)
    escalated = ledger.create_task(llm_calls_budget=1)
    ledger.claim(escalated.id, "w2")
    ledger.charge(escalated.id, calls=2)
    done = ledger.create_task(delivery_required=False)
    ledger.close_task(done.id, "succeeded")
    closed = ledger.create_task()
    ledger.close_task(closed.id, "cancelled")
    ledger.set_delivery(closed.id, "delivered")
    clock.advance(5)
    ids = [root, child, queued, running, blocked, escalated, done, closed]
    return [t.id for t in ids]


# --------------------------------------------------------------------------
# values


JUNK = st.one_of(
    st.builds(lambda a, b: a + MARKER + b, st.text(max_size=6), st.text(max_size=6)),
    st.just(MARKER.encode()),
    st.just(MARKER.upper() + "\x00"),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(st.just(MARKER), max_size=2),
    st.dictionaries(st.just(MARKER), st.integers(), max_size=1),
    st.builds(Hostile),
    st.builds(Sneaky),
    st.sampled_from(["", " ", "\x00", "x" * 300, "\U0001f600", "null", "-1", "1e400"]),
)


def junk() -> st.SearchStrategy[Any]:
    """A value no parameter accepts (or one that is merely odd)."""
    return JUNK


def _maybe(
    good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any] = JUNK
) -> st.SearchStrategy[Any]:
    """A plausible value four times in five (so calls get past validation and
    reach the state checks), junk otherwise. (A plain ``one_of`` would pick
    among the flattened branches, so mostly junk.)"""
    return st.integers(0, 4).flatmap(lambda i: bad if i == 0 else good)


def task_ids(arena: Arena) -> st.SearchStrategy[Any]:
    known = st.sampled_from(range(8)).map(lambda i: arena.ids[i])
    good = st.one_of(known, known, known.map(str.upper), st.uuids().map(str))
    return _maybe(good, st.one_of(JUNK, known.map(lambda s: s + MARKER)))


WORKER = _maybe(st.sampled_from(WORKERS))
TENANT = _maybe(st.sampled_from([*TENANTS, None]))
STATUS = _maybe(st.sampled_from(STATUSES))
DELIVERY = _maybe(st.sampled_from(DELIVERIES))
CODE = _maybe(st.sampled_from([*CODES, None]))
AMOUNT = _maybe(st.integers(min_value=0, max_value=5))
LIMIT_OR_NONE = _maybe(st.one_of(st.none(), st.integers(min_value=0, max_value=50)))
SECONDS = _maybe(st.floats(min_value=0, max_value=1e6))
FLAG = _maybe(st.booleans())
ATTEMPT = _maybe(st.one_of(st.none(), st.integers(min_value=0, max_value=3)))
HASH = _maybe(st.one_of(st.none(), st.just("ab" * 32), st.just("AB" * 32)))
COUNT = _maybe(st.integers(min_value=1, max_value=20))

# method -> (positional parameters, keyword parameters); strategies by name.
READS = {
    "get_task",
    "children_of",
    "events",
    "budget",
    "list_tasks",
    "stats",
    "doctor",
    "storage_info",
}
SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "create_task": (
        (),
        (
            "parent_id",
            "payload_hash",
            "timeout_seconds",
            "delivery_required",
            "task_id",
            "tenant",
            "llm_calls_budget",
            "token_budget",
            "cost_budget_micros",
            "max_attempts",
        ),
    ),
    "get_task": (("task_id",), ()),
    "children_of": (("task_id",), ()),
    "events": (("task_id",), ()),
    "start_task": (("task_id",), ()),
    "heartbeat": (("task_id",), ("worker", "attempt")),
    "close_task": (("task_id", "status"), ("code", "worker", "attempt")),
    "set_delivery": (("task_id", "delivery"), ("code",)),
    "claim": (("task_id", "worker"), ()),
    "claim_next": (("worker",), ("tenant", "limit")),
    "release": (("task_id", "worker"), ()),
    "transition": (("task_id", "expected", "to"), ("code", "worker", "attempt")),
    "block": (("task_id",), ("code", "worker")),
    "escalate": (("task_id",), ("code", "worker")),
    "requeue": (("task_id",), ()),
    "cancel": (("task_id",), ("subtree",)),
    "charge": (("task_id",), ("calls", "tokens", "cost_micros", "worker", "attempt")),
    "budget": (("task_id",), ()),
    "grant": (("task_id",), ("calls", "tokens", "cost_micros")),
    "list_tasks": ((), ("status", "tenant", "owner", "parent_id", "limit", "after")),
    "reconcile": (
        (),
        (
            "active_grace_seconds",
            "delivery_grace_seconds",
            "dry_run",
            "worker_lost",
            "tenant",
        ),
    ),
    "purge": ((), ("older_than_seconds", "dry_run", "tenant")),
    "delete_task": (("task_id",), ()),
    "stats": ((), ("tenant",)),
    "doctor": ((), ()),
    "storage_info": ((), ()),
}
REQUIRED_KEYWORDS = {
    "reconcile": {"active_grace_seconds", "delivery_grace_seconds"},
    "purge": {"older_than_seconds"},
}


def _strategies(arena: Arena) -> dict[str, st.SearchStrategy[Any]]:
    ids = task_ids(arena)
    return {
        "task_id": ids,
        "parent_id": st.one_of(st.none(), ids),
        "after": st.one_of(st.none(), ids),
        "worker": WORKER,
        "owner": st.one_of(st.none(), WORKER),
        "worker_lost": st.one_of(st.none(), WORKER),
        "tenant": TENANT,
        "status": STATUS,
        "expected": STATUS,
        "to": STATUS,
        "delivery": DELIVERY,
        "code": CODE,
        "attempt": ATTEMPT,
        "payload_hash": HASH,
        "timeout_seconds": st.one_of(st.none(), SECONDS),
        "delivery_required": FLAG,
        "dry_run": FLAG,
        "subtree": FLAG,
        "llm_calls_budget": LIMIT_OR_NONE,
        "token_budget": LIMIT_OR_NONE,
        "cost_budget_micros": LIMIT_OR_NONE,
        "max_attempts": AMOUNT,
        "calls": AMOUNT,
        "tokens": AMOUNT,
        "cost_micros": AMOUNT,
        "limit": COUNT,
        "active_grace_seconds": SECONDS,
        "delivery_grace_seconds": SECONDS,
        "older_than_seconds": SECONDS,
    }


def _leaks(text: str, secrets: list[str]) -> list[str]:
    lowered = text.lower()
    return [s for s in secrets if s and s.lower() in lowered]


METHODS = st.sampled_from(sorted(SIGNATURES))
CLOCK_STEPS = st.sampled_from([0.0, 0.5, 30.0, 700.0])


def _call_api(arena: Arena, data: Any, strategies: dict[str, st.SearchStrategy[Any]]) -> None:
    ledger = arena.open()
    arena.calls += 1
    method = data.draw(METHODS, label="method")
    positional, keywords = SIGNATURES[method]
    args = [data.draw(strategies[p], label=p) for p in positional]
    kwargs = {
        k: data.draw(strategies[k], label=k)
        for k in keywords
        if k in REQUIRED_KEYWORDS.get(method, ()) or data.draw(st.booleans())
    }
    arena.snapshot()
    before = fingerprint(arena.path)
    arena.clock.advance(data.draw(CLOCK_STEPS))
    problems: list[str] = []
    try:
        result = getattr(ledger, method)(*args, **kwargs)
    except DOCUMENTED as exc:
        arena.outcomes[type(exc).__name__] += 1
        if _leaks(f"{exc} {exc!r} {exc.args!r}", arena.secrets()):
            problems.append(f"{method}: message echoes a value ({type(exc).__name__})")
        if method in ("charge", "budget") and type(exc) is StateConflict:
            problems.append(f"{method} raised StateConflict for a state reason")
        if arena.wrote(before):
            problems.append(f"{method}: refused with {type(exc).__name__} but wrote")
    except Exception as exc:
        problems.append(f"{method}: undocumented {type(exc).__module__}.{type(exc).__name__}")
        arena.problems += problems
        raise
    else:
        arena.outcomes["returned"] += 1
        if method in READS or (method in ("reconcile", "purge") and kwargs.get("dry_run") is True):
            if arena.wrote(before):
                problems.append(f"{method}: a read wrote")
        else:
            arena.accepted(before)
        if MARKER in repr(result):
            problems.append(f"{method}: the result holds a marker value")
        if arena.calls % 50 == 0:
            problems += arena.check_health()
    arena.problems += problems
    assert not problems, (problems, method, args, kwargs)


def _settings(examples: int, long_campaign: bool) -> settings:
    """The short campaign is deterministic (same inputs every run); the long
    one explores new inputs each time."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=not long_campaign,
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[Arena]:
    directory = tmp_path / "arena"
    directory.mkdir(mode=0o700)
    fuzz = Arena(directory)
    try:
        yield fuzz
    finally:
        fuzz.close()


def test_every_ledger_method_refuses_hostile_values_cleanly(
    arena: Arena, long_campaign: bool, figures: Any
) -> None:
    examples = (LONG if long_campaign else SHORT)["api"]
    strategies = _strategies(arena)

    @_settings(examples, long_campaign)
    @given(data=st.data())
    def run(data: Any) -> None:
        _call_api(arena, data, strategies)

    try:
        run()
    finally:
        figures.record(
            "hostile_input",
            api_calls=arena.calls,
            api_refused=sum(v for k, v in arena.outcomes.items() if k != "returned"),
            api_returned=arena.outcomes["returned"],
            problems=len(arena.problems),
        )
    arena.close()
    assert arena.problems == []
    assert arena.outcomes["returned"] > examples // 20
    assert arena.outcomes["InvalidInput"] > examples // 5
    assert arena.outcomes["StateConflict"] + arena.outcomes["TaskNotFound"] > 0


def test_constructor_and_in_memory_refuse_hostile_options(
    tmp_path: Path, long_campaign: bool, figures: Any, monkeypatch: Any
) -> None:
    """Also accepted: a plain ``LedgerError``, the documented base class the
    ledger uses for storage failures (SPEC §2.4), e.g. for a file name longer
    than the file system allows; counted as ``constructor_storage_errors``."""
    workdir = tmp_path / "cwd"
    workdir.mkdir(mode=0o700)
    monkeypatch.chdir(workdir)  # junk strings are relative paths: they land here
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    existing = private / "existing.db"
    with Ledger(existing) as opened:
        opened.create_task()
    reference = logical_dump(existing)
    target = private / "target.db"
    (private / "link.db").symlink_to(existing)
    (private / "dir.db").mkdir(mode=0o700)
    paths = st.one_of(
        st.sampled_from(
            [
                str(existing),
                existing,
                str(target),
                str(private / "link.db"),
                str(private / "dir.db"),
                str(shared / "x.db"),
                str(private / "missing" / "x.db"),
                str(private / f"{MARKER}.db"),
                ":memory:",
                "",
                str(private / "nul\x00.db"),
            ]
        ),
        junk(),
    )
    clocks = st.one_of(
        st.sampled_from([lambda: 1_800_000_000.0, lambda: -1.0, lambda: math.nan, lambda: MARKER]),
        st.builds(lambda: lambda: 1 / 0),
        junk(),
    )
    counter: Counter[str] = Counter()
    all_problems: list[str] = []
    secrets = [MARKER, str(tmp_path)]

    @_settings((LONG if long_campaign else SHORT)["constructor"], long_campaign)
    @given(
        path=paths,
        clock=st.one_of(st.none(), clocks),
        busy=st.one_of(st.none(), AMOUNT),
        external=st.one_of(st.none(), FLAG),
        read_only=st.one_of(st.none(), FLAG),
        durability=st.one_of(st.none(), _maybe(st.sampled_from(["normal", "full"]))),
        snapshot=st.one_of(st.none(), AMOUNT.map(lambda v: v * 4096 if type(v) is int else v)),
        memory=st.booleans(),
    )
    def run(**drawn: Any) -> None:
        options = {
            key: drawn[name]
            for key, name in (
                ("clock", "clock"),
                ("busy_timeout_ms", "busy"),
                ("allow_external_acl", "external"),
                ("read_only", "read_only"),
                ("durability", "durability"),
                ("snapshot_max_bytes", "snapshot"),
            )
            if drawn[name] is not None
        }
        before = fingerprint(existing)
        counter["tried"] += 1
        problems: list[str] = []
        try:
            if drawn["memory"]:
                keep = {k: v for k, v in options.items() if k in ("clock", "busy_timeout_ms")}
                opened = Ledger.in_memory(**keep)
            else:
                opened = Ledger(drawn["path"], **options)
        except (*DOCUMENTED, LedgerError) as exc:
            counter[type(exc).__name__] += 1
            if _leaks(f"{exc} {exc!r}", secrets):
                problems.append("a constructor message echoes a value")
        except Exception as exc:
            all_problems.append(f"undocumented {type(exc).__module__}.{type(exc).__name__}")
            raise
        else:
            counter["opened"] += 1
            with opened:
                try:
                    opened.stats()
                    if drawn["memory"]:  # a write reads the clock
                        opened.create_task()
                except DOCUMENTED as exc:
                    counter[type(exc).__name__] += 1
                    if _leaks(f"{exc} {exc!r}", secrets):
                        problems.append("a message echoes a value")
                except ZeroDivisionError:  # the clock's own exception, passed on
                    counter["clock_raised"] += 1
        if fingerprint(existing) != before and logical_dump(existing) != reference:
            problems.append("opening changed an existing ledger's content")
        all_problems.extend(problems)
        assert not problems, (problems, drawn)
        for p in [*private.glob("target.db*"), *workdir.iterdir()]:
            # A missing parent directory is created (e.g. "junk/x"): remove it too.
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()

    try:
        run()
    finally:
        figures.record(
            "hostile_input",
            constructor_calls=counter["tried"],
            constructor_storage_errors=counter["LedgerError"],
        )
    assert all_problems == []
    assert counter["opened"] > 0 and counter["InvalidInput"] > 0
    assert not list(shared.iterdir())  # nothing created in an unsafe directory


# --------------------------------------------------------------------------
# the CLI

COMMANDS = [
    "init",
    "create",
    "start",
    "get",
    "heartbeat",
    "close",
    "delivery",
    "reconcile",
    "doctor",
    "claim",
    "claim-next",
    "release",
    "charge",
    "budget",
    "grant",
    "transition",
    "block",
    "escalate",
    "requeue",
    "cancel",
    "list",
    "stats",
    "purge",
    "demo",
]
FLAGS = [
    "--task-id",
    "--parent-id",
    "--payload-sha256",
    "--timeout-seconds",
    "--internal",
    "--tenant",
    "--llm-calls-budget",
    "--unlimited-calls",
    "--token-budget",
    "--cost-budget-micros",
    "--max-attempts",
    "--worker",
    "--attempt",
    "--status",
    "--code",
    "--active-grace-seconds",
    "--delivery-grace-seconds",
    "--dry-run",
    "--worker-lost",
    "--snapshot-max-mib",
    "--read-only",
    "--older-than-seconds",
    "--limit",
    "--after",
    "--owner",
    "--calls",
    "--tokens",
    "--cost-micros",
    "--expected",
    "--to",
    "--format",
    "--busy-timeout-ms",
    "--allow-external-acl",
    "--keep-db",
    "--db",
    "--help",
    "--version",
    "-h",
    "--",
]


def _cli_token(arena: Arena) -> st.SearchStrategy[str]:
    ids = st.sampled_from(range(8)).map(lambda i: arena.ids[i])
    return st.one_of(
        st.sampled_from(COMMANDS),
        st.sampled_from(FLAGS),
        st.sampled_from(FLAGS).map(lambda f: f + "=" + MARKER),
        ids,
        ids.map(lambda s: s + MARKER),
        st.sampled_from(STATUSES + DELIVERIES + CODES + WORKERS + TENANTS + ["json", "text"]),
        st.integers(min_value=-3, max_value=10**20).map(str),
        st.sampled_from(["0", "1", "0.5", "nan", "inf", "-1", "1e999", "9" * 30, "ab" * 32]),
        st.builds(lambda a, b: a + MARKER + b, st.text(max_size=5), st.text(max_size=5)),
    )


def _run_cli(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # --help and --version
            code = exc.code if isinstance(exc.code, int) else -1
    return code, out.getvalue() + err.getvalue()


def test_cli_argv_fuzz_exits_cleanly_and_echoes_nothing(
    arena: Arena, tmp_path: Path, long_campaign: bool, figures: Any, monkeypatch: Any
) -> None:
    workdir = tmp_path / "cwd"
    workdir.mkdir(mode=0o700)
    monkeypatch.chdir(workdir)  # relative paths (e.g. a stray --db value) land here
    exits: Counter[int] = Counter()

    argvs = st.lists(_cli_token(arena), max_size=8)

    @_settings((LONG if long_campaign else SHORT)["cli"], long_campaign)
    @given(data=st.data())
    def run(data: Any) -> None:
        arena.open()
        arena.calls += 1
        tokens = data.draw(argvs, label="tokens")
        if data.draw(st.integers(0, 9)) < 8:
            tokens = ["--db", str(arena.path), *tokens]
        arena.snapshot()
        before = fingerprint(arena.path)
        arena.clock.advance(1)
        code, output = _run_cli(tokens)
        exits[code] += 1
        problems = []
        said_no = "doctor" in tokens or "charge" in tokens  # unhealthy, refused
        if code not in (0, 1, 2) or (code == 1 and not said_no):
            problems.append(f"exit code {code}: {output[-300:]}")
        leaked = _leaks(output, [MARKER, str(tmp_path)])
        if leaked:
            problems.append("CLI output echoes a value")
        if code == 2:
            if arena.wrote(before):
                problems.append("a refused CLI command wrote")
            if output.startswith("{") and json.loads(output) != {
                "error": json.loads(output).get("error"),
                "ok": False,
            }:
                problems.append("exit 2 without a bare error line")
        else:
            arena.accepted(before)
        arena.problems += problems
        assert not problems, (problems, tokens)

    try:
        run()
    finally:
        figures.record("hostile_input", cli_runs=sum(exits.values()))
    arena.close()
    assert arena.problems == []
    assert exits[0] > 0 and exits[2] > 0


def test_uuid_forms_map_to_one_task(arena: Arena) -> None:
    """Control for the fuzzer's id strategy: the upper-case form of a known id
    is the same task, so fuzzed upper-case ids reach the state checks."""
    ledger = arena.open()
    task_id = arena.ids[2]
    assert ledger.get_task(task_id.upper()).id == task_id
    with pytest.raises(TaskNotFound):
        ledger.get_task(str(uuid.uuid4()))
