//! Tasks handed to Python as `taskwarden.models.Task` instances, built here.
//!
//! `Task` is a frozen, slotted dataclass of 27 fields. Its generated
//! `__init__` sets each field through `object.__setattr__`, which made
//! building a task cost a quarter of a batched claim. The core instead
//! calls `_TaskRecord`, Task's mutable twin of identical layout (a plain
//! `__init__`), and retypes the result as `Task`: the same instance a
//! `Task(...)` call makes, at a seventh of the cost. Callgrind, per claim
//! in batches of 64: 116k instructions with `Task(...)` in Python, 74k so.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyList, PyTuple};

use crate::fsm::{DeliveryStatus, TaskStatus, ALL_DELIVERY_STATUSES, ALL_TASK_STATUSES};
use crate::task::TaskRow;

/// `Task`'s fields, in the order [`values`] yields them.
const FIELDS: [&str; 27] = [
    "id",
    "parent_id",
    "status",
    "delivery_status",
    "delivery_required",
    "payload_hash",
    "timeout_seconds",
    "created_at",
    "started_at",
    "updated_at",
    "ended_at",
    "deadline_at",
    "delivery_updated_at",
    "terminal_code",
    "delivery_code",
    "version",
    "tenant",
    "owner",
    "park_code",
    "attempt_count",
    "max_attempts",
    "llm_calls_used",
    "llm_calls_budget",
    "tokens_used",
    "token_budget",
    "cost_used_micros",
    "cost_budget_micros",
];

/// What building a `Task` needs, looked up once per process.
struct Models {
    task: Py<PyAny>,
    record: Py<PyAny>,
    statuses: Vec<Py<PyAny>>,
    deliveries: Vec<Py<PyAny>>,
}

static MODELS: PyOnceLock<Models> = PyOnceLock::new();

fn models(py: Python<'_>) -> PyResult<&Models> {
    MODELS.get_or_try_init(py, || {
        let module = py.import("taskwarden.models")?;
        let task = module.getattr("Task")?;
        // Values go in by position: a field added to `Task` and not here
        // would shift them. Refuse to build tasks at all rather than hand
        // out wrong ones.
        let declared: Vec<String> = py
            .import("dataclasses")?
            .call_method1("fields", (&task,))?
            .try_iter()?
            .map(|f| f?.getattr("name")?.extract())
            .collect::<PyResult<_>>()?;
        if declared != FIELDS {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "taskwarden.models.Task does not match the core's fields",
            ));
        }
        let members = |enum_name: &str, values: &[&str]| -> PyResult<Vec<Py<PyAny>>> {
            let kind = module.getattr(enum_name)?;
            values
                .iter()
                .map(|v| Ok(kind.call1((*v,))?.unbind()))
                .collect()
        };
        Ok(Models {
            record: module.getattr("_TaskRecord")?.unbind(),
            statuses: members("TaskStatus", &ALL_TASK_STATUSES.map(TaskStatus::as_str))?,
            deliveries: members(
                "DeliveryStatus",
                &ALL_DELIVERY_STATUSES.map(DeliveryStatus::as_str),
            )?,
            task: task.unbind(),
        })
    })
}

/// `t`'s field values, in [`FIELDS`] order.
fn values<'py>(py: Python<'py>, m: &Models, t: &TaskRow) -> PyResult<[Bound<'py, PyAny>; 27]> {
    let status = ALL_TASK_STATUSES.iter().position(|s| *s == t.status);
    let delivery = ALL_DELIVERY_STATUSES
        .iter()
        .position(|d| *d == t.delivery_status);
    let (Some(status), Some(delivery)) = (status, delivery) else {
        return Err(pyo3::exceptions::PyRuntimeError::new_err("unknown status"));
    };
    Ok([
        t.id.as_str().into_pyobject(py)?.into_any(),
        t.parent_id.as_deref().into_pyobject(py)?,
        m.statuses[status].bind(py).clone(),
        m.deliveries[delivery].bind(py).clone(),
        PyBool::new(py, t.delivery_required).to_owned().into_any(),
        t.payload_hash.as_deref().into_pyobject(py)?,
        t.timeout_seconds.into_pyobject(py)?,
        t.created_at.into_pyobject(py)?.into_any(),
        t.started_at.into_pyobject(py)?,
        t.updated_at.into_pyobject(py)?.into_any(),
        t.ended_at.into_pyobject(py)?,
        t.deadline_at.into_pyobject(py)?,
        t.delivery_updated_at.into_pyobject(py)?.into_any(),
        t.terminal_code.as_deref().into_pyobject(py)?,
        t.delivery_code.as_deref().into_pyobject(py)?,
        t.version.into_pyobject(py)?.into_any(),
        t.tenant.as_deref().into_pyobject(py)?,
        t.owner.as_deref().into_pyobject(py)?,
        t.park_code.as_deref().into_pyobject(py)?,
        t.attempt_count.into_pyobject(py)?.into_any(),
        t.max_attempts.into_pyobject(py)?.into_any(),
        t.usage.calls.into_pyobject(py)?.into_any(),
        t.limits.calls.into_pyobject(py)?,
        t.usage.tokens.into_pyobject(py)?.into_any(),
        t.limits.tokens.into_pyobject(py)?,
        t.usage.cost_micros.into_pyobject(py)?.into_any(),
        t.limits.cost_micros.into_pyobject(py)?,
    ])
}

/// One task as a `Task` instance.
pub fn task<'py>(py: Python<'py>, t: &TaskRow) -> PyResult<Bound<'py, PyAny>> {
    let m = models(py)?;
    let task = m
        .record
        .bind(py)
        .call1(PyTuple::new(py, values(py, m, t)?)?)?;
    task.setattr(intern!(py, "__class__"), m.task.bind(py))?;
    Ok(task)
}

/// Tasks as a list of `Task` instances.
pub fn task_list<'py>(py: Python<'py>, rows: &[TaskRow]) -> PyResult<Bound<'py, PyList>> {
    let items = rows
        .iter()
        .map(|r| task(py, r))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}
