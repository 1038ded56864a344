//! Sidecars taken from under a live connection.
//!
//! SQLite deletes a WAL and its `-shm` when its last connection closes,
//! and judges "last" by the POSIX locks of the process. Another copy of
//! SQLite in this process (Python's `sqlite3`, say) closing its connection
//! to the ledger therefore takes itself for the last one: it checkpoints
//! everything committed into the database file, then unlinks both files
//! under this connection.
//!
//! People delete them too: a clean-up of "stale lock files" while workers
//! run. A deleted `-shm` takes the WAL's locks and index with it: the next
//! process to open the ledger makes a new one and no longer sees this
//! connection's locks, so the two claimed the same tasks and wrote over
//! each other's frames. A deleted WAL takes the commits not yet
//! checkpointed: every other connection lost them, and this one did too
//! once it closed.
//!
//! This module judges, from the files alone, which of these happened and
//! whether this connection's commits may still be copied into the database
//! file; the store acts on it (`Store::replace_connection_if_sidecars_lost`).

use std::fs::File;
use std::os::unix::fs::MetadataExt;

use crate::fsguard::{self, DbPath};

/// A file's device and inode.
pub type Key = (u64, u64);

/// A WAL's header; its frames follow.
const WAL_HEADER_BYTES: u64 = 32;

/// What became of the sidecars this connection uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Both are still the files at their names.
    None,
    /// The WAL is still there, but the `-shm` at its name is another file
    /// or none: other connections no longer see this one's locks.
    ShmReplaced,
    /// The WAL has no name left. `copy_first`: this connection's WAL may
    /// hold commits the database file lacks, and nobody else has written
    /// the ledger since, so a checkpoint through this connection keeps
    /// them. Without it the copy is skipped: someone has written since,
    /// and older pages copied over theirs would damage the file. (When
    /// SQLite itself removed the WAL, it copied it all first; a copy then
    /// finds nothing to do.)
    WalUnlinked { copy_first: bool },
}

/// The `-shm` at the ledger's name now, for comparing later.
#[must_use]
pub fn shm_key(path: &DbPath) -> Option<Key> {
    fsguard::key_at(&fsguard::sidecar(path, "-shm"))
}

/// Judges the connection whose WAL is `wal` (our own descriptor on it) and
/// whose `-shm` was `shm` when it opened.
#[must_use]
pub fn judge(path: &DbPath, wal: &File, shm: Option<Key>) -> Loss {
    let Ok(held) = wal.metadata() else {
        return Loss::None; // judged again at the next call
    };
    let shm_now = shm_key(path);
    if held.nlink() > 0 {
        return if shm.is_some() && shm_now != shm {
            Loss::ShmReplaced
        } else {
            Loss::None
        };
    }
    // SQLite unlinks the `-shm` with the WAL. With ours still in place the
    // WAL was deleted alone, by hand, and every connection that may write
    // the file still shares our locks: copying is coordinated by them.
    if shm.is_some() && shm_now == shm {
        return Loss::WalUnlinked { copy_first: true };
    }
    // Both gone. Copying is safe only if no connection has written the
    // file since: none has committed to a WAL made anew (a WAL without a
    // frame is at most its 32-byte header), and the database file was last
    // written before ours lost its name (the unlink stamped its change
    // time). Other processes that opened meanwhile read the file alone.
    let no_new_frames = std::fs::symlink_metadata(fsguard::sidecar(path, "-wal"))
        .map_or(true, |wal| wal.len() <= WAL_HEADER_BYTES);
    let nobody_since = no_new_frames
        && std::fs::metadata(&path.file)
            .is_ok_and(|db| (db.mtime(), db.mtime_nsec()) < (held.ctime(), held.ctime_nsec()));
    Loss::WalUnlinked {
        copy_first: nobody_since,
    }
}
