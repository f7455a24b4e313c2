//! Admissions that can be given back: [`RateLimiter::try_acquire_refundable`] and
//! [`KeyedLimiter::try_acquire_refundable`] (rate-limiter-flexible's `reward`, for the work that
//! turned out not to count: a response served from cache, a request a downstream refused, a
//! login that succeeded on a limiter of failures).
//!
//! A refund is the one a [`Chain`](crate::Chain) makes when a later member rejects, with the
//! same guarantee: the limiter is never looser than if the admission had never happened. With
//! the clock where it was at the admission the refund is exact (but for the exact sliding
//! window's, which is positional, and after a charge saturated the state); later it gives back
//! what still weighs on later decisions, and nothing once the admission has stopped weighing
//! (its window ended, its ticket expired, its tokens were replenished). A [`reconfigure`]
//! between the two makes the refund give nothing back, as does any `reset` of its keyed limiter
//! (of any key).
//!
//! The receipt is the proof that the permits were taken: it is made only by an admission, is
//! neither `Clone` nor `Copy`, and `refund` consumes it, so an admission is given back at most
//! once, to the limiter that made it, for the permits it took. Dropping it keeps the permits
//! spent, as a plain admission does.
//!
//! [`reconfigure`]: RateLimiter::reconfigure

use crate::clock::Clock;
use crate::decision::Admission;
use crate::error::TryAcquireError;
use crate::limiter::RateLimiter;
use crate::sync::{ADMITTED, REJECTED};
use std::fmt;

#[cfg(feature = "keyed")]
use crate::chain::Committed;
#[cfg(feature = "keyed")]
use crate::keyed::KeyedLimiter;
#[cfg(feature = "keyed")]
use std::hash::{BuildHasher, Hash};

/// An admission of a [`RateLimiter`] that [`refund`](Self::refund) can give back, from
/// [`RateLimiter::try_acquire_refundable`]. Dropping it keeps the permits spent.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, ManualClock, RateLimiter};
///
/// let limiter = RateLimiter::with_clock(
///     Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) },
///     ManualClock::new(),
/// )?;
/// let taken = limiter.try_acquire_refundable(4)?;
/// assert_eq!(taken.admission().remaining(), 6);
/// taken.refund(); // say, the answer came from a cache
/// assert_eq!(limiter.stats().available, 10);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping it keeps the permits spent; use `try_acquire_n` when no refund can follow"]
pub struct Refundable<C: Clock> {
    limiter: RateLimiter<C>,
    n: u32,
    admission: Admission,
    /// The parameters' version read before the admission (see `receipt_refund`).
    version: u64,
}

impl<C: Clock> Refundable<C> {
    /// The admission, as [`try_acquire_n`](RateLimiter::try_acquire_n) would have returned it.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::RateLimiter;
    ///
    /// let limiter = RateLimiter::fixed_window(5, std::time::Duration::from_secs(1))?;
    /// let taken = limiter.try_acquire_refundable(2)?;
    /// assert_eq!(taken.admission().remaining(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admission(&self) -> Admission {
        self.admission
    }

    /// The permits the admission took.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::RateLimiter;
    ///
    /// let limiter = RateLimiter::fixed_window(5, std::time::Duration::from_secs(1))?;
    /// assert_eq!(limiter.try_acquire_refundable(2)?.permits(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// Gives the permits back, as far as that leaves the limiter no looser than if they had
    /// never been taken (see [`RateLimiter::try_acquire_refundable`]), and wakes the head of the
    /// limiter's queue, which the permits may now admit. Not counted in
    /// [`stats`](RateLimiter::stats): the admission stays counted as one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ManualClock, RateLimiter};
    ///
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::TokenBucket { rate: turnstile::Rate::per_second(10), burst: 10 },
    ///     ManualClock::new(),
    /// )?;
    /// let taken = limiter.try_acquire_refundable(10)?;
    /// assert!(limiter.try_acquire().is_err());
    /// taken.refund();
    /// assert!(limiter.try_acquire().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(self) {
        self.limiter
            .receipt_refund(self.n, &self.admission, self.version);
        self.limiter.chain_wake(None);
    }
}

