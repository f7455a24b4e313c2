//! [`StoreLimiter`]: the four algorithms over any async key-value store that offers only get and
//! set-with-expiry (memcached, a SQL table, a cloud cache), for when Redis is not available.
//!
//! **Atomic within one process only.** Such a store has no compare-and-set and no scripts, so a
//! decision is a read-modify-write: `get`, decide, `set`. Inside one process, [`KeyLocks`]
//! serialises the decisions on each key, so they are exact: the decisions of one limiter and its
//! clones, that is (two `StoreLimiter`s built over one store and prefix have a `KeyLocks` each, and
//! race as two processes do). Two processes sharing the store can both read the same state and both
//! admit: across processes this is the read-modify-write race of AspNetCoreRateLimit's distributed
//! counter, and nothing built on get/set alone can close it. For a limit shared by several
//! processes, use [`RedisLimiter`](crate::RedisLimiter) (feature `redis`), whose every decision is
//! one atomic script on Redis's clock.

use crate::algorithm::{Algo, Charge, FixedWindow, SlidingCounter, SlidingWindow, TokenBucket};
use crate::clock::Clock;
use crate::decision::{Admission, Rejection};
#[cfg(feature = "tokio")]
use crate::error::AcquireError;
use crate::error::{ConfigError, TryAcquireError};
use crate::keyed::Unused;
use crate::keylocks::KeyLocks;
use crate::limiter::Algorithm;
use crate::sync::{Arc, AtomicU64, Ordering};
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// An async key-value store with only `get` and `set` with an expiry: what [`StoreLimiter`]
/// needs. Implement it for memcached, a SQL table (a row with an `expires_at` column), and so on.
///
/// # Examples
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use std::time::{Duration, Instant};
/// use turnstile::Store;
///
/// /// A store in this process's memory, entries dropped once expired (`None`: a TTL too long
/// /// for an `Instant`, which never expires).
/// #[derive(Default)]
/// struct Memory(Mutex<HashMap<Vec<u8>, (Vec<u8>, Option<Instant>)>>);
///
/// impl Store for Memory {
///     type Error = std::convert::Infallible;
///
///     async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
///         let map = self.0.lock().unwrap();
///         let live = |until: &Option<Instant>| until.is_none_or(|at| at > Instant::now());
///         Ok(map.get(key).filter(|(_, until)| live(until)).map(|(v, _)| v.clone()))
///     }
///
///     async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Self::Error> {
///         let until = Instant::now().checked_add(ttl);
///         self.0.lock().unwrap().insert(key.to_vec(), (value, until));
///         Ok(())
///     }
/// }
///
/// // The longest TTLs run to centuries: a window of `Duration::MAX`, a bucket charged deep
/// // into debt. `Instant::now() + ttl` may panic on them (`Instant` is smaller on some
/// // platforms), hence `checked_add`.
/// let memory = Memory::default();
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// memory.set(b"k", vec![1], Duration::MAX).await.unwrap();
/// assert_eq!(memory.get(b"k").await.unwrap(), Some(vec![1]));
/// # });
/// ```
pub trait Store: Send + Sync + 'static {
    /// What a failed `get` or `set` reports.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The value stored at `key`, or `None` if there is none (or it has expired).
    ///
    /// # Cancel safety
    ///
    /// The limiter may drop this future (when its caller is cancelled); a read must leave
    /// nothing behind.
    ///
    /// # Examples
    ///
    /// ```
    /// # async fn demo<S: turnstile::Store>(store: &S) -> Result<(), S::Error> {
    /// if let Some(bytes) = store.get(b"login:alice:fw").await? {
    ///     println!("{} bytes of state", bytes.len());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    fn get(&self, key: &[u8]) -> impl Future<Output = Result<Option<Vec<u8>>, Self::Error>> + Send;

    /// Stores `value` at `key`, to expire after `ttl` (at least 1 ms; a store with coarser
    /// expiry rounds up). After the TTL the state equals a fresh one, so an expired key loses
    /// nothing. A TTL can be very long (up to `Duration::MAX`, for the longest windows or a
    /// token bucket charged deep into debt): an implementation must neither overflow on it
    /// (`Instant::checked_add`, an expiry saturated at the store's largest) nor shorten it.
    ///
    /// # Cancel safety
    ///
    /// The limiter may drop this future; the write may then have happened or not, and either is
    /// fine for the limiter (the admission it was for is never reported to the caller). What is
    /// not fine is a write that happens *later*: the limiter releases the subject's lock when
    /// the future is dropped, so a request still in flight (sent on a pooled connection, or
    /// queued in a client's background task) that lands after a later decision's write
    /// replaces that state with an older one, and the admissions recorded in between are
    /// forgotten. An implementation must therefore either finish or abandon the write by the
    /// time the future is dropped (a request on a connection of its own, closed on drop, or a
    /// store call that is not cancellable), or accept that a cancelled caller can make the
    /// subject over-admit by what was decided meanwhile.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # async fn demo<S: turnstile::Store>(store: &S) -> Result<(), S::Error> {
    /// store.set(b"login:alice:fw", vec![0; 8], Duration::from_secs(60)).await?;
    /// # Ok(())
    /// # }
    /// ```
    fn set(
        &self,
        key: &[u8],
        value: Vec<u8>,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Removes the value at `key`: true if there was one (unexpired). Used by
    /// [`StoreLimiter::reset`].
    ///
    /// Optional: the default needs only `get` and `set`. It reads the key and, if a value is
    /// there, overwrites it with an empty value that expires after 1 ms: every [`StoreLimiter`]
    /// (of any algorithm, and of every version so far) reads an empty value as no state, and the
    /// store drops it soon after. Override it where the store can delete (memcached's `delete`,
    /// SQL's `DELETE`): one round trip instead of two, and the key is gone at once.
    ///
    /// # Cancel safety
    ///
    /// The limiter may drop this future; the value may then have been removed or not, and either
    /// is fine for the limiter. An override must not leave a value that is neither the old one
    /// nor absent (the default writes nothing if dropped during its `get`, and its one `set` is
    /// the store's own, whole or not at all).
    ///
    /// # Examples
    ///
    /// ```
    /// # async fn demo<S: turnstile::Store>(store: &S) -> Result<(), S::Error> {
    /// if store.delete(b"login:alice:fw").await? {
    ///     println!("alice's failed logins are forgiven");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    fn delete(&self, key: &[u8]) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        async move {
            // An empty value is what this default itself leaves behind: nothing to remove.
            let held = self.get(key).await?.is_some_and(|v| !v.is_empty());
            if held {
                self.set(key, Vec::new(), Duration::from_millis(1)).await?;
            }
            Ok(held)
        }
    }
}

/// Wall-clock nanoseconds since the Unix epoch, never going back within this process (a step
/// back of the system clock holds the reading still until the clock catches up). Processes
/// sharing a store must share an epoch, hence the wall clock; their skew loosens the limits.
struct WallClock {
    last: AtomicU64,
}

impl WallClock {
    /// The system clock's reading, which may go back.
    fn wall() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX >> 2))
    }

    /// How far readings are held ahead of the system clock now, in ns (0 unless it stepped back).
    ///
    /// A TTL is real time, counted by the store, but the state's times are this clock's: while
    /// it is held still, its time does not pass, and the state restricts for that much longer
    /// in real time: a rejection's retry-after and an admission's reset-after are that much
    /// longer too. With a TTL of the state's own time alone, a fixed window held 1 ms before its
    /// end was dropped by the store every millisecond and admitted its limit again each time;
    /// with such a retry-after, `acquire` retried every millisecond.
    fn lag(&self) -> u64 {
        // Relaxed: a reading of the maximum for a TTL; a newer one only shortens the lag.
        self.last
            .load(Ordering::Relaxed)
            .saturating_sub(Self::wall())
    }
}

