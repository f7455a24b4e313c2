//! [`ConcurrencyLimiter`]: at most N permits in flight, released by a guard's `Drop`.

use crate::error::{AcquireError, ConfigError, TryPermitError};
use crate::limiter::Stats;
use crate::queue::{
    no_timer, Acquire, Blocked, Phases, QueueOrder, SlowWait, Wait, WaitQueue, CLOSED,
    DEFAULT_QUEUE_LIMIT, WAITERS,
};
use crate::sync::{Arc, AtomicU64, Counters, Ordering, ADMITTED, CANCELLED, REJECTED};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

/// Permits free in a permit word (its low 32 bits).
#[inline(always)]
fn free(word: u64) -> u32 {
    word as u32
}

/// At most `limit` permits in flight at once: "at most 10 callers of this method at the same
/// moment".
///
/// Permits are guards ([`Permit`], or [`OwnedPermit`] for spawned tasks) that give their permits
/// back on `Drop`. `try_acquire` never blocks; `acquire().await` and `acquire_blocking()` wait in a
/// fair, bounded queue shared by async and blocking callers (see [`QueueOrder`]).
///
/// **Lock-free when nobody waits.** The state is one atomic word:
///
/// | bits 63..34 | bit 33 | bit 32 | bits 31..0 |
/// |---|---|---|---|
/// | zero | closed | waiters queued | permits free |
///
/// | operation | word before | effect |
/// |---|---|---|
/// | `try_acquire_n(n)` | free ≥ n, no waiters (oldest-first), not closed | CAS: free − n |
/// | `try_acquire_n(n)` | otherwise | fails, writes nothing |
/// | release of n | any | `fetch_add(n)`; if the waiters bit was set, wake the queue's head |
/// | the head's attempt (under the queue's mutex) | free ≥ n | CAS: free − n |
///
/// A release is a single wait-free `fetch_add` unless someone is queued; then it also takes the
/// queue's mutex to wake the head (tokio's `Semaphore` takes its mutex on every release). Free
/// permits never exceed the limit, so the add never carries into the flag bits.
///
/// Clones share state.
///
/// # Examples
///
/// ```
/// use turnstile::ConcurrencyLimiter;
///
/// let limiter = ConcurrencyLimiter::new(2)?;
/// let a = limiter.try_acquire().unwrap();
/// let b = limiter.try_acquire().unwrap();
/// assert!(limiter.try_acquire().is_err()); // two in flight
/// drop(a);
/// assert!(limiter.try_acquire().is_ok());
/// # drop(b);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
pub struct ConcurrencyLimiter {
    inner: Arc<Inner>,
}

struct Inner {
    /// The permit word; see the table on [`ConcurrencyLimiter`].
    word: CachePadded<AtomicU64>,
    limit: u32,
    counters: Counters,
    queue: WaitQueue,
}

impl Clone for ConcurrencyLimiter {
    fn clone(&self) -> Self {
        ConcurrencyLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl fmt::Debug for ConcurrencyLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimiter")
            .field("limit", &self.inner.limit)
            .field("available", &self.available())
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Takes `n` permits if free (`n == 0`: checks that one is). `barging` is false for the
    /// queue's head, which may take permits while `WAITERS` is set.
    #[inline(always)]
    fn take(&self, n: u32, respect_queue: bool) -> Result<(), TryPermitError> {
        // Relaxed: the value only seeds the CAS, whose success ordering does the synchronising.
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            if respect_queue && word & (WAITERS | CLOSED) != 0 {
                if word & CLOSED != 0 {
                    return Err(TryPermitError::Closed);
                }
                if self.queue.order() == QueueOrder::OldestFirst {
                    return Err(TryPermitError::NoPermits {
                        available: free(word),
                        requested: n,
                    });
                }
            }
            if free(word) < n.max(1) {
                return Err(TryPermitError::NoPermits {
                    available: free(word),
                    requested: n,
                });
            }
            if n == 0 {
                return Ok(());
            }
            // Acquire on success: pairs with the Release `fetch_add` of the releases that freed
            // these permits, so the previous holders' work happens before ours (a semaphore's
            // contract). Relaxed on failure: we only retry with the value.
            match self.word.compare_exchange_weak(
                word,
                word - u64::from(n),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => word = actual,
            }
        }
    }

