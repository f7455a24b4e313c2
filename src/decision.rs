//! What a limiter answers: an [`Admission`] or a [`Rejection`].
//!
//! Both are small `Copy` values (24 and 16 bytes) of raw integers; durations are converted when asked
//! for. Keeping them small matters: the whole `Result` is returned on every call.

use std::time::Duration;

/// A successful acquisition: what an HTTP layer needs for its rate-limit headers.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, ManualClock, RateLimiter};
///
/// let clock = ManualClock::new();
/// let limiter = RateLimiter::with_clock(
///     Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) },
///     clock.clone(),
/// )?;
/// clock.advance(Duration::from_millis(250));
/// let ok = limiter.try_acquire_n(3)?;
/// assert_eq!(ok.remaining(), 7);
/// assert_eq!(ok.reset_after(), Duration::from_millis(750));
/// assert_eq!(ok.at(), Duration::from_millis(250));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy)]
pub struct Admission {
    at: u64,
    reset_after: u64,
    remaining: u32,
    /// What a [`Chain`](crate::Chain) needs to give this admission back, beyond `at`: for the
    /// exact sliding window, the ring slot of the first ticket (bits 0..24), 7 bits of the
    /// parameters' version it was decided under (bits 24..31) and its lap parity (bit 31); for
    /// the other algorithms, the version of the parameters it was decided under (a refund after
    /// a reconfiguration gives nothing back). It sits in what would otherwise be padding, so the
    /// admission stays 24 bytes. Not part of equality or `Debug`: it names no property of the
    /// admission a caller can observe.
    token: u32,
}

impl PartialEq for Admission {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.reset_after, self.remaining)
            == (other.at, other.reset_after, other.remaining)
    }
}

impl Eq for Admission {}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("at", &self.at)
            .field("reset_after", &self.reset_after)
            .field("remaining", &self.remaining)
            .finish()
    }
}

impl Admission {
    #[inline(always)]
    pub(crate) fn new(at: u64, reset_after: u64, remaining: u32) -> Self {
        Admission {
            at,
            reset_after,
            remaining,
            token: 0,
        }
    }

    /// An admission carrying a refund token (see the field).
    #[inline(always)]
    pub(crate) fn with_token(at: u64, reset_after: u64, remaining: u32, token: u32) -> Self {
        Admission {
            at,
            reset_after,
            remaining,
            token,
        }
    }

    /// [`reset_after`](Self::reset_after) in whole nanoseconds.
    #[inline]
    pub(crate) fn reset_after_nanos(&self) -> u64 {
        self.reset_after
    }

    /// The refund token (see the field).
    #[inline]
    pub(crate) fn token(&self) -> u32 {
        self.token
    }

    /// Permits that could still be admitted right now, after this admission.
    ///
    /// Exact for a quiescent limiter; under concurrent use it is a snapshot taken at the admission.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use turnstile::{Algorithm, ManualClock, RateLimiter};
    /// #
    /// # let clock = ManualClock::new();
    /// # let limiter = RateLimiter::with_clock(
    /// #     Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) },
    /// #     clock.clone(),
    /// # )?;
    /// # clock.advance(Duration::from_millis(400));
    /// // A fixed window of 5 per second; 2 permits taken 400 ms into its first window.
    /// let ok = limiter.try_acquire_n(2)?;
    /// assert_eq!(ok.remaining(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Time until the limiter is back to its full capacity if nothing else is admitted: the end of
    /// the window (fixed window), the expiry of this admission (sliding window), or the time the
    /// bucket is full again (token bucket). At least 2^62 ns if no clock reading gets there
    /// (see [`Rejection::retry_after`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use turnstile::{Algorithm, ManualClock, RateLimiter};
    /// #
    /// # let clock = ManualClock::new();
    /// # let limiter = RateLimiter::with_clock(
    /// #     Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) },
    /// #     clock.clone(),
    /// # )?;
    /// # clock.advance(Duration::from_millis(400));
    /// // A fixed window of 5 per second; 2 permits taken 400 ms into its first window.
    /// let ok = limiter.try_acquire_n(2)?;
    /// // The fixed window ends at 1 s.
    /// assert_eq!(ok.reset_after(), Duration::from_millis(600));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after)
    }

    /// When the limiter admitted this call, as time since its clock's epoch.
    ///
    /// For the sliding window this is the time its log keeps (as this time plus the window): the
    /// exactness contract ("at most `limit` admissions in any interval of length `window`") holds
    /// on these values. For a [`Chain`](crate::Chain), the latest of the members' times.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use turnstile::{Algorithm, ManualClock, RateLimiter};
    /// #
    /// # let clock = ManualClock::new();
    /// # let limiter = RateLimiter::with_clock(
    /// #     Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) },
    /// #     clock.clone(),
    /// # )?;
    /// # clock.advance(Duration::from_millis(400));
    /// // A fixed window of 5 per second; 2 permits taken 400 ms into its first window.
    /// let ok = limiter.try_acquire_n(2)?;
    /// assert_eq!(ok.at(), Duration::from_millis(400));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn at(&self) -> Duration {
        Duration::from_nanos(self.at)
    }

    /// [`at`](Self::at) in whole nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use turnstile::{Algorithm, ManualClock, RateLimiter};
    /// #
    /// # let clock = ManualClock::new();
    /// # let limiter = RateLimiter::with_clock(
    /// #     Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) },
    /// #     clock.clone(),
    /// # )?;
    /// # clock.advance(Duration::from_millis(400));
    /// // A fixed window of 5 per second; 2 permits taken 400 ms into its first window.
    /// let ok = limiter.try_acquire_n(2)?;
    /// assert_eq!(ok.at_nanos(), 400_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn at_nanos(&self) -> u64 {
        self.at
    }
}

