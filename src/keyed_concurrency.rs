//! [`KeyedConcurrencyLimiter`]: at most N permits in flight *per key*, for millions of keys, with
//! idle keys evicted and a hard cap on how many are kept.
//!
//! It is the keyed store of `keyed.rs` (sharded papaya maps, cells inline, retirement, sweeps,
//! the cap, per-key wait queues) hosting one more [`Algo`]: [`Concurrency`], whose cell is a
//! permit word.

use crate::algorithm::{Algo, EachCell, RETIRED};
use crate::clock::Clock;
use crate::decision::{Admission, Rejection};
use crate::error::{AcquireError, ConfigError, TryAcquireError, TryPermitError};
use crate::keyed::{
    shard_count, waiting_error, Ctx, KeyOverflow, Keyed, KeyedStats, RetireOnExit, Slot, Waits,
    DEFAULT_MAX_KEYS,
};
use crate::queue::{no_timer, Blocked, QueueOrder, DEFAULT_QUEUE_LIMIT, WAITERS};
use crate::sync::{Arc, AtomicU64, Ordering, ADMITTED, CANCELLED, OVERFLOWED, REJECTED};
use std::fmt;
use std::hash::{BuildHasher, Hash};

/// Cell bit: the cell has given out permits at least once. A cell without it is one its inserter
/// has not used yet, which is never retired (see [`Algo::retire`]).
const USED: u64 = 1 << 33;

/// Permits free in a permit word (its low 32 bits).
#[inline(always)]
fn free(word: u64) -> u32 {
    word as u32
}

/// The concurrency "algorithm": a cell is one permit word.
///
/// | bits 63..34 | bit 33 | bit 32 | bits 31..0 |
/// |---|---|---|---|
/// | zero | `USED` | `WAITERS`: a blocked head wants the next release to wake it | permits free |
///
/// Free permits never exceed the limit (a release gives back exactly what was taken), so a
/// release's `fetch_add` never carries into the flags, and bits 63..34 stay zero: a live word is
/// below 2^34 and never equals [`RETIRED`] (`u64::MAX`), whatever the limit.
///
/// Idle ⇔ the word is exactly `limit | USED`: all permits back, nobody blocked. The clock is
/// never read: a concurrency cell's idleness is not a matter of time.
pub(crate) struct Concurrency {
    limit: u32,
}

impl Concurrency {
    /// Takes `n` permits if free (`n == 0`: checks that one is). `Ok(Ok(remaining))`: taken;
    /// `Ok(Err(free))`: too few free, nothing written; `Err(Closed)`: retired.
    #[inline(always)]
    fn take(&self, cell: &AtomicU64, n: u32) -> Result<Result<u32, u32>, TryAcquireError> {
        // Acquire: a word we see RETIRED (or retire races with) must carry the retire's
        // synchronisation to the fresh cell our caller then makes; see `retire`.
        let mut word = cell.load(Ordering::Acquire);
        loop {
            if word == RETIRED {
                return Err(TryAcquireError::Closed);
            }
            if free(word) < n.max(1) {
                return Ok(Err(free(word)));
            }
            if n == 0 {
                return Ok(Ok(free(word)));
            }
            // Acquire on success: pairs with the Release half of the releases that freed these
            // permits, so the previous holders' work happens before ours (a semaphore's
            // contract). Acquire on failure: as the load above.
            match cell.compare_exchange_weak(
                word,
                (word - u64::from(n)) | USED,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(Ok(free(word) - n)),
                Err(actual) => word = actual,
            }
        }
    }

    /// The queue head's attempt, under its queue's mutex: takes `n` permits if free (and clears
    /// `WAITERS`: the head that asked for a wake needs none now), otherwise sets `WAITERS` so
    /// that the next release wakes it. Returns as [`take`](Self::take).
    fn take_or_mark(&self, cell: &AtomicU64, n: u32) -> Result<Result<u32, u32>, TryAcquireError> {
        // Acquire: as in `take`.
        let mut word = cell.load(Ordering::Acquire);
        loop {
            if word == RETIRED {
                return Err(TryAcquireError::Closed);
            }
            let (next, outcome) = if free(word) >= n.max(1) {
                let left = if n == 0 { word } else { word - u64::from(n) };
                ((left | USED) & !WAITERS, Ok(free(word) - n))
            } else if word & WAITERS != 0 {
                // Already marked: the next release wakes this queue's head.
                return Ok(Err(free(word)));
            } else {
                (word | WAITERS, Err(free(word)))
            };
            // AcqRel on success. Acquire: as in `take`. Release: a releaser that reads our mark
            // (its AcqRel `fetch_add`) then sees everything before it, including the key's queue
            // in the queue map, which it looks up to wake us. Acquire on failure: as `take`.
            match cell.compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(outcome),
                Err(actual) => word = actual,
            }
        }
    }
}

impl Algo for Concurrency {
    type Cell = AtomicU64;

    /// Never called: keyed concurrency limiters have no reconfiguration.
    fn reconfigure<C: Clock>(
        &self,
        _to: &Self,
        _clock: &C,
        _cells: EachCell<'_, AtomicU64>,
    ) -> Result<(), ConfigError> {
        Ok(())
    }

    fn cell(&self) -> AtomicU64 {
        AtomicU64::new(u64::from(self.limit))
    }

