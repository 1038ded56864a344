//! The v3 schema, its exact fingerprint, and how files of an earlier
//! schema are recognised: task-state-guard 0.1.0's (v1 and v2, migrated
//! here in one transaction) and taskwarden's own earlier v3 layouts (see
//! `layout_upgrade`).
//!
//! The peer refuses any file whose schema objects differ from its own by a
//! single token, so taskwarden's additions live under a new version number:
//! a v3 file is ours alone, and the README says so.

use std::collections::HashMap;
use std::sync::OnceLock;

use rusqlite::{params, Connection, Transaction};
use sha2::{Digest, Sha256};

use crate::checks;
use crate::errors::{Error, Result};
use crate::events;
use crate::fsm::{self, DeliveryStatus, TaskStatus};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 3;

/// The fingerprint of task-state-guard 0.1.0's DDL (v1 and v2 share it);
/// an interop constant, so a peer file is recognised before it is migrated.
pub const PEER_FINGERPRINT: &str =
    "50ae209ec97afb360e142cfae85767f575acc2a065103f5b642bfd0c141e08f6";

/// The fingerprints of taskwarden's earlier v3 layouts: the first, written
/// by builds before its CHECKs gave up `IN` lists; the second, whose events
/// named their task by its text id; and the third, which had no index of
/// the tasks in creation order ([`CREATION_ORDER_INDEX`]) and held a
/// parent's children in no order ([`CHILDREN_INDEX`]).
pub const EARLIER_LAYOUT_FINGERPRINTS: [&str; 3] = [
    "982ad3385d1ee3cb3bf59c616f18e2eb60bbc49373064357ea19cce3eca06f27",
    "1609c2b5a35dfe830f0f24024f897dcf721bfeee0fc8c3e4bb032f332e545d52",
    THIRD_LAYOUT_FINGERPRINT,
];

/// The layout the current one only adds [`CREATION_ORDER_INDEX`] to and
/// orders [`CHILDREN_INDEX`] in.
pub const THIRD_LAYOUT_FINGERPRINT: &str =
    "ba72042b962ea0b717bb5abcba3bf3c99df2063d549ba9ceba3cd77f4c96c626";

/// Every task in the order lists are read in (SPEC 2.2.1: `(created_at,
/// id)`), so that a page of any filter but a parent's or the running
/// tasks' (which have indexes of their own) reads from its cursor on
/// instead of scanning and sorting the whole table (a walk through 200,000
/// closed tasks, 100 a page, took 64 s). Its entries change only when a task
/// is created or deleted, never on a claim, a charge or a close. One of the
/// statements of [`DDL`], in its words.
pub const CREATION_ORDER_INDEX: &str = "CREATE INDEX tasks_created_idx ON tasks(created_at, id);";

/// A parent's children in the order lists read them, so that a page of
/// one parent's children (and `children_of`) reads from its cursor on: the
/// third layout's index held the parent alone, and every page read and
/// sorted all the children (17 ms a page at 100,000 of them). Its entries,
/// too, change only when a task is created or deleted. One of the
/// statements of [`DDL`], in its words.
pub const CHILDREN_INDEX: &str = "CREATE INDEX tasks_parent_idx ON tasks(parent_id, created_at, id)
    WHERE parent_id IS NOT NULL;";

const PEER_OBJECTS: [&str; 6] = [
    "schema_meta",
    "task_events",
    "tasks",
    "tasks_delivery_idx",
    "tasks_parent_idx",
    "tasks_status_idx",
];

