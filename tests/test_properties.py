"""Property tests: a rule-based state machine checks the ledger against a small
pure-Python model of SPEC §3-§4, plus round-trip and bound properties of names
and budgets."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from taskwarden import Charge, InvalidInput, Ledger, StateConflict, Task, TaskStatus

from .conftest import FrozenClock

# Hypothesis scans loaded modules when it reports a failing example; reading
# mypy_extensions.TypedDict warns, which filterwarnings=error would turn into an
# internal error that hides the real failure.
pytestmark = pytest.mark.filterwarnings(
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
)

S = TaskStatus
I64_MAX = 2**63 - 1
TERMINAL = [S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED]
DIMS = ("calls", "tokens", "cost")
WORKERS = ["w1", "w2", "w3"]
OWNER = "<owner>"  # resolved to the task's current owner (None when it has none)

#: SPEC §3, written out independently of the product.
TABLE: dict[TaskStatus, frozenset[TaskStatus]] = {
    S.QUEUED: frozenset({S.RUNNING, *TERMINAL}),
    S.RUNNING: frozenset({*TERMINAL, S.BLOCKED, S.ESCALATED, S.QUEUED}),
    S.BLOCKED: frozenset({S.QUEUED, S.CANCELLED}),
    S.ESCALATED: frozenset({S.QUEUED, S.CANCELLED}),
    **{t: frozenset() for t in TERMINAL},
}
ALIASES = {"pending": S.QUEUED, "in_progress": S.RUNNING, "completed": S.SUCCEEDED}
STATUS_NAMES = [s.value for s in TaskStatus] + list(ALIASES)
CLOSE_CODES: dict[TaskStatus, list[str | None]] = {
    S.SUCCEEDED: [None, "completed", "worker_completed"],
    S.FAILED: [None, "worker_failed"],
    S.TIMED_OUT: [None, "deadline_exceeded", "restart_stale", "worker_lost"],
    S.CANCELLED: [None, "caller_cancelled"],
}

#: Task layout: (parent index, tenant, timeout). 1 and 4 are children of 0; 2 a grandchild.
LAYOUT: list[tuple[int | None, str | None, float | None]] = [
    (None, "ta", 10.0),
    (0, "ta", None),
    (1, "tb", 5.0),
    (None, None, None),
    (0, "tb", 20.0),
]
N = len(LAYOUT)

STATE_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    # no "explain" phase: it replays a failing program many times over
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def canonical(name: str) -> TaskStatus:
    return ALIASES.get(name) or TaskStatus(name)


@dataclass
class Model:
    """What SPEC §3-§4 say one task should look like."""

    id: str
    parent: int | None
    tenant: str | None
    timeout: float | None
    max_attempts: int
    limits: list[int | None]
    created_at: float
    status: TaskStatus = S.QUEUED
    owner: str | None = None
    attempt_count: int = 0
    park_code: str | None = None
    terminal_code: str | None = None
    used: list[int] = field(default_factory=lambda: [0, 0, 0])
    version: int = 0
    started_at: float | None = None
    deadline_at: float | None = None
    ended_at: float | None = None

    def observed(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "owner": self.owner,
            "attempt_count": self.attempt_count,
            "max_attempts": self.max_attempts,
            "park_code": self.park_code,
            "terminal_code": self.terminal_code,
            "llm_calls_used": self.used[0],
            "llm_calls_budget": self.limits[0],
            "tokens_used": self.used[1],
            "token_budget": self.limits[1],
            "cost_used_micros": self.used[2],
            "cost_budget_micros": self.limits[2],
            "version": self.version,
            "tenant": self.tenant,
            "started_at": self.started_at,
            "deadline_at": self.deadline_at,
            "ended_at": self.ended_at,
        }


def observed(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "status": task.status,
        "owner": task.owner,
        "attempt_count": task.attempt_count,
        "max_attempts": task.max_attempts,
        "park_code": task.park_code,
        "terminal_code": task.terminal_code,
        "llm_calls_used": task.llm_calls_used,
        "llm_calls_budget": task.llm_calls_budget,
        "tokens_used": task.tokens_used,
        "token_budget": task.token_budget,
        "cost_used_micros": task.cost_used_micros,
        "cost_budget_micros": task.cost_budget_micros,
        "version": task.version,
        "tenant": task.tenant,
        "started_at": task.started_at,
        "deadline_at": task.deadline_at,
        "ended_at": task.ended_at,
    }


budgets = st.tuples(
    st.one_of(st.none(), st.integers(0, 6)),
    st.one_of(st.none(), st.integers(0, 40)),
    st.one_of(st.none(), st.integers(0, 30)),
)


class LedgerMachine(RuleBasedStateMachine):
    """Random calls against a real in-memory ledger and the model side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FrozenClock()
        self.ledger: Ledger | None = None
        self.tasks: list[Model] = []

    # -- set-up / tear-down ---------------------------------------------------

    @initialize(
        limits=st.lists(budgets, min_size=N, max_size=N),
        attempts=st.lists(st.integers(1, 3), min_size=N, max_size=N),
    )
    def create_tasks(self, limits: list[tuple[Any, ...]], attempts: list[int]) -> None:
        self.ledger = Ledger.in_memory(clock=self.clock)
        for (parent, tenant, timeout), lim, max_attempts in zip(
            LAYOUT, limits, attempts, strict=True
        ):
            self.clock.advance(1)
            task = self.ledger.create_task(
                parent_id=None if parent is None else self.tasks[parent].id,
                tenant=tenant,
                timeout_seconds=timeout,
                llm_calls_budget=lim[0],
                token_budget=lim[1],
                cost_budget_micros=lim[2],
                max_attempts=max_attempts,
            )
            self.tasks.append(
                Model(
                    id=task.id,
                    parent=parent,
                    tenant=tenant,
                    timeout=timeout,
                    max_attempts=max_attempts,
                    limits=list(lim),
                    created_at=self.clock.now,
                )
            )
            assert observed(task) == self.tasks[-1].observed()

    def teardown(self) -> None:
        if self.ledger is not None:
            self.ledger.close()

    # -- model helpers ----------------------------------------------------------

    @property
    def db(self) -> Ledger:
        assert self.ledger is not None
        return self.ledger

    def chain(self, m: Model) -> list[Model]:
        out = [m]
        while out[-1].parent is not None:
            out.append(self.tasks[out[-1].parent])
        return out

    def resolve(self, m: Model, worker: str | None) -> str | None:
        return m.owner if worker == OWNER else worker

    def fenced_out(self, m: Model, worker: str | None, attempt: int | None = None) -> bool:
        fenced = worker is not None or attempt is not None
        return (
            (fenced and m.owner is None)  # held by no claim: whoever fences, it ended
            or (worker is not None and m.owner != worker)
            or (attempt is not None and attempt != m.attempt_count)
        )

    def move(self, m: Model, to: TaskStatus, code: str | None, worker: str | None = None) -> None:
        """Apply one edge of the table to the model (SPEC §3 column rules)."""
        assert to in TABLE[m.status]
        now = self.clock.now
        m.status = to
        m.version += 1
        m.park_code = None
        if to is S.RUNNING:
            m.attempt_count += 1
            m.owner = worker
            m.started_at = now
            m.deadline_at = None if m.timeout is None else now + m.timeout
        elif to is S.QUEUED:
            m.owner = m.started_at = m.deadline_at = None
        elif to in (S.BLOCKED, S.ESCALATED):
            m.park_code = code
        else:
            m.terminal_code = code
            m.ended_at = now

    def check_task(self, m: Model, task: Task) -> None:
        assert observed(task) == m.observed()

    def check_refused(self, exc: type[Exception], call: Any) -> None:
        before = [self.db.get_task(m.id) for m in self.tasks]
        with pytest.raises(exc):
            call()
        assert [self.db.get_task(m.id) for m in self.tasks] == before

    def charge_view(
        self,
        m: Model,
        refused: str | None,
        escalated: bool,
        exhausted: tuple[str, str] | None,
    ) -> Charge:
        """What charge or budget answers; ``refused`` is why it is not
        allowed (``None``: allowed), ``exhausted`` (dimension, the id of
        the task whose limit ran out)."""
        remaining = [
            None if lim is None else lim - u for u, lim in zip(m.used, m.limits, strict=True)
        ]
        return Charge(
            refused is None,
            escalated,
            None if exhausted is None else exhausted[0],
            m.used[0],
            m.limits[0],
            remaining[0],
            m.used[1],
            m.limits[1],
            remaining[1],
            m.used[2],
            m.limits[2],
            remaining[2],
            None if exhausted is None else exhausted[1],
            refused,
        )

    # -- rules ---------------------------------------------------------------------

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 7.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(i=st.integers(0, N - 1), worker=st.sampled_from(WORKERS))
    def claim(self, i: int, worker: str) -> None:
        m = self.tasks[i]
        result = self.db.claim(m.id, worker)
        if m.status is not S.QUEUED:
            assert result is None
            return
        self.move(m, S.RUNNING, "claimed", worker)
        assert result is not None
        self.check_task(m, result)

    @rule(
        worker=st.sampled_from(WORKERS),
        tenant=st.sampled_from([None, "ta", "tb", "tc"]),
        limit=st.integers(1, 3),
    )
    def claim_next(self, worker: str, tenant: str | None, limit: int) -> None:
        queued = [
            m for m in self.tasks if m.status is S.QUEUED and (tenant is None or m.tenant == tenant)
        ]
        picked = sorted(queued, key=lambda m: (m.created_at, m.id))[:limit]
        result = self.db.claim_next(worker, tenant=tenant, limit=limit)
        assert [t.id for t in result] == [m.id for m in picked]
        for m, task in zip(picked, result, strict=True):
            self.move(m, S.RUNNING, "claimed", worker)
            self.check_task(m, task)

    @rule(
        i=st.integers(0, N - 1),
        calls=st.integers(0, 3),
        tokens=st.sampled_from([0, 0, 1, 5, 15]),
        cost=st.sampled_from([0, 0, 1, 4, 10]),
        worker=st.sampled_from([None, OWNER, OWNER, "w2"]),
        attempt=st.sampled_from([None, None, "current", "stale"]),
    )
    def charge(self, i: int, calls: int, tokens: int, cost: int, worker: Any, attempt: Any) -> None:
        m = self.tasks[i]
        who = self.resolve(m, worker)
        att = {None: None, "current": m.attempt_count, "stale": m.attempt_count + 1}[attempt]
        amount = [calls, tokens, cost]
        result = self.db.charge(
            m.id, calls=calls, tokens=tokens, cost_micros=cost, worker=who, attempt=att
        )
        if self.fenced_out(m, who, att):
            expected = self.charge_view(m, "claim_lost", False, self.spent(m))
        elif m.status is not S.RUNNING:
            expected = self.charge_view(m, "not_running", False, self.spent(m))
        elif amount == [0, 0, 0]:
            expected = self.charge_view(m, None, False, None)
        else:
            exhausted = None
            for node in self.chain(m):
                for d, (u, lim, a) in enumerate(zip(node.used, node.limits, amount, strict=True)):
                    if lim is not None and u + a > lim:
                        exhausted = (DIMS[d], node.id)
                        break
                if exhausted:
                    break
            if exhausted:
                self.move(m, S.ESCALATED, "budget_exhausted")
                expected = self.charge_view(m, "budget", True, exhausted)
            else:
                for node in self.chain(m):
                    node.used = [u + a for u, a in zip(node.used, amount, strict=True)]
                    node.version += 1
                expected = self.charge_view(m, None, False, None)
        assert result == expected

    def spent(self, m: Model) -> tuple[str, str] | None:
        """The first limit already used up, on the task or an ancestor, and
        whose limit it is."""
        for node in self.chain(m):
            for d, (u, lim) in enumerate(zip(node.used, node.limits, strict=True)):
                if lim is not None and u >= lim:
                    return DIMS[d], node.id
        return None

    @rule(i=st.integers(0, N - 1))
    def budget(self, i: int) -> None:
        m = self.tasks[i]
        exhausted = self.spent(m)
        # Whether a one-call charge would fit every limit on the chain.
        fits = all(
            node.limits[0] is None or node.used[0] + 1 <= node.limits[0] for node in self.chain(m)
        )
        refused = "not_running" if m.status is not S.RUNNING else None if fits else "budget"
        assert self.db.budget(m.id) == self.charge_view(m, refused, False, exhausted)

    @rule(i=st.integers(0, N - 1), worker=st.sampled_from([OWNER, OWNER, "w1", "w2"]))
    def release(self, i: int, worker: str) -> None:
        m = self.tasks[i]
        who = self.resolve(m, worker) or "w3"
        if m.status is not S.RUNNING or m.owner != who:
            self.check_refused(StateConflict, lambda: self.db.release(m.id, who))
            return
        result = self.db.release(m.id, who)
        if m.attempt_count >= m.max_attempts:
            self.move(m, S.ESCALATED, "attempts_exhausted")
        else:
            self.move(m, S.QUEUED, "released")
        self.check_task(m, result)

    @rule(
        i=st.integers(0, N - 1),
        to=st.sampled_from([S.BLOCKED, S.ESCALATED]),
        worker=st.sampled_from([None, None, OWNER, "w2"]),
    )
    def park(self, i: int, to: TaskStatus, worker: Any) -> None:
        m = self.tasks[i]
        who = self.resolve(m, worker)
        call = self.db.block if to is S.BLOCKED else self.db.escalate
        if m.status is not S.RUNNING or self.fenced_out(m, who):
            self.check_refused(StateConflict, lambda: call(m.id, worker=who))
            return
        result = call(m.id, worker=who)
        self.move(m, to, "needs_input" if to is S.BLOCKED else "escalated_manually")
        self.check_task(m, result)

    @rule(i=st.integers(0, N - 1))
    def requeue(self, i: int) -> None:
        m = self.tasks[i]
        if m.status not in (S.BLOCKED, S.ESCALATED):
            self.check_refused(StateConflict, lambda: self.db.requeue(m.id))
            return
        result = self.db.requeue(m.id)
        self.move(m, S.QUEUED, "requeued")
        self.check_task(m, result)

    @rule(
        i=st.integers(0, N - 1),
        calls=st.integers(0, 3),
        tokens=st.sampled_from([0, 5, 20]),
        cost=st.sampled_from([0, 3, 10]),
    )
    def grant(self, i: int, calls: int, tokens: int, cost: int) -> None:
        m = self.tasks[i]
        if calls == tokens == cost == 0:  # a grant of nothing
            self.check_refused(InvalidInput, lambda: self.db.grant(m.id))
            return
        result = self.db.grant(m.id, calls=calls, tokens=tokens, cost_micros=cost)
        added = [
            0 if lim is None else a for lim, a in zip(m.limits, [calls, tokens, cost], strict=True)
        ]
        # Unlimited stays unlimited; a grant that adds nothing writes nothing.
        m.limits = [
            None if lim is None else lim + a for lim, a in zip(m.limits, added, strict=True)
        ]
        if any(added):
            m.version += 1
        self.check_task(m, result)

    @rule(
        i=st.integers(0, N - 1),
        to=st.sampled_from(TERMINAL),
        data=st.data(),
        worker=st.sampled_from([None, None, OWNER, "w2"]),
        attempt=st.sampled_from([None, None, "current", "stale"]),
    )
    def close(self, i: int, to: TaskStatus, data: st.DataObject, worker: Any, attempt: Any) -> None:
        m = self.tasks[i]
        code = data.draw(st.sampled_from(CLOSE_CODES[to]), label="code")
        who = self.resolve(m, worker)
        att = {None: None, "current": m.attempt_count, "stale": m.attempt_count + 1}[attempt]

        def call() -> Task:
            return self.db.close_task(m.id, to, code=code, worker=who, attempt=att)

        if self.fenced_out(m, who, att) or (m.status is not to and to not in TABLE[m.status]):
            self.check_refused(StateConflict, call)
            return
        if m.status is to:  # closing again: a no-op for the claim that closed it
            before = self.db.get_task(m.id)
            assert call() == before
            return
        result = call()
        self.move(m, to, code, who)
        self.check_task(m, result)

    @rule(i=st.integers(0, N - 1))
    def cancel(self, i: int) -> None:
        m = self.tasks[i]
        if m.status is S.CANCELLED:
            before = self.db.get_task(m.id)
            assert self.db.cancel(m.id) == before
            return
        if m.status.is_terminal:
            self.check_refused(StateConflict, lambda: self.db.cancel(m.id))
            return
        result = self.db.cancel(m.id)
        self.move(m, S.CANCELLED, "caller_cancelled")
        self.check_task(m, result)

    @rule(
        i=st.integers(0, N - 1),
        expected=st.sampled_from(STATUS_NAMES),
        to=st.sampled_from(STATUS_NAMES),
        worker=st.sampled_from([None, None, OWNER, "w1", "w2"]),
        prefer_stored=st.booleans(),
    )
    def transition(self, i: int, expected: str, to: str, worker: Any, prefer_stored: bool) -> None:
        m = self.tasks[i]
        if prefer_stored:  # a matching ``expected`` most of the time
            expected = m.status.value
        who = self.resolve(m, worker)
        exp, dst = canonical(expected), canonical(to)

        def call() -> Task:
            return self.db.transition(m.id, expected, to, worker=who)

        if m.status is not exp:
            self.check_refused(StateConflict, call)
            return
        if dst.is_terminal and m.status is dst and not self.fenced_out(m, who):
            before = self.db.get_task(m.id)
            assert call() == before
            return
        claims = m.status is S.QUEUED and dst is S.RUNNING  # the worker becomes the owner
        if dst not in TABLE[m.status] or (not claims and self.fenced_out(m, who)):
            self.check_refused(StateConflict, call)
            return
        result = call()
        code = {S.BLOCKED: "needs_input", S.ESCALATED: "escalated_manually"}.get(dst)
        if m.status is S.RUNNING and dst is S.QUEUED and m.attempt_count >= m.max_attempts:
            dst, code = S.ESCALATED, "attempts_exhausted"  # the release edge's attempts rule
        self.move(m, dst, code, who)
        self.check_task(m, result)

    @rule(
        i=st.integers(0, N - 1),
        to=st.sampled_from(["queued", "pending"]),
        worker=st.sampled_from([None, OWNER, OWNER, "w2"]),
    )
    def give_back_by_transition(self, i: int, to: str, worker: Any) -> None:
        """The release edge taken through ``transition`` (its attempts rule
        included), often enough to matter: drawn at random among all the
        statuses, a run seldom took it with the attempts used up."""
        self.transition(i, "running", to, worker, prefer_stored=False)

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def every_task_matches_the_model(self) -> None:
        if self.ledger is None:
            return
        for m in self.tasks:
            self.check_task(m, self.db.get_task(m.id))

    @invariant()
    def budgets_hold(self) -> None:
        if self.ledger is None:
            return
        stored = {m.id: self.db.get_task(m.id) for m in self.tasks}
        for t in stored.values():
            for used, limit in (
                (t.llm_calls_used, t.llm_calls_budget),
                (t.tokens_used, t.token_budget),
                (t.cost_used_micros, t.cost_budget_micros),
            ):
                assert used >= 0
                assert limit is None or used <= limit
            if t.status is S.QUEUED:
                assert t.owner is None and t.started_at is None
        for t in stored.values():
            kids = [c for c in stored.values() if c.parent_id == t.id]
            assert t.llm_calls_used >= sum(c.llm_calls_used for c in kids)
            assert t.tokens_used >= sum(c.tokens_used for c in kids)
            assert t.cost_used_micros >= sum(c.cost_used_micros for c in kids)
            assert [c.id for c in self.db.children_of(t.id)] == [c.id for c in kids]


