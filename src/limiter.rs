//! [`RateLimiter`]: the handle users hold.

use crate::algorithm::{Algo, Charge, FixedWindow, SlidingCounter, SlidingWindow, TokenBucket};
use crate::clock::{Clock, DefaultClock};
use crate::decision::{Admission, Rejection};
use crate::error::{AcquireError, ConfigError, TryAcquireError};
use crate::queue::{
    Blocked, CLOSED, DEFAULT_QUEUE_LIMIT, QueueOrder, Queued, WAITERS, Wait, WaitQueue,
};
use crate::sync::{ADMITTED, Arc, AtomicU64, CANCELLED, Counters, Mutex, Ordering, REJECTED, lock};
use crate::watchers::{Watcher, Watchers};
use crossbeam_utils::CachePadded;
use std::fmt;
#[cfg(feature = "tokio")]
use std::future::Future;
use std::task::Poll;
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
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Rate, RateLimiter};
    ///
    /// // 3 permits every 250 ms, up to 6 at once.
    /// let rate = Rate::new(3, Duration::from_millis(250));
    /// let limiter = RateLimiter::new(Algorithm::TokenBucket { rate, burst: 6 })?;
    /// assert_eq!(limiter.capacity(), 6);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub const fn new(permits: u32, period: Duration) -> Self {
        Rate { permits, period }
    }

    /// `permits` per second.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::Rate;
    ///
    /// const API: Rate = Rate::per_second(50); // usable in constants
    /// assert_eq!((API.permits, API.period), (50, Duration::from_secs(1)));
    /// ```
    pub const fn per_second(permits: u32) -> Self {
        Rate::new(permits, Duration::from_secs(1))
    }

    /// `permits` per minute.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::Rate;
    ///
    /// assert_eq!(Rate::per_minute(30), Rate::new(30, Duration::from_secs(60)));
    /// ```
    pub const fn per_minute(permits: u32) -> Self {
        Rate::new(permits, Duration::from_secs(60))
    }

    /// `permits` per hour.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::Rate;
    ///
    /// assert_eq!(Rate::per_hour(1000).period, Duration::from_secs(3600));
    /// ```
    pub const fn per_hour(permits: u32) -> Self {
        Rate::new(permits, Duration::from_secs(3600))
    }
}

/// Which algorithm a limiter runs, with its parameters.
///
/// | algorithm | exactness | memory | bursts |
/// |---|---|---|---|
/// | `FixedWindow` | ≤ limit per aligned window; up to 2 × limit across a boundary | 8 bytes | a full window's worth at each boundary |
/// | `SlidingWindow` | ≤ limit in *every* interval of length window | 8 bytes × limit (× `max_limit` if set) | up to limit at once, then paced by expiry |
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

impl Algorithm {
    /// Validates the parameters as a limiter's constructor does, building no state (no ring).
    #[cfg(all(feature = "http", feature = "redis"))]
    pub(crate) fn check_params(self) -> Result<(), ConfigError> {
        match self {
            Algorithm::FixedWindow { limit, window } => FixedWindow::new(limit, window).map(drop),
            Algorithm::SlidingWindow { limit, window } => {
                SlidingWindow::new(limit, window).map(drop)
            }
            Algorithm::SlidingCounter { limit, window } => {
                SlidingCounter::new(limit, window).map(drop)
            }
            Algorithm::TokenBucket { rate, burst } => TokenBucket::new(rate, burst).map(drop),
        }
    }

    /// The algorithm's name in messages ("fixed window", ...).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Algorithm::FixedWindow { .. } => "fixed window",
            Algorithm::SlidingWindow { .. } => "sliding window",
            Algorithm::SlidingCounter { .. } => "sliding counter",
            Algorithm::TokenBucket { .. } => "token bucket",
        }
    }
}

/// Builds the algorithm `algorithm` names, validated; `max_limit` sizes a sliding window's ring.
pub(crate) fn build_sliding(
    limit: u32,
    window: Duration,
    max_limit: Option<u32>,
) -> Result<SlidingWindow, ConfigError> {
    let algo = SlidingWindow::new(limit, window)?;
    match max_limit {
        Some(max) => algo.with_capacity(max),
        None => Ok(algo),
    }
}

/// One algorithm's parameters and the one cell of state an unkeyed limiter owns.
pub(crate) struct Single<A: Algo> {
    algo: A,
    /// On a cache line of its own: every admission writes it, the parameters are only read.
    cell: CachePadded<A::Cell>,
}

impl<A: Algo> Single<A> {
    fn new(algo: A) -> Self {
        let cell = CachePadded::new(algo.cell());
        Single { algo, cell }
    }
}

pub(crate) enum State {
    Fixed(Single<FixedWindow>),
    Sliding(Single<SlidingWindow>),
    Counter(Single<SlidingCounter>),
    Bucket(Single<TokenBucket>),
}

