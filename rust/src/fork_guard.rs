//! A ledger handle belongs to the process that opened it.
//!
//! A forked child inherits the parent's connections but not its POSIX
//! locks, while SQLite's own records of the locks it holds and of the
//! shared memory it mapped are copied as they were. Used in the child, an
//! inherited connection writes without the locks it believes it holds.
//! Closed there the usual way, it takes itself for the last user and
//! checkpoints its stale view over newer pages, or unlinks a WAL another
//! process still needs. And while it lives, a fresh connection in the
//! child to the same file shares its records and takes no lock at all.
//!
//! So every call checks the process id and refuses an inherited handle,
//! and just after a fork the child closes every inherited connection that
//! no other thread was using, without a checkpoint (nothing on disk
//! changes), so that the child's own ledgers start clean. One that another
//! thread was using at the fork is never closed in the child.

use std::sync::{Arc, Mutex, PoisonError, TryLockError, Weak};

use crate::held_files;
use crate::store::Store;

/// Where a handle keeps its store (`None` once closed).
pub type Slot = Mutex<Option<Store>>;

/// Every handle's slot, so that a forked child can find them.
static OPEN: Mutex<Vec<Weak<Slot>>> = Mutex::new(Vec::new());

/// The error for any use of a handle in a process that did not open it.
pub const INHERITED: crate::errors::Error = crate::errors::Error::Conflict(
    "this ledger handle was opened by another process (before a fork): open a new Ledger here",
);

/// Records a new handle's slot.
pub fn register(slot: &Arc<Slot>) {
    let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
    open.retain(|weak| weak.strong_count() > 0);
    open.push(Arc::downgrade(slot));
}

/// In a forked child, before anything else runs: closes the inherited
/// connections. Only the forking thread survives a fork, so a lock some
/// other thread held at that moment is never released: nothing here waits
/// for one, and whatever it guards is left alone.
pub fn close_inherited() {
    let mut open = match OPEN.try_lock() {
        Ok(open) => open,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => return,
    };
    for slot in open.drain(..).filter_map(|weak| weak.upgrade()) {
        // A slot locked at the fork belonged to a call in another thread:
        // its connection may be mid-transaction, and must not be touched.
        if let Ok(mut store) = slot.try_lock() {
            if let Some(store) = store.take() {
                store.close_without_checkpoint();
            }
        }
    }
    drop(open);
    held_files::forget_inherited();
}

/// For a handle being dropped: in a process other than the one that
/// opened it, takes its store out to be left unclosed for good (see the
/// module's comment); in its own process the store is dropped, and closed,
/// with the handle.
pub fn release(slot: &mut Arc<Slot>, opened_by: u32) {
    if std::process::id() == opened_by {
        return;
    }
    if let Some(slot) = Arc::get_mut(slot) {
        let store = slot.get_mut().unwrap_or_else(PoisonError::into_inner);
        std::mem::forget(store.take());
    }
}
