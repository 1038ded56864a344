//! The schema's CHECK constraints: judged by doctor, and left out of the
//! statements that must not run them ([`without_checks`]).
//!
//! SQLite's `quick_check` evaluates every CHECK constraint of every row in
//! its byte-code interpreter, which costs five times the page walk itself
//! (about 0.9 s of 1.1 s at 100k tasks). Doctor therefore runs `quick_check`
//! for pages, records and NOT NULL columns only, and judges the CHECKs here,
//! on the rows its scan has decoded anyway. A row that did not decode with
//! the expected types is rare and odd (it was edited behind SQLite's back),
//! so for it SQLite itself evaluates the DDL's expressions, exactly.

use rusqlite::{Connection, OptionalExtension};

use crate::errors::Result;
use crate::events;
use crate::task::TaskRow;
use crate::validate;

/// Runs `op` with the schema's CHECKs left out of every statement compiled
/// on `conn` meanwhile (`ignore_check_constraints`), and puts them back
/// whatever `op` returns. SQLite reads the setting when it compiles a
/// statement, and changing it recompiles every statement of the connection
/// at its next use. For rows carried as they stand (a migration keeps
/// damage for doctor to count), for writes whose values meet the CHECKs by
/// construction, and for SQLite's own checks that doctor judges apart.
pub fn without_checks<T>(conn: &Connection, op: impl FnOnce() -> Result<T>) -> Result<T> {
    conn.pragma_update(None, "ignore_check_constraints", true)?;
    let out = op();
    let restored = conn.pragma_update(None, "ignore_check_constraints", false);
    let out = out?;
    restored?;
    Ok(out)
}

/// Every CHECK of `tasks` in the DDL, joined: a row violates one when this
/// is false (NULL passes, as in SQLite).
const TASK_CHECKS: &str = "
    (status = 'queued' OR status = 'running' OR status = 'blocked' OR status = 'escalated'
        OR status = 'succeeded' OR status = 'failed' OR status = 'timed_out'
        OR status = 'cancelled')
    AND (delivery_status = 'pending' OR delivery_status = 'delivered'
        OR delivery_status = 'failed' OR delivery_status = 'not_applicable')
    AND delivery_required IN (0,1)
    AND (payload_hash IS NULL OR (
        length(payload_hash) = 64 AND payload_hash NOT GLOB '*[^0-9a-f]*'))
    AND (timeout_seconds IS NULL OR timeout_seconds >= 0)
    AND version >= 0
    AND (tenant IS NULL OR length(tenant) BETWEEN 1 AND 128)
    AND (owner IS NULL OR length(owner) BETWEEN 1 AND 128)
    AND attempt_count >= 0
    AND max_attempts >= 0
    AND llm_calls_used >= 0
    AND (llm_calls_budget IS NULL OR llm_calls_budget >= 0)
    AND tokens_used >= 0
    AND (token_budget IS NULL OR token_budget >= 0)
    AND cost_used_micros >= 0
    AND (cost_budget_micros IS NULL OR cost_budget_micros >= 0)
    AND length(event_head) = 32
    AND (parent_id IS NULL OR parent_id <> id)
    AND (deadline_at IS NULL OR started_at IS NOT NULL)
    AND (
        (ended_at IS NULL)
        = (status = 'queued' OR status = 'running' OR status = 'blocked' OR status = 'escalated')
    )";

/// Every CHECK of `task_events` in the DDL, joined.
const EVENT_CHECKS: &str = "
    (event_kind = 'created' OR event_kind = 'task_transition'
        OR event_kind = 'delivery_transition' OR event_kind = 'budget_granted')
    AND length(event_hash) = 32";

/// A task row that decoded with the expected types (so each CHECK has
/// SQLite's meaning on these values) passes every CHECK of the DDL. Status,
/// delivery status, `delivery_required` and `event_head` were already
/// held to their CHECKs by decoding.
#[must_use]
pub fn task_passes(task: &TaskRow) -> bool {
    let chars = |s: &str| s.chars().count();
    let name_ok = |n: &Option<String>| n.as_deref().is_none_or(|n| (1..=128).contains(&chars(n)));
    let non_negative = |n: Option<i64>| n.is_none_or(|n| n >= 0);
    // 64 lowercase hex digits, the GLOB's meaning (ASCII: bytes are chars).
    let hash_ok = task
        .payload_hash
        .as_deref()
        .is_none_or(validate::is_sha256_hex);
    hash_ok
        && task.timeout_seconds.is_none_or(|t| t >= 0.0)
        && task.version >= 0
        && name_ok(&task.tenant)
        && name_ok(&task.owner)
        && task.attempt_count >= 0
        && task.max_attempts >= 0
        && [task.usage.calls, task.usage.tokens, task.usage.cost_micros]
            .iter()
            .all(|n| *n >= 0)
        && [
            task.limits.calls,
            task.limits.tokens,
            task.limits.cost_micros,
        ]
        .into_iter()
        .all(non_negative)
        && task.parent_id.as_deref() != Some(task.id.as_str())
        && (task.deadline_at.is_none() || task.started_at.is_some())
        && task.status.is_terminal() == task.ended_at.is_some()
}

