//! [`ConcurrencyLimiter`]: at most N permits in flight, released by a guard's `Drop`.

use crate::error::{AcquireError, ConfigError, TryPermitError};
use crate::limiter::Stats;
use crate::queue::{
    Acquire, Blocked, CLOSED, DEFAULT_QUEUE_LIMIT, Phases, QueueOrder, Room, SlowWait, WAITERS,
    Wait, WaitQueue, no_timer,
};
use crate::sync::{ADMITTED, Arc, AtomicU64, CANCELLED, Counters, Mutex, Ordering, REJECTED, lock};
use crossbeam_utils::CachePadded;
use std::fmt;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

/// Permits in use in a permit word (its low 32 bits).
#[inline(always)]
fn used(word: u64) -> u32 {
    word as u32
}

/// One step of the permit word's generation (bits 63..34), bumped by every
/// [`ConcurrencyLimiter::set_limit`]. It wraps; see the state table.
const GENERATION: u64 = 1 << 34;

/// Permits free under `limit` when `in_use` are held (0 while a lowered limit drains).
#[inline(always)]
fn free(limit: u32, in_use: u32) -> u32 {
    limit.saturating_sub(in_use)
}

/// At most `limit` permits in flight at once: "at most 10 callers of this method at the same
/// moment".
///
/// Permits are guards ([`Permit`], or [`OwnedPermit`] for spawned tasks) that give their permits
/// back on `Drop`. `try_acquire` never blocks; `acquire().await` and `acquire_blocking()` wait in a
/// fair, bounded queue shared by async and blocking callers (see [`QueueOrder`]).
///
/// **Lock-free when nobody waits.** The state is one atomic word, plus the limit in an atomic of
/// its own:
///
/// | bits 63..34 | bit 33 | bit 32 | bits 31..0 |
/// |---|---|---|---|
/// | generation | closed | waiters queued | permits in use |
///
/// | operation | word before | effect |
/// |---|---|---|
/// | `try_acquire_n(n)` | in use + n ≤ limit, no waiters (oldest-first), not closed | CAS: in use + n |
/// | `try_acquire_n(n)` | otherwise | fails, writes nothing |
/// | release of n | any | `fetch_sub(n)`; if the waiters bit was set, wake the queue's head |
/// | the head's attempt (under the queue's mutex) | in use + n ≤ limit | CAS: in use + n |
/// | [`set_limit`](Self::set_limit) | any | store the limit, then `fetch_add` one generation |
///
/// A release is a single wait-free `fetch_sub` unless someone is queued; then it also takes the
/// queue's mutex to wake the head (tokio's `Semaphore` takes its mutex on every release). A
/// release gives back what was taken, so the count never borrows from the flag bits, and it never
/// reads the limit. An acquirer reads the word, then the limit, and CASes the whole word: a
/// limit change in between bumps the generation, so a CAS prepared under the old limit fails and
/// is decided again. In use may exceed a lowered limit (held permits are never revoked) until
/// they drain. The generation wraps after 2^30 changes; a CAS would have to be stalled across
/// exactly a multiple of that many changes to go through under a stale limit.
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
    /// The limit in force (a `u32`). Stored only under `reconfig`, before the generation bump
    /// that publishes it.
    limit: AtomicU64,
    /// Serialises [`ConcurrencyLimiter::set_limit`] calls; the hot path never takes it.
    reconfig: Mutex<()>,
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
            .field("limit", &self.limit())
            .field("available", &self.available())
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// The limit in force.
    #[inline(always)]
    fn limit(&self) -> u32 {
        // Relaxed: callers that decide on it load the permit word first with Acquire (see
        // `take`); for everyone else it is a snapshot.
        self.limit.load(Ordering::Relaxed) as u32
    }

    /// Takes `n` permits if free (`n == 0`: checks that one is). `respect_queue` is false for
    /// the queue's head, which may take permits while `WAITERS` is set.
    #[inline(always)]
    fn take(&self, n: u32, respect_queue: bool) -> Result<(), TryPermitError> {
        // Acquire (here and on CAS failure): every write to the word is a read-modify-write, so
        // a value at or after a `set_limit`'s generation bump is in that Release bump's release
        // sequence; loading it makes the limit stored before the bump visible to the limit load
        // below. A value before the bump makes the CAS fail (the bump changed the word), so no
        // decision under an old limit is published after a `set_limit` completes.
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let limit = self.limit();
            // Closed first, whatever `n` (as `RateLimiter`): a closed limiter serves nobody,
            // so "could never fit" would be beside the point. Then too big, then the queue.
            if respect_queue && word & (WAITERS | CLOSED) != 0 {
                if word & CLOSED != 0 {
                    return Err(TryPermitError::Closed);
                }
                if n <= limit && self.queue.order() == QueueOrder::OldestFirst {
                    return Err(TryPermitError::NoPermits {
                        available: free(limit, used(word)),
                        requested: n,
                    });
                }
            }
            if n > limit {
                return Err(TryPermitError::InsufficientCapacity {
                    requested: n,
                    capacity: limit,
                });
            }
            if free(limit, used(word)) < n.max(1) {
                return Err(TryPermitError::NoPermits {
                    available: free(limit, used(word)),
                    requested: n,
                });
            }
            if n == 0 {
                return Ok(());
            }
            // Acquire on success: pairs with the Release `fetch_sub` of the releases that freed
            // these permits, so the previous holders' work happens before ours (a semaphore's
            // contract). Acquire on failure: we decide again on the value, with the limit it
            // publishes (see the load above). `used + n ≤ limit ≤ u32::MAX`: no carry.
            match self.word.compare_exchange_weak(
                word,
                word + u64::from(n),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(actual) => word = actual,
            }
        }
    }

    fn try_acquire(&self, n: u32) -> Result<(), TryPermitError> {
        let outcome = self.take(n, true);
        self.counters
            .bump(if outcome.is_ok() { ADMITTED } else { REJECTED });
        outcome
    }

    /// The head's attempt, under the queue's mutex. A request above a limit lowered since it
    /// queued fails: `set_limit` stores the limit before its sweep takes this mutex, so a head
    /// attempt in between sees the new limit before the sweep can fail the head. (A waiter that
    /// validated against the old limit and enqueues after the sweep fails as it enqueues, on
    /// the capacity the sweep left in the queue, and never becomes the head.)
    fn take_head(&self, n: u32) -> Result<(), Blocked> {
        self.take(n, false).map_err(|error| match error {
            TryPermitError::InsufficientCapacity {
                requested,
                capacity,
            } => Blocked::Fail(AcquireError::InsufficientCapacity {
                requested,
                capacity,
            }),
            _ => Blocked::Release,
        })
    }

    /// Validates and tries the fast path; `Pending` means "queue up".
    #[inline(always)]
    fn acquire_fast(&self, n: u32) -> Poll<Result<(), AcquireError>> {
        let error = match self.take(n, true) {
            Ok(()) => {
                self.counters.bump(ADMITTED);
                return Poll::Ready(Ok(()));
            }
            Err(TryPermitError::Closed) => AcquireError::Closed,
            Err(TryPermitError::InsufficientCapacity {
                requested,
                capacity,
            }) => AcquireError::InsufficientCapacity {
                requested,
                capacity,
            },
            Err(_) => return Poll::Pending,
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
            retry_closed: None,
            capacity: None,
            room: Some(self),
        }
    }

    /// The wait in the queue, after the fast path said to queue up.
    async fn acquire_slow(&self, n: u32) -> Result<(), AcquireError> {
        self.wait(n)
            .run_async(|| self.take_head(n), |()| self.release(n), no_timer)
            .await
    }

    fn acquire_blocking(
        &self,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<(), AcquireError> {
        if let Poll::Ready(outcome) = self.acquire_fast(n) {
            return outcome;
        }
        self.wait(n)
            .run_blocking(|| self.take_head(n), |()| self.release(n), deadline)
    }

    /// Gives `n` permits back. Lock-free unless someone is queued.
    #[inline]
    fn release(&self, n: u32) {
        if n == 0 {
            return;
        }
        // Release: our holder's work happens before the next acquirer's (pairs with the Acquire
        // CAS in `take`). The waiters bit comes back with the old value: if it was set, our
        // subtraction is ordered before the head's next attempt or after its registration (see
        // queue.rs), so waking it under the mutex loses nothing. We held `n`, so in use ≥ n: no
        // borrow from the flags or the generation.
        let before = self.word.fetch_sub(u64::from(n), Ordering::Release);
        if before & WAITERS != 0 {
            self.queue.wake_head();
        }
    }
}

