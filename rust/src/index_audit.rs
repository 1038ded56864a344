//! Do the indexes say what the rows say?
//!
//! `PRAGMA quick_check` walks pages and records but never compares an index
//! with its table, and a damaged index misleads quietly: a lost entry of the
//! queue index hides a queued task from `claim_next`, a changed key in the
//! task index makes doctor read the wrong row. Doctor reads through the
//! indexes anyway, so it compares order-independent sums of per-row digests:
//! what the index-ordered streams saw against plain table scans, and what
//! each other index of the tasks holds against the entries the scanned rows
//! call for.

use rusqlite::types::ValueRef;
use rusqlite::Transaction;

use crate::fsm::{DeliveryStatus, TaskStatus};
use crate::task::TaskRow;

/// A fingerprint of one row's keys. Not cryptographic: it mixes 8-byte
/// words (a byte-at-a-time hash cost a tenth of doctor's scan) and only has
/// to make an accidental change of a key show.
#[derive(Clone, Copy, Debug)]
pub struct Digest(u64);

const K: u64 = 0x9e37_79b9_7f4a_7c15;
const REAL_TAG: u64 = 0xffff_fff0_0000_0001;
const NULL_TAG: u64 = 0xffff_fff0_0000_0002;

impl Digest {
    #[must_use]
    pub fn new(rowid: i64) -> Digest {
        Digest(K).mix(u64::from_le_bytes(rowid.to_le_bytes()))
    }

    fn mix(self, word: u64) -> Digest {
        Digest((self.0 ^ word).wrapping_mul(K).rotate_left(29))
    }

    /// Text or blob bytes, length first so that parts cannot run together.
    #[must_use]
    pub fn bytes(self, part: &[u8]) -> Digest {
        let mut d = self.mix(part.len() as u64);
        for chunk in part.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            d = d.mix(u64::from_le_bytes(word));
        }
        d
    }

    #[must_use]
    pub fn real(self, value: f64) -> Digest {
        self.mix(REAL_TAG).mix(value.to_bits())
    }

    /// A value as SQLite returned it (an integer in a REAL column is read
    /// back as the same number).
    #[must_use]
    #[allow(clippy::cast_precision_loss)]
    pub fn value(self, value: ValueRef<'_>) -> Digest {
        match value {
            ValueRef::Null => self.mix(NULL_TAG),
            ValueRef::Integer(i) => self.real(i as f64),
            ValueRef::Real(f) => self.real(f),
            ValueRef::Text(b) | ValueRef::Blob(b) => self.bytes(b),
        }
    }

    /// The final avalanche (as in splitmix64), so sums of digests spread.
    #[must_use]
    pub fn finish(self) -> u64 {
        let mut h = self.0;
        h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h ^ (h >> 31)
    }
}

/// How many rows, and the sum of their digests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub count: i64,
    pub sum: u64,
}

impl Tally {
    pub fn add(&mut self, digest: Digest) {
        self.count += 1;
        self.sum = self.sum.wrapping_add(digest.finish());
    }

    /// Adds the rows of another tally.
    pub fn add_all(&mut self, other: Tally) {
        self.count += other.count;
        self.sum = self.sum.wrapping_add(other.sum);
    }
}

/// The tally of a query's rows: column 0 is the rowid, the others are keys.
pub fn tally(tx: &Transaction<'_>, sql: &str) -> rusqlite::Result<Tally> {
    let mut stmt = tx.prepare(sql)?;
    let keys = stmt.column_count();
    let mut rows = stmt.query([])?;
    let mut tally = Tally::default();
    while let Some(row) = rows.next()? {
        let mut digest = Digest::new(row.get(0).unwrap_or(-1));
        for i in 1..keys {
            digest = digest.value(row.get_ref(i)?);
        }
        tally.add(digest);
    }
    Ok(tally)
}

