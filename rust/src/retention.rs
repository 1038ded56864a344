//! Retention for ledgers that run for years: deleting one fully closed
//! task, purging whole fully closed task trees in short batches, and the
//! counts that tell an operator what the file holds.

use std::collections::BTreeMap;
use std::time::Instant;

use rusqlite::types::ValueRef;
use rusqlite::{params, Transaction};

use crate::errors::{Error, Result};
use crate::fsm::{ALL_DELIVERY_STATUSES, ALL_TASK_STATUSES};
use crate::store::Store;
use crate::tasks;
use crate::validate;

/// A task is fully closed when its status and its delivery are terminal.
const FULLY_CLOSED: &str = "status IN ('succeeded','failed','timed_out','cancelled') \
    AND delivery_status <> 'pending'";

/// Task `t`'s row times are at or before the cutoff (`?2`).
fn row_unchanged_since_cutoff(t: &str) -> String {
    format!("max({t}.updated_at, {t}.delivery_updated_at) <= ?2")
}

/// Task `t` has an event after the cutoff: a grant changes a closed task
/// without moving its row times, so its events count too.
fn event_since_cutoff(t: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM task_events e WHERE e.task_no = {t}.task_no AND e.occurred_at > ?2)"
    )
}

/// Task `t` last changed at or before the cutoff: its row and its events.
fn unchanged_since_cutoff(t: &str) -> String {
    format!(
        "{} AND NOT {}",
        row_unchanged_since_cutoff(t),
        event_since_cutoff(t)
    )
}

/// The events of the task whose id is `?1`.
const OF_TASK: &str = "task_no = (SELECT task_no FROM tasks WHERE id = ?1)";

/// `delete_task`: one fully closed task without children, and its events.
pub fn delete_task(tx: &Transaction<'_>, id: &str) -> Result<()> {
    let task = tasks::get(tx, id)?;
    if !task.status.is_terminal() || !task.delivery_status.is_terminal() {
        return Err(Error::Conflict("only a fully closed task can be deleted"));
    }
    let children: i64 = tx.query_row(
        "SELECT count(*) FROM tasks WHERE parent_id = ?1",
        [id],
        |r| r.get(0),
    )?;
    if children > 0 {
        return Err(Error::Conflict("a task with children cannot be deleted"));
    }
    tx.execute(&format!("DELETE FROM task_events WHERE {OF_TASK}"), [id])?;
    tx.execute("DELETE FROM tasks WHERE id = ?1", [id])?;
    Ok(())
}

/// What a purge did (or, dry, would do). Counts only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PurgeReport {
    pub dry_run: bool,
    pub trees_purged: i64,
    pub tasks_purged: i64,
    pub events_purged: i64,
    pub batches: i64,
    /// The longest single write transaction, in microseconds.
    pub longest_batch_micros: i64,
}

/// Roots examined per write transaction: small enough that other writers
/// wait milliseconds, not seconds.
pub const PURGE_BATCH: usize = 256;

/// Tasks removed per write transaction, at most, unless one tree alone is
/// larger (a tree is never split; it then has a batch of its own): 256
/// large trees in one batch held the write lock for seconds.
pub const PURGE_BATCH_TASKS: usize = 4096;

/// Task rows a batch reads, at most, looking for roots: they are found by
/// reading the table in id order, and one unbounded search held the write
/// lock for seconds on a file of millions where few trees were old enough.
pub const PURGE_SCAN_ROWS: usize = 8192;

/// What one search for roots found.
struct Roots {
    /// Root ids in id order that are fully closed and last changed at or
    /// before the cutoff, each with whether it has children (most trees are
    /// a single task: those need no tree walk).
    found: Vec<(String, bool)>,
    /// The last id read, where the next search starts; `None` when no
    /// task was left to read.
    last_read: Option<String>,
}