impl Clock for WallClock {
    fn now(&self) -> u64 {
        let wall = Self::wall();
        // Relaxed: the maximum alone keeps readings from going back (read-modify-writes of one
        // word always read its latest value), and a reader that must not see a time earlier
        // than a writer's is already ordered after it by the Acquire/Release on the state it
        // decides on (load, then clock), as with `UpkeepClock`.
        let before = self.last.fetch_max(wall, Ordering::Relaxed);
        before.max(wall)
    }
}

enum AnyAlgo {
    Fixed(FixedWindow),
    Sliding(SlidingWindow),
    Counter(SlidingCounter),
    Bucket(TokenBucket),
}

/// Counts kept by a [`StoreLimiter`].
///
/// # Examples
///
/// ```
/// # fn demo<S: turnstile::Store>(limiter: turnstile::StoreLimiter<S>) {
/// let stats = limiter.stats();
/// println!("{} admitted, {} store errors", stats.admitted, stats.errors);
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StoreStats {
    /// Calls admitted.
    pub admitted: u64,
    /// Calls rejected by the limit.
    pub rejected: u64,
    /// Calls that failed because the store failed.
    pub errors: u64,
}

/// A rate limiter whose per-subject state lives in a [`Store`]: exact within one process (among
/// the clones of one limiter: build one per store and prefix and share it), **not** across
/// processes: two processes can both read the same state and both admit, the read-modify-write
/// race of AspNetCoreRateLimit's distributed counter, which nothing built on get and set alone
/// can close (use [`RedisLimiter`](crate::RedisLimiter) for a limit shared between processes).
///
/// Each decision runs the same algorithm code as the in-memory limiters on a cell restored from
/// the stored bytes (8 bytes per word, little-endian: one word for the fixed window and the
/// token bucket, three for the sliding counter, 2 + limit for the exact sliding window), under
/// a per-subject write lock from [`KeyLocks`]; an admission stores the new state with a TTL
/// that ends when it equals a fresh one, a rejection writes nothing. Time is the wall clock in
/// nanoseconds since the Unix epoch, kept from going back within the process: after a step back
/// of the system clock the reading stays still until the clock catches up, and each TTL,
/// retry-after and reset-after is lengthened by that wait, the real time the state's own time
/// takes to pass. Keys are `prefix:subject:fw` (or `sw`, `sc`, `tb`), subject bytes as given: a
/// store with a key length limit must hash long keys itself. A `:` in the prefix is written `%3A`
/// and a `%` as `%25`, so that the prefix ends at the key's first `:` and no two limiters' keys
/// meet: written as is, prefix `a` with subject `b:x` and prefix `a:b` with subject `x` shared the
/// key `a:b:x:fw`. A prefix without either character is written as is; one with either gets new
/// keys, so its subjects start afresh once when a version that wrote it as is is replaced. A stored
/// value that cannot be this algorithm's state is treated as absent (never a panic, never a wait
/// for a writer that does not exist); one that can is used as it is, whoever wrote it: a token
/// bucket's arrival time or a sliding window's expiry far ahead (a foreign value, or a writer whose
/// clock is ahead) rejects until then.
///
/// **Other parameters on existing keys** (another process, or a redeploy, over the same keys):
/// the fixed window and the sliding counter apply the caller's limit to the counts they find;
/// an exact sliding window's ring of another limit is read as its admissions that expire last
/// (which, after other windows, need not be the newest), as many as the caller's limit (all of
/// them if fewer), each with the expiry of the window it was admitted under, and the key lives
/// until the latest of them. The parameters themselves are not
/// stored, which costs two departures from the in-memory `reconfigure` and the Redis backend:
/// under another window length the fixed window's or sliding counter's stored window is not the
/// current one, so the subject starts a fresh window; and a token bucket reads the stored
/// theoretical arrival time under the caller's rate and burst, keeping the time until the bucket
/// is full rather than how full it is (a bucket emptied at 10 per second, full again in a
/// second, is full again in a second at 1 per second too). After a redeploy that happens once
/// per subject; two processes running side by side with different window lengths start a fresh
/// window at every turn of the writer, so together they admit up to a limit per turn. Storing
/// the parameters would change the stored value's length, which every earlier version reads as
/// no state: during a rolling deploy the old processes would then forget a subject's count at
/// every write of the new ones. Keep the parameters of one prefix the same in every process, or
/// use [`RedisLimiter`](crate::RedisLimiter), which stores them.
///
/// # Examples
///
/// ```
/// # use std::collections::HashMap;
/// # use std::sync::Mutex;
/// # use std::time::{Duration, Instant};
/// # #[derive(Default)]
/// # struct Memory(Mutex<HashMap<Vec<u8>, (Vec<u8>, Instant)>>);
/// # impl turnstile::Store for Memory {
/// #     type Error = std::convert::Infallible;
/// #     async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
/// #         let map = self.0.lock().unwrap();
/// #         Ok(map.get(key).filter(|(_, until)| *until > Instant::now()).map(|(v, _)| v.clone()))
/// #     }
/// #     async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Self::Error> {
/// #         self.0.lock().unwrap().insert(key.to_vec(), (value, Instant::now() + ttl));
/// #         Ok(())
/// #     }
/// # }
/// use turnstile::{Algorithm, StoreLimiter};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = StoreLimiter::new(
///     Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(60) },
///     "login",
///     Memory::default(),
/// )?;
/// assert!(limiter.try_acquire("alice").await.is_ok());
/// assert!(limiter.try_acquire("alice").await.is_ok());
/// assert!(limiter.try_acquire("alice").await.is_err());
/// # Ok(())
/// # }
/// ```
pub struct StoreLimiter<S> {
    inner: Arc<StoreInner<S>>,
}

struct StoreInner<S> {
    store: S,
    algo: AnyAlgo,
    algorithm: Algorithm,
    suffix: &'static str,
    prefix: String,
    /// The prefix as keys spell it (see [`escape_prefix`]).
    key_prefix: String,
    locks: KeyLocks<Vec<u8>>,
    clock: WallClock,
    counters: [AtomicU64; 3],
}

