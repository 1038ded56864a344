//! `LedgerCore`, the Python-facing handle: it turns arguments into checked
//! Rust values, runs each operation with the interpreter detached, and
//! turns the result back into Python values afterwards.

use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use pyo3::PyTraverseError;

use crate::call_queue::{CallQueue, Turn};
use crate::convert;
use crate::errors::{Error, Result};
use crate::fork_guard;
use crate::fsguard;
use crate::fsm::TaskStatus;
use crate::reconcile::{self, Policy};
use crate::retention;
use crate::snapshot;
use crate::store::{Durability, FileChanges, OpenOptions, Store};
use crate::task::{Limits, TaskRow};
use crate::tasks::{self, Clock, Fence, ListQuery, NewTask};
use crate::{busy, charge, claim, history, objects, validate};

/// One open ledger. Shareable across threads: the connection sits behind a
/// mutex that is only ever taken with the interpreter detached.
#[pyclass(frozen, module = "taskwarden._core")]
pub struct LedgerCore {
    store: Arc<fork_guard::Slot>,
    /// The process that opened the file: the only one that may use it
    /// (`None` for an in-memory ledger, which a forked child may go on
    /// using as its own copy).
    opened_by: Option<u32>,
    /// `None` means the system clock; otherwise a Python callable.
    clock: Option<Py<PyAny>>,
    /// How long a call waits for another thread's call on this handle.
    busy_timeout: Duration,
    /// The order in which this handle's threads get to call.
    queue: CallQueue,
}

/// The store, locked for one call in this handle's turn order. The lock is
/// released before the turn passes on (fields drop in order).
struct HeldStore<'a> {
    store: MutexGuard<'a, Option<Store>>,
    _turn: Turn<'a>,
}

impl std::ops::Deref for HeldStore<'_> {
    type Target = Option<Store>;
    fn deref(&self) -> &Option<Store> {
        &self.store
    }
}

impl std::ops::DerefMut for HeldStore<'_> {
    fn deref_mut(&mut self) -> &mut Option<Store> {
        &mut self.store
    }
}

/// The system's time in Unix seconds, as `time.time()` gives it: before
/// 1970 (a machine whose clock was never set) it is negative, which the
/// peer stores as any other time.
fn system_now() -> f64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    }
}

impl LedgerCore {
    fn holding(store: Store, clock: Option<Py<PyAny>>) -> LedgerCore {
        let in_memory = store.is_in_memory();
        let busy_timeout = store.busy_timeout();
        let store = Arc::new(Mutex::new(Some(store)));
        if !in_memory {
            fork_guard::register(&store);
        }
        LedgerCore {
            store,
            opened_by: (!in_memory).then(std::process::id),
            clock,
            busy_timeout,
            queue: CallQueue::default(),
        }
    }

    /// Whether this file handle came from a parent process by a fork.
    fn inherited(&self) -> bool {
        self.opened_by.is_some_and(|pid| pid != std::process::id())
    }

    fn now(&self) -> Result<f64> {
        match &self.clock {
            None => Ok(system_now()),
            Some(clock) => Python::attach(|py| {
                let value = clock
                    .bind(py)
                    .call0()
                    .map_err(|e| convert::clock_failed(py, e))?;
                convert::timestamp(&value)
            }),
        }
    }