/// The v3 DDL. Statement text is part of the fingerprint: change nothing
/// here without a way for files of the old text to reach the new one (a
/// new schema version and a migration, or a layout upgrade as below).
///
/// The CHECKs spell their lists of values as `=` comparisons, never as
/// `IN (...)`: SQLite builds a temporary index for an `IN` list of three or
/// more values on every run of a statement that evaluates it, which made
/// that a third of the cost of a claim (the first v3 layout's).
///
/// An event names its task by the task's number (`task_no`, the rowid it
/// declares, so `VACUUM` keeps it), not by its 36-character id: each event
/// row and each entry of the events' index is that much smaller, and a
/// 100,000-task reconcile writes a fifth less (the second layout's events
/// held the id).
///
/// Every index but the events' and the creation order's is partial: it
/// holds only the rows some query looks for (queued tasks to claim,
/// running tasks to reconcile, pending deliveries of ended tasks), so most
/// writes touch few indexes and the indexes stay small however long the
/// ledger lives.
pub const DDL: &str = "
CREATE TABLE schema_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE tasks (
    task_no INTEGER PRIMARY KEY,
    id TEXT UNIQUE,
    parent_id TEXT REFERENCES tasks(id),
    status TEXT NOT NULL CHECK (
        status = 'queued' OR status = 'running' OR status = 'blocked' OR status = 'escalated'
        OR status = 'succeeded' OR status = 'failed' OR status = 'timed_out'
        OR status = 'cancelled'
    ),
    delivery_status TEXT NOT NULL CHECK (
        delivery_status = 'pending' OR delivery_status = 'delivered'
        OR delivery_status = 'failed' OR delivery_status = 'not_applicable'
    ),
    delivery_required INTEGER NOT NULL CHECK (delivery_required IN (0,1)),
    payload_hash TEXT CHECK (
        payload_hash IS NULL OR (
            length(payload_hash) = 64 AND payload_hash NOT GLOB '*[^0-9a-f]*'
        )
    ),
    timeout_seconds REAL CHECK (timeout_seconds IS NULL OR timeout_seconds >= 0),
    created_at REAL NOT NULL,
    started_at REAL,
    updated_at REAL NOT NULL,
    ended_at REAL,
    deadline_at REAL,
    delivery_updated_at REAL NOT NULL,
    terminal_code TEXT,
    delivery_code TEXT,
    version INTEGER NOT NULL DEFAULT 0 CHECK (version >= 0),
    tenant TEXT CHECK (tenant IS NULL OR length(tenant) BETWEEN 1 AND 128),
    owner TEXT CHECK (owner IS NULL OR length(owner) BETWEEN 1 AND 128),
    park_code TEXT,
    attempt_count INTEGER NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    max_attempts INTEGER NOT NULL DEFAULT 3 CHECK (max_attempts >= 0),
    llm_calls_used INTEGER NOT NULL DEFAULT 0 CHECK (llm_calls_used >= 0),
    llm_calls_budget INTEGER CHECK (llm_calls_budget IS NULL OR llm_calls_budget >= 0),
    tokens_used INTEGER NOT NULL DEFAULT 0 CHECK (tokens_used >= 0),
    token_budget INTEGER CHECK (token_budget IS NULL OR token_budget >= 0),
    cost_used_micros INTEGER NOT NULL DEFAULT 0 CHECK (cost_used_micros >= 0),
    cost_budget_micros INTEGER CHECK (cost_budget_micros IS NULL OR cost_budget_micros >= 0),
    event_head BLOB NOT NULL CHECK (length(event_head) = 32),
    CHECK (parent_id IS NULL OR parent_id <> id),
    CHECK (deadline_at IS NULL OR started_at IS NOT NULL),
    CHECK (
        (ended_at IS NULL)
        = (status = 'queued' OR status = 'running' OR status = 'blocked' OR status = 'escalated')
    )
);
CREATE TABLE task_events (
    sequence INTEGER PRIMARY KEY,
    task_no INTEGER NOT NULL REFERENCES tasks(task_no),
    event_kind TEXT NOT NULL CHECK (
        event_kind = 'created' OR event_kind = 'task_transition'
        OR event_kind = 'delivery_transition' OR event_kind = 'budget_granted'
    ),
    from_value TEXT,
    to_value TEXT NOT NULL,
    occurred_at REAL NOT NULL,
    code TEXT,
    worker TEXT,
    grant_calls INTEGER,
    grant_tokens INTEGER,
    grant_cost_micros INTEGER,
    event_hash BLOB NOT NULL CHECK (length(event_hash) = 32)
);
CREATE INDEX tasks_parent_idx ON tasks(parent_id, created_at, id)
    WHERE parent_id IS NOT NULL;
CREATE INDEX tasks_running_idx ON tasks(updated_at) WHERE status = 'running';
CREATE INDEX tasks_pending_delivery_idx ON tasks(ended_at)
    WHERE delivery_status = 'pending' AND ended_at IS NOT NULL;
CREATE INDEX tasks_queue_idx ON tasks(created_at, id) WHERE status = 'queued';
CREATE INDEX tasks_tenant_queue_idx ON tasks(tenant, created_at, id)
    WHERE status = 'queued' AND tenant IS NOT NULL;
CREATE INDEX task_events_task_idx ON task_events(task_no);
CREATE INDEX tasks_created_idx ON tasks(created_at, id);
";

