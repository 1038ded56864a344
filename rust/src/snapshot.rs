//! The read-only snapshot of a cleanly closed ledger (SPEC §5).
//!
//! The file is read twice; identity, size, times and SHA-256 must agree, so
//! a writer that appears in between is caught. The second pass streams
//! straight into SQLite's own buffer: memory is one copy of the file. The
//! source file is never opened by SQLite, so nothing on disk can change.
//! Each pass hashes on a helper thread while it reads: hashing and reading
//! were each about a third of a snapshot, and a ledger host has two cores.

use std::fs::{File, Metadata};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use rusqlite::{Connection, MAIN_DB};
use sha2::{Digest, Sha256};

use crate::errors::{Error, Result};
use crate::fsguard::{self, DbPath, Identity, Sidecars};
use crate::held_files::{self, Lease};

/// The default cap: the peer's 64 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

const CHUNK: usize = 1 << 20;
/// Why a snapshot was refused when a writer opened the file as it began
/// (the peer's words).
pub const NOT_CLOSED_TEXT: &str = "read-only snapshot requires a closed WAL database";
/// Why a snapshot was refused when a writer changed the file between its reads.
pub const CHANGED_TEXT: &str = "database changed during read-only snapshot";
const CHANGED: Error = Error::Conflict(CHANGED_TEXT);

