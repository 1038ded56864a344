//! `doctor` (SPEC §6): is this file a healthy ledger? Counts only, never an
//! id, and nothing is repaired.
//!
//! Every logical check runs inside one read transaction, streaming: tasks
//! in id order merged with their events (by the events' task index) and
//! with their children's usage sums, so memory stays flat however large the
//! ledger is, and a concurrent writer can never make a healthy ledger look
//! unhealthy. Each decoded row is also held to the schema's CHECK
//! constraints (`checks`) and to the entries it calls for in every index
//! (`index_audit`). `PRAGMA quick_check` runs beside it for pages and
//! records (see `Store::doctor`).

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, Transaction};

use crate::ancestry::Ancestry;
use crate::checks::{self, Table};
use crate::errors::Result;
use crate::fsm::{DeliveryStatus, TaskStatus, ALL_DELIVERY_STATUSES, ALL_TASK_STATUSES};
use crate::index_audit::{self, Digest, Tally};
use crate::replay::{event_row, Chain, EventRow, EVENTS_OF_TASKS, EVENT_COLUMNS};
use crate::schema::{self, Found};
use crate::task::{TaskRow, COLUMNS};

/// What doctor found. Every field is a count or a flag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub healthy: bool,
    pub quick_check_ok: bool,
    pub schema_version: Option<i64>,
    pub schema_ok: bool,
    pub task_count: i64,
    pub event_count: i64,
    pub task_status_counts: BTreeMap<&'static str, i64>,
    pub delivery_status_counts: BTreeMap<&'static str, i64>,
    pub orphan_count: i64,
    pub parent_cycle_count: i64,
    pub foreign_key_error_count: i64,
    pub state_inconsistency_count: i64,
    pub owner_inconsistency_count: i64,
    pub budget_inconsistency_count: i64,
    pub timestamp_inconsistency_count: i64,
    pub event_inconsistency_count: i64,
    pub event_chain_break_count: i64,
    pub doctor_error_count: i64,
    /// The events' keys as read through the task index.
    stream_events: Tally,
    /// Rows that break a CHECK constraint of the schema (see `checks`).
    check_violation_count: i64,
    /// Rows that did not decode with the expected types: SQLite judges
    /// their CHECK constraints after the scan.
    check_suspects: Vec<(Table, i64)>,
}

impl Report {
    fn empty() -> Report {
        Report {
            task_status_counts: ALL_TASK_STATUSES.iter().map(|s| (s.as_str(), 0)).collect(),
            delivery_status_counts: ALL_DELIVERY_STATUSES
                .iter()
                .map(|s| (s.as_str(), 0))
                .collect(),
            ..Report::default()
        }
    }

    /// The report with SQLite's own page-level verdict folded in; like
    /// SQLite's `quick_check` on a writable connection, it fails when a row
    /// breaks a CHECK constraint.
    #[must_use]
    pub fn with_quick_check(mut self, ok: bool) -> Report {
        self.quick_check_ok = ok && self.check_violation_count == 0;
        self.settle();
        self
    }

    /// Folds in the task and event rows of a peer file that the peer's
    /// own registry refuses (codes taskwarden alone knows, say), which the
    /// scan of its migrated copy cannot see: counted at least once, not
    /// twice where the scan flagged the same rows.
    #[must_use]
    pub fn with_peer_code_problems(mut self, (tasks, events): (i64, i64)) -> Report {
        self.state_inconsistency_count = self.state_inconsistency_count.max(tasks);
        self.event_inconsistency_count = self.event_inconsistency_count.max(events);
        self.settle();
        self
    }

    /// The report of a migrated private copy, naming the version the file
    /// itself still has.
    #[must_use]
    pub fn with_schema_version(mut self, version: i64) -> Report {
        self.schema_version = Some(version);
        self
    }

    /// Every check of the scan passed (SQLite's page-level verdict aside,
    /// which the caller runs where it can).
    #[must_use]
    pub fn logically_sound(&self) -> bool {
        self.healthy && self.check_violation_count == 0
    }