impl<S> Clone for StoreLimiter<S> {
    fn clone(&self) -> Self {
        StoreLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S> fmt::Debug for StoreLimiter<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreLimiter")
            .field("algorithm", &self.inner.algorithm)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

/// What to store after an admission: the state's bytes and their TTL.
type Write = Option<(Vec<u8>, Duration)>;

/// One decision on stored bytes: the verdict, and what to store if it admitted. `outlived` gives
/// the latest time (clock ns) until which the saved words can restrict beyond the admission's
/// own `reset_after` (0 if never), so that the TTL covers it too.
fn run<A: Unused, C: Clock>(
    algo: &A,
    words: Option<Vec<u64>>,
    n: u32,
    clock: &C,
    outlived: fn(&[u64]) -> u64,
) -> (Result<Admission, TryAcquireError>, Write) {
    let cell = words
        .and_then(|w| algo.restore(&w))
        .unwrap_or_else(|| fresh(algo, n));
    let result = algo.try_acquire(&cell, n, clock);
    let write = match &result {
        Ok(admission) => save::<A>(&cell, admission, n, outlived),
        Err(_) => None,
    };
    (result, write)
}

/// The state of a subject the store holds nothing (readable) for, for a call of `n` permits:
/// for a probe (`n == 0`, which writes nothing back) one that answers as a fresh state without
/// being built as one; a fresh exact sliding window is a ring of 8 bytes per permit, which each
/// probe of an unknown subject allocated and dropped.
fn fresh<A: Unused>(algo: &A, n: u32) -> A::Cell {
    if n == 0 {
        algo.probe_cell()
    } else {
        algo.cell()
    }
}

/// A charge of `n` on stored bytes ([`Charge::charge`]): what it reports, and what to store
/// (nothing for `n == 0`), with an admission's TTL: until the state equals a fresh one.
fn run_charge<A: Charge + Unused, C: Clock>(
    algo: &A,
    words: Option<Vec<u64>>,
    n: u32,
    clock: &C,
    outlived: fn(&[u64]) -> u64,
) -> (Admission, Write) {
    let mut cell = words
        .and_then(|w| algo.restore(&w))
        .unwrap_or_else(|| fresh(algo, n));
    // Only a retired cell refuses a charge, and `restore` refuses a retired word: should one get
    // through, the charge goes to a fresh cell, as for bytes that are no state. A fresh cell is
    // never retired (the last arm only keeps this free of panics).
    let admission = match algo.charge(&cell, n, clock) {
        Ok(admission) => admission,
        Err(_) => {
            cell = algo.cell();
            match algo.charge(&cell, n, clock) {
                Ok(admission) => admission,
                Err(_) => return (Admission::new(clock.now(), 0, 0), None),
            }
        }
    };
    let write = save::<A>(&cell, &admission, n, outlived);
    (admission, write)
}

/// `admission` with its `reset_after` lengthened by `lag`, the time [`WallClock`] is held ahead
/// of real time (see [`WallClock::lag`]), unless it is 0: a state that is fresh now is fresh
/// whatever the clock.
fn lengthen(admission: Admission, lag: u64) -> Admission {
    match admission.reset_after_nanos() {
        0 => admission,
        reset_after => Admission::with_token(
            admission.at_nanos(),
            reset_after.saturating_add(lag),
            admission.remaining(),
            admission.token(),
        ),
    }
}

/// What to store after `admission` took `n > 0` permits on `cell` (None for `n == 0`).
fn save<A: Algo>(
    cell: &A::Cell,
    admission: &Admission,
    n: u32,
    outlived: fn(&[u64]) -> u64,
) -> Write {
    if n == 0 {
        return None;
    }
    let words = A::save(cell);
    let outlives = outlived(&words).saturating_sub(admission.at_nanos());
    let ttl = admission
        .reset_after()
        .max(Duration::from_nanos(outlives))
        .max(Duration::from_millis(1));
    let bytes = words.into_iter().flat_map(u64::to_le_bytes).collect();
    Some((bytes, ttl))
}

/// Stored bytes as words (8 bytes each, little-endian), or `None` if they are not a whole
/// number of words.
fn decode(stored: Option<&[u8]>) -> Option<Vec<u64>> {
    stored.filter(|b| b.len() % 8 == 0).map(|b| {
        b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect()
    })
}

/// A saved sliding-window ring of another limit (`head`, `expired`, then one slot per permit of
/// that limit, `expiry << 1 | lap parity`) as a ring of `slots` slots holding the same
/// admissions: the `slots` latest-expiring of them (or all), in ascending order of expiry, from
/// ticket 0 on lap 0 (parity 0), the other slots unwritten (1). A ring of the right length, or
/// none, is returned as it is, for `restore` to judge.
///
/// Another process, or the next version, may run with another limit over the same keys. The
/// ring cannot be restored as it is (its slots are positions modulo the old limit), and treating
/// it as absent forgot every admission in it: a limit lowered from 100 to 10 handed out 10 more
/// to a subject with 100 in the window. Every ticket below the old ring's last lap has expired
/// (each claim checked those it was decided on), so its live admissions are among the tickets
/// it holds; of those, the latest `slots` expiries are what decides under the new limit, as a
/// charge's overdraw keeps the log's latest (see `SlidingWindow::overdraw`): one left out
/// expires no later than every one kept, so while it is live all kept ones are (the ring is
/// full either way), and once it has expired it counts in neither. Sorted, expiry is
/// non-decreasing in ticket order, so a claim that finds a ticket expired knows every older one
/// has. That is exact under the new limit, as the in-memory `reconfigure` and the Redis backend
/// count the admissions they find. The *newest* tickets are not the latest expiries once some
/// were admitted under a longer window: keeping those (the oldest kept lent the latest expiry
/// left out) kept one entry for several live ones, and a charge's overdraw, which writes what
/// the ring holds, then forgot the others. `None` (no state) for a ring that `restore` would
/// refuse at any length: a retired head, or a ticket below the head whose slot does not show
/// its lap's parity. (The new ring's head is at most `slots`, however far the old one was.)
fn resize_ring(words: Vec<u64>, slots: usize) -> Option<Vec<u64>> {
    let [head, _, old @ ..] = &words[..] else {
        return Some(words);
    };
    if old.len() == slots || old.is_empty() {
        return Some(words);
    }
    let head = *head;
    let laps = old.len() as u64;
    let published = |t: u64| old[(t % laps) as usize] & 1 == (t / laps) & 1;
    if head == crate::algorithm::RETIRED || !(head.saturating_sub(laps)..head).all(published) {
        return None;
    }
    // Still shifted left by one, a charge's mark (bit 63) kept; compared by expiry alone: a
    // marked word that expired long ago is the larger number.
    let mut log: Vec<u64> = (head.saturating_sub(laps)..head)
        .map(|t| old[(t % laps) as usize] & !1)
        .collect();
    log.sort_unstable_by_key(|&word| crate::algorithm::slot_expiry(word));
    let kept = log.split_off(log.len().saturating_sub(slots));
    let mut ring = Vec::with_capacity(2 + slots);
    ring.extend([kept.len() as u64, 0]);
    ring.extend(kept);
    ring.resize(2 + slots, 1);
    Some(ring)
}

/// The latest expiry in a saved sliding-window ring (`head`, `expired`, then one word per slot,
/// `expiry << 1 | lap parity`; unwritten and refunded slots hold expiry 0).
///
/// Each ticket keeps the window it was admitted under, and the ring may hold tickets of a longer
/// window than this limiter's (written by another process or an earlier version with other
/// parameters): they go on restricting until their own expiry, later than this admission's
/// `reset_after` (its window). The key must live until then; with a TTL of the window alone it
/// expired early and took those admissions with it.
fn latest_expiry(words: &[u64]) -> u64 {
    words
        .iter()
        .skip(2)
        .map(|&slot| crate::algorithm::slot_expiry(slot))
        .max()
        .unwrap_or(0)
}

impl<S: Store> StoreLimiter<S> {
    /// A limiter running `algorithm` over `store`, its keys starting with `prefix`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if a parameter is zero or too large.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// # struct Nothing;
    /// # impl turnstile::Store for Nothing {
    /// #     type Error = std::convert::Infallible;
    /// #     async fn get(&self, _: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> { Ok(None) }
    /// #     async fn set(&self, _: &[u8], _: Vec<u8>, _: Duration) -> Result<(), Self::Error> { Ok(()) }
    /// # }
    /// use turnstile::{Algorithm, ConfigError, StoreLimiter};
    ///
    /// let err = StoreLimiter::new(Algorithm::FixedWindow { limit: 0, window: Duration::from_secs(1) }, "p", Nothing);
    /// assert_eq!(err.unwrap_err(), ConfigError::Zero { what: "limit" });
    /// ```
    pub fn new(
        algorithm: Algorithm,
        prefix: impl Into<String>,
        store: S,
    ) -> Result<Self, ConfigError> {
        let prefix = prefix.into();
        let (algo, suffix) = match algorithm {
            Algorithm::FixedWindow { limit, window } => {
                (AnyAlgo::Fixed(FixedWindow::new(limit, window)?), "fw")
            }
            Algorithm::SlidingWindow { limit, window } => {
                (AnyAlgo::Sliding(SlidingWindow::new(limit, window)?), "sw")
            }
            Algorithm::SlidingCounter { limit, window } => {
                (AnyAlgo::Counter(SlidingCounter::new(limit, window)?), "sc")
            }
            Algorithm::TokenBucket { rate, burst } => {
                (AnyAlgo::Bucket(TokenBucket::new(rate, burst)?), "tb")
            }
        };
        Ok(StoreLimiter {
            inner: Arc::new(StoreInner {
                store,
                algo,
                algorithm,
                suffix,
                key_prefix: escape_prefix(&prefix),
                prefix,
                locks: KeyLocks::new(),
                clock: WallClock {
                    last: AtomicU64::new(0),
                },
                counters: Default::default(),
            }),
        })
    }

    /// Takes one permit for `subject`. See [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo<S: turnstile::Store>(limiter: turnstile::StoreLimiter<S>) {
    /// if limiter.try_acquire("alice").await.is_err() {
    ///     println!("429");
    /// }
    /// # }
    /// ```
    pub async fn try_acquire<K>(&self, subject: &K) -> Result<Admission, TryAcquireError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        self.try_acquire_n(subject, 1).await
    }

    /// Takes `n` permits for `subject`, all or nothing (`n == 0` asks for one and takes
    /// nothing): under the subject's write lock, `get`, decide, and `set` if admitted.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Rejected`] with the exact retry-after;
    /// [`TryAcquireError::InsufficientCapacity`] if `n` exceeds the limit (the store is not
    /// asked); [`TryAcquireError::Unavailable`] if the store failed (counted in
    /// [`stats`](Self::stats)).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits for the lock or for `get` changes nothing. Dropped
    /// during `set`, the admission may or may not have been stored; the caller never sees it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo<S: turnstile::Store>(limiter: turnstile::StoreLimiter<S>) {
    /// match limiter.try_acquire_n("report-export", 5).await {
    ///     Ok(a) => println!("{} left", a.remaining()),
    ///     Err(e) => println!("{e}"),
    /// }
    /// # }
    /// ```
    pub async fn try_acquire_n<K>(&self, subject: &K, n: u32) -> Result<Admission, TryAcquireError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        let inner = &*self.inner;
        let capacity = match &inner.algo {
            AnyAlgo::Fixed(a) => a.limit(),
            AnyAlgo::Sliding(a) => a.limit(),
            AnyAlgo::Counter(a) => a.limit(),
            AnyAlgo::Bucket(a) => a.limit(),
        };
        if n > capacity {
            return Err(TryAcquireError::InsufficientCapacity {
                requested: n,
                capacity,
            });
        }
        let key = self.key(subject);
        let _guard = inner.locks.write(&key[..]).await;
        let stored = match inner.store.get(&key).await {
            Ok(stored) => stored,
            Err(_) => return Err(inner.count(2, TryAcquireError::Unavailable)),
        };
        let words = decode(stored.as_deref());
        let clock = &inner.clock;
        // Only the sliding window's state can restrict beyond the admission's `reset_after`:
        // the others' words are all within it (a window's count, a bucket's `tat`).
        let never = |_: &[u64]| 0;
        let (result, save) = match &inner.algo {
            AnyAlgo::Fixed(a) => run(a, words, n, clock, never),
            AnyAlgo::Sliding(a) => {
                let words = words.and_then(|w| resize_ring(w, a.limit() as usize));
                run(a, words, n, clock, latest_expiry)
            }
            AnyAlgo::Counter(a) => run(a, words, n, clock, never),
            AnyAlgo::Bucket(a) => run(a, words, n, clock, never),
        };
        // The state's times are the clock's, which may be held ahead of real time: every
        // duration handed to the store or the caller is lengthened by the hold.
        let lag = inner.clock.lag();
        if let Some((value, ttl)) = save {
            let ttl = ttl.saturating_add(Duration::from_nanos(lag));
            if inner.store.set(&key, value, ttl).await.is_err() {
                return Err(inner.count(2, TryAcquireError::Unavailable));
            }
        }
        match result {
            Ok(admission) => {
                inner.counters[0].fetch_add(1, Ordering::Relaxed);
                Ok(lengthen(admission, lag))
            }
            Err(TryAcquireError::Rejected(r)) => {
                let retry_after = r.retry_after_nanos().saturating_add(lag);
                let rejected = TryAcquireError::Rejected(Rejection::new(retry_after, r.limit()));
                Err(inner.count(1, rejected))
            }
            Err(e) => Err(inner.count(1, e)),
        }
    }

