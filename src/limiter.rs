//! [`RateLimiter`]: the handle users hold.

use crate::algorithm::{FixedWindow, SlidingCounter, SlidingWindow, TokenBucket};
use crate::clock::{Clock, DefaultClock};
use crate::decision::Admission;
use crate::error::{ConfigError, TryAcquireError};
use crate::sync::{Arc, Counters, ADMITTED, REJECTED};
use std::fmt;
use std::time::Duration;

/// A rate: `permits` per `period`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::Rate;
///
/// assert_eq!(Rate::per_second(10), Rate::new(10, Duration::from_secs(1)));
/// assert_eq!(Rate::per_minute(60).period, Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    /// Permits per period.
    pub permits: u32,
    /// The period.
    pub period: Duration,
}

impl Rate {
    /// `permits` per `period`.
    pub const fn new(permits: u32, period: Duration) -> Self {
        Rate { permits, period }
    }

    /// `permits` per second.
    pub const fn per_second(permits: u32) -> Self {
        Rate::new(permits, Duration::from_secs(1))
    }

    /// `permits` per minute.
    pub const fn per_minute(permits: u32) -> Self {
        Rate::new(permits, Duration::from_secs(60))
    }

    /// `permits` per hour.
    pub const fn per_hour(permits: u32) -> Self {
        Rate::new(permits, Duration::from_secs(3600))
    }
}

/// Which algorithm a limiter runs, with its parameters.
///
/// | algorithm | exactness | memory | bursts |
/// |---|---|---|---|
/// | `FixedWindow` | ≤ limit per aligned window; up to 2 × limit across a boundary | 8 bytes | a full window's worth at each boundary |
/// | `SlidingWindow` | ≤ limit in *every* interval of length window | 8 bytes × limit | up to limit at once, then paced by expiry |
/// | `SlidingCounter` | approximate: < 2 × limit in any window-long interval, typically within a few % | 24 bytes | like the sliding window, smoothed |
/// | `TokenBucket` | GCRA: ≤ burst + rate × t in any interval of length t | 8 bytes | up to burst, refilled continuously |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, Rate, RateLimiter};
///
/// let per_user = Algorithm::TokenBucket { rate: Rate::per_second(5), burst: 10 };
/// let limiter = RateLimiter::new(per_user)?;
/// assert_eq!(limiter.algorithm(), per_user);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// At most `limit` permits per window; windows aligned to the clock's epoch.
    FixedWindow {
        /// Permits per window.
        limit: u32,
        /// Window length.
        window: Duration,
    },
    /// Exact sliding log: at most `limit` permits in any interval of length `window`.
    /// `limit` is at most 16,777,216 (the ring costs 8 bytes per permit).
    SlidingWindow {
        /// Permits per window.
        limit: u32,
        /// Window length.
        window: Duration,
    },
    /// Sliding window counter: two weighted counts, O(1) memory for any limit.
    SlidingCounter {
        /// Permits per window.
        limit: u32,
        /// Window length.
        window: Duration,
    },
    /// GCRA token bucket: a sustained `rate` with bursts of up to `burst` permits.
    ///
    /// The time per permit (`period / permits`) is rounded *up* to a whole nanosecond, so the
    /// long-run rate never exceeds the configured one. The shortfall is under 0.1 % for rates up to
    /// 10^6 per second; rates above 10^9 per second are served at 10^9 per second.
    TokenBucket {
        /// The sustained rate.
        rate: Rate,
        /// Bucket size: the most permits admitted at once.
        burst: u32,
    },
}

pub(crate) enum State {
    Fixed(FixedWindow),
    Sliding(SlidingWindow),
    Counter(SlidingCounter),
    Bucket(TokenBucket),
}

impl State {
    pub(crate) fn new(algorithm: Algorithm) -> Result<Self, ConfigError> {
        Ok(match algorithm {
            Algorithm::FixedWindow { limit, window } => {
                State::Fixed(FixedWindow::new(limit, window)?)
            }
            Algorithm::SlidingWindow { limit, window } => {
                State::Sliding(SlidingWindow::new(limit, window)?)
            }
            Algorithm::SlidingCounter { limit, window } => {
                State::Counter(SlidingCounter::new(limit, window)?)
            }
            Algorithm::TokenBucket { rate, burst } => State::Bucket(TokenBucket::new(rate, burst)?),
        })
    }