    fn settle(&mut self) {
        self.healthy = self.quick_check_ok
            && self.schema_ok
            && self.doctor_error_count == 0
            && [
                self.orphan_count,
                self.parent_cycle_count,
                self.foreign_key_error_count,
                self.state_inconsistency_count,
                self.owner_inconsistency_count,
                self.budget_inconsistency_count,
                self.timestamp_inconsistency_count,
                self.event_inconsistency_count,
                self.event_chain_break_count,
            ]
            .iter()
            .all(|n| *n == 0);
    }
}

/// Runs `PRAGMA quick_check` on `conn` without its CHECK constraints (the
/// scan judges those, see `checks`): true only for a single `ok`.
#[must_use]
pub fn quick_check(conn: &rusqlite::Connection) -> bool {
    let rows = checks::without_checks(conn, || {
        let mut check = conn.prepare("PRAGMA quick_check")?;
        let rows = check.query_map([], |r| r.get::<_, String>(0))?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    });
    matches!(rows.as_deref(), Ok([ok]) if ok == "ok")
}

/// The logical checks, in the caller's read transaction. The caller adds
/// the `quick_check` verdict with [`Report::with_quick_check`], having run
/// it beside this on another connection where it could.
#[must_use]
pub fn check(tx: &Transaction<'_>) -> Report {
    let mut report = Report::empty();
    report.quick_check_ok = true;
    report.schema_version = stored_version(tx);
    report.schema_ok = matches!(schema::inspect(tx), Ok(Found::Current));
    if !report.schema_ok {
        report.doctor_error_count = 1;
        report.settle();
        return report;
    }
    match scan(tx, &mut report) {
        Ok(()) => {}
        Err(_) => report.doctor_error_count += 1,
    }
    report.settle();
    report
}