    fn try_acquire(&self, n: u32) -> Result<(), TryPermitError> {
        let outcome = if n > self.limit {
            Err(TryPermitError::InsufficientCapacity {
                requested: n,
                capacity: self.limit,
            })
        } else {
            self.take(n, true)
        };
        self.counters
            .bump(if outcome.is_ok() { ADMITTED } else { REJECTED });
        outcome
    }

    /// The head's attempt, under the queue's mutex.
    fn take_head(&self, n: u32) -> Result<(), Blocked> {
        self.take(n, false).map_err(|_| Blocked::Release)
    }

    /// Validates and tries the fast path; `Pending` means "queue up".
    #[inline(always)]
    fn acquire_fast(&self, n: u32) -> Poll<Result<(), AcquireError>> {
        let error = if n > self.limit {
            AcquireError::InsufficientCapacity {
                requested: n,
                capacity: self.limit,
            }
        } else {
            match self.take(n, true) {
                Ok(()) => {
                    self.counters.bump(ADMITTED);
                    return Poll::Ready(Ok(()));
                }
                Err(TryPermitError::Closed) => AcquireError::Closed,
                Err(_) => return Poll::Pending,
            }
        };
        self.counters.bump(REJECTED);
        Poll::Ready(Err(error))
    }

    fn wait(&self, n: u32) -> Wait<'_> {
        Wait {
            queue: &self.queue,
            gate: &self.word,
            counters: &self.counters,
            permits: n,
            retry_closed: false,
        }
    }

    /// The wait in the queue, after the fast path said to queue up.
    async fn acquire_slow(&self, n: u32) -> Result<(), AcquireError> {
        self.wait(n).run_async(|| self.take_head(n), no_timer).await
    }

    fn acquire_blocking(
        &self,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<(), AcquireError> {
        if let Poll::Ready(outcome) = self.acquire_fast(n) {
            return outcome;
        }
        self.wait(n).run_blocking(|| self.take_head(n), deadline)
    }

    /// Gives `n` permits back. Lock-free unless someone is queued.
    #[inline]
    fn release(&self, n: u32) {
        if n == 0 {
            return;
        }
        // Release: our holder's work happens before the next acquirer's (pairs with the Acquire
        // CAS in `take`). The waiters bit comes back with the old value: if it was set, our add
        // is ordered before the head's next attempt or after its registration (see queue.rs), so
        // waking it under the mutex loses nothing.
        let before = self.word.fetch_add(u64::from(n), Ordering::Release);
        if before & WAITERS != 0 {
            self.queue.wake_head();
        }
    }
}

