//! Python values in, Python values out. Each argument is checked for its
//! type here (bool is never a number, a str is never bytes) and then handed
//! to the pure validators. Reports go back as dicts (tasks and charges as
//! `taskwarden.models` instances, built in `objects`).

use pyo3::exceptions::{PyException, PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString};

use crate::doctor::Report as DoctorReport;
use crate::errors::{Error, Result};
use crate::fsm::{DeliveryStatus, TaskStatus, ALL_DELIVERY_STATUSES, ALL_TASK_STATUSES};
use crate::reconcile::Report;
use crate::retention::{PurgeReport, Stats};
use crate::store::StorageInfo;
use crate::task::Usage;
use crate::validate;

/// A required task id in any form the peer accepts, canonicalised.
pub fn task_id(obj: &Bound<'_, PyAny>) -> Result<String> {
    // The peer's words: a value that is no text, and text that is no UUID.
    const NOT_TEXT: &str = "task id must be a UUID string";
    const BAD: &str = "task id must be a valid UUID";
    validate::canonical_uuid(&text(obj, NOT_TEXT)?).or_else(|_| {
        // The rarer spellings the peer accepts (surrounding whitespace, a
        // sign, `0x`, `_` between digits, non-ASCII digits, many braces)
        // are whatever Python's `uuid.UUID` parses: the peer's own parser.
        let py = obj.py();
        let parsed = py
            .import("uuid")
            .and_then(|m| m.getattr("UUID"))
            .and_then(|uuid| uuid.call1((obj,)))
            .map_err(|e| conversion_failed(py, e, Error::Invalid(BAD)))?;
        let canonical = parsed
            .str()
            .map_err(|e| conversion_failed(py, e, Error::Invalid(BAD)))?;
        Ok(canonical
            .to_cow()
            .map_err(|_| Error::Invalid(BAD))?
            .into_owned())
    })
}

/// An optional task id.
pub fn opt_task_id(obj: Option<&Bound<'_, PyAny>>) -> Result<Option<String>> {
    match obj {
        Some(o) if !o.is_none() => task_id(o).map(Some),
        _ => Ok(None),
    }
}

fn text(obj: &Bound<'_, PyAny>, bad: &'static str) -> Result<String> {
    let s = obj.cast::<PyString>().map_err(|_| Error::Invalid(bad))?;
    Ok(s.to_cow().map_err(|_| Error::Invalid(bad))?.into_owned())
}

/// An optional string argument that must be a `str` when given.
pub fn opt_text(obj: Option<&Bound<'_, PyAny>>, bad: &'static str) -> Result<Option<String>> {
    match obj {
        Some(o) if !o.is_none() => text(o, bad).map(Some),
        _ => Ok(None),
    }
}

/// A tenant or worker name; a refusal names the argument `arg`, so a
/// caller (and the CLI, which turns it into the flag typed) knows which
/// of several names was wrong.
pub fn name(obj: &Bound<'_, PyAny>, arg: &'static str) -> Result<String> {
    let checked = text(obj, NAME_RULE).and_then(|s| validate::name(&s).map(|()| s));
    named(checked, arg, NAME_RULE)
}

/// An optional tenant or worker name, refused as [`name`] refuses.
pub fn opt_name(obj: Option<&Bound<'_, PyAny>>, arg: &'static str) -> Result<Option<String>> {
    match obj {
        Some(o) if !o.is_none() => name(o, arg).map(Some),
        _ => Ok(None),
    }
}

/// An optional payload fingerprint.
pub fn opt_payload_hash(obj: Option<&Bound<'_, PyAny>>) -> Result<Option<String>> {
    let hash = opt_text(obj, "payload_hash must be a lowercase SHA-256 hex digest")?;
    if let Some(h) = &hash {
        validate::payload_hash(h)?;
    }
    Ok(hash)
}

/// A strict bool (the peer refuses `1` for a flag); a refusal names the
/// flag in the peer's words.
pub fn flag(obj: &Bound<'_, PyAny>, name: &'static str) -> Result<bool> {
    obj.cast::<PyBool>()
        .map(pyo3::types::PyBoolMethods::is_true)
        .map_err(|_| Error::InvalidArgument(name, "must be bool"))
}

