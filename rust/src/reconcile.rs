//! Restart reconciliation (SPEC §5): which `running` rows are lies, and
//! which pending deliveries will never be confirmed.
//!
//! Decisions are SQL predicates shared by the dry run (counts only) and the
//! apply (set-based writes), so the two can never disagree. Each transition
//! still gets its chained event: the hash is computed by a Rust SQL function
//! inside the statement that writes the events, and the rows take it from
//! there as their new chain head.

use rusqlite::types::ValueRef;
use rusqlite::{named_params, Connection, Transaction};

use crate::checks;
use crate::errors::{Error, Result};
use crate::tasks::Clock;

/// What to reconcile.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// A running task not updated for this long is `restart_stale`.
    pub active_grace: f64,
    /// A pending delivery this long after the task ended has failed.
    pub delivery_grace: f64,
    /// This worker's running tasks are timed out now (`worker_lost`).
    pub worker_lost: Option<String>,
    /// Only this tenant's tasks are examined.
    pub tenant: Option<String>,
}

/// The peer's report: counts only, never an id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub dry_run: bool,
    pub applied: bool,
    pub active_examined: i64,
    pub tasks_timed_out: i64,
    pub fresh_active_retained: i64,
    pub pending_delivery_examined: i64,
    pub deliveries_failed: i64,
    pub deliveries_not_applicable: i64,
    pub pending_delivery_retained: i64,
}

const TENANT: &str = "(:tenant IS NULL OR tenant = :tenant)";

/// Running tasks that are past their deadline, stale, or owned by a lost
/// worker. All thresholds are inclusive (peer rule).
///
/// A row at the last version (i64::MAX: `version + 1` would store a REAL
/// no read accepts) or below the first (its `CHECK` broken by hand: the
/// pass writes `version + 1` without that check, see [`update_rows`]), or
/// with a time that is no finite number (text sorts after every number, so
/// it looked like a clock behind the row; a time of -inf was overwritten,
/// and doctor's evidence with it) is damage that every other write
/// refuses: the pass leaves it to doctor, whose counts name it, instead of
/// failing or writing it.
const TIMED_OUT: &str = "status = 'running' AND (:tenant IS NULL OR tenant = :tenant) AND (
    (deadline_at IS NOT NULL AND deadline_at <= :now) OR updated_at <= :stale
    OR (:worker IS NOT NULL AND owner = :worker)) AND version BETWEEN 0 AND 9223372036854775806 \
    AND created_at BETWEEN -1.7976931348623157e308 AND 1.7976931348623157e308 \
    AND updated_at BETWEEN -1.7976931348623157e308 AND 1.7976931348623157e308 \
    AND (started_at IS NULL OR started_at BETWEEN -1.7976931348623157e308 AND 1.7976931348623157e308)";

/// The code, by precedence: deadline, then stale, then lost worker.
const TIMEOUT_CODE: &str = "CASE WHEN deadline_at IS NOT NULL AND deadline_at <= :now \
    THEN 'deadline_exceeded' WHEN updated_at <= :stale THEN 'restart_stale' ELSE 'worker_lost' END";

/// Terminal tasks (ended_at is set exactly when terminal) whose pending
/// delivery outlived its grace; a row at the last version, or below the
/// first, is passed over (see [`TIMED_OUT`]).
macro_rules! delivery_expired {
    () => {
        "delivery_status = 'pending' AND ended_at IS NOT NULL AND ended_at <= :dcut \
         AND (:tenant IS NULL OR tenant = :tenant) \
         AND version BETWEEN 0 AND 9223372036854775806"
    };
}

/// Expired deliveries of either kind.
const DELIVERY_EXPIRED: &str = delivery_expired!();

/// Expired deliveries of one kind (`:required`).
const EXPIRED: &str = concat!(delivery_expired!(), " AND delivery_required = :required");

/// Expired deliveries, of either kind, on rows that are not running: the
/// ones [`in_one_scan`] changes beside the timeouts (a running row with an
/// ended delivery is damage, left to the passes after it).
const EXPIRED_ENDED: &str = concat!(delivery_expired!(), " AND status <> 'running'");

/// A row's new chain head: the hash of the one event the pass has just
/// written for it, the only one numbered past `:before` (the last sequence
/// before the pass wrote). Read through the events' index instead of
/// hashing the event a second time.
const NEW_HEAD: &str = "(SELECT event_hash FROM task_events e \
    WHERE e.task_no = tasks.task_no AND e.sequence > :before)";