impl ConcurrencyLimiter {
    /// A limiter allowing `limit` permits in flight, with the default queue (oldest first,
    /// [`DEFAULT_QUEUE_LIMIT`] permits).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] if `limit` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(10)?;
    /// assert_eq!(limiter.limit(), 10);
    /// assert!(ConcurrencyLimiter::new(0).is_err());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn new(limit: u32) -> Result<Self, ConfigError> {
        Self::builder(limit).build()
    }

    /// A builder for the queue settings.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConcurrencyLimiter, QueueOrder};
    ///
    /// let limiter = ConcurrencyLimiter::builder(4).queue_limit(100).build()?;
    /// assert_eq!(limiter.queue_limit(), 100);
    /// assert_eq!(limiter.queue_order(), QueueOrder::OldestFirst);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn builder(limit: u32) -> ConcurrencyLimiterBuilder {
        ConcurrencyLimiterBuilder {
            limit,
            order: QueueOrder::OldestFirst,
            queue_limit: DEFAULT_QUEUE_LIMIT,
        }
    }

    /// Takes one permit if one is free and nobody is queued ahead (oldest-first order). Never
    /// blocks; a failure writes no shared memory.
    ///
    /// # Errors
    ///
    /// [`TryPermitError::NoPermits`] or [`TryPermitError::Closed`].
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(1)?;
    /// let permit = limiter.try_acquire().unwrap();
    /// assert_eq!(permit.permits(), 1);
    /// assert_eq!(limiter.available(), 0);
    /// drop(permit);
    /// assert_eq!(limiter.available(), 1);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn try_acquire(&self) -> Result<Permit<'_>, TryPermitError> {
        self.try_acquire_n(1)
    }

    /// Takes `n` permits at once if they are free; otherwise none. `n == 0` succeeds iff a permit
    /// is free, holding nothing.
    ///
    /// **No barging.** Under [`QueueOrder::OldestFirst`] this fails while anyone is queued.
    ///
    /// # Errors
    ///
    /// [`TryPermitError::NoPermits`], [`TryPermitError::InsufficientCapacity`] (`n` > limit) or
    /// [`TryPermitError::Closed`].
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConcurrencyLimiter, TryPermitError};
    ///
    /// let limiter = ConcurrencyLimiter::new(4)?;
    /// let three = limiter.try_acquire_n(3).unwrap();
    /// assert!(matches!(limiter.try_acquire_n(2), Err(TryPermitError::NoPermits { available: 1, .. })));
    /// assert!(matches!(limiter.try_acquire_n(5), Err(TryPermitError::InsufficientCapacity { .. })));
    /// # drop(three);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire_n(&self, n: u32) -> Result<Permit<'_>, TryPermitError> {
        self.inner.try_acquire(n)?;
        Ok(Permit {
            limiter: &self.inner,
            permits: n,
        })
    }

    /// [`try_acquire_n`](Self::try_acquire_n) returning a `'static` permit for spawned tasks.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(1)?;
    /// let permit = limiter.try_acquire_owned(1).unwrap();
    /// std::thread::spawn(move || drop(permit)).join().unwrap();
    /// assert_eq!(limiter.available(), 1);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn try_acquire_owned(&self, n: u32) -> Result<OwnedPermit, TryPermitError> {
        self.inner.try_acquire(n)?;
        Ok(OwnedPermit {
            limiter: self.clone(),
            permits: n,
        })
    }

    /// Waits for one permit. See [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future holds no permit and frees its place in the queue.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = ConcurrencyLimiter::new(1)?;
    /// let permit = limiter.acquire().await?;
    /// let waiter = {
    ///     let limiter = limiter.clone();
    ///     tokio::spawn(async move { limiter.acquire_owned(1).await.map(|p| p.permits()) })
    /// };
    /// tokio::task::yield_now().await;
    /// drop(permit); // wakes the waiter
    /// assert_eq!(waiter.await??, 1);
    /// # Ok(())
    /// # }
    /// ```
    #[inline]
    pub fn acquire(&self) -> impl Future<Output = Result<Permit<'_>, AcquireError>> + Send + '_ {
        self.acquire_n(1)
    }

    /// Waits until `n` permits can be held at once, in a fair, bounded queue.
    ///
    /// If nobody is queued and the permits are free, this returns at the first poll. Otherwise the
    /// caller joins the queue; the head is woken by the release that may let it proceed, and the
    /// next waiter when the head leaves. `n == 0` waits until a permit is free and holds nothing.
    /// Runtime-agnostic: needs no timer.
    ///
    /// # Errors
    ///
    /// - [`AcquireError::InsufficientCapacity`] at once if `n` exceeds the limit.
    /// - [`AcquireError::QueueFull`] if the queue has no room (or, newest-first, this waiter was
    ///   among the oldest failed to make room).
    /// - [`AcquireError::Closed`] if the limiter is or gets closed.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future at any await point holds no permit, frees its place in the
    /// queue and, if it was the head, wakes the next waiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = ConcurrencyLimiter::new(3)?;
    /// let permit = limiter.acquire_n(3).await?;
    /// assert_eq!(limiter.available(), 0);
    /// drop(permit);
    /// assert_eq!(limiter.available(), 3);
    /// # Ok(())
    /// # }
    /// ```
    #[inline]
    pub fn acquire_n(
        &self,
        n: u32,
    ) -> impl Future<Output = Result<Permit<'_>, AcquireError>> + Send + '_ {
        Acquire::new(Borrowed {
            inner: &self.inner,
            n,
        })
    }

    /// Waits for `n` permits and returns a `'static` guard; the future itself is `'static` too, so
    /// it can be spawned.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`acquire_n`](Self::acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = ConcurrencyLimiter::new(2)?;
    /// let task = tokio::spawn(limiter.acquire_owned(2));
    /// let permit = task.await??;
    /// assert_eq!(limiter.available(), 0);
    /// drop(permit);
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_owned(
        &self,
        n: u32,
    ) -> impl Future<Output = Result<OwnedPermit, AcquireError>> + Send + 'static {
        Acquire::new(Owned {
            limiter: self.clone(),
            n,
        })
    }

    /// [`acquire_n`](Self::acquire_n) with a time limit; on timeout nothing is held.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n), and [`AcquireError::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`acquire_n`](Self::acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{AcquireError, ConcurrencyLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = ConcurrencyLimiter::new(1)?;
    /// let _held = limiter.acquire().await?;
    /// let late = limiter.acquire_timeout(1, Duration::from_secs(1)).await;
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> Result<Permit<'_>, AcquireError> {
        match tokio::time::timeout(timeout, self.acquire_n(n)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(AcquireError::Timeout),
        }
    }

    /// Blocks the calling thread until one permit is free. See
    /// [`acquire_blocking_n`](Self::acquire_blocking_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(1)?;
    /// let permit = limiter.acquire_blocking()?;
    /// assert_eq!(limiter.available(), 0);
    /// drop(permit);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking(&self) -> Result<Permit<'_>, AcquireError> {
        self.acquire_blocking_n(1)
    }

    /// Blocks the calling thread until `n` permits can be held, in the same queue as the async
    /// waiters. The thread sleeps on a futex (atomic-wait) until a release or a promotion wakes it.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(2)?;
    /// let inside = AtomicU32::new(0);
    /// std::thread::scope(|s| {
    ///     for _ in 0..8 {
    ///         s.spawn(|| {
    ///             let _permit = limiter.acquire_blocking_n(1).unwrap();
    ///             assert!(inside.fetch_add(1, Ordering::SeqCst) < 2);
    ///             std::thread::yield_now();
    ///             inside.fetch_sub(1, Ordering::SeqCst);
    ///         });
    ///     }
    /// });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_n(&self, n: u32) -> Result<Permit<'_>, AcquireError> {
        self.inner.acquire_blocking(n, None)?;
        Ok(Permit {
            limiter: &self.inner,
            permits: n,
        })
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n) with a time limit.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n), and [`AcquireError::Timeout`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{AcquireError, ConcurrencyLimiter};
    ///
    /// let limiter = ConcurrencyLimiter::new(1)?;
    /// let _held = limiter.acquire_blocking()?;
    /// let late = limiter.acquire_blocking_timeout(1, Duration::from_millis(10));
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> Result<Permit<'_>, AcquireError> {
        let deadline = std::time::Instant::now().checked_add(timeout);
        self.inner.acquire_blocking(n, deadline)?;
        Ok(Permit {
            limiter: &self.inner,
            permits: n,
        })
    }

    /// Closes the limiter: queued waiters fail with [`AcquireError::Closed`], later acquisitions
    /// fail at once. Permits already held stay valid and are returned as usual.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConcurrencyLimiter, TryPermitError};
    ///
    /// let limiter = ConcurrencyLimiter::new(1)?;
    /// limiter.close();
    /// assert!(limiter.is_closed());
    /// assert_eq!(limiter.try_acquire().unwrap_err(), TryPermitError::Closed);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn close(&self) {
        self.inner.queue.close(&self.inner.word);
    }

    /// Whether [`close`](Self::close) was called.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// assert!(!ConcurrencyLimiter::new(1)?.is_closed());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn is_closed(&self) -> bool {
        // Relaxed: a snapshot.
        self.inner.word.load(Ordering::Relaxed) & CLOSED != 0
    }

    /// The most permits in flight at once.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// assert_eq!(ConcurrencyLimiter::new(7)?.limit(), 7);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn limit(&self) -> u32 {
        self.inner.limit
    }

    /// Permits free now (a snapshot).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(5)?;
    /// let _two = limiter.try_acquire_n(2).unwrap();
    /// assert_eq!(limiter.available(), 3);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn available(&self) -> u32 {
        // Relaxed: a snapshot.
        free(self.inner.word.load(Ordering::Relaxed))
    }

    /// The order queued waiters are served in.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConcurrencyLimiter, QueueOrder};
    ///
    /// assert_eq!(ConcurrencyLimiter::new(1)?.queue_order(), QueueOrder::OldestFirst);
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
    /// use turnstile::{ConcurrencyLimiter, DEFAULT_QUEUE_LIMIT};
    ///
    /// assert_eq!(ConcurrencyLimiter::new(1)?.queue_limit(), DEFAULT_QUEUE_LIMIT);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_limit(&self) -> u64 {
        self.inner.queue.limit()
    }

    /// Counts so far, permits free, and the queue.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(1)?;
    /// let held = limiter.try_acquire().unwrap();
    /// let _ = limiter.try_acquire();
    /// let stats = limiter.stats();
    /// assert_eq!((stats.admitted, stats.rejected, stats.available), (1, 1, 0));
    /// # drop(held);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn stats(&self) -> Stats {
        let inner = &*self.inner;
        let (waiting, queued_permits) = inner.queue.len();
        Stats {
            admitted: inner.counters.sum(ADMITTED),
            rejected: inner.counters.sum(REJECTED),
            cancelled: inner.counters.sum(CANCELLED),
            available: self.available(),
            waiting,
            queued_permits,
        }
    }
}