impl State {
    pub(crate) fn new(algorithm: Algorithm, max_limit: Option<u32>) -> Result<Self, ConfigError> {
        Ok(match algorithm {
            Algorithm::FixedWindow { limit, window } => {
                State::Fixed(Single::new(FixedWindow::new(limit, window)?))
            }
            Algorithm::SlidingWindow { limit, window } => {
                State::Sliding(Single::new(build_sliding(limit, window, max_limit)?))
            }
            Algorithm::SlidingCounter { limit, window } => {
                State::Counter(Single::new(SlidingCounter::new(limit, window)?))
            }
            Algorithm::TokenBucket { rate, burst } => {
                State::Bucket(Single::new(TokenBucket::new(rate, burst)?))
            }
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
        self.decide::<C, true>(n, clock)
    }

    /// [`Algo::decide`]: takes the permits with `COMMIT`, only decides without.
    #[inline(always)]
    pub(crate) fn decide<C: Clock, const COMMIT: bool>(
        &self,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        match self {
            State::Fixed(s) => s.algo.decide::<C, COMMIT>(&s.cell, n, clock),
            State::Sliding(s) => s.algo.decide::<C, COMMIT>(&s.cell, n, clock),
            State::Counter(s) => s.algo.decide::<C, COMMIT>(&s.cell, n, clock),
            State::Bucket(s) => s.algo.decide::<C, COMMIT>(&s.cell, n, clock),
        }
    }

    /// [`Charge::charge`].
    pub(crate) fn charge<C: Clock>(&self, n: u32, clock: &C) -> Result<Admission, TryAcquireError> {
        match self {
            State::Fixed(s) => s.algo.charge(&s.cell, n, clock),
            State::Sliding(s) => s.algo.charge(&s.cell, n, clock),
            State::Counter(s) => s.algo.charge(&s.cell, n, clock),
            State::Bucket(s) => s.algo.charge(&s.cell, n, clock),
        }
    }

    /// [`Algo::refund`].
    pub(crate) fn refund<C: Clock>(&self, n: u32, admission: &Admission, clock: &C) {
        match self {
            State::Fixed(s) => s.algo.refund(&s.cell, n, admission, clock),
            State::Sliding(s) => s.algo.refund(&s.cell, n, admission, clock),
            State::Counter(s) => s.algo.refund(&s.cell, n, admission, clock),
            State::Bucket(s) => s.algo.refund(&s.cell, n, admission, clock),
        }
    }

    /// [`Algo::version`].
    pub(crate) fn version(&self) -> u64 {
        match self {
            State::Fixed(s) => s.algo.version(),
            State::Sliding(s) => s.algo.version(),
            State::Counter(s) => s.algo.version(),
            State::Bucket(s) => s.algo.version(),
        }
    }

    /// [`Algo::exact_refund`].
    pub(crate) fn exact_refund(&self) -> bool {
        match self {
            State::Fixed(s) => s.algo.exact_refund(),
            State::Sliding(s) => s.algo.exact_refund(),
            State::Counter(s) => s.algo.exact_refund(),
            State::Bucket(s) => s.algo.exact_refund(),
        }
    }

    pub(crate) fn available(&self, now: u64) -> u32 {
        match self {
            State::Fixed(s) => s.algo.available(&s.cell, now),
            State::Sliding(s) => s.algo.available(&s.cell, now),
            State::Counter(s) => s.algo.available(&s.cell, now),
            State::Bucket(s) => s.algo.available(&s.cell, now),
        }
    }

    /// [`Algo::beyond_limit`] at the clock's time.
    pub(crate) fn beyond_limit<C: Clock>(&self, clock: &C, at_limit: u64, extra: u64) -> u64 {
        let now = clock.now();
        match self {
            State::Fixed(s) => s.algo.beyond_limit(now, at_limit, extra),
            State::Sliding(s) => s.algo.beyond_limit(now, at_limit, extra),
            State::Counter(s) => s.algo.beyond_limit(now, at_limit, extra),
            State::Bucket(s) => s.algo.beyond_limit(now, at_limit, extra),
        }
    }

    pub(crate) fn limit(&self) -> u32 {
        match self {
            State::Fixed(s) => s.algo.limit(),
            State::Sliding(s) => s.algo.limit(),
            State::Counter(s) => s.algo.limit(),
            State::Bucket(s) => s.algo.limit(),
        }
    }

    /// [`Algo::reconfigure`] with `to`'s parameters, validated first; `from` is what the state
    /// runs now (for the error when the kind differs). Callers serialise.
    pub(crate) fn reconfigure<C: Clock>(
        &self,
        from: Algorithm,
        to: Algorithm,
        clock: &C,
    ) -> Result<(), ConfigError> {
        match (self, to) {
            (State::Fixed(s), Algorithm::FixedWindow { limit, window }) => {
                let to = FixedWindow::new(limit, window)?;
                s.algo.reconfigure(&to, clock, &|f| f(&s.cell))
            }
            (State::Sliding(s), Algorithm::SlidingWindow { limit, window }) => {
                let to = SlidingWindow::new(limit, window)?;
                s.algo.reconfigure(&to, clock, &|f| f(&s.cell))
            }
            (State::Counter(s), Algorithm::SlidingCounter { limit, window }) => {
                let to = SlidingCounter::new(limit, window)?;
                s.algo.reconfigure(&to, clock, &|f| f(&s.cell))
            }
            (State::Bucket(s), Algorithm::TokenBucket { rate, burst }) => {
                let to = TokenBucket::new(rate, burst)?;
                s.algo.reconfigure(&to, clock, &|f| f(&s.cell))
            }
            _ => Err(ConfigError::AlgorithmChanged {
                from: from.name(),
                to: to.name(),
            }),
        }
    }
}

/// The answer to a call for `n` permits that queued waiters hold back (no barging), on a
/// limiter of `capacity` whose queue will take `queued`: `InsufficientCapacity` if `n` can never
/// be admitted, else a rejection whose retry-after is a lower bound of when this call could be
/// admitted behind the queue. `check` is the algorithm's decision for that many permits without
/// `COMMIT` (it writes nothing); `next_window_after` is the sliding counter's (see below), and
/// `beyond_limit` the algorithm's [`Algo::beyond_limit`] at the clock's time.
///
/// The bound is when the algorithm could admit the queue's permits and this call's (`n.max(1)`:
/// a probe needs one) at once. The queue is served first, in order, and its admissions only make
/// the state stricter: for the fixed and sliding windows and the token bucket this call's
/// permits then fit no earlier than all of them would fit at once. A check cannot be asked for
/// more than the capacity: beyond it, the time the capacity needs at once, or what the
/// algorithm guarantees of more than its limit in a row (`beyond_limit`: the next window, a
/// window's length, one more period per permit), whichever is later. Shared by the keyed
/// limiter (`KeyedLimiter`'s `refused_for_waiters`), with its key's queue and state.
///
/// The sliding counter's estimate weighs what a window admitted less as the next goes by, so
/// a call admitted a window after the queue's admissions can fit sooner than all of them would
/// at once. Its bound at once is therefore no later than the start of the window after the one
/// in which the head could first be admitted (`next_window_after` of that wait, a second
/// check): if this call is admitted in the window of every queue admission, they all count in
/// full, as at once; if not, it comes after a window that the head's admission fell in.
///
/// 0 only when the algorithm admits all of it now, within the capacity: then the head has been
/// woken, or its timer is due (a timer rounds its sleep up), and is about to take its permits,
/// and behind it this call would be admitted at once; how soon the head runs is not known
/// here. An HTTP answer never says 0: it rounds up to at least 1 s.
#[cold]
pub(crate) fn refused_for_waiters(
    n: u32,
    mut capacity: u32,
    queued: Queued,
    check: impl Fn(u32) -> Result<Admission, TryAcquireError>,
    next_window_after: Option<impl Fn(u64) -> u64>,
    beyond_limit: impl Fn(u64, u64) -> u64,
) -> TryAcquireError {
    loop {
        if n > capacity {
            return TryAcquireError::InsufficientCapacity {
                requested: n,
                capacity,
            };
        }
        let total = queued.permits.saturating_add(u64::from(n.max(1)));
        let want = total.min(u64::from(capacity)) as u32;
        let (at_once, limit) = match check(want) {
            Err(TryAcquireError::InsufficientCapacity {
                capacity: lowered, ..
            }) if lowered < capacity => {
                // The limit was lowered since we read it: again, under the new one. (It
                // decreases with every round, so this ends.)
                capacity = lowered;
                continue;
            }
            Err(TryAcquireError::Rejected(rejection)) => {
                (rejection.retry_after_nanos(), rejection.limit())
            }
            Err(other) => return other,
            Ok(_) => (0, capacity),
        };
        let mut bound = at_once;
        if let Some(next_window_after) = next_window_after
            && at_once > 0
            && queued.permits > 0
        {
            match check(queued.head.clamp(1, capacity)) {
                Ok(_) => bound = bound.min(next_window_after(0)),
                Err(TryAcquireError::Rejected(head)) => {
                    bound = bound.min(next_window_after(head.retry_after_nanos()));
                }
                // Lowered meanwhile, or gone: the bound at once stands.
                Err(_) => {}
            }
        }
        if total > u64::from(capacity) {
            bound = bound.max(beyond_limit(at_once, total - u64::from(capacity)));
        }
        return TryAcquireError::Rejected(Rejection::new(bound, limit));
    }
}

/// Counts kept by a limiter.
///
/// Every call ends in exactly one of `admitted`, `rejected` or `cancelled`, so once no call is in
/// flight `admitted + rejected + cancelled` is the number of calls.
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
    /// Calls that got their permits (`try_acquire` and `acquire` alike; probes with n = 0
    /// included).
    pub admitted: u64,
    /// Calls that failed: rejections, requests that can never fit, a full queue, a closed limiter.
    /// A waiter the limiter fails (on `close`, on eviction from a full newest-first queue, or as
    /// too large after the limit shrank) counts here even if it is dropped before it sees the
    /// failure.
    pub rejected: u64,
    /// Waits given up: `acquire` futures dropped while queued, and timeouts. Also the rare
    /// waiter whose poll panicked in a `Waker` it woke, after it had been served: what it took is
    /// given back, and a panicked future cannot be polled again.
    pub cancelled: u64,
    /// Permits the algorithm could admit right now. A snapshot: approximate while other threads
    /// are acquiring. It does not look at the gate: a [closed](RateLimiter::close) limiter still
    /// counts them, and so does one whose queued waiters hold `try_acquire` back (oldest first,
    /// behind a head that asks for more), as [`ConcurrencyLimiter::available`](crate::ConcurrencyLimiter::available) does. For a
    /// concurrency limiter, the permits not held.
    pub available: u32,
    /// Waiters queued now.
    pub waiting: usize,
    /// Permits the queued waiters ask for (a probe, `n == 0`, counts as the one it waits for).
    pub queued_permits: u64,
}

/// A rate limiter: one of the four [`Algorithm`]s over one [`Clock`].
///
/// Cloning is cheap and clones share state. `try_acquire` never waits for permits, never
/// allocates after a thread's first call, and on rejection writes no shared memory, but for
/// one case: while waiters are queued (oldest first), a refusal reads what they wait for under
/// the queue's mutex (held briefly), to count it in its `retry_after`.
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
    /// [`WAITERS`] and [`CLOSED`]; zero on the fast path. Read by every `try_acquire`, written only
    /// when the queue turns empty or non-empty and on close, so it sits on a line of its own.
    gate: CachePadded<AtomicU64>,
    /// The parameters now. Its mutex serialises reconfigurations (the state's parameters are
    /// read without it).
    algorithm: Mutex<Algorithm>,
    clock: C,
    counters: Counters,
    queue: WaitQueue,
    /// Chain callers sleeping on this limiter, told of a close, a reconfiguration or a refund.
    watchers: Watchers,
}

