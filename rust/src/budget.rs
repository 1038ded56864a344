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

/// Usage after adding `amount`, or the first dimension whose limit the sum
/// would pass. A sum beyond `i64` can never fit a limit; on an unlimited
/// dimension it is refused as input, since the counter could not hold it.
pub fn add(
    used: Usage,
    limits: Limits,
    amount: Usage,
) -> Result<std::result::Result<Usage, Dimension>> {
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
    let mut overflow = false;
    for (i, (dim, u, limit, a)) in dims.into_iter().enumerate() {
        match (u.checked_add(a), limit) {
            (Some(sum), Some(l)) if sum > l => return Ok(Err(dim)),
            (Some(sum), _) => sums[i] = sum,
            (None, Some(_)) => return Ok(Err(dim)),
            // Judged after every limit: a passed limit escalates first.
            (None, None) => overflow = true,
        }
    }
    if overflow {
        return Err(Error::Invalid("charge would overflow a usage counter"));
    }
    Ok(Ok(Usage {
        calls: sums[0],
        tokens: sums[1],
        cost_micros: sums[2],
    }))
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

/// The first dimension already at its limit, if any: nothing more of it
/// can be charged.
#[must_use]
pub fn spent(used: Usage, limits: Limits) -> Option<Dimension> {
    [
        (Dimension::Calls, used.calls, limits.calls),
        (Dimension::Tokens, used.tokens, limits.tokens),
        (Dimension::Cost, used.cost_micros, limits.cost_micros),
    ]
    .into_iter()
    .find(|(_, u, l)| l.is_some_and(|l| *u >= l))
    .map(|(d, _, _)| d)
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
    fn exactly_the_limit_fits_and_one_more_does_not() -> Result<()> {
        let l = limits(Some(25), None, None);
        assert_eq!(
            add(usage(24, 0, 0), l, usage(1, 0, 0))?,
            Ok(usage(25, 0, 0))
        );
        assert_eq!(
            add(usage(25, 0, 0), l, usage(1, 0, 0))?,
            Err(Dimension::Calls)
        );
        assert_eq!(
            add(usage(25, 0, 0), l, usage(0, 0, 0))?,
            Ok(usage(25, 0, 0))
        );
        Ok(())
    }

    #[test]
    fn dimensions_are_checked_in_order() -> Result<()> {
        let l = limits(Some(10), Some(100), Some(5));
        assert_eq!(
            add(usage(0, 100, 5), l, usage(1, 1, 1))?,
            Err(Dimension::Tokens)
        );
        assert_eq!(
            add(usage(0, 0, 5), l, usage(1, 1, 1))?,
            Err(Dimension::Cost)
        );
        Ok(())
    }

    #[test]
    fn i64_edges_never_overflow() -> Result<()> {
        let max = i64::MAX;
        assert_eq!(
            add(
                usage(max, 0, 0),
                limits(Some(max), None, None),
                usage(1, 0, 0)
            )?,
            Err(Dimension::Calls)
        );
        assert_eq!(
            add(
                usage(max - 1, 0, 0),
                limits(Some(max), None, None),
                usage(1, 0, 0)
            )?,
            Ok(usage(max, 0, 0))
        );
        assert!(add(usage(0, max, 0), limits(None, None, None), usage(0, 1, 0)).is_err());
        // A passed limit is the answer even when an earlier, unlimited
        // dimension of the same charge would overflow.
        assert_eq!(
            add(
                usage(max, 0, 5),
                limits(None, None, Some(5)),
                usage(1, 0, 1)
            )?,
            Err(Dimension::Cost)
        );
        assert!(raise(limits(Some(max), None, None), usage(1, 0, 0)).is_err());
        assert_eq!(
            raise(limits(Some(1), None, Some(2)), usage(1, 5, 3))?,
            limits(Some(2), None, Some(5))
        );
        Ok(())
    }

    #[test]
    fn spent_reports_the_exhausted_dimension() {
        assert_eq!(
            spent(usage(3, 0, 0), limits(Some(3), None, None)),
            Some(Dimension::Calls)
        );
        assert_eq!(
            spent(usage(2, 10, 0), limits(Some(3), Some(10), None)),
            Some(Dimension::Tokens)
        );
        assert_eq!(spent(usage(2, 9, 0), limits(Some(3), Some(10), None)), None);
    }
}
