//! What a writable open does with the schema it finds: judge it before
//! touching anything, switch the file to WAL, then create the schema, or
//! migrate a task-state-guard file, or upgrade an earlier layout.

use rusqlite::TransactionBehavior;

use super::bulk::{bulk_in_memory, MIGRATION_CACHE_KIB};
use super::{FileChanges, Size, Store, CACHE_KIB};
use crate::doctor;
use crate::errors::{Error, Result};
use crate::fsguard;
use crate::layout_upgrade;
use crate::schema::{self, DamagedRows, Earlier, Found, LayoutUpgrade};

/// A writable open told not to migrate met a file of an earlier schema.
fn not_migrated(earlier: Earlier) -> Error {
    Error::Conflict(match earlier {
        Earlier::Peer(_) => {
            "the ledger is a task-state-guard file, and this open may not migrate it"
        }
        Earlier::Layout(_) => {
            "the ledger is in an earlier taskwarden layout, and this open may not upgrade it"
        }
    })
}

/// Which peer files a migration takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Gate {
    /// Anything doctor would flag stays the peer's, untouched: the file
    /// itself is rewritten, or a read-only handle's private copy of it.
    DoctorClean,
    /// A refused file's private copy is migrated for doctor to read,
    /// carrying the rows the peer itself would not migrate.
    CarryDamaged,
}

impl Store {
    /// Judges the file before changing anything about it: a file that is
    /// not a ledger, or a peer file that fails migration, keeps every byte
    /// (even its journal mode). Only then is it switched to WAL, and a new
    /// file given its schema, if this open may create one: an existing
    /// file that holds no ledger yet (empty, another program's empty
    /// database) is no more a ledger to a reading command than a missing
    /// one.
    pub(super) fn judge_then_prepare(&mut self, may: FileChanges) -> Result<()> {
        let found = self.read(|tx| schema::inspect(tx))?;
        if matches!(found, Found::Empty) && !may.create {
            return Err(fsguard::NO_LEDGER_YET);
        }
        if let Found::Earlier(earlier) = found {
            if !may.migrate {
                return Err(not_migrated(earlier));
            }
        }
        // WAL first, so a file left in rollback-journal mode migrates as
        // any other does (inside the WAL).
        self.ensure_wal()?;
        if matches!(found, Found::Earlier(_)) {
            self.migrate_and_compact()?;
        }
        match found {
            Found::Empty => self.settle_schema(),
            Found::Earlier(_) | Found::Current => Ok(()),
        }
    }

    /// Switching to WAL needs the write lock, so it is only asked for when
    /// the file is not in WAL mode yet.
    pub(super) fn ensure_wal(&mut self) -> Result<()> {
        let mode: String = self
            .conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))?;
        if mode.eq_ignore_ascii_case("wal") {
            return Ok(());
        }
        let mode: String = self
            .conn
            .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Conflict("database configuration failed"));
        }
        // The switch leaves the `-wal` file to the next transaction, and
        // the open holds that file from here on (a file left in rollback
        // mode by another tool had none yet): one read creates it.
        self.read(|tx| Ok(tx.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))?))
    }

    /// Gives a new file its schema, judged again under the write lock:
    /// another process opening the same file may have been first.
    pub(super) fn settle_schema(&mut self) -> Result<()> {
        self.write(|tx| match schema::inspect(tx)? {
            Found::Empty => schema::create(tx),
            Found::Current => Ok(()),
            Found::Earlier(_) => Err(Error::Conflict("schema changed while opening")),
        })
    }

    fn migrate_and_compact(&mut self) -> Result<()> {
        if !self.migrate(Gate::DoctorClean)? {
            return Ok(());
        }
        // The old tables' pages are free now; give them back so the file
        // holds no more pages than a fresh v3 ledger of the same tasks (and
        // stays under the read-only snapshot cap longer). Only an
        // optimisation: a busy reader simply postpones it (but a Ctrl-C
        // during its wait is the caller's).
        let vacuumed = self.conn.execute_batch("VACUUM");
        match vacuumed.map_err(|e| self.interruption.explain(e.into())) {
            Err(interrupted @ Error::Interrupted(_)) => Err(interrupted),
            _ => Ok(()),
        }
    }

    /// Brings the file to the current schema; whether its tables were
    /// rebuilt (and so left pages free).
    pub(super) fn migrate(&mut self, gate: Gate) -> Result<bool> {
        // Foreign keys cannot be switched inside a transaction, and the
        // table rebuild must not cascade; they are checked before commit.
        self.conn.pragma_update(None, "foreign_keys", false)?;
        // The rebuild touches every page of the file once: a small file's
        // rebuild gets a larger cache, given back afterwards.
        if bulk_in_memory(self.file_len()) {
            self.conn
                .pragma_update(None, "cache_size", MIGRATION_CACHE_KIB)?;
        }
        let outcome = self.transaction(TransactionBehavior::Immediate, Size::Large, |tx| {
            match schema::inspect(tx)? {
                // An earlier layout is taskwarden's own: its rows are
                // carried as they are, for doctor to judge as before.
                Found::Earlier(Earlier::Layout(upgrade)) => {
                    layout_upgrade::migrate(tx, upgrade)?;
                    Ok(upgrade == LayoutUpgrade::Rebuild)
                }
                Found::Earlier(Earlier::Peer(_)) => match gate {
                    Gate::CarryDamaged => {
                        schema::migrate_peer(tx, DamagedRows::Carry).map(|()| true)
                    }
                    Gate::DoctorClean => {
                        schema::migrate_peer(tx, DamagedRows::Refuse)?;
                        // Before commit, every check doctor makes: a peer file
                        // with rows taskwarden would never write (free text, a
                        // bad id, a broken invariant) stays the peer's.
                        if doctor::check(tx).logically_sound() {
                            Ok(true)
                        } else {
                            Err(Error::Conflict("legacy database failed validation"))
                        }
                    }
                },
                Found::Current => Ok(false),
                Found::Empty => Err(Error::Conflict("schema changed while opening")),
            }
        });
        self.conn.pragma_update(None, "foreign_keys", true)?;
        self.conn.pragma_update(None, "cache_size", CACHE_KIB)?;
        outcome
    }
}