impl<C: Clock> fmt::Debug for Refundable<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refundable")
            .field("permits", &self.n)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> RateLimiter<C> {
    /// [`try_acquire_n`](Self::try_acquire_n), with a receipt that can give the permits back:
    /// for work that may turn out not to count (rate-limiter-flexible's `reward`).
    ///
    /// [`Refundable::refund`] leaves the limiter never looser than if the admission had never
    /// happened, whatever was admitted in between: exact while the clock has not moved since the
    /// admission, and later, per algorithm,
    ///
    /// | algorithm | what a later refund gives back |
    /// |---|---|
    /// | fixed window | all n, while the clock is in the admission's window; nothing after |
    /// | sliding counter | all n, while the admission's window is the current one; after the roll-over its count weighs on the estimate until the next window ends |
    /// | token bucket (GCRA) | `n·T − elapsed` of the theoretical arrival time: the part of the admission the bucket has not yet replenished |
    /// | exact sliding window | positional, see below |
    ///
    /// The exact sliding window's log is a ring in which admission k waits for admission k − N
    /// to expire. A refund marks the admission's tickets expired where they stand (each still
    /// live and not overwritten by a [`charge`](Self::charge) that overdrew the log), so the
    /// permits come back when the ring's turn reaches them: the admissions N later than the
    /// refunded ones do not wait for them. Until then later calls are refused as if the
    /// admission stood, with the `retry_after` of the oldest ticket. Where a refund should free
    /// a permit at once, use the sliding counter, which also keeps a log's shape in O(1).
    ///
    /// Nothing is given back after a [`reconfigure`](Self::reconfigure) (the admission was made
    /// under other parameters), nor, for the fixed window and the sliding counter, once a
    /// [`charge`](Self::charge) has saturated the window's count at `u32::MAX` (it then no longer
    /// holds every admission; only a limit above 2^31 can notice), nor for the token bucket once
    /// a charge has saturated its debt (146 years ahead). The receipt is neither `Clone` nor
    /// `Copy`, and `refund` takes it by value: an admission is given back at most once, to this
    /// limiter, for its own permits.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ManualClock, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::SlidingWindow { limit: 3, window: Duration::from_secs(60) },
    ///     clock.clone(),
    /// )?;
    /// limiter.try_acquire()?; // at 0 s
    /// clock.advance(Duration::from_secs(1));
    /// let given_back = limiter.try_acquire_refundable(1)?; // at 1 s
    /// limiter.try_acquire()?; // at 1 s: the log is full
    /// given_back.refund();
    /// assert!(limiter.try_acquire().is_err(), "the next admission waits for the one at 0 s");
    /// clock.advance(Duration::from_secs(59));
    /// limiter.try_acquire()?; // at 60 s, in the place of the one at 0 s
    /// limiter.try_acquire()?; // in the refunded one's place, which it need not wait for
    /// assert!(limiter.try_acquire().is_err(), "three in the last minute");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_refundable(&self, n: u32) -> Result<Refundable<C>, TryAcquireError> {
        // Before the decision: the admission is decided under this version or a later one.
        let version = self.params_version();
        let decision = self.chain_decide::<true>(n);
        self.chain_count(if decision.is_ok() { ADMITTED } else { REJECTED });
        decision.map(|admission| Refundable {
            limiter: self.clone(),
            n,
            admission,
            version,
        })
    }
}

/// An admission of a [`KeyedLimiter`] that [`refund`](Self::refund) can give back, from
/// [`KeyedLimiter::try_acquire_refundable`]. Dropping it keeps the permits spent.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, KeyedLimiter, ManualClock};
///
/// let per_user = KeyedLimiter::with_clock(
///     Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(60) },
///     ManualClock::new(),
/// )?;
/// let taken = per_user.try_acquire_refundable(&"alice", 1)?;
/// taken.refund(); // the login succeeded: only failures count
/// assert_eq!(per_user.available(&"alice"), 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "keyed")]
#[must_use = "dropping it keeps the permits spent; use `try_acquire_n` when no refund can follow"]
pub struct KeyedRefundable<K, C: Clock, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    limiter: KeyedLimiter<K, C, S>,
    key: K,
    n: u32,
    admission: Admission,
    committed: Committed,
    /// The parameters' version read before the admission (see `receipt_refund`).
    version: u64,
}

