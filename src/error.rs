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
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Zero { what } => write!(f, "{what} must be greater than zero"),
            ConfigError::TooLarge { what, max } => write!(f, "{what} is too large (at most {max})"),
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
            TryAcquireError::InsufficientCapacity { .. } => None,
        }
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
                "{requested} permits requested but at most {capacity} can ever be admitted at once"
            ),
        }
    }
}

impl std::error::Error for TryAcquireError {}