LedgerMachine.TestCase.settings = STATE_SETTINGS
TestLedgerMachine = LedgerMachine.TestCase


# -- names: round trip and bounds ------------------------------------------------------

NAME_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
valid_names = st.from_regex(NAME_RE, fullmatch=True)
invalid_names = st.one_of(
    st.just(""),
    st.from_regex(r"[A-Za-z0-9._:@-]{129,200}", fullmatch=True),
    st.text(min_size=1, max_size=40).filter(lambda s: NAME_RE.fullmatch(s) is None),
    st.sampled_from(["w 1", "w/1", "w\n", "\nw", "tenant#1", "é", "w\x00", "a" * 129, "w*"]),
)


@PROPERTY_SETTINGS
@given(name=valid_names)
def test_valid_names_are_stored_exactly(name: str) -> None:
    with Ledger.in_memory(clock=FrozenClock()) as ledger:
        task = ledger.create_task(tenant=name)
        assert task.tenant == name
        claimed = ledger.claim(task.id, name)
        assert claimed is not None and claimed.owner == name
        stored = ledger.get_task(task.id)
        assert (stored.tenant, stored.owner) == (name, name)
        assert stored.to_dict()["owner"] == name and stored.to_dict()["tenant"] == name
        assert ledger.list_tasks(tenant=name, owner=name) == [stored]
        other = ledger.create_task(tenant=name)
        assert [t.id for t in ledger.claim_next(name, tenant=name)] == [other.id]
        assert ledger.release(other.id, name).owner is None
        assert ledger.charge(task.id, worker=name).allowed is True