/// Builds a [`ConcurrencyLimiter`]; see [`ConcurrencyLimiter::builder`].
///
/// # Examples
///
/// ```
/// use turnstile::{ConcurrencyLimiter, QueueOrder};
///
/// let limiter = ConcurrencyLimiter::builder(8)
///     .queue_order(QueueOrder::NewestFirst)
///     .queue_limit(64)
///     .build()?;
/// assert_eq!(limiter.limit(), 8);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ConcurrencyLimiterBuilder {
    limit: u32,
    order: QueueOrder,
    queue_limit: u64,
}

impl ConcurrencyLimiterBuilder {
    /// The order queued waiters are served in (default: [`QueueOrder::OldestFirst`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConcurrencyLimiter, QueueOrder};
    ///
    /// let limiter = ConcurrencyLimiter::builder(1).queue_order(QueueOrder::NewestFirst).build()?;
    /// assert_eq!(limiter.queue_order(), QueueOrder::NewestFirst);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_order(mut self, order: QueueOrder) -> Self {
        self.order = order;
        self
    }

    /// The most permits that may wait at once (default: [`DEFAULT_QUEUE_LIMIT`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::builder(1).queue_limit(0).build()?;
    /// let _held = limiter.try_acquire().unwrap();
    /// assert!(limiter.acquire_blocking().is_err()); // no room to wait
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_limit(mut self, permits: u64) -> Self {
        self.queue_limit = permits;
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] if the limit is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// assert!(ConcurrencyLimiter::builder(0).build().is_err());
    /// ```
    pub fn build(self) -> Result<ConcurrencyLimiter, ConfigError> {
        if self.limit == 0 {
            return Err(ConfigError::Zero { what: "limit" });
        }
        Ok(ConcurrencyLimiter {
            inner: Arc::new(Inner {
                word: CachePadded::new(AtomicU64::new(u64::from(self.limit))),
                limit: self.limit,
                counters: Counters::new(),
                queue: WaitQueue::new(self.order, self.queue_limit),
            }),
        })
    }
}

