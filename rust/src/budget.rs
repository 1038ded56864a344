//! The budget guard's arithmetic (SPEC §4): does a charge fit a task and
//! every ancestor, and which dimension ran out. Pure and checked: no sum
//! can overflow, a refused charge changes nothing.

use crate::errors::{Error, Result};
use crate::task::{Limits, Usage};

/// A budget dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dimension {
    Calls,
    Tokens,
    Cost,
}

impl Dimension {
    /// The name `Charge.exhausted` reports.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Calls => "calls",
            Dimension::Tokens => "tokens",
            Dimension::Cost => "cost",
        }
    }
}

/// Why a charge does not fit one task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misfit {
    /// The sum would pass the dimension's limit (a grant can raise it).
    OverLimit(Dimension),
    /// The dimension is unlimited, but its counter cannot hold the sum
    /// (`i64`): as full as a passed limit. What filled it is the ledger's
    /// state (a sibling's use, rolled up), not the charge's amount, which
    /// is valid input; and a charge never raises for state.
    CounterFull(Dimension),
}

impl Misfit {
    /// The dimension that does not fit.
    #[must_use]
    pub fn dimension(self) -> Dimension {
        match self {
            Misfit::OverLimit(dim) | Misfit::CounterFull(dim) => dim,
        }
    }
}

/// Usage after adding `amount`, or why it does not fit: the first
/// dimension whose limit the sum would pass, else the first unlimited one
/// whose counter could not hold it (a limit is what an operator can
/// grant, so it is named first). A sum beyond `i64` never fits a limit.
pub fn add(used: Usage, limits: Limits, amount: Usage) -> std::result::Result<Usage, Misfit> {
    let dims = [
        (Dimension::Calls, used.calls, limits.calls, amount.calls),
        (Dimension::Tokens, used.tokens, limits.tokens, amount.tokens),
        (
            Dimension::Cost,
            used.cost_micros,
            limits.cost_micros,
            amount.cost_micros,
        ),
    ];
    let mut sums = [0i64; 3];
    let mut full = None;
    for (i, (dim, u, limit, a)) in dims.into_iter().enumerate() {
        match (u.checked_add(a), limit) {
            (Some(sum), Some(l)) if sum > l => return Err(Misfit::OverLimit(dim)),
            (Some(sum), _) => sums[i] = sum,
            (None, Some(_)) => return Err(Misfit::OverLimit(dim)),
            (None, None) => {
                full.get_or_insert(Misfit::CounterFull(dim));
            }
        }
    }
    if let Some(full) = full {
        return Err(full);
    }
    Ok(Usage {
        calls: sums[0],
        tokens: sums[1],
        cost_micros: sums[2],
    })
}

/// What a grant adds to each limit: nothing to an unlimited one, which
/// stays unlimited. Its event records this, not what was asked, so that
/// the history says what the grant changed.
#[must_use]
pub fn granted(limits: Limits, asked: Usage) -> Usage {
    let to = |limit: Option<i64>, by: i64| if limit.is_some() { by } else { 0 };
    Usage {
        calls: to(limits.calls, asked.calls),
        tokens: to(limits.tokens, asked.tokens),
        cost_micros: to(limits.cost_micros, asked.cost_micros),
    }
}

/// Limits raised by a grant; an unlimited dimension stays unlimited.
pub fn raise(limits: Limits, grant: Usage) -> Result<Limits> {
    const OVERFLOW: Error = Error::Invalid("grant would overflow a limit");
    let up = |limit: Option<i64>, by: i64| -> Result<Option<i64>> {
        limit.map(|l| l.checked_add(by).ok_or(OVERFLOW)).transpose()
    };
    Ok(Limits {
        calls: up(limits.calls, grant.calls)?,
        tokens: up(limits.tokens, grant.tokens)?,
        cost_micros: up(limits.cost_micros, grant.cost_micros)?,
    })
}

/// What nothing more can be charged of: the first dimension where one
/// more unit would not fit ([`add`]'s judgement), a limit before a full
/// unlimited counter.
#[must_use]
pub fn spent(used: Usage, limits: Limits) -> Option<Misfit> {
    let unit = |calls, tokens, cost_micros| Usage {
        calls,
        tokens,
        cost_micros,
    };
    let misfits = [unit(1, 0, 0), unit(0, 1, 0), unit(0, 0, 1)]
        .map(|one| add(used, limits, one).err())
        .into_iter()
        .flatten()
        .map(|misfit| (misfit, ()));
    named_first(misfits).map(|(misfit, ())| misfit)
}

/// Of misfits in order (each with where it was found), the one an operator
/// is shown: the first passed limit (what a grant can raise), else the
/// first full unlimited counter.
pub fn named_first<T>(misfits: impl Iterator<Item = (Misfit, T)>) -> Option<(Misfit, T)> {
    let mut first = None;
    for found in misfits {
        if matches!(found.0, Misfit::OverLimit(_)) {
            return Some(found);
        }
        first.get_or_insert(found);
    }
    first
}

