//! taskwarden's core: an embedded, crash-honest task-state ledger.
//!
//! Domain modules (`fsm`, `validate`, `task`, `events`, `schema`, `tasks`,
//! `store`, `fsguard`, `snapshot` and the rest) never touch Python; `ledger`,
//! `convert`, `objects` and `errors` are the bridge. One exception: `busy`
//! runs Python's signal handlers during a long lock wait, so that Ctrl-C
//! ends the wait (it attaches only if an interpreter is there).

mod ancestry;
mod budget;
mod busy;
mod call_queue;
mod charge;
mod checks;
mod claim;
mod convert;
mod doctor;
mod errors;
mod events;
mod file_mount;
mod fork_guard;
mod fsguard;
mod fsm;
mod held_files;
mod history;
mod index_audit;
mod layout_upgrade;
mod ledger;
mod objects;
mod reconcile;
mod replay;
mod retention;
mod schema;
mod sidecar_loss;
mod snapshot;
mod store;
mod task;
mod tasks;
mod turnstile;
mod validate;
mod wal_flush;
mod wal_growth;
mod wal_index;

use pyo3::prelude::*;

#[pymodule(gil_used = false)]
mod _core {
    use pyo3::prelude::*;
    use pyo3::types::{PyDict, PyTuple};

    #[pymodule_export]
    use crate::ledger::LedgerCore;
    #[pymodule_export]
    use crate::ledger::{can_transition, non_negative_seconds, payload_fingerprint, resolve_path};
    use crate::ledger::{free_registries_after_fork, hold_registries_for_fork};

    /// `{status: (codes...)}` for the statuses that take any code.
    fn code_table<'py>(py: Python<'py>, rows: &[(&str, &[&str])]) -> PyResult<Bound<'py, PyDict>> {
        let table = PyDict::new(py);
        for (status, codes) in rows.iter().filter(|(_, codes)| !codes.is_empty()) {
            table.set_item(status, PyTuple::new(py, *codes)?)?;
        }
        Ok(table)
    }

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        let py = m.py();
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("SCHEMA_VERSION", crate::schema::SCHEMA_VERSION)?;
        m.add(
            "DEFAULT_SNAPSHOT_MAX_BYTES",
            crate::snapshot::DEFAULT_MAX_BYTES,
        )?;
        m.add("REASON_CODES", PyTuple::new(py, crate::fsm::REASON_CODES)?)?;
        let table = PyDict::new(py);
        for from in crate::fsm::ALL_TASK_STATUSES {
            let targets = crate::fsm::ALL_TASK_STATUSES
                .into_iter()
                .filter(|to| crate::fsm::can_transition(from, *to))
                .map(crate::fsm::TaskStatus::as_str)
                .collect::<Vec<_>>();
            table.set_item(from.as_str(), PyTuple::new(py, targets)?)?;
        }
        m.add("TRANSITIONS", table)?;
        let terminal = crate::fsm::ALL_TASK_STATUSES
            .into_iter()
            .filter(|s| s.is_terminal())
            .map(crate::fsm::TaskStatus::as_str)
            .collect::<Vec<_>>();
        m.add("TERMINAL_STATUSES", PyTuple::new(py, terminal)?)?;
        let aliases = PyDict::new(py);
        for (alias, status) in crate::fsm::STATUS_ALIASES {
            aliases.set_item(alias, status.as_str())?;
        }
        m.add("STATUS_ALIASES", aliases)?;
        // The codes a caller may give for each target, as the core checks.
        let task_codes =
            crate::fsm::ALL_TASK_STATUSES.map(|to| (to.as_str(), crate::fsm::caller_codes(to)));
        m.add("TASK_REASON_CODES", code_table(py, &task_codes)?)?;
        let delivery_codes = crate::fsm::ALL_DELIVERY_STATUSES
            .map(|to| (to.as_str(), crate::fsm::delivery_codes(to)));
        m.add("DELIVERY_REASON_CODES", code_table(py, &delivery_codes)?)?;
        // No registry lock is inherited held by a thread the child lacks.
        let hooks = PyDict::new(py);
        let free = wrap_pyfunction!(free_registries_after_fork, m)?;
        hooks.set_item("before", wrap_pyfunction!(hold_registries_for_fork, m)?)?;
        hooks.set_item("after_in_parent", &free)?;
        hooks.set_item("after_in_child", &free)?;
        py.import("os")?
            .call_method("register_at_fork", (), Some(&hooks))?;
        Ok(())
    }
}
