//! The budget guard's one atomic write (SPEC §4): a charge either fits the
//! task and every ancestor and is added to all of them, or nothing is
//! charged and the task is force-escalated. Never raises for state reasons.

use rusqlite::Transaction;

use crate::budget::{self, Dimension, Misfit};
use crate::errors::{Error, Result};
use crate::fsm::TaskStatus;
use crate::task::{TaskRow, Usage};
use crate::tasks::{self, Clock, Columns, Fence};

/// Why a charge was not added (or, for a budget read, why a one-call
/// charge would not be): what a worker logs when it stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A limit (or a full counter) of the task or an ancestor; see
    /// `Outcome::exhausted`.
    Budget,
    /// The task is not running (queued, parked or ended).
    NotRunning,
    /// The caller's claim (`worker=`, `attempt=`) is not the task's: another
    /// claim holds it, or none (it went back to the queue).
    ClaimLost,
}

impl Refusal {
    /// The name `Charge.refused` reports.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Budget => "budget",
            Refusal::NotRunning => "not_running",
            Refusal::ClaimLost => "claim_lost",
        }
    }
}

/// What a charge (or a budget read) found.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// `None`: added (for a budget read: a one-call charge would be).
    pub refused: Option<Refusal>,
    pub escalated: bool,
    /// The dimension that ran out, and the task (this one or an ancestor)
    /// whose limit it is: the one an operator grants more to.
    pub exhausted: Option<(Dimension, String)>,
    pub task: TaskRow,
}

/// Charges `amount` to `id` and every ancestor, or escalates `id`.
pub fn charge(
    tx: &Transaction<'_>,
    id: &str,
    amount: Usage,
    fence: &Fence,
    clock: Clock<'_>,
) -> Result<Outcome> {
    let task = tasks::get(tx, id)?;
    if let Some(refusal) = state_refusal(&task, fence) {
        // Refused: nothing changes, and the figures are `budget`'s.
        return Ok(Outcome {
            refused: Some(refusal),
            escalated: false,
            exhausted: spent_on(&chain_of(tx, &task)?),
            task,
        });
    }
    if amount == Usage::default() {
        return Ok(Outcome {
            refused: None,
            escalated: false,
            exhausted: None,
            task,
        });
    }
    let chain = chain_of(tx, &task)?;
    let judged = chain
        .iter()
        .map(|node| budget::add(node.usage, node.limits, amount))
        .collect::<Vec<_>>();
    if let Some(stop) = first_misfit(&chain, &judged) {
        return escalate(tx, task, stop, fence, clock);
    }
    let grown = judged
        .into_iter()
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| Error::Internal("a misfit was missed"))?;
    Ok(Outcome {
        refused: None,
        escalated: false,
        exhausted: None,
        task: add_to_chain(tx, &chain, grown)?,
    })
}

/// Where on the chain a charge does not fit, and in which dimension. Every
/// node is judged before anything is raised.
fn first_misfit(
    chain: &[TaskRow],
    judged: &[std::result::Result<Usage, Misfit>],
) -> Option<(Dimension, String)> {
    named_on_chain(chain, judged.iter().map(|j| j.err()))
}

/// Each node's misfit (nearest first), named as an operator is shown it
/// (see [`budget::named_first`]), with the task it was found on.
fn named_on_chain(
    chain: &[TaskRow],
    misfits: impl Iterator<Item = Option<Misfit>>,
) -> Option<(Dimension, String)> {
    let found = misfits
        .zip(chain)
        .filter_map(|(misfit, node)| misfit.map(|m| (m, node)));
    budget::named_first(found).map(|(misfit, node)| (misfit.dimension(), node.id.clone()))
}

/// A charge that would pass `stop` (a dimension and the task whose limit
/// it is): nothing is charged, and the task is force-escalated.
fn escalate(
    tx: &Transaction<'_>,
    task: TaskRow,
    stop: (Dimension, String),
    fence: &Fence,
    clock: Clock<'_>,
) -> Result<Outcome> {
    let now = clock()?;
    if now < task.latest_timestamp() {
        // Time only moves forward, so a clock behind the task's stored
        // times (a step back, another host) may not date the escalation.
        // A charge never raises for state: it is refused and nothing
        // changes; the first charge past the limit once the clock has
        // caught up escalates.
        return Ok(Outcome {
            refused: Some(Refusal::Budget),
            escalated: false,
            exhausted: Some(stop),
            task,
        });
    }
    let parked = tasks::transition(
        tx,
        &task,
        TaskStatus::Escalated,
        Some("budget_exhausted"),
        fence.worker.as_deref(),
        now,
    )?;
    Ok(Outcome {
        refused: Some(Refusal::Budget),
        escalated: true,
        exhausted: Some(stop),
        task: parked,
    })
}

/// Stores each node's grown usage, the charged task first; returns it.
fn add_to_chain(tx: &Transaction<'_>, chain: &[TaskRow], grown: Vec<Usage>) -> Result<TaskRow> {
    let mut charged = None;
    for (node, usage) in chain.iter().zip(grown) {
        let mut next = node.clone();
        next.usage = usage;
        next.version = node.next_version()?;
        tasks::save(tx, node, &next, Columns::Budget)?;
        charged.get_or_insert(next);
    }
    charged.ok_or(Error::Internal("empty charge chain"))
}

/// The same figures without charging: `allowed` says whether a one-call
/// charge (no tokens, no cost) would pass now, `exhausted` which limit (own
/// or an ancestor's) is already used up. A dimension at its limit refuses
/// only charges of that dimension, so the two can differ.
pub fn read(tx: &Transaction<'_>, id: &str) -> Result<Outcome> {
    let task = tasks::get(tx, id)?;
    let chain = chain_of(tx, &task)?;
    let one_call = Usage {
        calls: 1,
        ..Usage::default()
    };
    let fits = chain
        .iter()
        .all(|node| budget::add(node.usage, node.limits, one_call).is_ok());
    let refused = match (state_refusal(&task, &Fence::default()), fits) {
        (Some(refusal), _) => Some(refusal),
        (None, false) => Some(Refusal::Budget),
        (None, true) => None,
    };
    Ok(Outcome {
        refused,
        escalated: false,
        exhausted: spent_on(&chain),
        task,
    })
}

/// Why a charge to `task` is refused before its budget is looked at: a
/// fenced caller whose claim is not the task's own (another claim holds
/// it, or none since it went back to the queue) has lost it; otherwise a
/// task that is not running, ended or parked under the caller's own claim
/// too (a cancel, a block, a reconcile): its status says which.
fn state_refusal(task: &TaskRow, fence: &Fence) -> Option<Refusal> {
    if fence.check(task).is_err() {
        Some(Refusal::ClaimLost)
    } else if task.status != TaskStatus::Running {
        Some(Refusal::NotRunning)
    } else {
        None
    }
}

/// The task and its ancestors, nearest first: every budget a charge to the
/// task must fit.
fn chain_of(tx: &Transaction<'_>, task: &TaskRow) -> Result<Vec<TaskRow>> {
    Ok(std::iter::once(task.clone())
        .chain(tasks::ancestors(tx, task)?)
        .collect())
}

/// What on the chain is used up, named as a charge's refusal names it.
fn spent_on(chain: &[TaskRow]) -> Option<(Dimension, String)> {
    named_on_chain(
        chain,
        chain
            .iter()
            .map(|node| budget::spent(node.usage, node.limits)),
    )
}