struct Cutoffs {
    now: f64,
    stale: f64,
    dcut: f64,
}

fn count(tx: &Transaction<'_>, sql: &str, params: &[(&str, &dyn rusqlite::ToSql)]) -> Result<i64> {
    Ok(tx.prepare_cached(sql)?.query_row(params, |r| r.get(0))?)
}

/// Tasks of one status, counted through its partial index.
fn status_count(tx: &Transaction<'_>, status: &str, tenant: Option<&str>) -> Result<i64> {
    let sql = status_count_sql(status, tenant.is_some());
    match tenant {
        Some(tenant) => count(tx, &sql, named_params! {":tenant": tenant}),
        None => count(tx, &sql, &[]),
    }
}

/// With a tenant, its own term, never the catch-all [`TENANT`]: the plan is
/// fixed before the value is bound, and the catch-all read every tenant's
/// queue where one tenant's queue index holds just its own (a pass for one
/// tenant of 10,000 counted all 300,000 open tasks).
fn status_count_sql(status: &str, by_tenant: bool) -> String {
    let tenant = if by_tenant {
        " AND tenant = :tenant"
    } else {
        ""
    };
    format!("SELECT count(*) FROM tasks WHERE status = '{status}'{tenant}")
}

/// Queued plus running tasks (the peer's "active").
fn active_count(tx: &Transaction<'_>, tenant: Option<&str>) -> Result<i64> {
    Ok(status_count(tx, "queued", tenant)? + status_count(tx, "running", tenant)?)
}

fn pending_count(tx: &Transaction<'_>, tenant: Option<&str>) -> Result<i64> {
    count(
        tx,
        &format!(
            "SELECT count(*) FROM tasks WHERE delivery_status = 'pending' \
             AND ended_at IS NOT NULL AND {TENANT}"
        ),
        named_params! {":tenant": tenant},
    )
}

fn timed_out_count(tx: &Transaction<'_>, p: &Policy, c: &Cutoffs) -> Result<i64> {
    count(
        tx,
        &format!("SELECT count(*) FROM tasks WHERE {TIMED_OUT}"),
        named_params! {":tenant": p.tenant, ":now": c.now, ":stale": c.stale, ":worker": p.worker_lost},
    )
}

/// Of the tasks this pass times out, those whose delivery a grace of zero
/// then closes in the same pass, by kind (required, internal): a row that
/// takes one write more after its timeout (not then at the last version).
/// The apply's delivery scan passes over the rest.
fn closed_after_timeout(tx: &Transaction<'_>, p: &Policy, c: &Cutoffs) -> Result<(i64, i64)> {
    Ok(tx
        .prepare_cached(&format!(
            "SELECT count(*) FILTER (WHERE delivery_required = 1),
                    count(*) FILTER (WHERE delivery_required = 0)
             FROM tasks WHERE {TIMED_OUT} AND version <= 9223372036854775805"
        ))?
        .query_row(
            named_params! {":tenant": p.tenant, ":now": c.now, ":stale": c.stale,
            ":worker": p.worker_lost},
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?)
}

const CLOCK_BEHIND: &str = "clock moved backwards across a persisted transition";

/// The peer fails the whole reconcile if a task it would time out carries a
/// timestamp later than `now`: the clock is not trusted then.
fn check_forward_time(tx: &Transaction<'_>, p: &Policy, c: &Cutoffs) -> Result<()> {
    let behind = count(
        tx,
        &format!(
            "SELECT count(*) FROM tasks WHERE {TIMED_OUT} \
             AND (created_at > :now OR started_at > :now OR updated_at > :now)"
        ),
        named_params! {":tenant": p.tenant, ":now": c.now, ":stale": c.stale, ":worker": p.worker_lost},
    )?;
    if behind > 0 {
        return Err(Error::Conflict(CLOCK_BEHIND));
    }
    Ok(())
}

/// Registers `tw_not_before(now, t1, t2, t3)`: `now`, or an error if any
/// of the times (NULLs aside) is later. The apply's timeout pass reads
/// every row it times out anyway, so it checks the clock in the same read
/// instead of in a scan of its own (20-30 ms of a 100,000-task apply).
pub fn register_sql_function(conn: &Connection) -> Result<()> {
    use rusqlite::functions::FunctionFlags;
    conn.create_scalar_function(
        "tw_not_before",
        4,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            let now: f64 = ctx.get(0)?;
            for index in 1..4 {
                // SQL's order: text and blobs sort after every number.
                let later = match ctx.get_raw(index) {
                    ValueRef::Null => false,
                    ValueRef::Integer(t) => t as f64 > now,
                    ValueRef::Real(t) => t > now,
                    ValueRef::Text(_) | ValueRef::Blob(_) => true,
                };
                if later {
                    return Err(rusqlite::Error::UserFunctionError(CLOCK_BEHIND.into()));
                }
            }
            Ok(now)
        },
    )?;
    Ok(())
}

