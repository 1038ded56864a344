//! The library's own descriptors on ledger files, one per file per process.
//!
//! SQLite's locks are POSIX record locks, which belong to a process and a
//! file: closing *any* descriptor of the file drops every lock the process
//! holds on it, SQLite's included. A ledger whose lock was dropped looks
//! unused to other processes; the next one to close its connection takes
//! itself for the last user, checkpoints and unlinks the WAL under a live
//! writer, and what that writer commits afterwards is lost.
//!
//! So the checks and reads the library makes itself go through one shared
//! descriptor per file, closed only when no handle of the process uses the
//! file any more (a handle drops its lease after its SQLite connection).
//! The same holds for the `-shm`, where SQLite keeps its WAL locks: the
//! descriptors through which the library reads the WAL index there (see
//! `wal_index`) live as long as the file's own. A review saw a read-only
//! handle that opened and closed the `-shm` for each look drop a writer's
//! lock in its process, two writers commit at once, and the file corrupt.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::fsguard::FileKey as Key;

struct Entry {
    key: Key,
    file: Arc<File>,
    /// Descriptors of the same file opened in a race with this entry:
    /// closing them could drop locks too, so they live as long as it does.
    strays: Vec<File>,
    leases: usize,
    /// Handles whose connection writes (see [`Lease::enter_as_writer`]).
    writers: usize,
    /// Read-only handles that made SQLite map the WAL's shared memory
    /// read-only (see [`Lease::enter_as_reader`]).
    readonly_shm: usize,
    /// The `-shm` the process's SQLite maps for this file, as the first
    /// writable handle found it: SQLite maps it once per process, so a
    /// handle opening beside others gets that mapping, whatever file is at
    /// the name now (see `Store::open`).
    mapped_shm: Option<Key>,
    /// Descriptors of the file's `-shm`, one per file found at the name,
    /// for reading the WAL index (see [`Lease::shm`]).
    shms: Vec<(Key, Arc<File>)>,
    /// The process that opened the descriptor: a forked child forgets the
    /// parent's entries (see [`forget_inherited`]).
    pid: u32,
}

/// What a lease's handle does with the file's shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Other,
    Writer,
    ReadOnlyShm,
}

static HELD: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn held() -> MutexGuard<'static, Vec<Entry>> {
    // The list stays consistent even if a holder panicked: every change to
    // it is a single push, increment or removal.
    HELD.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A use of the shared descriptor of one file; the descriptor is closed
/// when the last lease on it is dropped.
pub struct Lease {
    key: Key,
    /// Always `Some` until dropped: the drop closes it under the registry's
    /// lock, so that no other handle opens the file in between.
    file: Option<Arc<File>>,
    /// The process that took it: a forked child's copy does not count.
    pid: u32,
    role: Role,
}

impl Lease {
    /// The shared descriptor. Reads must be positional (`read_at`): other
    /// leases use the same file offset.
    ///
    /// # Panics
    ///
    /// Never: a lease gives up its file only when dropped.
    #[must_use]
    pub fn file(&self) -> &File {
        self.file
            .as_deref()
            .expect("a lease holds its file until dropped")
    }

    /// Whether the process's SQLite maps `shm` for this file: records it
    /// when no other handle of the process uses the file (or none recorded
    /// one), and otherwise compares it with the one recorded.
    pub fn maps_shm(&self, shm: Option<Key>) -> bool {
        let mut held = held();
        let Some(entry) = held.iter_mut().find(|e| e.key == self.key) else {
            return true;
        };
        if entry.leases == 1 || entry.mapped_shm.is_none() {
            entry.mapped_shm = shm;
            return true;
        }
        entry.mapped_shm == shm
    }