/// A served head wakes the next head only if its permits are free: every release wakes the head
/// of the moment when `WAITERS` is set, and a raise's sweep wakes it too (see [`Room`]).
impl Room for Inner {
    fn free_for(&self, permits: u32) -> bool {
        // Relaxed: a hint, read under the queue's mutex. A release this load misses comes later
        // in the word's modification order, while `WAITERS` is set (it changes only under that
        // mutex, and the next head is queued), so that release wakes the head itself. A limit
        // read stale is one whose raise has yet to sweep, which wakes the head after us.
        free(self.limit(), used(self.word.load(Ordering::Relaxed))) >= permits.max(1)
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
    /// In this order of precedence:
    ///
    /// - [`TryPermitError::Closed`]: the limiter was [closed](Self::close), whatever `n`.
    /// - [`TryPermitError::InsufficientCapacity`]: `n` exceeds the limit.
    /// - [`TryPermitError::NoPermits`]: too few free, or others are queued (oldest first).
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
    /// next waiter when the head leaves (a served head wakes it only if its permits are free;
    /// otherwise the release that frees them does). `n == 0` waits until a permit is free and
    /// holds nothing. Runtime-agnostic: needs no timer.
    ///
    /// # Errors
    ///
    /// - [`AcquireError::Closed`] if the limiter is or gets [closed](Self::close); a closed
    ///   limiter says so first, whatever `n`.
    /// - [`AcquireError::InsufficientCapacity`] at once if `n` exceeds the limit, or as soon as
    ///   a [`set_limit`](Self::set_limit) lowers it below `n` while this call waits (a racing
    ///   one included).
    /// - [`AcquireError::QueueFull`] if the queue has no room (or, newest-first, this waiter was
    ///   among the oldest failed to make room).
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

    /// [`acquire_owned`](Self::acquire_owned)'s first step alone: the permit when it is free
    /// and nobody is queued before the caller, the error when the acquire would fail at once,
    /// `Pending` when it would queue (nothing is queued then, and nothing counted: the
    /// `acquire_owned` that follows counts it). For `ConcurrencyLayer::wait`, whose request
    /// keeps what the inner service reserved for it unless it has to wait.
    #[cfg(feature = "http")]
    pub(crate) fn acquire_owned_now(&self, n: u32) -> Poll<Result<OwnedPermit, AcquireError>> {
        Owned {
            limiter: self.clone(),
            n,
        }
        .fast()
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
        crate::queue::timeout(timeout, self.acquire_n(n)).await
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
    /// For threads, not async tasks: on a thread that runs tasks (a tokio worker, a `block_on`)
    /// it stalls them while it waits, and it waits for good (or until
    /// [`acquire_blocking_timeout`](Self::acquire_blocking_timeout)'s limit) for permits that
    /// a task of that thread holds, as on a current-thread runtime. Async code awaits
    /// [`acquire_n`](Self::acquire_n) instead.
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
        self.inner.limit()
    }

    /// Changes the limit at run time, keeping the permits in flight and the queue.
    ///
    /// - **Raising** admits more at once: the queue's head is woken and takes what it can.
    /// - **Lowering** revokes nothing: permits held stay valid and drain as usual, and new
    ///   acquisitions wait until in use + n ≤ the new limit ([`available`](Self::available) is 0
    ///   meanwhile). Queued waiters asking for more than the new limit fail at once with
    ///   [`AcquireError::InsufficientCapacity`].
    ///
    /// Once this returns, every later acquisition decides under the new limit (one that was
    /// prepared under the old limit fails its compare-and-swap and decides again). Releases never
    /// read the limit: they stay one wait-free `fetch_sub`. Calls are serialised by a mutex the
    /// hot path never takes.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] if `limit` is 0; nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConcurrencyLimiter, ConfigError, TryPermitError};
    ///
    /// let limiter = ConcurrencyLimiter::new(4)?;
    /// let three = limiter.try_acquire_n(3)?;
    /// // Lowered below what is held: nothing is revoked, nothing new until it drains.
    /// limiter.set_limit(2)?;
    /// assert_eq!((limiter.limit(), limiter.available()), (2, 0));
    /// assert!(matches!(limiter.try_acquire(), Err(TryPermitError::NoPermits { .. })));
    /// drop(three);
    /// assert_eq!(limiter.available(), 2);
    /// // Raised: more at once.
    /// limiter.set_limit(5)?;
    /// assert_eq!(limiter.try_acquire_n(5)?.permits(), 5);
    /// // Zero is an error and changes nothing.
    /// assert_eq!(limiter.set_limit(0), Err(ConfigError::Zero { what: "limit" }));
    /// assert_eq!(limiter.limit(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_limit(&self, limit: u32) -> Result<(), ConfigError> {
        if limit == 0 {
            return Err(ConfigError::Zero { what: "limit" });
        }
        let inner = &*self.inner;
        let guard = lock(&inner.reconfig);
        // Relaxed: published by the Release bump below (an acquirer loads the word with Acquire
        // before it loads the limit; see `Inner::take`).
        inner.limit.store(u64::from(limit), Ordering::Relaxed);
        // Release: heads the release sequence that makes the store above visible to every
        // acquirer that loads this word value or a later one. As an RMW it also changes the word,
        // so a CAS prepared on an older value (under the old limit) fails. It never touches the
        // count or the flags; a wrap of the generation falls off bit 63.
        inner.word.fetch_add(GENERATION, Ordering::Release);
        // Waiters look again: the head may fit now, and a request above the new limit never will.
        // The head's attempt and this sweep (which takes its waker) are both under the queue's
        // mutex, so a raise cannot slip between the head's failed attempt and its registration
        // (no lost wake-up: the wake itself may come after the unlock).
        // The sweep runs under the mutex, so that racing changes sweep in their order; the
        // wake-ups after it, since a woken party's `Waker` runs code of its own (which may call
        // `set_limit`).
        let woken = inner
            .queue
            .reconfigure_waiters_and_bound(&inner.word, limit);
        drop(guard);
        woken.wake();
        Ok(())
    }