@PROPERTY_SETTINGS
@given(bad=invalid_names)
def test_invalid_names_are_refused_and_write_nothing(bad: str) -> None:
    with Ledger.in_memory(clock=FrozenClock()) as ledger:
        task = ledger.create_task(tenant="ok")
        with pytest.raises(InvalidInput):
            ledger.create_task(tenant=bad)
        with pytest.raises(InvalidInput):
            ledger.claim(task.id, bad)
        with pytest.raises(InvalidInput):
            ledger.claim_next(bad)
        with pytest.raises(InvalidInput):
            ledger.claim_next("w1", tenant=bad)
        with pytest.raises(InvalidInput):
            ledger.list_tasks(owner=bad)
        assert ledger.list_tasks() == [task]
        assert ledger.get_task(task.id) == task


@pytest.mark.parametrize("bad", [1, 1.5, b"w1", ["w1"], True])
def test_non_string_names_are_refused(bad: Any) -> None:
    with Ledger.in_memory(clock=FrozenClock()) as ledger:
        task = ledger.create_task()
        with pytest.raises(InvalidInput):
            ledger.create_task(tenant=bad)
        with pytest.raises(InvalidInput):
            ledger.claim(task.id, bad)
        assert ledger.list_tasks() == [task]


# -- budgets at the i64 edges ------------------------------------------------------------