fn expired_count(tx: &Transaction<'_>, p: &Policy, c: &Cutoffs, required: bool) -> Result<i64> {
    count(
        tx,
        &format!("SELECT count(*) FROM tasks WHERE {EXPIRED}"),
        named_params! {":tenant": p.tenant, ":dcut": c.dcut, ":required": required},
    )
}

fn cutoffs(now: f64, p: &Policy) -> Cutoffs {
    Cutoffs {
        now,
        stale: now - p.active_grace,
        dcut: now - p.delivery_grace,
    }
}

/// Counts what [`apply`] would do, writing nothing. The read snapshot is
/// fixed by the first count before the clock is read (peer order).
pub fn preview(tx: &Transaction<'_>, p: &Policy, clock: Clock<'_>) -> Result<Report> {
    let active = active_count(tx, p.tenant.as_deref())?;
    let c = cutoffs(clock()?, p);
    let timed_out = timed_out_count(tx, p, &c)?;
    if timed_out > 0 {
        check_forward_time(tx, p, &c)?;
    }
    let pending = pending_count(tx, p.tenant.as_deref())?;
    let (mut failed, mut not_applicable) = (
        expired_count(tx, p, &c, true)?,
        expired_count(tx, p, &c, false)?,
    );
    // Tasks timed out in this pass end at `now`; their delivery expires in
    // the same pass only when `now <= now - grace` (a grace of zero).
    if timed_out > 0 && c.now <= c.dcut {
        let (required, internal) = closed_after_timeout(tx, p, &c)?;
        failed += required;
        not_applicable += internal;
    }
    Ok(report(
        true,
        active,
        timed_out,
        pending + timed_out,
        failed,
        not_applicable,
    ))
}

fn report(
    dry_run: bool,
    active: i64,
    timed_out: i64,
    examined: i64,
    failed: i64,
    na: i64,
) -> Report {
    Report {
        dry_run,
        applied: !dry_run,
        active_examined: active,
        tasks_timed_out: timed_out,
        fresh_active_retained: active - timed_out,
        pending_delivery_examined: examined,
        deliveries_failed: failed,
        deliveries_not_applicable: na,
        pending_delivery_retained: examined - failed - na,
    }
}

/// Applies every decision in the caller's write transaction, all stamped
/// with one `now` read after the lock is held (peer order).
pub fn apply(tx: &Transaction<'_>, p: &Policy, clock: Clock<'_>) -> Result<Report> {
    let c = cutoffs(clock()?, p);
    let tenant = p.tenant.as_deref();
    let running = status_count(tx, "running", tenant)?;
    let active = status_count(tx, "queued", tenant)? + running;
    let pending = pending_count(tx, tenant)?;
    let (timed_out, mut failed, mut not_applicable) = match running_tasks(tx, running)? {
        SCAN => in_one_scan(tx, p, &c)?,
        tasks => (time_out(tx, p, &c, tasks)?, 0, 0),
    };
    // After the timeouts: a task timed out just now whose delivery expires
    // at once (a grace of zero or less) gets its second event here.
    failed += expire_deliveries(tx, p, &c, true)?;
    not_applicable += expire_deliveries(tx, p, &c, false)?;
    Ok(report(
        false,
        active,
        timed_out,
        pending + timed_out,
        failed,
        not_applicable,
    ))
}

