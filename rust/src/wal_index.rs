//! How far the WAL has come, as SQLite's shared memory (`-shm`) records
//! it, read without SQLite: for a read-only handle, which may not run a
//! checkpoint (that writes the database file) to find out.
//!
//! The `-shm` file starts with the WAL-index header, written twice, and
//! the checkpoint's progress after it, in the layout every SQLite since
//! 3.7.0 shares (sqlite.org/walformat.html, "The WAL-Index Header"): all
//! connections to one WAL must read it alike, whatever their version.
//! Only the header is read, by `pread`, never written, and through a
//! descriptor that is never closed while SQLite may hold locks on the file
//! (see `held_files`).

use std::fs::File;
use std::os::unix::fs::FileExt;

/// One copy of the header; the second follows the first.
const HEADER_BYTES: usize = 48;

/// What is read: both copies, then the checkpoint's count of frames
/// copied back (`nBackfill`).
const READ_BYTES: usize = 2 * HEADER_BYTES + 4;

/// The header's version field (`iVersion`), the same in every SQLite.
const VERSION: u32 = 3_007_000;

/// Where each field is, in the header's native byte order.
const IS_INIT_AT: usize = 12;
const FRAMES_AT: usize = 16;
const COPIED_AT: usize = 2 * HEADER_BYTES;

/// The WAL's frames of committed transactions, and how many of them a
/// checkpoint has copied back into the database file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub frames: u32,
    pub copied: u32,
}

/// The progress the `-shm` open as `shm` records; `None` when it cannot
/// be told: a header not yet written, or one being written right now (its
/// two copies differ until a writer is done).
#[must_use]
pub fn read(shm: &File) -> Option<Progress> {
    let mut bytes = [0u8; READ_BYTES];
    shm.read_exact_at(&mut bytes, 0).ok()?;
    parse(&bytes)
}

fn parse(bytes: &[u8; READ_BYTES]) -> Option<Progress> {
    let (first, second) = bytes[..2 * HEADER_BYTES].split_at(HEADER_BYTES);
    if first != second || bytes[IS_INIT_AT] != 1 || word_at(bytes, 0) != VERSION {
        return None;
    }
    Some(Progress {
        frames: word_at(bytes, FRAMES_AT),
        copied: word_at(bytes, COPIED_AT),
    })
}

fn word_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_ne_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::{read, Progress};
    use rusqlite::Connection;

    /// The header read beside SQLite agrees with SQLite's own checkpoint
    /// answers (the frames in the WAL, then how many are copied back),
    /// also once a write has started the WAL over.
    #[test]
    fn reads_what_sqlite_reports() -> crate::errors::Result<()> {
        let dir = std::env::temp_dir().join(format!("tw-wal-index-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).map_err(crate::errors::Error::from)?;
        let db = dir.join("t.db");
        let writer = Connection::open(&db)?;
        writer.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;
             CREATE TABLE t (v); INSERT INTO t VALUES (1); INSERT INTO t VALUES (2);",
        )?;
        // Held open until the connection is gone: closing it would drop
        // the connection's locks on the file.
        let shm = std::fs::File::open(dir.join("t.db-shm")).map_err(crate::errors::Error::from)?;
        let as_counts = |p: Progress| (i64::from(p.frames), i64::from(p.copied));
        let (frames, copied) = read(&shm).map(as_counts).unwrap_or_default();
        assert!(frames >= 3 && copied == 0, "{frames} {copied}");
        let checkpoint = |conn: &Connection| {
            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
            })
        };
        assert_eq!(checkpoint(&writer)?, (frames, frames));
        assert_eq!(read(&shm).map(as_counts), Some((frames, frames)));
        writer.execute_batch("INSERT INTO t VALUES (3)")?; // starts the WAL over
        let restarted = read(&shm).map(as_counts).unwrap_or_default();
        assert!(restarted.0 < frames && restarted.1 == 0, "{restarted:?}");
        assert_eq!(checkpoint(&writer)?, (restarted.0, restarted.0));
        drop(writer);
        drop(shm);
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }

    /// A header whose two copies differ (a writer in the middle of it), an
    /// uninitialised one or another version tells nothing.
    #[test]
    fn refuses_a_header_it_cannot_trust() {
        let mut bytes = [0u8; super::READ_BYTES];
        bytes[..4].copy_from_slice(&super::VERSION.to_ne_bytes());
        bytes[super::IS_INIT_AT] = 1;
        bytes[super::FRAMES_AT..super::FRAMES_AT + 4].copy_from_slice(&7u32.to_ne_bytes());
        let (first, _) = bytes.split_at(super::HEADER_BYTES);
        let copy = first.to_vec();
        bytes[super::HEADER_BYTES..2 * super::HEADER_BYTES].copy_from_slice(&copy);
        bytes[super::COPIED_AT..super::COPIED_AT + 4].copy_from_slice(&5u32.to_ne_bytes());
        let good = super::parse(&bytes);
        assert_eq!(
            good,
            Some(Progress {
                frames: 7,
                copied: 5
            })
        );
        let mut torn = bytes;
        torn[super::HEADER_BYTES + super::FRAMES_AT] ^= 1;
        assert_eq!(super::parse(&torn), None);
        let mut uninit = bytes;
        uninit[super::IS_INIT_AT] = 0;
        uninit[super::HEADER_BYTES + super::IS_INIT_AT] = 0;
        assert_eq!(super::parse(&uninit), None);
        let mut other = bytes;
        other[0] ^= 1;
        other[super::HEADER_BYTES] ^= 1;
        assert_eq!(super::parse(&other), None);
    }
}