/// The two halves of [`ConcurrencyLimiter::acquire_n`].
struct Borrowed<'a> {
    inner: &'a Inner,
    n: u32,
}

impl<'a> Phases<'a> for Borrowed<'a> {
    type Output = Permit<'a>;

    #[inline(always)]
    fn fast(&mut self) -> Poll<Result<Permit<'a>, AcquireError>> {
        let (inner, permits) = (self.inner, self.n);
        match inner.acquire_fast(permits) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(Permit {
                limiter: inner,
                permits,
            })),
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn slow(&mut self) -> SlowWait<'a, Permit<'a>> {
        let (inner, permits) = (self.inner, self.n);
        Box::pin(async move {
            inner.acquire_slow(permits).await?;
            Ok(Permit {
                limiter: inner,
                permits,
            })
        })
    }
}

/// The two halves of [`ConcurrencyLimiter::acquire_owned`].
struct Owned {
    limiter: ConcurrencyLimiter,
    n: u32,
}

impl Phases<'static> for Owned {
    type Output = OwnedPermit;

    #[inline(always)]
    fn fast(&mut self) -> Poll<Result<OwnedPermit, AcquireError>> {
        match self.limiter.inner.acquire_fast(self.n) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(OwnedPermit {
                limiter: self.limiter.clone(),
                permits: self.n,
            })),
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn slow(&mut self) -> SlowWait<'static, OwnedPermit> {
        let (limiter, permits) = (self.limiter.clone(), self.n);
        Box::pin(async move {
            limiter.inner.acquire_slow(permits).await?;
            Ok(OwnedPermit { limiter, permits })
        })
    }
}

