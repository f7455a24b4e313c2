//! Admissions that can be given back: [`RateLimiter::try_acquire_refundable`] and
//! `KeyedLimiter::try_acquire_refundable` (rate-limiter-flexible's `reward`, for the work that
//! turned out not to count: a response served from cache, a request a downstream refused, a
//! login that succeeded on a limiter of failures), and their waiting counterparts
//! (`acquire_refundable(n).await`, `acquire_refundable_timeout`, `acquire_blocking_refundable`,
//! `acquire_blocking_refundable_timeout`), for a caller that waits its turn in the queue and
//! then finds the work unnecessary.
//!
//! A waiting call's admission, made at once or by the head of the queue, is the very decision
//! `try_acquire_refundable` makes (the algorithm's commit for a `RateLimiter`, a chain member's
//! commit for a `KeyedLimiter`), with the parameters' version read just before it: its receipt
//! is as good, and its refund as safe.
//!
//! A refund is the one a [`Chain`](crate::Chain) makes when a later member rejects, with the
//! same guarantee: the limiter is never looser than if the admission had never happened. With
//! the clock where it was at the admission the refund is exact (but for the exact sliding
//! window's, which is positional, and after a charge saturated the state); later it gives back
//! what still weighs on later decisions, and nothing once the admission has stopped weighing
//! (its window ended, its ticket expired, its tokens were replenished). A [`reconfigure`]
//! between the two makes the refund give nothing back, as does any `reset` of its keyed limiter
//! (of any key), unless the shared overflow cell made the admission: no reset touches that cell,
//! which gets its permits back.
//!
//! Chains have receipts of their own, which give every member its permits back under these rules:
//! [`ChainRefundable`](crate::ChainRefundable) and `KeyedChainRefundable`.
//!
//! The receipt is the proof that the permits were taken: it is made only by an admission, is
//! neither `Clone` nor `Copy`, and `refund` consumes it, so an admission is given back at most
//! once, to the limiter that made it, for the permits it took. Dropping it keeps the permits
//! spent, as a plain admission does.
//!
//! [`reconfigure`]: RateLimiter::reconfigure

use crate::clock::Clock;
use crate::decision::Admission;
use crate::error::{AcquireError, TryAcquireError};
use crate::limiter::RateLimiter;
use crate::sync::{ADMITTED, REJECTED};
use std::fmt;
#[cfg(feature = "tokio")]
use std::future::Future;
#[cfg(feature = "tokio")]
use std::task::Poll;
use std::time::Duration;

#[cfg(feature = "keyed")]
use crate::chain::Committed;
#[cfg(feature = "keyed")]
use crate::keyed::KeyedLimiter;
#[cfg(feature = "keyed")]
use std::hash::{BuildHasher, Hash};

/// An admission of a [`RateLimiter`] that [`refund`](Self::refund) can give back, from
/// [`RateLimiter::try_acquire_refundable`] or a waiting call
#[cfg_attr(
    feature = "tokio",
    doc = "([`acquire_refundable`](RateLimiter::acquire_refundable)"
)]
#[cfg_attr(not(feature = "tokio"), doc = "(`acquire_refundable`")]
/// and its timeout and blocking
/// variants). Dropping it keeps the permits spent.
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
#[must_use = "dropping it keeps the permits spent; use `try_acquire_n` or `acquire_n` when no refund can follow"]
pub struct Refundable<C: Clock> {
    limiter: RateLimiter<C>,
    n: u32,
    admission: Admission,
    /// The parameters' version read before the admission (see `receipt_refund`).
    version: u64,
}