fn stored_version(tx: &Transaction<'_>) -> Option<i64> {
    let raw: Option<rusqlite::types::Value> = tx
        .query_row(
            "SELECT value FROM schema_meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()
        .ok()
        .flatten();
    match raw {
        Some(rusqlite::types::Value::Text(t))
            if !t.is_empty() && t.len() <= 20 && t.bytes().all(|b| b.is_ascii_digit()) =>
        {
            t.parse().ok()
        }
        _ => None,
    }
}

/// Children's usage, summed per parent without overflow.
#[derive(Default)]
struct ChildSums {
    parent: String,
    calls: i128,
    tokens: i128,
    cost: i128,
}

/// Each task's events through the events' index, in the tasks' order, with
/// no sort (without `t.task_no`, which the id index holds, SQLite sorts
/// each task's events). An event whose task is missing is not in it:
/// `cross_check_indexes` finds those.
fn event_stream() -> String {
    format!("SELECT {EVENT_COLUMNS} FROM {EVENTS_OF_TASKS} ORDER BY t.id, t.task_no, e.sequence")
}

// One streaming merge of three cursors: split up, its invariants (which
// cursor is ahead of which) would be spread over many signatures.
#[allow(clippy::too_many_lines)]
fn scan(tx: &Transaction<'_>, report: &mut Report) -> Result<()> {
    let mut tasks = tx.prepare(&format!("SELECT {COLUMNS}, rowid FROM tasks ORDER BY id"))?;
    let mut events = tx.prepare(&event_stream())?;
    let mut children = tx.prepare(
        "SELECT parent_id, llm_calls_used, tokens_used, cost_used_micros FROM tasks
         WHERE parent_id IS NOT NULL ORDER BY parent_id",
    )?;
    let mut ancestry = Ancestry::new(tx)?;

    let mut task_rows = tasks.query([])?;
    let mut event_rows = events.query([])?;
    let mut child_rows = children.query([])?;
    let mut stream_tasks = Tally::default();
    let mut expected_indexes = index_audit::Expected::default();
    let mut all_decoded = true;
    let mut next_event = advance_event(&mut event_rows, report)?;
    let mut next_child = advance_child(&mut child_rows)?;

    while let Some(row) = task_rows.next()? {
        report.task_count += 1;
        let rowid = row.get(28).unwrap_or(-1);
        stream_tasks.add(
            Digest::new(rowid)
                .value(row.get_ref(0)?)
                .value(row.get_ref(27)?),
        );
        let Ok(task) = TaskRow::from_row(row) else {
            // An unreadable row is one state inconsistency; its events and
            // children still belong to it, not to nobody.
            report.state_inconsistency_count += 1;
            all_decoded = false;
            report.check_suspects.push((Table::Tasks, rowid));
            count_statuses_as_stored(report, row);
            while next_event.as_ref().is_some_and(|e| e.task_no == rowid) {
                next_event = advance_event(&mut event_rows, report)?;
            }
            if let Ok(id) = row.get::<_, String>(0) {
                while let Some(c) = next_child.as_ref().filter(|c| c.parent <= id) {
                    report.orphan_count += i64::from(c.parent < id);
                    next_child = advance_child(&mut child_rows)?;
                }
            }
            continue;
        };
        count_statuses(report, Some(task.status), Some(task.delivery_status));
        report.state_inconsistency_count += i64::from(task.state_problem());
        report.check_violation_count += i64::from(!checks::task_passes(&task));
        expected_indexes.add(rowid, &task);

        let mut chain = Chain::new();
        while next_event.as_ref().is_some_and(|e| e.task_no == rowid) {
            if let Some(e) = next_event.take() {
                chain.feed(&e);
            }
            next_event = advance_event(&mut event_rows, report)?;
        }
        let claims_match = chain.claims_match(&task);
        report.owner_inconsistency_count += i64::from(task.owner_problem() || !claims_match);
        let (broken, inconsistent) = chain.finish(&task);
        report.event_chain_break_count += i64::from(broken);
        report.event_inconsistency_count += i64::from(inconsistent);

        // Children whose parent sorts before this task have no parent row.
        let mut sums = ChildSums::default();
        loop {
            match &next_child {
                Some(c) if c.parent < task.id => report.orphan_count += 1,
                Some(c) if c.parent == task.id => {
                    // Saturating: an unreadable counter reads as i128::MAX,
                    // so the parent is then found not rolled up.
                    sums.calls = sums.calls.saturating_add(c.calls);
                    sums.tokens = sums.tokens.saturating_add(c.tokens);
                    sums.cost = sums.cost.saturating_add(c.cost);
                }
                _ => break,
            }
            next_child = advance_child(&mut child_rows)?;
        }
        let rolled_up = i128::from(task.usage.calls) >= sums.calls
            && i128::from(task.usage.tokens) >= sums.tokens
            && i128::from(task.usage.cost_micros) >= sums.cost;
        report.budget_inconsistency_count += i64::from(task.budget_problem() || !rolled_up);

        let mut late_child = false;
        if let Some(parent) = &task.parent_id {
            late_child = ancestry
                .walk_up(rowid, parent)?
                .is_some_and(|p| task.created_at < p);
        }
        report.timestamp_inconsistency_count += i64::from(task.timestamp_problem() || late_child);
    }
    report.parent_cycle_count = ancestry.cycles;
    while next_event.is_some() {
        report.foreign_key_error_count += 1;
        next_event = advance_event(&mut event_rows, report)?;
    }
    while next_child.is_some() {
        report.orphan_count += 1;
        next_child = advance_child(&mut child_rows)?;
    }
    report.foreign_key_error_count += report.orphan_count;
    cross_check_indexes(tx, report, stream_tasks)?;
    // With every row decoded, each index must hold exactly the entries
    // those rows call for (else a row was already counted).
    if all_decoded && !expected_indexes.matches_indexes(tx)? {
        report.state_inconsistency_count += 1;
    }
    for (table, rowid) in std::mem::take(&mut report.check_suspects) {
        // A row SQLite cannot even judge fails, as it would in quick_check.
        report.check_violation_count +=
            i64::from(checks::row_violates(tx, table, rowid).unwrap_or(true));
    }
    Ok(())
}

/// The streams read ids from the indexes; a row changed under its index (a
/// damaged page that `quick_check` does not look at) shows as a mismatch
/// between those streams and plain table scans.
fn cross_check_indexes(
    tx: &Transaction<'_>,
    report: &mut Report,
    stream_tasks: Tally,
) -> Result<()> {
    if index_audit::tally(tx, "SELECT rowid, id, event_head FROM tasks NOT INDEXED")?
        != stream_tasks
    {
        report.state_inconsistency_count += 1;
    }
    let events_in_table = index_audit::tally(
        tx,
        "SELECT sequence, task_no, event_hash FROM task_events NOT INDEXED",
    )?;
    if events_in_table == report.stream_events {
        return Ok(());
    }
    // Events whose task is missing (the stream joins events to tasks) are
    // broken references; only what is still unaccounted for after them is
    // an index that disagrees with its table.
    let orphans = index_audit::tally(
        tx,
        "SELECT sequence, task_no, event_hash FROM task_events e NOT INDEXED
         WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.task_no = e.task_no)",
    )?;
    report.event_count += orphans.count;
    report.foreign_key_error_count += orphans.count;
    report.stream_events.add_all(orphans);
    if events_in_table != report.stream_events {
        report.event_inconsistency_count += 1;
    }
    Ok(())
}