impl<C: Clock> Inner<C> {
    /// `try_acquire_n` without the statistics: the gate, then the algorithm. Without `COMMIT` it
    /// only decides (a chain's first pass).
    #[inline(always)]
    fn decide<const COMMIT: bool>(&self, n: u32) -> Result<Admission, TryAcquireError> {
        // Relaxed: as in `try_acquire_n`.
        if self.gate.load(Ordering::Relaxed) == 0 {
            self.state.decide::<C, COMMIT>(n, &self.clock)
        } else {
            self.try_acquire_gated::<COMMIT>(n)
        }
    }

    /// `try_acquire` when the gate is not clear: closed, or others are queued.
    #[cold]
    #[inline(never)]
    fn try_acquire_gated<const COMMIT: bool>(&self, n: u32) -> Result<Admission, TryAcquireError> {
        // Relaxed: as in `try_acquire_n`.
        let gate = self.gate.load(Ordering::Relaxed);
        if gate & CLOSED != 0 {
            return Err(TryAcquireError::Closed);
        }
        if gate & WAITERS == 0 || self.queue.order() == QueueOrder::NewestFirst {
            return self.state.decide::<C, COMMIT>(n, &self.clock);
        }
        // Oldest first and others are queued: no barging.
        let next_window_after = match &self.state {
            State::Counter(s) => Some(|after| s.algo.next_window_after(self.clock.now(), after)),
            _ => None,
        };
        Err(refused_for_waiters(
            n,
            self.state.limit(),
            self.queue.queued(),
            |want| self.state.decide::<C, false>(want, &self.clock),
            next_window_after,
            |at_limit, extra| self.state.beyond_limit(&self.clock, at_limit, extra),
        ))
    }

    /// The head's attempt: the algorithm, ignoring the gate. The head has usually just slept until
    /// its slot frees, so a cached clock is brought up to date first.
    fn take(&self, n: u32) -> Result<Admission, Blocked> {
        self.clock.catch_up();
        match self.state.try_acquire(n, &self.clock) {
            Ok(admission) => Ok(admission),
            Err(TryAcquireError::Rejected(r)) => Err(Blocked::Until(r.retry_after_nanos())),
            Err(TryAcquireError::InsufficientCapacity {
                requested,
                capacity,
            }) => Err(Blocked::Fail(AcquireError::InsufficientCapacity {
                requested,
                capacity,
            })),
            // An unkeyed cell is never retired and has no key cap; `Closed` cannot come from the
            // algorithm here, but failing the waiter is the safe answer to anything unexpected.
            Err(
                TryAcquireError::Closed
                | TryAcquireError::TooManyKeys { .. }
                | TryAcquireError::Unavailable,
            ) => Err(Blocked::Fail(AcquireError::Closed)),
        }
    }

    /// [`take`](Self::take) for a receipt: with the parameters' version read before the
    /// decision, as [`try_acquire_refundable`](RateLimiter::try_acquire_refundable) reads it, so
    /// that a refund of an admission the queue made is checked against the version it was
    /// made under (or an earlier one: then it gives nothing back, which is never looser).
    fn take_versioned(&self, n: u32) -> Result<(Admission, u64), Blocked> {
        let version = self.state.version();
        self.take(n).map(|admission| (admission, version))
    }

    /// [`try_acquire`](State::try_acquire) for a receipt, the version read first (see
    /// [`take_versioned`](Self::take_versioned)).
    #[inline(always)]
    fn try_acquire_versioned(&self, n: u32) -> Result<(Admission, u64), TryAcquireError> {
        let version = self.state.version();
        self.state
            .try_acquire(n, &self.clock)
            .map(|admission| (admission, version))
    }

    /// Undoes an admission `take` made that never reached its caller (see `Wait::run_async`:
    /// its handover to the next waiter unwound). The chain callers sleeping on this limiter are
    /// told, as a chain's refund tells them (`chain_wake`): one that looked while the admission
    /// was held sleeps until its retry-after otherwise, with the permits free. This runs inside
    /// the unwind; `Watchers::changed` wakes every watcher even if a `Waker` panics, and lets no
    /// second panic out of it.
    fn give_back(&self, n: u32, admission: &Admission) {
        let _watchers = self.watchers.notify_on_drop();
        self.state.refund(n, admission, &self.clock);
    }