impl<C: Clock> Refundable<C> {
    /// The admission, as [`try_acquire_n`](RateLimiter::try_acquire_n) (or, for a waiting call,
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](RateLimiter::acquire_n))")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`)")]
    /// would have returned it.
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
    /// holds every admission; only a limit above 2^31 can notice), or admissions have filled a
    /// window of limit `u32::MAX` to that count (which reads the same), nor for the token bucket
    /// once a charge has saturated its debt (146 years ahead; an admission that empties a bucket
    /// of the largest capacity at the clock's cap of 2^62 ns reads the same). The receipt is
    /// neither `Clone` nor `Copy`, and `refund` takes it by value: an admission is given back at
    /// most once, to this limiter, for its own permits.
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

    /// The receipt for an admission and the version read before it.
    fn receipt(&self, n: u32, (admission, version): (Admission, u64)) -> Refundable<C> {
        Refundable {
            limiter: self.clone(),
            n,
            admission,
            version,
        }
    }

    /// [`acquire_n`](Self::acquire_n), with a receipt that can give the permits back: for a
    /// caller that waits its turn and then finds the work unnecessary (rate-limiter-flexible's
    /// `RateLimiterQueue` followed by `reward`, .NET's lease given back).
    ///
    /// Waits as `acquire_n` does, in the same fair queue (a caller admitted at once never
    /// touches it), and is counted as it is. The admission, made at once or by the head of the
    /// queue, is the one `try_acquire_refundable` makes, and its receipt is as good: the
    /// parameters' version is read just before each attempt, so a
    /// [`reconfigure`](Self::reconfigure) while the caller waited leaves the refund of an
    /// admission made after it whole, and one after the admission makes it give nothing back.
    /// What [`Refundable::refund`] gives back, per algorithm and over time, is as for
    /// [`try_acquire_refundable`](Self::try_acquire_refundable).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`acquire_n`](Self::acquire_n): a future dropped while it waits holds
    /// nothing (the permits are taken only in the poll that returns the receipt), frees its
    /// place in the queue and, if it was the head, wakes the next waiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, RateLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::SlidingCounter { limit: 1, window: Duration::from_secs(1) },
    ///     TokioClock::new(),
    /// )?;
    /// limiter.acquire().await?;
    /// let taken = limiter.acquire_refundable(1).await?; // waits for its turn
    /// let already_done = true; // say, another worker did the job meanwhile
    /// if already_done {
    ///     taken.refund();
    /// }
    /// assert!(limiter.try_acquire().is_ok(), "the permit went to the next caller");
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub fn acquire_refundable(
        &self,
        n: u32,
    ) -> impl Future<Output = Result<Refundable<C>, AcquireError>> + Send + '_ {
        crate::queue::Acquire::new(RefundableAcquire { limiter: self, n })
    }

    /// [`acquire_refundable`](Self::acquire_refundable) with a time limit; on timeout nothing is
    /// consumed and the waiter has left the queue.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n), and [`AcquireError::Timeout`] when `timeout` passes
    /// first.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`acquire_refundable`](Self::acquire_refundable).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{AcquireError, Algorithm, RateLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(10) },
    ///     TokioClock::new(),
    /// )?;
    /// let taken = limiter.acquire_refundable_timeout(2, Duration::from_secs(1)).await?;
    /// let late = limiter.acquire_refundable_timeout(1, Duration::from_secs(1)).await;
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// taken.refund();
    /// assert_eq!(limiter.stats().available, 2);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_refundable_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> Result<Refundable<C>, AcquireError> {
        crate::queue::timeout(timeout, self.acquire_refundable(n)).await
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n), with a receipt that can give the
    /// permits back: the blocking counterpart of
    #[cfg_attr(
        feature = "tokio",
        doc = "[`acquire_refundable`](Self::acquire_refundable),"
    )]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_refundable`,")]
    /// in the same queue, with a receipt as
    /// good.
    ///
    /// # Errors
    ///
    /// As
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n).")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`.")]
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::RateLimiter;
    ///
    /// let limiter = RateLimiter::fixed_window(3, Duration::from_secs(3600))?;
    /// let taken = limiter.acquire_blocking_refundable(3)?;
    /// assert!(limiter.try_acquire().is_err());
    /// taken.refund(); // say, the batch turned out empty
    /// assert_eq!(limiter.try_acquire_n(3)?.remaining(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_refundable(&self, n: u32) -> Result<Refundable<C>, AcquireError> {
        self.receipt_blocking(n, None)
            .map(|admitted| self.receipt(n, admitted))
    }

    /// [`acquire_blocking_refundable`](Self::acquire_blocking_refundable) with a time limit
    /// (real time); on timeout nothing is consumed and the waiter leaves the queue.
    ///
    /// # Errors
    ///
    /// As
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n),")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`,")]
    /// and [`AcquireError::Timeout`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{AcquireError, RateLimiter};
    ///
    /// let limiter = RateLimiter::fixed_window(1, Duration::from_secs(3600))?;
    /// let taken = limiter.acquire_blocking_refundable_timeout(1, Duration::from_millis(10))?;
    /// let late = limiter.acquire_blocking_refundable_timeout(1, Duration::from_millis(10));
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// taken.refund();
    /// assert!(limiter.try_acquire().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_refundable_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> Result<Refundable<C>, AcquireError> {
        self.receipt_blocking(n, std::time::Instant::now().checked_add(timeout))
            .map(|admitted| self.receipt(n, admitted))
    }
}