    // Always inlined: the caller knows the clock type, and an out-of-line call returns the whole
    // `Result` through memory, which costs more than the decision (see BENCHMARKS.md).
    #[inline(always)]
    pub(crate) fn try_acquire<C: Clock>(
        &self,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        match self {
            State::Fixed(s) => s.try_acquire(n, clock),
            State::Sliding(s) => s.try_acquire(n, clock),
            State::Counter(s) => s.try_acquire(n, clock),
            State::Bucket(s) => s.try_acquire(n, clock),
        }
    }

    pub(crate) fn available(&self, now: u64) -> u32 {
        match self {
            State::Fixed(s) => s.available(now),
            State::Sliding(s) => s.available(now),
            State::Counter(s) => s.available(now),
            State::Bucket(s) => s.available(now),
        }
    }

    pub(crate) fn limit(&self) -> u32 {
        match self {
            State::Fixed(s) => s.limit(),
            State::Sliding(s) => s.limit(),
            State::Counter(s) => s.limit(),
            State::Bucket(s) => s.limit(),
        }
    }
}

/// Counts kept by a limiter.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, ManualClock, RateLimiter};
///
/// let limiter = RateLimiter::with_clock(
///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) },
///     ManualClock::new(),
/// )?;
/// let _ = limiter.try_acquire();
/// let _ = limiter.try_acquire();
/// let stats = limiter.stats();
/// assert_eq!((stats.admitted, stats.rejected, stats.available), (1, 1, 0));
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Successful `try_acquire` calls (probes with n = 0 included).
    pub admitted: u64,
    /// Failed `try_acquire` calls: rejections and requests that can never fit.
    pub rejected: u64,
    /// Permits that could be admitted right now. A snapshot: approximate while other threads are
    /// acquiring.
    pub available: u32,
}

/// A rate limiter: one of the four [`Algorithm`]s over one [`Clock`].
///
/// Cloning is cheap and clones share state. `try_acquire` never blocks, never allocates after a
/// thread's first call, and on rejection writes no shared memory.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::RateLimiter;
///
/// let limiter = RateLimiter::sliding_window(2, Duration::from_secs(2))?;
/// assert!(limiter.try_acquire().is_ok());
/// assert!(limiter.try_acquire().is_ok());
/// let err = limiter.try_acquire().unwrap_err();
/// let retry = err.rejection().unwrap().retry_after();
/// assert!(retry > Duration::from_millis(1900) && retry <= Duration::from_secs(2));
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
pub struct RateLimiter<C: Clock = DefaultClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    state: State,
    algorithm: Algorithm,
    clock: C,
    counters: Counters,
}

impl<C: Clock> Clone for RateLimiter<C> {
    fn clone(&self) -> Self {
        RateLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C: Clock> fmt::Debug for RateLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("algorithm", &self.inner.algorithm)
            .finish_non_exhaustive()
    }
}

impl RateLimiter<DefaultClock> {
    /// A limiter running `algorithm` on the [`DefaultClock`].
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if a parameter is zero or too large.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, RateLimiter};
    ///
    /// let limiter = RateLimiter::new(Algorithm::SlidingCounter {
    ///     limit: 1_000_000,
    ///     window: Duration::from_secs(60),
    /// })?;
    /// assert!(limiter.try_acquire().is_ok());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn new(algorithm: Algorithm) -> Result<Self, ConfigError> {
        Self::with_clock(algorithm, DefaultClock::new())
    }

    /// At most `limit` permits per aligned window of length `window`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if `limit` or `window` is zero, or `window` exceeds 584 years.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::RateLimiter;
    ///
    /// let limiter = RateLimiter::fixed_window(100, Duration::from_secs(1))?;
    /// assert_eq!(limiter.try_acquire()?.remaining(), 99);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fixed_window(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        Self::new(Algorithm::FixedWindow { limit, window })
    }

    /// At most `limit` permits in any interval of length `window` (exact; `limit` ≤ 16,777,216).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if `limit` or `window` is zero or too large.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::RateLimiter;
    ///
    /// let limiter = RateLimiter::sliding_window(10, Duration::from_secs(1))?;
    /// assert_eq!(limiter.try_acquire_n(4)?.remaining(), 6);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sliding_window(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        Self::new(Algorithm::SlidingWindow { limit, window })
    }

    /// The sliding window counter: O(1) memory for any limit, approximate (see [`Algorithm`]).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if `limit` or `window` is zero or `window` is too large.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::RateLimiter;
    ///
    /// let limiter = RateLimiter::sliding_counter(1_000_000, Duration::from_secs(60))?;
    /// assert_eq!(limiter.try_acquire()?.remaining(), 999_999);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sliding_counter(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        Self::new(Algorithm::SlidingCounter { limit, window })
    }

    /// A GCRA token bucket: `rate` sustained, bursts of up to `burst`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if a parameter is zero or `burst × period / permits` exceeds ~146 years.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::token_bucket(Rate::per_second(100), 20)?;
    /// assert_eq!(limiter.try_acquire_n(20)?.remaining(), 0);
    /// assert!(limiter.try_acquire().is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn token_bucket(rate: Rate, burst: u32) -> Result<Self, ConfigError> {
        Self::new(Algorithm::TokenBucket { rate, burst })
    }
}

