//! Chain admissions that can be given back: [`Chain::try_acquire_refundable`] and
//! `KeyedChain::try_acquire_refundable`, and their waiting counterparts
//! (`acquire_refundable(n).await`, `acquire_refundable_timeout`, `acquire_blocking_refundable`,
//! `acquire_blocking_refundable_timeout`): the single limiters' receipts (`crate::refund`), for a
//! call that every member admitted.
//!
//! The admission is the chain's own all-or-nothing attempt, unchanged; a receipt attempt also
//! reads every member's parameters' version before it decides anything, as a member's own
//! receipt reads its version before its admission, and keeps, per member, the admission its
//! commit returned and what a refund of it needs ([`Committed`]: the shared overflow cell, the
//! reset count). A refund then gives each member its permits back through that member's own
//! receipt refund (`RateLimiter::receipt_refund`, `KeyedLimiter::receipt_refund`): the version
//! compared under the member's reconfiguration mutex, the reset count compared for a keyed one.
//! Each member decides alone, so a reconfiguration (or a reset) of one member voids only that
//! member's refund. The members' queues and the chain callers sleeping on them are woken once
//! every member has its permits back, as after a chain's own refund (`Core::wake`).
//!
//! Nothing here is a new atomic protocol: per member, the version is loaded before the commit
//! and the refund is that member's receipt refund, in the order a member's own receipt uses.

use super::{Chain, Committed, Core, Line, Member, Slots};
use crate::clock::Clock;
use crate::decision::Admission;
use crate::error::{AcquireError, TryAcquireError};
use std::fmt;
use std::time::Duration;

#[cfg(feature = "keyed")]
use super::KeyedChain;
#[cfg(feature = "keyed")]
use std::hash::{BuildHasher, Hash};

/// What a chain receipt's attempt took from each member (indexed by member), to give back: the
/// commit's admission, what the commit returned beside it, and the member's parameters' version
/// read before the attempt.
struct Held {
    admissions: Box<[Admission]>,
    flags: Box<[Committed]>,
    versions: Box<[u64]>,
}

impl Held {
    fn new(members: usize) -> Self {
        Held {
            admissions: vec![Admission::new(0, 0, 0); members].into_boxed_slice(),
            flags: vec![Committed::default(); members].into_boxed_slice(),
            versions: vec![0; members].into_boxed_slice(),
        }
    }

    /// Every slot an attempt can fill.
    fn slots(&mut self) -> Slots<'_> {
        Slots {
            admissions: Some(&mut self.admissions),
            flags: Some(&mut self.flags),
            versions: Some(&mut self.versions),
        }
    }
}

impl<L, W> Core<L, W> {
    /// `try_acquire`, keeping what a receipt needs.
    fn try_acquire_held<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
    ) -> Result<(Admission, Held), TryAcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let mut held = Held::new(self.members.len());
        let admission = self.try_acquire(key, n, held.slots())?;
        Ok((admission, held))
    }

    /// `acquire`, keeping what a receipt needs (the admitting attempt's).
    #[cfg(feature = "tokio")]
    async fn acquire_held<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
    ) -> Result<(Admission, Held), AcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let mut held = Held::new(self.members.len());
        let admission = self.acquire(key, n, held.slots()).await?;
        Ok((admission, held))
    }

    /// `acquire_blocking`, keeping what a receipt needs (the admitting attempt's).
    fn acquire_blocking_held<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<(Admission, Held), AcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let mut held = Held::new(self.members.len());
        let admission = self.acquire_blocking(key, n, held.slots(), deadline)?;
        Ok((admission, held))
    }

    /// Gives every member (every listing of a limiter listed twice: each took `n`) its own
    /// commit's permits back through its receipt refund, then wakes them all: only once every
    /// refund is done, as `give_back` does, since a `Waker` may panic. A probe (`n == 0`) took
    /// nothing and gives nothing. Not counted: the call stays counted as admitted.
    fn refund_held<Q: ?Sized>(&self, key: &Q, n: u32, held: &Held)
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        if n == 0 {
            return;
        }
        for (i, member) in self.members.iter().enumerate() {
            member.receipt_refund(key, n, &held.admissions[i], held.flags[i], held.versions[i]);
        }
        let overflow = held.flags.iter().map(|flag| flag.overflow);
        self.wake(key, overflow.enumerate(), None);
    }
}