    /// Permits free now (a snapshot). A [closed](Self::close) limiter still counts them (none
    /// can be taken; [`is_closed`](Self::is_closed) says so), as tokio's `Semaphore` does.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::new(5)?;
    /// let _two = limiter.try_acquire_n(2).unwrap();
    /// assert_eq!(limiter.available(), 3);
    /// limiter.close();
    /// assert_eq!(limiter.available(), 3);
    /// assert!(limiter.try_acquire().is_err());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn available(&self) -> u32 {
        // Acquire: so that the limit read next is at least as new as the word (see `take`).
        let word = self.inner.word.load(Ordering::Acquire);
        free(self.inner.limit(), used(word))
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

    /// Whether any permit is held now: one load, for a chain's gate (`chain::ChainLine`), whose
    /// waiting callers each hold permits of such a limiter for as long as they wait.
    #[inline(always)]
    pub(crate) fn in_use(&self) -> bool {
        // Relaxed: a hint read once, as a limiter's gate (`WAITERS`) is: a holder that takes
        // its permits just after this load is one the caller may precede (it was not waiting
        // yet). Nothing is read on the strength of it.
        used(self.inner.word.load(Ordering::Relaxed)) != 0
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n) until `deadline`, if any.
    pub(crate) fn acquire_blocking_until(
        &self,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<Permit<'_>, AcquireError> {
        self.inner.acquire_blocking(n, deadline)?;
        Ok(Permit {
            limiter: &self.inner,
            permits: n,
        })
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

    /// The most permits that may wait at once (default: [`DEFAULT_QUEUE_LIMIT`]); a waiting probe
    /// (`n == 0`) counts as one.
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
                word: CachePadded::new(AtomicU64::new(0)),
                limit: AtomicU64::new(u64::from(self.limit)),
                reconfig: Mutex::new(()),
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