/// Where the timeout pass reads the running tasks: through their index, or,
/// when they are a large share of the table (a whole fleet left them
/// behind), the table itself in its own order. Then each page is read once
/// in turn instead of each row looked up at random, and the events need no
/// sort: at a million tasks, half of them stale, the pass took about a
/// third less. The table's size is its highest task number (a bound: a
/// purge leaves gaps).
fn running_tasks(tx: &Transaction<'_>, running: i64) -> Result<&'static str> {
    let numbered: i64 = tx.query_row("SELECT coalesce(max(task_no), 0) FROM tasks", [], |r| {
        r.get(0)
    })?;
    Ok(if running.saturating_mul(4) >= numbered {
        SCAN
    } else {
        "tasks"
    })
}

/// The table read in its own order (see [`running_tasks`]).
const SCAN: &str = "tasks NOT INDEXED";

fn time_out(tx: &Transaction<'_>, p: &Policy, c: &Cutoffs, tasks: &str) -> Result<i64> {
    let before = last_sequence(tx)?;
    let written = timeout_events(tx, p, c, tasks)?;
    update_rows(
        tx,
        written,
        &timeout_update(tasks),
        named_params! {":tenant": p.tenant, ":now": c.now, ":stale": c.stale,
        ":worker": p.worker_lost, ":before": before},
    )
}

/// Writes the timed-out tasks' events; returns how many.
fn timeout_events(tx: &Transaction<'_>, p: &Policy, c: &Cutoffs, tasks: &str) -> Result<i64> {
    let hash = format!(
        "tw_event_hash(event_head, id, 'task_transition', 'running', 'timed_out', :now, \
         {TIMEOUT_CODE}, NULL)"
    );
    let params = named_params! {":tenant": p.tenant, ":now": c.now, ":stale": c.stale, ":worker": p.worker_lost};
    let inserted = tx
        .prepare_cached(&format!(
            // In the table's order: the events' task index then grows in
            // key order, which keeps a 50,000-row reconcile cache-friendly.
            // A clock check that fails part-way undoes the whole statement.
            "INSERT INTO task_events (task_no, event_kind, from_value, to_value, occurred_at, code, event_hash)
             SELECT task_no, 'task_transition', 'running', 'timed_out',
                    tw_not_before(:now, created_at, started_at, updated_at), {TIMEOUT_CODE}, {hash}
             FROM {tasks} WHERE {TIMED_OUT} ORDER BY task_no"
        ))?
        .execute(params);
    match inserted {
        Ok(count) => Ok(count as i64),
        Err(failed) => {
            // The statement is undone. A clock behind a row is the peer's
            // conflict, found again by the plain scan; anything else is
            // the statement's own error.
            check_forward_time(tx, p, c)?;
            Err(failed.into())
        }
    }
}

fn expire_deliveries(tx: &Transaction<'_>, p: &Policy, c: &Cutoffs, required: bool) -> Result<i64> {
    let before = last_sequence(tx)?;
    let written = expiry_events(tx, p, c, required, DELIVERY_EXPIRED)?;
    let (to, code) = expiry(required);
    update_rows(
        tx,
        written,
        &expiry_update(to, code),
        named_params! {":tenant": p.tenant, ":now": c.now, ":dcut": c.dcut,
        ":required": required, ":before": before},
    )
}

/// The status and code an expired delivery of this kind moves to.
fn expiry(required: bool) -> (&'static str, &'static str) {
    if required {
        ("failed", "delivery_grace_expired")
    } else {
        ("not_applicable", "internal_task")
    }
}

/// Writes the events of the expired deliveries that `rows` selects, of
/// one kind; returns how many.
fn expiry_events(
    tx: &Transaction<'_>,
    p: &Policy,
    c: &Cutoffs,
    required: bool,
    rows: &str,
) -> Result<i64> {
    let (to, code) = expiry(required);
    let hash = format!(
        "tw_event_hash(event_head, id, 'delivery_transition', 'pending', '{to}', :now, '{code}', NULL)"
    );
    let params =
        named_params! {":tenant": p.tenant, ":now": c.now, ":dcut": c.dcut, ":required": required};
    let inserted = tx
        .prepare_cached(&format!(
            "INSERT INTO task_events (task_no, event_kind, from_value, to_value, occurred_at, code, event_hash)
             SELECT task_no, 'delivery_transition', 'pending', '{to}', :now, '{code}', {hash}
             FROM tasks WHERE {rows} AND delivery_required = :required ORDER BY ended_at, task_no"
        ))?
        .execute(params)?;
    Ok(inserted as i64)
}

/// When the timeout pass scans the whole table, the expired deliveries'
/// rows change in that same scan: their events are written first, by kind
/// as ever, then one `UPDATE` changes every row that has one. Changed in
/// a pass of their own, after the timeouts had changed rows on every page,
/// each page was changed twice: at a million tasks (100,000 expired
/// deliveries), whose pages the page cache does not hold (see
/// `store::bulk::IN_MEMORY_BULK_MAX_FILE_BYTES`), the apply wrote 833 MiB
/// instead of 667 and took 0.1-0.25 s longer (about 3.3 s against 3.1).
/// The events come out numbered as before: the timeouts, then each kind
/// of delivery in its own order. Returns the timeouts and both kinds.
fn in_one_scan(tx: &Transaction<'_>, p: &Policy, c: &Cutoffs) -> Result<(i64, i64, i64)> {
    let before = last_sequence(tx)?;
    let timed_out = timeout_events(tx, p, c, SCAN)?;
    let failed = expiry_events(tx, p, c, true, EXPIRED_ENDED)?;
    let not_applicable = expiry_events(tx, p, c, false, EXPIRED_ENDED)?;
    let written = timed_out + failed + not_applicable;
    let changed = update_rows(
        tx,
        written,
        &one_scan_update(),
        named_params! {":tenant": p.tenant, ":now": c.now, ":stale": c.stale,
        ":worker": p.worker_lost, ":dcut": c.dcut, ":before": before},
    )?;
    // The same predicates over the same rows: a row without its one event
    // would take a wrong head, so the whole apply is refused instead.
    if changed != written {
        return Err(Error::Internal(
            "reconcile changed other rows than it wrote events for",
        ));
    }
    Ok((timed_out, failed, not_applicable))
}

/// The timeout pass's rows, read from `tasks` (see [`running_tasks`]).
fn timeout_update(tasks: &str) -> String {
    format!(
        "UPDATE OR FAIL {tasks} SET status = 'timed_out', updated_at = :now, ended_at = :now,
            terminal_code = {TIMEOUT_CODE}, park_code = NULL, version = version + 1,
            event_head = {NEW_HEAD}
         WHERE {TIMED_OUT}"
    )
}

/// The expired deliveries' rows, moved `to` with `code`.
fn expiry_update(to: &str, code: &str) -> String {
    format!(
        "UPDATE OR FAIL tasks SET delivery_status = '{to}', delivery_code = '{code}',
            delivery_updated_at = :now, version = version + 1, event_head = {NEW_HEAD}
         WHERE {EXPIRED}"
    )
}

/// The rows of [`in_one_scan`]: a running one is timed out, any other has
/// its delivery expired (by its kind).
fn one_scan_update() -> String {
    let run = "status = 'running'";
    let (failed, failed_code) = expiry(true);
    let (na, na_code) = expiry(false);
    format!(
        "UPDATE OR FAIL {SCAN} SET
            status = CASE WHEN {run} THEN 'timed_out' ELSE status END,
            updated_at = CASE WHEN {run} THEN :now ELSE updated_at END,
            ended_at = CASE WHEN {run} THEN :now ELSE ended_at END,
            terminal_code = CASE WHEN {run} THEN {TIMEOUT_CODE} ELSE terminal_code END,
            park_code = CASE WHEN {run} THEN NULL ELSE park_code END,
            delivery_status = CASE WHEN {run} THEN delivery_status
                WHEN delivery_required = 1 THEN '{failed}' ELSE '{na}' END,
            delivery_code = CASE WHEN {run} THEN delivery_code
                WHEN delivery_required = 1 THEN '{failed_code}' ELSE '{na_code}' END,
            delivery_updated_at = CASE WHEN {run} THEN delivery_updated_at ELSE :now END,
            version = version + 1, event_head = {NEW_HEAD}
         WHERE ({TIMED_OUT}) OR ({EXPIRED_ENDED} AND delivery_required IN (0, 1))"
    )
}

/// The highest event sequence so far (0 for none): each event the pass
/// writes next is numbered past it.
fn last_sequence(tx: &Transaction<'_>) -> Result<i64> {
    Ok(tx.query_row(
        "SELECT coalesce(max(sequence), 0) FROM task_events",
        [],
        |r| r.get(0),
    )?)
}

/// Runs one of the pass's multi-row `UPDATE`s so that SQLite keeps no
/// statement journal for it. A multi-row statement that may stop part-way
/// makes SQLite copy every page it changes to a journal first, to undo
/// just that statement. At a million tasks the pass wrote 385 MiB of
/// such journals, more than its WAL (288 MiB), 330 MiB of them for these
/// `UPDATE`s. Nothing here needs that undo: any error fails the whole
/// transaction, which the caller rolls back. SQLite skips the
/// journal when the statement calls no SQL function and its constraints
/// fail with `OR FAIL` instead of aborting, so the `UPDATE` takes its
/// chain heads from the events already written (see [`NEW_HEAD`]) and is
/// compiled without the table's `CHECK`s: the one on `event_head` calls
/// `length()`. The values it writes meet them by construction: fixed
/// statuses and codes, `ended_at` set with a terminal status, a version
/// taken from the predicates' range plus one, a head that is a stored
/// event's 32-byte hash (a missing one fails `NOT NULL`).
///
/// The rows are those of the `written` events just written: with none, no
/// row can match, and the statement is neither compiled nor run (switching
/// the `CHECK`s also recompiles every statement of the connection at its
/// next use, a cost an apply with nothing to do need not pay).
fn update_rows(
    tx: &Transaction<'_>,
    written: i64,
    sql: &str,
    params: &[(&str, &dyn rusqlite::ToSql)],
) -> Result<i64> {
    if written == 0 {
        return Ok(0);
    }
    let changed = checks::without_checks(tx, || Ok(tx.prepare(sql)?.execute(params)?))?;
    Ok(changed as i64)
}

#[cfg(test)]
mod tests {
    use super::{
        cutoffs, expire_deliveries, expiry_update, in_one_scan, one_scan_update,
        register_sql_function, running_tasks, status_count_sql, time_out, timeout_update, Policy,
        EXPIRED, SCAN, TIMED_OUT,
    };
    use crate::checks::without_checks;
    use crate::schema::test_support::plan;
    use rusqlite::Connection;

    /// A ledger of `queued` queued tasks and 40 running ones, half of them
    /// silent since time 0, numbered from 1 with the running ones last.
    fn ledger(queued: i64) -> crate::errors::Result<Connection> {
        let mut conn = Connection::open_in_memory()?;
        crate::events::register_sql_functions(&conn)?;
        register_sql_function(&conn)?;
        let tx = conn.transaction()?;
        crate::schema::create(&tx)?;
        tx.execute(
            "WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n WHERE k < ?1 + 40)
             INSERT INTO tasks (id, status, delivery_status, delivery_required, created_at,
                 started_at, updated_at, delivery_updated_at, event_head)
             SELECT printf('00000000-0000-4000-8000-%012d', k),
                 CASE WHEN k > ?1 THEN 'running' ELSE 'queued' END, 'pending', 1, 0.0,
                 CASE WHEN k > ?1 THEN 0.0 END, CASE WHEN k % 2 = 0 THEN 500.0 ELSE 0.0 END,
                 0.0, zeroblob(32)
             FROM n",
            [queued],
        )?;
        tx.commit()?;
        Ok(conn)
    }

    /// The rows and events a timeout pass leaves.
    fn timed_out_through(conn: &mut Connection, tasks: &str) -> crate::errors::Result<String> {
        let tx = conn.transaction()?;
        let policy = Policy {
            active_grace: 600.0,
            ..Policy::default()
        };
        assert_eq!(
            time_out(&tx, &policy, &cutoffs(1_000.0, &policy), tasks)?,
            20
        );
        let joined = |rows: &str| -> rusqlite::Result<String> {
            tx.query_row(
                &format!("SELECT group_concat(row, ';') FROM ({rows})"),
                [],
                |r| r.get(0),
            )
        };
        let tasks = joined(
            "SELECT printf('%d %s %s %s', task_no, status, terminal_code, hex(event_head)) AS row
             FROM tasks ORDER BY task_no",
        )?;
        let events = joined(
            "SELECT printf('%d %d %s %s', sequence, task_no, code, hex(event_hash)) AS row
             FROM task_events ORDER BY sequence",
        )?;
        Ok(format!("{tasks}|{events}"))
    }

    /// [`ledger`] with, interleaved among its tasks' numbers, 30 ended
    /// ones: their deliveries pending since time 0 (a third of them
    /// internal) or, for every fourth, since time 990.
    fn ledger_with_deliveries() -> crate::errors::Result<Connection> {
        let conn = ledger(40)?;
        conn.execute(
            "WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n WHERE k < 30)
             INSERT INTO tasks (task_no, id, status, delivery_status, delivery_required,
                 created_at, started_at, updated_at, ended_at, delivery_updated_at,
                 terminal_code, event_head)
             SELECT 1000 + 3 * k, printf('00000000-0000-4000-9000-%012d', k), 'succeeded',
                 'pending', k % 3 <> 0, 0.0, 0.0, 0.0,
                 CASE WHEN k % 4 = 0 THEN 990.0 ELSE 0.0 END, 0.0, 'worker_completed',
                 zeroblob(32)
             FROM n",
            [],
        )?;
        Ok(conn)
    }

    /// Every row and event an apply through the table's scan leaves, the
    /// expired deliveries changed in the timeouts' scan (`one_scan`) or
    /// in passes of their own, with the delivery grace given.
    fn applied(one_scan: bool, delivery_grace: f64) -> crate::errors::Result<(String, String)> {
        let mut conn = ledger_with_deliveries()?;
        let tx = conn.transaction()?;
        let policy = Policy {
            active_grace: 600.0,
            delivery_grace,
            ..Policy::default()
        };
        let c = cutoffs(1_000.0, &policy);
        let (timed_out, mut failed, mut internal) = if one_scan {
            in_one_scan(&tx, &policy, &c)?
        } else {
            (time_out(&tx, &policy, &c, SCAN)?, 0, 0)
        };
        failed += expire_deliveries(&tx, &policy, &c, true)?;
        internal += expire_deliveries(&tx, &policy, &c, false)?;
        let joined = |rows: &str| -> rusqlite::Result<String> {
            tx.query_row(
                &format!("SELECT group_concat(row, ';') FROM ({rows})"),
                [],
                |r| r.get(0),
            )
        };
        let tasks = joined(
            "SELECT printf('%d %s %s %s %s %s %s %s %d %s', task_no, status, updated_at,
                 ended_at, terminal_code, delivery_status, delivery_code, delivery_updated_at,
                 version, hex(event_head)) AS row FROM tasks ORDER BY task_no",
        )?;
        let events = joined(
            "SELECT printf('%d %s %s %s %s', task_no, event_kind, to_value, code,
                 hex(event_hash)) AS row FROM task_events ORDER BY task_no, sequence",
        )?;
        let numbered = joined(
            "SELECT printf('%d %d', sequence, task_no) AS row FROM task_events ORDER BY sequence",
        )?;
        Ok((
            format!("{timed_out} {failed} {internal}|{tasks}|{events}"),
            numbered,
        ))
    }

    /// Changed in the timeouts' scan or in passes of their own, the
    /// expired deliveries come out alike: the same rows, the same chained
    /// events, numbered in the same order. With a grace of zero, a task
    /// timed out by the pass has its delivery expire too, second in its
    /// chain (its events are numbered after the other deliveries' then).
    #[test]
    fn expired_deliveries_in_the_timeouts_scan_change_as_in_their_own_pass(
    ) -> crate::errors::Result<()> {
        let (scanned, numbered) = applied(true, 50.0)?;
        assert_eq!((scanned.clone(), numbered), applied(false, 50.0)?);
        assert!(scanned.starts_with("20 15 8|"), "{scanned}");
        let (at_once, _) = applied(true, 0.0)?;
        assert_eq!(at_once, applied(false, 0.0)?.0);
        assert!(at_once.starts_with("20 40 10|"), "{at_once}");
        Ok(())
    }

    /// Few running tasks are read through their index, a large share of
    /// the table by scanning it; either way the pass writes the same rows
    /// and the same events, in the same order.
    #[test]
    fn the_timeout_pass_reads_the_running_tasks_either_way_alike() -> crate::errors::Result<()> {
        for (queued, expected) in [(1_000, "tasks"), (40, "tasks NOT INDEXED")] {
            let conn = ledger(queued)?;
            let tx = Connection::unchecked_transaction(&conn)?;
            assert_eq!(running_tasks(&tx, 40)?, expected);
        }
        let (mut by_index, mut by_scan) = (ledger(1_000)?, ledger(1_000)?);
        let written = timed_out_through(&mut by_index, "tasks")?;
        assert_eq!(
            timed_out_through(&mut by_scan, "tasks NOT INDEXED")?,
            written
        );
        let scan = plan(&format!(
            "SELECT task_no FROM tasks NOT INDEXED WHERE {TIMED_OUT} ORDER BY task_no"
        ))?;
        assert_eq!(scan, "SCAN tasks");
        Ok(())
    }

    /// `now` when no time is later (the bound is inclusive, NULLs are
    /// skipped); an error for a later time, or for text or a blob, which
    /// SQL sorts after every number.
    #[test]
    fn tw_not_before_passes_now_through_or_refuses() -> crate::errors::Result<()> {
        let conn = Connection::open_in_memory()?;
        register_sql_function(&conn)?;
        let call = |args: &str| {
            conn.query_row(&format!("SELECT tw_not_before({args})"), [], |r| {
                r.get::<_, f64>(0)
            })
        };
        assert_eq!(call("10.0, 1, 2.5, NULL")?, 10.0);
        assert_eq!(call("10.0, 10, 10.0, NULL")?, 10.0);
        for later in [
            "10.0, 11, NULL, NULL",
            "10.0, NULL, 10.5, NULL",
            "10.0, 1, 2, '3'",
            "10.0, 1, x'00', 3",
        ] {
            assert!(call(later).is_err(), "{later}");
        }
        Ok(())
    }

    /// Reconcile reads only the rows it may change, through the partial
    /// indexes, whatever values are bound (plans are pinned per connection).
    #[test]
    fn decisions_read_their_partial_indexes() -> crate::errors::Result<()> {
        let timed_out = plan(&format!("SELECT count(*) FROM tasks WHERE {TIMED_OUT}"))?;
        assert!(timed_out.contains("tasks_running_idx"), "{timed_out}");
        let expired = plan(&format!("SELECT count(*) FROM tasks WHERE {EXPIRED}"))?;
        assert!(expired.contains("tasks_pending_delivery_idx"), "{expired}");
        // The writes too: the timeout events are sorted by task number,
        // not read by scanning the whole table in that order.
        let events = plan(&format!(
            "SELECT task_no FROM tasks WHERE {TIMED_OUT} ORDER BY task_no"
        ))?;
        assert!(events.contains("tasks_running_idx"), "{events}");
        Ok(())
    }

    /// The opcodes of `sql` that keep SQLite's statement journal: a call
    /// of an SQL function, or a constraint that aborts the statement
    /// (`Halt` with P2 = 2, `OE_Abort`).
    fn journal_reasons(conn: &Connection, sql: &str) -> crate::errors::Result<Vec<String>> {
        let mut explain = conn.prepare(&format!("EXPLAIN {sql}"))?;
        // Unbound: compiling needs no parameter values.
        let mut ops = explain.raw_query();
        let mut reasons = Vec::new();
        while let Some(op) = ops.next()? {
            let (opcode, p2): (String, i64) = (op.get(1)?, op.get(3)?);
            if opcode.contains("Func") || (opcode == "Halt" && p2 == 2) {
                reasons.push(format!("{opcode} {p2}"));
            }
        }
        Ok(reasons)
    }

    /// Compiled as `update_rows` compiles them, the pass's `UPDATE`s meet
    /// SQLite's terms for keeping no statement journal; with the table's
    /// `CHECK`s they would not (the one on `event_head` calls `length()`),
    /// and the connection has its `CHECK`s back afterwards.
    #[test]
    fn the_row_updates_keep_no_statement_journal() -> crate::errors::Result<()> {
        let mut conn = ledger(0)?;
        let tx = conn.transaction()?;
        let updates = [
            timeout_update("tasks"),
            timeout_update(SCAN),
            expiry_update("failed", "delivery_grace_expired"),
            one_scan_update(),
        ];
        for update in &updates {
            assert!(!journal_reasons(&tx, update)?.is_empty(), "{update}");
            let reasons = without_checks(&tx, || journal_reasons(&tx, update))?;
            assert_eq!(reasons, Vec::<String>::new(), "{update}");
            let ignoring: bool =
                tx.query_row("PRAGMA ignore_check_constraints", [], |r| r.get(0))?;
            assert!(!ignoring);
        }
        Ok(())
    }

    /// A pass for one tenant counts its queue through that tenant's own
    /// queue index, and every queue through the whole queue's.
    #[test]
    fn a_tenants_queue_is_counted_through_its_own_index() -> crate::errors::Result<()> {
        assert_eq!(
            plan(&status_count_sql("queued", true))?,
            "SEARCH tasks USING COVERING INDEX tasks_tenant_queue_idx (tenant=?)"
        );
        assert_eq!(
            plan(&status_count_sql("queued", false))?,
            "SCAN tasks USING COVERING INDEX tasks_queue_idx"
        );
        Ok(())
    }
}
