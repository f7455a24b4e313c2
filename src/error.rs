//! Typed errors: bad configuration and failed acquisitions.

use crate::decision::Rejection;
use std::fmt;

/// A limiter could not be built because a parameter is out of range.
///
/// Every constructor returns this instead of panicking; the message names the parameter and the
/// allowed range.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ConfigError, RateLimiter};
///
/// let err = RateLimiter::fixed_window(0, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err, ConfigError::Zero { what: "limit" });
/// assert_eq!(err.to_string(), "limit must be greater than zero");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A count or duration that must be positive was zero.
    Zero {
        /// Which parameter.
        what: &'static str,
    },
    /// A parameter exceeds what the limiter can represent.
    TooLarge {
        /// Which parameter.
        what: &'static str,
        /// The largest accepted value, in words (for example "584 years" or "16777216").
        max: &'static str,
    },
    /// A reconfiguration asked for a different algorithm than the limiter runs. A limiter's
    /// state cannot be translated between algorithms; build a new limiter instead.
    AlgorithmChanged {
        /// The algorithm the limiter runs (for example "fixed window").
        from: &'static str,
        /// The algorithm asked for.
        to: &'static str,
    },
    /// A reconfiguration raised an exact sliding window's limit above the capacity its ring was
    /// allocated for (the limit it was built with, or the builder's `max_limit`).
    AboveMaxLimit {
        /// The limit asked for.
        limit: u32,
        /// The largest limit this limiter can take.
        max_limit: u32,
    },
    /// A parameter has a value that is not allowed (for example a Redis key prefix containing a
    /// hash-tag brace, or a share outside (0, 1]).
    Invalid {
        /// Which parameter.
        what: &'static str,
        /// What is required of it, in words.
        requirement: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Zero { what } => write!(f, "{what} must be greater than zero"),
            ConfigError::TooLarge { what, max } => write!(f, "{what} is too large (at most {max})"),
            ConfigError::AlgorithmChanged { from, to } => write!(
                f,
                "cannot reconfigure a {from} limiter as a {to}: its state cannot be translated \
                 between algorithms; build a new limiter instead"
            ),
            ConfigError::AboveMaxLimit { limit, max_limit } => write!(
                f,
                "limit {limit} is above this sliding window's max_limit of {max_limit} (its ring \
                 of timestamps is allocated once; set a larger max_limit on the builder)"
            ),
            ConfigError::Invalid { what, requirement } => {
                write!(f, "{what} is invalid: {requirement}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why a `try_acquire` did not admit.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ManualClock, Algorithm, RateLimiter, TryAcquireError};
///
/// let limiter = RateLimiter::with_clock(
///     Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(1) },
///     ManualClock::new(),
/// )?;
/// limiter.try_acquire_n(2)?;
/// match limiter.try_acquire() {
///     Err(TryAcquireError::Rejected(r)) => assert_eq!(r.retry_after(), Duration::from_secs(1)),
///     other => panic!("expected a rejection, got {other:?}"),
/// }
/// assert!(matches!(
///     limiter.try_acquire_n(3),
///     Err(TryAcquireError::InsufficientCapacity { requested: 3, capacity: 2 })
/// ));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryAcquireError {
    /// Not enough permits now; the [`Rejection`] says when there will be.
    Rejected(Rejection),
    /// `requested` permits can never be admitted at once: the limiter's capacity is smaller.
    ///
    /// This is not a rejection: retrying later cannot help.
    InsufficientCapacity {
        /// Permits asked for.
        requested: u32,
        /// The most permits one call can ever get (the limit, or the burst of a token bucket).
        capacity: u32,
    },
    /// The limiter was [closed](crate::RateLimiter::close).
    Closed,
    /// A keyed limiter holds its maximum number of keys, none of them is idle, and its overflow
    /// policy is to reject new keys
    #[cfg_attr(
        feature = "keyed",
        doc = "([`KeyOverflow::Reject`](crate::KeyOverflow::Reject))."
    )]
    #[cfg_attr(not(feature = "keyed"), doc = "(`KeyOverflow::Reject`).")]
    /// Existing keys are still served; retrying once some keys have gone idle may succeed.
    TooManyKeys {
        /// The limiter's key cap.
        max_keys: usize,
    },
    /// A distributed limiter could not reach its store (an error, or no answer within the
    /// decision's deadline) and its failure policy is to fail closed. Nothing is known to have
    /// been admitted; retrying at once is not advised (a timed-out decision may still have run).
    Unavailable,
}

