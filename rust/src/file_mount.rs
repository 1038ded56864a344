//! A ledger file mounted on its own (`docker run -v /host/t.db:/app/t.db`,
//! a Kubernetes `subPath`): refused at open.
//!
//! SQLite keeps a ledger's WAL and its locks (`-shm`) beside the name it
//! opened. Through a file mounted alone, each side of the mount makes its
//! own beside its own name, so two WALs run over one database file: a
//! review had every task of a host worker and a container worker claimed
//! twice, and the file damaged. With one side alone, the commits not yet
//! copied into the file live in the container's layer, gone with it. A
//! directory mounted whole keeps the sidecars beside the file for all.
//!
//! The kernel names the mount every open file is reached through
//! (`mnt_id` in `/proc/self/fdinfo`): a file reached through another
//! mount than its directory is itself a mount point. Where the kernel does
//! not say, nothing is refused.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::errors::{Error, Result};

const MOUNTED_ALONE: &str = "database file is mounted on its own (a bind mount of the file, \
     not its directory): processes on either side would keep separate WALs over one file; \
     mount its directory instead";

/// Refuses the opened database `file` when it is reached through another
/// mount than its directory, `parent`. `file` is the process's one shared
/// descriptor (`held_files`), perhaps opened by an earlier handle through
/// another spelling of the path (a directory mounted twice); its mount then
/// says nothing of this path's, and nothing is judged.
pub fn refuse_file_mounted_alone(file: &File, path: &Path, parent: &Path) -> Result<()> {
    let opened_as = fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()));
    if opened_as.ok().as_deref() != Some(path) {
        return Ok(());
    }
    let Some(file_mount) = mount_id(file) else {
        return Ok(());
    };
    let Some(dir_mount) = File::open(parent).ok().as_ref().and_then(mount_id) else {
        return Ok(());
    };
    if file_mount == dir_mount {
        Ok(())
    } else {
        Err(Error::Conflict(MOUNTED_ALONE))
    }
}

/// The mount `file` is reached through, as the kernel reports it.
fn mount_id(file: &File) -> Option<u64> {
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", file.as_raw_fd())).ok()?;
    parse_mount_id(&info)
}

fn parse_mount_id(fdinfo: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|line| line.strip_prefix("mnt_id:"))
        .and_then(|id| id.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::{parse_mount_id, refuse_file_mounted_alone};
    use std::fs::{self, File};

    #[test]
    fn reads_the_mount_id_of_fdinfo() {
        assert_eq!(
            parse_mount_id("pos:\t0\nflags:\t0100000\nmnt_id:\t24\nino:\t3\n"),
            Some(24)
        );
        assert_eq!(parse_mount_id("pos:\t0\n"), None);
    }

    /// A file beside others in its directory shares its directory's mount.
    #[test]
    fn a_file_in_its_directory_is_not_mounted_alone() -> crate::errors::Result<()> {
        let dir = std::env::temp_dir().join(format!("tw-mount-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let path = dir.join("ledger.db");
        fs::write(&path, b"")?;
        let outcome = refuse_file_mounted_alone(&File::open(&path)?, &path, &dir);
        fs::remove_dir_all(&dir)?;
        outcome
    }
}
