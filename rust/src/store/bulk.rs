//! Large rewrites (reconcile, migration): their page cache, statement
//! journals and foreign key checks, set for the transaction and restored
//! afterwards.

use rusqlite::Transaction;

use super::{Size, Store, CACHE_KIB};
use crate::errors::Result;

/// Page cache while a migration rebuilds a small file (see
/// [`IN_MEMORY_BULK_MAX_FILE_BYTES`]). It writes each new page once, in
/// order, so pages spilled to the WAL before the commit are not touched
/// again. At 100,000 tasks it was 4% faster than the everyday cache, for
/// 109 MiB at its peak against 30. At a million tasks (a 394 MB peer
/// file) 1 GiB once made it no faster than this and more than doubled its
/// peak (497 to 1,152 MiB), and the everyday cache made it 6% faster
/// (19.6-20.2 s against 21.0-21.5 s) at 145 MiB against 406.
pub(super) const MIGRATION_CACHE_KIB: i64 = -262_144;

/// Page cache while reconcile rewrites rows all over a small file (see
/// [`IN_MEMORY_BULK_MAX_FILE_BYTES`]): large enough that no page it
/// changes is spilled to the WAL before the commit and then written again.
/// A cache limit, not an allocation: the apply takes only the pages it
/// touches.
const REWRITE_CACHE_KIB: i64 = -1_048_576;

/// Up to this file size, a bulk rewrite keeps its work in memory: its
/// changed pages (see [`REWRITE_CACHE_KIB`], and [`MIGRATION_CACHE_KIB`]
/// for a migration) and, in reconcile, its statement journals.
/// Each of its multi-row statements that calls an SQL function first
/// copies every page it changes to such a journal (SQLite must be able to
/// undo a statement whose function fails halfway; reconcile's row updates
/// are written to need none). At 100,000 tasks (a 59 MB file) that was
/// 54 MB in 27,492 writes to a temporary file; in memory the apply spent
/// about 40 ms less in the kernel (5% of its time) for 15 MiB more at its
/// peak, and with the everyday cache it wrote spilled pages twice and took
/// about 10% longer. Past this size memory costs more than it saves: every
/// page a process takes fresh from the kernel is zeroed first, and at a
/// million tasks (a 450 MB file, 600,000 rows changed) the large cache
/// grew the apply's peak from 24 to 344 MiB and made it 10-20% slower,
/// spills and all (3.2-3.4 s against 3.7-4.5 s, interleaved runs); an
/// in-memory journal doubled the peak and gained nothing.
const IN_MEMORY_BULK_MAX_FILE_BYTES: u64 = 128 * 1024 * 1024;

/// Whether a bulk rewrite of a file `file_len` long (unknown: an in-memory
/// ledger, or metadata that could not be read) keeps its work in memory.
pub(super) fn bulk_in_memory(file_len: Option<u64>) -> bool {
    file_len.is_some_and(|len| len <= IN_MEMORY_BULK_MAX_FILE_BYTES)
}

impl Store {
    /// Like [`Store::write`], for one large rewrite (reconcile): for a file
    /// of up to [`IN_MEMORY_BULK_MAX_FILE_BYTES`] the page cache is raised
    /// for the transaction and statement journals stay in memory, and the
    /// WAL is synced while the commit writes it. It takes no turn:
    /// turns pay off for short writes that change hands often, and a
    /// rewrite that holds the lock for seconds gains nothing from a queue;
    /// writers meeting it wait in the busy handler, as for any holder.
    ///
    /// Foreign keys are not checked inside, so `op` must not be able to
    /// break a reference. Reconcile cannot: it writes events for the very
    /// rows its statements read, and changes no id or parent. Checked, each
    /// event cost a search of the tasks' id index: about 7% of a
    /// 100,000-task apply.
    pub fn bulk_write<T>(&mut self, op: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let out = self
            .enter_bulk_settings()
            .and_then(|()| self.write_sized(Size::Large, op));
        let restored = self.restore_everyday_settings();
        let out = out?;
        restored?;
        Ok(out)
    }

    /// The length of the file behind the handle, if it has one and it can
    /// be read.
    pub(super) fn file_len(&self) -> Option<u64> {
        let lease = self.file_lease.as_ref()?;
        lease.file().metadata().ok().map(|m| m.len())
    }