impl TryAcquireError {
    /// The rejection, if this is one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ManualClock, RateLimiter};
    ///
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::SlidingWindow { limit: 1, window: Duration::from_secs(1) },
    ///     ManualClock::new(),
    /// )?;
    /// limiter.try_acquire()?;
    /// let err = limiter.try_acquire().unwrap_err();
    /// assert_eq!(err.rejection().map(|r| r.limit()), Some(1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            TryAcquireError::Rejected(r) => Some(r),
            TryAcquireError::InsufficientCapacity { .. }
            | TryAcquireError::Closed
            | TryAcquireError::TooManyKeys { .. }
            | TryAcquireError::Unavailable => None,
        }
    }

    /// For a retry loop's `acquire`: the rejection to wait out, or the error that ends the
    /// wait (every other failure: waiting cannot help).
    pub(crate) fn wait_or_fail(self) -> Result<Rejection, AcquireError> {
        Err(match self {
            TryAcquireError::Rejected(r) => return Ok(r),
            TryAcquireError::InsufficientCapacity {
                requested,
                capacity,
            } => AcquireError::InsufficientCapacity {
                requested,
                capacity,
            },
            TryAcquireError::TooManyKeys { max_keys } => AcquireError::TooManyKeys { max_keys },
            TryAcquireError::Unavailable => AcquireError::Unavailable,
            TryAcquireError::Closed => AcquireError::Closed,
        })
    }
}

impl fmt::Display for TryAcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryAcquireError::Rejected(r) => write!(
                f,
                "rate limit of {} exceeded; retry after {:?}",
                r.limit(),
                r.retry_after()
            ),
            TryAcquireError::InsufficientCapacity {
                requested,
                capacity,
            } => write!(
                f,
                "{} requested but at most {capacity} can ever be admitted at once",
                Permits(*requested)
            ),
            TryAcquireError::Closed => f.write_str("the limiter is closed"),
            TryAcquireError::TooManyKeys { max_keys } => write!(
                f,
                "the limiter already tracks its maximum of {max_keys} keys and none is idle"
            ),
            TryAcquireError::Unavailable => f.write_str(
                "the limiter's store did not answer in time (or failed) and its policy is to fail closed",
            ),
        }
    }
}

impl std::error::Error for TryAcquireError {}

/// Why an `acquire` (async or blocking) did not get its permits.
///
/// Waiting never ends in a rate rejection: a waiter stays queued until its permits are admitted, or
/// one of these happens.
///
/// # Examples
///
/// ```
/// use turnstile::{AcquireError, ConcurrencyLimiter};
///
/// let limiter = ConcurrencyLimiter::new(2)?;
/// assert_eq!(
///     limiter.acquire_blocking_n(3).unwrap_err(),
///     AcquireError::InsufficientCapacity { requested: 3, capacity: 2 }
/// );
/// limiter.close();
/// assert_eq!(limiter.acquire_blocking().unwrap_err(), AcquireError::Closed);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// `requested` permits can never be admitted at once; returned immediately, nothing queued.
    InsufficientCapacity {
        /// Permits asked for.
        requested: u32,
        /// The most permits one call can ever get.
        capacity: u32,
    },
    /// The queue could not take the waiter: it was full when the waiter arrived (oldest-first
    /// order), or the waiter was among the oldest failed to make room for newer ones (newest-first
    /// order).
    QueueFull {
        /// Permits asked for (0 for a probe, which takes one permit's room).
        requested: u32,
        /// The queue's limit, in permits.
        queue_limit: u64,
    },
    /// The limiter was closed before the permits were admitted.
    Closed,
    /// The deadline passed first; nothing was consumed.
    Timeout,
    /// A keyed limiter (or a keyed member of a
    #[cfg_attr(feature = "keyed", doc = "[`KeyedChain`](crate::KeyedChain))")]
    #[cfg_attr(not(feature = "keyed"), doc = "`KeyedChain`)")]
    /// holds its
    /// maximum number of keys, none is idle, and its overflow policy is to reject new keys
    #[cfg_attr(
        feature = "keyed",
        doc = "([`KeyOverflow::Reject`](crate::KeyOverflow::Reject)):"
    )]
    #[cfg_attr(not(feature = "keyed"), doc = "(`KeyOverflow::Reject`):")]
    /// the waiter's key could not be
    /// admitted. Returned at once.
    TooManyKeys {
        /// The limiter's key cap.
        max_keys: usize,
    },
    /// A distributed limiter could not reach its store and fails closed
    /// (see [`TryAcquireError::Unavailable`]).
    Unavailable,
}

