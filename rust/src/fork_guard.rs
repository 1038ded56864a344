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
//! So every call checks the process id and refuses an inherited handle.
//! Before the child opens a ledger of its own, it closes every inherited
//! connection that no thread was using at the fork, without a checkpoint
//! (nothing on disk changes), so that its own connections start clean.
//! Nothing happens at the fork itself: a child that never opens a ledger
//! never calls SQLite, whose locks a thread that did not survive the fork
//! may hold. A connection that a thread was using at the fork may be in
//! the middle of a transaction and is never closed in the child.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::held_files;
use crate::store::Store;
use crate::wal_flush;

/// Where a handle keeps its store (`None` once closed).
pub type Slot = Mutex<Option<Store>>;

/// Every file handle's slot, with the process that opened it.
static OPEN: Mutex<Vec<(Weak<Slot>, u32)>> = Mutex::new(Vec::new());

/// Inherited stores whose handles the child dropped: closed, like the
/// others, before its first ledger of its own.
static ORPHANS: Mutex<Vec<Store>> = Mutex::new(Vec::new());

/// The registries' locks, held across a fork (see [`hold_registries`]).
struct Registries {
    _wal_helper: wal_flush::ForkLock,
    _open: MutexGuard<'static, Vec<(Weak<Slot>, u32)>>,
    _orphans: MutexGuard<'static, Vec<Store>>,
    _held: held_files::ForkLock,
}

thread_local! {
    /// Set on the forking thread between the fork hooks.
    static ACROSS_FORK: RefCell<Option<Registries>> = const { RefCell::new(None) };
}

/// Before a fork (an `os.register_at_fork` hook): takes the registries'
/// locks, so that none is held by another thread at the moment of the fork
/// (the child would inherit it locked for ever, and its first ledger would
/// wait on it). Their holders never wait for the interpreter, so this
/// waits only for them to finish. No SQLite is called. The WAL helper is
/// stopped first (see `wal_flush::stop_for_fork`).
pub fn hold_registries() {
    let registries = Registries {
        _wal_helper: wal_flush::stop_for_fork(),
        _open: locked(&OPEN),
        _orphans: locked(&ORPHANS),
        _held: held_files::lock_for_fork(),
    };
    ACROSS_FORK.with(|slot| *slot.borrow_mut() = Some(registries));
}

/// After a fork, in the parent and in the child alike: lets go of them.
pub fn free_registries() {
    ACROSS_FORK.with(|slot| drop(slot.borrow_mut().take()));
}

/// The error for any use of a handle in a process that did not open it.
pub const INHERITED: crate::errors::Error = crate::errors::Error::Conflict(
    "this ledger handle was opened by another process (before a fork): open a new Ledger here",
);

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change to these lists is one push, removal or take.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records a new file handle's slot.
pub fn register(slot: &Arc<Slot>) {
    let mut open = locked(&OPEN);
    open.retain(|(weak, _)| weak.strong_count() > 0);
    open.push((Arc::downgrade(slot), std::process::id()));
}

/// Before a process opens a ledger: closes the connections it inherited
/// that no thread was using at the fork, and forgets the parent's shared
/// descriptors. Nothing to do in the process that opened them.
pub fn close_inherited() {
    let me = std::process::id();
    let mut inherited = Vec::new();
    locked(&OPEN).retain(|(weak, opened_by)| {
        if *opened_by == me {
            return weak.strong_count() > 0;
        }
        if let Some(slot) = weak.upgrade() {
            // A slot locked at the fork belonged to a call in a thread that
            // is gone: its connection may be mid-transaction, left alone.
            if let Ok(mut store) = slot.try_lock() {
                inherited.extend(store.take());
            }
        }
        false
    });
    inherited.append(&mut locked(&ORPHANS));
    for store in inherited {
        store.close_without_checkpoint();
    }
    held_files::forget_inherited();
}

/// For a file handle being dropped in a process other than the one that
/// opened it: its store is kept for [`close_inherited`], or, if a thread
/// was using it at the fork, never closed. In its own process the store
/// is dropped, and closed, with the handle.
pub fn release(slot: &mut Arc<Slot>, opened_by: u32) {
    if std::process::id() == opened_by {
        return;
    }
    let idle = match slot.try_lock() {
        Ok(mut store) => store.take(),
        Err(_) => None,
    };
    match idle {
        Some(store) => locked(&ORPHANS).push(store),
        None => {
            if let Some(slot) = Arc::get_mut(slot) {
                let store = slot.get_mut().unwrap_or_else(PoisonError::into_inner);
                std::mem::forget(store.take());
            }
        }
    }
}
