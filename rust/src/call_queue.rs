//! Threads sharing one `Ledger` take turns at it, without starving.
//!
//! A handle runs one call at a time. Waiting for the call ahead is a lock
//! wait like any other: bounded by `busy_timeout_ms` (then `LedgerBusy`)
//! and ended by Ctrl-C. It must also be fair. Polled, a thread that had
//! just finished a call took the handle straight back, and the longest
//! waiters starved into a false `LedgerBusy` (four threads with 10 ms
//! calls waited up to a whole second). Strictly in arrival order, every
//! call handed the handle (and the interpreter) to a sleeping thread: 16
//! threads made a third as many calls a second.
//!
//! So a caller may take a free handle at once unless the longest waiter
//! has waited [`FAIR_AFTER`]; from then on, callers queue behind it.
//! Nobody waits much longer than that plus the calls queued ahead of it.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::busy::{LoopSignals, SIGNAL_CHECK_EVERY};
use crate::errors::{Error, Result};

/// How long the longest waiter lets newcomers go first.
const FAIR_AFTER: Duration = Duration::from_millis(5);

/// One handle's line of callers.
#[derive(Default)]
pub struct CallQueue {
    line: Mutex<Line>,
    changed: Condvar,
}

#[derive(Default)]
struct Line {
    /// A call runs now.
    busy: bool,
    /// Waiting callers, longest first: their numbers and arrival times.
    waiting: VecDeque<(u64, Instant)>,
    /// The number the next waiting caller takes.
    next: u64,
    /// Callers asleep on `changed`: nobody to wake, no wake-up call.
    sleepers: u32,
}

impl Line {
    /// A newcomer may go first: the handle is free and nobody has waited
    /// long for it.
    fn open_to_newcomers(&self) -> bool {
        !self.busy
            && self
                .waiting
                .front()
                .is_none_or(|(_, since)| since.elapsed() < FAIR_AFTER)
    }

    fn first_in_line(&self, mine: u64) -> bool {
        !self.busy && self.waiting.front().is_some_and(|(n, _)| *n == mine)
    }
}

/// The right to run one call on the handle, until dropped.
pub struct Turn<'a>(&'a CallQueue);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut line = self.0.line();
        line.busy = false;
        self.0.wake(&line);
    }
}

impl CallQueue {
    /// Waits for this caller's turn: `timeout` at most (`None`: as long as
    /// it takes), then `Busy`; a signal handler's exception ends the wait.
    pub fn wait_turn(&self, timeout: Option<Duration>) -> Result<Turn<'_>> {
        let mut line = self.line();
        if line.open_to_newcomers() {
            line.busy = true;
            return Ok(Turn(self));
        }
        let started = Instant::now();
        let mut signals = LoopSignals::starting_now();
        let mine = line.next;
        line.next += 1;
        line.waiting.push_back((mine, started));
        loop {
            if line.first_in_line(mine) {
                line.waiting.pop_front();
                line.busy = true;
                return Ok(Turn(self));
            }
            let slice = match timeout.map(|t| t.checked_sub(started.elapsed())) {
                None => SIGNAL_CHECK_EVERY,
                Some(Some(left)) if !left.is_zero() => left.min(SIGNAL_CHECK_EVERY),
                Some(_) => return Err(self.leave(line, mine, Error::Busy)),
            };
            line.sleepers += 1;
            line = self
                .changed
                .wait_timeout(line, slice)
                .map_or_else(|e| e.into_inner().0, |(l, _)| l);
            line.sleepers -= 1;
            if !line.first_in_line(mine) && signals.due() {
                // Python's handlers run without the line's lock held, and
                // out of the line: a handler may run for long (a shutdown
                // handler joining the other threads that wait here), and
                // a caller at the front that cannot take its turn held
                // every other caller back until they gave up.
                let place = line.waiting.iter().position(|(n, _)| *n == mine);
                let entry = place.and_then(|at| line.waiting.remove(at));
                self.wake(&line);
                drop(line);
                let raised = signals.check();
                line = self.line();
                if let Err(raised) = raised {
                    self.wake(&line);
                    return Err(raised);
                }
                if let Some(entry) = entry {
                    // Back at its place: numbers are taken in arrival order.
                    let at = line.waiting.partition_point(|(n, _)| *n < mine);
                    line.waiting.insert(at, entry);
                }
            }
        }
    }

    fn leave(&self, mut line: MutexGuard<'_, Line>, mine: u64, why: Error) -> Error {
        line.waiting.retain(|(n, _)| *n != mine);
        self.wake(&line);
        why
    }

    fn wake(&self, line: &Line) {
        if line.sleepers > 0 {
            self.changed.notify_all();
        }
    }

    fn line(&self) -> MutexGuard<'_, Line> {
        // Every change is a few assignments under the lock: a panic
        // elsewhere cannot leave them half made.
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_waiter_that_waited_long_goes_before_newcomers() {
        let queue = Arc::new(CallQueue::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = queue.wait_turn(None).unwrap();
        let waiter = {
            let (queue, order) = (Arc::clone(&queue), Arc::clone(&order));
            std::thread::spawn(move || {
                let _turn = queue.wait_turn(None).unwrap();
                order.lock().unwrap().push("waiter");
            })
        };
        while queue.line().waiting.is_empty() {
            std::thread::yield_now();
        }
        std::thread::sleep(FAIR_AFTER * 2);
        drop(first);
        // The handle is free, but the waiter has waited long: a newcomer
        // queues behind it instead of taking it.
        let newcomer = queue.wait_turn(Some(Duration::from_secs(10))).unwrap();
        order.lock().unwrap().push("newcomer");
        drop(newcomer);
        waiter.join().unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["waiter", "newcomer"]);
    }

    #[test]
    fn a_waiter_that_gives_up_leaves_the_line() {
        let queue = Arc::new(CallQueue::default());
        let first = queue.wait_turn(None).unwrap();
        let gave_up = queue.wait_turn(Some(Duration::from_millis(20)));
        assert!(matches!(gave_up, Err(Error::Busy)));
        assert!(queue.line().waiting.is_empty());
        drop(first);
        assert!(
            queue.wait_turn(Some(Duration::ZERO)).is_ok(),
            "the handle is free again"
        );
    }
}
