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

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex, MutexGuard};

/// Device and inode.
type Key = (u64, u64);

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
    file: Arc<File>,
    /// The process that took it: a forked child's copy does not count.
    pid: u32,
    role: Role,
}

impl Lease {
    /// The shared descriptor. Reads must be positional (`read_at`): other
    /// leases use the same file offset.
    #[must_use]
    pub fn file(&self) -> &File {
        &self.file
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
    /// connection: with no writer in the process, that maps the shared
    /// memory read-only, and later writers must wait for it to close.
    pub fn enter_as_reader(&mut self) {
        self.enter(|entry| {
            (entry.writers == 0).then(|| {
                entry.readonly_shm += 1;
                Role::ReadOnlyShm
            })
        });
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

impl Drop for Lease {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            return; // the registry was the parent's (see `forget_inherited`)
        }
        let mut held = held();
        if let Some(at) = held.iter().position(|e| e.key == self.key) {
            match self.role {
                Role::Writer => held[at].writers -= 1,
                Role::ReadOnlyShm => held[at].readonly_shm -= 1,
                Role::Other => {}
            }
            held[at].leases -= 1;
            if held[at].leases == 0 {
                held.swap_remove(at);
            }
        }
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
    let meta = file.metadata()?;
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
    });
    let last = held.len() - 1;
    Ok(take(&mut held[last]))
}

fn take(entry: &mut Entry) -> Lease {
    entry.leases += 1;
    Lease {
        key: entry.key,
        file: Arc::clone(&entry.file),
        pid: std::process::id(),
        role: Role::Other,
    }
}

/// In a forked child, once the inherited connections are closed: the
/// parent's descriptors are dropped (closing the child's copies drops no
/// lock of the child's), so that the child's own handles start afresh.
/// Leases the child still holds from the parent keep their file open.
pub fn forget_inherited() {
    match HELD.try_lock() {
        Ok(mut held) => held.clear(),
        Err(std::sync::TryLockError::Poisoned(held)) => held.into_inner().clear(),
        // Held by a thread that did not survive the fork: left as it is.
        Err(std::sync::TryLockError::WouldBlock) => {}
    }
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
}