/// A rejection: when to try again, and the limit that was hit.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, ManualClock, Rate, RateLimiter};
///
/// let limiter = RateLimiter::with_clock(
///     Algorithm::TokenBucket { rate: Rate::per_second(4), burst: 1 },
///     ManualClock::new(),
/// )?;
/// limiter.try_acquire()?;
/// let rejection = *limiter.try_acquire().unwrap_err().rejection().unwrap();
/// assert_eq!(rejection.retry_after(), Duration::from_millis(250));
/// assert_eq!(rejection.limit(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    retry_after: u64,
    limit: u32,
}

impl Rejection {
    #[inline]
    pub(crate) fn new(retry_after: u64, limit: u32) -> Self {
        Rejection { retry_after, limit }
    }

    /// The exact time until the requested permits could be admitted, if nothing else is admitted
    /// meanwhile. Never rounded: an HTTP layer rounds up to whole seconds itself.
    ///
    /// A call refused because others are queued first (no barging, see
    /// [`RateLimiter::try_acquire_n`](crate::RateLimiter::try_acquire_n)) gets a lower bound
    /// instead, which counts the permits the queue will take before it (see there).
    ///
    /// A wait no clock reading ends is at least 2^62 ns (about 146 years): a limiter full at the
    /// end of its time (the token bucket and the exact sliding window cap readings at 2^62 − 1 ns,
    /// the windows' grid saturates at `u64::MAX` ns: a `ManualClock` advanced by `Duration::MAX`)
    /// stays full, and says so rather than a few nanoseconds that a waiter would retry for ever.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use turnstile::{Algorithm, ManualClock, Rate, RateLimiter};
    /// #
    /// # let limiter = RateLimiter::with_clock(
    /// #     Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 2 },
    /// #     ManualClock::new(),
    /// # )?;
    /// # limiter.try_acquire_n(2)?;
    /// // A token bucket of 10 per second, burst 2, just emptied.
    /// let rejection = *limiter.try_acquire().unwrap_err().rejection().unwrap();
    /// // One token comes back every 100 ms.
    /// assert_eq!(rejection.retry_after(), Duration::from_millis(100));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after)
    }

    /// [`retry_after`](Self::retry_after) in whole nanoseconds.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use turnstile::{Algorithm, ManualClock, Rate, RateLimiter};
    /// #
    /// # let limiter = RateLimiter::with_clock(
    /// #     Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 2 },
    /// #     ManualClock::new(),
    /// # )?;
    /// # limiter.try_acquire_n(2)?;
    /// // A token bucket of 10 per second, burst 2, just emptied.
    /// let rejection = *limiter.try_acquire().unwrap_err().rejection().unwrap();
    /// assert_eq!(rejection.retry_after_nanos(), 100_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_after_nanos(&self) -> u64 {
        self.retry_after
    }

    /// The limit that was hit: the window limit, or the burst of a token bucket.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use turnstile::{Algorithm, ManualClock, Rate, RateLimiter};
    /// #
    /// # let limiter = RateLimiter::with_clock(
    /// #     Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 2 },
    /// #     ManualClock::new(),
    /// # )?;
    /// # limiter.try_acquire_n(2)?;
    /// // A token bucket of 10 per second, burst 2, just emptied.
    /// let rejection = *limiter.try_acquire().unwrap_err().rejection().unwrap();
    /// // A token bucket reports its burst.
    /// assert_eq!(rejection.limit(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limit(&self) -> u32 {
        self.limit
    }
}
