//! Waiting for the write lock.
//!
//! SQLite's own busy timeout sleeps in steps that grow to 100 ms, which is
//! fine for one writer and ruinous for a fleet: with several processes
//! claiming from one file, waiters sleep far longer than the ~0.2 ms the
//! lock is held. This handler first yields the processor a few times (with
//! more processes than cores, the holder is often waiting for one), then
//! polls in short, growing pauses, and gives up (SQLITE_BUSY, surfaced as
//! `LedgerBusy`) once the timeout has passed.
//!
//! Yielding first matters once processes outnumber cores: a sleep of
//! 50 us lasts at least the kernel's timer slack and costs two context
//! switches, and with 16 processes claiming on 2 cores, waiters that only
//! slept spent twice the CPU per task and claimed half as many tasks per
//! second as waiters that yielded first (about 1,500 against 2,600).

use std::time::{Duration, Instant};

use rusqlite::Connection;

use crate::errors::Result;

/// What to do before retry number `count` of one wait.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Pause {
    /// Let another runnable thread (perhaps the holder) have this core.
    Yield,
    Sleep(Duration),
}

fn pause(count: i32) -> Pause {
    match count {
        0..20 => Pause::Yield,
        20..40 => Pause::Sleep(Duration::from_micros(50)),
        40..200 => Pause::Sleep(Duration::from_micros(250)),
        _ => Pause::Sleep(Duration::from_millis(1)),
    }
}

/// Installs the handler on `conn`: retry until `timeout_ms` has passed.
pub fn install(conn: &mut Connection, timeout_ms: u32) -> Result<()> {
    let timeout = Duration::from_millis(u64::from(timeout_ms));
    let mut started = Instant::now();
    conn.busy_handler(Some(move |count: i32| {
        if count == 0 {
            started = Instant::now();
        }
        match timeout.checked_sub(started.elapsed()) {
            Some(left) if !left.is_zero() => {
                match pause(count) {
                    Pause::Yield => std::thread::yield_now(),
                    Pause::Sleep(pause) => std::thread::sleep(pause.min(left)),
                }
                true
            }
            _ => false,
        }
    }))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_yield_first_then_grow_and_stay_short() {
        assert_eq!(pause(0), Pause::Yield);
        assert!(pause(0) < pause(30));
        assert!(pause(30) < pause(50));
        assert!(pause(50) < pause(500));
        assert_eq!(pause(i32::MAX), Pause::Sleep(Duration::from_millis(1)));
    }

    #[test]
    fn a_held_lock_times_out_as_busy() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("tw-busy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(crate::errors::Error::from)?;
        let path = dir.join("busy.db");
        let holder = Connection::open(&path)?;
        holder.execute_batch(
            "PRAGMA journal_mode=WAL; CREATE TABLE IF NOT EXISTS t(x); BEGIN IMMEDIATE;",
        )?;
        let mut waiter = Connection::open(&path)?;
        install(&mut waiter, 30)?;
        let start = Instant::now();
        let outcome = waiter.execute_batch("BEGIN IMMEDIATE; ROLLBACK;");
        assert!(matches!(
            crate::errors::Error::from(outcome.unwrap_err()),
            crate::errors::Error::Busy
        ));
        assert!(start.elapsed() >= Duration::from_millis(30));
        drop(holder);
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }
}
