//! Tasks and charges handed to Python as `taskwarden.models` instances,
//! built here.
//!
//! `Task` and `Charge` are frozen, slotted dataclasses. Their generated
//! `__init__` sets each field through `object.__setattr__`, which made
//! building the tasks a large part of a batched claim. The core instead
//! calls each class's mutable layout twin (`_TaskRecord`, `_ChargeRecord`:
//! the same slots, a plain `__init__`) and retypes the result: the same
//! instance a `Task(...)` call makes, for less. Callgrind, per claim in
//! batches of 64: 116k instructions with `Task(...)` in Python, 74k so.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyList, PyTuple};

use crate::budget;
use crate::charge::{Outcome, Refusal};
use crate::errors::Error;
use crate::events::Event;
use crate::fsm::{DeliveryStatus, TaskStatus, ALL_DELIVERY_STATUSES, ALL_TASK_STATUSES};
use crate::task::TaskRow;

/// `Task`'s fields, in the order [`task_values`] yields them.
const TASK_FIELDS: [&str; 27] = [
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

/// `Charge`'s fields, in the order [`charge`] gives them.
const CHARGE_FIELDS: [&str; 14] = [
    "allowed",
    "escalated",
    "exhausted",
    "calls_used",
    "calls_budget",
    "calls_remaining",
    "tokens_used",
    "token_budget",
    "tokens_remaining",
    "cost_used_micros",
    "cost_budget_micros",
    "cost_remaining_micros",
    "exhausted_task_id",
    "refused",
];

/// A frozen class and its mutable layout twin.
struct Twin {
    class: Py<PyAny>,
    record: Py<PyAny>,
}

impl Twin {
    /// Looks both up, refusing a class whose fields are not `fields`:
    /// values go in by position, so a field added on one side only would
    /// shift them. Better no instances at all than wrong ones.
    fn load(module: &Bound<'_, PyModule>, name: &str, fields: &[&str]) -> PyResult<Twin> {
        let py = module.py();
        let class = module.getattr(name)?;
        let declared: Vec<String> = py
            .import("dataclasses")?
            .call_method1("fields", (&class,))?
            .try_iter()?
            .map(|f| f?.getattr("name")?.extract())
            .collect::<PyResult<_>>()?;
        if declared != fields {
            return Err(
                Error::Internal("taskwarden.models does not match the core's fields").into(),
            );
        }
        Ok(Twin {
            record: module.getattr(format!("_{name}Record"))?.unbind(),
            class: class.unbind(),
        })
    }

    /// An instance of the class with these field values.
    fn make<'py>(
        &self,
        py: Python<'py>,
        values: Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let made = self.record.bind(py).call1(values)?;
        made.setattr(intern!(py, "__class__"), self.class.bind(py))?;
        Ok(made)
    }
}

/// What building tasks and charges needs, looked up once per process.
struct Models {
    task: Twin,
    charge: Twin,
    statuses: Vec<Py<PyAny>>,
    deliveries: Vec<Py<PyAny>>,
}

static MODELS: PyOnceLock<Models> = PyOnceLock::new();

fn models(py: Python<'_>) -> PyResult<&Models> {
    MODELS.get_or_try_init(py, || {
        let module = py.import("taskwarden.models")?;
        let members = |enum_name: &str, values: &[&str]| -> PyResult<Vec<Py<PyAny>>> {
            let kind = module.getattr(enum_name)?;
            values
                .iter()
                .map(|v| Ok(kind.call1((*v,))?.unbind()))
                .collect()
        };
        Ok(Models {
            task: Twin::load(&module, "Task", &TASK_FIELDS)?,
            charge: Twin::load(&module, "Charge", &CHARGE_FIELDS)?,
            statuses: members("TaskStatus", &ALL_TASK_STATUSES.map(TaskStatus::as_str))?,
            deliveries: members(
                "DeliveryStatus",
                &ALL_DELIVERY_STATUSES.map(DeliveryStatus::as_str),
            )?,
        })
    })
}

/// `t`'s field values, in [`TASK_FIELDS`] order.
fn task_values<'py>(py: Python<'py>, m: &Models, t: &TaskRow) -> PyResult<[Bound<'py, PyAny>; 27]> {
    let status = ALL_TASK_STATUSES.iter().position(|s| *s == t.status);
    let delivery = ALL_DELIVERY_STATUSES
        .iter()
        .position(|d| *d == t.delivery_status);
    let (Some(status), Some(delivery)) = (status, delivery) else {
        return Err(Error::Internal("unknown status").into());
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
    m.task.make(py, PyTuple::new(py, task_values(py, m, t)?)?)
}

/// A charge outcome as a `Charge` instance.
pub fn charge<'py>(py: Python<'py>, o: &Outcome) -> PyResult<Bound<'py, PyAny>> {
    let t = &o.task;
    let left = budget::remaining(t.usage, t.limits);
    let values: [Bound<'py, PyAny>; 14] = [
        PyBool::new(py, o.refused.is_none()).to_owned().into_any(),
        PyBool::new(py, o.escalated).to_owned().into_any(),
        o.exhausted
            .as_ref()
            .map(|(dim, _)| dim.as_str())
            .into_pyobject(py)?,
        t.usage.calls.into_pyobject(py)?.into_any(),
        t.limits.calls.into_pyobject(py)?,
        left.calls.into_pyobject(py)?,
        t.usage.tokens.into_pyobject(py)?.into_any(),
        t.limits.tokens.into_pyobject(py)?,
        left.tokens.into_pyobject(py)?,
        t.usage.cost_micros.into_pyobject(py)?.into_any(),
        t.limits.cost_micros.into_pyobject(py)?,
        left.cost_micros.into_pyobject(py)?,
        o.exhausted
            .as_ref()
            .map(|(_, at)| at.as_str())
            .into_pyobject(py)?,
        o.refused.map(Refusal::as_str).into_pyobject(py)?,
    ];
    models(py)?.charge.make(py, PyTuple::new(py, values)?)
}

/// Tasks as a list of `Task` instances.
pub fn task_list<'py>(py: Python<'py>, rows: &[TaskRow]) -> PyResult<Bound<'py, PyList>> {
    let items = rows
        .iter()
        .map(|r| task(py, r))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}

/// Events as a list of `taskwarden.models.Event` instances (a history is
/// read rarely: built by keyword, no layout twin).
pub fn event_list<'py>(py: Python<'py>, events: &[Event]) -> PyResult<Bound<'py, PyList>> {
    let class = py.import("taskwarden.models")?.getattr("Event")?;
    let items = events
        .iter()
        .map(|e| {
            let fields = pyo3::types::PyDict::new(py);
            let (calls, tokens, cost) = match e.grant {
                Some((c, t, m)) => (Some(c), Some(t), Some(m)),
                None => (None, None, None),
            };
            fields.set_item("kind", &e.kind)?;
            fields.set_item("from_state", &e.from)?;
            fields.set_item("to_state", &e.to)?;
            fields.set_item("at", e.at)?;
            fields.set_item("code", &e.code)?;
            fields.set_item("worker", &e.worker)?;
            fields.set_item("granted_calls", calls)?;
            fields.set_item("granted_tokens", tokens)?;
            fields.set_item("granted_cost_micros", cost)?;
            class.call((), Some(&fields))
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, items)
}