    /// The part of `acquire` that every caller runs first: validate, then try without queueing if
    /// nobody is queued. `Pending` means "queue up".
    #[inline(always)]
    fn acquire_fast(&self, n: u32) -> Poll<Result<Admission, AcquireError>> {
        self.acquire_fast_with(n, || self.state.try_acquire(n, &self.clock))
    }

    /// [`acquire_fast`](Self::acquire_fast) with `attempt` as the algorithm's decision (for a
    /// receipt, one that also reads the parameters' version first).
    #[inline(always)]
    fn acquire_fast_with<T, F: FnOnce() -> Result<T, TryAcquireError>>(
        &self,
        n: u32,
        attempt: F,
    ) -> Poll<Result<T, AcquireError>> {
        // Relaxed: as in `try_acquire_n`.
        let gate = self.gate.load(Ordering::Relaxed);
        if gate == 0 {
            return match attempt() {
                Ok(admitted) => {
                    self.counters.bump(ADMITTED);
                    Poll::Ready(Ok(admitted))
                }
                Err(TryAcquireError::Rejected(_)) => Poll::Pending,
                Err(_) => self.acquire_check::<T, F>(n, gate, None),
            };
        }
        self.acquire_check(n, gate, Some(attempt))
    }

    /// The checks of `acquire_fast` once the gate is not clear or the algorithm refused with an
    /// error; `attempt` (if not spent) is the decision a newest-first caller makes at once.
    #[cold]
    fn acquire_check<T, F: FnOnce() -> Result<T, TryAcquireError>>(
        &self,
        n: u32,
        gate: u64,
        attempt: Option<F>,
    ) -> Poll<Result<T, AcquireError>> {
        let capacity = self.state.limit();
        let error = if gate & CLOSED != 0 {
            AcquireError::Closed
        } else if n > capacity {
            AcquireError::InsufficientCapacity {
                requested: n,
                capacity,
            }
        } else if gate & WAITERS != 0 && self.queue.order() == QueueOrder::NewestFirst {
            // Newest first: this caller is served before every queued waiter, so it takes what
            // is free now, as `try_acquire` does, and queues only if it must wait. Queueing first
            // would make a full queue fail its oldest waiter with `QueueFull` to make room for a
            // caller that is then admitted at once.
            return match attempt.map(|attempt| attempt()) {
                Some(Ok(admitted)) => {
                    self.counters.bump(ADMITTED);
                    Poll::Ready(Ok(admitted))
                }
                // Rejected (or the capacity changed since it was read): the queue decides.
                _ => Poll::Pending,
            };
        } else {
            return Poll::Pending;
        };
        self.counters.bump(REJECTED);
        Poll::Ready(Err(error))
    }

    fn wait(&self, n: u32) -> Wait<'_> {
        Wait {
            queue: &self.queue,
            gate: &self.gate,
            counters: &self.counters,
            permits: n,
            retry_closed: None,
            capacity: None,
            room: None,
        }
    }
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
            .field("algorithm", &*lock(&self.inner.algorithm))
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

    /// A builder for the settings the constructors leave at their defaults: the clock, the queue
    /// order and the queue limit.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ManualClock, QueueOrder, RateLimiter};
    ///
    /// let limiter = RateLimiter::builder(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })
    ///     .clock(ManualClock::new())
    ///     .queue_order(QueueOrder::NewestFirst)
    ///     .queue_limit(100)
    ///     .build()?;
    /// assert_eq!(limiter.queue_limit(), 100);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn builder(algorithm: Algorithm) -> RateLimiterBuilder<DefaultClock> {
        RateLimiterBuilder {
            algorithm,
            clock: DefaultClock::new(),
            order: QueueOrder::OldestFirst,
            queue_limit: DEFAULT_QUEUE_LIMIT,
            max_limit: None,
        }
    }
}

/// Builds a [`RateLimiter`] with a chosen clock and queue settings; see [`RateLimiter::builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, MonotonicClock, RateLimiter};
///
/// let limiter = RateLimiter::builder(Algorithm::SlidingWindow { limit: 3, window: Duration::from_secs(1) })
///     .clock(MonotonicClock::new())
///     .queue_limit(0) // never wait: acquire fails at once when it would have to queue
///     .build()?;
/// assert!(limiter.try_acquire().is_ok());
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RateLimiterBuilder<C> {
    algorithm: Algorithm,
    clock: C,
    order: QueueOrder,
    queue_limit: u64,
    max_limit: Option<u32>,
}