    fn limit(&self) -> u32 {
        self.limit
    }

    fn decide<C: Clock, const COMMIT: bool>(
        &self,
        cell: &AtomicU64,
        n: u32,
        _clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        if !COMMIT {
            // A check (chains do not take concurrency members): whether n.max(1) are free now.
            // Relaxed: a verdict only; nothing is written or ordered by it.
            let word = cell.load(Ordering::Relaxed);
            if word == RETIRED {
                return Err(TryAcquireError::Closed);
            }
            let want = n.max(1);
            return if free(word) >= want {
                Ok(Admission::new(0, 0, free(word) - want))
            } else {
                Err(TryAcquireError::Rejected(Rejection::new(0, self.limit)))
            };
        }
        match self.take(cell, n)? {
            Ok(remaining) => Ok(Admission::new(0, 0, remaining)),
            Err(_) => Err(TryAcquireError::Rejected(Rejection::new(0, self.limit))),
        }
    }

    fn refund<C: Clock>(&self, _cell: &AtomicU64, _n: u32, _admission: &Admission, _clock: &C) {
        // Chains take rate limiters only; a concurrency permit goes back through its guard's
        // release, which also wakes the key's waiters. Giving nothing back here is the
        // conservative answer (never looser) should anything ever call it.
    }

    fn available(&self, cell: &AtomicU64, _now: u64) -> u32 {
        // Relaxed: a snapshot.
        match cell.load(Ordering::Relaxed) {
            RETIRED => self.limit,
            word => free(word),
        }
    }

    fn retire<C: Clock>(&self, cell: &AtomicU64, _clock: &C) -> Result<(), u64> {
        // Relaxed: only seeds the CAS, which decides.
        let word = cell.load(Ordering::Relaxed);
        if word == RETIRED {
            return Ok(());
        }
        if word & USED == 0 {
            // Never used: its inserter is about to take permits from it.
            return Err(0);
        }
        let idle = u64::from(self.limit) | USED;
        if word != idle {
            // Permits out or a head blocked: idle only after a release, which lowers the hints
            // (`Ctx::idle_hint`); no clock time says when.
            return Err(u64::MAX);
        }
        // AcqRel on success. Acquire: the last releases happen before us. Release: whoever sees
        // RETIRED (an Acquire load in `take`) and re-creates the key then happens after them
        // too, so the semaphore's happens-before survives eviction. Relaxed on failure: a take
        // landed; we only report "busy".
        cell.compare_exchange(word, RETIRED, Ordering::AcqRel, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| u64::MAX)
    }

    fn retired(cell: &AtomicU64) -> bool {
        // Relaxed: RETIRED is final, and the caller only removes the dead cell from its map.
        cell.load(Ordering::Relaxed) == RETIRED
    }

    #[cfg(all(test, not(turnstile_loom)))]
    fn words(cell: &AtomicU64) -> Vec<u64> {
        vec![cell.load(Ordering::Relaxed)]
    }
}

/// The store's clock: a concurrency cell never reads time, and its sweep hints are 0 ("look")
/// or `u64::MAX` ("not before a release says so"), so a constant does.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NoClock;

impl Clock for NoClock {
    fn now(&self) -> u64 {
        0
    }
}

/// At most `limit` permits in flight **per key** (user, tenant, IP, upstream host), for millions
/// of keys: "at most 4 requests per user at the same moment".
///
/// Every key gets its own permit word, created on its first acquisition and evicted once all its
/// permits are back and nobody waits (never while a permit is out). It is [`KeyedLimiter`]'s
/// store with a permit word for the cell, so everything said there holds: lock-free hits,
/// eviction that never loses a permit, a hard cap ([`max_keys`](Self::max_keys)) with a
/// [`KeyOverflow`] policy, and per-key fair, bounded wait queues.
///
/// Permits are guards ([`KeyedPermit`], or [`OwnedKeyedPermit`] for spawned tasks) that give
/// their permits back on `Drop`: one lookup of the key and one `fetch_add`, lock-free unless
/// someone waits for that key.
///
/// Under [`KeyOverflow::Shared`] all overflow keys share one pool of `limit` permits.
///
/// Clones share state.
///
/// [`KeyedLimiter`]: crate::KeyedLimiter
///
/// # Examples
///
/// ```
/// use turnstile::KeyedConcurrencyLimiter;
///
/// let per_user = KeyedConcurrencyLimiter::new(2)?;
/// let a = per_user.try_acquire(&"alice")?;
/// let b = per_user.try_acquire(&"alice")?;
/// assert!(per_user.try_acquire(&"alice").is_err()); // two in flight for alice
/// assert!(per_user.try_acquire(&"bob").is_ok()); // keys are independent
/// drop(a);
/// assert!(per_user.try_acquire(&"alice").is_ok());
/// # drop(b);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedConcurrencyLimiter<K, S = foldhash::fast::RandomState> {
    inner: Arc<Inner<K, S>>,
}

struct Inner<K, S> {
    store: Keyed<Concurrency, K, S>,
    ctx: Ctx<NoClock, S>,
    waits: Waits<K, S>,
}