    /// Records `n` permits as used by `subject` now, without checking the limit: for usage
    /// known only after the fact (the tokens of a reply, the bytes of a response, a failed
    /// login's penalty). Under the subject's write lock, `get`, then the in-memory algorithm's
    /// [`RateLimiter::charge`](crate::RateLimiter::charge) on the restored state (its
    /// semantics and bounds per algorithm), then `set`: never rejected, it may put the subject
    /// in *debt*, and later calls are then rejected with an exact retry-after until the debt
    /// has passed. `n == 0` records nothing (no `set`) and reports the state. The key's TTL is
    /// an admission's: until the state equals a fresh one, so a debt keeps its key alive (a
    /// token bucket charged far beyond its burst asks the store for as long a TTL).
    ///
    /// The [`Admission`] says what is left: [`remaining`](Admission::remaining) is 0 while in
    /// debt, [`reset_after`](Admission::reset_after) the time until the subject is back to its
    /// full capacity if nothing else is taken. Charges are not counted in
    /// [`stats`](Self::stats). As for decisions, the lock serialises charges with this
    /// process's decisions only (see [`StoreLimiter`]).
    ///
    /// # Errors
    ///
    /// The store's error if `get` or `set` failed (a charge is not a decision, so it is no
    /// [`TryAcquireError::Unavailable`]): nothing is recorded if `get` failed, and a failed
    /// `set` may or may not have stored it.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits for the lock or for `get` records nothing. Dropped
    /// during `set`, the charge may or may not have been stored; the state is whole either way.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::collections::HashMap;
    /// # use std::sync::Mutex;
    /// # use std::time::{Duration, Instant};
    /// # #[derive(Default)]
    /// # struct Memory(Mutex<HashMap<Vec<u8>, (Vec<u8>, Instant)>>);
    /// # impl turnstile::Store for Memory {
    /// #     type Error = std::convert::Infallible;
    /// #     async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
    /// #         let map = self.0.lock().unwrap();
    /// #         Ok(map.get(key).filter(|(_, until)| *until > Instant::now()).map(|(v, _)| v.clone()))
    /// #     }
    /// #     async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Self::Error> {
    /// #         self.0.lock().unwrap().insert(key.to_vec(), (value, Instant::now() + ttl));
    /// #         Ok(())
    /// #     }
    /// # }
    /// use turnstile::{Algorithm, StoreLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 100 MB per user per hour, counted once each download has finished.
    /// let downloads = StoreLimiter::new(
    ///     Algorithm::FixedWindow { limit: 100, window: Duration::from_secs(3600) },
    ///     "download-mb",
    ///     Memory::default(),
    /// )?;
    /// let state = downloads.charge("alice", 120).await?; // a 120 MB download
    /// assert_eq!(state.remaining(), 0); // 20 MB in debt
    /// assert!(downloads.try_acquire("alice").await.is_err()); // until the hour is over
    /// assert_eq!(downloads.charge("bob", 0).await?.remaining(), 100); // records nothing
    /// # Ok(())
    /// # }
    /// ```
    pub async fn charge<K>(&self, subject: &K, n: u32) -> Result<Admission, S::Error>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        let inner = &*self.inner;
        let key = self.key(subject);
        let _guard = inner.locks.write(&key[..]).await;
        let stored = inner.store.get(&key).await?;
        let words = decode(stored.as_deref());
        let clock = &inner.clock;
        // As in `try_acquire_n`: only the sliding window's state outlives its `reset_after`.
        let never = |_: &[u64]| 0;
        let (admission, save) = match &inner.algo {
            AnyAlgo::Fixed(a) => run_charge(a, words, n, clock, never),
            AnyAlgo::Sliding(a) => {
                let words = words.and_then(|w| resize_ring(w, a.limit() as usize));
                run_charge(a, words, n, clock, latest_expiry)
            }
            AnyAlgo::Counter(a) => run_charge(a, words, n, clock, never),
            AnyAlgo::Bucket(a) => run_charge(a, words, n, clock, never),
        };
        // As in `try_acquire_n`: durations lengthened by the clock's hold.
        let lag = inner.clock.lag();
        if let Some((value, ttl)) = save {
            let ttl = ttl.saturating_add(Duration::from_nanos(lag));
            inner.store.set(&key, value, ttl).await?;
        }
        Ok(lengthen(admission, lag))
    }

    /// Takes one permit for `subject`, waiting as long as it takes. See
    /// [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::collections::HashMap;
    /// # use std::sync::Mutex;
    /// # use std::time::{Duration, Instant};
    /// # #[derive(Default)]
    /// # struct Memory(Mutex<HashMap<Vec<u8>, (Vec<u8>, Instant)>>);
    /// # impl turnstile::Store for Memory {
    /// #     type Error = std::convert::Infallible;
    /// #     async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
    /// #         let map = self.0.lock().unwrap();
    /// #         Ok(map.get(key).filter(|(_, until)| *until > Instant::now()).map(|(v, _)| v.clone()))
    /// #     }
    /// #     async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Self::Error> {
    /// #         self.0.lock().unwrap().insert(key.to_vec(), (value, Instant::now() + ttl));
    /// #         Ok(())
    /// #     }
    /// # }
    /// use turnstile::{Algorithm, StoreLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let window = Duration::from_millis(50);
    /// let limiter = StoreLimiter::new(Algorithm::FixedWindow { limit: 1, window }, "crawl", Memory::default())?;
    /// let first = limiter.acquire("example.org").await?;
    /// let second = limiter.acquire("example.org").await?; // the next 50 ms window
    /// assert!(second.at() >= first.at());
    /// assert_eq!(limiter.stats().admitted, 2);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire<K>(&self, subject: &K) -> Result<Admission, AcquireError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        self.acquire_n(subject, 1).await
    }

    /// Takes `n` permits for `subject`, waiting as long as it takes: after each rejection it
    /// sleeps (on tokio's timer inside a tokio runtime, on futures-timer's helper thread
    /// anywhere else) for the retry-after plus a little jitter (up to 1/8 of it,
    /// between 0.1 ms and 50 ms, so that many waiters do not return at the same instant) and
    /// tries again, as [`RedisLimiter::acquire_n`](crate::RedisLimiter::acquire_n) does.
    ///
    /// **Not FIFO.** Waiters do not queue: whoever asks first after the permits free up gets
    /// them, and a waiter can be overtaken many times under contention;
    /// [`acquire_timeout`](Self::acquire_timeout) bounds the wait. The time is the wall clock
    /// (the state's), so tokio's paused time does not shorten the wait.
    ///
    /// # Errors
    ///
    /// [`AcquireError::InsufficientCapacity`] at once if `n` exceeds the limit;
    /// [`AcquireError::Unavailable`] as soon as the store fails (the wait ends: a store that
    /// fails is not waited for).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it sleeps consumes nothing; dropped during a decision, as
    /// [`try_acquire_n`](Self::try_acquire_n) (nothing half-written).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::collections::HashMap;
    /// # use std::sync::Mutex;
    /// # use std::time::{Duration, Instant};
    /// # #[derive(Default)]
    /// # struct Memory(Mutex<HashMap<Vec<u8>, (Vec<u8>, Instant)>>);
    /// # impl turnstile::Store for Memory {
    /// #     type Error = std::convert::Infallible;
    /// #     async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
    /// #         let map = self.0.lock().unwrap();
    /// #         Ok(map.get(key).filter(|(_, until)| *until > Instant::now()).map(|(v, _)| v.clone()))
    /// #     }
    /// #     async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Self::Error> {
    /// #         self.0.lock().unwrap().insert(key.to_vec(), (value, Instant::now() + ttl));
    /// #         Ok(())
    /// #     }
    /// # }
    /// use turnstile::{AcquireError, Algorithm, StoreLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = StoreLimiter::new(
    ///     Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(60) },
    ///     "batch",
    ///     Memory::default(),
    /// )?;
    /// let admission = limiter.acquire_n("job", 4).await?;
    /// assert_eq!(admission.remaining(), 6);
    /// assert_eq!(
    ///     limiter.acquire_n("job", 11).await,
    ///     Err(AcquireError::InsufficientCapacity { requested: 11, capacity: 10 })
    /// );
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_n<K>(&self, subject: &K, n: u32) -> Result<Admission, AcquireError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        crate::clock::retry_rejections(None, || self.try_acquire_n(subject, n)).await
    }

    /// [`acquire_n`](Self::acquire_n) within a time limit: the wait ends with
    /// [`AcquireError::Timeout`] once `timeout` has passed since the call, unless the permits
    /// were admitted first.
    ///
    /// The limit ends a sleep between attempts, never a decision: an attempt under way when the
    /// time is up (a `get`/`set` of the store) runs to its end and is answered, an admission
    /// included, so the call returns up to one decision's time late rather than leave a
    /// decision half done or permits taken that nobody holds, as a `tokio::time::timeout`
    /// around [`acquire_n`](Self::acquire_n) can. Measured on the timer the sleeps use
    /// (tokio's inside a tokio runtime, so its paused time counts; futures-timer's elsewhere);
    /// a `timeout` past what an `Instant` holds never passes.
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n), and [`AcquireError::Timeout`] when the time is up.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::collections::HashMap;
    /// # use std::sync::Mutex;
    /// # use std::time::{Duration, Instant};
    /// # #[derive(Default)]
    /// # struct Memory(Mutex<HashMap<Vec<u8>, (Vec<u8>, Instant)>>);
    /// # impl turnstile::Store for Memory {
    /// #     type Error = std::convert::Infallible;
    /// #     async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
    /// #         let map = self.0.lock().unwrap();
    /// #         Ok(map.get(key).filter(|(_, until)| *until > Instant::now()).map(|(v, _)| v.clone()))
    /// #     }
    /// #     async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Self::Error> {
    /// #         self.0.lock().unwrap().insert(key.to_vec(), (value, Instant::now() + ttl));
    /// #         Ok(())
    /// #     }
    /// # }
    /// use turnstile::{AcquireError, Algorithm, StoreLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = StoreLimiter::new(
    ///     Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(3600) },
    ///     "batch",
    ///     Memory::default(),
    /// )?;
    /// let admission = limiter.acquire_timeout("job", 8, Duration::from_secs(5)).await?;
    /// assert_eq!(admission.remaining(), 2);
    /// // The next window is up to an hour away: the call gives up after five seconds.
    /// let late = limiter.acquire_timeout("job", 4, Duration::from_secs(5)).await;
    /// assert_eq!(late, Err(AcquireError::Timeout));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_timeout<K>(
        &self,
        subject: &K,
        n: u32,
        timeout: Duration,
    ) -> Result<Admission, AcquireError>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        crate::clock::retry_rejections(Some(timeout), || self.try_acquire_n(subject, n)).await
    }

    /// Forgets `subject`'s state in the store: its next call, through this limiter or any other
    /// sharing the store and prefix, starts as a subject seen for the first time would, with the
    /// full limit (burst). `Ok(true)` if the store held state for it, `Ok(false)` if it had none
    /// (never seen, or expired), when nothing changes. As
    /// [`RedisLimiter::reset`](crate::RedisLimiter::reset) and
    /// [`KeyedLimiter::reset`](crate::KeyedLimiter::reset) do, for a login's failure counter
    /// once the password was right, a client cleared by an operator, and so on.
    ///
    /// The state is removed with [`Store::delete`], under the subject's write lock in
    /// [`KeyLocks`], the one its decisions hold from `get` to `set`: a decision in this process
    /// that races the reset is decided and stored wholly before it (and forgotten with the rest)
    /// or wholly after it, on the fresh state; none writes the old state back over the reset.
    /// Decisions in other processes are not serialised with it (see [`StoreLimiter`]): one that
    /// read the old state before the reset can still store its admission on it afterwards.
    ///
    /// **Why `delete`, a trait method with a default.** The store has no delete of its own, and
    /// the alternative, writing a fresh state with the shortest TTL, would need no trait change.
    /// But a fresh state is one algorithm's bytes, written whether or not there was state (so it
    /// could not say which), and a store that can delete could not do so. `Store::delete`'s
    /// default needs only get and set (it reads the key, and overwrites a value it finds with an
    /// empty one expiring after 1 ms, which every algorithm reads as no state), and a store that
    /// overrides it removes the key in one round trip. Existing `Store` implementations compile
    /// unchanged.
    ///
    /// # Errors
    ///
    /// The store's error if `delete` failed (not counted in [`stats`](Self::stats), which counts
    /// decisions). The state may then be there still.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits for the lock changes nothing. Dropped during `delete`,
    /// the state may or may not have been removed (see [`Store::delete`]); either way it is
    /// whole, and the next decision on the subject runs on it or on a fresh one.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::collections::HashMap;
    /// # use std::sync::Mutex;
    /// # use std::time::{Duration, Instant};
    /// # #[derive(Default)]
    /// # struct Memory(Mutex<HashMap<Vec<u8>, (Vec<u8>, Instant)>>);
    /// # impl turnstile::Store for Memory {
    /// #     type Error = std::convert::Infallible;
    /// #     async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
    /// #         let map = self.0.lock().unwrap();
    /// #         Ok(map.get(key).filter(|(_, until)| *until > Instant::now()).map(|(v, _)| v.clone()))
    /// #     }
    /// #     async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Self::Error> {
    /// #         self.0.lock().unwrap().insert(key.to_vec(), (value, Instant::now() + ttl));
    /// #         Ok(())
    /// #     }
    /// # }
    /// use turnstile::{Algorithm, StoreLimiter};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Five failed logins per user per 15 minutes.
    /// let failures = StoreLimiter::new(
    ///     Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(15 * 60) },
    ///     "failed-logins",
    ///     Memory::default(),
    /// )?;
    /// for _ in 0..5 {
    ///     failures.try_acquire("alice").await?;
    /// }
    /// assert!(failures.try_acquire("alice").await.is_err());
    /// // Alice got her password right: her failures are forgiven.
    /// assert!(failures.reset("alice").await?);
    /// assert_eq!(failures.try_acquire("alice").await?.remaining(), 4);
    /// assert!(!failures.reset("bob").await?);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset<K>(&self, subject: &K) -> Result<bool, S::Error>
    where
        K: AsRef<[u8]> + ?Sized,
    {
        let inner = &*self.inner;
        let key = self.key(subject);
        let _guard = inner.locks.write(&key[..]).await;
        inner.store.delete(&key).await
    }

    /// The store key of `subject`: `prefix:subject:suffix`, a `:` in the prefix written `%3A`
    /// and a `%` in it `%25` (so that no two prefixes' keys meet; see [`StoreLimiter`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo<S: turnstile::Store>(limiter: turnstile::StoreLimiter<S>) {
    /// assert!(limiter.key("alice").ends_with(b":alice:fw"));
    /// # }
    /// ```
    pub fn key<K: AsRef<[u8]> + ?Sized>(&self, subject: &K) -> Vec<u8> {
        let inner = &*self.inner;
        let subject = subject.as_ref();
        let mut key =
            Vec::with_capacity(inner.key_prefix.len() + subject.len() + inner.suffix.len() + 2);
        key.extend_from_slice(inner.key_prefix.as_bytes());
        key.push(b':');
        key.extend_from_slice(subject);
        key.push(b':');
        key.extend_from_slice(inner.suffix.as_bytes());
        key
    }

    /// The counts so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo<S: turnstile::Store>(limiter: turnstile::StoreLimiter<S>) {
    /// assert_eq!(limiter.stats().errors, 0);
    /// # }
    /// ```
    pub fn stats(&self) -> StoreStats {
        let c = |i: usize| self.inner.counters[i].load(Ordering::Relaxed);
        StoreStats {
            admitted: c(0),
            rejected: c(1),
            errors: c(2),
        }
    }

    /// The algorithm and its parameters.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo<S: turnstile::Store>(limiter: turnstile::StoreLimiter<S>) {
    /// println!("{:?}", limiter.algorithm());
    /// # }
    /// ```
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }
}