/// What the caller's clock raised, judged as the peer judges it: a
/// `TypeError`, `ValueError` or `OverflowError` means it had no valid time
/// (`InvalidInput`); anything else (Ctrl-C, a bug in the clock) reaches
/// the caller as it was raised.
pub fn clock_failed(py: Python<'_>, err: PyErr) -> Error {
    let bad_value = err.is_instance_of::<PyTypeError>(py)
        || err.is_instance_of::<PyValueError>(py)
        || err.is_instance_of::<PyOverflowError>(py);
    if bad_value {
        INVALID_TIMESTAMP
    } else {
        Error::Raised(err)
    }
}

/// A value's own conversion (`float()`, `operator.index`) failed. Any
/// error is the value's fault: bad input (`bad`). What is no error at all
/// (Ctrl-C, `SystemExit`) reaches the caller as it was raised: a retry
/// loop catching `InvalidInput` must never swallow an interrupt.
pub fn conversion_failed(py: Python<'_>, err: PyErr, bad: Error) -> Error {
    if err.is_instance_of::<PyException>(py) {
        bad
    } else {
        Error::Raised(err)
    }
}

/// `float(obj)`, with a failure judged by [`conversion_failed`].
fn float_of(obj: &Bound<'_, PyAny>, bad: Error) -> Result<f64> {
    let py = obj.py();
    py.get_type::<PyFloat>()
        .call1((obj,))
        .and_then(|f| f.extract::<f64>())
        .map_err(|e| conversion_failed(py, e, bad))
}

/// A non-negative number of seconds: anything `float()` accepts except a
/// bool, finite and at least 0 (the peer's rule). A refusal names the
/// argument (`name`), never its value.
pub fn seconds(obj: &Bound<'_, PyAny>, name: &'static str) -> Result<f64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(Error::InvalidArgument(name, validate::NOT_SECONDS));
    }
    let as_float = float_of(obj, Error::InvalidArgument(name, validate::NOT_SECONDS))?;
    validate::non_negative_seconds(as_float, name)
}

/// Optional seconds.
pub fn opt_seconds(obj: Option<&Bound<'_, PyAny>>, name: &'static str) -> Result<Option<f64>> {
    match obj {
        Some(o) if !o.is_none() => seconds(o, name).map(Some),
        _ => Ok(None),
    }
}

/// A non-negative signed 64-bit integer: an int, an integer of another
/// kind (`__index__`, as `numpy.int64` token counts are), or a float with
/// no fractional part; never a bool, a string, NaN or infinity. A refusal
/// names the argument (`name`), never its value.
pub fn amount(obj: &Bound<'_, PyAny>, name: &'static str) -> Result<i64> {
    let bad = || Error::InvalidArgument(name, "must be a non-negative 64-bit integer");
    if obj.is_instance_of::<PyBool>() {
        return Err(bad());
    }
    let value = if obj.is_instance_of::<PyInt>() {
        obj.extract::<i64>().map_err(|_| bad())?
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        let v = f.value();
        // 2^63 is exactly representable; anything at or above it overflows.
        if !v.is_finite() || v.fract() != 0.0 || !(0.0..9_223_372_036_854_775_808.0).contains(&v) {
            return Err(bad());
        }
        v as i64
    } else {
        let py = obj.py();
        py.import("operator")
            .and_then(|operator| operator.call_method1("index", (obj,)))
            .map_err(|e| conversion_failed(py, e, bad()))?
            .extract::<i64>()
            .map_err(|_| bad())?
    };
    validate::non_negative_int(value).map_err(|_| bad())
}

/// An optional amount (None = unlimited).
pub fn opt_amount(obj: Option<&Bound<'_, PyAny>>, name: &'static str) -> Result<Option<i64>> {
    match obj {
        Some(o) if !o.is_none() => amount(o, name).map(Some),
        _ => Ok(None),
    }
}

/// `converted`, with a refusal that names the argument and its rule: for
/// taskwarden's own arguments, where several of one kind (two statuses, a
/// tenant and a worker) would otherwise be refused in the same words. The
/// compatible surface keeps the peer's wording.
pub fn named<T>(converted: Result<T>, name: &'static str, rule: &'static str) -> Result<T> {
    converted.map_err(|e| match e {
        Error::Invalid(_) | Error::InvalidArgument(..) => Error::InvalidArgument(name, rule),
        other => other,
    })
}