impl<K, S> Clone for KeyedConcurrencyLimiter<K, S> {
    fn clone(&self) -> Self {
        KeyedConcurrencyLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, S> fmt::Debug for KeyedConcurrencyLimiter<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedConcurrencyLimiter")
            .field("limit", &self.inner.store.algo.limit)
            .field("max_keys", &self.inner.ctx.max_keys)
            .field("overflow", &self.inner.ctx.overflow)
            // Relaxed: a snapshot for display.
            .field("keys", &self.inner.ctx.keys.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<K, S> Inner<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn limit(&self) -> u32 {
        self.store.algo.limit
    }

    /// Takes `n` permits for `key` ignoring its queue. `Ok(Err(free))`: too few free.
    fn decide(&self, key: &K, shard: usize, n: u32) -> Result<Result<Slot, u32>, TryAcquireError> {
        let algo = &self.store.algo;
        let (outcome, slot) = self
            .store
            .with_cell(&self.ctx, shard, key, n, |cell| algo.take(cell, n))?;
        Ok(outcome.map(|_| slot))
    }

    fn try_acquire(&self, key: &K, shard: usize, n: u32) -> Result<Slot, TryPermitError> {
        let outcome = self.try_decide(key, shard, n);
        self.ctx
            .counters
            .bump(if outcome.is_ok() { ADMITTED } else { REJECTED });
        outcome
    }

    fn try_decide(&self, key: &K, shard: usize, n: u32) -> Result<Slot, TryPermitError> {
        let limit = self.limit();
        if n > limit {
            return Err(TryPermitError::InsufficientCapacity {
                requested: n,
                capacity: limit,
            });
        }
        // No barging past this key's queue under oldest-first order.
        if self.waits.any()
            && self.waits.order == QueueOrder::OldestFirst
            && self.waits.has_waiters(key)
        {
            return Err(TryPermitError::NoPermits {
                available: self.available(key, shard),
                requested: n,
            });
        }
        match self.decide(key, shard, n) {
            Ok(Ok(slot)) => Ok(slot),
            Ok(Err(available)) => Err(TryPermitError::NoPermits {
                available,
                requested: n,
            }),
            Err(error) => Err(permit_error(error)),
        }
    }

    fn available(&self, key: &K, shard: usize) -> u32 {
        self.store.shards[shard]
            .map
            .get(key, |cell| self.store.algo.available(cell, 0))
            .unwrap_or(self.limit())
    }

    /// Validates and tries without queueing when `key` has no waiters. `Ok(None)`: queue up.
    fn acquire_fast(&self, key: &K, shard: usize, n: u32) -> Result<Option<Slot>, AcquireError> {
        let counters = &self.ctx.counters;
        let limit = self.limit();
        let error = if n > limit {
            AcquireError::InsufficientCapacity {
                requested: n,
                capacity: limit,
            }
        } else if self.waits.any() && self.waits.has_waiters(key) {
            return Ok(None);
        } else {
            match self.decide(key, shard, n) {
                Ok(Ok(slot)) => {
                    counters.bump(ADMITTED);
                    return Ok(Some(slot));
                }
                Ok(Err(_)) => return Ok(None),
                Err(error) => waiting_error(error),
            }
        };
        counters.bump(REJECTED);
        Err(error)
    }

    /// The head waiter's attempt (under its queue's mutex): take, or mark the cell so that the
    /// next release wakes this key's head.
    fn take_head(&self, key: &K, shard: usize, n: u32) -> Result<Slot, Blocked> {
        let algo = &self.store.algo;
        match self
            .store
            .with_cell(&self.ctx, shard, key, n, |cell| algo.take_or_mark(cell, n))
        {
            Ok((Ok(_), slot)) => Ok(slot),
            Ok((Err(_), _)) => Err(Blocked::Release),
            Err(error) => Err(Blocked::Fail(waiting_error(error))),
        }
    }

    async fn acquire_slow(&self, key: &K, shard: usize, n: u32) -> Result<Slot, AcquireError> {
        loop {
            let wait = self.waits.key_wait(key);
            let exit = RetireOnExit {
                waits: &self.waits,
                key,
                wait: &wait,
            };
            let outcome = self
                .waits
                .wait(&wait, &self.ctx.counters, n)
                .run_async(|| self.take_head(key, shard, n), no_timer)
                .await;
            drop(exit);
            match outcome {
                // The queue was retired between our lookup and our enqueue: look again.
                Err(AcquireError::Closed) => continue,
                outcome => return outcome,
            }
        }
    }

    async fn acquire(&self, key: &K, shard: usize, n: u32) -> Result<Slot, AcquireError> {
        if let Some(slot) = self.acquire_fast(key, shard, n)? {
            return Ok(slot);
        }
        // Boxed so that the fast path's future stays small.
        Box::pin(self.acquire_slow(key, shard, n)).await
    }

    fn blocking(
        &self,
        key: &K,
        shard: usize,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<Slot, AcquireError> {
        if let Some(slot) = self.acquire_fast(key, shard, n)? {
            return Ok(slot);
        }
        loop {
            let wait = self.waits.key_wait(key);
            let _exit = RetireOnExit {
                waits: &self.waits,
                key,
                wait: &wait,
            };
            match self
                .waits
                .wait(&wait, &self.ctx.counters, n)
                .run_blocking(|| self.take_head(key, shard, n), deadline)
            {
                Err(AcquireError::Closed) => continue,
                outcome => return outcome,
            }
        }
    }

    /// Gives `n` permits of `key` back to the cell they came from. Lock-free unless a head is
    /// blocked on that cell.
    fn release(&self, key: &K, shard: usize, n: u32, slot: Slot) {
        if n == 0 {
            return;
        }
        let add = |cell: &AtomicU64| {
            // AcqRel. Release: our holder's work happens before the next taker's (pairs with the
            // Acquire CAS in `take`). Acquire: if we read a head's `WAITERS` mark (a Release
            // CAS), its key's queue is visible to our lookup below. The mark comes back with the
            // old value: the head's mark and our add are RMWs of one word, so either our add
            // comes first (the head's attempt sees the permits) or we see the mark and wake it
            // under its queue's mutex, which it held while marking and registering its waker.
            let before = cell.fetch_add(u64::from(n), Ordering::AcqRel);
            if before & WAITERS != 0 {
                // Relaxed: we consume the mark and wake the head below; if the head marked again
                // meanwhile, our wake still comes after its registration (see queue.rs), and it
                // marks again if it is still short.
                cell.fetch_and(!WAITERS, Ordering::Relaxed);
            }
            before
        };
        let shard_ref = &self.store.shards[shard];
        let before = match slot {
            // The key's cell is the one we took from: a cell with permits out is never retired.
            Slot::Key => shard_ref.map.get(key, add),
            Slot::Overflow => Some(add(&self.store.overflow)),
        };
        let Some(before) = before else {
            debug_assert!(false, "a key with permits out lost its cell");
            return;
        };
        if slot == Slot::Key && u64::from(free(before)) + u64::from(n) == u64::from(self.limit()) {
            self.ctx.idle_hint(shard_ref);
        }
        if before & WAITERS != 0 {
            match slot {
                Slot::Key => {
                    if let Some(wait) = self.waits.map.get(key, Arc::clone) {
                        wait.queue.wake_head();
                    }
                }
                // The shared pool's waiters may be in any key's queue: wake every head (rare:
                // only overflow keys at the cap wait on the pool).
                Slot::Overflow => self.waits.map.for_each(|_, wait| wait.queue.wake_head()),
            }
        }
    }
}

/// A store error seen by `try_acquire` (never `Rejected`: the store answers "too few free"
/// apart).
fn permit_error(error: TryAcquireError) -> TryPermitError {
    match error {
        TryAcquireError::InsufficientCapacity {
            requested,
            capacity,
        } => TryPermitError::InsufficientCapacity {
            requested,
            capacity,
        },
        TryAcquireError::TooManyKeys { max_keys } => TryPermitError::TooManyKeys { max_keys },
        // No in-memory store is ever unavailable.
        TryAcquireError::Rejected(_) | TryAcquireError::Closed | TryAcquireError::Unavailable => {
            TryPermitError::Closed
        }
    }
}

impl<K> KeyedConcurrencyLimiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A limiter allowing `limit` permits in flight per key, with at most [`DEFAULT_MAX_KEYS`]
    /// keys, [`KeyOverflow::Reject`] and the default queue (oldest first, [`DEFAULT_QUEUE_LIMIT`]
    /// permits per key).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] if `limit` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::<u64>::new(8)?;
    /// assert_eq!(limiter.limit(), 8);
    /// assert!(KeyedConcurrencyLimiter::<u64>::new(0).is_err());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn new(limit: u32) -> Result<Self, ConfigError> {
        Self::builder(limit).build()
    }

    /// A builder starting from `limit` with the defaults of [`new`](Self::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{KeyOverflow, KeyedConcurrencyLimiter};
    ///
    /// let limiter = KeyedConcurrencyLimiter::<String>::builder(4)
    ///     .max_keys(10_000)
    ///     .overflow(KeyOverflow::Shared)
    ///     .build()?;
    /// assert_eq!(limiter.max_keys(), 10_000);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn builder(limit: u32) -> KeyedConcurrencyLimiterBuilder<K> {
        KeyedConcurrencyLimiterBuilder {
            limit,
            hasher: foldhash::fast::RandomState::default(),
            max_keys: DEFAULT_MAX_KEYS,
            overflow: KeyOverflow::Reject,
            order: QueueOrder::OldestFirst,
            queue_limit: DEFAULT_QUEUE_LIMIT,
            _key: std::marker::PhantomData,
        }
    }
}