/// What is left of each limited dimension (`Charge.*_remaining`): the
/// task's own limit minus its own use (SPEC 2.2.1), `None` where unlimited.
/// Never an overflow, even for a damaged row.
#[must_use]
pub fn remaining(used: Usage, limits: Limits) -> Limits {
    let left = |limit: Option<i64>, used: i64| limit.map(|l| l.saturating_sub(used));
    Limits {
        calls: left(limits.calls, used.calls),
        tokens: left(limits.tokens, used.tokens),
        cost_micros: left(limits.cost_micros, used.cost_micros),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remaining_is_the_limit_less_the_use_and_never_wraps() {
        let limits = Limits {
            calls: Some(25),
            tokens: None,
            cost_micros: Some(i64::MAX),
        };
        let left = remaining(usage(3, i64::MAX, 0), limits);
        assert_eq!(left.calls, Some(22));
        assert_eq!(left.tokens, None);
        assert_eq!(left.cost_micros, Some(i64::MAX));
        let damaged = remaining(usage(i64::MIN, 0, -1), limits);
        assert_eq!(
            (damaged.calls, damaged.cost_micros),
            (Some(i64::MAX), Some(i64::MAX))
        );
    }

    fn usage(calls: i64, tokens: i64, cost_micros: i64) -> Usage {
        Usage {
            calls,
            tokens,
            cost_micros,
        }
    }

    fn limits(calls: Option<i64>, tokens: Option<i64>, cost: Option<i64>) -> Limits {
        Limits {
            calls,
            tokens,
            cost_micros: cost,
        }
    }

    #[test]
    fn exactly_the_limit_fits_and_one_more_does_not() {
        let l = limits(Some(25), None, None);
        assert_eq!(add(usage(24, 0, 0), l, usage(1, 0, 0)), Ok(usage(25, 0, 0)));
        assert_eq!(
            add(usage(25, 0, 0), l, usage(1, 0, 0)),
            Err(Misfit::OverLimit(Dimension::Calls))
        );
        assert_eq!(add(usage(25, 0, 0), l, usage(0, 0, 0)), Ok(usage(25, 0, 0)));
    }

    #[test]
    fn dimensions_are_checked_in_order() {
        let l = limits(Some(10), Some(100), Some(5));
        assert_eq!(
            add(usage(0, 100, 5), l, usage(1, 1, 1)),
            Err(Misfit::OverLimit(Dimension::Tokens))
        );
        assert_eq!(
            add(usage(0, 0, 5), l, usage(1, 1, 1)),
            Err(Misfit::OverLimit(Dimension::Cost))
        );
    }

    #[test]
    fn i64_edges_never_overflow() -> Result<()> {
        let max = i64::MAX;
        assert_eq!(
            add(
                usage(max, 0, 0),
                limits(Some(max), None, None),
                usage(1, 0, 0)
            ),
            Err(Misfit::OverLimit(Dimension::Calls))
        );
        assert_eq!(
            add(
                usage(max - 1, 0, 0),
                limits(Some(max), None, None),
                usage(1, 0, 0)
            ),
            Ok(usage(max, 0, 0))
        );
        assert!(raise(limits(Some(max), None, None), usage(1, 0, 0)).is_err());
        assert_eq!(
            raise(limits(Some(1), None, Some(2)), usage(1, 5, 3))?,
            limits(Some(2), None, Some(5))
        );
        Ok(())
    }

    #[test]
    fn a_full_unlimited_counter_refuses_like_a_limit_named_after_one() {
        let max = i64::MAX;
        let none = limits(None, None, None);
        assert_eq!(
            add(usage(0, max - 1, 0), none, usage(0, 1, 0)),
            Ok(usage(0, max, 0))
        );
        assert_eq!(
            add(usage(0, max, 0), none, usage(0, 1, 0)),
            Err(Misfit::CounterFull(Dimension::Tokens))
        );
        // A passed limit is named first, even when an earlier, unlimited
        // dimension of the same charge could not hold its sum: a limit is
        // what a grant can raise.
        assert_eq!(
            add(
                usage(max, 0, 5),
                limits(None, None, Some(5)),
                usage(1, 0, 1)
            ),
            Err(Misfit::OverLimit(Dimension::Cost))
        );
        assert_eq!(
            spent(usage(0, max, 0), none),
            Some(Misfit::CounterFull(Dimension::Tokens))
        );
        assert_eq!(spent(usage(0, max - 1, 0), none), None);
        assert_eq!(
            spent(usage(max, 3, 0), limits(None, Some(3), None)),
            Some(Misfit::OverLimit(Dimension::Tokens))
        );
    }

    #[test]
    fn spent_reports_the_exhausted_dimension() {
        assert_eq!(
            spent(usage(3, 0, 0), limits(Some(3), None, None)),
            Some(Misfit::OverLimit(Dimension::Calls))
        );
        assert_eq!(
            spent(usage(2, 10, 0), limits(Some(3), Some(10), None)),
            Some(Misfit::OverLimit(Dimension::Tokens))
        );
        assert_eq!(spent(usage(2, 9, 0), limits(Some(3), Some(10), None)), None);
    }
}