/// Everything about the file that a writer would disturb.
#[derive(Debug, PartialEq, Eq)]
struct Signature {
    dev: u64,
    ino: u64,
    nlink: u64,
    mode: u32,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Signature {
    fn of(meta: &Metadata) -> Signature {
        Signature {
            dev: meta.dev(),
            ino: meta.ino(),
            nlink: meta.nlink(),
            mode: meta.mode(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// SHA-256 computed on a helper thread: `update` hands it a copy of the
/// bytes (from a small pool of buffers), so the caller reads on meanwhile.
struct BackgroundSha256 {
    chunks: Option<SyncSender<Vec<u8>>>,
    spare: Receiver<Vec<u8>>,
    worker: Option<JoinHandle<Vec<u8>>>,
}

impl BackgroundSha256 {
    fn new() -> Result<BackgroundSha256> {
        let (chunks, todo) = sync_channel::<Vec<u8>>(2);
        let (give_back, spare) = sync_channel::<Vec<u8>>(4);
        let worker = std::thread::Builder::new()
            .name("taskwarden-snapshot-hash".into())
            .spawn(move || {
                let mut hasher = Sha256::new();
                for chunk in todo {
                    hasher.update(&chunk);
                    give_back.try_send(chunk).ok();
                }
                hasher.finalize().to_vec()
            })
            .map_err(|_| Error::Conflict("snapshot cannot be read safely"))?;
        Ok(BackgroundSha256 {
            chunks: Some(chunks),
            spare,
            worker: Some(worker),
        })
    }

    fn update(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let mut chunk = self.spare.try_recv().unwrap_or_default();
        chunk.clear();
        chunk.extend_from_slice(bytes);
        self.chunks
            .as_ref()
            .and_then(|c| c.send(chunk).ok())
            .ok_or_else(|| std::io::Error::other("snapshot hasher stopped"))
    }

    /// The digest of everything given to `update`, in order.
    fn finalize(mut self) -> Result<Vec<u8>> {
        drop(self.chunks.take());
        self.worker
            .take()
            .and_then(|w| w.join().ok())
            .ok_or(Error::Conflict("snapshot cannot be read safely"))
    }
}

/// A reader that hashes what it reads and, in the bytes it hands on, sets
/// the WAL header bytes 18-19 to 1: SQLite cannot load a WAL-mode image
/// into memory, and the hash must cover the bytes as they are on disk.
struct HashingReader {
    /// The process's shared descriptor (never one of our own, whose close
    /// would drop SQLite's locks): read at explicit offsets.
    file: Lease,
    hasher: BackgroundSha256,
    offset: u64,
    patch_header: bool,
    header: [u8; 20],
}

impl HashingReader {
    fn new(file: Lease, patch_header: bool) -> Result<HashingReader> {
        Ok(HashingReader {
            file,
            hasher: BackgroundSha256::new()?,
            offset: 0,
            patch_header,
            header: [0; 20],
        })
    }
}

impl Read for HashingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // At most a chunk at a time, even into SQLite's whole-file buffer,
        // so the helper thread hashes one chunk while the next is read.
        let len = buf.len().min(CHUNK);
        let n = self.file.file().read_at(&mut buf[..len], self.offset)?;
        self.hasher.update(&buf[..n])?;
        for (i, byte) in buf[..n].iter().enumerate() {
            let at = self.offset + i as u64;
            if at >= 20 {
                break;
            }
            self.header[at as usize] = *byte;
        }
        if self.patch_header {
            as_rollback_journal(&mut buf[..n], self.offset);
        }
        self.offset += n as u64;
        Ok(n)
    }
}

/// One pass read to its end; its digest may still be being computed.
struct Pass {
    signature: Signature,
    digest: BackgroundSha256,
    header: [u8; 20],
}

fn open_checked(path: &DbPath, identity: Identity, max_bytes: u64) -> Result<(Lease, Metadata)> {
    fsguard::verify_identity(path, identity)?;
    if fsguard::sidecar_state(path) != Sidecars::Closed {
        return Err(Error::Conflict(NOT_CLOSED_TEXT));
    }
    let file = held_files::lease(Some((identity.dev, identity.ino)), || {
        File::open(&path.file)
    })
    .map_err(|_| Error::Conflict("snapshot cannot be read safely"))?;
    let meta = file
        .file()
        .metadata()
        .map_err(|_| Error::Conflict("snapshot cannot be read safely"))?;
    if meta.dev() != identity.dev || meta.ino() != identity.ino || meta.nlink() != 1 {
        return Err(Error::Conflict("database file identity changed"));
    }
    if meta.size() > max_bytes {
        return Err(OVER_CAP);
    }
    if meta.size() == 0 {
        // Not damage: nothing was ever written (the peer's class, and the
        // refusal a writable open that may not create gives).
        return Err(crate::fsguard::NO_LEDGER_YET);
    }
    Ok((file, meta))
}

fn finish(
    reader: HashingReader,
    before: Metadata,
    path: &DbPath,
    identity: Identity,
) -> Result<Pass> {
    let after = reader.file.file().metadata().map_err(|_| CHANGED)?;
    if Signature::of(&before) != Signature::of(&after) || reader.offset != after.size() {
        return Err(CHANGED);
    }
    fsguard::verify_identity(path, identity)?;
    if fsguard::sidecar_state(path) != Sidecars::Closed {
        return Err(CHANGED);
    }
    Ok(Pass {
        signature: Signature::of(&after),
        digest: reader.hasher,
        header: reader.header,
    })
}

fn hash_pass(path: &DbPath, identity: Identity, max_bytes: u64) -> Result<Pass> {
    let (file, meta) = open_checked(path, identity, max_bytes)?;
    let mut reader = HashingReader::new(file, false)?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(_) if reader.offset > max_bytes => return Err(OVER_CAP),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(Error::Conflict("snapshot cannot be read safely")),
        }
    }
    finish(reader, meta, path, identity)
}

/// A file too large to copy into memory; the refusal says which setting
/// moves the cap.
const OVER_CAP: Error = Error::Conflict(
    "database exceeds the read-only snapshot cap (snapshot_max_bytes, CLI --snapshot-max-mib)",
);

/// Header bytes 18 and 19 (the file format's write and read versions) are
/// 2 in a WAL-mode file; SQLite cannot load such an image into memory, so a
/// private copy says rollback journal (1) there. `chunk` holds the file's
/// bytes from `offset` on; only the two header bytes in it change.
fn as_rollback_journal(chunk: &mut [u8], offset: u64) {
    for at in [18u64, 19] {
        let inside = at.checked_sub(offset).and_then(|i| usize::try_from(i).ok());
        if let Some(byte) = inside.and_then(|i| chunk.get_mut(i)) {
            *byte = 1;
        }
    }
}

/// A SQLite file in WAL mode (2, 2) or, closed (no `-journal`: the caller
/// checked the sidecars), in rollback-journal mode (1, 1): a peer file
/// restored from a `VACUUM INTO` backup is one, and its copy needs no patch.
fn check_header(header: &[u8; 20]) -> Result<()> {
    if &header[..16] != b"SQLite format 3\0" {
        return Err(Error::Corrupt);
    }
    match (header[18], header[19]) {
        (2, 2) | (1, 1) => Ok(()),
        _ => Err(Error::Conflict(
            "read-only snapshot requires a WAL or rollback-journal file",
        )),
    }
}

/// Loads a private in-memory copy of the closed ledger at `path`.
pub fn load(path: &DbPath, identity: Identity, max_bytes: u64) -> Result<Connection> {
    let first = hash_pass(path, identity, max_bytes)?;
    check_header(&first.header)?;
    let (file, meta) = open_checked(path, identity, max_bytes)?;
    let size = usize::try_from(meta.size()).map_err(|_| OVER_CAP)?;
    let mut reader = HashingReader::new(file, true)?;
    let mut conn = Connection::open_in_memory()?;
    conn.deserialize_read_exact(MAIN_DB, &mut reader, size, false)
        .map_err(|_| Error::Conflict("deserialization failed"))?;
    // Anything past the size seen at open means the file grew meanwhile.
    let mut probe = [0u8; 1];
    let beyond = reader.file.file().read_at(&mut probe, reader.offset);
    if beyond.map_err(|_| CHANGED)? != 0 {
        return Err(CHANGED);
    }
    let second = finish(reader, meta, path, identity)?;
    // The first pass's digest was computed while the second pass read.
    if second.signature != first.signature
        || second.header != first.header
        || second.digest.finalize()? != first.digest.finalize()?
    {
        return Err(CHANGED);
    }
    Ok(conn)
}

/// A private in-memory copy of the database `conn` reads (a live WAL
/// file, say), so that it can be changed without touching the file. Held
/// to the snapshot's cap, as a copy of a closed file is.
pub fn copy_of(conn: &mut Connection, max_bytes: u64) -> Result<Connection> {
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    if u64::try_from(pages.saturating_mul(page_size)).map_or(true, |size| size > max_bytes) {
        return Err(OVER_CAP);
    }
    let mut image = conn.serialize(MAIN_DB)?.to_vec();
    as_rollback_journal(&mut image, 0);
    let mut copy = Connection::open_in_memory()?;
    copy.deserialize_read_exact(MAIN_DB, &image[..], image.len(), false)?;
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::as_rollback_journal;

    #[test]
    fn only_the_two_format_bytes_change_wherever_the_chunk_starts() {
        let mut whole = [2u8; 24];
        as_rollback_journal(&mut whole, 0);
        assert_eq!(&whole[16..20], &[2, 2, 1, 1]);
        assert_eq!(whole[20], 2);
        // A read that ends inside the header, and the read after it.
        let (mut head, mut tail) = ([2u8; 19], [2u8; 5]);
        as_rollback_journal(&mut head, 0);
        as_rollback_journal(&mut tail, 19);
        assert_eq!((head[18], tail[0], tail[1]), (1, 1, 2));
        let mut later = [2u8; 8];
        as_rollback_journal(&mut later, 20);
        assert_eq!(later, [2u8; 8]);
    }
}