impl<K, S> KeyedConcurrencyLimiter<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn permit(&self, key: &K, shard: usize, permits: u32, slot: Slot) -> KeyedPermit<'_, K, S> {
        KeyedPermit {
            limiter: self,
            key: key.clone(),
            shard,
            permits,
            slot,
        }
    }

    fn owned(&self, key: K, shard: usize, permits: u32, slot: Slot) -> OwnedKeyedPermit<K, S> {
        OwnedKeyedPermit {
            limiter: self.clone(),
            key,
            shard,
            permits,
            slot,
        }
    }

    /// Takes one permit for `key` if one is free. Never blocks. See
    /// [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let permit = limiter.try_acquire(&42u64)?;
    /// assert_eq!(limiter.available(&42u64), 0);
    /// drop(permit);
    /// assert_eq!(limiter.available(&42u64), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self, key: &K) -> Result<KeyedPermit<'_, K, S>, TryPermitError> {
        self.try_acquire_n(key, 1)
    }

    /// Takes `n` permits for `key` at once if they are free; otherwise none. Never blocks, and a
    /// failure for a key already held writes no shared memory. `n == 0` succeeds iff a permit is
    /// free, holding nothing, and never creates a key.
    ///
    /// **No barging.** Under [`QueueOrder::OldestFirst`] this fails while `key` has waiters.
    ///
    /// # Errors
    ///
    /// - [`TryPermitError::NoPermits`]: too few free for `key` now (or others wait for them).
    /// - [`TryPermitError::InsufficientCapacity`]: `n` exceeds the limit.
    /// - [`TryPermitError::TooManyKeys`]: a new key, the cap is reached, no key is idle, and the
    ///   policy is [`KeyOverflow::Reject`].
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{KeyedConcurrencyLimiter, TryPermitError};
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(4)?;
    /// let three = limiter.try_acquire_n(&"tenant-a", 3)?;
    /// assert!(matches!(
    ///     limiter.try_acquire_n(&"tenant-a", 2),
    ///     Err(TryPermitError::NoPermits { available: 1, requested: 2 })
    /// ));
    /// assert!(limiter.try_acquire_n(&"tenant-b", 4).is_ok());
    /// # drop(three);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_n(&self, key: &K, n: u32) -> Result<KeyedPermit<'_, K, S>, TryPermitError> {
        let shard = self.inner.ctx.shard(key);
        let slot = self.inner.try_acquire(key, shard, n)?;
        Ok(self.permit(key, shard, n, slot))
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
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let permit = limiter.try_acquire_owned("job".to_string(), 1)?;
    /// std::thread::spawn(move || drop(permit)).join().unwrap();
    /// assert_eq!(limiter.available(&"job".to_string()), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_owned(
        &self,
        key: K,
        n: u32,
    ) -> Result<OwnedKeyedPermit<K, S>, TryPermitError> {
        let shard = self.inner.ctx.shard(&key);
        let slot = self.inner.try_acquire(&key, shard, n)?;
        Ok(self.owned(key, shard, n, slot))
    }

    /// Waits until one permit for `key` is free. See [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future holds no permit and frees its place in the key's queue.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let permit = limiter.acquire(&"alice").await?;
    /// let other = limiter.acquire(&"bob").await?; // another key: no wait
    /// drop(permit);
    /// let again = limiter.acquire(&"alice").await?; // free again
    /// # drop((other, again));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(&self, key: &K) -> Result<KeyedPermit<'_, K, S>, AcquireError> {
        self.acquire_n(key, 1).await
    }

    /// Waits until `n` permits for `key` are free and takes them, in the key's own fair, bounded
    /// queue (async and blocking waiters share it; keys never wait for each other). Needs no
    /// timer and no particular runtime.
    ///
    /// # Errors
    ///
    /// - [`AcquireError::InsufficientCapacity`] at once if `n` exceeds the limit.
    /// - [`AcquireError::QueueFull`] if the key's queue has no room for `n` more permits (or,
    ///   under [`QueueOrder::NewestFirst`], this waiter was among the oldest failed to make room).
    /// - [`AcquireError::TooManyKeys`] if the key is new, the cap is reached, nothing is idle, and
    ///   the policy is [`KeyOverflow::Reject`].
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: permits are taken only in the poll that returns them, so dropping the future
    /// at any await point holds nothing; it frees its place in the key's queue and, if it was the
    /// head, wakes the next waiter; the key's queue is dropped once its last waiter is gone.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedConcurrencyLimiter::new(3)?;
    /// let two = limiter.acquire_n(&7u64, 2).await?;
    /// assert_eq!(two.permits(), 2);
    /// assert_eq!(limiter.available(&7u64), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_n(&self, key: &K, n: u32) -> Result<KeyedPermit<'_, K, S>, AcquireError> {
        let shard = self.inner.ctx.shard(key);
        let slot = self.inner.acquire(key, shard, n).await?;
        Ok(self.permit(key, shard, n, slot))
    }

    /// [`acquire_n`](Self::acquire_n) for a `'static` permit, as a `'static` future: for
    /// spawned tasks.
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
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let permit = limiter.acquire_owned("user-9".to_string(), 1).await?;
    /// let task = tokio::spawn(async move {
    ///     // ... work for user-9 ...
    ///     drop(permit);
    /// });
    /// task.await?;
    /// assert_eq!(limiter.available(&"user-9".to_string()), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_owned(
        &self,
        key: K,
        n: u32,
    ) -> impl std::future::Future<Output = Result<OwnedKeyedPermit<K, S>, AcquireError>> + Send + 'static
    {
        let limiter = self.clone();
        async move {
            let shard = limiter.inner.ctx.shard(&key);
            let slot = limiter.inner.acquire(&key, shard, n).await?;
            Ok(limiter.owned(key, shard, n, slot))
        }
    }

    /// [`acquire_n`](Self::acquire_n) with a time limit (tokio's timer); on timeout nothing is
    /// held and the waiter has left the key's queue.
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
    /// use turnstile::{AcquireError, KeyedConcurrencyLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let _held = limiter.acquire(&"k").await?;
    /// let late = limiter.acquire_timeout(&"k", 1, Duration::from_secs(1)).await;
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// assert_eq!(limiter.stats().waiting, 0);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_timeout(
        &self,
        key: &K,
        n: u32,
        timeout: std::time::Duration,
    ) -> Result<KeyedPermit<'_, K, S>, AcquireError> {
        match tokio::time::timeout(timeout, self.acquire_n(key, n)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(AcquireError::Timeout),
        }
    }

    /// Blocks the calling thread until one permit for `key` is free. See
    /// [`acquire_blocking_n`](Self::acquire_blocking_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let held = limiter.acquire_blocking(&"k")?;
    /// let waiter = {
    ///     let limiter = limiter.clone();
    ///     std::thread::spawn(move || limiter.acquire_blocking(&"k").map(|p| p.permits()))
    /// };
    /// drop(held); // wakes the waiter
    /// assert_eq!(waiter.join().unwrap()?, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking(&self, key: &K) -> Result<KeyedPermit<'_, K, S>, AcquireError> {
        self.acquire_blocking_n(key, 1)
    }

    /// Blocks the calling thread until `n` permits for `key` are free and takes them, in the same
    /// per-key queue as [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(4)?;
    /// let permit = limiter.acquire_blocking_n(&("alice", "/upload"), 4)?;
    /// assert_eq!(permit.permits(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_n(
        &self,
        key: &K,
        n: u32,
    ) -> Result<KeyedPermit<'_, K, S>, AcquireError> {
        let shard = self.inner.ctx.shard(key);
        let slot = self.inner.blocking(key, shard, n, None)?;
        Ok(self.permit(key, shard, n, slot))
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n) with a time limit (real time); on
    /// timeout nothing is held and the waiter has left the key's queue.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n), and [`AcquireError::Timeout`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{AcquireError, KeyedConcurrencyLimiter};
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let _held = limiter.acquire_blocking(&"k")?;
    /// let late = limiter.acquire_blocking_timeout(&"k", 1, Duration::from_millis(10));
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_timeout(
        &self,
        key: &K,
        n: u32,
        timeout: std::time::Duration,
    ) -> Result<KeyedPermit<'_, K, S>, AcquireError> {
        let shard = self.inner.ctx.shard(key);
        let deadline = std::time::Instant::now().checked_add(timeout);
        let slot = self.inner.blocking(key, shard, n, deadline)?;
        Ok(self.permit(key, shard, n, slot))
    }

    /// Permits free for `key` now (a snapshot; a key not held has the full limit).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(5)?;
    /// let _two = limiter.try_acquire_n(&1u64, 2)?;
    /// assert_eq!(limiter.available(&1u64), 3);
    /// assert_eq!(limiter.available(&2u64), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available(&self, key: &K) -> u32 {
        self.inner.available(key, self.inner.ctx.shard(key))
    }

    /// The permits each key may have in flight.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::<u64>::new(3)?;
    /// assert_eq!(limiter.limit(), 3);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn limit(&self) -> u32 {
        self.inner.limit()
    }

    /// Evicts every idle key now (all permits back, nobody waiting); returns how many. Never
    /// removes a key with a permit out; runs concurrently with every other call.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let held = limiter.try_acquire(&"busy")?;
    /// drop(limiter.try_acquire(&"done")?);
    /// assert_eq!(limiter.sweep(), 1); // "done" only
    /// assert_eq!(limiter.len(), 1);
    /// drop(held);
    /// assert_eq!(limiter.sweep(), 1);
    /// assert!(limiter.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sweep(&self) -> usize {
        self.inner.store.sweep_all(&self.inner.ctx) as usize
    }

    /// Keys held now.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let _a = limiter.try_acquire(&'a')?;
    /// let _b = limiter.try_acquire(&'b')?;
    /// assert_eq!(limiter.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        // Relaxed: a snapshot.
        self.inner.ctx.keys.load(Ordering::Relaxed) as usize
    }

    /// Whether no key is held.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::<u64>::new(1)?;
    /// assert!(limiter.is_empty());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key cap.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{KeyedConcurrencyLimiter, DEFAULT_MAX_KEYS};
    ///
    /// let limiter = KeyedConcurrencyLimiter::<u64>::new(1)?;
    /// assert_eq!(limiter.max_keys(), DEFAULT_MAX_KEYS);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn max_keys(&self) -> usize {
        self.inner.ctx.max_keys
    }

    /// The queue order of every key's waiters.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{KeyedConcurrencyLimiter, QueueOrder};
    ///
    /// let limiter = KeyedConcurrencyLimiter::<u64>::new(1)?;
    /// assert_eq!(limiter.queue_order(), QueueOrder::OldestFirst);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_order(&self) -> QueueOrder {
        self.inner.waits.order
    }

    /// The queue limit of every key, in permits.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{KeyedConcurrencyLimiter, DEFAULT_QUEUE_LIMIT};
    ///
    /// let limiter = KeyedConcurrencyLimiter::<u64>::new(1)?;
    /// assert_eq!(limiter.queue_limit(), DEFAULT_QUEUE_LIMIT);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_limit(&self) -> u64 {
        self.inner.waits.queue_limit
    }

    /// Counts over all keys (the same [`KeyedStats`] as a keyed rate limiter's). `admitted +
    /// rejected + cancelled` is the number of calls once none is in flight.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let _held = limiter.try_acquire(&1u16)?;
    /// let _ = limiter.try_acquire(&1u16);
    /// let stats = limiter.stats();
    /// assert_eq!((stats.admitted, stats.rejected, stats.keys), (1, 1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> KeyedStats {
        let ctx = &self.inner.ctx;
        let (waiting_keys, waiting, queued_permits) = self.inner.waits.queued();
        KeyedStats {
            admitted: ctx.counters.sum(ADMITTED),
            rejected: ctx.counters.sum(REJECTED),
            cancelled: ctx.counters.sum(CANCELLED),
            overflowed: ctx.counters.sum(OVERFLOWED),
            // Relaxed: a statistic.
            evicted: ctx.evicted.load(Ordering::Relaxed),
            keys: self.len(),
            waiting,
            queued_permits,
            waiting_keys,
        }
    }
}