/// An admission of a [`Chain`] that [`refund`](Self::refund) can give back to every member,
/// from [`Chain::try_acquire_refundable`] or a waiting call
#[cfg_attr(
    feature = "tokio",
    doc = "([`acquire_refundable`](Chain::acquire_refundable)"
)]
#[cfg_attr(not(feature = "tokio"), doc = "(`acquire_refundable`")]
/// and its timeout and blocking variants).
/// Dropping it keeps the permits spent.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, Chain, ManualClock, RateLimiter};
///
/// let clock = ManualClock::new();
/// let per_second = RateLimiter::with_clock(Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(1) }, clock.clone())?;
/// let per_hour = RateLimiter::with_clock(Algorithm::FixedWindow { limit: 100, window: Duration::from_secs(3600) }, clock)?;
/// let chain = Chain::new([per_second.clone(), per_hour.clone()])?;
/// let taken = chain.try_acquire_refundable(2)?;
/// taken.refund(); // say, the answer came from a cache
/// assert_eq!((per_second.stats().available, per_hour.stats().available), (2, 100));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping it keeps the permits spent; use `try_acquire_n` or `acquire_n` when no refund can follow"]
pub struct ChainRefundable<C: Clock> {
    chain: Chain<C>,
    n: u32,
    admission: Admission,
    held: Held,
}

impl<C: Clock> ChainRefundable<C> {
    /// The admission, as [`Chain::try_acquire_n`] (or, for a waiting call,
    #[cfg_attr(feature = "tokio", doc = "[`Chain::acquire_n`])")]
    #[cfg_attr(not(feature = "tokio"), doc = "`Chain::acquire_n`)")]
    /// would have returned it: the members' combined.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Chain, RateLimiter};
    ///
    /// let chain = Chain::new([
    ///     RateLimiter::fixed_window(5, Duration::from_secs(1))?,
    ///     RateLimiter::fixed_window(3, Duration::from_secs(60))?,
    /// ])?;
    /// assert_eq!(chain.try_acquire_refundable(2)?.admission().remaining(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admission(&self) -> Admission {
        self.admission
    }

    /// The permits the admission took from each member (from a limiter listed twice, twice
    /// that).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Chain, RateLimiter};
    ///
    /// let chain = Chain::new([RateLimiter::fixed_window(5, Duration::from_secs(1))?])?;
    /// assert_eq!(chain.try_acquire_refundable(2)?.permits(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// Gives the permits back to every member, each as its own
    /// [`Refundable::refund`](crate::Refundable::refund) would: as far as that leaves the
    /// member no looser than if they had never been taken (per algorithm and over time, see
    /// [`RateLimiter::try_acquire_refundable`](crate::RateLimiter::try_acquire_refundable)),
    /// and nothing to a member [`reconfigure`](crate::RateLimiter::reconfigure)d since the
    /// admission, while the others get theirs. Then wakes the head of every member's queue, and
    /// the chain callers sleeping on the members. Not counted in [`stats`](Chain::stats), the
    /// chain's or the members': the admission stays counted as one.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Chain, ManualClock, Rate, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let chain = Chain::new([
    ///     RateLimiter::with_clock(Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 10 }, clock.clone())?,
    ///     RateLimiter::with_clock(Algorithm::SlidingCounter { limit: 50, window: Duration::from_secs(60) }, clock)?,
    /// ])?;
    /// let taken = chain.try_acquire_refundable(10)?;
    /// assert!(chain.try_acquire().is_err());
    /// taken.refund();
    /// assert_eq!(chain.try_acquire_n(10)?.remaining(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(self) {
        self.chain.core.refund_held(&(), self.n, &self.held);
    }
}