    /// The store, once no other call holds it. Python code runs while a
    /// call holds the store (its clock; signal handlers during a lock
    /// wait), so Python calling back into the same ledger on that thread
    /// would wait for itself forever: it is refused instead.
    ///
    /// The wait for another thread's call is a lock wait like any other
    /// (see `call_queue`): fair, `busy_timeout_ms` at most, then
    /// `LedgerBusy`, and Ctrl-C ends it. Unbounded, threads queued
    /// behind a call stuck in a long lock wait waited a timeout each in
    /// turn, and a signal handler that joins them (while the main thread's
    /// call holds the store) waited for ever.
    fn lock_store(&self) -> Result<HeldStore<'_>> {
        self.lock_store_within(Some(self.busy_timeout))
    }

    fn lock_store_within(&self, timeout: Option<Duration>) -> Result<HeldStore<'_>> {
        // Before the lock: in a forked child, a call another thread was
        // making at the fork holds it for ever.
        if self.inherited() {
            return Err(fork_guard::INHERITED);
        }
        if OwnCall::is_running(self) {
            return Err(Error::Conflict(
                "the ledger was called from inside one of its own calls \
                 (its clock, or a signal handler during a lock wait)",
            ));
        }
        let turn = {
            // A signal handler run during this wait that calls this ledger
            // would queue behind its own thread: refused like the above.
            let _waiting = OwnCall::enter(self);
            self.queue.wait_turn(timeout)?
        };
        // In turn, nothing else of this process holds the store (only a
        // forked child's guard takes it, in the child).
        // A panic in an earlier call (a bug) poisoned the lock. Its
        // transaction rolled back as it unwound, so the store is as the
        // last commit left it: the handle stays usable, and closable.
        let store = self.store.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(HeldStore { store, _turn: turn })
    }

    /// Runs `op` on the store with the interpreter detached.
    fn run<T: Send>(
        &self,
        py: Python<'_>,
        op: impl FnOnce(&mut Store, Clock<'_>) -> Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut guard = self.lock_store()?;
            let store = guard.as_mut().ok_or(Error::Conflict("ledger is closed"))?;
            let _inside = OwnCall::enter(self);
            let clock = || self.now();
            // A panic is a bug here: its transaction rolls back as it
            // unwinds, and the caller gets a RuntimeError (CLI exit 3),
            // not PyO3's PanicException, a BaseException that `except
            // Exception` misses. The store stays usable.
            panic::catch_unwind(AssertUnwindSafe(|| op(store, &clock)))
                .unwrap_or(Err(Error::Internal("internal error in the ledger core")))
        })
        .map_err(PyErr::from)
    }

    fn write_task<'py>(
        &self,
        py: Python<'py>,
        op: impl FnOnce(&rusqlite::Transaction<'_>, Clock<'_>) -> Result<TaskRow> + Send,
    ) -> PyResult<Bound<'py, PyAny>> {
        let row = self.run(py, |store, clock| store.write(|tx| op(tx, clock)))?;
        objects::task(py, &row)
    }
}

thread_local! {
    /// The ledgers with a call holding their store on this thread,
    /// innermost last (by address: a ledger cannot move while one of its
    /// calls runs).
    static CALLS_RUNNING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Marks one ledger's call as holding its store on this thread until
/// dropped.
struct OwnCall(usize);

impl OwnCall {
    fn enter(ledger: &LedgerCore) -> OwnCall {
        let key = std::ptr::from_ref(ledger) as usize;
        CALLS_RUNNING.with(|c| c.borrow_mut().push(key));
        OwnCall(key)
    }

    fn is_running(ledger: &LedgerCore) -> bool {
        let key = std::ptr::from_ref(ledger) as usize;
        CALLS_RUNNING.with(|c| c.borrow().contains(&key))
    }
}

impl Drop for OwnCall {
    fn drop(&mut self) {
        CALLS_RUNNING.with(|c| {
            let mut running = c.borrow_mut();
            if let Some(at) = running.iter().rposition(|k| *k == self.0) {
                running.remove(at);
            }
        });
    }
}

/// The busy timeout, judged alike for file and in-memory ledgers: an int
/// only, as the peer takes it (a float such as 5.0 is refused), and at
/// most what SQLite takes (a C int of milliseconds).
fn busy_ms(obj: &Bound<'_, PyAny>) -> Result<u32> {
    // The peer's one refusal for a value that is no int, or a negative one.
    const REFUSED: Error = Error::InvalidArgument("busy_timeout_ms", "must be nonnegative");
    if !obj.is_instance_of::<pyo3::types::PyInt>() || obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(REFUSED);
    }
    // An int subclass's own comparison may raise: judged as any conversion
    // (Ctrl-C passes through).
    let negative = obj
        .lt(0)
        .map_err(|e| convert::conversion_failed(obj.py(), e, REFUSED))?;
    if negative {
        return Err(REFUSED);
    }
    let value = convert::amount(obj, "busy_timeout_ms")?;
    i32::try_from(value)
        .ok()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or(Error::InvalidArgument("busy_timeout_ms", "is too large"))
}