/// Builds a [`KeyedConcurrencyLimiter`] with a chosen key cap, overflow policy, queue settings
/// or hasher.
///
/// # Examples
///
/// ```
/// use turnstile::{KeyOverflow, KeyedConcurrencyLimiter, QueueOrder};
///
/// let limiter = KeyedConcurrencyLimiter::<u64>::builder(2)
///     .max_keys(1_000)
///     .overflow(KeyOverflow::Shared)
///     .queue_order(QueueOrder::NewestFirst)
///     .queue_limit(64)
///     .build()?;
/// assert_eq!(limiter.queue_limit(), 64);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct KeyedConcurrencyLimiterBuilder<K, S = foldhash::fast::RandomState> {
    limit: u32,
    hasher: S,
    max_keys: usize,
    overflow: KeyOverflow,
    order: QueueOrder,
    queue_limit: u64,
    _key: std::marker::PhantomData<fn(&K)>,
}

impl<K, S> KeyedConcurrencyLimiterBuilder<K, S> {
    /// Hashes keys with `hasher` instead of foldhash. Keep it randomly seeded if clients choose
    /// the keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::hash::RandomState;
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::<String>::builder(1).hasher(RandomState::new()).build()?;
    /// assert!(limiter.try_acquire(&"k".to_string()).is_ok());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn hasher<S2: BuildHasher + Clone>(
        self,
        hasher: S2,
    ) -> KeyedConcurrencyLimiterBuilder<K, S2> {
        KeyedConcurrencyLimiterBuilder {
            limit: self.limit,
            hasher,
            max_keys: self.max_keys,
            overflow: self.overflow,
            order: self.order,
            queue_limit: self.queue_limit,
            _key: std::marker::PhantomData,
        }
    }

    /// Keeps at most `max_keys` keys (default [`DEFAULT_MAX_KEYS`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::<u64>::builder(1).max_keys(100).build()?;
    /// assert_eq!(limiter.max_keys(), 100);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// What to do with a new key when the cap is reached and no key is idle (default
    /// [`KeyOverflow::Reject`]). Under [`KeyOverflow::Shared`] the overflow keys share one pool
    /// of `limit` permits.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{KeyOverflow, KeyedConcurrencyLimiter};
    ///
    /// let limiter = KeyedConcurrencyLimiter::builder(1).max_keys(1).overflow(KeyOverflow::Shared).build()?;
    /// let _a = limiter.try_acquire(&1u8)?;
    /// let b = limiter.try_acquire(&2u8)?; // over the cap: the shared pool
    /// assert!(limiter.try_acquire(&3u8).is_err()); // the pool's one permit is out
    /// drop(b);
    /// assert!(limiter.try_acquire(&3u8).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn overflow(mut self, policy: KeyOverflow) -> Self {
        self.overflow = policy;
        self
    }

    /// The order in which each key's waiters are served (default [`QueueOrder::OldestFirst`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{KeyedConcurrencyLimiter, QueueOrder};
    ///
    /// let limiter = KeyedConcurrencyLimiter::<u64>::builder(1).queue_order(QueueOrder::NewestFirst).build()?;
    /// assert_eq!(limiter.queue_order(), QueueOrder::NewestFirst);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_order(mut self, order: QueueOrder) -> Self {
        self.order = order;
        self
    }

    /// The most permits each key's queue may hold waiters for (default [`DEFAULT_QUEUE_LIMIT`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::<u64>::builder(1).queue_limit(10).build()?;
    /// assert_eq!(limiter.queue_limit(), 10);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_limit(mut self, permits: u64) -> Self {
        self.queue_limit = permits;
        self
    }
}

