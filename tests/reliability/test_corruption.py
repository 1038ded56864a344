"""Corrupt files (SPEC §2.4, §6): seeded byte flips, bursts, zeroed pages and
truncations of copies of a healthy ledger file, and flips in an un-checkpointed
WAL.

Every case is probed in a child process (``_corrupt_probe.py``, with a
timeout) that opens the copy read-only and writable and runs ``doctor()``.
For every case: no crash (signal), no hang, no exception but a
``LedgerError`` subclass. Where the damage is proven to hit live data the
answer must also never be ``healthy: True``:

- the system SQLite cannot read the file or its ``PRAGMA quick_check`` fails
  (the check doctor is specified to run), or
- the rows of ``task_events`` (hash-chained, SPEC §3), ``schema_meta`` or
  ``sqlite_master`` differ from the pristine file's (the exact-schema check).

Flips that only change a task row's value (say one letter of a tenant), land
in free space, or only break an index (found by ``integrity_check`` but not
by ``quick_check``) may legitimately leave the ledger healthy; they are
counted in the figures, and only a clean answer is asserted for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from taskwarden import Ledger, StateConflict

from ..conftest import run_cli
from ._corrupt_probe import system_view

PROBE = Path(__file__).with_name("_corrupt_probe.py")
SHORT_CASES, LONG_CASES = 160, 4000
BATCH = 40
# Tables whose rows doctor vouches for: events are hash-chained, the schema is exact.
PROVEN_TABLES = ("task_events", "schema_meta", "sqlite_master")
TABLES = ("tasks", *PROVEN_TABLES)
CASE_TIMEOUT = 20.0


def _build(path: Path, tasks: int, keep_open: bool = False) -> Ledger | None:
    """A healthy ledger with tasks in every state, budgets, parents and events."""
    rng = random.Random(7)
    ledger = Ledger(path)
    roots = [ledger.create_task(tenant="acme", llm_calls_budget=100).id for _ in range(5)]
    for i in range(tasks):
        task = ledger.create_task(
            parent_id=rng.choice(roots) if i % 3 == 0 else None,
            tenant=rng.choice(["acme", "globex", None]),
            payload_hash=f"{i:064x}",
            token_budget=rng.choice([None, 5000]),
            delivery_required=i % 4 != 0,
        )
        kind = i % 6
        if kind == 0:
            continue
        ledger.claim(task.id, f"worker-{i % 7}")
        if kind >= 2:
            ledger.charge(task.id, calls=2, tokens=100, worker=f"worker-{i % 7}")
        if kind == 3:
            ledger.block(task.id)
        if kind == 4:
            ledger.close_task(task.id, "succeeded", worker=f"worker-{i % 7}")
            ledger.set_delivery(task.id, "delivered" if i % 4 else "not_applicable")
        if kind == 5:
            ledger.close_task(task.id, "failed")
    # Some deleted rows leave free pages and free space inside pages.
    ledger.purge(older_than_seconds=0, tenant="globex")
    assert ledger.doctor()["healthy"] is True
    if keep_open:
        return ledger
    ledger.close()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    return None


def _pages(path: Path) -> dict[str, list[int]]:
    """Page numbers of each b-tree (tables and indexes) from dbstat."""
    pages: dict[str, list[int]] = {}
    with contextlib.closing(sqlite3.connect(f"file:{path}?immutable=1", uri=True)) as conn:
        for name, pageno in conn.execute("SELECT name, pageno FROM dbstat"):
            pages.setdefault(name, []).append(pageno)
    return pages


def _mutate(data: bytes, rng: random.Random, pages: dict[str, list[int]], page_size: int):
    """One seeded mutation: (kind, new bytes)."""
    out = bytearray(data)
    kind = rng.choices(
        ["flip", "live_flip", "burst", "zero_page", "header", "truncate"],
        weights=[25, 30, 10, 10, 10, 15],
    )[0]
    if kind == "truncate":
        if rng.random() < 0.5:
            cut = rng.randrange(1, len(data) // page_size) * page_size
        else:
            cut = rng.randrange(1, len(data))
        return kind, bytes(out[:cut])
    if kind == "header":
        offsets = [rng.randrange(0, 100)]
    elif kind == "live_flip":
        table = rng.choice(["tasks", "task_events"])
        page = rng.choice(pages[table])
        offsets = [(page - 1) * page_size + rng.randrange(page_size)]
    elif kind == "burst":
        start = rng.randrange(len(data))
        offsets = list(range(start, min(len(data), start + rng.randint(2, 64))))
    elif kind == "zero_page":
        page = rng.randrange(1, len(data) // page_size + 1)
        for i in range((page - 1) * page_size, page * page_size):
            out[i] = 0
        return kind, bytes(out)
    else:
        offsets = [rng.randrange(len(data)) for _ in range(rng.randint(1, 3))]
    for offset in offsets:
        out[offset] ^= rng.randint(1, 255)
    return kind, bytes(out)


def _write_case(directory: Path, files: dict[str, bytes]) -> None:
    directory.mkdir(mode=0o700)
    for name, content in files.items():
        target = directory / name
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)


def _run_probe(batch: list[Path]) -> tuple[list[dict[str, Any]], str]:
    try:
        done = subprocess.run(
            [sys.executable, str(PROBE), *map(str, batch)],
            capture_output=True,
            timeout=CASE_TIMEOUT * len(batch),
            check=False,
        )
        last = (done.stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
        stdout, code = done.stdout, f"exit code {done.returncode}: {last[:200]}"
    except subprocess.TimeoutExpired as exc:
        stdout, code = exc.stdout or b"", "timeout"
    answered = [json.loads(line) for line in stdout.decode().splitlines() if line[:1] == "{"]
    for result in answered:
        result["dir"] = str(batch[result.pop("case")])
    return answered, code


def _probe(case_dirs: list[Path]) -> list[dict[str, Any]]:
    """Probe cases in child processes; a crash or a hang becomes a result too."""
    results: list[dict[str, Any]] = []
    pending = list(case_dirs)
    while pending:
        batch = pending[:BATCH]
        answered, code = _run_probe(batch)
        results += answered
        pending = pending[len(answered) :]
        if len(answered) < len(batch):
            # The case after the last answer crashed or hung: run it alone to
            # tell a real crash from a flake (e.g. the extension being replaced).
            suspect = pending.pop(0)
            again, code = _run_probe([suspect]) if len(batch) > 1 else ([], code)
            results += again or [{"dir": str(suspect), "crash": code}]
    return results


def _judge(results: list[dict[str, Any]], cases: dict[str, dict[str, Any]], pristine):
    problems, counts = [], {"cases": 0, "proven_live": 0, "healthy_unproven": 0}
    counts.update(index_only_damage_healthy=0, task_rows_changed_healthy=0, clean_errors=0)
    for result in results:
        case = cases[result["dir"]]
        counts["cases"] += 1
        label = f"{case['kind']} seed={case['seed']}"
        if "crash" in result:
            problems.append(f"{label}: the probe crashed or hung ({result['crash']})")
            continue
        answers = [result["read_only"], result["writable"]]
        for answer in answers:
            if "bad" in answer:
                problems.append(f"{label}: unclean exception {answer['bad']}")
            counts["clean_errors"] += "error" in answer
        healthy = any(a.get("healthy") is True for a in answers)
        view = result.get("sqlite")
        if view is None:  # WAL cases: the WAL checksum may legitimately drop frames
            counts["healthy_unproven"] += healthy
            continue
        # Proven: SQLite cannot open it, quick_check fails (or gives up), a table
        # cannot be read, or the rows doctor vouches for differ.
        unreadable = "open" in view or any(str(view.get(t, "")).startswith("error") for t in TABLES)
        damaged = unreadable or view.get("quick_check") != ["ok"]
        changed = [t for t in PROVEN_TABLES if view.get(t) != pristine[t]]
        if damaged or changed:
            counts["proven_live"] += 1
            if healthy:
                index = "ok" if view.get("integrity_check") == ["ok"] else "fails"
                why = f"quick_check={view.get('quick_check')} open={view.get('open', 'ok')}"
                problems.append(
                    f"{label}: doctor says healthy (integrity_check {index}) although "
                    + (why if damaged else f"rows of {changed} changed")
                )
        elif healthy:
            counts["healthy_unproven"] += 1
            # Index-only damage (integrity_check reports it or gives up): counted.
            counts["index_only_damage_healthy"] += view["integrity_check"] != ["ok"]
            counts["task_rows_changed_healthy"] += view["tasks"] != pristine["tasks"]
    return problems, counts


def test_damaged_files_give_clean_answers_never_false_health(
    tmp_path: Path, long_campaign: bool, figures: Any
) -> None:
    source = tmp_path / "source"
    source.mkdir(mode=0o700)
    _build(source / "ledger.db", tasks=150)
    data = (source / "ledger.db").read_bytes()
    pages = _pages(source / "ledger.db")
    pristine = system_view(source / "ledger.db")
    assert pristine["quick_check"] == pristine["integrity_check"] == ["ok"]
    assert "open" not in pristine and not any(str(v).startswith("error") for v in pristine.values())
    page_size = 2048
    assert len(data) % page_size == 0 and pages["tasks"] and pages["task_events"]

    count = LONG_CASES if long_campaign else SHORT_CASES
    cases: dict[str, dict[str, Any]] = {}
    root = tmp_path / "cases"
    root.mkdir(mode=0o700)
    for seed in range(count):
        rng = random.Random(seed)
        kind, mutated = _mutate(data, rng, pages, page_size)
        if mutated == data:
            continue
        directory = root / f"case-{seed}"
        _write_case(directory, {"ledger.db": mutated})
        cases[str(directory)] = {"kind": kind, "seed": seed}
    started = time.monotonic()
    results = _probe([Path(d) for d in cases])
    problems, counts = _judge(results, cases, pristine)
    figures.record("corruption", seconds=round(time.monotonic() - started, 1), **counts)
    assert len(results) == len(cases)
    assert problems == [], problems[:20]
    assert counts["proven_live"] > count // 3  # the campaign really hit live data


def test_damaged_wal_gives_clean_answers(tmp_path: Path, long_campaign: bool, figures: Any) -> None:
    source = tmp_path / "source"
    source.mkdir(mode=0o700)
    ledger = _build(source / "ledger.db", tasks=60, keep_open=True)
    assert ledger is not None
    try:
        # Read the three files while the ledger is open (plain reads, no SQLite).
        files = {p.name: p.read_bytes() for p in source.iterdir()}
    finally:
        ledger.close()
    if "ledger.db-wal" not in files or len(files["ledger.db-wal"]) < 64:
        pytest.skip("the ledger checkpointed everything: no WAL to damage")
    wal = files["ledger.db-wal"]
    count = (LONG_CASES if long_campaign else SHORT_CASES) // 4
    cases: dict[str, dict[str, Any]] = {}
    root = tmp_path / "cases"
    root.mkdir(mode=0o700)
    for seed in range(count):
        rng = random.Random(10_000 + seed)
        out = bytearray(wal)
        if rng.random() < 0.2:
            out = out[: rng.randrange(1, len(out))]
            kind = "wal_truncate"
        else:
            for _ in range(rng.randint(1, 4)):
                out[rng.randrange(len(out))] ^= rng.randint(1, 255)
            kind = "wal_flip"
        directory = root / f"case-{seed}"
        _write_case(directory, {**files, "ledger.db-wal": bytes(out)})
        cases[str(directory)] = {"kind": kind, "seed": seed}
    results = _probe([Path(d) for d in cases])
    problems, counts = _judge(results, cases, {})
    figures.record("corruption_wal", **counts)
    assert len(results) == len(cases)
    assert problems == [], problems[:20]


def _dump(path: Path) -> dict[str, list[str]]:
    uri = f"file:{path}?immutable=1"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        conn.text_factory = bytes
        return {t: sorted(repr(r) for r in conn.execute(f'SELECT * FROM "{t}"')) for t in TABLES}


def _live_schema_text(path: Path, text: bytes) -> int:
    """Where ``text`` first stands in the schema's leaf or overflow pages:
    once the schema outgrew page 1, that page kept stale copies of its
    text in free space, where a change alters nothing."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?immutable=1", uri=True)) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = sorted(
            pageno
            for (pageno,) in conn.execute(
                "SELECT pageno FROM dbstat WHERE name = 'sqlite_schema' AND pagetype <> 'internal'"
            )
        )
    data = path.read_bytes()
    for pageno in pages:
        start = (pageno - 1) * page_size
        found = data.find(text, start, start + page_size)
        if found >= 0:
            return found
    raise AssertionError("the text is in no live page of the schema")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b"'failed'", b"'\xe3ailed'"),  # invalid UTF-8 inside a CHECK constraint
        (b"'failed'", b"'gailed'"),  # valid text, different schema
        (b"CREATE INDEX", b"CREATE INDE\xd8"),
    ],
)
def test_damaged_schema_text_gives_a_clean_answer(tmp_path: Path, old: bytes, new: bytes) -> None:
    """One byte of the stored schema SQL (``sqlite_schema``) changed on disk:
    opening and doctor give a ``LedgerError`` or ``healthy: False``, never
    another exception (seen: ``RuntimeError: internal storage error``)."""
    source = tmp_path / "source"
    source.mkdir(mode=0o700)
    _build(source / "ledger.db", tasks=20)
    data = (source / "ledger.db").read_bytes()
    offset = _live_schema_text(source / "ledger.db", old)
    assert len(old) == len(new)
    case = tmp_path / "case"
    _write_case(case, {"ledger.db": data[:offset] + new + data[offset + len(old) :]})
    (result,) = _probe([case])
    for answer in (result["read_only"], result["writable"]):
        assert "bad" not in answer, answer
        assert answer != {"healthy": True}