impl<C: Clock> fmt::Debug for ChainRefundable<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainRefundable")
            .field("permits", &self.n)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Chain<C> {
    fn receipt(&self, n: u32, (admission, held): (Admission, Held)) -> ChainRefundable<C> {
        ChainRefundable {
            chain: self.clone(),
            n,
            admission,
            held,
        }
    }

    /// [`try_acquire_n`](Self::try_acquire_n), with a receipt that can give the permits back to
    /// every member: for work that may turn out not to count (rate-limiter-flexible's `reward`
    /// on a `RateLimiterUnion`).
    ///
    /// The admission is `try_acquire_n`'s, all or nothing, counted as it is. Before deciding,
    /// the call reads every member's parameters' version, as a member's own
    /// [`try_acquire_refundable`](crate::RateLimiter::try_acquire_refundable) does, and the receipt
    /// keeps each member's own admission. [`ChainRefundable::refund`] gives each member its
    /// permits back under that member's rules, as if the member had made a receipt of its own:
    ///
    /// - exact while the clock has not moved since the admission, for the fixed window, the
    ///   sliding counter and the token bucket; later, per algorithm, what the admission still
    ///   weighs on the member (the table at
    ///   [`RateLimiter::try_acquire_refundable`](crate::RateLimiter::try_acquire_refundable): nothing
    ///   once a fixed window has ended, the part a token bucket has not replenished);
    /// - positional for an exact sliding window: its tickets are marked expired where they
    ///   stand, and the permits come back when the ring's turn reaches them (until then, the
    ///   chain is refused as if the admission stood);
    /// - nothing to a member [`reconfigure`](crate::RateLimiter::reconfigure)d between the admission
    ///   and the refund (the others still get theirs: each member is never looser than if the
    ///   admission had never happened, and the chain admits only what every member admits), nor
    ///   to one whose count a [`charge`](crate::RateLimiter::charge) saturated.
    ///
    /// A limiter listed twice gets both of its admissions back. `n == 0` is a probe, as for
    /// `try_acquire_n`: its receipt gives nothing back. The receipt is neither `Clone` nor
    /// `Copy`, and `refund` takes it by value: an admission is given back at most once, to this
    /// chain's members.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Chain, ManualClock, RateLimiter};
    ///
    /// // Three searches a second and ten a minute, not counting those answered from the cache.
    /// let clock = ManualClock::new();
    /// let chain = Chain::new([
    ///     RateLimiter::with_clock(Algorithm::FixedWindow { limit: 3, window: Duration::from_secs(1) }, clock.clone())?,
    ///     RateLimiter::with_clock(Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(60) }, clock.clone())?,
    /// ])?;
    /// for from_cache in [true, false, true, true, false] {
    ///     let taken = chain.try_acquire_refundable(1)?;
    ///     if from_cache {
    ///         taken.refund();
    ///     }
    /// }
    /// assert_eq!(chain.members()[0].stats().available, 1);
    /// assert_eq!(chain.members()[1].stats().available, 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_refundable(&self, n: u32) -> Result<ChainRefundable<C>, TryAcquireError> {
        self.core
            .try_acquire_held(&(), n)
            .map(|held| self.receipt(n, held))
    }

    /// [`acquire_n`](Self::acquire_n), with a receipt that can give the permits back to every
    /// member: for a caller that waits for the chain and then finds the work unnecessary.
    ///
    /// Waits as `acquire_n` does (retrying, sleeping between attempts, no fairness across
    /// members), and is counted as it is. Every attempt reads the members' versions before it
    /// decides, so the receipt is the admitting attempt's and as good as
    /// [`try_acquire_refundable`](Self::try_acquire_refundable)'s: a
    /// [`reconfigure`](crate::RateLimiter::reconfigure) of a member while the caller waited leaves the
    /// refund of a later admission whole, and one after the admission voids that member's
    /// refund only.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`acquire_n`](Self::acquire_n): between attempts the call holds no
    /// permit of any member, and the receipt is made in the poll that returns it, so dropping
    /// the future consumes nothing. It is counted as cancelled.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Chain, RateLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let clock = TokioClock::new();
    /// let chain = Chain::new([
    ///     RateLimiter::with_clock(Algorithm::SlidingCounter { limit: 1, window: Duration::from_secs(1) }, clock.clone())?,
    ///     RateLimiter::with_clock(Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(60) }, clock)?,
    /// ])?;
    /// chain.acquire().await?;
    /// let taken = chain.acquire_refundable(1).await?; // waits for the next second
    /// let already_done = true; // say, another worker did the job meanwhile
    /// if already_done {
    ///     taken.refund();
    /// }
    /// assert!(chain.try_acquire().is_ok(), "the permit went to the next caller");
    /// assert_eq!(chain.members()[1].stats().available, 8);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_refundable(&self, n: u32) -> Result<ChainRefundable<C>, AcquireError> {
        let held = self.core.acquire_held(&(), n).await?;
        Ok(self.receipt(n, held))
    }

    /// [`acquire_refundable`](Self::acquire_refundable) with a time limit; on timeout nothing
    /// is consumed from any member, and the call counts as cancelled.
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
    /// use turnstile::{AcquireError, Algorithm, Chain, RateLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let chain = Chain::new([RateLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(10) },
    ///     TokioClock::new(),
    /// )?])?;
    /// let taken = chain.acquire_refundable_timeout(2, Duration::from_secs(1)).await?;
    /// let late = chain.acquire_refundable_timeout(1, Duration::from_secs(1)).await;
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// taken.refund();
    /// assert_eq!(chain.members()[0].stats().available, 2);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_refundable_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> Result<ChainRefundable<C>, AcquireError> {
        match crate::timer::timeout(timeout, self.acquire_refundable(n)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(AcquireError::Timeout),
        }
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n), with a receipt that can give the
    /// permits back to every member: the blocking counterpart of
    #[cfg_attr(
        feature = "tokio",
        doc = "[`acquire_refundable`](Self::acquire_refundable),"
    )]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_refundable`,")]
    /// with a receipt as good.
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
    /// use turnstile::{Chain, RateLimiter};
    ///
    /// let chain = Chain::new([
    ///     RateLimiter::fixed_window(3, Duration::from_secs(3600))?,
    ///     RateLimiter::fixed_window(5, Duration::from_secs(3600))?,
    /// ])?;
    /// let taken = chain.acquire_blocking_refundable(3)?;
    /// assert!(chain.try_acquire().is_err());
    /// taken.refund(); // say, the batch turned out empty
    /// assert_eq!(chain.try_acquire_n(3)?.remaining(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_refundable(&self, n: u32) -> Result<ChainRefundable<C>, AcquireError> {
        self.core
            .acquire_blocking_held(&(), n, None)
            .map(|held| self.receipt(n, held))
    }

    /// [`acquire_blocking_refundable`](Self::acquire_blocking_refundable) with a time limit
    /// (real time); on timeout nothing is consumed from any member, and the call counts as
    /// cancelled.
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
    /// use turnstile::{AcquireError, Chain, RateLimiter};
    ///
    /// let chain = Chain::new([RateLimiter::fixed_window(1, Duration::from_secs(3600))?])?;
    /// let taken = chain.acquire_blocking_refundable_timeout(1, Duration::from_millis(10))?;
    /// let late = chain.acquire_blocking_refundable_timeout(1, Duration::from_millis(10));
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// taken.refund();
    /// assert!(chain.try_acquire().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_refundable_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> Result<ChainRefundable<C>, AcquireError> {
        let deadline = std::time::Instant::now().checked_add(timeout);
        self.core
            .acquire_blocking_held(&(), n, deadline)
            .map(|held| self.receipt(n, held))
    }
}

/// An admission of a [`KeyedChain`] for one key that [`refund`](Self::refund) can give back to
/// every member (to the key on the per-key members, to the global members), from
/// [`KeyedChain::try_acquire_refundable`] or a waiting call
#[cfg_attr(
    feature = "tokio",
    doc = "([`acquire_refundable`](KeyedChain::acquire_refundable)"
)]
#[cfg_attr(not(feature = "tokio"), doc = "(`acquire_refundable`")]
/// and its timeout and blocking
/// variants). Dropping it keeps the permits spent.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, ManualClock, RateLimiter};
///
/// let clock = ManualClock::new();
/// let per_user = KeyedLimiter::with_clock(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(60) }, clock.clone())?;
/// let everyone = RateLimiter::with_clock(Algorithm::FixedWindow { limit: 100, window: Duration::from_secs(60) }, clock)?;
/// let chain = KeyedChain::builder().per_key(per_user.clone()).global(everyone.clone()).build()?;
/// let taken = chain.try_acquire_refundable(&"alice", 1)?;
/// taken.refund(); // the login succeeded: only failures count
/// assert_eq!((per_user.available(&"alice"), everyone.stats().available), (5, 100));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "keyed")]
#[must_use = "dropping it keeps the permits spent; use `try_acquire_n` or `acquire_n` when no refund can follow"]
pub struct KeyedChainRefundable<K, C: Clock, S> {
    chain: KeyedChain<K, C, S>,
    key: K,
    n: u32,
    admission: Admission,
    held: Held,
}

#[cfg(feature = "keyed")]
impl<K, C: Clock, S> KeyedChainRefundable<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// The admission, as [`KeyedChain::try_acquire_n`] (or, for a waiting call,
    #[cfg_attr(feature = "tokio", doc = "[`KeyedChain::acquire_n`])")]
    #[cfg_attr(not(feature = "tokio"), doc = "`KeyedChain::acquire_n`)")]
    /// would have returned it: the members' combined.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })?)
    ///     .build()?;
    /// assert_eq!(chain.try_acquire_refundable(&7, 2)?.admission().remaining(), 3);
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
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })?)
    ///     .build()?;
    /// assert_eq!(*chain.try_acquire_refundable(&7, 2)?.key(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The permits the admission took from each member (from a limiter listed twice, twice
    /// that).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })?)
    ///     .build()?;
    /// assert_eq!(chain.try_acquire_refundable(&7, 2)?.permits(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn permits(&self) -> u32 {
        self.n
    }

    /// Gives the permits back to every member, each as its own receipt would: to the key on
    /// every per-key member (or to its shared overflow cell, if that admitted them), as
    /// [`KeyedRefundable::refund`](crate::KeyedRefundable::refund) does, and to every global
    /// member, as [`Refundable::refund`](crate::Refundable::refund) does. A member
    /// [`reconfigure`](crate::KeyedLimiter::reconfigure)d since the admission, or a per-key
    /// member with a [`reset`](crate::KeyedLimiter::reset) since (of any key: resets are
    /// counted per limiter; unless its shared overflow cell admitted, which no reset touches),
    /// gets nothing back; the others get theirs. Then wakes the head of
    /// the key's queue on every per-key member (of every key's queue on one whose overflow cell
    /// admitted, whose waiters wait in their own keys' queues) and of every global member's
    /// queue, and the chain callers sleeping on the members. Not counted in
    /// [`stats`](KeyedChain::stats).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, ManualClock, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::with_clock(Algorithm::SlidingCounter { limit: 2, window: Duration::from_secs(1) }, clock.clone())?)
    ///     .global(RateLimiter::with_clock(Algorithm::SlidingCounter { limit: 3, window: Duration::from_secs(1) }, clock)?)
    ///     .build()?;
    /// let taken = chain.try_acquire_refundable(&"10.0.0.1", 2)?;
    /// assert!(chain.try_acquire(&"10.0.0.1").is_err());
    /// taken.refund();
    /// assert!(chain.try_acquire_n(&"10.0.0.1", 2).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refund(self) {
        self.chain.core.refund_held(&self.key, self.n, &self.held);
    }
}

#[cfg(feature = "keyed")]
impl<K: fmt::Debug, C: Clock, S> fmt::Debug for KeyedChainRefundable<K, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedChainRefundable")
            .field("key", &self.key)
            .field("permits", &self.n)
            .field("admission", &self.admission)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "keyed")]
impl<K, C: Clock, S> KeyedChain<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn receipt(
        &self,
        key: &K,
        n: u32,
        (admission, held): (Admission, Held),
    ) -> KeyedChainRefundable<K, C, S> {
        KeyedChainRefundable {
            chain: self.clone(),
            key: key.clone(),
            n,
            admission,
            held,
        }
    }

    /// [`try_acquire_n`](Self::try_acquire_n), with a receipt that can give the permits back to
    /// every member: for work on `key` that may turn out not to count (rate-limiter-flexible's
    /// `reward` on a `RateLimiterUnion`).
    ///
    /// As [`Chain::try_acquire_refundable`]: the admission is `try_acquire_n`'s, counted as it
    /// is, with every member's parameters' version read before it, and
    /// [`KeyedChainRefundable::refund`] gives each member its permits back under that member's
    /// own receipt's rules, per algorithm and over time (see
    /// [`RateLimiter::try_acquire_refundable`](crate::RateLimiter::try_acquire_refundable));
    /// each per-key member as [`KeyedLimiter::try_acquire_refundable`](crate::KeyedLimiter::try_acquire_refundable)'s
    /// receipt: to the shared overflow cell if that admitted (a reset does not void that),
    /// nothing after a [`reset`](crate::KeyedLimiter::reset) of that member (of any key) or a
    /// [`reconfigure`](crate::KeyedLimiter::reconfigure), and nothing on a cell evicted
    /// meanwhile (only once the admission no longer weighs on it). A member that gets nothing
    /// back does not keep the others from getting theirs. The key is cloned into the receipt.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, ManualClock, RateLimiter};
    ///
    /// // Five failed logins per user a minute and 50 for everyone: a success gives its attempt back.
    /// let clock = ManualClock::new();
    /// let minute = Duration::from_secs(60);
    /// let per_user = KeyedLimiter::with_clock(Algorithm::FixedWindow { limit: 5, window: minute }, clock.clone())?;
    /// let everyone = RateLimiter::with_clock(Algorithm::FixedWindow { limit: 50, window: minute }, clock)?;
    /// let failures = KeyedChain::builder().per_key(per_user.clone()).global(everyone.clone()).build()?;
    /// for password_ok in [false, true, false, true, false] {
    ///     let taken = failures.try_acquire_refundable(&"alice", 1)?;
    ///     if password_ok {
    ///         taken.refund();
    ///     }
    /// }
    /// assert_eq!(per_user.available(&"alice"), 2); // three failures
    /// assert_eq!(everyone.stats().available, 47);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_refundable(
        &self,
        key: &K,
        n: u32,
    ) -> Result<KeyedChainRefundable<K, C, S>, TryAcquireError> {
        self.core
            .try_acquire_held(key, n)
            .map(|held| self.receipt(key, n, held))
    }

    /// [`acquire_n`](Self::acquire_n), with a receipt that can give the permits back to every
    /// member: for a caller that waits for the chain and then finds the work on `key`
    /// unnecessary.
    ///
    /// Waits as `acquire_n` does, and is counted as it is. Every attempt reads the members'
    /// versions before it decides (and a per-key member's commit its reset count), so the
    /// receipt is the admitting attempt's and as good as
    /// [`try_acquire_refundable`](Self::try_acquire_refundable)'s: a reconfiguration or reset
    /// while the caller waited does not void the refund of an admission made after it. The key
    /// is cloned into the receipt.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`acquire_n`](Self::acquire_n): between attempts the call holds no
    /// permit of any member, and the receipt is made in the poll that returns it, so dropping
    /// the future consumes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // One export per user a minute; an export that finds nothing new does not count.
    /// let per_user = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(60) },
    ///     TokioClock::new(),
    /// )?;
    /// let exports = KeyedChain::builder().per_key(per_user.clone()).build()?;
    /// exports.acquire(&"alice").await?;
    /// let taken = exports.acquire_refundable(&"alice", 1).await?; // the next minute
    /// let nothing_new = true;
    /// if nothing_new {
    ///     taken.refund();
    /// }
    /// assert_eq!(per_user.available(&"alice"), 1);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_refundable(
        &self,
        key: &K,
        n: u32,
    ) -> Result<KeyedChainRefundable<K, C, S>, AcquireError> {
        let held = self.core.acquire_held(key, n).await?;
        Ok(self.receipt(key, n, held))
    }

    /// [`acquire_refundable`](Self::acquire_refundable) with a time limit; on timeout nothing
    /// is consumed from any member.
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
    /// use turnstile::{AcquireError, Algorithm, KeyedChain, KeyedLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let per_key = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(10) },
    ///     TokioClock::new(),
    /// )?;
    /// let chain = KeyedChain::builder().per_key(per_key.clone()).build()?;
    /// let taken = chain.acquire_refundable_timeout(&"k", 1, Duration::from_secs(1)).await?;
    /// let late = chain.acquire_refundable_timeout(&"k", 1, Duration::from_secs(1)).await;
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// taken.refund();
    /// assert_eq!(per_key.available(&"k"), 1);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_refundable_timeout(
        &self,
        key: &K,
        n: u32,
        timeout: Duration,
    ) -> Result<KeyedChainRefundable<K, C, S>, AcquireError> {
        match crate::timer::timeout(timeout, self.acquire_refundable(key, n)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(AcquireError::Timeout),
        }
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n), with a receipt that can give the
    /// permits back to every member: the blocking counterpart of
    #[cfg_attr(
        feature = "tokio",
        doc = "[`acquire_refundable`](Self::acquire_refundable),"
    )]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_refundable`,")]
    /// with a receipt as good.
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
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, RateLimiter};
    ///
    /// let per_batch = KeyedLimiter::new(Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(3600) })?;
    /// let everyone = RateLimiter::fixed_window(10, Duration::from_secs(3600))?;
    /// let chain = KeyedChain::builder().per_key(per_batch.clone()).global(everyone.clone()).build()?;
    /// let taken = chain.acquire_blocking_refundable(&"batch-7", 2)?;
    /// taken.refund(); // say, the batch was empty
    /// assert_eq!((per_batch.available(&"batch-7"), everyone.stats().available), (2, 10));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_refundable(
        &self,
        key: &K,
        n: u32,
    ) -> Result<KeyedChainRefundable<K, C, S>, AcquireError> {
        self.core
            .acquire_blocking_held(key, n, None)
            .map(|held| self.receipt(key, n, held))
    }

    /// [`acquire_blocking_refundable`](Self::acquire_blocking_refundable) with a time limit
    /// (real time); on timeout nothing is consumed from any member, and the call counts as
    /// cancelled.
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
    /// use turnstile::{AcquireError, Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let per_key = KeyedLimiter::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(3600) })?;
    /// let chain = KeyedChain::builder().per_key(per_key.clone()).build()?;
    /// let taken = chain.acquire_blocking_refundable_timeout(&"k", 1, Duration::from_millis(10))?;
    /// let late = chain.acquire_blocking_refundable_timeout(&"k", 1, Duration::from_millis(10));
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// taken.refund();
    /// assert_eq!(per_key.available(&"k"), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_refundable_timeout(
        &self,
        key: &K,
        n: u32,
        timeout: Duration,
    ) -> Result<KeyedChainRefundable<K, C, S>, AcquireError> {
        let deadline = std::time::Instant::now().checked_add(timeout);
        self.core
            .acquire_blocking_held(key, n, deadline)
            .map(|held| self.receipt(key, n, held))
    }
}