/// Permits held from a [`ConcurrencyLimiter`], given back on `Drop`.
///
/// # Examples
///
/// ```
/// use turnstile::ConcurrencyLimiter;
///
/// let limiter = ConcurrencyLimiter::new(3)?;
/// {
///     let permit = limiter.try_acquire_n(2).unwrap();
///     assert_eq!(permit.permits(), 2);
///     assert_eq!(limiter.available(), 1);
/// }
/// assert_eq!(limiter.available(), 3);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[must_use = "the permits are given back as soon as the guard is dropped"]
pub struct Permit<'a> {
    limiter: &'a Inner,
    permits: u32,
}

impl Permit<'_> {
    /// How many permits this guard holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(3)?;
    /// assert_eq!(limiter.try_acquire_n(3).unwrap().permits(), 3);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.limiter.release(self.permits);
    }
}

impl fmt::Debug for Permit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("permits", &self.permits)
            .finish()
    }
}

/// Permits held from a [`ConcurrencyLimiter`], owning a handle to it: `'static`, for spawned tasks
/// and threads. Given back on `Drop`.
///
/// # Examples
///
/// ```
/// use turnstile::ConcurrencyLimiter;
///
/// let limiter = ConcurrencyLimiter::new(1)?;
/// let permit = limiter.try_acquire_owned(1).unwrap();
/// let worker = std::thread::spawn(move || {
///     let _permit = permit; // released when the thread is done
/// });
/// worker.join().unwrap();
/// assert_eq!(limiter.available(), 1);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[must_use = "the permits are given back as soon as the guard is dropped"]
pub struct OwnedPermit {
    limiter: ConcurrencyLimiter,
    permits: u32,
}

impl OwnedPermit {
    /// How many permits this guard holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(2)?;
    /// assert_eq!(limiter.try_acquire_owned(2).unwrap().permits(), 2);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The limiter these permits came from.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(2)?;
    /// let permit = limiter.try_acquire_owned(1).unwrap();
    /// assert_eq!(permit.limiter().available(), 1);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn limiter(&self) -> &ConcurrencyLimiter {
        &self.limiter
    }
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        self.limiter.inner.release(self.permits);
    }
}

impl fmt::Debug for OwnedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("permits", &self.permits)
            .finish()
    }
}