/// The two halves of [`RateLimiter::acquire_refundable`].
#[cfg(feature = "tokio")]
struct RefundableAcquire<'a, C: Clock> {
    limiter: &'a RateLimiter<C>,
    n: u32,
}

#[cfg(feature = "tokio")]
impl<'a, C: Clock> crate::queue::Phases<'a> for RefundableAcquire<'a, C> {
    type Output = Refundable<C>;

    #[inline(always)]
    fn fast(&mut self) -> Poll<Result<Refundable<C>, AcquireError>> {
        let (limiter, n) = (self.limiter, self.n);
        limiter
            .receipt_fast(n)
            .map(|outcome| outcome.map(|admitted| limiter.receipt(n, admitted)))
    }

    fn slow(&mut self) -> crate::queue::SlowWait<'a, Refundable<C>> {
        let (limiter, n) = (self.limiter, self.n);
        Box::pin(async move {
            let admitted = limiter.receipt_slow(n).await?;
            Ok(limiter.receipt(n, admitted))
        })
    }
}

/// An admission of a [`KeyedLimiter`] that [`refund`](Self::refund) can give back, from
/// [`KeyedLimiter::try_acquire_refundable`] or a waiting call
#[cfg_attr(
    feature = "tokio",
    doc = "([`acquire_refundable`](KeyedLimiter::acquire_refundable)"
)]
#[cfg_attr(not(feature = "tokio"), doc = "(`acquire_refundable`")]
/// and its timeout and blocking
/// variants). Dropping it keeps the permits spent.
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
#[must_use = "dropping it keeps the permits spent; use `try_acquire_n` or `acquire_n` when no refund can follow"]
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
    /// The admission, as [`try_acquire_n`](KeyedLimiter::try_acquire_n) (or, for a waiting call,
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](KeyedLimiter::acquire_n))")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`)")]
    /// would have returned it.
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

    /// Whether the permits were taken from `limiter` (a handle to the same limiter).
    #[cfg(feature = "http")]
    pub(crate) fn is_from(&self, limiter: &KeyedLimiter<K, C, S>) -> bool {
        self.limiter.chain_same(limiter)
    }

    /// Whether the shared overflow cell admitted the permits (the key was new to the limiter
    /// at its key cap, under [`KeyOverflow::Shared`](crate::KeyOverflow::Shared)).
    #[cfg(feature = "http")]
    pub(crate) fn overflowed(&self) -> bool {
        self.committed.overflow
    }

    /// Gives the permits back to the key (or to the shared overflow cell, if that admitted
    /// them), as far as that leaves it no looser than if they had never been taken (see
    /// [`KeyedLimiter::try_acquire_refundable`]), and wakes the head of the key's queue (of
    /// every key's queue for the overflow cell, whose waiters wait in their own keys', and
    /// under [`KeyOverflow::Shared`](crate::KeyOverflow::Shared) when the refund leaves the key
    /// idle at the key cap: its slot can then go to a key waiting on that cell). Nothing
    /// is given back after a [`reset`](KeyedLimiter::reset) (the key's cell may be a new one
    /// that never held the admission; the limiter counts resets, not resets per key, so a reset
    /// of *any* key, even one that held nothing, counts; but a refund to the shared overflow
    /// cell, which no reset touches, is made all the same) or a
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
        self.limiter
            .chain_wake(&self.key, self.committed.overflow, None);
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
    /// limiter; not for an admission of the shared overflow cell, which no reset touches) or a
    /// [`reconfigure`](Self::reconfigure) makes the refund give nothing back. The key is cloned
    /// into the receipt.
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

    /// The receipt for a commit on `key`, with the version read before it.
    fn receipt(
        &self,
        key: &K,
        n: u32,
        (admission, committed, version): (Admission, Committed, u64),
    ) -> KeyedRefundable<K, C, S> {
        KeyedRefundable {
            limiter: self.clone(),
            key: key.clone(),
            n,
            admission,
            committed,
            version,
        }
    }

    /// [`acquire_n`](Self::acquire_n), with a receipt that can give the permits back to `key`:
    /// for a caller that waits its turn and then finds the work unnecessary
    /// (rate-limiter-flexible's `RateLimiterQueue` followed by `reward`).
    ///
    /// Waits as `acquire_n` does, in the key's own fair queue, and is counted as it is. The
    /// admission, made at once or by the head of the key's queue, is the commit
    /// [`try_acquire_refundable`](Self::try_acquire_refundable) makes (the shared overflow cell
    /// at the key cap included), and its receipt is as good: the parameters' version and the
    /// reset count are read just before each attempt, so what a later refund gives back, and
    /// when it gives nothing (a [`reset`](Self::reset) or a
    /// [`reconfigure`](Self::reconfigure) after the admission, an eviction), are as for
    /// `try_acquire_refundable`. A reconfiguration or reset while the caller still waited does
    /// not void the receipt of an admission made after it. The key is cloned into the receipt.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`acquire_n`](Self::acquire_n): a future dropped while it waits holds
    /// nothing (the permits are taken only in the poll that returns the receipt), frees its
    /// place in the key's queue and, if it was the head, wakes the next waiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // One export per user a minute; an export that finds nothing new does not count.
    /// let exports = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(60) },
    ///     TokioClock::new(),
    /// )?;
    /// exports.acquire(&"alice").await?;
    /// let taken = exports.acquire_refundable(&"alice", 1).await?; // the next minute
    /// let nothing_new = true;
    /// if nothing_new {
    ///     taken.refund();
    /// }
    /// assert_eq!(exports.available(&"alice"), 1);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub fn acquire_refundable<'a>(
        &'a self,
        key: &'a K,
        n: u32,
    ) -> impl Future<Output = Result<KeyedRefundable<K, C, S>, AcquireError>> + Send + 'a {
        crate::queue::Acquire::new(KeyedRefundableAcquire {
            limiter: self,
            key,
            n,
            overflowed: false,
        })
    }

    /// [`acquire_refundable`](Self::acquire_refundable) with a time limit; on timeout nothing
    /// is consumed and the waiter has left the key's queue.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n), and [`AcquireError::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`acquire_refundable`](Self::acquire_refundable).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{AcquireError, Algorithm, KeyedLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::SlidingWindow { limit: 1, window: Duration::from_secs(10) },
    ///     TokioClock::new(),
    /// )?;
    /// let taken = limiter.acquire_refundable_timeout(&"k", 1, Duration::from_secs(1)).await?;
    /// let late = limiter.acquire_refundable_timeout(&"k", 1, Duration::from_secs(1)).await;
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// assert_eq!(limiter.stats().waiting, 0);
    /// taken.refund(); // its ticket is marked expired, and the next admission waits for it
    /// assert!(limiter.try_acquire(&"k").is_ok());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_refundable_timeout(
        &self,
        key: &K,
        n: u32,
        timeout: Duration,
    ) -> Result<KeyedRefundable<K, C, S>, AcquireError> {
        crate::queue::timeout(timeout, self.acquire_refundable(key, n)).await
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n), with a receipt that can give the
    /// permits back to `key`: the blocking counterpart of
    #[cfg_attr(
        feature = "tokio",
        doc = "[`acquire_refundable`](Self::acquire_refundable),"
    )]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_refundable`,")]
    /// in the same per-key queue, with a
    /// receipt as good.
    ///
    /// # Errors
    ///
    /// As
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n).")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`.")]
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(3600) })?;
    /// let taken = limiter.acquire_blocking_refundable(&"batch-7", 2)?;
    /// taken.refund(); // say, the batch was empty
    /// assert_eq!(limiter.available(&"batch-7"), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_refundable(
        &self,
        key: &K,
        n: u32,
    ) -> Result<KeyedRefundable<K, C, S>, AcquireError> {
        self.receipt_blocking(key, n, None)
            .map(|committed| self.receipt(key, n, committed))
    }

    /// [`acquire_blocking_refundable`](Self::acquire_blocking_refundable) with a time limit
    /// (real time); on timeout nothing is consumed and the waiter leaves the key's queue.
    ///
    /// # Errors
    ///
    /// As
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n),")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`,")]
    /// and [`AcquireError::Timeout`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{AcquireError, Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(3600) })?;
    /// let taken = limiter.acquire_blocking_refundable_timeout(&"k", 1, Duration::from_millis(10))?;
    /// let late = limiter.acquire_blocking_refundable_timeout(&"k", 1, Duration::from_millis(10));
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// taken.refund();
    /// assert_eq!(limiter.available(&"k"), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_refundable_timeout(
        &self,
        key: &K,
        n: u32,
        timeout: Duration,
    ) -> Result<KeyedRefundable<K, C, S>, AcquireError> {
        self.receipt_blocking(key, n, std::time::Instant::now().checked_add(timeout))
            .map(|committed| self.receipt(key, n, committed))
    }
}

