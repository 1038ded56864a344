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
//! A copy is made only where every connection that may write or cache the
//! file still shares this one's locks and index: only the WAL deleted,
//! and no connection writing a new one yet ([`Loss::WalDeletedAlone`]).

use std::fs::{self, File};
use std::os::unix::fs::MetadataExt;

use crate::fsguard::{self, DbPath, FileKey};

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
    /// The WAL was deleted by hand, alone (SQLite deletes the `-shm` with
    /// it). `copy_first`: no connection has written a WAL at the name
    /// since, so every one that may write still shares this one's locks
    /// and index, and a checkpoint through this connection keeps the
    /// commits it holds. Otherwise a connection that reopened writes there
    /// now, and the shared index describes that file: a checkpoint through
    /// our descriptor would copy whatever ours holds at those offsets.
    WalDeletedAlone { copy_first: bool },
    /// Both are gone or replaced: SQLite itself removed them (another copy
    /// of SQLite in this process closing as the last), or someone did by
    /// hand. Nothing is copied: a process that opened since keeps pages in
    /// a cache that a copy made behind its back would leave stale.
    /// `reopened`: a WAL or `-shm` is at the names again, so another
    /// connection has opened the file since, and may have written it.
    BothRemoved { reopened: bool },
}

/// The `-shm` at the ledger's name now, for comparing later.
#[must_use]
pub fn shm_key(path: &DbPath) -> Option<FileKey> {
    fsguard::key_at(&fsguard::sidecar(path, "-shm"))
}

/// Judges the connection whose WAL is `wal` (our own descriptor on it) and
/// whose `-shm` was `shm` when it opened.
#[must_use]
pub fn judge(path: &DbPath, wal: &File, shm: Option<FileKey>) -> Loss {
    let Ok(held) = wal.metadata() else {
        return Loss::None; // judged again at the next call
    };
    let shm_now = shm_key(path);
    let shm_is_ours = shm.is_some() && shm_now == shm;
    if held.nlink() > 0 {
        return if shm.is_some() && !shm_is_ours {
            Loss::ShmReplaced
        } else {
            Loss::None
        };
    }
    let wal_now = fs::symlink_metadata(fsguard::sidecar(path, "-wal")).ok();
    if !shm_is_ours {
        return Loss::BothRemoved {
            reopened: shm_now.is_some() || wal_now.is_some(),
        };
    }
    // A WAL without a frame is at most its 32-byte header.
    Loss::WalDeletedAlone {
        copy_first: wal_now.is_none_or(|wal| wal.len() <= WAL_HEADER_BYTES),
    }
}

#[cfg(test)]
mod tests {
    use super::{judge, shm_key, Loss};
    use crate::errors::Result;
    use crate::fsguard::{self, DbPath};
    use std::fs::{self, File};
    use std::path::PathBuf;

    fn folder(case: &str) -> PathBuf {
        std::env::temp_dir().join(format!("tw-sidecars-{}-{case}", std::process::id()))
    }

    /// A ledger's name with a WAL and `-shm` beside it, the WAL held open.
    fn ledger(case: &str) -> Result<(DbPath, File)> {
        let dir = folder(case);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let path = fsguard::resolve(&dir.join("ledger.db").to_string_lossy())?;
        fs::write(&path.file, b"")?;
        fs::write(fsguard::sidecar(&path, "-wal"), [0u8; 32])?;
        fs::write(fsguard::sidecar(&path, "-shm"), [0u8; 64])?;
        let wal = File::open(fsguard::sidecar(&path, "-wal"))?;
        Ok((path, wal))
    }

    /// Each deletion is told apart, and a copy is allowed only for a WAL
    /// deleted alone while no new one holds a frame.
    #[test]
    fn judges_what_became_of_the_sidecars() -> Result<()> {
        let (path, wal) = ledger("intact")?;
        let shm = shm_key(&path);
        assert_eq!(judge(&path, &wal, shm), Loss::None);
        fs::remove_file(fsguard::sidecar(&path, "-shm"))?;
        assert_eq!(judge(&path, &wal, shm), Loss::ShmReplaced);

        let (path, wal) = ledger("wal-alone")?;
        let shm = shm_key(&path);
        fs::remove_file(fsguard::sidecar(&path, "-wal"))?;
        assert_eq!(
            judge(&path, &wal, shm),
            Loss::WalDeletedAlone { copy_first: true }
        );
        fs::write(fsguard::sidecar(&path, "-wal"), [0u8; 32])?; // a header alone
        assert_eq!(
            judge(&path, &wal, shm),
            Loss::WalDeletedAlone { copy_first: true }
        );
        fs::write(fsguard::sidecar(&path, "-wal"), [0u8; 32 + 24 + 2048])?;
        assert_eq!(
            judge(&path, &wal, shm),
            Loss::WalDeletedAlone { copy_first: false }
        );

        let (path, wal) = ledger("both")?;
        let shm = shm_key(&path);
        fs::remove_file(fsguard::sidecar(&path, "-wal"))?;
        fs::remove_file(fsguard::sidecar(&path, "-shm"))?;
        assert_eq!(
            judge(&path, &wal, shm),
            Loss::BothRemoved { reopened: false }
        );
        fs::write(fsguard::sidecar(&path, "-wal"), b"")?; // a newcomer's
        assert_eq!(
            judge(&path, &wal, shm),
            Loss::BothRemoved { reopened: true }
        );

        for case in ["intact", "wal-alone", "both"] {
            fs::remove_dir_all(folder(case))?;
        }
        Ok(())
    }
}