/// The prefix as keys spell it: `%` as `%25` and `:` as `%3A`, everything else as is. With no
/// `:` in it, the prefix is what precedes a key's first `:`; the suffix (no `:` either) follows
/// its last, and the subject lies between: one key per (prefix, subject, algorithm). `%` is
/// escaped too so that the prefix `a%3Ab` stays apart from `a:b`. A prefix with neither
/// character keeps the key it had before the escape, and with it its counters.
fn escape_prefix(prefix: &str) -> String {
    let mut escaped = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        match c {
            '%' => escaped.push_str("%25"),
            ':' => escaped.push_str("%3A"),
            c => escaped.push(c),
        }
    }
    escaped
}

impl<S> StoreInner<S> {
    fn count(&self, counter: usize, error: TryAcquireError) -> TryAcquireError {
        self.counters[counter].fetch_add(1, Ordering::Relaxed);
        error
    }
}

#[cfg(all(test, feature = "tokio", not(turnstile_loom)))]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// Key → (value, expiry on the store's time).
    type Entries = HashMap<Vec<u8>, (Vec<u8>, Duration)>;

    /// A store whose expiry runs on a time of its own, advanced by hand: the real time that
    /// passes while the limiter's wall clock is held still.
    #[derive(Default)]
    struct Virtual {
        now: Mutex<Duration>,
        map: Mutex<Entries>,
    }

    impl Virtual {
        fn advance(&self, by: Duration) {
            *self.now.lock().unwrap() += by;
        }
    }

    impl Store for std::sync::Arc<Virtual> {
        type Error = std::convert::Infallible;

        async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error> {
            let now = *self.now.lock().unwrap();
            let map = self.map.lock().unwrap();
            Ok(map
                .get(key)
                .filter(|(_, until)| *until > now)
                .map(|(v, _)| v.clone()))
        }

        async fn set(&self, key: &[u8], value: Vec<u8>, ttl: Duration) -> Result<(), Self::Error> {
            let until = *self.now.lock().unwrap() + ttl;
            self.map
                .lock()
                .unwrap()
                .insert(key.to_vec(), (value, until));
            Ok(())
        }
    }

    /// A fixed window of `limit` per minute over a [`Virtual`] store, its limiter's clock held
    /// an hour ahead of the system clock (as after a step back of an hour), 1 ms before the end
    /// of a window: the store, the limiter and the held reading.
    fn held_for_an_hour(
        limit: u32,
    ) -> (
        std::sync::Arc<Virtual>,
        StoreLimiter<std::sync::Arc<Virtual>>,
        u64,
    ) {
        let window = Duration::from_secs(60);
        let store = std::sync::Arc::new(Virtual::default());
        let limiter = StoreLimiter::new(
            Algorithm::FixedWindow { limit, window },
            "t",
            std::sync::Arc::clone(&store),
        )
        .unwrap();
        let w = window.as_nanos() as u64;
        let ahead = limiter.inner.clock.now() + 3_600_000_000_000;
        let held = (ahead / w + 1) * w - 1_000_000;
        limiter.inner.clock.last.store(held, Ordering::Relaxed);
        (store, limiter, held)
    }

    /// The system clock stepped back an hour, just after a reading 1 ms before the end of a
    /// minute's window: the limiter's clock stays on that reading for the hour, so its window
    /// does not end for an hour of real time. The stored state must live as long; with a TTL
    /// of the 1 ms left on the held clock, the store dropped it every millisecond of real
    /// time and a limit of 1 per minute admitted once per millisecond.
    #[tokio::test]
    async fn state_outlives_its_window_while_the_clock_is_held() {
        let (store, limiter, _) = held_for_an_hour(1);
        limiter.try_acquire("x").await.unwrap();
        for step in 1..=5 {
            store.advance(Duration::from_millis(2));
            assert!(
                limiter.try_acquire("x").await.is_err(),
                "admitted again {} ms later, with the clock still in the window",
                2 * step
            );
        }
    }

    /// In the same hold, a rejection's retry-after is the real time until the held clock leaves
    /// the window: an hour, not the 1 ms left on the held clock. Told 1 ms, `acquire` retried
    /// (a store round trip each time) every millisecond for the hour.
    #[tokio::test]
    async fn a_retry_after_covers_the_time_the_clock_is_held() {
        let (_store, limiter, _) = held_for_an_hour(1);
        limiter.try_acquire("x").await.unwrap();
        match limiter.try_acquire("x").await {
            Err(TryAcquireError::Rejected(r)) => assert!(
                r.retry_after() > Duration::from_secs(3_599),
                "retry after {:?}, while the clock is held for an hour",
                r.retry_after()
            ),
            other => panic!("{other:?}"),
        }
    }

    /// In the same hold, an admission's reset-after (the time until the subject is back to its
    /// full limit) is an hour of real time too, for the admission and for a charge: it said
    /// 1 ms, and a client that waited that long found the window still running for the hour.
    #[tokio::test]
    async fn a_reset_after_covers_the_time_the_clock_is_held() {
        let (store, limiter, held) = held_for_an_hour(3);
        let admission = limiter.try_acquire("x").await.unwrap();
        let charged = limiter.charge("x", 1).await.unwrap();
        for (what, reset_after) in [
            ("admission", admission.reset_after()),
            ("charge", charged.reset_after()),
        ] {
            assert!(
                reset_after > Duration::from_secs(3_599),
                "{what}: reset after {reset_after:?}, while the clock is held for an hour"
            );
        }
        // A state at its full limit (a bucket's reset-after of 0) is so now, held or not.
        let bucket = StoreLimiter::new(
            Algorithm::TokenBucket {
                rate: crate::Rate::per_second(1),
                burst: 1,
            },
            "t",
            std::sync::Arc::clone(&store),
        )
        .unwrap();
        bucket.inner.clock.last.store(held, Ordering::Relaxed);
        let probe = bucket.try_acquire_n("y", 0).await.unwrap();
        assert_eq!(probe.reset_after(), Duration::ZERO);
    }
}