fn fence(worker: Option<&Bound<'_, PyAny>>, attempt: Option<&Bound<'_, PyAny>>) -> Result<Fence> {
    Ok(Fence {
        worker: convert::opt_name(worker, "worker")?,
        attempt: convert::opt_amount(attempt, "attempt")?,
    })
}

#[pymethods]
impl LedgerCore {
    /// Opens (and creates, migrates, unless told not to; secures) the
    /// ledger at `path`.
    #[new]
    #[pyo3(signature = (path, *, busy_timeout_ms, durability, read_only, allow_external_acl,
                        snapshot_max_bytes, clock, euid, migrate, create))]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        busy_timeout_ms: &Bound<'_, PyAny>,
        durability: &Bound<'_, PyAny>,
        read_only: &Bound<'_, PyAny>,
        allow_external_acl: &Bound<'_, PyAny>,
        snapshot_max_bytes: &Bound<'_, PyAny>,
        clock: Option<Py<PyAny>>,
        euid: u32,
        migrate: &Bound<'_, PyAny>,
        create: &Bound<'_, PyAny>,
    ) -> PyResult<LedgerCore> {
        let path = convert::opt_text(Some(path), "database path is invalid")?
            .ok_or(Error::Invalid("database path is invalid"))?;
        // Accepted for the peer's signature and checked in its order. On a
        // POSIX system the file's mode is always enforced, as in the peer, so
        // the value changes nothing.
        convert::flag(allow_external_acl, "allow_external_acl")?;
        let opts = OpenOptions {
            busy_timeout_ms: busy_ms(busy_timeout_ms)?,
            durability: Durability::parse(
                &convert::opt_text(Some(durability), "durability must be 'normal' or 'full'")?
                    .unwrap_or_default(),
            )?,
            read_only: convert::flag(read_only, "read_only")?,
            snapshot_max_bytes: convert::opt_amount(
                Some(snapshot_max_bytes),
                "snapshot_max_bytes",
            )?
            .map_or(snapshot::DEFAULT_MAX_BYTES, |v| v as u64),
            euid,
            may: FileChanges {
                create: convert::flag(create, "create")?,
                migrate: convert::flag(migrate, "migrate")?,
            },
        };
        let store = py.detach(|| {
            fork_guard::close_inherited();
            Store::open(&path, &opts)
        })?;
        Ok(LedgerCore::holding(store, clock))
    }

    /// A private in-memory ledger (for tests).
    #[staticmethod]
    #[pyo3(signature = (*, busy_timeout_ms, clock))]
    fn in_memory(
        busy_timeout_ms: &Bound<'_, PyAny>,
        clock: Option<Py<PyAny>>,
    ) -> PyResult<LedgerCore> {
        let busy = busy_ms(busy_timeout_ms)?;
        Ok(LedgerCore::holding(Store::in_memory(busy)?, clock))
    }

    /// Shows the collector the clock: a clock that refers back to the
    /// ledger's owner (a bound method, a fake clock holding its ledger)
    /// makes a cycle, which without this was never freed, and the file
    /// stayed open with its sidecars. The clock never changes, so the
    /// cycle is broken elsewhere and no `__clear__` is needed.
    fn __traverse__(&self, visit: PyVisit<'_>) -> std::result::Result<(), PyTraverseError> {
        visit.call(&self.clock)
    }

    /// Releases the connection; later calls raise `StateConflict`. In a
    /// forked child an inherited handle is closed when the child opens a
    /// ledger of its own (or, in use at the fork, never): nothing to do.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.inherited() {
            return Ok(());
        }
        // A close waits for the call ahead of it however long that takes
        // (Ctrl-C still ends the wait): it must not fail for being patient.
        py.detach(|| {
            self.lock_store_within(None)?.take();
            Ok::<(), Error>(())
        })?;
        Ok(())
    }

    #[pyo3(signature = (*, task_id, parent_id, payload_hash, timeout_seconds, delivery_required,
                        tenant, llm_calls_budget, token_budget, cost_budget_micros, max_attempts))]
    fn create_task<'py>(
        &self,
        py: Python<'py>,
        task_id: Option<&Bound<'py, PyAny>>,
        parent_id: Option<&Bound<'py, PyAny>>,
        payload_hash: Option<&Bound<'py, PyAny>>,
        timeout_seconds: Option<&Bound<'py, PyAny>>,
        delivery_required: &Bound<'py, PyAny>,
        tenant: Option<&Bound<'py, PyAny>>,
        llm_calls_budget: Option<&Bound<'py, PyAny>>,
        token_budget: Option<&Bound<'py, PyAny>>,
        cost_budget_micros: Option<&Bound<'py, PyAny>>,
        max_attempts: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let new = NewTask {
            id: convert::opt_task_id(task_id)?,
            parent_id: convert::opt_task_id(parent_id)?,
            payload_hash: convert::opt_payload_hash(payload_hash)?,
            timeout_seconds: convert::opt_seconds(timeout_seconds, "timeout_seconds")?,
            delivery_required: convert::flag(delivery_required, "delivery_required")?,
            tenant: convert::opt_name(tenant, "tenant")?,
            limits: Limits {
                calls: convert::opt_amount(llm_calls_budget, "llm_calls_budget")?,
                tokens: convert::opt_amount(token_budget, "token_budget")?,
                cost_micros: convert::opt_amount(cost_budget_micros, "cost_budget_micros")?,
            },
            max_attempts: convert::amount(max_attempts, "max_attempts")?,
        };
        // A task named as its own parent needs no rule of its own, as in the
        // peer: a new one finds no parent (`TaskNotFound`), an existing one
        // differs in its parent (`StateConflict`).
        self.write_task(py, |tx, clock| tasks::create(tx, &new, clock))
    }

    fn get_task<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        let row = self.run(py, |store, _| store.read(|tx| tasks::get(tx, &id)))?;
        objects::task(py, &row)
    }

    /// The task's events, oldest first, once they verify.
    fn events<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let id = convert::task_id(task_id)?;
        let events = self.run(py, |store, _| store.read(|tx| history::of_task(tx, &id)))?;
        objects::event_list(py, &events)
    }

    fn children_of<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let id = convert::task_id(task_id)?;
        let rows = self.run(py, |store, _| store.read(|tx| tasks::children(tx, &id)))?;
        objects::task_list(py, &rows)
    }

    fn start_task<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        self.write_task(py, |tx, clock| tasks::start(tx, &id, clock))
    }

    #[pyo3(signature = (task_id, *, worker=None, attempt=None))]
    fn heartbeat<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
        worker: Option<&Bound<'py, PyAny>>,
        attempt: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        let fence = fence(worker, attempt)?;
        self.write_task(py, |tx, clock| tasks::heartbeat(tx, &id, &fence, clock))
    }

    #[pyo3(signature = (task_id, status, *, code=None, worker=None, attempt=None))]
    fn close_task<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
        status: &Bound<'py, PyAny>,
        code: Option<&Bound<'py, PyAny>>,
        worker: Option<&Bound<'py, PyAny>>,
        attempt: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        let to = convert::task_status(status)?;
        if !to.is_terminal() {
            return Err(Error::Invalid("close status must be terminal").into());
        }
        // Judged only where it would be written (see `CallerCode`).
        let code = convert::opt_text(code, validate::BAD_CODE_FORMAT).ok();
        let fence = fence(worker, attempt)?;
        self.write_task(py, |tx, clock| {
            tasks::close(
                tx,
                &id,
                to,
                tasks::CallerCode::from_converted(code.as_ref()),
                &fence,
                clock,
            )
        })
    }

    #[pyo3(signature = (task_id, status, *, code=None, worker=None, attempt=None))]
    fn set_delivery<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
        status: &Bound<'py, PyAny>,
        code: Option<&Bound<'py, PyAny>>,
        worker: Option<&Bound<'py, PyAny>>,
        attempt: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        let to = convert::delivery_status(status)?;
        if !to.is_terminal() {
            return Err(Error::Invalid("delivery close status must be terminal").into());
        }
        let code = convert::opt_text(code, validate::BAD_CODE_FORMAT).ok();
        let fence = fence(worker, attempt)?;
        self.write_task(py, |tx, clock| {
            tasks::set_delivery(
                tx,
                &id,
                to,
                tasks::CallerCode::from_converted(code.as_ref()),
                &fence,
                clock,
            )
        })
    }

    #[pyo3(signature = (*, active_grace_seconds, delivery_grace_seconds, dry_run, worker_lost=None,
                        tenant=None))]
    fn reconcile<'py>(
        &self,
        py: Python<'py>,
        active_grace_seconds: &Bound<'py, PyAny>,
        delivery_grace_seconds: &Bound<'py, PyAny>,
        dry_run: &Bound<'py, PyAny>,
        worker_lost: Option<&Bound<'py, PyAny>>,
        tenant: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let dry_run = convert::flag(dry_run, "dry_run")?;
        let policy = Policy {
            active_grace: convert::seconds(active_grace_seconds, "active_grace_seconds")?,
            delivery_grace: convert::seconds(delivery_grace_seconds, "delivery_grace_seconds")?,
            worker_lost: convert::opt_name(worker_lost, "worker_lost")?,
            tenant: convert::opt_name(tenant, "tenant")?,
        };
        let report = self.run(py, |store, clock| {
            if dry_run {
                store.read(|tx| reconcile::preview(tx, &policy, clock))
            } else {
                store.bulk_write(|tx| reconcile::apply(tx, &policy, clock))
            }
        })?;
        convert::reconcile_dict(py, &report)
    }

    #[pyo3(signature = (task_id, worker))]
    fn claim<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
        worker: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let id = convert::task_id(task_id)?;
        let worker = convert::name(worker, "worker")?;
        let row = self.run(py, |store, clock| {
            store.write(|tx| claim::claim(tx, &id, &worker, clock))
        })?;
        row.map(|r| objects::task(py, &r)).transpose()
    }

    #[pyo3(signature = (worker, *, tenant=None, limit))]
    fn claim_next<'py>(
        &self,
        py: Python<'py>,
        worker: &Bound<'py, PyAny>,
        tenant: Option<&Bound<'py, PyAny>>,
        limit: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let worker = convert::name(worker, "worker")?;
        let tenant = convert::opt_name(tenant, "tenant")?;
        let limit = convert::page_size(limit)?;
        let rows = self.run(py, |store, clock| {
            store.write(|tx| claim::claim_next(tx, &worker, tenant.as_deref(), limit, clock))
        })?;
        objects::task_list(py, &rows)
    }

    #[pyo3(signature = (task_id, worker, *, attempt=None))]
    fn release<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
        worker: &Bound<'py, PyAny>,
        attempt: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        let worker = convert::name(worker, "worker")?;
        let attempt = convert::opt_amount(attempt, "attempt")?;
        self.write_task(py, |tx, clock| {
            claim::release(tx, &id, &worker, attempt, clock)
        })
    }

    #[pyo3(signature = (task_id, expected, to, *, code=None, worker=None, attempt=None))]
    fn transition<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
        expected: &Bound<'py, PyAny>,
        to: &Bound<'py, PyAny>,
        code: Option<&Bound<'py, PyAny>>,
        worker: Option<&Bound<'py, PyAny>>,
        attempt: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        use convert::{named, STATUS_RULE};
        let expected = named(convert::task_status(expected), "expected", STATUS_RULE)?;
        let to = named(convert::task_status(to), "to", STATUS_RULE)?;
        // A code must be text here (close_task keeps the peer's leniency for
        // one that is not). As in close_task, whether a code fits a terminal
        // status is judged only when written, so the same terminal status
        // again ignores it (SPEC 2.2.1).
        let code = convert::opt_text(code, validate::BAD_CODE_FORMAT)?;
        tasks::check_code_ahead(to, code.as_deref())?;
        let fence = fence(worker, attempt)?;
        self.write_task(py, |tx, clock| {
            tasks::compare_and_set(tx, &id, expected, to, code.as_deref(), &fence, clock)
        })
    }

    /// block, escalate and requeue: a move into `to` from whatever the task
    /// is now, judged by the table (`cancel` is its own call: it writes
    /// `caller_cancelled` and, with `subtree`, cancels the tasks below).
    #[pyo3(signature = (task_id, to, *, code=None, worker=None, attempt=None))]
    fn move_to<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
        to: &Bound<'py, PyAny>,
        code: Option<&Bound<'py, PyAny>>,
        worker: Option<&Bound<'py, PyAny>>,
        attempt: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        let to = convert::task_status(to)?;
        let code = convert::opt_code(code)?;
        tasks::check_code_ahead(to, code.as_deref())?;
        let fence = fence(worker, attempt)?;
        self.write_task(py, |tx, clock| {
            tasks::move_to(tx, &id, to, code.as_deref(), &fence, clock)
        })
    }

    /// Cancels a task; with `subtree`, every task below it that is not
    /// terminal yet too.
    #[pyo3(signature = (task_id, *, subtree))]
    fn cancel<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
        subtree: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        let cancelled = Some("caller_cancelled");
        if convert::flag(subtree, "subtree")? {
            self.write_task(py, |tx, clock| tasks::cancel_tree(tx, &id, clock))
        } else {
            let (to, unfenced) = (TaskStatus::Cancelled, Fence::default());
            self.write_task(py, |tx, clock| {
                tasks::move_to(tx, &id, to, cancelled, &unfenced, clock)
            })
        }
    }

    #[pyo3(signature = (task_id, *, calls, tokens, cost_micros))]
    fn grant<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
        calls: &Bound<'py, PyAny>,
        tokens: &Bound<'py, PyAny>,
        cost_micros: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        let amount = convert::usage(calls, tokens, cost_micros)?;
        self.write_task(py, |tx, clock| tasks::grant(tx, &id, amount, clock))
    }

    #[pyo3(signature = (task_id, *, calls, tokens, cost_micros, worker=None, attempt=None))]
    fn charge<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
        calls: &Bound<'py, PyAny>,
        tokens: &Bound<'py, PyAny>,
        cost_micros: &Bound<'py, PyAny>,
        worker: Option<&Bound<'py, PyAny>>,
        attempt: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        let amount = convert::usage(calls, tokens, cost_micros)?;
        let fence = fence(worker, attempt)?;
        let outcome = self.run(py, |store, clock| {
            store.write(|tx| charge::charge(tx, &id, amount, &fence, clock))
        })?;
        objects::charge(py, &outcome)
    }

    fn budget<'py>(
        &self,
        py: Python<'py>,
        task_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = convert::task_id(task_id)?;
        let outcome = self.run(py, |store, _| store.read(|tx| charge::read(tx, &id)))?;
        objects::charge(py, &outcome)
    }

    #[pyo3(signature = (*, status=None, tenant=None, owner=None, parent_id=None, limit, after=None))]
    fn list_tasks<'py>(
        &self,
        py: Python<'py>,
        status: Option<&Bound<'py, PyAny>>,
        tenant: Option<&Bound<'py, PyAny>>,
        owner: Option<&Bound<'py, PyAny>>,
        parent_id: Option<&Bound<'py, PyAny>>,
        limit: &Bound<'py, PyAny>,
        after: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        use convert::{named, ID_RULE, STATUS_RULE};
        let status = status.filter(|s| !s.is_none()).map(convert::task_status);
        let query = ListQuery {
            status: named(status.transpose(), "status", STATUS_RULE)?,
            tenant: convert::opt_name(tenant, "tenant")?,
            owner: convert::opt_name(owner, "owner")?,
            parent_id: named(convert::opt_task_id(parent_id), "parent_id", ID_RULE)?,
            limit: convert::page_size(limit)?,
            after: named(convert::opt_task_id(after), "after", ID_RULE)?,
        };
        let rows = self.run(py, |store, _| store.read(|tx| tasks::list(tx, &query)))?;
        objects::task_list(py, &rows)
    }

    /// Deletes one fully closed task without children, and its events.
    fn delete_task(&self, py: Python<'_>, task_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = convert::task_id(task_id)?;
        self.run(py, |store, _| {
            store.write(|tx| retention::delete_task(tx, &id))
        })
    }

    /// Purges fully closed task trees last changed `older_than_seconds` ago,
    /// a batch per write transaction so other writers never wait long.
    #[pyo3(signature = (*, older_than_seconds, dry_run, tenant=None))]
    fn purge<'py>(
        &self,
        py: Python<'py>,
        older_than_seconds: &Bound<'py, PyAny>,
        dry_run: &Bound<'py, PyAny>,
        tenant: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let dry_run = convert::flag(dry_run, "dry_run")?;
        let older_than = convert::seconds(older_than_seconds, "older_than_seconds")?;
        let tenant = convert::opt_name(tenant, "tenant")?;
        let report = self.run(py, |store, clock| {
            let scope = retention::PurgeScope {
                cutoff: clock()? - older_than,
                tenant,
                dry_run,
            };
            let mut signals = busy::LoopSignals::starting_now();
            retention::purge(store, &scope, &mut || signals.check())
        })?;
        convert::purge_dict(py, &report)
    }

    /// Counts by status, delivery and tenant, and the file's size.
    #[pyo3(signature = (*, tenant=None))]
    fn stats<'py>(
        &self,
        py: Python<'py>,
        tenant: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let tenant = convert::opt_name(tenant, "tenant")?;
        let (stats, sizes) = self.run(py, |store, _| {
            Ok((
                store.read(|tx| retention::stats(tx, tenant.as_deref()))?,
                store.file_sizes(),
            ))
        })?;
        convert::stats_dict(py, &stats, sizes)
    }

    /// Is the file a healthy ledger? Counts only.
    fn doctor<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let report = self.run(py, |store, _| store.doctor())?;
        convert::doctor_dict(py, &report)
    }

    /// The database file as the open resolved it (`None` in memory).
    #[getter]
    fn path(&self, py: Python<'_>) -> PyResult<Option<std::path::PathBuf>> {
        self.run(py, |store, _| {
            Ok(store.file_path().map(std::path::Path::to_path_buf))
        })
    }

    fn storage_info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let info = self.run(py, |store, _| store.info())?;
        convert::storage_dict(py, &info)
    }
}