edge_ints = st.one_of(
    st.sampled_from([0, 1, 2**31, 2**32, 2**53 + 1, 2**62, I64_MAX - 1, I64_MAX]),
    st.integers(0, I64_MAX),
)
maybe_limit = st.one_of(st.none(), edge_ints)


@PROPERTY_SETTINGS
@given(calls=maybe_limit, tokens=maybe_limit, cost=maybe_limit, attempts=edge_ints)
def test_budgets_round_trip_at_i64_edges(
    calls: int | None, tokens: int | None, cost: int | None, attempts: int
) -> None:
    with Ledger.in_memory(clock=FrozenClock()) as ledger:
        task = ledger.create_task(
            llm_calls_budget=calls,
            token_budget=tokens,
            cost_budget_micros=cost,
            max_attempts=attempts,
        )
        stored = ledger.get_task(task.id)
        assert stored == task
        assert (
            stored.llm_calls_budget,
            stored.token_budget,
            stored.cost_budget_micros,
            stored.max_attempts,
        ) == (calls, tokens, cost, attempts)
        figures = ledger.budget(task.id)
        assert (figures.calls_budget, figures.token_budget, figures.cost_budget_micros) == (
            calls,
            tokens,
            cost,
        )
        assert (figures.calls_remaining, figures.tokens_remaining) == (calls, tokens)
        assert figures.cost_remaining_micros == cost
        assert ledger.list_tasks()[0].to_dict()["cost_budget_micros"] == cost