/// Decisions on stored bytes against an in-memory cell, on one manual clock.
#[cfg(all(test, not(turnstile_loom)))]
mod model_tests {
    use super::*;
    use crate::Rate;
    use crate::clock::ManualClock;
    use proptest::prelude::*;

    /// One call, after the clock moved `advance` ns: a take of `n` permits or a charge of `n`.
    #[derive(Debug, Clone)]
    struct Call {
        advance: u64,
        n: u32,
        charge: bool,
    }

    fn calls(limit: u32, window: u64) -> impl Strategy<Value = Vec<Call>> {
        let advance = prop_oneof![3 => Just(0u64), 4 => 0..=window, 2 => 0..=3 * window];
        let call = (advance, 0..=2 * limit + 1, prop::bool::weighted(0.15)).prop_map(
            move |(advance, n, charge)| Call {
                advance,
                // A take of more than the limit is refused before the store is asked.
                n: if charge { n } else { n.min(limit) },
                charge,
            },
        );
        prop::collection::vec(call, 1..80)
    }

    /// What a decision answered, for comparison: the verdict, and what the caller is told.
    fn outcome(result: &Result<Admission, TryAcquireError>) -> Result<(u32, u64), TryAcquireError> {
        result
            .as_ref()
            .map(|a| (a.remaining(), a.reset_after_nanos()))
            .map_err(|e| *e)
    }