/// The rule a refused status argument is given with [`named`].
pub const STATUS_RULE: &str = "is not a task status";
/// The rule a refused tenant or worker argument is given with [`named`].
pub const NAME_RULE: &str = "must be 1-128 characters of [A-Za-z0-9._:@-]";
/// The rule a refused task id argument is given with [`named`].
pub const ID_RULE: &str = "must be a task id (a UUID)";

/// A task status (or alias).
pub fn task_status(obj: &Bound<'_, PyAny>) -> Result<TaskStatus> {
    TaskStatus::parse(&text(obj, "unknown task status")?)
}

/// A delivery status.
pub fn delivery_status(obj: &Bound<'_, PyAny>) -> Result<DeliveryStatus> {
    DeliveryStatus::parse(&text(obj, "unknown delivery status")?)
}

/// The refusal of a clock that gave no usable time, in the peer's words.
const INVALID_TIMESTAMP: Error = Error::Invalid("clock returned an invalid timestamp");

/// A clock reading: whatever `float()` makes of it, finite. The peer
/// converts inside the same `try` as its clock call, so a conversion's
/// error is judged as the clock's own ([`clock_failed`]).
pub fn timestamp(obj: &Bound<'_, PyAny>) -> Result<f64> {
    let py = obj.py();
    let value = py
        .get_type::<PyFloat>()
        .call1((obj,))
        .and_then(|f| f.extract::<f64>())
        .map_err(|e| clock_failed(py, e))?;
    validate::timestamp(value)
}

/// Bytes to fingerprint: `str` (UTF-8) or `bytes`, nothing else.
pub fn payload_bytes(obj: &Bound<'_, PyAny>) -> Result<Vec<u8>> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(s
            .to_cow()
            .map_err(|_| Error::Invalid("payload must be str or bytes"))?
            .as_bytes()
            .to_vec());
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    Err(Error::Invalid("payload must be str or bytes"))
}

/// `storage_info()` as a dict.
pub fn storage_dict<'py>(py: Python<'py>, info: &StorageInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("journal_mode", &info.journal_mode)?;
    d.set_item("busy_timeout_ms", info.busy_timeout_ms)?;
    d.set_item("foreign_keys", info.foreign_keys)?;
    d.set_item("permission_model", info.permission_model)?;
    d.set_item("durability", info.durability)?;
    d.set_item("synchronous", info.synchronous)?;
    d.set_item("file_bytes", info.sizes.map(|(f, _)| f))?;
    d.set_item("wal_bytes", info.sizes.map(|(_, w)| w))?;
    Ok(d)
}

/// A reconcile report as a dict with the peer's keys, in the peer's order.
pub fn reconcile_dict<'py>(py: Python<'py>, r: &Report) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("dry_run", r.dry_run)?;
    d.set_item("applied", r.applied)?;
    d.set_item("active_examined", r.active_examined)?;
    d.set_item("tasks_timed_out", r.tasks_timed_out)?;
    d.set_item("fresh_active_retained", r.fresh_active_retained)?;
    d.set_item("pending_delivery_examined", r.pending_delivery_examined)?;
    d.set_item("deliveries_failed", r.deliveries_failed)?;
    d.set_item("deliveries_not_applicable", r.deliveries_not_applicable)?;
    d.set_item("pending_delivery_retained", r.pending_delivery_retained)?;
    Ok(d)
}

/// A page size (`limit` of listing and batch claims): 1 to 10,000.
pub fn page_size(obj: &Bound<'_, PyAny>) -> Result<i64> {
    match amount(obj, "limit")? {
        n @ 1..=10_000 => Ok(n),
        _ => Err(Error::InvalidArgument(
            "limit",
            "must be between 1 and 10000",
        )),
    }
}

/// An optional reason code that must at least have the registry's shape.
pub fn opt_code(obj: Option<&Bound<'_, PyAny>>) -> Result<Option<String>> {
    let code = opt_text(obj, validate::BAD_CODE_FORMAT)?;
    if let Some(c) = &code {
        validate::code_format(c)?;
    }
    Ok(code)
}