impl<C: Clock> RateLimiterBuilder<C> {
    /// Reads `clock` instead of the default.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ManualClock, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::builder(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })
    ///     .clock(clock.clone())
    ///     .build()?;
    /// clock.advance(Duration::from_secs(2));
    /// assert_eq!(limiter.try_acquire()?.at(), Duration::from_secs(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clock<C2: Clock>(self, clock: C2) -> RateLimiterBuilder<C2> {
        RateLimiterBuilder {
            algorithm: self.algorithm,
            clock,
            order: self.order,
            queue_limit: self.queue_limit,
            max_limit: self.max_limit,
        }
    }

    /// The order queued waiters are served in (default: [`QueueOrder::OldestFirst`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, QueueOrder, RateLimiter};
    ///
    /// let limiter = RateLimiter::builder(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })
    ///     .queue_order(QueueOrder::NewestFirst)
    ///     .build()?;
    /// assert_eq!(limiter.queue_order(), QueueOrder::NewestFirst);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_order(mut self, order: QueueOrder) -> Self {
        self.order = order;
        self
    }

    /// The most permits that may wait at once (default: [`DEFAULT_QUEUE_LIMIT`]); a waiting probe
    /// (`n == 0`) counts as one. 0 means that `acquire` never waits: it fails with `QueueFull`
    /// whenever it would have to.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, RateLimiter};
    ///
    /// let limiter = RateLimiter::builder(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })
    ///     .queue_limit(16)
    ///     .build()?;
    /// assert_eq!(limiter.queue_limit(), 16);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_limit(mut self, permits: u64) -> Self {
        self.queue_limit = permits;
        self
    }

    /// The largest limit a later [`reconfigure`](RateLimiter::reconfigure) may set on an
    /// exact sliding window (default: the limit it is built with). Its ring of timestamps
    /// cannot grow without a lock, so it is allocated once for this many permits (8 bytes
    /// each, at most 16,777,216); a smaller limit uses part of it. A `max_limit` below the
    /// limit it is built with is raised to that limit (the ring holds at least the limit). The
    /// other algorithms keep O(1) state whatever the limit and ignore this.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ConfigError, RateLimiter};
    ///
    /// let limiter = RateLimiter::builder(Algorithm::SlidingWindow { limit: 10, window: Duration::from_secs(1) })
    ///     .max_limit(100)
    ///     .build()?;
    /// limiter.reconfigure(Algorithm::SlidingWindow { limit: 100, window: Duration::from_secs(1) })?;
    /// assert_eq!(limiter.capacity(), 100);
    /// let too_many = Algorithm::SlidingWindow { limit: 101, window: Duration::from_secs(1) };
    /// assert_eq!(
    ///     limiter.reconfigure(too_many).unwrap_err(),
    ///     ConfigError::AboveMaxLimit { limit: 101, max_limit: 100 }
    /// );
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn max_limit(mut self, max_limit: u32) -> Self {
        self.max_limit = Some(max_limit);
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if an algorithm parameter is zero or too large.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ConfigError, RateLimiter};
    ///
    /// let bad = RateLimiter::builder(Algorithm::FixedWindow { limit: 0, window: Duration::from_secs(1) }).build();
    /// assert_eq!(bad.unwrap_err(), ConfigError::Zero { what: "limit" });
    /// ```
    pub fn build(self) -> Result<RateLimiter<C>, ConfigError> {
        RateLimiter::build(
            self.algorithm,
            self.clock,
            self.order,
            self.queue_limit,
            self.max_limit,
        )
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
        Self::build(
            algorithm,
            clock,
            QueueOrder::OldestFirst,
            DEFAULT_QUEUE_LIMIT,
            None,
        )
    }

    fn build(
        algorithm: Algorithm,
        clock: C,
        order: QueueOrder,
        queue_limit: u64,
        max_limit: Option<u32>,
    ) -> Result<Self, ConfigError> {
        Ok(RateLimiter {
            inner: Arc::new(Inner {
                state: State::new(algorithm, max_limit)?,
                gate: CachePadded::new(AtomicU64::new(0)),
                algorithm: Mutex::new(algorithm),
                clock,
                counters: Counters::new(),
                queue: WaitQueue::new(order, queue_limit),
                watchers: Watchers::default(),
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
    /// **No barging.** Under [`QueueOrder::OldestFirst`] (the default), while anyone is queued in
    #[cfg_attr(feature = "tokio", doc = "[`acquire`](Self::acquire)")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire`")]
    /// or [`acquire_blocking`](Self::acquire_blocking) this fails with a
    /// rejection rather than take permits the queue is waiting for. Its `retry_after` is then a
    /// lower bound that counts the queue: the time until the algorithm could admit the permits
    /// the queued waiters take plus these `n` (one for a probe) at once (for the sliding
    /// counter, whose older windows weigh less, no later than the start of the window after the
    /// one the queue's head could be admitted in). Beyond the capacity it is the later of the
    /// time the capacity needs and what the algorithm allows of more than its limit in a row:
    /// the next window (fixed window, sliding counter), a window's length (sliding window), one
    /// more period per permit (token bucket). It is 0 only when the algorithm could admit all
    /// of it now, within the capacity, the head waiter being about to take its share.
    ///
    /// # Errors
    ///
    /// - [`TryAcquireError::Rejected`]: not enough permits now; `retry_after` is the exact time until
    ///   `n` permits could be admitted if nothing else is (behind queued waiters, the lower bound
    ///   above).
    /// - [`TryAcquireError::InsufficientCapacity`]: `n` exceeds the limit (or burst) and can never be
    ///   admitted.
    /// - [`TryAcquireError::Closed`]: the limiter was [closed](Self::close); this comes first,
    ///   whatever `n`.
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
        // The gate is loaded Relaxed (in `decide`): it carries no data; a call that misses a bit
        // just set is ordered before the enqueue or close that set it.
        let decision = inner.decide::<true>(n);
        inner
            .counters
            .bump(if decision.is_ok() { ADMITTED } else { REJECTED });
        decision
    }

    /// Records `n` permits as used now, without checking the limit: for usage known only after
    /// the fact (tokens or bytes of a response, a failed login's penalty; rate-limiter-flexible's
    /// `penalty`). It is never rejected for being over the limit: it may put the limiter in
    /// *debt*, and later calls are then rejected, with an exact `retry_after`, until the debt
    /// has passed. Nothing is woken and no waiter is passed over: a charge only makes the
    /// limiter stricter, and a queued head that wakes at its computed time and is refused again
    /// sleeps for the new `retry_after`. Charges are not counted in [`stats`](Self::stats).
    ///
    /// Per algorithm (W the window, N the limit, T the time per token, b the burst):
    ///
    /// | algorithm | a charge of n at `now` | the debt is bounded by |
    /// |---|---|---|
    /// | fixed window | the current window's count grows by n | the window: its count saturates at `u32::MAX`, and the next window starts empty |
    /// | sliding counter | the current window's count grows by n | two windows: the count saturates at `u32::MAX`, weighs fully until the window ends, then fades over the next |
    /// | token bucket (GCRA) | `tat = max(tat, now) + n·T`; a call for m is admitted once `tat + m·T − now ≤ b·T` | `tat` saturates at 2^63 − 2 ns after the clock's epoch (at least 146 years of debt) |
    /// | exact sliding window | min(n, N) timestamps `now` enter the log | one window: the log keeps only its newest N entries, so a charge of N or more refuses everything for W from now |
    ///
    /// In the exact sliding window a charge that fits is taken exactly as an admission; one that
    /// does not claims every slot of the ring at once and writes into them the N latest expiries
    /// of the log with the k new entries (an entry left out expires no later than every one
    /// kept, so the window counts exactly as the whole log would, up to N), the rest of a ring
    /// built larger than its limit (`max_limit`) marked expired: a limit raised later counts
    /// the N entries kept and what came after, as the Redis backend does. A token bucket's debt is
    /// translated by a [`reconfigure`](Self::reconfigure) like any other (scaled by new
    /// capacity / old).
    ///
    /// `n == 0` records nothing and reports the state, as a probe would, but never fails for a
    /// full limiter. Every `n` is accepted: what an algorithm cannot record saturates as above.
    ///
    /// The [`Admission`] says what is left: [`remaining`](Admission::remaining) is 0 while in
    /// debt, and [`reset_after`](Admission::reset_after) is the time until the limiter is back
    /// to its full capacity if nothing else is taken (the end of the window for the fixed
    /// window; for the others, as for an admission). For the time until the next permit, ask
    /// [`try_acquire_n`](Self::try_acquire_n)'s rejection.
    ///
    /// The concurrency limiters offer no `charge`: permits in flight are held and released,
    /// not charged after the fact.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Closed`] if the limiter was [closed](Self::close) (nothing recorded);
    /// never `Rejected` nor `InsufficientCapacity`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ManualClock, Rate, RateLimiter};
    ///
    /// // 100 tokens per second, bursts of up to 100: an LLM gateway charging what a reply used.
    /// let clock = ManualClock::new();
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::TokenBucket { rate: Rate::per_second(100), burst: 100 },
    ///     clock.clone(),
    /// )?;
    /// limiter.try_acquire()?; // admit the request...
    /// let state = limiter.charge(149)?; // ...then charge the 149 tokens its reply used
    /// assert_eq!(state.remaining(), 0); // 50 tokens in debt
    /// assert_eq!(state.reset_after(), Duration::from_millis(1500));
    /// let rejection = *limiter.try_acquire().unwrap_err().rejection().unwrap();
    /// assert_eq!(rejection.retry_after(), Duration::from_millis(510)); // debt + one token
    /// clock.advance(Duration::from_millis(510));
    /// assert!(limiter.try_acquire().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge(&self, n: u32) -> Result<Admission, TryAcquireError> {
        let inner = &*self.inner;
        // Relaxed: as in `try_acquire_n`; only the closed bit matters here, since a charge does
        // not queue and never takes what waiters wait for (it is not admitted: it is recorded).
        if inner.gate.load(Ordering::Relaxed) & CLOSED != 0 {
            return Err(TryAcquireError::Closed);
        }
        inner.state.charge(n, &inner.clock)
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
        let (waiting, queued_permits) = inner.queue.len();
        Stats {
            admitted: inner.counters.sum(ADMITTED),
            rejected: inner.counters.sum(REJECTED),
            cancelled: inner.counters.sum(CANCELLED),
            available: inner.state.available(inner.clock.now()),
            waiting,
            queued_permits,
        }
    }

    /// The algorithm and parameters this limiter runs: those it was built with, or the last
    /// successful [`reconfigure`](Self::reconfigure).
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
        *lock(&self.inner.algorithm)
    }

    /// Changes the limit, window, rate or burst at run time, keeping the state: what was
    /// admitted still counts. Clones share the change; it applies at once to every later call,
    /// and queued waiters look again at once (a waiter whose request no longer fits the new
    /// capacity fails with [`AcquireError::InsufficientCapacity`]).
    ///
    /// How the state carries over, per algorithm:
    ///
    /// - **Fixed window, sliding counter**: the count of the current window is kept (and the
    ///   previous window's, for the counter); a new limit applies to it at once (a count above a
    ///   lowered limit admits nothing until the window ends). A new window length never hands out
    ///   a fresh window: the current window keeps its start and takes the new length (if it is
    ///   already older than that, it ends at the earlier of its old end and now + the new
    ///   length), and the windows after it have the new length.
    /// - **Token bucket**: the bucket stays as *full* as it was (a full bucket stays full, an
    ///   empty one empty, 70 % stays 70 % of the new burst) and refills at the new rate.
    /// - **Sliding window** (exact log): the limit can move anywhere up to the builder's
    ///   [`max_limit`](RateLimiterBuilder::max_limit) (by default the limit it was built with;
    ///   the ring of timestamps is allocated once); admissions already logged keep the expiry
    ///   they were admitted with, and a new window applies to later admissions.
    ///
    /// The parameters are read on the hot path as one consistent snapshot (a seqlock: plain loads,
    /// no lock, no write); a decision is made under one parameter set, never a mix, and a call
    /// that started under the old parameters re-decides if they change before it commits.
    /// Reconfigurations are serialised by a mutex; the hot path never takes it.
    ///
    /// # Errors
    ///
    /// - [`ConfigError::AlgorithmChanged`] if `algorithm` is another kind than the limiter runs
    ///   (state cannot be translated between algorithms);
    /// - [`ConfigError::AboveMaxLimit`] for a sliding window limit above its `max_limit`;
    /// - the constructors' [`ConfigError`]s for parameters that are zero or too large.
    ///
    /// On error nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ConfigError, ManualClock, Rate, RateLimiter};
    ///
    /// let window = Duration::from_secs(60);
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 10, window },
    ///     ManualClock::new(),
    /// )?;
    /// limiter.try_acquire_n(8)?;
    /// // Raise the limit: the 8 already admitted in this window still count.
    /// limiter.reconfigure(Algorithm::FixedWindow { limit: 12, window })?;
    /// assert_eq!(limiter.try_acquire_n(4)?.remaining(), 0);
    /// assert_eq!(limiter.capacity(), 12);
    /// // Another algorithm is a typed error, and changes nothing.
    /// let bucket = Algorithm::TokenBucket { rate: Rate::per_second(1), burst: 1 };
    /// assert!(matches!(limiter.reconfigure(bucket), Err(ConfigError::AlgorithmChanged { .. })));
    /// assert_eq!(limiter.algorithm(), Algorithm::FixedWindow { limit: 12, window });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reconfigure(&self, algorithm: Algorithm) -> Result<(), ConfigError> {
        let inner = &*self.inner;
        let mut current = lock(&inner.algorithm);
        inner.state.reconfigure(*current, algorithm, &inner.clock)?;
        *current = algorithm;
        // Waiters look again under the new parameters: the head may be admissible earlier, and
        // a request above the new capacity can never succeed now. The sweep runs under the
        // mutex: run after it, for a capacity another reconfiguration has since replaced, it
        // failed waiters that fit the capacity in force (loom_waiters,
        // `rate_reconfigure_sweep_never_uses_a_superseded_capacity`). The wake-ups run after it,
        // since a woken task's `Waker` may call `algorithm()`, which takes the same mutex.
        let woken = inner
            .queue
            .reconfigure_waiters_and_bound(&inner.gate, inner.state.limit());
        drop(current);
        // Chain callers sleeping on the old parameters look again too, even if a waker panics.
        let _watchers = inner.watchers.notify_on_drop();
        woken.wake();
        Ok(())
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

    /// Waits until one permit is admitted. See [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future consumes no permit and frees its place in the queue.
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
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) },
    ///     TokioClock::new(),
    /// )?;
    /// let start = tokio::time::Instant::now();
    /// limiter.acquire().await?;
    /// limiter.acquire().await?; // waits for the next window
    /// assert_eq!(start.elapsed(), Duration::from_secs(1));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[inline]
    pub fn acquire(&self) -> impl Future<Output = Result<Admission, AcquireError>> + Send + '_ {
        self.acquire_n(1)
    }

    /// Waits until `n` permits are admitted at once, in a fair, bounded queue.
    ///
    /// If nobody is queued and the permits are available, this returns at the first poll without
    /// touching the queue. Otherwise the caller joins the queue. Waiters are served in
    /// [`QueueOrder`] (oldest first by default; a large request at the head is not overtaken). The
    /// head waiter sleeps for exactly the time the algorithm says its permits free (no polling, no
    /// background task); when it is served, the next waiter becomes the head. `n == 0` waits until
    /// a permit is available and consumes nothing.
    ///
    /// Runs on any executor. A waiter that must sleep does so on tokio's timer when it starts to
    /// sleep inside a tokio runtime (which must then have its time driver enabled), and on
    /// futures-timer's helper thread anywhere else (`futures::executor::block_on`, smol,
    /// async-std). With tokio's paused time, give the limiter a [`TokioClock`](crate::TokioClock)
    /// so that both read the same time.
    ///
    /// # Errors
    ///
    /// - [`AcquireError::InsufficientCapacity`] at once if `n` exceeds the limit (or burst), or
    ///   as soon as a [`reconfigure`](Self::reconfigure) lowers it below `n` while this call
    ///   waits (a racing one included).
    /// - [`AcquireError::QueueFull`] at once if the queue has no room for `n` more permits, or
    ///   later if a newest-first queue fails this (oldest) waiter to make room.
    /// - [`AcquireError::Closed`] if the limiter is or gets [closed](Self::close); a closed
    ///   limiter says so first, whatever `n`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future at any await point (a `tokio::time::timeout`, a `select!`
    /// branch, an aborted task) consumes no permit, frees its place in the queue and, if it was
    /// the head, wakes the next waiter. It is counted in [`Stats::cancelled`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Rate, RateLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 5 },
    ///     TokioClock::new(),
    /// )?;
    /// let start = tokio::time::Instant::now();
    /// limiter.acquire_n(5).await?; // the full burst, at once
    /// limiter.acquire_n(5).await?; // five more permits take 500 ms to accrue
    /// assert_eq!(start.elapsed(), Duration::from_millis(500));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[inline]
    pub fn acquire_n(
        &self,
        n: u32,
    ) -> impl Future<Output = Result<Admission, AcquireError>> + Send + '_ {
        crate::queue::Acquire::new(RateAcquire { limiter: self, n })
    }

    #[cfg(feature = "tokio")]
    async fn acquire_slow(&self, n: u32) -> Result<Admission, AcquireError> {
        let inner = &*self.inner;
        // Dropped after the wait (declared before it): chain callers held back by this waiter
        // look again once it has given up (see `Watchers::notify_if_given_up`).
        let gave_up = inner.watchers.notify_if_given_up();
        let mut timer = crate::queue::Timer::default();
        let outcome = inner
            .wait(n)
            .run_async(
                || inner.take(n),
                |admission| inner.give_back(n, &admission),
                |cx, nanos| timer.poll(cx, nanos),
            )
            .await;
        gave_up.ended(&outcome);
        outcome
    }

    /// [`acquire_n`](Self::acquire_n)'s fast path for a receipt: the admission and the
    /// parameters' version read before it (see `Inner::take_versioned`).
    #[cfg(feature = "tokio")]
    #[inline(always)]
    pub(crate) fn receipt_fast(&self, n: u32) -> Poll<Result<(Admission, u64), AcquireError>> {
        let inner = &*self.inner;
        inner.acquire_fast_with(n, || inner.try_acquire_versioned(n))
    }

    /// [`acquire_n`](Self::acquire_n)'s wait in the queue for a receipt: the head's admission
    /// with the version it read before deciding.
    #[cfg(feature = "tokio")]
    pub(crate) async fn receipt_slow(&self, n: u32) -> Result<(Admission, u64), AcquireError> {
        let inner = &*self.inner;
        // As in `acquire_slow`.
        let gave_up = inner.watchers.notify_if_given_up();
        let mut timer = crate::queue::Timer::default();
        let outcome = inner
            .wait(n)
            .run_async(
                || inner.take_versioned(n),
                |(admission, _)| inner.give_back(n, &admission),
                |cx, nanos| timer.poll(cx, nanos),
            )
            .await;
        gave_up.ended(&outcome);
        outcome
    }

    /// [`blocking`](Self::blocking) for a receipt: the fast path and the head's attempt each
    /// read the version before deciding.
    pub(crate) fn receipt_blocking(
        &self,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<(Admission, u64), AcquireError> {
        let inner = &*self.inner;
        if let Poll::Ready(outcome) = inner.acquire_fast_with(n, || inner.try_acquire_versioned(n))
        {
            return outcome;
        }
        // As in `acquire_slow`.
        let gave_up = inner.watchers.notify_if_given_up();
        let outcome = inner.wait(n).run_blocking(
            || inner.take_versioned(n),
            |(admission, _)| inner.give_back(n, &admission),
            deadline,
        );
        gave_up.ended(&outcome);
        outcome
    }

    /// [`acquire_n`](Self::acquire_n) with a time limit; on timeout nothing is consumed.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n), and [`AcquireError::Timeout`] when `timeout` passes
    /// first.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`acquire_n`](Self::acquire_n).
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
    ///     Algorithm::SlidingWindow { limit: 1, window: Duration::from_secs(10) },
    ///     TokioClock::new(),
    /// )?;
    /// limiter.acquire().await?;
    /// let late = limiter.acquire_timeout(1, Duration::from_secs(1)).await;
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// assert_eq!(limiter.stats().waiting, 0);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> Result<Admission, AcquireError> {
        crate::queue::timeout(timeout, self.acquire_n(n)).await
    }

    /// Blocks the calling thread until one permit is admitted. See
    /// [`acquire_blocking_n`](Self::acquire_blocking_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_blocking_n`](Self::acquire_blocking_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, MonotonicClock, RateLimiter};
    ///
    /// let limiter = RateLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_millis(20) },
    ///     MonotonicClock::new(),
    /// )?;
    /// let first = limiter.acquire_blocking()?;
    /// let second = limiter.acquire_blocking()?; // the next 20 ms window
    /// let window = |t: Duration| t.as_millis() / 20;
    /// assert!(window(second.at()) > window(first.at()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking(&self) -> Result<Admission, AcquireError> {
        self.acquire_blocking_n(1)
    }

    /// Blocks the calling thread until `n` permits are admitted, in the same fair, bounded queue as
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n)")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`")]
    /// (async and blocking waiters share it).
    ///
    /// The head waiter parks the thread for exactly the time the algorithm says its permits free;
    /// the others wait, without polling, to be woken as the head.
    ///
    /// For threads, not async tasks: on a thread that runs tasks (a tokio worker, a `block_on`)
    /// it stalls them for the whole wait. The head parks for real time, whatever the limiter's
    /// clock: advancing a [`ManualClock`](crate::ManualClock), or tokio's paused time for a
    /// `TokioClock`, does not wake it (it wakes when that much real time has passed, and reads
    /// the clock wherever it is then).
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
    /// use turnstile::{Rate, RateLimiter};
    ///
    /// let limiter = RateLimiter::token_bucket(Rate::per_second(1000), 10)?;
    /// let threads: Vec<_> = (0..4)
    ///     .map(|_| {
    ///         let limiter = limiter.clone();
    ///         std::thread::spawn(move || limiter.acquire_blocking_n(5).map(|_| ()))
    ///     })
    ///     .collect();
    /// for t in threads {
    ///     t.join().unwrap()?;
    /// }
    /// assert_eq!(limiter.stats().admitted, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_n(&self, n: u32) -> Result<Admission, AcquireError> {
        self.blocking(n, None)
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n) with a time limit (real time); on timeout
    /// nothing is consumed and the waiter leaves the queue.
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
    /// limiter.acquire_blocking()?;
    /// let late = limiter.acquire_blocking_timeout(1, Duration::from_millis(10));
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> Result<Admission, AcquireError> {
        self.blocking(n, std::time::Instant::now().checked_add(timeout))
    }

    fn blocking(
        &self,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<Admission, AcquireError> {
        let inner = &*self.inner;
        if let Poll::Ready(outcome) = inner.acquire_fast(n) {
            return outcome;
        }
        // As in `acquire_slow`.
        let gave_up = inner.watchers.notify_if_given_up();
        let outcome = inner.wait(n).run_blocking(
            || inner.take(n),
            |admission| inner.give_back(n, &admission),
            deadline,
        );
        gave_up.ended(&outcome);
        outcome
    }

    /// Closes the limiter: every queued waiter fails with [`AcquireError::Closed`], and every later
    /// `try_acquire` or `acquire` fails at once. Closing twice is harmless.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{RateLimiter, TryAcquireError};
    ///
    /// let limiter = RateLimiter::fixed_window(10, Duration::from_secs(1))?;
    /// limiter.close();
    /// assert!(limiter.is_closed());
    /// assert_eq!(limiter.try_acquire().unwrap_err(), TryAcquireError::Closed);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn close(&self) {
        let inner = &*self.inner;
        // Chain callers sleeping on this limiter fail now rather than when their sleep ends;
        // told after the closed bit is set, and even if a queued waiter's waker panics.
        let _watchers = inner.watchers.notify_on_drop();
        inner.queue.close(&inner.gate);
    }

    /// Whether [`close`](Self::close) was called.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::RateLimiter;
    ///
    /// let limiter = RateLimiter::fixed_window(10, Duration::from_secs(1))?;
    /// assert!(!limiter.is_closed());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn is_closed(&self) -> bool {
        // Relaxed: a snapshot.
        self.inner.gate.load(Ordering::Relaxed) & CLOSED != 0
    }

    /// The order queued waiters are served in.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{QueueOrder, RateLimiter};
    ///
    /// let limiter = RateLimiter::fixed_window(10, Duration::from_secs(1))?;
    /// assert_eq!(limiter.queue_order(), QueueOrder::OldestFirst);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_order(&self) -> QueueOrder {
        self.inner.queue.order()
    }

    /// The most permits that may wait in the queue at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{RateLimiter, DEFAULT_QUEUE_LIMIT};
    ///
    /// let limiter = RateLimiter::fixed_window(10, Duration::from_secs(1))?;
    /// assert_eq!(limiter.queue_limit(), DEFAULT_QUEUE_LIMIT);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_limit(&self) -> u64 {
        self.inner.queue.limit()
    }
}