    /// Every call decided as [`StoreLimiter::try_acquire_n`] and [`StoreLimiter::charge`] do
    /// (`decode`, `resize`, [`run`] or [`run_charge`], and the write with its TTL) on a store
    /// that drops a value once its TTL has passed on the same clock, and on an in-memory cell
    /// that nothing ever drops: the answers must be the same. A TTL that ends while the state
    /// still restricts shows as an admission the cell refuses.
    fn stored_matches_memory<A: Charge + Unused>(
        algo: A,
        resize: fn(Vec<u64>, &A) -> Option<Vec<u64>>,
        outlived: fn(&[u64]) -> u64,
        calls: &[Call],
    ) {
        let clock = ManualClock::new();
        let cell = algo.cell();
        // The stored bytes and the clock time they expire at.
        let mut stored: Option<(Vec<u8>, u64)> = None;
        for (i, call) in calls.iter().enumerate() {
            clock.advance(Duration::from_nanos(call.advance));
            let now = clock.now();
            if stored.as_ref().is_some_and(|(_, until)| *until <= now) {
                stored = None;
            }
            let words = decode(stored.as_ref().map(|(bytes, _)| &bytes[..]))
                .and_then(|words| resize(words, &algo));
            let (got, write) = if call.charge {
                let (admission, write) = run_charge(&algo, words, call.n, &clock, outlived);
                (Ok(admission), write)
            } else {
                run(&algo, words, call.n, &clock, outlived)
            };
            let want = if call.charge {
                algo.charge(&cell, call.n, &clock)
            } else {
                algo.try_acquire(&cell, call.n, &clock)
            };
            assert_eq!(
                outcome(&got),
                outcome(&want),
                "call {i} ({call:?}) at {now}: the stored state answers otherwise"
            );
            if let Some((bytes, ttl)) = write {
                let ttl = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
                stored = Some((bytes, now.saturating_add(ttl)));
            }
        }
    }

    fn same(words: Vec<u64>, _: &impl Algo) -> Option<Vec<u64>> {
        Some(words)
    }

    fn never(_: &[u64]) -> u64 {
        0
    }

    /// Windows of 1 to 50 ms: above the 1 ms floor of a TTL, so that a TTL cut short shows.
    const MS: u64 = 1_000_000;

    /// Stored words from anywhere: small numbers, times around the clock's, lap parities,
    /// the top bits, and anything.
    fn word(now: u64) -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..8,
            (0..=4 * 50 * MS).prop_map(move |d| now - 2 * 50 * MS + d),
            (0..=4 * 50 * MS, 0u64..2)
                .prop_map(move |(d, parity)| ((now - 2 * 50 * MS + d) << 1) | parity),
            Just(u64::MAX),
            Just(u64::MAX - 1),
            Just(1 << 63),
            Just((1 << 62) - 1),
            any::<u64>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