def test_a_schema_meta_without_its_columns_is_not_a_ledger(tmp_path: Path) -> None:
    """``schema_meta``'s stored DDL damaged so that it loses its ``value``
    column (one flipped byte: ``value TEXT`` -> ``value0TEXT``): every open
    is a ``StateConflict``, and doctor exits 2. The metadata used to be read
    before the DDL was checked, and the failed read was an internal error
    (``RuntimeError``, exit 3) for every open, doctor's included."""
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA writable_schema=ON")
        conn.execute(
            "UPDATE sqlite_master SET sql = replace(sql, 'value TEXT', 'value0TEXT') "
            "WHERE name = 'schema_meta'"
        )
        conn.commit()
    for read_only in (True, False):
        with pytest.raises(StateConflict):
            Ledger(path, read_only=read_only)
    for extra in ([], ["--read-only"]):
        code, parsed, _ = run_cli("--db", str(path), "doctor", *extra)
        assert (code, parsed) == (2, {"error": "StateConflict", "ok": False})


@pytest.mark.parametrize(
    ("table", "column", "flip_at"),
    [
        ("task_events", "to_value", 1),  # the event now tells another move
        ("task_events", "worker", -1),  # the event names another worker
        ("tasks", "id", 5),  # the task's id is no longer the one its events name
    ],
)
def test_single_byte_edit_of_a_live_row_is_unhealthy(
    tmp_path: Path, table: str, column: str, flip_at: int
) -> None:
    """One byte of one live row changed on disk, in the table b-tree only (as
    bit rot or a hand edit with a hex editor would): the rows really differ
    (checked with the system SQLite), so doctor must not say healthy."""
    source = tmp_path / "source"
    source.mkdir(mode=0o700)
    _build(source / "ledger.db", tasks=30)
    path = source / "ledger.db"
    data, pages, before = path.read_bytes(), _pages(path), _dump(path)
    with contextlib.closing(sqlite3.connect(f"file:{path}?immutable=1", uri=True)) as conn:
        values = [r[0] for r in conn.execute(f'SELECT "{column}" FROM "{table}"') if r[0]]
    case = None
    for number, value in enumerate(values):
        needle = value.encode()
        for page in pages[table]:
            start = data.find(needle, (page - 1) * 2048, page * 2048)
            if start < 0:
                continue
            offset = start + (flip_at % len(needle))
            mutated = bytearray(data)
            mutated[offset] = ord("e") if mutated[offset] != ord("e") else ord("f")
            candidate = tmp_path / f"case-{number}-{page}"
            _write_case(candidate, {"ledger.db": bytes(mutated)})
            after = _dump(candidate / "ledger.db")
            if after[table] != before[table]:  # a live row, not a freed cell
                case = candidate
                break
        if case is not None:
            break
    assert case is not None, "no live occurrence found"
    (result,) = _probe([case])
    assert result["read_only"] != {"healthy": True}
    assert result["writable"] != {"healthy": True}


def test_probe_detects_a_plain_event_edit(tmp_path: Path) -> None:
    """Control for the probe: an event row edited with the system SQLite (the
    ledger closed, indexes kept in step) is reported unhealthy by both opens."""
    source = tmp_path / "source"
    source.mkdir(mode=0o700)
    _build(source / "ledger.db", tasks=20)
    edited = tmp_path / "edited"
    edited.mkdir(mode=0o700)
    shutil.copy2(source / "ledger.db", edited / "ledger.db")
    with contextlib.closing(sqlite3.connect(edited / "ledger.db")) as conn:
        conn.execute("UPDATE task_events SET occurred_at = occurred_at + 1 WHERE sequence = 3")
        conn.commit()
    for name in ("ledger.db-wal", "ledger.db-shm"):
        assert not (edited / name).exists()
    (result,) = _probe([edited])
    assert result["read_only"] == {"healthy": False}
    assert result["writable"] == {"healthy": False}