/// What an existing file holds, judged before anything is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// No schema objects at all: a new or empty file.
    Empty,
    /// A file of an earlier schema or layout: migrated by a writable open
    /// before anything is written, and read through a migrated private copy.
    Earlier(Earlier),
    /// A current taskwarden file.
    Current,
}

/// The earlier schemas and layouts a file may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Earlier {
    /// A task-state-guard 0.1.0 file at version 1 or 2.
    Peer(i64),
    /// A taskwarden v3 file of an earlier layout, and what its upgrade
    /// must do.
    Layout(LayoutUpgrade),
}

/// How a file of an earlier v3 layout reaches the current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutUpgrade {
    /// The first two layouts: both tables are rebuilt (events named their
    /// task by id), which leaves the old tables' pages free.
    Rebuild,
    /// The third: only indexes are built, the rows stay where they are.
    Index,
}

impl Earlier {
    /// The version its `schema_meta` holds.
    #[must_use]
    pub fn version(self) -> i64 {
        match self {
            Earlier::Peer(version) => version,
            Earlier::Layout(_) => 3,
        }
    }
}

/// The fingerprint of the schema objects in `conn`'s main database: SHA-256
/// over the compact JSON list of `[type, name, tbl_name, sql]`, with runs of
/// white space in `sql` folded to one space (the peer's algorithm).
pub fn fingerprint(conn: &Connection) -> Result<String> {
    let mut stmt = conn.prepare(
        "SELECT type, name, tbl_name, sql FROM sqlite_master \
         WHERE name NOT LIKE 'sqlite_%' AND sql IS NOT NULL ORDER BY type, name",
    )?;
    let mut rows = stmt.query([])?;
    let mut json = String::from("[");
    let mut first = true;
    while let Some(row) = rows.next()? {
        if !first {
            json.push(',');
        }
        first = false;
        json.push('[');
        for i in 0..4 {
            if i > 0 {
                json.push(',');
            }
            let text: String = row.get(i)?;
            let text = if i == 3 {
                text.split_whitespace().collect::<Vec<_>>().join(" ")
            } else {
                text
            };
            push_json_string(&mut json, &text);
        }
        json.push(']');
    }
    json.push(']');
    Ok(hex(&Sha256::digest(json.as_bytes())))
}

/// The fingerprint of a fresh v3 schema, computed once per process.
pub fn current_fingerprint() -> Result<&'static str> {
    static FP: OnceLock<String> = OnceLock::new();
    if let Some(fp) = FP.get() {
        return Ok(fp);
    }
    let fp = fingerprint(&fresh_schema()?)?;
    Ok(FP.get_or_init(|| fp))
}

/// A private in-memory database holding exactly the v3 DDL.
fn fresh_schema() -> Result<Connection> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch(DDL)?;
    Ok(conn)
}