/// Three non-negative amounts: calls, tokens, cost in micro-units.
pub fn usage(
    calls: &Bound<'_, PyAny>,
    tokens: &Bound<'_, PyAny>,
    cost: &Bound<'_, PyAny>,
) -> Result<Usage> {
    Ok(Usage {
        calls: amount(calls, "calls")?,
        tokens: amount(tokens, "tokens")?,
        cost_micros: amount(cost, "cost_micros")?,
    })
}

/// A doctor report as a dict: the peer's keys plus taskwarden's counters.
pub fn doctor_dict<'py>(py: Python<'py>, r: &DoctorReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("healthy", r.healthy)?;
    d.set_item(
        "quick_check",
        if r.quick_check_ok { "ok" } else { "failed" },
    )?;
    d.set_item("schema_version", r.schema_version)?;
    d.set_item("schema_ok", r.schema_ok)?;
    d.set_item("task_count", r.task_count)?;
    d.set_item("event_count", r.event_count)?;
    d.set_item(
        "task_status_counts",
        in_table_order(
            py,
            ALL_TASK_STATUSES.map(TaskStatus::as_str),
            &r.task_status_counts,
        )?,
    )?;
    let deliveries = in_table_order(
        py,
        ALL_DELIVERY_STATUSES.map(DeliveryStatus::as_str),
        &r.delivery_status_counts,
    )?;
    d.set_item("delivery_status_counts", deliveries)?;
    for (key, value) in [
        ("orphan_count", r.orphan_count),
        ("parent_cycle_count", r.parent_cycle_count),
        ("foreign_key_error_count", r.foreign_key_error_count),
        ("state_inconsistency_count", r.state_inconsistency_count),
        ("owner_inconsistency_count", r.owner_inconsistency_count),
        ("budget_inconsistency_count", r.budget_inconsistency_count),
        (
            "timestamp_inconsistency_count",
            r.timestamp_inconsistency_count,
        ),
        ("event_inconsistency_count", r.event_inconsistency_count),
        ("event_chain_break_count", r.event_chain_break_count),
        ("doctor_error_count", r.doctor_error_count),
    ] {
        d.set_item(key, value)?;
    }
    Ok(d)
}

/// A purge report as a dict (counts only).
pub fn purge_dict<'py>(py: Python<'py>, r: &PurgeReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("dry_run", r.dry_run)?;
    d.set_item("trees_purged", r.trees_purged)?;
    d.set_item("tasks_purged", r.tasks_purged)?;
    d.set_item("events_purged", r.events_purged)?;
    d.set_item("batches", r.batches)?;
    d.set_item("longest_batch_ms", r.longest_batch_micros as f64 / 1000.0)?;
    Ok(d)
}

/// `stats()` as a dict.
pub fn stats_dict<'py>(
    py: Python<'py>,
    s: &Stats,
    sizes: Option<(u64, u64)>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("task_count", s.task_count)?;
    d.set_item("event_count", s.event_count)?;
    d.set_item(
        "by_status",
        in_table_order(py, ALL_TASK_STATUSES.map(TaskStatus::as_str), &s.by_status)?,
    )?;
    d.set_item(
        "by_delivery",
        in_table_order(
            py,
            ALL_DELIVERY_STATUSES.map(DeliveryStatus::as_str),
            &s.by_delivery,
        )?,
    )?;
    d.set_item("by_tenant", s.by_tenant.clone())?;
    d.set_item("file_bytes", sizes.map(|(f, _)| f))?;
    d.set_item("wal_bytes", sizes.map(|(_, w)| w))?;
    Ok(d)
}

/// Counts by status as a dict in the state machine's order (the peer's
/// statuses keep the peer's order), not the map's alphabetical one.
fn in_table_order<'py>(
    py: Python<'py>,
    names: impl IntoIterator<Item = &'static str>,
    counts: &std::collections::BTreeMap<&'static str, i64>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for name in names {
        d.set_item(name, counts.get(name).copied().unwrap_or(0))?;
    }
    Ok(d)
}