/// Counts a task under each of its statuses that is known.
fn count_statuses(
    report: &mut Report,
    status: Option<TaskStatus>,
    delivery: Option<DeliveryStatus>,
) {
    if let Some(status) = status {
        *report
            .task_status_counts
            .entry(status.as_str())
            .or_default() += 1;
    }
    if let Some(delivery) = delivery {
        *report
            .delivery_status_counts
            .entry(delivery.as_str())
            .or_default() += 1;
    }
}

/// A row the scan cannot read whole (a time stored as text, a flag of 2)
/// is still counted under each status it stores that is a known one, as
/// the peer counts them (by the column alone): the counts then add up to
/// the tasks whenever the statuses themselves are sound.
fn count_statuses_as_stored(report: &mut Report, row: &rusqlite::Row<'_>) {
    let stored = |i: usize| row.get::<_, String>(i).ok();
    count_statuses(
        report,
        stored(2).and_then(|s| TaskStatus::from_stored(&s).ok()),
        stored(3).and_then(|s| DeliveryStatus::from_stored(&s).ok()),
    );
}

fn advance_event(rows: &mut rusqlite::Rows<'_>, report: &mut Report) -> Result<Option<EventRow>> {
    loop {
        let Some(row) = rows.next()? else {
            return Ok(None);
        };
        report.event_count += 1;
        report.stream_events.add(
            Digest::new(row.get(11).unwrap_or(-1))
                .value(row.get_ref(12)?)
                .value(row.get_ref(10)?),
        );
        let Ok(e) = event_row(row) else {
            // A row of the wrong shape is an inconsistency, never a crash.
            report.event_inconsistency_count += 1;
            let sequence = row.get(11).unwrap_or(-1);
            report.check_suspects.push((Table::Events, sequence));
            continue;
        };
        if e.stored_hash.is_none() {
            report.check_suspects.push((Table::Events, e.sequence));
        } else {
            report.check_violation_count += i64::from(!checks::event_passes(&e.event.kind));
        }
        return Ok(Some(e));
    }
}

fn advance_child(rows: &mut rusqlite::Rows<'_>) -> Result<Option<ChildSums>> {
    let Some(row) = rows.next()? else {
        return Ok(None);
    };
    let num = |i| row.get::<_, i64>(i).map_or(i128::MAX, i128::from);
    Ok(Some(ChildSums {
        parent: row.get(0)?,
        calls: num(1),
        tokens: num(2),
        cost: num(3),
    }))
}

#[cfg(test)]
mod tests {
    use super::event_stream;
    use crate::schema::test_support::plan;

    /// The events come through the events' index, task by task in the
    /// tasks' id order, with no sort of all of them (a temporary b-tree
    /// the size of the table).
    #[test]
    fn the_event_stream_needs_no_sort() -> crate::errors::Result<()> {
        let events = plan(&event_stream())?;
        assert!(!events.contains("TEMP B-TREE"), "{events}");
        assert!(events.contains("task_events_task_idx"), "{events}");
        Ok(())
    }
}