/// Lowercase hex of a digest.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// JSON string escaping as Python's `json.dumps(ensure_ascii=True)` does it.
fn push_json_string(out: &mut String, text: &str) {
    use std::fmt::Write;
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Reads `schema_meta` and the object set, and says what the file is.
/// Anything that is neither empty, nor an exact peer file, nor an exact v3
/// file is refused: a ledger never guesses at a schema.
pub fn inspect(conn: &Connection) -> Result<Found> {
    const MISMATCH: Error = Error::Conflict("schema does not match");
    if has_planted_objects(conn)? {
        return Err(MISMATCH);
    }
    let names: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    if names.is_empty() {
        return Ok(Found::Empty);
    }
    if !names.iter().any(|n| n == "schema_meta") {
        return Err(MISMATCH);
    }
    // The objects first: `schema_meta` is read only once its own DDL is
    // known to be one of ours (damaged, say a column renamed by one
    // flipped byte, the read failed as an internal error).
    let fp = fingerprint(conn)?;
    let known = [current_fingerprint()?, PEER_FINGERPRINT];
    if !known.contains(&fp.as_str()) && !EARLIER_LAYOUT_FINGERPRINTS.contains(&fp.as_str()) {
        return Err(MISMATCH);
    }
    let meta = read_meta(conn)?;
    let version = meta.get("schema_version").ok_or(MISMATCH)?;
    match version.as_str() {
        "3" => {
            let stored = meta.get("schema_fingerprint").map(String::as_str);
            let exact =
                |expected: &str| meta.len() == 2 && stored == Some(expected) && fp == expected;
            if exact(current_fingerprint()?) {
                Ok(Found::Current)
            } else if exact(THIRD_LAYOUT_FINGERPRINT) {
                Ok(Found::Earlier(Earlier::Layout(LayoutUpgrade::Index)))
            } else if EARLIER_LAYOUT_FINGERPRINTS
                .iter()
                .any(|layout| exact(layout))
            {
                Ok(Found::Earlier(Earlier::Layout(LayoutUpgrade::Rebuild)))
            } else {
                Err(MISMATCH)
            }
        }
        "1" | "2" => {
            let objects_ok = names
                .iter()
                .map(String::as_str)
                .eq(PEER_OBJECTS.iter().copied());
            let meta_ok = if version == "1" {
                meta.len() == 1
            } else {
                meta.len() == 2
                    && meta.get("schema_fingerprint").map(String::as_str) == Some(PEER_FINGERPRINT)
            };
            if objects_ok && meta_ok && fp == PEER_FINGERPRINT {
                Ok(Found::Earlier(Earlier::Peer(if version == "1" {
                    1
                } else {
                    2
                })))
            } else {
                Err(MISMATCH)
            }
        }
        _ => Err(Error::Conflict("unsupported schema version")),
    }
}

/// Objects whose names the fingerprint skips (the peer's `LIKE 'sqlite_%'`,
/// which also takes `sqlitex` in any case) but which SQLite did not make:
/// a trigger or view hidden there would still run, a table hold free text.
/// What SQLite makes itself is a primary key's or UNIQUE's index without
/// text, the AUTOINCREMENT table and `ANALYZE`'s tables, each in its own
/// exact words.
fn has_planted_objects(conn: &Connection) -> Result<bool> {
    Ok(conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name LIKE 'sqlite_%' AND NOT (
            (type = 'index' AND sql IS NULL AND name GLOB 'sqlite_autoindex_*')
            OR (type = 'table' AND (name, sql) IN (VALUES
                ('sqlite_sequence', 'CREATE TABLE sqlite_sequence(name,seq)'),
                ('sqlite_stat1', 'CREATE TABLE sqlite_stat1(tbl,idx,stat)'),
                ('sqlite_stat4', 'CREATE TABLE sqlite_stat4(tbl,idx,neq,nlt,ndlt,sample)')))))",
        [],
        |r| r.get(0),
    )?)
}

fn read_meta(conn: &Connection) -> Result<HashMap<String, String>> {
    let mut stmt = conn.prepare("SELECT key, value FROM schema_meta")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, rusqlite::types::Value>(0)?,
            r.get::<_, rusqlite::types::Value>(1)?,
        ))
    })?;
    let mut meta = HashMap::new();
    for row in rows {
        match row? {
            (rusqlite::types::Value::Text(k), rusqlite::types::Value::Text(v)) => {
                meta.insert(k, v);
            }
            _ => return Err(Error::Conflict("schema does not match")),
        }
    }
    Ok(meta)
}

/// Creates the v3 schema in an empty database, inside `tx`.
pub fn create(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch(DDL)?;
    write_meta(tx)
}

fn write_meta(tx: &Transaction<'_>) -> Result<()> {
    tx.execute("DELETE FROM schema_meta", [])?;
    tx.execute(
        "INSERT INTO schema_meta(key, value) VALUES ('schema_version', ?1), ('schema_fingerprint', ?2)",
        params![SCHEMA_VERSION.to_string(), current_fingerprint()?],
    )?;
    Ok(())
}

/// What a peer file's migration does with rows the peer itself would not
/// migrate (codes outside its registry, broken parent links, values its
/// CHECKs forbid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DamagedRows {
    /// The migration is refused: the file itself would be rewritten.
    Refuse,
    /// They are carried over as they are, for doctor to count: only a
    /// private copy is migrated, to be read.
    Carry,
}

/// Migrates a peer v1/v2 file to v3 inside `tx`. Every task and event is
/// kept; events get their hash chain; the result is exactly a fresh v3
/// schema. The caller must have turned foreign keys off (SQLite cannot do
/// that inside a transaction) and checks them again before commit.
pub fn migrate_peer(tx: &Transaction<'_>, damaged: DamagedRows) -> Result<()> {
    if damaged == DamagedRows::Carry {
        return checks::without_checks(tx, || move_peer_rows(tx));
    }
    check_legacy_codes(tx)?;
    move_peer_rows(tx)?;
    let fk_errors: i64 =
        tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })?;
    if fk_errors != 0 {
        return Err(Error::Conflict(
            "legacy database has broken task references",
        ));
    }
    Ok(())
}