        /// Bytes the limiter did not write (any length, any words) are decided on or treated
        /// as absent, by every algorithm and for every call (a probe, a take, a charge of any
        /// size): never a panic, never a wait for a writer that does not exist (the test would
        /// hang), and what is written back is state the same limiter reads again.
        #[test]
        fn foreign_bytes_are_decided_or_ignored(
            kind in 0u8..4,
            limit in 1u32..5,
            window in MS..50 * MS,
            words in prop::collection::vec(word(1 << 60), 0..10),
            ragged in 0usize..8,
            n in prop_oneof![0u32..6, Just(u32::MAX)],
            charge in any::<bool>(),
        ) {
            let clock = ManualClock::new();
            clock.set(Duration::from_nanos(1 << 60));
            let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            // Sometimes not a whole number of words.
            bytes.truncate(bytes.len().saturating_sub(ragged % 8 * usize::from(ragged > 3)));
            let window = Duration::from_nanos(window);
            let n = if charge { n } else { n.min(limit) };
            match kind {
                0 => foreign(&FixedWindow::new(limit, window).unwrap(), same, never, bytes, n, charge, &clock),
                1 => foreign(&SlidingCounter::new(limit, window).unwrap(), same, never, bytes, n, charge, &clock),
                2 => {
                    let algo = TokenBucket::new(Rate::new(limit, window), limit).unwrap();
                    foreign(&algo, same, never, bytes, n, charge, &clock)
                }
                _ => {
                    let algo = SlidingWindow::new(limit, window).unwrap();
                    let resize = |words, algo: &SlidingWindow| resize_ring(words, algo.limit() as usize);
                    foreign(&algo, resize, latest_expiry, bytes, n, charge, &clock)
                }
            }
        }
    }

    /// [`foreign_bytes_are_decided_or_ignored`] for one algorithm: a call on `bytes`, then one on
    /// what it wrote, which must be this algorithm's state.
    fn foreign<A: Charge + Unused>(
        algo: &A,
        resize: fn(Vec<u64>, &A) -> Option<Vec<u64>>,
        outlived: fn(&[u64]) -> u64,
        bytes: Vec<u8>,
        n: u32,
        charge: bool,
        clock: &ManualClock,
    ) {
        let mut stored = Some(bytes);
        for call in 0..2 {
            let words = decode(stored.as_deref()).and_then(|words| resize(words, algo));
            let write = if charge {
                run_charge(algo, words, n, clock, outlived).1
            } else {
                run(algo, words, n, clock, outlived).1
            };
            let Some((bytes, _)) = write else {
                return;
            };
            let words = decode(Some(&bytes)).expect("whole words");
            assert!(
                algo.restore(&words).is_some(),
                "call {call} wrote {words:?}, no state"
            );
            stored = Some(bytes);
        }
    }

    /// One call of a process with its own parameters over the same key: a limit, a window
    /// (ns), a take of `n` or a charge of `n`, after the clock moved `advance` ns.
    #[derive(Debug, Clone)]
    struct Visit {
        advance: u64,
        limit: u32,
        window: u64,
        n: u32,
        charge: bool,
    }

    fn visits() -> impl Strategy<Value = Vec<Visit>> {
        let visit = (
            prop_oneof![3 => Just(0u64), 4 => 0..=20 * MS, 1 => 0..=80 * MS],
            1u32..=5,
            prop_oneof![Just(10 * MS), Just(40 * MS)],
            1u32..=6,
            prop::bool::weighted(0.2),
        )
            .prop_map(|(advance, limit, window, n, charge)| Visit {
                advance,
                limit,
                window,
                n: if charge { n } else { n.min(limit) },
                charge,
            });
        prop::collection::vec(visit, 1..60)
    }

    /// Sliding windows of several limits and windows over one key (processes, or deploys, with
    /// other parameters), decided on the stored ring as `StoreLimiter` decides, against the
    /// sorted-set log of the Redis backend (`sliding_window.lua`): each admission keeps the
    /// expiry of its own window, a take of `n` is admitted iff the live entries and `n` fit the
    /// caller's limit, and a charge of `n` adds `min(n, limit)` entries and keeps the `limit`
    /// latest expiries. The ring may be stricter (it is positional), never looser: no admission
    /// the log refuses.
    #[test]
    fn a_stored_ring_under_other_parameters_never_admits_what_the_log_refuses() {
        proptest!(ProptestConfig { cases: 2000, ..ProptestConfig::default() }, |(visits in visits())| {
            let clock = ManualClock::new();
            let mut stored: Option<(Vec<u8>, u64)> = None;
            let mut log: Vec<u64> = Vec::new();
            for (i, v) in visits.iter().enumerate() {
                clock.advance(Duration::from_nanos(v.advance));
                let now = clock.now();
                if stored.as_ref().is_some_and(|(_, until)| *until <= now) {
                    stored = None;
                }
                log.retain(|&expiry| expiry > now);
                let algo = SlidingWindow::new(v.limit, Duration::from_nanos(v.window)).unwrap();
                let words = decode(stored.as_ref().map(|(bytes, _)| &bytes[..]))
                    .and_then(|words| resize_ring(words, v.limit as usize));
                let limit = v.limit as usize;
                let write = if v.charge {
                    let (_, write) = run_charge(&algo, words, v.n, &clock, latest_expiry);
                    log.extend(std::iter::repeat_n(now + v.window, (v.n as usize).min(limit)));
                    log.sort_unstable();
                    log.drain(..log.len().saturating_sub(limit));
                    write
                } else {
                    let (got, write) = run(&algo, words, v.n, &clock, latest_expiry);
                    let fits = log.len() + v.n as usize <= limit;
                    prop_assert!(
                        fits || got.is_err(),
                        "visit {} ({:?}) at {}: admitted with {:?} live in the log",
                        i, v, now, log
                    );
                    if got.is_ok() {
                        log.extend(std::iter::repeat_n(now + v.window, v.n as usize));
                    }
                    write
                };
                if let Some((bytes, ttl)) = write {
                    let ttl = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
                    stored = Some((bytes, now.saturating_add(ttl)));
                }
            }
        });
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn a_stored_fixed_window_decides_as_in_memory((limit, window, calls) in (1u32..6, MS..50 * MS)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), calls(l, w)))) {
            let algo = FixedWindow::new(limit, Duration::from_nanos(window)).unwrap();
            stored_matches_memory(algo, same, never, &calls);
        }

        #[test]
        fn a_stored_sliding_counter_decides_as_in_memory((limit, window, calls) in (1u32..6, MS..50 * MS)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), calls(l, w)))) {
            let algo = SlidingCounter::new(limit, Duration::from_nanos(window)).unwrap();
            stored_matches_memory(algo, same, never, &calls);
        }

        #[test]
        fn a_stored_token_bucket_decides_as_in_memory((burst, permits, period, calls) in (1u32..6, 1u32..4, MS..50 * MS)
            .prop_flat_map(|(b, p, t)| (Just(b), Just(p), Just(t), calls(b, t)))) {
            let algo = TokenBucket::new(Rate::new(permits, Duration::from_nanos(period)), burst).unwrap();
            stored_matches_memory(algo, same, never, &calls);
        }

        #[test]
        fn a_stored_sliding_window_decides_as_in_memory((limit, window, calls) in (1u32..6, MS..50 * MS)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), calls(l, w)))) {
            let algo = SlidingWindow::new(limit, Duration::from_nanos(window)).unwrap();
            let resize = |words, algo: &SlidingWindow| resize_ring(words, algo.limit() as usize);
            stored_matches_memory(algo, resize, latest_expiry, &calls);
        }
    }
}