/// The two halves of [`RateLimiter::acquire_n`].
#[cfg(feature = "tokio")]
struct RateAcquire<'a, C: Clock> {
    limiter: &'a RateLimiter<C>,
    n: u32,
}

#[cfg(feature = "tokio")]
impl<'a, C: Clock> crate::queue::Phases<'a> for RateAcquire<'a, C> {
    type Output = Admission;

    #[inline(always)]
    fn fast(&mut self) -> Poll<Result<Admission, AcquireError>> {
        self.limiter.inner.acquire_fast(self.n)
    }

    fn slow(&mut self) -> crate::queue::SlowWait<'a, Admission> {
        Box::pin(self.limiter.acquire_slow(self.n))
    }
}

/// What a [`Chain`](crate::Chain) needs from a member: decisions without statistics, refunds, and
/// one count per chain call.
impl<C: Clock> RateLimiter<C> {
    /// The gate and the algorithm, counting nothing: with `COMMIT` the permits are taken, without
    /// it `n.max(1)` permits are only checked.
    #[inline]
    pub(crate) fn chain_decide<const COMMIT: bool>(
        &self,
        n: u32,
    ) -> Result<Admission, TryAcquireError> {
        self.inner.decide::<COMMIT>(n)
    }

    /// Gives back an admission `chain_decide::<true>` returned (see [`Algo::refund`]). The
    /// chain then wakes this limiter's head ([`chain_wake`](Self::chain_wake)), once every
    /// member it refunds has its permits back.
    pub(crate) fn chain_refund(&self, n: u32, admission: &Admission) {
        let inner = &*self.inner;
        inner.state.refund(n, admission, &inner.clock);
    }