/// An event whose kind (text) and hash (a 32-byte blob) decoded passes the
/// CHECKs of the DDL when its kind is one the schema allows.
#[must_use]
pub fn event_passes(kind: &str) -> bool {
    events::KINDS.contains(&kind)
}

/// SQLite's own verdict on the row of `table` (`tasks` or `task_events`)
/// with this rowid: true when one of its CHECK constraints fails.
pub fn row_violates(conn: &Connection, table: Table, rowid: i64) -> rusqlite::Result<bool> {
    let (name, checks) = match table {
        Table::Tasks => ("tasks", TASK_CHECKS),
        Table::Events => ("task_events", EVENT_CHECKS),
    };
    let sql = format!("SELECT NOT ({checks}) FROM {name} WHERE rowid = ?1");
    let verdict: Option<Option<bool>> = conn
        .prepare_cached(&sql)?
        .query_row([rowid], |r| r.get(0))
        .optional()?;
    Ok(verdict.flatten() == Some(true))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Tasks,
    Events,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;
    use crate::task::COLUMNS;

    /// A ledger with one valid task (and its creation event) to edit.
    fn ledger() -> crate::errors::Result<Connection> {
        let mut conn = Connection::open_in_memory()?;
        let tx = conn.transaction()?;
        schema::create(&tx)?;
        tx.execute_batch(
            "INSERT INTO tasks (id, status, delivery_status, delivery_required, created_at,
                 updated_at, delivery_updated_at, event_head)
             VALUES ('01890000-0000-7000-8000-000000000001', 'queued', 'pending', 1,
                 1.0, 1.0, 1.0, zeroblob(32));
             INSERT INTO task_events (task_no, event_kind, to_value, occurred_at, event_hash)
             VALUES (1, 'created', 'queued', 1.0, zeroblob(32));",
        )?;
        tx.commit()?;
        conn.pragma_update(None, "ignore_check_constraints", true)?;
        Ok(conn)
    }

    fn rust_task_verdict(conn: &Connection) -> rusqlite::Result<Option<bool>> {
        conn.query_row(&format!("SELECT {COLUMNS} FROM tasks"), [], |r| {
            Ok(TaskRow::from_row(r).ok().map(|t| !task_passes(&t)))
        })
    }

    /// Each edit breaks at most one CHECK (or none, to prove the Rust side
    /// does not see violations that are not there); Rust and SQLite agree
    /// wherever the row decodes, and SQLite's verdict is the one expected.
    #[test]
    fn rust_and_sqlite_agree_on_task_checks() -> crate::errors::Result<()> {
        let edits: &[(&str, bool)] = &[
            ("version = 0", false),
            ("version = -1", true),
            ("payload_hash = printf('%064d', 7)", false),
            ("payload_hash = printf('%063d', 7) || 'A'", true),
            ("payload_hash = printf('%063d', 7) || 'é'", true),
            ("payload_hash = printf('%065d', 7)", true),
            ("timeout_seconds = 0", false),
            ("timeout_seconds = -0.5", true),
            ("tenant = ''", true),
            ("tenant = printf('%.128c', 'x')", false),
            ("tenant = printf('%.129c', 'x')", true),
            ("tenant = printf('%.128c', 'é')", false),
            ("owner = ''", true),
            ("attempt_count = -1", true),
            ("max_attempts = -1", true),
            ("llm_calls_used = -1", true),
            ("llm_calls_budget = -1", true),
            ("token_budget = 0", false),
            ("tokens_used = -1", true),
            ("cost_budget_micros = -1", true),
            ("cost_used_micros = -1", true),
            ("parent_id = id", true),
            ("deadline_at = 5.0", true),
            ("status = 'succeeded'", true),
            ("ended_at = 2.0", true),
            ("status = 'succeeded', ended_at = 2.0", false),
        ];
        for (edit, violates) in edits {
            let conn = ledger()?;
            conn.execute_batch(&format!("UPDATE tasks SET {edit}"))?;
            let sqlite = row_violates(&conn, Table::Tasks, 1)?;
            assert_eq!(sqlite, *violates, "SQLite on {edit}");
            if let Some(rust) = rust_task_verdict(&conn)? {
                assert_eq!(rust, sqlite, "Rust on {edit}");
            }
        }
        Ok(())
    }

    #[test]
    fn sqlite_judges_rows_of_unexpected_types() -> crate::errors::Result<()> {
        for (edit, violates) in [
            ("status = CAST('queued' AS BLOB)", true),
            ("version = 'x'", false),
            ("event_head = zeroblob(31)", true),
            ("event_head = printf('%.32c', 'x')", false),
        ] {
            let conn = ledger()?;
            conn.execute_batch(&format!("UPDATE tasks SET {edit}"))?;
            assert_eq!(rust_task_verdict(&conn)?, None, "{edit} decodes");
            assert_eq!(row_violates(&conn, Table::Tasks, 1)?, violates, "{edit}");
        }
        Ok(())
    }

    #[test]
    fn event_checks() -> crate::errors::Result<()> {
        assert!(event_passes("created"));
        assert!(!event_passes("paused"));
        let conn = ledger()?;
        assert!(!row_violates(&conn, Table::Events, 1)?);
        conn.execute_batch("UPDATE task_events SET event_kind = 'paused'")?;
        assert!(row_violates(&conn, Table::Events, 1)?);
        assert!(!row_violates(&conn, Table::Events, 99)?, "no row");
        Ok(())
    }

    /// Whitespace folded, and one pair of parentheses around the whole
    /// expression dropped: the DDL and the lists here lay them out apart.
    fn folded(expr: &str) -> String {
        let flat = expr.split_whitespace().collect::<Vec<_>>().join(" ");
        let flat = flat.replace("( ", "(").replace(" )", ")");
        let inner = flat
            .strip_prefix('(')
            .and_then(|e| e.strip_suffix(')'))
            .filter(|e| depth_never_closes(e));
        inner.map_or(flat.clone(), str::to_owned)
    }

    /// True when no `)` in `expr` closes a `(` opened before it.
    fn depth_never_closes(expr: &str) -> bool {
        let mut depth = 0i32;
        expr.chars().all(|c| {
            depth += match c {
                '(' => 1,
                ')' => -1,
                _ => 0,
            };
            depth >= 0
        })
    }

    /// The top-level `AND` clauses of `expr`.
    fn clauses(expr: &str) -> Vec<String> {
        let flat = expr.split_whitespace().collect::<Vec<_>>().join(" ");
        let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
        let bytes = flat.as_bytes();
        for (i, c) in flat.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                // (Every `BETWEEN .. AND ..` sits inside parentheses.)
                _ if depth == 0 && bytes[i..].starts_with(b" AND ") => {
                    out.push(folded(&flat[start..i]));
                    start = i + 5;
                }
                _ => {}
            }
        }
        out.push(folded(&flat[start..]));
        out
    }

    /// Every `CHECK (...)` expression of `table`'s statement in the DDL.
    fn ddl_checks(table: &str) -> Vec<String> {
        let ddl = crate::schema::DDL;
        let start = ddl
            .find(&format!("CREATE TABLE {table} ("))
            .expect("table in DDL");
        let end = ddl[start..].find(");").map_or(ddl.len(), |e| start + e);
        let statement = &ddl[start..end];
        let mut out = Vec::new();
        let mut rest = statement;
        while let Some(at) = rest.find("CHECK (") {
            let body = &rest[at + "CHECK ".len()..];
            let mut depth = 0;
            let close = body
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map(|(i, _)| i)
                .expect("balanced CHECK");
            out.push(folded(&body[..=close]));
            rest = &body[close..];
        }
        out
    }

    /// The lists doctor judges by are the DDL's CHECKs, no more and no
    /// fewer: a schema change to one side only fails here.
    #[test]
    fn the_check_lists_are_the_ddl_s() {
        let mut ours = clauses(TASK_CHECKS);
        let mut theirs = ddl_checks("tasks");
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs);
        let (mut ours, mut theirs) = (clauses(EVENT_CHECKS), ddl_checks("task_events"));
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs);
    }
}
