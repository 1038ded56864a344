//! A handle whose `-wal` or `-shm` was deleted or replaced under it (see
//! `sidecar_loss` for how): its connection is replaced before the next
//! call, or refused, and never closes as a last connection would.

use rusqlite::config::DbConfig;
use rusqlite::Connection;

use super::{open_writable, Backing, Store};
use crate::errors::{Error, Result};
use crate::fsguard;
use crate::held_files::Lease;
use crate::sidecar_loss::{self, Loss};
use crate::wal_flush;
use crate::wal_growth;

/// Why every handle of a process refuses calls after the ledger's `-shm`
/// was deleted, until one alone is left to open again.
const SHM_LOST_UNDER_OTHER_HANDLES: &str = "the ledger's -shm was deleted while open (by hand, \
     or by another SQLite library in this process closing its connection), and other handles in \
     this process still use it: close every handle on this ledger here, then open it again";

impl Drop for Store {
    /// A connection whose `-shm` was replaced, or whose WAL was deleted
    /// while another connection now writes a new one, must not close as
    /// SQLite's last one would: that copies a stale WAL over the file
    /// through an index that describes another, and deletes the WAL at
    /// the name. A WAL deleted alone, with no new one written, is copied
    /// in first, without waiting for readers (a close must not hang; those
    /// readers copy it at their own next call); the close then runs as
    /// usual, and as the last one it removes the sidecars left behind.
    /// With both sidecars removed and none back at the names it runs as
    /// usual too: SQLite copies our WAL only as the file's last connection,
    /// and no connection has opened since. A handle already closing without
    /// a checkpoint (a forked child's) is left alone.
    fn drop(&mut self) {
        let closing_plainly = self
            .conn
            .db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE)
            .unwrap_or(true);
        if closing_plainly {
            return;
        }
        let close_as_usual = match self.sidecar_loss() {
            // A connection that opened since the deletion may have written
            // the file and left a WAL at the name: as the last connection,
            // SQLite would copy our older pages over its and delete that WAL.
            Loss::None | Loss::BothRemoved { reopened: false } => true,
            Loss::WalDeletedAlone { copy_first: true } => self.copy_lost_wal("PASSIVE").is_ok(),
            Loss::ShmReplaced
            | Loss::WalDeletedAlone { copy_first: false }
            | Loss::BothRemoved { reopened: true } => false,
        };
        if !close_as_usual {
            let _ = self
                .conn
                .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true);
        }
    }
}

impl Store {
    /// What became of the sidecars this connection uses (`sidecar_loss`).
    pub(super) fn sidecar_loss(&self) -> Loss {
        match (&self.backing, &self.wal) {
            (Backing::File { path, .. }, Some(wal)) => {
                sidecar_loss::judge(path, wal.wal(), self.shm)
            }
            _ => Loss::None,
        }
    }

    /// Before a call (once the directory shows a change): if our WAL has
    /// no name left, or the `-shm` at its name is not the one we opened,
    /// the connection is replaced (see `sidecar_loss` for how either
    /// happens). A WAL deleted by hand alone, with no new one written, is
    /// first copied into the database file through the old connection,
    /// which then closes without a last connection's checkpoint and WAL
    /// removal (its views are stale, and a WAL at the name now is
    /// another's) before the new one opens, as closing releases the
    /// process's locks on the file.
    pub(super) fn replace_connection_if_sidecars_lost(&mut self) -> Result<()> {
        let loss = self.sidecar_loss();
        let Backing::File { path, .. } = &self.backing else {
            return Ok(());
        };
        if loss == Loss::None {
            return Ok(());
        }
        // SQLite maps a file's `-shm` once per process: while another
        // handle here keeps the deleted one mapped, a new connection would
        // map it again, and go on unseen by other processes.
        let shm_lost = matches!(loss, Loss::ShmReplaced | Loss::BothRemoved { .. });
        if shm_lost && self.file_lease.as_ref().is_some_and(Lease::shared) {
            return Err(Error::Conflict(SHM_LOST_UNDER_OTHER_HANDLES));
        }
        let path = path.clone();
        if loss == (Loss::WalDeletedAlone { copy_first: true }) {
            // Waits for readers (RESTART), so that the next writer starts
            // the WAL at the name afresh, with a header, instead of adding
            // frames after ones that file lacks; until they let go the
            // call is busy, and the copy is tried again at the next.
            self.copy_lost_wal("RESTART")
                .map_err(|e| self.interruption.explain(e))?;
        }
        self.conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        let stale = std::mem::replace(&mut self.conn, Connection::open_in_memory()?);
        stale.close().map_err(|(_, e)| Error::from(e))?;
        self.conn = open_writable(&path)?;
        self.configure()?;
        self.ensure_wal()?;
        fsguard::secure_sidecars(&path, true)?;
        self.wal = Some(wal_flush::Pacer::new(fsguard::open_wal(&path)?));
        self.shm = sidecar_loss::shm_key(&path);
        self.refuse_unless_the_process_maps_this_shm()
    }

    /// A handle opened beside others of its process gets SQLite's one
    /// mapping of the file's `-shm` in the process: after that file was
    /// deleted, the old one, whatever is at the name now. It would go on
    /// unseen by other processes (a review had 25 of 25 tasks claimed
    /// twice), so it is refused while the others keep it.
    pub(super) fn refuse_unless_the_process_maps_this_shm(&self) -> Result<()> {
        match &self.file_lease {
            Some(lease) if !lease.maps_shm(self.shm) => {
                Err(Error::Conflict(SHM_LOST_UNDER_OTHER_HANDLES))
            }
            _ => Ok(()),
        }
    }

    /// Copies every commit of a WAL deleted by hand into the database file
    /// (a checkpoint in `mode`), so they outlive it: `Busy` when readers
    /// kept some from being copied.
    fn copy_lost_wal(&mut self, mode: &str) -> Result<()> {
        let (busy, frames, copied) = wal_growth::wal_checkpoint(&self.conn, mode)?;
        if busy || copied < frames {
            return Err(Error::Busy);
        }
        Ok(())
    }
}