impl Drop for LedgerCore {
    fn drop(&mut self) {
        if let Some(pid) = self.opened_by {
            fork_guard::release(&mut self.store, pid);
        }
    }
}

/// `os.register_at_fork(before=...)`: see `fork_guard::hold_registries`.
#[pyfunction]
pub fn hold_registries_for_fork() {
    fork_guard::hold_registries();
}

/// `os.register_at_fork(after_in_parent=..., after_in_child=...)`.
#[pyfunction]
pub fn free_registries_after_fork() {
    fork_guard::free_registries();
}

/// The file a ledger opened at `path` would be: absolute, its existing
/// directories' links followed, its name as written. Refuses what an open
/// refuses for the path alone, and touches nothing (for `demo`, which
/// builds its ledger under another name beside this one).
#[pyfunction]
pub fn resolve_path(path: &Bound<'_, PyAny>) -> PyResult<std::path::PathBuf> {
    let raw = convert::opt_text(Some(path), "database path is invalid")?
        .ok_or(Error::Invalid("database path is invalid"))?;
    Ok(fsguard::resolve(&raw)?.file)
}

/// SHA-256 of a payload (`str` as UTF-8, or `bytes`), lowercase hex.
#[pyfunction]
pub fn payload_fingerprint(payload: &Bound<'_, PyAny>) -> PyResult<String> {
    use sha2::{Digest, Sha256};
    let bytes = convert::payload_bytes(payload)?;
    Ok(crate::schema::hex(&Sha256::digest(&bytes)))
}

/// True when SPEC §3's table has the edge `from -> to` (aliases accepted).
#[pyfunction]
pub fn can_transition(
    from_status: &Bound<'_, PyAny>,
    to_status: &Bound<'_, PyAny>,
) -> PyResult<bool> {
    Ok(crate::fsm::can_transition(
        convert::task_status(from_status)?,
        convert::task_status(to_status)?,
    ))
}

/// Checks a grace period or timeout: anything `float()` accepts except a
/// bool, finite and at least 0. Returns it as a float. A refusal names
/// the policy's field (messages hold only fixed text).
#[pyfunction]
pub fn non_negative_seconds(value: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    let name = match name {
        "active_grace_seconds" => "active_grace_seconds",
        "delivery_grace_seconds" => "delivery_grace_seconds",
        _ => "seconds",
    };
    Ok(convert::seconds(value, name)?)
}