    /// The settings of [`Store::bulk_write`], all outside its transaction:
    /// SQLite reads `temp_store` when a transaction begins and ignores
    /// `foreign_keys` inside one.
    fn enter_bulk_settings(&self) -> Result<()> {
        if bulk_in_memory(self.file_len()) {
            self.conn
                .pragma_update(None, "cache_size", REWRITE_CACHE_KIB)?;
            self.conn.pragma_update(None, "temp_store", "MEMORY")?;
        }
        self.conn.pragma_update(None, "foreign_keys", false)?;
        Ok(())
    }

    /// Back to every handle's settings after a bulk write, whether it
    /// succeeded, failed or never began: each one is tried, whatever the
    /// others do.
    fn restore_everyday_settings(&self) -> Result<()> {
        let restored: rusqlite::Result<()> = [
            self.conn.pragma_update(None, "foreign_keys", true),
            self.conn.pragma_update(None, "cache_size", CACHE_KIB),
            self.conn.pragma_update(None, "temp_store", "DEFAULT"),
        ]
        .into_iter()
        .collect();
        Ok(restored?)
    }
}

#[cfg(test)]
mod tests {
    use super::{IN_MEMORY_BULK_MAX_FILE_BYTES, REWRITE_CACHE_KIB};
    use crate::errors::{Error, Result};
    use crate::store::{Durability, FileChanges, OpenOptions, Store, CACHE_KIB};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// `temp_store`, `cache_size` and `foreign_keys` as a connection sees
    /// them.
    fn settings(conn: &rusqlite::Connection) -> Result<(i64, i64, bool)> {
        let temp_store = conn.query_row("PRAGMA temp_store", [], |r| r.get(0))?;
        let cache_size = conn.query_row("PRAGMA cache_size", [], |r| r.get(0))?;
        let foreign_keys = conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
        Ok((temp_store, cache_size, foreign_keys))
    }

    /// A small file's bulk write journals in memory (the setting is read
    /// when its transaction begins) with the rewrite's larger page cache
    /// and no foreign key checks, and the handle is back to its everyday
    /// settings afterwards, whether the write succeeded or failed. Past
    /// the bound, only the foreign key checks are off.
    #[test]
    fn a_bulk_write_works_in_memory_up_to_the_bound_then_restores() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("tw-bulk-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let opts = OpenOptions {
            busy_timeout_ms: 1000,
            durability: Durability::Normal,
            read_only: false,
            snapshot_max_bytes: 1 << 20,
            euid: std::fs::metadata(&dir)?.uid(),
            may: FileChanges {
                create: true,
                migrate: true,
            },
        };
        let path = dir.join("bulk.db");
        let mut store = Store::open(&path.to_string_lossy(), &opts)?;
        let everyday = (0, CACHE_KIB, true); // temp_store DEFAULT
        assert_eq!(settings(&store.conn)?, everyday);
        let inside = store.bulk_write(|tx| settings(tx))?;
        assert_eq!(
            inside,
            (2, REWRITE_CACHE_KIB, false),
            "MEMORY, no foreign keys inside the bulk write"
        );
        assert_eq!(settings(&store.conn)?, everyday, "restored after it");
        let failed: Result<()> = store.bulk_write(|_| Err(Error::Conflict("refused")));
        assert!(failed.is_err());
        assert_eq!(
            settings(&store.conn)?,
            everyday,
            "restored after a failed one too"
        );
        // A sparse tail past the bound: SQLite reads the size its header
        // gives, and the rewrite judges by the file's length.
        let file = std::fs::OpenOptions::new().write(true).open(&path)?;
        file.set_len(IN_MEMORY_BULK_MAX_FILE_BYTES)?;
        let at_bound = store.bulk_write(|tx| settings(tx))?;
        assert_eq!(at_bound, (2, REWRITE_CACHE_KIB, false), "the bound itself");
        file.set_len(IN_MEMORY_BULK_MAX_FILE_BYTES + 1)?;
        let past = store.bulk_write(|tx| settings(tx))?;
        assert_eq!(
            past,
            (0, CACHE_KIB, false),
            "a temporary file, everyday cache"
        );
        assert_eq!(settings(&store.conn)?, everyday);
        drop(store);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }
}