fn move_peer_rows(tx: &Transaction<'_>) -> Result<()> {
    rebuild(
        tx,
        &["tasks_parent_idx", "tasks_status_idx", "tasks_delivery_idx"],
        |tx| {
            // Numbered in id order, so the heads below are stored in the
            // table's own order.
            tx.execute(
                "INSERT INTO tasks (id, parent_id, status, delivery_status, delivery_required,
                    payload_hash, timeout_seconds, created_at, started_at, updated_at, ended_at,
                    deadline_at, delivery_updated_at, terminal_code, delivery_code, version,
                    attempt_count, max_attempts, llm_calls_budget, event_head)
                 SELECT id, parent_id, status, delivery_status, delivery_required,
                    payload_hash, timeout_seconds, created_at, started_at, updated_at, ended_at,
                    deadline_at, delivery_updated_at, terminal_code, delivery_code, version,
                    CASE WHEN started_at IS NULL THEN 0 ELSE 1 END, 3, NULL, zeroblob(32)
                 FROM tw_migrating_tasks ORDER BY id",
                [],
            )?;
            rechain_events(tx)
        },
    )
}

/// Brings a file of the third layout to the current one inside `tx`: the
/// index it lacks and its children index in order, each built from the
/// table in one sort, and the current metadata. The rows are not touched.
pub fn order_third_layout_indexes(tx: &Transaction<'_>) -> Result<()> {
    tx.execute_batch("DROP INDEX tasks_parent_idx")?;
    tx.execute_batch(CHILDREN_INDEX)?;
    tx.execute_batch(CREATION_ORDER_INDEX)?;
    write_meta(tx)?;
    settled(tx)
}