impl<K, S> KeyedConcurrencyLimiterBuilder<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] if the limit or `max_keys` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConfigError, KeyedConcurrencyLimiter};
    ///
    /// let bad = KeyedConcurrencyLimiter::<u64>::builder(1).max_keys(0).build();
    /// assert_eq!(bad.unwrap_err(), ConfigError::Zero { what: "max_keys" });
    /// ```
    pub fn build(self) -> Result<KeyedConcurrencyLimiter<K, S>, ConfigError> {
        if self.limit == 0 {
            return Err(ConfigError::Zero { what: "limit" });
        }
        if self.max_keys == 0 {
            return Err(ConfigError::Zero { what: "max_keys" });
        }
        let shards = shard_count(self.max_keys);
        let store = Keyed::new(Concurrency { limit: self.limit }, shards, &self.hasher);
        Ok(KeyedConcurrencyLimiter {
            inner: Arc::new(Inner {
                store,
                waits: Waits::new(self.hasher.clone(), self.order, self.queue_limit),
                ctx: Ctx::new(NoClock, self.hasher, shards, self.max_keys, self.overflow),
            }),
        })
    }
}

/// Permits for one key of a [`KeyedConcurrencyLimiter`], given back when dropped.
///
/// It keeps a clone of the key: the release looks the key's permit word up (it cannot have been
/// evicted: a key with permits out is never idle) and adds the permits back.
///
/// # Examples
///
/// ```
/// use turnstile::KeyedConcurrencyLimiter;
///
/// let limiter = KeyedConcurrencyLimiter::new(2)?;
/// {
///     let permit = limiter.try_acquire_n(&"k", 2)?;
///     assert_eq!((permit.key(), permit.permits()), (&"k", 2));
///     assert_eq!(limiter.available(&"k"), 0);
/// }
/// assert_eq!(limiter.available(&"k"), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "the permits are released as soon as the permit is dropped"]
pub struct KeyedPermit<'a, K, S = foldhash::fast::RandomState>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    limiter: &'a KeyedConcurrencyLimiter<K, S>,
    key: K,
    shard: usize,
    permits: u32,
    slot: Slot,
}

