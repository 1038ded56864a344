//! The one error type of the core, and its single mapping to Python exceptions.
//!
//! Every message is a fixed string: no id, path, hash or caller value ever
//! reaches a message (SPEC §2.4), so errors can be logged without leaking.

use std::fmt;

use pyo3::PyErr;

/// What [`Error::Corrupt`] says, wherever it is said.
pub const CORRUPT_TEXT: &str = "database file is corrupt or not a ledger";

/// Everything that can go wrong inside the core.
#[derive(Debug)]
pub enum Error {
    /// The caller passed a bad value; nothing was written.
    Invalid(&'static str),
    /// The named argument breaks the rule: "limit", "must be ...".
    InvalidArgument(&'static str, &'static str),
    /// The task (or the parent named at creation) does not exist.
    NotFound,
    /// The stored state does not allow the operation.
    Conflict(&'static str),
    /// A write made for a claim (`worker=` or `attempt=` given) found the
    /// claim over: the task was released, requeued, claimed again, parked
    /// or ended by someone else. The worker should stop working on it.
    ClaimLost(&'static str),
    /// Another connection held the write lock past `busy_timeout_ms`.
    Busy,
    /// The storage refused a write for lack of space.
    Full,
    /// The file is not a usable ledger (corrupt, not a database).
    Corrupt,
    /// Any other storage failure: reported without SQLite's text.
    Storage(&'static str),
    /// A bug or an impossible state: CLI exit 3.
    Internal(&'static str),
    /// Python code the call ran for the caller (its clock, a value's
    /// conversion) raised what is not a bad value's error (see
    /// `convert::clock_failed`). Its own exception reaches the caller, as
    /// from any Python callable: a `KeyboardInterrupt` stays one, a retry
    /// loop never mistakes it for bad input. Nothing was written.
    Raised(PyErr),
    /// A signal handler raised while the call waited for the write lock
    /// (Ctrl-C): its exception reaches the caller. Nothing was written.
    Interrupted(PyErr),
}

/// The `Result` of the core.
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Invalid(msg)
            | Error::Conflict(msg)
            | Error::ClaimLost(msg)
            | Error::Internal(msg) => f.write_str(msg),
            Error::InvalidArgument(name, rule) => write!(f, "{name} {rule}"),
            Error::Storage(msg) => write!(f, "storage failure: {msg}"),
            Error::NotFound => f.write_str("task does not exist"),
            Error::Busy => f.write_str("ledger is busy: write lock not acquired in time"),
            Error::Full => f.write_str("storage is full: nothing was written"),
            Error::Corrupt => f.write_str(CORRUPT_TEXT),
            Error::Raised(err) => write!(f, "the caller's code raised {err}"),
            Error::Interrupted(err) => write!(f, "the lock wait was interrupted by {err}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<rusqlite::Error> for Error {
    fn from(err: rusqlite::Error) -> Self {
        use rusqlite::ffi::ErrorCode;
        match err.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => Error::Busy,
            Some(ErrorCode::DiskFull) => Error::Full,
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => Error::Corrupt,
            // SQLite cannot make the WAL or journal beside the file: not
            // the handle's mode, the directory's.
            Some(ErrorCode::ReadOnly)
                if matches!(&err, rusqlite::Error::SqliteFailure(e, _)
                    if e.extended_code == rusqlite::ffi::SQLITE_READONLY_DIRECTORY) =>
            {
                Error::Conflict("the ledger's directory is not writable")
            }
            Some(ErrorCode::ReadOnly) => Error::Conflict("ledger is read-only"),
            Some(ErrorCode::ConstraintViolation) => {
                Error::Conflict("stored task metadata failed validation")
            }
            Some(ErrorCode::SystemIoFailure) => Error::Storage("i/o error"),
            Some(ErrorCode::CannotOpen) => Error::Conflict("database connection failed"),
            Some(ErrorCode::OutOfMemory) => Error::Storage("out of memory"),
            Some(ErrorCode::OperationInterrupted) => Error::Storage("operation interrupted"),
            Some(_) => Error::Storage("database operation failed"),
            // A stored value of the wrong type or invalid text is damage in
            // the file, not a bug here: a clean conflict, never exit 3.
            None => match err {
                rusqlite::Error::FromSqlConversionFailure(..)
                | rusqlite::Error::InvalidColumnType(..)
                | rusqlite::Error::IntegralValueOutOfRange(..)
                | rusqlite::Error::Utf8Error(..) => Error::Corrupt,
                _ => Error::Internal("internal storage error"),
            },
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(err: std::io::Error) -> Self {
        match err.kind() {
            std::io::ErrorKind::StorageFull => Error::Full,
            std::io::ErrorKind::PermissionDenied => {
                Error::Invalid("database path is not accessible")
            }
            // A `:ro` volume or a read-only root: a refusal of the file's
            // place, like its mode's, which a read-only open gets past (the
            // CLI's reading commands fall back to one).
            std::io::ErrorKind::ReadOnlyFilesystem => Error::Conflict(
                "the ledger's file system is read-only: only a read-only open can use it",
            ),
            _ => Error::Storage("file system operation failed"),
        }
    }
}

mod py {
    pyo3::import_exception!(taskwarden.errors, LedgerError);
    pyo3::import_exception!(taskwarden.errors, InvalidInput);
    pyo3::import_exception!(taskwarden.errors, TaskNotFound);
    pyo3::import_exception!(taskwarden.errors, StateConflict);
    pyo3::import_exception!(taskwarden.errors, LedgerBusy);
    pyo3::import_exception!(taskwarden.errors, ClaimLost);
}

impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        match err {
            Error::Raised(raised) | Error::Interrupted(raised) => raised,
            e @ (Error::Invalid(_) | Error::InvalidArgument(..)) => {
                py::InvalidInput::new_err(e.to_string())
            }
            e @ Error::NotFound => py::TaskNotFound::new_err(e.to_string()),
            e @ (Error::Conflict(_) | Error::Corrupt) => py::StateConflict::new_err(e.to_string()),
            e @ Error::Busy => py::LedgerBusy::new_err(e.to_string()),
            e @ Error::ClaimLost(_) => py::ClaimLost::new_err(e.to_string()),
            e @ (Error::Full | Error::Storage(_)) => py::LedgerError::new_err(e.to_string()),
            e @ Error::Internal(_) => pyo3::exceptions::PyRuntimeError::new_err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_and_locked_map_to_busy() {
        for code in [rusqlite::ffi::SQLITE_BUSY, rusqlite::ffi::SQLITE_LOCKED] {
            let err = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
            assert!(matches!(Error::from(err), Error::Busy));
        }
    }

    #[test]
    fn full_disk_maps_to_full() {
        let err = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("secret detail".into()),
        );
        let mapped = Error::from(err);
        assert!(matches!(mapped, Error::Full));
        assert!(!mapped.to_string().contains("secret"));
    }

    /// A WAL or journal SQLite could not create beside the file names the
    /// directory; any other read-only refusal names the handle.
    #[test]
    fn a_read_only_directory_is_named() {
        let refusal = |code| {
            let err = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
            Error::from(err).to_string()
        };
        assert_eq!(
            refusal(rusqlite::ffi::SQLITE_READONLY_DIRECTORY),
            "the ledger's directory is not writable"
        );
        assert_eq!(
            refusal(rusqlite::ffi::SQLITE_READONLY),
            "ledger is read-only"
        );
    }
}