/// Reads tasks after `after` in id order until a batch of roots is found
/// or [`PURGE_SCAN_ROWS`] rows were read. The `CASE` judges each row in
/// order of cost, so the event and child lookups run only for a root
/// whose own fields qualify; a NULL in them (no tenant, or damage) is
/// "no", as it was in a `WHERE`: a tenant's purge once took the old tasks
/// with no tenant too. Ids stored as anything but text, which only
/// damage makes, are passed over, as every read refuses them.
fn next_roots(
    tx: &Transaction<'_>,
    after: &str,
    cutoff: f64,
    tenant: Option<&str>,
) -> Result<Roots> {
    let mut stmt = tx.prepare_cached(&format!(
        "SELECT r.id, CASE
             WHEN NOT coalesce(r.parent_id IS NULL AND (?3 IS NULL OR r.tenant IS ?3)
                               AND {FULLY_CLOSED} AND {}, 0) THEN 0
             WHEN {} THEN 0
             WHEN EXISTS (SELECT 1 FROM tasks c WHERE c.parent_id = r.id) THEN 2
             ELSE 1 END
         FROM tasks r WHERE r.id > ?1 AND typeof(r.id) = 'text' ORDER BY r.id",
        row_unchanged_since_cutoff("r"),
        event_since_cutoff("r")
    ))?;
    let mut rows = stmt.query(params![after, cutoff, tenant])?;
    let mut roots = Roots {
        found: Vec::new(),
        last_read: None,
    };
    for _ in 0..PURGE_SCAN_ROWS {
        let Some(row) = rows.next()? else { break };
        let id: String = row.get(0)?;
        match row.get::<_, i64>(1)? {
            0 => {}
            kind => roots.found.push((id.clone(), kind == 2)),
        }
        roots.last_read = Some(id);
        if roots.found.len() == PURGE_BATCH {
            break;
        }
    }
    Ok(roots)
}

// UNION, not UNION ALL: an id duplicated by damage (a flipped bit in the
// table, which the index does not see) makes a cycle, and the walk ends.
const TREE: &str = "WITH RECURSIVE tree(id) AS (
    SELECT ?1 UNION SELECT t.id FROM tasks t JOIN tree ON t.parent_id = tree.id)";

/// Every task of the tree under `root`, if every one of them is fully
/// closed, old enough and (when scoped) of the tenant; otherwise `None`.
/// What the walk of one tree found.
enum Tree {
    /// Every task of it may go, these.
    Closed(Vec<String>),
    /// A task of it must stay; the walk read this many rows to find it.
    Open { read: usize },
}

fn closed_tree(
    tx: &Transaction<'_>,
    root: &str,
    cutoff: f64,
    tenant: Option<&str>,
) -> Result<Tree> {
    let mut stmt = tx.prepare_cached(&format!(
        "{TREE} SELECT x.id, ({FULLY_CLOSED} AND {}
                             AND (?3 IS NULL OR x.tenant IS ?3))
         FROM tasks x JOIN tree ON x.id = tree.id",
        unchanged_since_cutoff("x")
    ))?;
    let mut ids = Vec::new();
    let mut rows = stmt.query(params![root, cutoff, tenant])?;
    while let Some(row) = rows.next()? {
        if !row.get::<_, bool>(1)? {
            return Ok(Tree::Open {
                read: ids.len() + 1,
            });
        }
        ids.push(row.get(0)?);
    }
    Ok(Tree::Closed(ids))
}

/// Which trees a purge takes: fully closed, last changed at or before
/// `cutoff`, and (when scoped) of `tenant`.
pub struct PurgeScope {
    pub cutoff: f64,
    pub tenant: Option<String>,
    pub dry_run: bool,
}

/// Purges every tree in `scope`, a batch per write transaction, making way
/// for other writers between batches (see `Store::make_way`); a dry run
/// counts them in one read transaction (one snapshot: counted batch by
/// batch beside a writer, a preview reported a count the ledger never
/// held). `between` runs after each batch; its error stops the purge
/// there, and the batches already committed stay purged.
pub fn purge(
    store: &mut Store,
    scope: &PurgeScope,
    between: &mut dyn FnMut() -> Result<()>,
) -> Result<PurgeReport> {
    let mut report = PurgeReport {
        dry_run: scope.dry_run,
        ..PurgeReport::default()
    };
    if scope.dry_run {
        return store.read(|tx| {
            let mut after = String::new();
            while let Some(last) = timed(&mut report, |r| purge_batch(tx, &after, scope, r))? {
                after = last;
                between()?;
            }
            Ok(report)
        });
    }
    let mut after = String::new();
    loop {
        let batch =
            |tx: &Transaction<'_>| timed(&mut report, |r| purge_batch(tx, &after, scope, r));
        match store.write(batch)? {
            Some(last) => after = last,
            None => return Ok(report),
        }
        store.make_way();
        between()?;
    }
}