    /// A descriptor of the regular file at `name` (the file's `-shm`), to
    /// read (positionally) and never close: it closes with the file's own,
    /// once no handle of the process uses the file. One per file found at
    /// the name, kept while the process uses the ledger file: a `-shm` that
    /// writers removed and made again is another file. `None` when no
    /// regular file is there.
    #[must_use]
    pub fn shm(&self, name: &Path) -> Option<Arc<File>> {
        let at_name = std::fs::symlink_metadata(name).ok()?;
        if !at_name.file_type().is_file() {
            return None; // a FIFO planted there would block the open
        }
        let key = (at_name.dev(), at_name.ino());
        {
            let held = held();
            let entry = held.iter().find(|e| e.key == self.key)?;
            if let Some((_, file)) = entry.shms.iter().find(|(k, _)| *k == key) {
                return Some(Arc::clone(file));
            }
        }
        // Opened outside the registry's lock: a FIFO swapped in since the
        // check above blocks this call alone, not every open, close and
        // fork of the process.
        let file = File::open(name).ok()?;
        let Ok(meta) = file.metadata() else {
            std::mem::forget(file); // which file it is cannot be told
            return None;
        };
        let opened = (meta.dev(), meta.ino());
        let file = Arc::new(file);
        let mut held = held();
        // The file's registry entry may be gone (a forked child forgot the
        // parent's): then nothing may close this descriptor.
        let Some(entry) = held.iter_mut().find(|e| e.key == self.key) else {
            std::mem::forget(file);
            return None;
        };
        // Another thread may have opened the same file meanwhile: both
        // stay open (closing either could drop SQLite's locks).
        entry.shms.push((opened, Arc::clone(&file)));
        (opened == key).then_some(file)
    }

    /// Whether other handles of this process use the file too.
    #[must_use]
    pub fn shared(&self) -> bool {
        held()
            .iter()
            .find(|e| e.key == self.key)
            .is_some_and(|e| e.leases > 1)
    }

    /// SQLite keeps one shared-memory mapping of a WAL per file and
    /// process, made writable or read-only by the first connection to map
    /// it; a writer that came later could not commit at all. So a writable
    /// handle is refused (`false`) while a read-only one holds the mapping
    /// read-only, and counts as a writer otherwise.
    pub fn enter_as_writer(&mut self) -> bool {
        self.enter(|entry| {
            (entry.readonly_shm == 0).then(|| {
                entry.writers += 1;
                Role::Writer
            })
        })
    }

    /// A read-only handle on a live WAL, about to open SQLite's read-only
    /// connection. `true`: no writer is in the process, the connection may
    /// map the shared memory read-only, and writers wait for it to close.
    /// `false`: a writer is here, and the connection must map it writable
    /// (whichever of the two maps it first, SQLite shares that mapping).
    pub fn enter_as_reader(&mut self) -> bool {
        self.enter(|entry| {
            (entry.writers == 0).then(|| {
                entry.readonly_shm += 1;
                Role::ReadOnlyShm
            })
        })
    }

    /// The handle no longer maps the shared memory (a read-only preview
    /// that moved to a private copy): writers need not wait for it.
    pub fn step_down(&mut self) {
        let mut held = held();
        if let Some(entry) = held.iter_mut().find(|e| e.key == self.key) {
            leave(entry, self.role);
        }
        self.role = Role::Other;
    }

    fn enter(&mut self, judge: impl FnOnce(&mut Entry) -> Option<Role>) -> bool {
        let mut held = held();
        let Some(entry) = held.iter_mut().find(|e| e.key == self.key) else {
            return false;
        };
        match judge(entry) {
            Some(role) => {
                self.role = role;
                true
            }
            None => false,
        }
    }
}

fn leave(entry: &mut Entry, role: Role) {
    match role {
        Role::Writer => entry.writers -= 1,
        Role::ReadOnlyShm => entry.readonly_shm -= 1,
        Role::Other => {}
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            return; // the registry was the parent's (see `forget_inherited`)
        }
        let mut held = held();
        let file = self.file.take();
        if let Some(at) = held.iter().position(|e| e.key == self.key) {
            leave(&mut held[at], self.role);
            held[at].leases -= 1;
            if held[at].leases == 0 {
                held.swap_remove(at);
            }
        }
        drop(file); // the last one closes the descriptor, still under the lock
    }
}