/// The two halves of [`KeyedLimiter::acquire_refundable`].
#[cfg(all(feature = "keyed", feature = "tokio"))]
struct KeyedRefundableAcquire<'a, K, C: Clock, S> {
    limiter: &'a KeyedLimiter<K, C, S>,
    key: &'a K,
    n: u32,
    /// The fast path counted the call in the limiter's `overflowed`.
    overflowed: bool,
}

#[cfg(all(feature = "keyed", feature = "tokio"))]
impl<'a, K, C: Clock, S> crate::queue::Phases<'a> for KeyedRefundableAcquire<'a, K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    type Output = KeyedRefundable<K, C, S>;

    #[inline(always)]
    fn fast(&mut self) -> Poll<Result<KeyedRefundable<K, C, S>, AcquireError>> {
        let (limiter, key, n) = (self.limiter, self.key, self.n);
        let (outcome, overflowed) = limiter.receipt_fast(key, n);
        self.overflowed = overflowed;
        outcome.map(|outcome| outcome.map(|committed| limiter.receipt(key, n, committed)))
    }

    fn slow(&mut self) -> crate::queue::SlowWait<'a, KeyedRefundable<K, C, S>> {
        let (limiter, key, n, overflowed) = (self.limiter, self.key, self.n, self.overflowed);
        Box::pin(async move {
            let committed = limiter.receipt_slow(key, n, overflowed).await?;
            Ok(limiter.receipt(key, n, committed))
        })
    }
}