#[cfg(feature = "keyed")]
impl<K, C: Clock, S> KeyedRefundable<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// The admission, as [`try_acquire_n`](KeyedLimiter::try_acquire_n) would have returned it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })?;
    /// assert_eq!(limiter.try_acquire_refundable(&7, 2)?.admission().remaining(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admission(&self) -> Admission {
        self.admission
    }

    /// The key the permits were taken for.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })?;
    /// assert_eq!(*limiter.try_acquire_refundable(&7, 2)?.key(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The permits the admission took.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })?;
    /// assert_eq!(limiter.try_acquire_refundable(&7, 2)?.permits(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// Gives the permits back to the key (or to the shared overflow cell, if that admitted
    /// them), as far as that leaves it no looser than if they had never been taken (see
    /// [`KeyedLimiter::try_acquire_refundable`]), and wakes the head of the key's queue. Nothing
    /// is given back after a [`reset`](KeyedLimiter::reset) (the key's cell may be a new one
    /// that never held the admission; the limiter counts resets, not resets per key, so a reset
    /// of *any* key, even one that held nothing, counts) or a
    /// [`reconfigure`](KeyedLimiter::reconfigure). Not counted in [`stats`](KeyedLimiter::stats).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, ManualClock};
    ///
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::SlidingCounter { limit: 2, window: Duration::from_secs(1) },
    ///     ManualClock::new(),
    /// )?;
    /// let taken = limiter.try_acquire_refundable(&"10.0.0.1", 2)?;
    /// assert!(limiter.try_acquire(&"10.0.0.1").is_err());
    /// taken.refund();
    /// assert!(limiter.try_acquire(&"10.0.0.1").is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(self) {
        self.limiter.receipt_refund(
            &self.key,
            self.n,
            &self.admission,
            self.committed,
            self.version,
        );
        self.limiter.chain_wake(&self.key, None);
    }
}

#[cfg(feature = "keyed")]
impl<K, C: Clock, S> fmt::Debug for KeyedRefundable<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Debug + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRefundable")
            .field("key", &self.key)
            .field("permits", &self.n)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "keyed")]
impl<K, C: Clock, S> KeyedLimiter<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// [`try_acquire_n`](Self::try_acquire_n), with a receipt that can give the permits back
    /// to `key`: for work that may turn out not to count (rate-limiter-flexible's `reward`).
    /// What a refund gives back, per algorithm, is as for
    /// [`RateLimiter::try_acquire_refundable`]; the key's cell may be evicted meanwhile (only
    /// once the admission no longer weighs on it, so the refund then finds nothing of it and
    /// writes nothing), and a [`reset`](Self::reset) (of any key: resets are counted per
    /// limiter) or a [`reconfigure`](Self::reconfigure) makes the refund give nothing back. The
    /// key is cloned into the receipt.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, ManualClock};
    ///
    /// // Five failed logins per user a minute: each attempt takes a permit, a success gives it back.
    /// let failures = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(60) },
    ///     ManualClock::new(),
    /// )?;
    /// for password_ok in [false, true, false, true, false, false, true, false] {
    ///     let taken = failures.try_acquire_refundable(&"alice", 1)?;
    ///     if password_ok {
    ///         taken.refund();
    ///     }
    /// }
    /// assert_eq!(failures.available(&"alice"), 0); // five failures, three refunds
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_refundable(
        &self,
        key: &K,
        n: u32,
    ) -> Result<KeyedRefundable<K, C, S>, TryAcquireError> {
        // Before the decision, as for a `Refundable`.
        let version = self.params_version();
        let (decision, committed) = self.chain_decide::<true>(key, n);
        self.chain_count(if decision.is_ok() { ADMITTED } else { REJECTED });
        decision.map(|admission| KeyedRefundable {
            limiter: self.clone(),
            key: key.clone(),
            n,
            admission,
            committed,
            version,
        })
    }
}