impl<C: Clock> RateLimiter<C> {
    /// A limiter running `algorithm` on `clock`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if a parameter is zero or too large.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ManualClock, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::SlidingWindow { limit: 1, window: Duration::from_secs(1) },
    ///     clock.clone(),
    /// )?;
    /// limiter.try_acquire()?;
    /// clock.advance(Duration::from_millis(400));
    /// let err = limiter.try_acquire().unwrap_err();
    /// assert_eq!(err.rejection().unwrap().retry_after(), Duration::from_millis(600));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_clock(algorithm: Algorithm, clock: C) -> Result<Self, ConfigError> {
        Ok(RateLimiter {
            inner: Arc::new(Inner {
                state: State::new(algorithm)?,
                algorithm,
                clock,
                counters: Counters::new(),
            }),
        })
    }

    /// Takes one permit if one is available now. Never blocks.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Rejected`] with the exact time until a permit frees.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::RateLimiter;
    ///
    /// let limiter = RateLimiter::fixed_window(1, Duration::from_secs(60))?;
    /// assert!(limiter.try_acquire().is_ok());
    /// assert!(limiter.try_acquire().is_err());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    #[inline(always)]
    pub fn try_acquire(&self) -> Result<Admission, TryAcquireError> {
        self.try_acquire_n(1)
    }

    /// Takes `n` permits at once if they are all available now; otherwise takes none. Never blocks.
    ///
    /// `n == 0` is a probe: admitted iff at least one permit is available, consuming nothing.
    ///
    /// # Errors
    ///
    /// - [`TryAcquireError::Rejected`]: not enough permits now; `retry_after` is the exact time until
    ///   `n` permits could be admitted if nothing else is.
    /// - [`TryAcquireError::InsufficientCapacity`]: `n` exceeds the limit (or burst) and can never be
    ///   admitted.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{RateLimiter, TryAcquireError};
    ///
    /// let limiter = RateLimiter::sliding_window(5, Duration::from_secs(1))?;
    /// assert_eq!(limiter.try_acquire_n(0)?.remaining(), 5); // a probe takes nothing
    /// assert_eq!(limiter.try_acquire_n(5)?.remaining(), 0);
    /// assert!(matches!(limiter.try_acquire_n(6), Err(TryAcquireError::InsufficientCapacity { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn try_acquire_n(&self, n: u32) -> Result<Admission, TryAcquireError> {
        let inner = &*self.inner;
        let decision = inner.state.try_acquire(n, &inner.clock);
        inner
            .counters
            .bump(if decision.is_ok() { ADMITTED } else { REJECTED });
        decision
    }

    /// Counts so far and the permits available now.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::RateLimiter;
    ///
    /// let limiter = RateLimiter::sliding_counter(10, Duration::from_secs(1))?;
    /// limiter.try_acquire_n(3).unwrap();
    /// assert_eq!(limiter.stats().admitted, 1);
    /// assert!(limiter.stats().available <= 7);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let inner = &*self.inner;
        Stats {
            admitted: inner.counters.sum(ADMITTED),
            rejected: inner.counters.sum(REJECTED),
            available: inner.state.available(inner.clock.now()),
        }
    }

    /// The algorithm and parameters this limiter was built with.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, RateLimiter};
    ///
    /// let limiter = RateLimiter::fixed_window(3, Duration::from_secs(1))?;
    /// assert!(matches!(limiter.algorithm(), Algorithm::FixedWindow { limit: 3, .. }));
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }

    /// The most permits one call can get: the limit, or the burst of a token bucket.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::token_bucket(Rate::per_second(10), 3)?;
    /// assert_eq!(limiter.capacity(), 3);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn capacity(&self) -> u32 {
        self.inner.state.limit()
    }

    /// The clock this limiter reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Clock, ManualClock, RateLimiter};
    ///
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) },
    ///     ManualClock::new(),
    /// )?;
    /// limiter.clock().advance(Duration::from_secs(5));
    /// assert_eq!(limiter.clock().now(), 5_000_000_000);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }
}