/// Each index of `tasks` but the id's (which the streams read): the
/// covering scan that reads only the index, and which of a task's fields
/// make its entry.
const TASK_INDEXES: [&str; 6] = [
    "SELECT rowid, created_at, id FROM tasks INDEXED BY tasks_queue_idx
     WHERE status = 'queued'",
    "SELECT rowid, tenant, created_at, id FROM tasks INDEXED BY tasks_tenant_queue_idx
     WHERE status = 'queued' AND tenant IS NOT NULL",
    "SELECT rowid, updated_at FROM tasks INDEXED BY tasks_running_idx
     WHERE status = 'running'",
    "SELECT rowid, ended_at FROM tasks INDEXED BY tasks_pending_delivery_idx
     WHERE delivery_status = 'pending' AND ended_at IS NOT NULL",
    "SELECT rowid, parent_id, created_at, id FROM tasks INDEXED BY tasks_parent_idx
     WHERE parent_id IS NOT NULL",
    // Every list page but a parent's or the running tasks' reads its ids
    // from here: a changed id in it lists a task that does not exist.
    "SELECT rowid, created_at, id FROM tasks INDEXED BY tasks_created_idx",
];

/// The entries the indexes should hold, from the rows doctor read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expected([Tally; 6]);

impl Expected {
    pub fn add(&mut self, rowid: i64, task: &TaskRow) {
        let row = Digest::new(rowid);
        let id = task.id.as_bytes();
        // The entry of the queue's and of the creation order's index alike.
        let in_order = row.real(task.created_at).bytes(id);
        if task.status == TaskStatus::Queued {
            self.0[0].add(in_order);
            if let Some(tenant) = &task.tenant {
                self.0[1].add(row.bytes(tenant.as_bytes()).real(task.created_at).bytes(id));
            }
        }
        if task.status == TaskStatus::Running {
            self.0[2].add(row.real(task.updated_at));
        }
        if let (DeliveryStatus::Pending, Some(ended)) = (task.delivery_status, task.ended_at) {
            self.0[3].add(row.real(ended));
        }
        if let Some(parent) = &task.parent_id {
            self.0[4].add(row.bytes(parent.as_bytes()).real(task.created_at).bytes(id));
        }
        self.0[5].add(in_order);
    }

    /// True when every index holds exactly the expected entries.
    pub fn matches_indexes(&self, tx: &Transaction<'_>) -> rusqlite::Result<bool> {
        for (sql, expected) in TASK_INDEXES.iter().zip(&self.0) {
            if tally(tx, sql)? != *expected {
                return Ok(false);
            }
        }
        // The metadata keys through their unique index and in the table.
        Ok(tally(tx, "SELECT rowid, key FROM schema_meta NOT INDEXED")?
            == tally(
                tx,
                "SELECT rowid, key FROM schema_meta INDEXED BY sqlite_autoindex_schema_meta_1",
            )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::test_support::plan;

    /// The audit is only worth something if it reads the index alone.
    #[test]
    fn index_scans_read_only_the_index() -> crate::errors::Result<()> {
        let meta = "SELECT rowid, key FROM schema_meta INDEXED BY sqlite_autoindex_schema_meta_1";
        for sql in TASK_INDEXES.iter().chain([&meta]) {
            let plan = plan(sql)?;
            assert!(plan.contains("USING COVERING INDEX"), "{sql}: {plan}");
        }
        Ok(())
    }

    #[test]
    fn digests_tell_keys_apart() {
        let base = Digest::new(1).bytes(b"ab").bytes(b"c").finish();
        assert_ne!(base, Digest::new(1).bytes(b"a").bytes(b"bc").finish());
        assert_ne!(base, Digest::new(2).bytes(b"ab").bytes(b"c").finish());
        assert_eq!(
            Digest::new(3).real(2.0).finish(),
            Digest::new(3).value(ValueRef::Integer(2)).finish()
        );
        assert_ne!(
            Digest::new(3).real(0.0).finish(),
            Digest::new(3).value(ValueRef::Null).finish()
        );
    }
}