/// Rebuilds the tables of an earlier schema as the current ones inside
/// `tx`: the old tables are renamed aside (their `indexes` dropped, as the
/// new ones take the same names), `fill` copies their rows into the new
/// tables, and then the new indexes are built and the old tables dropped.
/// The schema ends exactly as a fresh file's, or the transaction fails.
///
/// Rows first, indexes after: building an index from a full table is one
/// sort, far cheaper than growing it a row at a time.
pub fn rebuild(
    tx: &Transaction<'_>,
    indexes: &[&str],
    fill: impl FnOnce(&Transaction<'_>) -> Result<()>,
) -> Result<()> {
    for index in indexes {
        tx.execute_batch(&format!("DROP INDEX {index}"))?;
    }
    tx.execute_batch(
        "ALTER TABLE tasks RENAME TO tw_migrating_tasks;
         ALTER TABLE task_events RENAME TO tw_migrating_events;
         DROP TABLE schema_meta;",
    )?;
    // The same statement text as a fresh file's.
    let (tables, new_indexes) = DDL.split_at(DDL.find("CREATE INDEX").unwrap_or(DDL.len()));
    tx.execute_batch(tables)?;
    fill(tx)?;
    tx.execute_batch(new_indexes)?;
    tx.execute_batch("DROP TABLE tw_migrating_events; DROP TABLE tw_migrating_tasks;")?;
    write_meta(tx)?;
    settled(tx)
}

/// The schema is now exactly a fresh file's, or the transaction fails.
fn settled(tx: &Transaction<'_>) -> Result<()> {
    if fingerprint(tx)? != current_fingerprint()? {
        return Err(Error::Internal(
            "migration did not produce the current schema",
        ));
    }
    Ok(())
}

/// What an event of the old table is numbered with in the new one: its
/// task's number, or, for an event whose task is missing (damage), a
/// number below every task's (below zero too, as no task is given one),
/// which the foreign key check and doctor then count as the broken
/// reference it was. Not one derived from the event alone: a task's rowid,
/// edited by hand, may be any number.
pub const EVENT_TASK_NO: &str =
    "COALESCE(t.task_no, (SELECT min(coalesce(min(task_no), 0), 0) - 1 FROM tasks))";

/// Copies the peer's events in their original order (appending, so the
/// table grows sequentially), extends each task's hash chain in memory, and
/// then stores every chain's head on its task, in the table's order.
fn rechain_events(tx: &Transaction<'_>) -> Result<()> {
    let mut read = tx.prepare(&format!(
        "SELECT e.sequence, e.task_id, e.event_kind, e.from_value, e.to_value, e.occurred_at,
                e.code, {EVENT_TASK_NO}
         FROM tw_migrating_events e LEFT JOIN tasks t ON t.id = e.task_id ORDER BY e.sequence"
    ))?;
    let mut insert = tx.prepare(
        "INSERT INTO task_events (sequence, task_no, event_kind, from_value, to_value,
            occurred_at, code, event_hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    let mut heads: HashMap<i64, events::Hash> = HashMap::new();
    let mut rows = read.query([])?;
    while let Some(row) = rows.next()? {
        let event = events::Event {
            task_id: row.get(1)?,
            kind: row.get(2)?,
            from: row.get(3)?,
            to: row.get(4)?,
            at: row.get(5)?,
            code: row.get(6)?,
            worker: None,
            grant: None,
        };
        let task_no: i64 = row.get(7)?;
        let head = heads.entry(task_no).or_insert(events::GENESIS);
        *head = events::chain_hash(head, &event);
        let sequence: i64 = row.get(0)?;
        insert.execute(params![
            sequence,
            task_no,
            event.kind,
            event.from,
            event.to,
            event.at,
            event.code,
            &head[..]
        ])?;
    }
    let mut heads: Vec<(i64, events::Hash)> = heads.into_iter().collect();
    heads.sort_unstable_by_key(|(task_no, _)| *task_no);
    let mut set_head = tx.prepare("UPDATE tasks SET event_head = ?2 WHERE task_no = ?1")?;
    for (task_no, head) in heads {
        set_head.execute(params![task_no, &head[..]])?;
    }
    Ok(())
}

/// The peer refuses to migrate files whose stored codes fall outside its
/// registry (its own, narrower than taskwarden's: no `worker_lost`, no
/// parked statuses); taskwarden keeps that rule so no unknown text is
/// carried on.
fn check_legacy_codes(tx: &Transaction<'_>) -> Result<()> {
    if peer_code_problems(tx)? == (0, 0) {
        Ok(())
    } else {
        Err(Error::Conflict(
            "legacy database contains unsafe reason metadata",
        ))
    }
}

/// How many task rows and event rows hold a status or code the peer's
/// registry refuses (or a value that is not text where one belongs).
pub fn peer_code_problems(tx: &Transaction<'_>) -> Result<(i64, i64)> {
    let text = |row: &rusqlite::Row<'_>, i| row.get::<_, Option<String>>(i).ok();
    let mut stmt =
        tx.prepare("SELECT status, terminal_code, delivery_status, delivery_code FROM tasks")?;
    let mut rows = stmt.query([])?;
    let mut tasks = 0;
    while let Some(row) = rows.next()? {
        let fits = match (text(row, 0), text(row, 1), text(row, 2), text(row, 3)) {
            (Some(Some(status)), Some(code), Some(Some(delivery)), Some(delivery_code)) => {
                task_fits_peer(&status, code.as_deref())
                    && DeliveryStatus::from_stored(&delivery).is_ok_and(|d| {
                        code_fits(
                            delivery_code.as_deref(),
                            d.is_terminal(),
                            fsm::delivery_codes(d),
                        )
                    })
            }
            _ => false,
        };
        tasks += i64::from(!fits);
    }
    let mut stmt = tx.prepare("SELECT event_kind, to_value, code FROM task_events")?;
    let mut rows = stmt.query([])?;
    let mut events = 0;
    while let Some(row) = rows.next()? {
        let fits = match (text(row, 0), text(row, 1), text(row, 2)) {
            (Some(Some(kind)), Some(Some(to)), Some(code)) => {
                event_fits_peer(&kind, &to, code.as_deref())
            }
            _ => false,
        };
        events += i64::from(!fits);
    }
    Ok((tasks, events))
}

/// A status the peer knows, with a code its registry allows for it.
fn task_fits_peer(status: &str, code: Option<&str>) -> bool {
    TaskStatus::from_stored(status).is_ok_and(|s| {
        fsm::peer_codes(s).is_some_and(|codes| code_fits(code, s.is_terminal(), codes))
    })
}

/// An event the peer writes: its kind, target and code.
fn event_fits_peer(kind: &str, to: &str, code: Option<&str>) -> bool {
    match kind {
        "created" => to == "queued" && code == Some("created"),
        "task_transition" => match TaskStatus::from_stored(to) {
            Ok(TaskStatus::Running) => code == Some("started"),
            Ok(s) => fsm::peer_codes(s).is_some_and(|codes| code_fits(code, true, codes)),
            Err(_) => false,
        },
        "delivery_transition" => DeliveryStatus::from_stored(to)
            .is_ok_and(|d| code_fits(code, true, fsm::delivery_codes(d))),
        _ => false,
    }
}

fn code_fits(code: Option<&str>, terminal: bool, allowed: &[&str]) -> bool {
    match code {
        None => true,
        Some(c) => terminal && allowed.contains(&c),
    }
}

/// Query plans, for tests that pin which index a statement reads.
#[cfg(test)]
pub mod test_support {
    use rusqlite::config::DbConfig;
    use rusqlite::types::Null;
    use rusqlite::{params_from_iter, Connection};

    /// The plan SQLite picks on a fresh ledger with the query planner
    /// stability guarantee on (as every ledger connection has it).
    pub fn plan(sql: &str) -> crate::errors::Result<String> {
        let mut conn = Connection::open_in_memory()?;
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        let tx = conn.transaction()?;
        super::create(&tx)?;
        tx.commit()?;
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
        let unbound = vec![Null; stmt.parameter_count()];
        let details = stmt.query_map(params_from_iter(unbound), |r| r.get::<_, String>(3))?;
        Ok(details.collect::<rusqlite::Result<Vec<_>>>()?.join("; "))
    }

    /// The third layout's children index, as its DDL wrote it.
    const THIRD_LAYOUT_CHILDREN_INDEX: &str =
        "CREATE INDEX tasks_parent_idx ON tasks(parent_id) WHERE parent_id IS NOT NULL;";

    /// What the third layout changed from the second: how an event names
    /// its task.
    const SECOND_LAYOUT_SPELLINGS: [(&str, &str); 3] = [
        (
            "    id TEXT PRIMARY KEY,\n",
            "    task_no INTEGER PRIMARY KEY,\n    id TEXT UNIQUE,\n",
        ),
        (
            "task_id TEXT NOT NULL REFERENCES tasks(id)",
            "task_no INTEGER NOT NULL REFERENCES tasks(task_no)",
        ),
        ("ON task_events(task_id)", "ON task_events(task_no)"),
    ];

    /// The CHECKs as the first v3 layout spelled them, and as later.
    const FIRST_LAYOUT_SPELLINGS: [(&str, &str); 4] = [
        (
            "status IN ('queued','running','blocked','escalated',
                   'succeeded','failed','timed_out','cancelled')",
            "status = 'queued' OR status = 'running' OR status = 'blocked' OR status = 'escalated'
        OR status = 'succeeded' OR status = 'failed' OR status = 'timed_out'
        OR status = 'cancelled'",
        ),
        (
            "delivery_status IN ('pending','delivered','failed','not_applicable')",
            "delivery_status = 'pending' OR delivery_status = 'delivered'
        OR delivery_status = 'failed' OR delivery_status = 'not_applicable'",
        ),
        (
            "(status IN ('queued','running','blocked','escalated') AND ended_at IS NULL) OR
        (status IN ('succeeded','failed','timed_out','cancelled') AND ended_at IS NOT NULL)",
            "(ended_at IS NULL)
        = (status = 'queued' OR status = 'running' OR status = 'blocked' OR status = 'escalated')",
        ),
        (
            "event_kind IN ('created','task_transition','delivery_transition','budget_granted')",
            "event_kind = 'created' OR event_kind = 'task_transition'
        OR event_kind = 'delivery_transition' OR event_kind = 'budget_granted'",
        ),
    ];

    /// An empty file of an earlier layout (1, 2 or 3): its DDL and its
    /// metadata.
    pub fn earlier_layout(layout: usize) -> crate::errors::Result<Connection> {
        let respell = |ddl: String, (old, new): &(&str, &str)| {
            assert!(ddl.contains(new));
            ddl.replace(new, old)
        };
        let creation_order = format!("{}\n", super::CREATION_ORDER_INDEX);
        let mut ddl = respell(super::DDL.to_owned(), &("", &creation_order));
        ddl = respell(ddl, &(THIRD_LAYOUT_CHILDREN_INDEX, super::CHILDREN_INDEX));
        if layout <= 2 {
            ddl = SECOND_LAYOUT_SPELLINGS.iter().fold(ddl, respell);
        }
        if layout == 1 {
            ddl = FIRST_LAYOUT_SPELLINGS.iter().fold(ddl, respell);
        }
        let conn = Connection::open_in_memory()?;
        conn.execute_batch(&ddl)?;
        conn.execute(
            "INSERT INTO schema_meta VALUES ('schema_version', '3'), ('schema_fingerprint', ?1)",
            [super::EARLIER_LAYOUT_FINGERPRINTS[layout - 1]],
        )?;
        Ok(conn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-memory database with a fresh v3 schema.
    fn fresh() -> Result<Connection> {
        let mut conn = Connection::open_in_memory()?;
        let tx = conn.transaction()?;
        create(&tx)?;
        tx.commit()?;
        Ok(conn)
    }

    #[test]
    fn fresh_schema_is_current() -> Result<()> {
        let conn = fresh()?;
        assert_eq!(inspect(&conn)?, Found::Current);
        Ok(())
    }

    #[test]
    fn an_extra_object_is_refused() -> Result<()> {
        let conn = fresh()?;
        conn.execute_batch("CREATE INDEX extra_idx ON tasks(tenant)")?;
        assert!(matches!(inspect(&conn), Err(Error::Conflict(_))));
        Ok(())
    }

    /// The indexes the third layout's upgrade builds are the current DDL's
    /// own statements, word for word: it must end in a fresh file's schema.
    #[test]
    fn the_upgrades_indexes_are_ddl_statements() {
        assert_eq!(DDL.matches(CREATION_ORDER_INDEX).count(), 1);
        assert_eq!(DDL.matches(CHILDREN_INDEX).count(), 1);
    }

    #[test]
    fn json_escaping_matches_python() {
        let mut s = String::new();
        push_json_string(&mut s, "a\"b\\c\u{e9}");
        assert_eq!(s, r#""a\"b\\c\u00e9""#);
    }

    /// How many temporary indexes one run of `sql` builds.
    fn temporary_indexes(conn: &Connection, sql: &str) -> Result<usize> {
        let mut stmt = conn.prepare(&format!("EXPLAIN {sql}"))?;
        let unbound = vec![rusqlite::types::Null; stmt.parameter_count()];
        let ops = stmt.query_map(rusqlite::params_from_iter(unbound), |r| {
            r.get::<_, String>(1)
        })?;
        let ops = ops.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(ops.iter().filter(|op| *op == "OpenEphemeral").count())
    }

    const CLAIM_UPDATE: &str = "UPDATE tasks SET status = ?1, owner = ?2 WHERE id = ?3";
    const EVENT_INSERT: &str = "INSERT INTO task_events (task_no, event_kind, to_value, \
                                occurred_at, event_hash) VALUES (?1, ?2, ?3, ?4, ?5)";

    #[test]
    fn status_writes_build_no_temporary_index() -> Result<()> {
        let conn = fresh()?;
        assert_eq!(temporary_indexes(&conn, CLAIM_UPDATE)?, 0);
        assert_eq!(temporary_indexes(&conn, EVENT_INSERT)?, 0);
        // What the first layout cost on every claim, for contrast.
        let old = test_support::earlier_layout(1)?;
        assert!(temporary_indexes(&old, CLAIM_UPDATE)? >= 2);
        Ok(())
    }

    /// The earlier layouts, rebuilt from today's DDL, have the
    /// fingerprints their builds wrote, and are recognised as such; with
    /// the metadata of another layout, a file is refused.
    #[test]
    fn earlier_layouts_are_recognised() -> Result<()> {
        for layout in 1..=3 {
            let conn = test_support::earlier_layout(layout)?;
            let expected = EARLIER_LAYOUT_FINGERPRINTS[layout - 1];
            assert_eq!(fingerprint(&conn)?, expected);
            let upgrade = if layout == 3 {
                LayoutUpgrade::Index
            } else {
                LayoutUpgrade::Rebuild
            };
            assert_eq!(inspect(&conn)?, Found::Earlier(Earlier::Layout(upgrade)));
            conn.execute(
                "UPDATE schema_meta SET value = ?1 WHERE key = 'schema_fingerprint'",
                [current_fingerprint()?],
            )?;
            assert!(matches!(inspect(&conn), Err(Error::Conflict(_))));
        }
        let conn = fresh()?;
        conn.execute(
            "UPDATE schema_meta SET value = ?1 WHERE key = 'schema_fingerprint'",
            [EARLIER_LAYOUT_FINGERPRINTS[1]],
        )?;
        assert!(matches!(inspect(&conn), Err(Error::Conflict(_))));
        Ok(())
    }
}