/// A lease on the file `expected` names, if the process already holds it;
/// otherwise on the file `open` returns, which from then on is the shared
/// descriptor of whatever file it turned out to be (the caller compares
/// identities). `open` runs under the registry's lock, so two handles
/// opening one new file cannot both keep a descriptor of their own.
pub fn lease(expected: Option<Key>, open: impl FnOnce() -> io::Result<File>) -> io::Result<Lease> {
    let mut held = held();
    if let Some(entry) = expected.and_then(|key| held.iter_mut().find(|e| e.key == key)) {
        return Ok(take(entry));
    }
    let file = open()?;
    let meta = match file.metadata() {
        Ok(meta) => meta,
        Err(e) => {
            // Which file it is cannot be told, so neither can whether a
            // connection holds locks on it: never closed.
            std::mem::forget(file);
            return Err(e);
        }
    };
    let key = (meta.dev(), meta.ino());
    if let Some(entry) = held.iter_mut().find(|e| e.key == key) {
        entry.strays.push(file);
        return Ok(take(entry));
    }
    held.push(Entry {
        key,
        file: Arc::new(file),
        strays: Vec::new(),
        leases: 0,
        writers: 0,
        readonly_shm: 0,
        mapped_shm: None,
        shms: Vec::new(),
        pid: std::process::id(),
    });
    let last = held.len() - 1;
    Ok(take(&mut held[last]))
}

fn take(entry: &mut Entry) -> Lease {
    entry.leases += 1;
    Lease {
        key: entry.key,
        file: Some(Arc::clone(&entry.file)),
        pid: std::process::id(),
        role: Role::Other,
    }
}

/// The registry's lock, held by the forking thread across a fork (see
/// `fork_guard::hold_registries`).
pub struct ForkLock {
    _guard: MutexGuard<'static, Vec<Entry>>,
}

/// Takes the registry's lock for the duration of a fork.
pub fn lock_for_fork() -> ForkLock {
    ForkLock { _guard: held() }
}

/// In a forked child, once its inherited connections are closed and before
/// it opens a ledger of its own: the parent's entries (their counts are the
/// parent's handles) are forgotten. Closing the child's copies of their
/// descriptors drops no lock of the child's; leases the child still holds
/// from the parent keep their file open.
pub fn forget_inherited() {
    let me = std::process::id();
    held().retain(|entry| entry.pid == me);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(key: Key) -> usize {
        held()
            .iter()
            .filter(|e| e.key == key)
            .map(|e| e.leases)
            .sum()
    }

    #[test]
    fn one_descriptor_per_file_until_the_last_lease() -> io::Result<()> {
        let dir = std::env::temp_dir().join(format!("tw-held-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("f");
        std::fs::write(&path, b"x")?;
        let meta = std::fs::metadata(&path)?;
        let key = (meta.dev(), meta.ino());
        let first = lease(None, || File::open(&path))?;
        let mut opened_again = false;
        let second = lease(Some(key), || {
            opened_again = true;
            File::open(&path)
        })?;
        assert!(!opened_again, "a held file is not opened twice");
        assert_eq!(count(key), 2);
        // A racing open of the same file is kept, not closed.
        let third = lease(None, || File::open(&path))?;
        assert_eq!(count(key), 3);
        drop((first, second));
        assert_eq!(count(key), 1);
        drop(third);
        assert_eq!(count(key), 0);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    /// The `-shm` is read through descriptors that stay open as long as
    /// the file's own: one per file found at the name, never a FIFO.
    #[test]
    fn shm_descriptors_live_with_the_file() -> io::Result<()> {
        let dir = std::env::temp_dir().join(format!("tw-held-shm-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let (path, shm) = (dir.join("f"), dir.join("f-shm"));
        std::fs::write(&path, b"x")?;
        std::fs::write(&shm, b"first")?;
        let lease = lease(None, || File::open(&path))?;
        let shms = || {
            held()
                .iter()
                .find(|e| e.key == lease.key)
                .map(|e| e.shms.len())
        };
        let first = lease.shm(&shm).ok_or(io::ErrorKind::NotFound)?;
        let again = lease.shm(&shm).ok_or(io::ErrorKind::NotFound)?;
        assert!(Arc::ptr_eq(&first, &again), "one descriptor per file");
        std::fs::remove_file(&shm)?;
        assert!(lease.shm(&shm).is_none());
        std::fs::write(&shm, b"second")?; // made again: another file
        let second = lease.shm(&shm).ok_or(io::ErrorKind::NotFound)?;
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(shms(), Some(2), "the first is kept, not closed");
        std::fs::remove_file(&shm)?;
        std::fs::create_dir(&shm)?; // not a regular file
        assert!(lease.shm(&shm).is_none());
        drop((first, again, second));
        let key = lease.key;
        drop(lease);
        assert_eq!(count(key), 0, "closed with the last lease");
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
