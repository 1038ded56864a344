//! Parent-link cycles for `doctor`, found in one pass over the tasks.
//!
//! Each task's walk towards its root stops at the first ancestor an
//! earlier walk already settled. A ledger of deep task trees then costs
//! about one lookup per task and one per parent, where walking every task
//! to its root cost one per task and ancestor (a chain of 3,000 tasks took
//! 21 s). Memory is one integer per parent task, never an id.

use std::collections::HashSet;

use rusqlite::{OptionalExtension, Statement, Transaction};

use crate::errors::Result;

/// One task reached by a walk.
struct Found {
    rowid: i64,
    parent: Option<String>,
    created: Option<f64>,
}

pub struct Ancestry<'conn> {
    /// A task's rowid, parent and creation time, by id.
    lookup: Statement<'conn>,
    /// Tasks whose way up is known: it ends at a root, at a missing
    /// parent, or on a cycle already counted.
    settled: HashSet<i64>,
    /// The tasks of the walk in progress.
    path: HashSet<i64>,
    /// Cycles found so far; each is counted once, by the walk that closes it.
    pub cycles: i64,
}

impl<'conn> Ancestry<'conn> {
    pub fn new(tx: &'conn Transaction<'_>) -> Result<Self> {
        Ok(Self {
            lookup: tx.prepare("SELECT rowid, parent_id, created_at FROM tasks WHERE id = ?1")?,
            settled: HashSet::new(),
            path: HashSet::new(),
            cycles: 0,
        })
    }

    /// Walks up from the task at `rowid`, whose parent is `parent`,
    /// counting the cycle it closes if any, and returns the parent's
    /// creation time if the parent exists (doctor's late-child check). A
    /// read that fails (a damaged page) ends doctor's scan as an error.
    pub fn walk_up(&mut self, rowid: i64, parent: &str) -> Result<Option<f64>> {
        let Some(first) = self.find(parent)? else {
            return Ok(None);
        };
        let parent_created = first.created;
        self.path.clear();
        self.path.insert(rowid);
        let mut closed_cycle = false;
        let mut next = Some(first);
        while let Some(found) = next {
            if self.settled.contains(&found.rowid) {
                break;
            }
            if !self.path.insert(found.rowid) {
                // No member of this cycle was settled, or the walk would
                // have stopped there: it is a new one.
                self.cycles += 1;
                closed_cycle = true;
                break;
            }
            next = match found.parent {
                Some(parent) => self.find(&parent)?,
                None => None,
            };
        }
        // Only parents are kept: a task that is nobody's parent is never
        // reached by another walk. A start on the cycle it closed is a
        // parent (of the member below it), and must not count it again.
        let start = (!closed_cycle).then_some(rowid);
        self.settled
            .extend(self.path.drain().filter(|&r| Some(r) != start));
        Ok(parent_created)
    }

    /// The task with this id, if there is one. Values of the wrong type
    /// are other checks' business: read what can be read and walk on.
    fn find(&mut self, id: &str) -> Result<Option<Found>> {
        Ok(self
            .lookup
            .query_row([id], |r| {
                Ok(Found {
                    rowid: r.get(0)?,
                    parent: r.get(1).ok().flatten(),
                    created: r.get(2).ok(),
                })
            })
            .optional()?)
    }
}