impl<K, S> KeyedPermit<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// The permits held.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(3)?;
    /// assert_eq!(limiter.try_acquire_n(&1u8, 3)?.permits(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The key the permits belong to.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// assert_eq!(*limiter.try_acquire(&9u8)?.key(), 9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key(&self) -> &K {
        &self.key
    }
}

impl<K, S> Drop for KeyedPermit<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        self.limiter
            .inner
            .release(&self.key, self.shard, self.permits, self.slot);
    }
}

impl<K, S> fmt::Debug for KeyedPermit<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Debug + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedPermit")
            .field("key", &self.key)
            .field("permits", &self.permits)
            .finish()
    }
}

/// A `'static` [`KeyedPermit`]: it holds a handle to the limiter, for spawned tasks.
///
/// # Examples
///
/// ```
/// use turnstile::KeyedConcurrencyLimiter;
///
/// let limiter = KeyedConcurrencyLimiter::new(1)?;
/// let permit = limiter.try_acquire_owned(5u32, 1)?;
/// assert_eq!((*permit.key(), permit.permits()), (5, 1));
/// std::thread::spawn(move || drop(permit)).join().unwrap();
/// assert_eq!(limiter.available(&5), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "the permits are released as soon as the permit is dropped"]
pub struct OwnedKeyedPermit<K, S = foldhash::fast::RandomState>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    limiter: KeyedConcurrencyLimiter<K, S>,
    key: K,
    shard: usize,
    permits: u32,
    slot: Slot,
}