impl fmt::Display for AcquireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireError::InsufficientCapacity {
                requested,
                capacity,
            } => write!(
                f,
                "{} requested but at most {capacity} can ever be admitted at once",
                Permits(*requested)
            ),
            // A probe waits for one permit, and takes that much room in the queue.
            AcquireError::QueueFull {
                requested: 0,
                queue_limit,
            } => write!(
                f,
                "the wait queue has no room for a probe, which waits as one permit (its limit is \
                 {queue_limit})"
            ),
            AcquireError::QueueFull {
                requested,
                queue_limit,
            } => write!(
                f,
                "the wait queue has no room for {requested} more {} (its limit is {queue_limit})",
                if *requested == 1 { "permit" } else { "permits" }
            ),
            AcquireError::Closed => f.write_str("the limiter is closed"),
            AcquireError::TooManyKeys { max_keys } => write!(
                f,
                "the limiter already tracks its maximum of {max_keys} keys and none is idle"
            ),
            AcquireError::Timeout => f.write_str("timed out waiting for permits"),
            AcquireError::Unavailable => f.write_str(
                "the limiter's store did not answer in time (or failed) and its policy is to fail closed",
            ),
        }
    }
}

impl std::error::Error for AcquireError {}

/// Why a [`ConcurrencyLimiter::try_acquire`](crate::ConcurrencyLimiter::try_acquire) did not get
/// its permits.
///
/// # Examples
///
/// ```
/// use turnstile::{ConcurrencyLimiter, TryPermitError};
///
/// let limiter = ConcurrencyLimiter::new(1)?;
/// let _held = limiter.try_acquire().unwrap();
/// assert!(matches!(limiter.try_acquire(), Err(TryPermitError::NoPermits { available: 0, .. })));
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryPermitError {
    /// Not enough permits free now (or, oldest-first, others are already waiting for them).
    NoPermits {
        /// Permits free at the time of the call (a snapshot).
        available: u32,
        /// Permits asked for.
        requested: u32,
    },
    /// `requested` exceeds the limit and can never be admitted.
    InsufficientCapacity {
        /// Permits asked for.
        requested: u32,
        /// The limit.
        capacity: u32,
    },
    /// The limiter was closed.
    Closed,
    /// A keyed concurrency limiter already holds its cap of keys, none is idle, and the overflow
    /// policy is to reject new keys.
    TooManyKeys {
        /// The cap.
        max_keys: usize,
    },
}

/// `n` permits, in words: "1 permit", "2 permits".
struct Permits(u32);

impl fmt::Display for Permits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            1 => f.write_str("1 permit"),
            n => write!(f, "{n} permits"),
        }
    }
}

impl fmt::Display for TryPermitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryPermitError::NoPermits {
                available,
                requested,
            } => write!(
                f,
                "{} requested, {available} free (or others are queued first)",
                Permits(*requested)
            ),
            TryPermitError::InsufficientCapacity {
                requested,
                capacity,
            } => write!(
                f,
                "{} requested but at most {capacity} can ever be held at once",
                Permits(*requested)
            ),
            TryPermitError::Closed => f.write_str("the limiter is closed"),
            TryPermitError::TooManyKeys { max_keys } => {
                write!(f, "the limiter already holds {max_keys} keys, none idle")
            }
        }
    }
}

impl std::error::Error for TryPermitError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count of one reads "1 permit", not "1 permits", in every message that counts them.
    #[test]
    fn one_permit_is_singular() {
        let none_free = TryPermitError::NoPermits {
            available: 0,
            requested: 1,
        };
        assert_eq!(
            none_free.to_string(),
            "1 permit requested, 0 free (or others are queued first)"
        );
        let two = TryPermitError::NoPermits {
            available: 1,
            requested: 2,
        };
        assert!(two.to_string().starts_with("2 permits requested"));
        let closed_gate = TryPermitError::InsufficientCapacity {
            requested: 1,
            capacity: 0,
        };
        assert!(
            closed_gate
                .to_string()
                .starts_with("1 permit requested but")
        );
        let too_big = TryAcquireError::InsufficientCapacity {
            requested: 1,
            capacity: 0,
        };
        assert!(too_big.to_string().starts_with("1 permit requested but"));
        let full = AcquireError::QueueFull {
            requested: 1,
            queue_limit: 0,
        };
        assert_eq!(
            full.to_string(),
            "the wait queue has no room for 1 more permit (its limit is 0)"
        );
    }
}