@pytest.mark.parametrize("bad", [-1, 2**63, 2**64, -(2**63), 1.5, float("inf"), "5", True])
@pytest.mark.parametrize("arg", ["llm_calls_budget", "token_budget", "cost_budget_micros"])
def test_out_of_range_budgets_are_refused(arg: str, bad: Any) -> None:
    with Ledger.in_memory(clock=FrozenClock()) as ledger:
        with pytest.raises(InvalidInput):
            ledger.create_task(**{arg: bad})
        assert ledger.list_tasks() == []


@PROPERTY_SETTINGS
@given(limit=st.integers(1, I64_MAX), dim=st.sampled_from(DIMS))
def test_a_charge_up_to_an_i64_limit_fits_and_one_more_escalates(limit: int, dim: str) -> None:
    kwarg = {"calls": "llm_calls_budget", "tokens": "token_budget", "cost": "cost_budget_micros"}
    amount = {"calls": "calls", "tokens": "tokens", "cost": "cost_micros"}[dim]
    with Ledger.in_memory(clock=FrozenClock()) as ledger:
        task = ledger.create_task(**{"llm_calls_budget": None, kwarg[dim]: limit})
        ledger.claim(task.id, "w1")
        full = ledger.charge(task.id, **{"calls": 0, amount: limit})
        assert full.allowed is True and full.exhausted is None
        assert ledger.budget(task.id).exhausted == dim
        over = ledger.charge(task.id, **{"calls": 0, amount: 1})
        assert (over.allowed, over.escalated, over.exhausted) == (False, True, dim)
        stored = ledger.get_task(task.id)
        assert (stored.status, stored.park_code) == (S.ESCALATED, "budget_exhausted")
        used = {
            "calls": stored.llm_calls_used,
            "tokens": stored.tokens_used,
            "cost": stored.cost_used_micros,
        }
        assert used[dim] == limit


def test_grant_up_to_i64_max_and_no_further() -> None:
    with Ledger.in_memory(clock=FrozenClock()) as ledger:
        task = ledger.create_task(llm_calls_budget=5, token_budget=None, cost_budget_micros=0)
        raised = ledger.grant(task.id, calls=I64_MAX - 5, tokens=7, cost_micros=I64_MAX)
        assert (raised.llm_calls_budget, raised.token_budget, raised.cost_budget_micros) == (
            I64_MAX,
            None,
            I64_MAX,
        )
        with pytest.raises(InvalidInput):
            ledger.grant(task.id, calls=1)
        with pytest.raises(InvalidInput):
            ledger.grant(task.id, calls=2**63)
        assert ledger.get_task(task.id) == raised