impl<K, S> OwnedKeyedPermit<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// The permits held.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(2)?;
    /// assert_eq!(limiter.try_acquire_owned(1u8, 2)?.permits(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The key the permits belong to.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// assert_eq!(limiter.try_acquire_owned("k", 1)?.key(), &"k");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn key(&self) -> &K {
        &self.key
    }

    /// The limiter the permits belong to.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(4)?;
    /// let permit = limiter.try_acquire_owned(1u8, 1)?;
    /// assert_eq!(permit.limiter().limit(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limiter(&self) -> &KeyedConcurrencyLimiter<K, S> {
        &self.limiter
    }
}

impl<K, S> Drop for OwnedKeyedPermit<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        self.limiter
            .inner
            .release(&self.key, self.shard, self.permits, self.slot);
    }
}

impl<K, S> fmt::Debug for OwnedKeyedPermit<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + fmt::Debug + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedKeyedPermit")
            .field("key", &self.key)
            .field("permits", &self.permits)
            .finish()
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn cell_retires_only_when_idle_and_never_equals_retired() {
        let algo = Concurrency { limit: u32::MAX };
        let clock = ManualClock::new();
        let cell = algo.cell();
        assert_eq!(
            algo.retire(&cell, &clock),
            Err(0),
            "never used: left to its inserter"
        );
        assert_eq!(algo.take(&cell, u32::MAX), Ok(Ok(0)));
        assert!(algo.retire(&cell, &clock).is_err());
        // The largest live word: every permit free, both flags set.
        cell.fetch_add(u64::from(u32::MAX), Ordering::Relaxed);
        cell.fetch_or(WAITERS, Ordering::Relaxed);
        assert_ne!(cell.load(Ordering::Relaxed), RETIRED);
        assert!(
            algo.retire(&cell, &clock).is_err(),
            "a blocked head keeps the key"
        );
        cell.fetch_and(!WAITERS, Ordering::Relaxed);
        assert_eq!(algo.retire(&cell, &clock), Ok(()));
        assert_eq!(algo.take(&cell, 1), Err(TryAcquireError::Closed));
        assert_eq!(algo.take_or_mark(&cell, 1), Err(TryAcquireError::Closed));
    }

    #[test]
    fn head_marks_when_short_and_clears_when_served() {
        let algo = Concurrency { limit: 2 };
        let cell = algo.cell();
        assert_eq!(algo.take(&cell, 2), Ok(Ok(0)));
        assert_eq!(algo.take_or_mark(&cell, 1), Ok(Err(0)));
        assert_ne!(cell.load(Ordering::Relaxed) & WAITERS, 0);
        cell.fetch_add(1, Ordering::Relaxed);
        assert_eq!(algo.take_or_mark(&cell, 1), Ok(Ok(0)));
        assert_eq!(cell.load(Ordering::Relaxed) & WAITERS, 0);
    }
}