    /// The parameters' version now, read by a receipt before its admission
    /// ([`try_acquire_refundable`](Self::try_acquire_refundable)).
    pub(crate) fn params_version(&self) -> u64 {
        self.inner.state.version()
    }

    /// [`chain_refund`](Self::chain_refund) for a receipt, which can come any time later: only
    /// if the parameters are still those of `version`, read before the admission. An admission
    /// is decided under a version at least that one, so an unchanged version now is the
    /// admission's own. Under the reconfiguration mutex, so that no reconfiguration lands
    /// between that check and the refund. (The admission's token keeps only some bits of the
    /// version, 7 for the exact sliding window: enough for a chain's immediate refund, not for a
    /// receipt held across 128 reconfigurations.)
    pub(crate) fn receipt_refund(&self, n: u32, admission: &Admission, version: u64) {
        let inner = &*self.inner;
        let _reconfiguring = lock(&inner.algorithm);
        if inner.state.version() == version {
            inner.state.refund(n, admission, &inner.clock);
        }
    }

    /// Wakes the head of this limiter's queue after a refund: a waiter that queued since the
    /// refunded admission sleeps until the time the algorithm reported then, while the permits
    /// given back are free now and `try_acquire` defers to it (oldest first), so without the
    /// wake they would sit unused until its timer fired.
    ///
    /// It takes the queue's mutex whether or not `WAITERS` is set: the head sets that bit and
    /// then reads the algorithm's state, and a refund writes the state and would then read the
    /// bit, so a check without a full fence on both sides could miss the head while the head
    /// missed the refund. Under the mutex, either the refund comes before the head's attempt
    /// (which sees it) or after its registration (which this wakes). A refund is the cold path
    /// of a chain that lost a race; the lock costs nothing on the paths that admit. Chain
    /// callers sleeping on this limiter are told as well (`crate::watchers`), all but `except`,
    /// the caller whose refund this is.
    pub(crate) fn chain_wake(&self, except: Option<&Watcher>) {
        let _watchers = self.inner.watchers.notify_on_drop_except(except);
        self.inner.queue.wake_head();
    }

    /// The chain callers sleeping on this limiter.
    pub(crate) fn chain_watchers(&self) -> &Watchers {
        &self.inner.watchers
    }

    /// Whether `other` is a handle to this very limiter (a chain member listed twice).
    pub(crate) fn chain_same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether refunds are exact (every algorithm but the exact sliding window).
    pub(crate) fn chain_exact_refund(&self) -> bool {
        self.inner.state.exact_refund()
    }

    /// [`Algo::beyond_limit`] now, for a chain's refusal behind its queue.
    pub(crate) fn chain_beyond_limit(&self, at_limit: u64, extra: u64) -> u64 {
        (self.inner.state).beyond_limit(&self.inner.clock, at_limit, extra)
    }

    /// Counts one chain call on this member's statistics.
    pub(crate) fn chain_count(&self, which: usize) {
        self.inner.counters.bump(which);
    }

    /// Brings the clock up to date before a retry after sleeping.
    pub(crate) fn chain_catch_up(&self) {
        self.inner.clock.catch_up();
    }
}