/// Purges (or counts) one batch; returns the id the next batch starts
/// after, or `None` when no task was left to read.
fn purge_batch(
    tx: &Transaction<'_>,
    after: &str,
    scope: &PurgeScope,
    report: &mut PurgeReport,
) -> Result<Option<String>> {
    let (cutoff, tenant) = (scope.cutoff, scope.tenant.as_deref());
    let Roots {
        found: roots,
        last_read: Some(last),
    } = next_roots(tx, after, cutoff, tenant)?
    else {
        return Ok(None);
    };
    let mut count_events =
        tx.prepare_cached(&format!("SELECT count(*) FROM task_events WHERE {OF_TASK}"))?;
    let mut drop_events = tx.prepare_cached(&format!("DELETE FROM task_events WHERE {OF_TASK}"))?;
    let mut drop_task = tx.prepare_cached("DELETE FROM tasks WHERE id = ?1")?;
    let mut taken = 0;
    // The last root this batch examined: where the next one starts.
    let mut examined: Option<String> = None;
    for (root, has_children) in roots {
        let tree = if has_children {
            match closed_tree(tx, &root, cutoff, tenant)? {
                Tree::Closed(ids) => ids,
                Tree::Open { read } => {
                    // Walking a tree that stays costs the batch too.
                    taken += read;
                    examined = Some(root);
                    if taken >= PURGE_BATCH_TASKS {
                        return Ok(examined);
                    }
                    continue;
                }
            }
        } else {
            vec![root.clone()]
        };
        if taken > 0 && taken + tree.len() > PURGE_BATCH_TASKS {
            return Ok(examined); // this tree starts the next batch
        }
        examined = Some(root);
        taken += tree.len();
        report.trees_purged += 1;
        // Children before parents, so no moment sees a dangling parent link.
        for id in tree.iter().rev() {
            if scope.dry_run {
                report.events_purged += count_events.query_row([id], |r| r.get::<_, i64>(0))?;
            } else {
                report.events_purged += drop_events.execute([id])? as i64;
                drop_task.execute([id])?;
            }
            report.tasks_purged += 1;
        }
    }
    Ok(Some(last))
}

/// Times one batch and keeps the longest.
fn timed<T>(report: &mut PurgeReport, op: impl FnOnce(&mut PurgeReport) -> Result<T>) -> Result<T> {
    let start = Instant::now();
    let out = op(report)?;
    let micros = i64::try_from(start.elapsed().as_micros()).unwrap_or(i64::MAX);
    report.longest_batch_micros = report.longest_batch_micros.max(micros);
    report.batches += 1;
    Ok(out)
}

/// `stats()`: counts by status, delivery and tenant. Counts only.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub task_count: i64,
    pub by_status: BTreeMap<&'static str, i64>,
    pub by_delivery: BTreeMap<&'static str, i64>,
    pub by_tenant: BTreeMap<String, i64>,
    pub event_count: i64,
}

/// Reads the counts in the caller's read transaction.
/// The `by_tenant` key of a stored tenant. A stored value that is not a
/// valid name (a damaged or edited file) is counted, never echoed: every
/// other read refuses such a row, and it may hold any text at all.
fn tenant_key(stored: ValueRef<'_>) -> &str {
    match stored {
        ValueRef::Null => "(none)",
        ValueRef::Text(t) => std::str::from_utf8(t)
            .ok()
            .filter(|name| validate::name(name).is_ok())
            .unwrap_or("(invalid)"),
        _ => "(invalid)",
    }
}

pub fn stats(tx: &Transaction<'_>, tenant: Option<&str>) -> Result<Stats> {
    let mut out = Stats {
        by_status: ALL_TASK_STATUSES.iter().map(|s| (s.as_str(), 0)).collect(),
        by_delivery: ALL_DELIVERY_STATUSES
            .iter()
            .map(|s| (s.as_str(), 0))
            .collect(),
        ..Stats::default()
    };
    let mut stmt = tx.prepare(
        "SELECT status, delivery_status, tenant, count(*) FROM tasks
         WHERE (?1 IS NULL OR tenant = ?1) GROUP BY 1, 2, 3",
    )?;
    let mut rows = stmt.query([tenant])?;
    while let Some(row) = rows.next()? {
        let (status, delivery, n): (String, String, i64) = (row.get(0)?, row.get(1)?, row.get(3)?);
        let who = tenant_key(row.get_ref(2)?);
        out.task_count += n;
        if let Some(slot) = ALL_TASK_STATUSES.iter().find(|s| s.as_str() == status) {
            *out.by_status.entry(slot.as_str()).or_default() += n;
        }
        if let Some(slot) = ALL_DELIVERY_STATUSES
            .iter()
            .find(|s| s.as_str() == delivery)
        {
            *out.by_delivery.entry(slot.as_str()).or_default() += n;
        }
        *out.by_tenant.entry(who.to_owned()).or_default() += n;
    }
    out.event_count = if tenant.is_some() {
        tx.query_row(
            "SELECT count(*) FROM task_events e JOIN tasks t ON t.task_no = e.task_no WHERE t.tenant = ?1",
            [tenant],
            |r| r.get(0),
        )?
    } else {
        tx.query_row("SELECT count(*) FROM task_events", [], |r| r.get(0))?
    };
    Ok(out)
}
