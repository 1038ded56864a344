//! Brings a file of an earlier v3 layout to the current one.
//!
//! A file of the third layout lacks only the index of the tasks in
//! creation order and the children's order in its children index, which
//! are built in place. The third layout changed how
//! an event names its task (by number, see `schema::DDL`), so a file of the
//! first two (the first, whose CHECKs listed values with `IN`, or the
//! second) has both tables rebuilt. It is a change of layout, not of
//! meaning:
//! every row is copied as it stands, damage too (a value its CHECKs refuse,
//! an event whose task is missing), so doctor counts on the new file what
//! it counted on the old. A task keeps its rowid as its number, and so the
//! table's order.

use rusqlite::Transaction;

use crate::checks;
use crate::errors::Result;
use crate::schema::{self, LayoutUpgrade, EVENT_TASK_NO};
// A task row's columns: every layout has them all (the current one adds
// only its number).
use crate::task::COLUMNS as TASK_COLUMNS;

/// The earlier layouts' indexes (every layout names them alike); the new
/// ones take their names.
const INDEXES: [&str; 6] = [
    "tasks_parent_idx",
    "tasks_running_idx",
    "tasks_pending_delivery_idx",
    "tasks_queue_idx",
    "tasks_tenant_queue_idx",
    "task_events_task_idx",
];

/// The columns an event row has in every layout (all but its task's).
const EVENT_COLUMNS: [&str; 11] = [
    "sequence",
    "event_kind",
    "from_value",
    "to_value",
    "occurred_at",
    "code",
    "worker",
    "grant_calls",
    "grant_tokens",
    "grant_cost_micros",
    "event_hash",
];

/// Brings an earlier layout's tables to the current ones inside `tx`, as
/// `schema::inspect` found they must be. The caller must have turned
/// foreign keys off (SQLite cannot do that inside a transaction).
pub fn migrate(tx: &Transaction<'_>, upgrade: LayoutUpgrade) -> Result<()> {
    match upgrade {
        LayoutUpgrade::Index => schema::order_third_layout_indexes(tx),
        // The rows are copied as they are, so a row that breaks a CHECK is
        // carried for doctor to count, not refused.
        LayoutUpgrade::Rebuild => {
            checks::without_checks(tx, || schema::rebuild(tx, &INDEXES, copy_rows))
        }
    }
}

fn copy_rows(tx: &Transaction<'_>) -> Result<()> {
    tx.execute(
        &format!(
            "INSERT INTO tasks (task_no, {TASK_COLUMNS})
             SELECT rowid, {TASK_COLUMNS} FROM tw_migrating_tasks ORDER BY rowid"
        ),
        [],
    )?;
    let columns = EVENT_COLUMNS.join(", ");
    let from_old = EVENT_COLUMNS.map(|c| format!("e.{c}")).join(", ");
    tx.execute(
        &format!(
            "INSERT INTO task_events (task_no, {columns})
             SELECT {EVENT_TASK_NO}, {from_old}
             FROM tw_migrating_events e LEFT JOIN tasks t ON t.id = e.task_id
             ORDER BY e.sequence"
        ),
        [],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::migrate;
    use crate::errors::Result;
    use crate::schema::{inspect, test_support, Earlier, Found, LayoutUpgrade};

    /// Every row crosses as it stands: a task keeps its rowid as its
    /// number (a negative one, edited by hand, too), an event names that
    /// number, an event whose task is missing names none that exists, and a
    /// row its CHECKs refuse is kept.
    #[test]
    fn the_first_two_layouts_are_rebuilt_keeping_every_row() -> Result<()> {
        for layout in [1, 2] {
            let mut conn = test_support::earlier_layout(layout)?;
            // Off for the orphan event, and as the caller of `migrate` has it.
            conn.pragma_update(None, "foreign_keys", false)?;
            conn.execute_batch(
                "INSERT INTO tasks (rowid, id, status, delivery_status, delivery_required,
                     created_at, updated_at, delivery_updated_at, event_head)
                 VALUES (-3, 'a', 'queued', 'pending', 1, 1.0, 1.0, 1.0, zeroblob(32)),
                        (9, 'b', 'queued', 'pending', 1, 2.0, 2.0, 2.0, zeroblob(32));
                 INSERT INTO task_events (sequence, task_id, event_kind, to_value, occurred_at,
                     event_hash)
                 VALUES (1, 'b', 'created', 'queued', 2.0, zeroblob(32)),
                        (2, 'a', 'created', 'queued', 1.0, zeroblob(32)),
                        (3, 'gone', 'created', 'queued', 3.0, zeroblob(32));
                 PRAGMA ignore_check_constraints = ON;
                 UPDATE tasks SET status = 'paused' WHERE id = 'b';
                 PRAGMA ignore_check_constraints = OFF;",
            )?;
            let tx = conn.transaction()?;
            let upgrade = LayoutUpgrade::Rebuild;
            assert_eq!(inspect(&tx)?, Found::Earlier(Earlier::Layout(upgrade)));
            migrate(&tx, upgrade)?;
            tx.commit()?;
            assert_eq!(inspect(&conn)?, Found::Current);
            let tasks: Vec<(i64, String, String)> = conn
                .prepare("SELECT task_no, id, status FROM tasks ORDER BY task_no")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<rusqlite::Result<_>>()?;
            assert_eq!(
                tasks,
                [
                    (-3, "a".into(), "queued".into()),
                    (9, "b".into(), "paused".into())
                ]
            );
            let events: Vec<(i64, i64)> = conn
                .prepare("SELECT sequence, task_no FROM task_events ORDER BY sequence")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            assert_eq!(events, [(1, 9), (2, -3), (3, -4)]);
            let checks: i64 =
                conn.query_row("PRAGMA ignore_check_constraints", [], |r| r.get(0))?;
            assert_eq!(checks, 0, "the CHECKs hold again after the copy");
        }
        Ok(())
    }

    /// A file of the third layout gets the indexes it lacks and nothing
    /// else: every row stays where it is, and the file is the current
    /// layout.
    #[test]
    fn the_third_layout_gets_its_index_in_place() -> Result<()> {
        let mut conn = test_support::earlier_layout(3)?;
        conn.execute_batch(
            "INSERT INTO tasks (task_no, id, status, delivery_status, delivery_required,
                 created_at, updated_at, ended_at, delivery_updated_at, event_head)
             VALUES (4, 'b', 'queued', 'pending', 1, 2.0, 2.0, NULL, 2.0, zeroblob(32)),
                    (7, 'a', 'succeeded', 'pending', 1, 1.0, 1.0, 1.0, 1.0, zeroblob(32));",
        )?;
        let tx = conn.transaction()?;
        assert_eq!(
            inspect(&tx)?,
            Found::Earlier(Earlier::Layout(LayoutUpgrade::Index))
        );
        migrate(&tx, LayoutUpgrade::Index)?;
        tx.commit()?;
        assert_eq!(inspect(&conn)?, Found::Current);
        let ordered: Vec<(i64, String)> = conn
            .prepare("SELECT task_no, id FROM tasks INDEXED BY tasks_created_idx ORDER BY created_at, id")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        assert_eq!(ordered, [(7, "a".into()), (4, "b".into())]);
        Ok(())
    }
}
