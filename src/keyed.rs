//! [`KeyedLimiter`]: one rate limiter per key (IP address, user, API token, session), for millions
//! of keys, with idle keys evicted and a hard cap on how many are kept.

use crate::algorithm::{Algo, FixedWindow, SlidingCounter, SlidingWindow, TokenBucket, too_big};
use crate::chain::Committed;
use crate::clock::{Clock, DefaultClock};
use crate::decision::{Admission, Rejection};
use crate::error::{AcquireError, ConfigError, TryAcquireError};
use crate::limiter::{Algorithm, build_sliding};
use crate::queue::{
    Blocked, Capacity, DEFAULT_QUEUE_LIMIT, QueueOrder, Queued, WAITERS, Wait, WaitQueue, Woken,
};
use crate::sync::{
    ADMITTED, Arc, AtomicU64, CANCELLED, Counters, KeyMap, Mutex, OVERFLOWED, Ordering, REJECTED,
    Reclaimer, fence, lock, wake_all,
};
use crate::watchers::{Watcher, Watchers};
use crossbeam_utils::CachePadded;
use std::fmt;
#[cfg(feature = "tokio")]
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::task::Poll;

/// The key cap keyed limiters get unless told otherwise: 1,048,576 keys.
///
/// A fixed window or token bucket costs about 37 bytes per `u64` key as requested from the
/// allocator, about 53 as glibc holds them (BENCHMARKS.md), so the default bounds such a limiter
/// at about 56 MB however many distinct keys arrive.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, KeyedLimiter, DEFAULT_MAX_KEYS};
///
/// let limiter: KeyedLimiter<u64> =
///     KeyedLimiter::new(Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) })?;
/// assert_eq!(limiter.max_keys(), DEFAULT_MAX_KEYS);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
pub const DEFAULT_MAX_KEYS: usize = 1 << 20;

/// What a [`KeyedLimiter`] does with a call for a *new* key when it already holds
/// [`max_keys`](KeyedLimiterBuilder::max_keys) keys and sweeping found none idle.
///
/// Calls for keys already present are never affected.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, KeyOverflow, KeyedLimiter, ManualClock, TryAcquireError};
///
/// let limiter = KeyedLimiter::builder(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })
///     .clock(ManualClock::new())
///     .max_keys(1)
///     .overflow(KeyOverflow::Reject)
///     .build()?;
/// limiter.try_acquire(&"alice")?;
/// assert_eq!(limiter.try_acquire(&"bob"), Err(TryAcquireError::TooManyKeys { max_keys: 1 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum KeyOverflow {
    /// Fail the call with [`TryAcquireError::TooManyKeys`] (the default): memory stays bounded
    /// and no key is ever limited by another key's traffic.
    #[default]
    Reject,
    /// Serve the call from one limiter that all overflow keys share (same algorithm and
    /// parameters): under a flood of distinct keys, the flood shares one key's budget.
    ///
    /// The shared limiter is not per key: a key served from it that gets a limiter of its own
    /// once room frees starts that one fresh. For a [`KeyedConcurrencyLimiter`] this means a
    /// key can then hold up to its limit on its own permits besides those it still holds from
    /// the shared pool, until those come back.
    ///
    /// Waiters of overflow keys queue in their own keys' queues. Under
    /// [`QueueOrder::OldestFirst`] a call is not served from the shared limiter while the head
    /// of such a queue waits for it (no barging: `try_acquire` fails, `acquire` queues; the
    /// heads waiting on it are not ordered among themselves). A [`KeyedLimiter`]'s refusal then
    /// says when the shared limiter could admit those heads' permits and the call's together;
    /// a [`KeyedConcurrencyLimiter`]'s `available` reports the pool's free permits for a key
    /// the pool would serve.
    ///
    /// [`KeyedLimiter`]: crate::KeyedLimiter
    ///
    /// [`KeyedConcurrencyLimiter`]: crate::KeyedConcurrencyLimiter
    /// [`QueueOrder::OldestFirst`]: crate::QueueOrder::OldestFirst
    Shared,
}

/// Counts kept by a [`KeyedLimiter`], over all keys.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, KeyedLimiter, ManualClock};
///
/// let limiter = KeyedLimiter::with_clock(
///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) },
///     ManualClock::new(),
/// )?;
/// let _ = limiter.try_acquire(&1u64);
/// let _ = limiter.try_acquire(&1u64);
/// let _ = limiter.try_acquire(&2u64);
/// let stats = limiter.stats();
/// assert_eq!((stats.admitted, stats.rejected, stats.keys), (2, 1, 2));
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KeyedStats {
    /// Calls that got their permits (probes included).
    pub admitted: u64,
    /// Calls that failed, including those rejected by [`KeyOverflow::Reject`]. A waiter the
    /// limiter fails (on eviction from a full newest-first queue, or as too large after the
    /// limit shrank) counts here even if it is dropped before it sees the failure.
    pub rejected: u64,
    /// Waits given up: `acquire` futures dropped while queued, and timeouts. Also the rare
    /// waiter whose poll panicked in a `Waker` it woke, after it had been served: what it took is
    /// given back, and a panicked future cannot be polled again.
    pub cancelled: u64,
    /// Calls for a new key that found the cap reached and no idle key to evict (served by the
    /// shared overflow limiter or rejected, per [`KeyOverflow`]): a waiting call counts once,
    /// however many of its attempts meet the cap. A
    /// [`charge`](KeyedLimiter::charge) is not a call counted here, whatever the policy did
    /// with it, as it is not counted anywhere in these statistics.
    pub overflowed: u64,
    /// Idle keys evicted so far.
    pub evicted: u64,
    /// Keys whose state [`KeyedLimiter::reset`] forgot.
    pub reset: u64,
    /// Keys held now.
    pub keys: usize,
    /// Waiters queued now, over all keys.
    pub waiting: usize,
    /// Permits the queued waiters ask for, over all keys (a probe, `n == 0`, counts as one).
    pub queued_permits: u64,
    /// Keys that have a wait queue now.
    pub waiting_keys: usize,
}

/// A rate limiter per key: every key gets its own state of the same [`Algorithm`], created on
/// the key's first admission and evicted once it is idle.
///
/// - **Lock-free hits.** A call for a key already present is one lookup in a lock-free map
///   (papaya) plus the algorithm's compare-and-swap on the key's own state, stored inline in the
///   map entry. It takes no lock, allocates nothing, and when it is rejected it writes no shared
///   memory at all, unless the key has waiters queued oldest first: then the refusal reads what
///   they wait for under the key's queue mutex (held briefly), to count it in its `retry_after`.
/// - **Idle eviction that never loses an admission.** A key whose state admits exactly what a
///   fresh one would is *retired* (a compare-and-swap from the very state judged idle to a
///   sentinel, which fails if any admission landed in between) and then removed. A call that finds
///   its key retired removes the dead entry and retries on a fresh one; it never decides on the
///   dead state. Eviction runs incrementally as new keys are inserted (amortised O(1) per insert,
///   bounded by one shard per call), when the cap is reached, and on [`sweep`](Self::sweep).
/// - **Hard cap.** At most [`max_keys`](Self::max_keys) keys. When full, idle keys go first;
///   if none is idle, the [`KeyOverflow`] policy applies to the new key. One spare slot above
///   the cap serves a call that meets its own key's cell being evicted or reset, whose slot is
///   being given back at that very moment (so the key is not refused for its own eviction): the
///   count never exceeds `max_keys + 1`.
///
/// Keys are hashed with foldhash (randomly seeded per limiter) unless another `BuildHasher` is
/// given; keys are often chosen by clients, so a seeded hasher keeps them from aiming collisions.
///
/// Cloning is cheap and clones share state.
///
/// # Examples
///
/// ```
/// use std::net::IpAddr;
/// use turnstile::{Algorithm, KeyedLimiter, Rate};
///
/// let per_ip = KeyedLimiter::new(Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 20 })?;
/// let client: IpAddr = "203.0.113.7".parse()?;
/// match per_ip.try_acquire(&client) {
///     Ok(admission) => println!("ok, {} left", admission.remaining()),
///     Err(e) => println!("429: {e}"),
/// }
/// assert_eq!(per_ip.len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedLimiter<K, C: Clock = DefaultClock, S = crate::sync::RandomHasher> {
    inner: Arc<Inner<K, C, S>>,
}

struct Inner<K, C, S> {
    store: Store<K, S>,
    /// The parameters now. Its mutex serialises reconfigurations (every key's parameters are
    /// read without it).
    algorithm: Mutex<Algorithm>,
    /// Serialises [`KeyedLimiter::reset`] calls, so that `Ctx::resets` is odd exactly while one
    /// runs.
    resetting: Mutex<()>,
    ctx: Ctx<K, C, S>,
    /// Chain callers sleeping on this limiter, told of a reconfiguration, a reset, a refund, or
    /// a sweep that evicted keys (see `Inner::sweep`).
    watchers: Watchers,
    /// The permits of the queues' heads that wait on the shared overflow cell (under
    /// [`KeyOverflow::Shared`] and [`QueueOrder::OldestFirst`] only; see [`OverflowWait`]):
    /// while non-zero, a call whose key has no queue and that the shared cell would decide is
    /// not decided (no barging past those heads: `try_acquire` is refused, `acquire` queues).
    /// Written only by those heads; read (Relaxed) only on the slow paths, where some key has
    /// waiters.
    overflow_heads: CachePadded<AtomicU64>,
}

/// A waiting call's standing among the heads waiting on the shared overflow cell
/// ([`Inner::overflow_heads`]), as its head's attempts find it:
///
/// | its last attempt | counted in `overflow_heads` | its next attempt |
/// |---|---|---|
/// | none yet, or decided on its key's own cell | no (`counted` 0) | if other heads are counted and the shared cell would decide it: counts itself, takes nothing, sleeps until the shared cell could admit theirs and its permits together; else takes |
/// | refused by the shared cell, or deferred as above | yes (`counted` = its permits) | takes (the counted heads race: they are not ordered among themselves) |
///
/// Leaves (uncounts itself) when an attempt is decided on its key's own cell, and when the
/// call ends, however (served, failed, timed out, its future dropped: the drop). No wake-up is
/// owed to anyone: every counted head sleeps on its timer, until a time the shared cell gave;
/// a newcomer refused meanwhile is told when it could be admitted behind them. A head that
/// gives up leaves the others their timers' times, a later wake than the shared cell's free
/// permits might allow (never an earlier one).
///
/// It also keeps whether the call has been counted in `overflowed` (a call is counted once,
/// however many of its attempts meet the key cap).
struct OverflowWait<'a, K, C, S> {
    inner: &'a Inner<K, C, S>,
    /// The permits counted (0: not counted). Relaxed everywhere: only the owning call reads or
    /// writes it (in its head's attempts and its drop).
    counted: AtomicU64,
    /// 1 once the call is counted in `overflowed` (by its fast path, or an attempt here).
    /// Relaxed: the owning call's only.
    overflowed: AtomicU64,
}

impl<'a, K, C, S> OverflowWait<'a, K, C, S> {
    /// `overflowed`: the call's fast path counted it in `overflowed` already.
    fn new(inner: &'a Inner<K, C, S>, overflowed: bool) -> Self {
        OverflowWait {
            inner,
            counted: AtomicU64::new(0),
            overflowed: AtomicU64::new(u64::from(overflowed)),
        }
    }

    /// An attempt met the key cap: counts the call in `overflowed` unless it is already.
    fn met_cap(&self) {
        if self.overflowed.swap(1, Ordering::Relaxed) == 0 {
            self.inner.ctx.counters.bump(OVERFLOWED);
        }
    }

    fn counted(&self) -> bool {
        self.counted.load(Ordering::Relaxed) != 0
    }

    /// Counts `n` permits (at least 1: a probe waits for one) among the shared cell's heads, if
    /// not counted yet.
    fn join(&self, n: u32) {
        if self.counted() || self.inner.ctx.waits.order != QueueOrder::OldestFirst {
            return;
        }
        let n = u64::from(n.max(1));
        self.counted.store(n, Ordering::Relaxed);
        // Relaxed: a hint for newcomers (see `Inner::overflow_heads`); nothing is published
        // with it.
        self.inner.overflow_heads.fetch_add(n, Ordering::Relaxed);
    }

    fn leave(&self) {
        let n = self.counted.swap(0, Ordering::Relaxed);
        if n != 0 {
            // Relaxed: as in `join`.
            self.inner.overflow_heads.fetch_sub(n, Ordering::Relaxed);
        }
    }
}

impl<K, C, S> Drop for OverflowWait<'_, K, C, S> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The per-key wait queues of a keyed limiter (rate or concurrency): one [`KeyWait`] per key
/// that has waiters, in a map of its own.
pub(crate) struct Waits<K, S> {
    /// The wait queues of the keys that have waiters (see [`KeyWait`]).
    pub(crate) map: KeyMap<K, Arc<KeyWait>, S>,
    /// Entries in `map`, and whether the limiter is closed: read by every `try_acquire` (zero on
    /// the fast path), written only when a key gains its first waiter or its queue is retired,
    /// and by [`close`](Self::close).
    ///
    /// | bits | holds |
    /// |---|---|
    /// | 0..=62 | keys with a queue in `map`, counted just before the insert (a count: `fetch_add`/`fetch_sub` of 1; never below zero, see [`key_wait`](Self::key_wait)) |
    /// | 63 ([`WAITS_CLOSED`]) | the limiter is closed; set once, never cleared |
    ///
    /// The closed bit in this word, not a flag beside it, keeps the fast path at one load: a
    /// closed limiter reads non-zero and takes the slow path, which looks at the bit.
    pub(crate) waiting_keys: CachePadded<AtomicU64>,
    pub(crate) order: QueueOrder,
    pub(crate) queue_limit: u64,
}

/// An admission with what a refund of it needs: how it was committed, and the parameters'
/// version read before it.
pub(crate) type Receipt = (Admission, Committed, u64);

/// [`Waits::waiting_keys`]' closed bit (see its state table).
const WAITS_CLOSED: u64 = 1 << 63;

/// One key's wait queue: created when the key gets its first waiter, retired and dropped from
/// the map when its last waiter leaves.
///
/// Retiring closes the queue only if it is empty (under its mutex), *then* removes it from the
/// map. A waiter that looked the queue up just before finds it closed when it tries to join,
/// removes it from the map itself if it is still there, and looks again: nobody ever waits in a
/// queue that nobody can find.
pub(crate) struct KeyWait {
    /// [`WAITERS`] and `CLOSED` (retired), as for an unkeyed limiter's gate.
    pub(crate) gate: AtomicU64,
    pub(crate) queue: WaitQueue,
}

/// What every store needs from its limiter besides the cells.
pub(crate) struct Ctx<K, C, S> {
    clock: C,
    /// Picks a key's shard (and is cloned into every shard's map).
    hasher: S,
    /// `shards.len() - 1`; the shard count is a power of two.
    shard_mask: usize,
    pub(crate) max_keys: usize,
    pub(crate) overflow: KeyOverflow,
    /// Keys held, over all shards. Written only when a key is inserted or removed.
    pub(crate) keys: CachePadded<AtomicU64>,
    /// Idle keys evicted so far. Written only by evictions.
    pub(crate) evicted: AtomicU64,
    /// Where the next make-room pass starts, so that pressure spreads over the shards.
    cursor: AtomicU64,
    /// A lower bound of every shard's `not_before`: before this time no key anywhere can be idle,
    /// so a new key at the cap skips the search for room in O(1). Lowered with every shard hint;
    /// raised only by a full make-room pass (swap to [`SEARCHING`] at its start, replaced by what
    /// it found at its end unless lowered meanwhile).
    ///
    /// | holds | a new key at the cap |
    /// |---|---|
    /// | a time t (`u64::MAX`: no time known) | searches if now ≥ t, else is refused at once |
    /// | [`SEARCHING`] | searches too: another search is running, and has not found the room |
    ///
    /// Every lowering that follows a shard hint's is a Release RMW made after it, and
    /// a search's opening swap is Acquire: a search whose swap reads a lowering (or a later RMW
    /// of its release sequence: every write here is an RMW) then loads that shard's hint as
    /// lowered or later, never the value before, so it cannot rebuild `room_at` from a hint
    /// older than the lowering it overwrote. (With Relaxed lowerings a weakly ordered CPU could
    /// let it: a sweep's closing `fetch_min(next)` overwritten by the swap, the shard's hint
    /// then read as the `u64::MAX` the sweep opened with, and new keys refused until a reset,
    /// a release or `sweep_all`, though a key there turns idle at `next`. On x86 every RMW is a
    /// full barrier.)
    room_at: AtomicU64,
    /// Two per [`KeyedLimiter::reset`] call, one before it retires the key's cell and one after,
    /// so odd while a reset runs (resets are serialised). A chain's commit reads it first and
    /// its refund gives back only if it still reads the same even value: a refund never lands
    /// in a cell made after a reset (see [`Keyed::chain_refund`]).
    pub(crate) resets: AtomicU64,
    /// Keys whose state a reset forgot.
    pub(crate) forgotten: AtomicU64,
    pub(crate) counters: Counters,
    /// The limiter's per-key wait queues: a key with waiters is not idle, whatever its cell
    /// says (a head woken by a release has yet to take what was freed for it).
    pub(crate) waits: Waits<K, S>,
}

enum Store<K, S> {
    Fixed(Keyed<FixedWindow, K, S>),
    Sliding(Keyed<SlidingWindow, K, S>),
    Counter(Keyed<SlidingCounter, K, S>),
    Bucket(Keyed<TokenBucket, K, S>),
}

/// What the keyed store needs of an algorithm besides [`Algo`]: taking back a cell it inserted
/// for a new key when the call it was inserted for admitted nothing on it.
///
/// `first_use` inserts a fresh cell and then decides the call on it, and sweeps never retire a
/// cell that has never admitted (its inserter is about to use it, see [`Algo::retire`]). If that
/// first decision fails on the fresh cell (a `reconfigure` or `set_limit` lowered the limit below
/// `n` between `first_use`'s check and the decision) and nobody else has used the cell meanwhile,
/// nothing would ever use or evict it: it would hold a key of the cap for good. So the inserter
/// retires it itself, by a CAS from the fresh word that fails if any admission landed first.
///
/// Each algorithm implements it beside its state word; the defaults ("unknown": keep the cell)
/// serve none.
pub(crate) trait Unused: Algo {
    /// Whether `cell` has never admitted anything: a hint, read right after the inserter's
    /// decision (the word may change at once); only a true answer leads to
    /// [`retire_unused`](Self::retire_unused), which decides.
    fn unused(_cell: &Self::Cell) -> bool {
        false
    }

    /// Retires `cell` if it has never admitted anything: a compare-and-swap from the fresh word
    /// to [`RETIRED`](crate::algorithm::RETIRED), so it fails if an admission landed first, and
    /// a caller that then meets the retired cell retries on a fresh one, as after an eviction.
    /// True if this call retired it.
    fn retire_unused(_cell: &Self::Cell) -> bool {
        false
    }

    /// Retires `cell` whatever it holds, for [`KeyedLimiter::reset`]: a compare-and-swap to
    /// [`RETIRED`](crate::algorithm::RETIRED) from the word it loaded, repeated until it lands,
    /// unless the word is never-used (nothing to forget; its inserter is about to use it or take
    /// it back, see above) or retired already (by a sweep, which counted it). True if this call
    /// retired it: the caller then owns the key's books, as a sweep that retires a cell does.
    fn retire_now(_cell: &Self::Cell) -> bool {
        false
    }

    /// A cell that answers a call for zero permits (a probe, `charge(0)`) as a fresh cell
    /// would, for a key that is not held: used for that one call and dropped, never inserted,
    /// never shared. An algorithm whose fresh cell is costly to build (the exact sliding
    /// window's ring) hands out a cheaper one that such a call cannot tell apart.
    fn probe_cell(&self) -> Self::Cell {
        self.cell()
    }

    /// Whether a probe for a key that is not held meets the key cap as a take of one would: at
    /// the cap with no idle key to evict, it gets the overflow policy's answer (refused under
    /// [`KeyOverflow::Reject`], the shared cell's under [`KeyOverflow::Shared`]) rather than a
    /// fresh cell's. The keyed concurrency limiter's: its probe says whether a permit is free
    /// for the key, and at the cap none is on a cell the key cannot get. The rate limiters
    /// answer for a fresh state (their probes and `charge(0)` have documented that).
    const PROBE_MEETS_CAP: bool = false;
}

/// One algorithm's parameters, its per-key cells, and the shared overflow cell.
pub(crate) struct Keyed<A: Algo, K, S> {
    pub(crate) algo: A,
    pub(crate) shards: Box<[Shard<K, A::Cell, S>]>,
    pub(crate) overflow: CachePadded<A::Cell>,
}

/// Where a call was decided: on its key's own cell, or on the shared overflow cell
/// ([`KeyOverflow::Shared`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Key,
    Overflow,
}

/// A part of the key space with its own map, so that eviction can work on a bounded slice.
pub(crate) struct Shard<K, V, S> {
    pub(crate) map: KeyMap<K, V, S>,
    /// Keys in this shard.
    len: AtomicU64,
    /// Keys inserted since this shard was last swept: a sweep is due when they reach the number
    /// of keys that sweep left.
    inserted: AtomicU64,
    /// 1 while a thread sweeps this shard: one sweeper per shard at a time.
    sweeping: AtomicU64,
    /// Clock time before which a sweep can evict nothing (the earliest time a key it saw busy
    /// turns idle); lowered to "now" by every insert.
    pub(crate) not_before: AtomicU64,
}

/// `Ctx::room_at` while a search for room runs: not a time (clocks never get near it), and
/// not a reason to refuse. It used to be `u64::MAX`, "nothing idle, ever", so a second new key
/// at the cap arriving during a search was refused at once, though idle keys were there to
/// evict for it too.
const SEARCHING: u64 = u64::MAX - 1;

/// A refusal of a key without a cell of its own by the shared overflow cell, no later than
/// `room_at`, when a key may first turn idle: a call then evicts it and is admitted on a fresh
/// cell of its own (or finds the room another new key took, and is answered as now). The
/// shared cell's wait alone told such a caller, and a waiter's timer, to wait past that for
/// permits it would not need (`at_the_cap_a_shared_cell_refusal_is_no_later_than_a_key_turning_idle`).
/// Left as it is when `room_at` is no time (a search runs, or no key can turn idle) or is
/// already past (a search will run, and may or may not find room).
fn sooner_by_room<K, C: Clock, S, R>(
    ctx: &Ctx<K, C, S>,
    outcome: Result<R, TryAcquireError>,
) -> Result<R, TryAcquireError> {
    match outcome {
        Err(TryAcquireError::Rejected(r)) => {
            // Relaxed: a hint, as in `make_room`; a stale value answers as a moment earlier.
            let room_at = ctx.room_at.load(Ordering::Relaxed);
            let now = ctx.clock.now();
            let sooner = match room_at {
                SEARCHING | u64::MAX => None,
                t if t > now && t - now < r.retry_after_nanos() => Some(t - now),
                _ => None,
            };
            Err(TryAcquireError::Rejected(match sooner {
                Some(wait) => Rejection::new(wait, r.limit()),
                None => r,
            }))
        }
        other => other,
    }
}

/// A shard whose key count reaches a multiple of this flushes its thread's reclamation batch
/// (one `membarrier` system call per this many inserts into the shard), so that tables replaced
/// by resizes while it grows are freed promptly: right after inserting 1M keys, about 9 bytes
/// per key of them still awaited reclamation without it, at most about 2 with it (BENCHMARKS.md).
const FLUSH_EVERY: u64 = 256;
/// A sweep of a shard is due once the inserts since its last one reach half its keys, or half
/// this many in a shard of fewer: a small shard is swept every `MIN_SWEEP / 2` inserts rather
/// than at every other one. (Not "never below this many keys": it is swept all the same.)
const MIN_SWEEP: u64 = 64;
/// A shard holds about this many keys at most, on average, when the cap is reached (more shards
/// for larger caps, up to 4,096 shards: beyond a cap of 4,096 × this, shards grow), so that one
/// sweep, the most eviction work a call can do per shard, stays short.
pub(crate) const SHARD_KEYS: usize = 4096;

impl<K, V, S: BuildHasher + Clone> Shard<K, V, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Send + Sync + 'static,
{
    fn new(hasher: S, reclaimer: &Reclaimer) -> Self {
        Shard {
            map: KeyMap::with_hasher(hasher, reclaimer),
            len: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
            sweeping: AtomicU64::new(0),
            not_before: AtomicU64::new(0),
        }
    }
}

/// The shard count for a cap of `max_keys`: enough that one shard holds at most [`SHARD_KEYS`]
/// at the cap, at least 16 and 4 × cores, a power of two (two under loom).
pub(crate) fn shard_count(max_keys: usize) -> usize {
    // Under loom, two: a sweep or a search for room walks every shard, and each shard's flag
    // and hint are atomics loom interleaves with everything else, so sixteen shards put the
    // models that race a sweep with a search beyond reach. Two keep the walk over other shards.
    if cfg!(turnstile_loom) {
        return 2;
    }
    let parallel = std::thread::available_parallelism().map_or(4, usize::from);
    max_keys
        .div_ceil(SHARD_KEYS)
        .max(4 * parallel)
        .clamp(16, 4096)
        .next_power_of_two()
}

impl<K, C: Clock, S> Ctx<K, C, S> {
    pub(crate) fn new(
        clock: C,
        hasher: S,
        shards: usize,
        max_keys: usize,
        overflow: KeyOverflow,
        waits: Waits<K, S>,
    ) -> Self {
        Ctx {
            waits,
            clock,
            hasher,
            shard_mask: shards - 1,
            max_keys,
            overflow,
            keys: CachePadded::new(AtomicU64::new(0)),
            evicted: AtomicU64::new(0),
            cursor: AtomicU64::new(0),
            room_at: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            forgotten: AtomicU64::new(0),
            counters: Counters::new(),
        }
    }

    /// The shard of `key`.
    #[inline(always)]
    pub(crate) fn shard<Q: Hash>(&self, key: &Q) -> usize
    where
        S: BuildHasher,
    {
        // The high half of the hash picks the shard; the map uses the low bits for its buckets.
        (self.hasher.hash_one(key) >> 32) as usize & self.shard_mask
    }

    /// Reserves room for one more key; false at the cap.
    fn reserve_key(&self) -> bool {
        self.reserve_key_within(self.max_keys as u64)
    }

    /// Reserves the one slot kept above the cap, for a call that met its own key's cell
    /// retired (see `Keyed::with_cell_after`); false if it is taken too.
    fn reserve_spare_key(&self) -> bool {
        self.reserve_key_within(self.max_keys as u64 + 1)
    }

    fn reserve_key_within(&self, bound: u64) -> bool {
        // Relaxed: the count guards a bound, not other data; the CAS makes it exact.
        self.keys
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |k| {
                (k < bound).then_some(k + 1)
            })
            .is_ok()
    }

    /// A key's cell of `shard` has just turned idle at a moment no clock predicts (a keyed
    /// concurrency limiter's last permit came back): lowers the shard's and the limiter's
    /// sweep hints so that sweeps and the search for room at the cap look at it again. A load
    /// first, so that the common case (hints already 0) writes nothing shared.
    ///
    /// The caller's write that left the cell idle is a read-modify-write (AcqRel), and a sweep
    /// that found the cell busy confirmed it with one (`keyed_concurrency`'s
    /// `busy_until_a_release`): so either that sweep saw the cell idle, or our loads see its
    /// swaps of the hints and lower them. A refund, whose write is no such RMW on a word a
    /// sweep confirms, lowers with read-modify-writes instead
    /// ([`refunded_idle`](Self::refunded_idle)).
    pub(crate) fn idle_hint<Q, V>(&self, shard: &Shard<Q, V, S>) {
        // Relaxed: ordered by the caller's RMW (see above). Release on the RMW: as an
        // insert's (see `first_use`), pairs with the Acquire swap that starts a sweep, so a
        // sweep that reads our 0 sees the idle cell.
        if shard.not_before.load(Ordering::Relaxed) != 0 {
            shard.not_before.fetch_min(0, Ordering::Release);
            // SeqCst fence: our lowering of the shard's hint, then our load of `room_at`,
            // against a search's swap of `room_at`, then its load of the shard's hint (to skip
            // the shard, `sweep_shard`; the fence after the swap in `make_room`), is
            // store-then-load on both sides: either the search reads our lowering (and looks
            // at the shard), or we read its swap (and lower `room_at` below its result).
            fence(Ordering::SeqCst);
        }
        // Relaxed load: a hint; see `room_at` and the fences above. Release on the RMW: after
        // the shard's lowering above, for the search that overwrites it (see `room_at`).
        if self.room_at.load(Ordering::Relaxed) != 0 {
            self.room_at.fetch_min(0, Ordering::Release);
        }
    }

    /// A refund left a key's cell of `shard` idle, sooner than the hints say (its only
    /// admission of the window given back): lowers the shard's and the limiter's sweep hints to
    /// 0, so that a new key at the cap gets the slot at once rather than when the last search
    /// for room computed, and sweeps look at the shard again.
    ///
    /// Read-modify-writes, not `idle_hint`'s load first: the refund's write to the cell, then a
    /// load of a hint, against a search's swap of that hint, then its look at the cell, is
    /// store-then-load on both sides, and both could miss the other (the search's look finds
    /// the key busy, the load reads the hint from before the swap and skips the lowering: the
    /// search's "busy until" stood, and new keys were refused until then, as the loom model
    /// `a_refund_racing_a_search_for_room_at_the_cap_leaves_room` found). An RMW is ordered
    /// with the search's RMWs on the same word: before its swap, and the swap reads our value
    /// or a later one of its release sequence (Acquire: it then sees the refunded cell);
    /// after, and the search's final `fetch_update` of `room_at` reads our 0 or comes before
    /// our lowering of it.
    pub(crate) fn refunded_idle<Q, V>(&self, shard: &Shard<Q, V, S>) {
        // Release: as an insert's lowering (see `first_use`): a sweep whose opening swap reads
        // our 0 (or a later RMW's value) sees the refunded cell.
        shard.not_before.fetch_min(0, Ordering::Release);
        // Release: after the shard's lowering, for the search whose opening swap reads it (see
        // `room_at`).
        self.room_at.fetch_min(0, Ordering::Release);
    }

    fn release_keys(&self, n: u64) {
        if n > 0 {
            // Relaxed: as in `reserve_key`.
            self.keys.fetch_sub(n, Ordering::Relaxed);
        }
    }
}

/// A key slot reserved under the cap by a call that has yet to insert its key: dropped (only by
/// an unwind out of the key's `Clone`, `Hash` or `Eq`, see `Keyed::first_use`), it gives the
/// slot back, and the count in its shard's `len` once that is taken.
struct SlotOnUnwind<'a, K, C: Clock, S> {
    ctx: &'a Ctx<K, C, S>,
    len: Option<&'a AtomicU64>,
}

impl<K, C: Clock, S> Drop for SlotOnUnwind<'_, K, C, S> {
    fn drop(&mut self) {
        if let Some(len) = self.len {
            // Relaxed: bookkeeping, as where it was counted (`first_use`).
            len.fetch_sub(1, Ordering::Relaxed);
        }
        self.ctx.release_keys(1);
    }
}

/// A key's queue counted in [`Waits::waiting_keys`] by a call that has yet to insert it:
/// dropped (only by an unwind out of the key's `Clone`, `Hash` or `Eq`, see
/// [`Waits::key_wait`]), it takes the count back.
struct UncountOnUnwind<'a>(&'a AtomicU64);

impl Drop for UncountOnUnwind<'_> {
    fn drop(&mut self) {
        // Relaxed: our own increment, sequenced before; nothing was inserted, so nobody found
        // the queue to retire it and uncount it.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Ends a [`KeyedLimiter::reset`] when dropped: takes `Ctx::resets` back to even, however the
/// reset ends (see there).
struct ResetEnds<'a>(&'a AtomicU64);

impl Drop for ResetEnds<'_> {
    fn drop(&mut self) {
        // Release: back to even, after the retirement; pairs with a chain commit's Acquire
        // load, so that a commit that reads this value decides on a cell made after it.
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// Counts `n` keys evicted: by the sweep that retired their cells, which is exactly one per
/// cell (retirement is a compare-and-swap, and final), whoever then removes the dead entry.
/// Their slots under the cap were given back one by one as they were retired (see
/// `Keyed::sweep_shard`); these are the counts nothing decides on.
fn removed<K, V, C: Clock, S>(ctx: &Ctx<K, C, S>, shard: &Shard<K, V, S>, n: u64) {
    if n > 0 {
        // Relaxed: counts only.
        shard.len.fetch_sub(n, Ordering::Relaxed);
        ctx.evicted.fetch_add(n, Ordering::Relaxed);
        EVICTED_HERE.with(|here| here.set(here.get().wrapping_add(n)));
    }
}

/// A sweep of one shard under way (`Keyed::sweep_shard`), which holds the shard's `sweeping`
/// flag: dropped, it clears the flag, however the sweep ends. A sweep can unwind mid-walk, out
/// of a key's `Hash` or `Eq` where it asks whether an idle key has waiters; the flag then
/// stayed set, and every later sweep and search for room skipped the shard for good (its idle
/// keys kept their slots, and at the cap new keys were refused though they were there to
/// evict). Such an unwind also lowers the shard's hint and `room_at` to 0 (the walk had raised
/// the hint to "never", and the keys it did not reach may be idle) and counts the keys it
/// evicted.
struct Sweeping<'a, K, V, C: Clock, S> {
    ctx: &'a Ctx<K, C, S>,
    shard: &'a Shard<K, V, S>,
    /// Keys this sweep has evicted so far.
    evicted: std::cell::Cell<u64>,
    /// Set once the sweep has kept its books (hints and counts) itself.
    finished: bool,
}

impl<K, V, C: Clock, S> Drop for Sweeping<'_, K, V, C, S> {
    fn drop(&mut self) {
        if !self.finished {
            // Release, both: as `Keyed::forget_hints`'s lowering (a sweep or search whose
            // opening swap reads our 0 sees what was done before it).
            self.shard.not_before.fetch_min(0, Ordering::Release);
            self.ctx.room_at.fetch_min(0, Ordering::Release);
            removed(self.ctx, self.shard, self.evicted.get());
        }
        // Release: pairs with the Acquire that starts the next sweep of this shard, so our
        // bookkeeping is visible to it.
        self.shard.sweeping.store(0, Ordering::Release);
    }
}

/// What a refund left of a key's cell (`Keyed::chain_refund`).
enum Refunded {
    /// Exactly fresh, as if never used: retired as its inserter would, inside the lookup
    /// (`Keyed::retire_unused`), and now owed `Keyed::taken_back`.
    Fresh,
    /// Idle: the sweep hints are lowered (`Ctx::refunded_idle`).
    Idle,
    /// Still busy, or nothing refunded (a reset came between).
    Busy,
}

std::thread_local! {
    /// Keys evicted by the sweeps this thread ran, in any limiter (see [`evicted_here`]).
    static EVICTED_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Keys evicted so far by the sweeps run on this thread (wrapping): a call that reads it before
/// and after its decision learns whether the sweeps it ran on its way (a search for room at the
/// cap, the sweep an insert pays for) evicted any, without a load of shared memory. A keyed
/// concurrency limiter's waiters for its shared pool need to hear of that room (see
/// `KeyedConcurrencyLimiter`'s `room_freed`). Under loom, model threads may share one OS
/// thread, and so this count: a call then also sees others' evictions, which costs it a look
/// for nothing, never a miss of its own.
#[inline(always)]
pub(crate) fn evicted_here() -> u64 {
    EVICTED_HERE.with(std::cell::Cell::get)
}

/// Whether `Keyed::chain_check` counts a call that meets the key cap in `overflowed`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum CountOverflow {
    /// When the check refuses it: the call ends there. An admission is left to the commit that
    /// may follow. (A chain's checks count nothing, `Never`: the chain counts its call once,
    /// see `KeyedLimiter::chain_decide_uncounted`.)
    IfRefused,
    /// Whatever the check answers: the call is refused anyway (held back by the key's
    /// waiters, see `KeyedLimiter::refused_for_waiters`, and the keyed concurrency limiter's
    /// `try_decide`).
    Always,
    /// Never: a further check for a call already counted.
    Never,
}

impl<A: Unused, K, S> Keyed<A, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone,
{
    pub(crate) fn new(algo: A, shards: usize, hasher: &S) -> Self {
        let overflow = CachePadded::new(algo.cell());
        let reclaimer = Reclaimer::new();
        Keyed {
            shards: (0..shards)
                .map(|_| Shard::new(hasher.clone(), &reclaimer))
                .collect(),
            overflow,
            algo,
        }
    }

    /// Calls `f` on every key held and not retired (a weakly consistent pass, as
    /// `for_each_cell`).
    fn for_each_key(&self, f: &mut dyn FnMut(&K)) {
        for shard in self.shards.iter() {
            shard.map.for_each(|key, cell| {
                if !A::retired(cell) {
                    f(key);
                }
            });
        }
    }

    /// Calls `f` on every key's cell and on the shared overflow cell (a weakly consistent
    /// pass: keys inserted meanwhile may be missed, and are fresh or decided under the new
    /// parameters).
    fn for_each_cell(&self, f: &dyn Fn(&A::Cell)) {
        for shard in self.shards.iter() {
            shard.map.for_each(|_, cell| f(cell));
        }
        f(&self.overflow);
    }

    #[inline(always)]
    fn try_acquire<C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: usize,
        key: &K,
        n: u32,
    ) -> Result<Admission, TryAcquireError> {
        // The hit on a live cell first, with the decision as the only closure (LLVM then inlines
        // it into the lookup); a missing or retired key takes the general path.
        match self.shards[shard]
            .map
            .get(key, |cell| self.algo.try_acquire(cell, n, &ctx.clock))
        {
            Some(Err(TryAcquireError::Closed)) => self.try_acquire_slow(ctx, shard, key, n, true),
            None => self.try_acquire_slow(ctx, shard, key, n, false),
            Some(outcome) => outcome,
        }
    }

    #[cold]
    #[inline(never)]
    fn try_acquire_slow<C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: usize,
        key: &K,
        n: u32,
        met_retired: bool,
    ) -> Result<Admission, TryAcquireError> {
        self.with_cell_after(ctx, shard, key, n, met_retired, |cell| {
            self.algo.try_acquire(cell, n, &ctx.clock)
        })
        .map(|(admission, _)| admission)
    }

    /// Runs `op` (a call for `n` permits) on `key`'s cell: the one in the map, or a fresh one
    /// inserted for a new key (cap and overflow policy applied, see `first_use`). `op` answers
    /// `Err(Closed)` on a retired cell; the dead entry is then removed and `op` runs again on a
    /// fresh one. Every keyed decision goes through here, whatever the algorithm.
    #[inline(always)]
    pub(crate) fn with_cell<C: Clock, R>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: usize,
        key: &K,
        n: u32,
        op: impl Fn(&A::Cell) -> Result<R, TryAcquireError>,
    ) -> Result<(R, Slot), TryAcquireError> {
        self.with_cell_after(ctx, shard, key, n, false, op)
    }

    /// [`with_cell`](Self::with_cell) for a call that may have met the key's cell retired
    /// already (`met_retired`).
    ///
    /// **The spare slot.** A call that meets its key's cell retired needs a fresh cell, and so
    /// a slot under the cap. The retirer (a sweep, a reset, a take-back) gives the dead cell's
    /// slot back right after its retiring CAS, but a call that runs between the two finds the
    /// count still at the cap and, with every other key busy, was refused (`TooManyKeys`) on
    /// the very key whose slot was being freed (the loom models
    /// `a_call_racing_the_eviction_of_its_key_at_the_cap_gets_the_slot` and `…_a_reset_…`).
    /// The slot cannot be handed from the cell to the caller exactly: it lives in the key count
    /// and the retirement in the cell's word, and whatever the retirer does last (a second CAS
    /// on the word, or the count's decrement) leaves such a gap of its own. So such a call may
    /// take one spare slot above the cap, when the normal reservation fails and before any
    /// search for room: the retirer's release then brings the count back to the cap. The count
    /// never exceeds `max_keys + 1` (the spare is one slot, reserved by the same CAS with a
    /// bound one higher), and it stays above the cap only when the dead cell's slot had been
    /// given back and taken by another new key already: then until the next eviction.
    pub(crate) fn with_cell_after<C: Clock, R>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: usize,
        key: &K,
        n: u32,
        met_retired: bool,
        op: impl Fn(&A::Cell) -> Result<R, TryAcquireError>,
    ) -> Result<(R, Slot), TryAcquireError> {
        self.with_cell_counting::<true, C, R>(ctx, shard, key, n, met_retired, op)
    }

    /// [`with_cell_after`](Self::with_cell_after); `COUNTED`: the call is one that `stats()`
    /// counts, so a new key that meets the cap counts as overflowed. A charge is not (its
    /// docs): it passes false.
    pub(crate) fn with_cell_counting<const COUNTED: bool, C: Clock, R>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: usize,
        key: &K,
        n: u32,
        mut met_retired: bool,
        op: impl Fn(&A::Cell) -> Result<R, TryAcquireError>,
    ) -> Result<(R, Slot), TryAcquireError> {
        let shard = &self.shards[shard];
        loop {
            let outcome = match shard.map.get(key, &op) {
                Some(outcome) => outcome.map(|r| (r, Slot::Key)),
                None => self.first_use::<COUNTED, C, R>(ctx, shard, key, n, met_retired, &op),
            };
            match outcome {
                // The key's cell was retired by eviction: drop the dead entry and retry, which
                // finds (or makes) a fresh one.
                Err(TryAcquireError::Closed) => {
                    met_retired = true;
                    self.remove_retired(ctx, shard, key)
                }
                outcome => return outcome,
            }
        }
    }

    /// Whether a take of one for a key not in the map would get a cell of its own now (see
    /// [`Unused::PROBE_MEETS_CAP`]): a key slot is free, its own slot is on its way back
    /// (`met_retired`), or a search evicts an idle key for one. A slot the search reserves is
    /// given back at once: the probe creates no key. Evicting idle keys is what the take would
    /// do, and harmless: an idle key holds nothing.
    #[cold]
    fn room_for_probe<C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: &Shard<K, A::Cell, S>,
        met_retired: bool,
    ) -> bool {
        // Relaxed: as in `reserve_key`; a snapshot, as any probe's answer is.
        if met_retired || ctx.keys.load(Ordering::Relaxed) < ctx.max_keys as u64 {
            return true;
        }
        if self.make_room(ctx, shard) {
            ctx.release_keys(1);
            return true;
        }
        false
    }

    /// A call for a key that is not in the map; the `Slot` says whether it was decided on the
    /// shared overflow cell (the key cap was reached and the policy is `Shared`).
    /// `met_retired`: the call met the key's cell retired, and may take the spare slot (see
    /// `with_cell_after`).
    #[cold]
    #[inline(never)]
    fn first_use<const COUNTED: bool, C: Clock, R>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: &Shard<K, A::Cell, S>,
        key: &K,
        n: u32,
        met_retired: bool,
        op: &impl Fn(&A::Cell) -> Result<R, TryAcquireError>,
    ) -> Result<(R, Slot), TryAcquireError> {
        let limit = self.algo.limit();
        if n > limit {
            return Err(too_big(n, limit));
        }
        if n == 0 && (!A::PROBE_MEETS_CAP || self.room_for_probe(ctx, shard, met_retired)) {
            // A probe consumes nothing, so it creates no key (nor a fresh ring of the exact
            // sliding window, 8 bytes per permit): answer for a fresh state.
            let fresh = self.algo.probe_cell();
            return op(&fresh).map(|r| (r, Slot::Key));
        }
        // The spare before a search for room: when the key's own slot is on its way back, a
        // search would evict another idle key for nothing. (A probe left here met the cap: it
        // takes no slot and gets the overflow policy's answer.)
        let reserved = n != 0
            && (ctx.reserve_key()
                || (met_retired && ctx.reserve_spare_key())
                || self.make_room(ctx, shard));
        if !reserved {
            if COUNTED {
                ctx.counters.bump(OVERFLOWED);
            }
            return match ctx.overflow {
                KeyOverflow::Reject => Err(TryAcquireError::TooManyKeys {
                    max_keys: ctx.max_keys,
                }),
                KeyOverflow::Shared => {
                    sooner_by_room(ctx, op(&self.overflow)).map(|r| (r, Slot::Overflow))
                }
            };
        }
        // Insert a fresh cell, then admit on whichever cell is there through the ordinary path
        // (load, then clock), so that the admission's time is no earlier than anything that
        // happened to the key before, including the eviction of an earlier cell. A sweeper never
        // retires a cell that has not admitted yet (`Algo::retire`), so the inserter is not
        // starved by one looping beside it.
        // The map's copy of the key, made now that the slot is ours (a call refused at the cap
        // clones nothing). Should the key's `Clone` panic, or its `Hash` or `Eq` inside the
        // map's insert (which then inserts nothing), the slot and the count in `len` go back as
        // it unwinds: kept, each such panic took a slot of the cap for good.
        let mut slot = SlotOnUnwind { ctx, len: None };
        let owned = key.clone();
        // Relaxed: bookkeeping for when to sweep; no decision about admissions depends on it.
        // Counted before the insert so that a concurrent removal never takes `len` below zero.
        let len = shard.len.fetch_add(1, Ordering::Relaxed) + 1;
        slot.len = Some(&shard.len);
        let fresh = self.algo.cell();
        let ((outcome, taken_back), inserted) =
            shard.map.insert_then(owned, fresh, |cell, ours| {
                // The map has placed the key (ours inserted, or another's found): from here the
                // books are kept below, whatever happened.
                std::mem::forget(slot);
                let outcome = op(cell);
                // If the call left our cell unused (it failed, or it was a chain's decided
                // rejection), it is retired here, on the cell just decided on, not after a
                // second lookup of the key: a key whose `Hash` or `Eq` panicked in that
                // lookup left the cell in the map unretired, holding a slot of the cap for
                // good. One load of the word; for algorithms that cannot tell, nothing.
                // (Another's cell, if still unused, is its inserter's to take back.)
                (outcome, ours && Self::retire_unused(cell))
            });
        let outcome = outcome.map(|r| (r, Slot::Key));
        if !inserted {
            // Another call inserted the key first: the call was decided on its cell, and our
            // reservation is given back. (If that cell is still unused, its inserter has yet to
            // decide on it, or takes it back itself.)
            shard.len.fetch_sub(1, Ordering::Relaxed);
            ctx.release_keys(1);
            return outcome;
        }
        if taken_back {
            self.taken_back(ctx, shard, key);
            return outcome;
        }
        // Release: pairs with the Acquire swap that starts a sweep: if that swap reads our 0, the
        // sweep sees our key; if it comes earlier, our 0 lands after it and survives the sweep's
        // closing `fetch_min`. Either way a new key is never hidden from later sweeps. An RMW,
        // not a store: under C++'s rules a store would do (RMW atomicity puts it after a swap
        // that did not read it), but loom orders plain stores only partially against RMWs it
        // has not seen and would report a shard stuck at "never"; the RMW keeps the model exact.
        shard.not_before.fetch_min(0, Ordering::Release);
        // Release: after the shard's lowering, for the search that overwrites it (see
        // `room_at`).
        ctx.room_at.fetch_min(0, Ordering::Release);
        let inserted = shard.inserted.fetch_add(1, Ordering::Relaxed) + 1;
        // Due once the inserts since the last sweep match the keys it left (len − inserted).
        if 2 * inserted >= len.max(MIN_SWEEP) {
            // Amortised: a shard of L keys is swept after L inserts, so each insert pays for about
            // one key looked at; and one call sweeps at most this one shard.
            self.sweep_shard(ctx, shard, false);
        } else if len % FLUSH_EVERY == 0 {
            // A growing shard's resizes retire its old tables; hand them to reclamation within
            // `FLUSH_EVERY` inserts rather than when a batch fills (sweeps flush too).
            shard.map.flush();
        }
        outcome
    }

    /// Retires `cell`, which our call inserted for a key (or a refund left exactly fresh), if
    /// it has still admitted nothing (a limit lowered below `n` after `first_use`'s check, a
    /// chain's rejection, a refund of its only admission): true if this call retired it, and
    /// then owes [`taken_back`](Self::taken_back). A cell another caller has used meanwhile is
    /// kept (the CAS from the fresh word fails).
    ///
    /// Without this, nothing would remove the cell: sweeps never retire a never-used cell (see
    /// [`Algo::retire`]), so the key would count against `max_keys` for good. Called inside
    /// the map's closure that holds the cell, so that no lookup of the key (its `Hash` and
    /// `Eq`, which may panic) comes between the decision and the retirement. The inserter and a
    /// refund that leaves the word fresh again (`chain_refund`) may both try; the CAS from the
    /// fresh word decides, and whichever retires the cell keeps the books for it.
    #[inline]
    fn retire_unused(cell: &A::Cell) -> bool {
        A::unused(cell) && A::retire_unused(cell)
    }

    /// Keeps the books for a cell of `key` that [`retire_unused`](Self::retire_unused) retired:
    /// gives back its key reservation and its count in `shard.len`, then removes the dead entry,
    /// so that the key is as if never inserted. The books first: the removal looks the key up
    /// (its `Hash` and `Eq` may panic), and a retired entry left behind is harmless (a sweep or
    /// the key's next caller removes it), a slot kept is not.
    #[cold]
    #[inline(never)]
    fn taken_back<C: Clock>(&self, ctx: &Ctx<K, C, S>, shard: &Shard<K, A::Cell, S>, key: &K) {
        // The slot before the removal: a caller of this key that met the retired cell needs a
        // fresh one, and with the slot still taken it was refused at the cap.
        ctx.release_keys(1);
        // Relaxed: bookkeeping, as in `first_use`. Not an eviction: the key never held anything.
        shard.len.fetch_sub(1, Ordering::Relaxed);
        // A caller that met the dead entry first may have removed it already (and inserted a
        // fresh cell, which `remove_if` leaves alone: it is not retired).
        shard.map.remove_if(key, A::retired);
    }

    /// At the cap: looks for an idle key to evict, this key's shard first, then every other
    /// shard whose hint says it may hold one, and reserves the room it frees. False if no key is
    /// idle. When nothing can be idle before `room_at`, this is one load; a pass that finds
    /// nothing raises `room_at` to the earliest time a key it saw turns idle, so a flood of new
    /// keys while every key is busy costs one pass, not one per call. New keys that arrive while
    /// a pass runs search too (shards being swept are skipped, and shards swept already are
    /// skipped by their hints, so they share the work rather than repeat it), and any slot given
    /// back meanwhile, by whoever, is taken.
    #[cold]
    pub(crate) fn make_room<C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        own: &Shard<K, A::Cell, S>,
    ) -> bool {
        let now = ctx.clock.now();
        // Relaxed: a hint, as `not_before`.
        let room_at = ctx.room_at.load(Ordering::Relaxed);
        if now < room_at && room_at != SEARCHING {
            return false;
        }
        // AcqRel: Acquire pairs with the Release of every lowering (see `room_at`), so the
        // shard hints loaded below are no older than the lowering this swap overwrites; Release
        // keeps the release sequence of a lowering going for a later search. From here
        // `room_at` is rebuilt from the shard hints seen, and any hint lowered meanwhile
        // lowers it too.
        ctx.room_at.swap(SEARCHING, Ordering::AcqRel);
        // SeqCst fence: our swap, then our loads of the shard hints, against a release's
        // lowering of a shard hint, then its load of `room_at` (`Ctx::idle_hint`'s fence), is
        // store-then-load on both sides: either we read its lowering, or it reads our swap and
        // lowers `room_at` below what we find.
        fence(Ordering::SeqCst);
        // Relaxed: only spreads the work; any value is a valid starting point.
        let start = ctx.cursor.fetch_add(1, Ordering::Relaxed) as usize;
        let others = (0..self.shards.len()).map(|i| &self.shards[(start + i) & ctx.shard_mask]);
        let mut earliest = u64::MAX;
        for shard in std::iter::once(own).chain(others) {
            self.sweep_shard(ctx, shard, true);
            // Whoever evicted: slots given back by another search, a sweep or a reset running
            // beside us are room too. (Only our own evictions counted: a search that found the
            // keys of its shard evicted by another, and none left elsewhere, was refused with
            // room to spare.) At the cap this is a load; it writes only when it reserves.
            if ctx.reserve_key() {
                // Other shards were not looked at: their keys may be idle now. Relaxed: no
                // hint of ours to publish (0 sends the next search to every shard's own hint).
                ctx.room_at.fetch_min(0, Ordering::Relaxed);
                return true;
            }
            // Relaxed: a hint.
            earliest = earliest.min(shard.not_before.load(Ordering::Relaxed));
        }
        // Relaxed: replaces our `SEARCHING` (or another search's) with what we found; a value
        // stored meanwhile is lower (an insert's, a sweep's, another search's result) and the
        // minimum keeps it.
        let _ = ctx
            .room_at
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                Some(if r == SEARCHING {
                    earliest
                } else {
                    r.min(earliest)
                })
            });
        false
    }

    /// Removes `key`'s entry if its cell is retired. (Not counted here: the sweep that retired
    /// the cell counted it as evicted.)
    #[cold]
    fn remove_retired<C: Clock>(&self, _ctx: &Ctx<K, C, S>, shard: &Shard<K, A::Cell, S>, key: &K) {
        shard.map.remove_if(key, A::retired);
    }

    /// Retires and removes every idle key of `shard`; returns how many. Skips the shard if
    /// another thread is sweeping it or if nothing in it can be idle yet. `search`: a sweep of
    /// a search for room (`make_room`), which rebuilds `room_at` from the shard hints itself.
    #[inline]
    fn sweep_shard<C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: &Shard<K, A::Cell, S>,
        search: bool,
    ) -> u64 {
        // Relaxed: a hint; a stale value only makes us sweep in vain or a little late.
        if ctx.clock.now() < shard.not_before.load(Ordering::Relaxed) {
            return 0;
        }
        // Acquire: pairs with the Release store that ended the previous sweep of this shard, so
        // its bookkeeping is visible. A plain flag: the sweep itself needs no mutual exclusion
        // for correctness (retire and remove are atomic), only to avoid doing the work twice.
        if shard
            .sweeping
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return 0;
        }
        self.walk_shard(ctx, shard, search)
    }

    /// The walk of [`sweep_shard`](Self::sweep_shard), once its shard's sweep flag is ours. Kept
    /// apart so that the checks before it stay small enough to inline: with the walk's unwind
    /// guard (`Sweeping`) in the same function, a sweep that skips every shard on its hint cost
    /// three times as much (`keyed_sweep/1m_keys/…/busy_repeat`, 190 → 590 ns).
    #[inline(never)]
    fn walk_shard<C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: &Shard<K, A::Cell, S>,
        search: bool,
    ) -> u64 {
        let mut sweeping = Sweeping {
            ctx,
            shard,
            evicted: std::cell::Cell::new(0),
            finished: false,
        };
        shard.inserted.store(0, Ordering::Relaxed);
        // AcqRel: Acquire pairs with the Release store of an insert (see `first_use`). From here
        // the hint is rebuilt: this sweep lowers it to the earliest time a key it saw turns idle,
        // and any insert meanwhile lowers it to 0. (Storing our result instead of taking the
        // minimum lost such an insert: the loom model `sweep_vs_acquire_on_an_idle_key` found a
        // shard left at "never" with an idle key in it.)
        shard.not_before.swap(u64::MAX, Ordering::AcqRel);
        let mut next = u64::MAX;
        let evicted = &sweeping.evicted;
        // One walk that retires each idle cell and removes its entry in place (no second lookup
        // per key). A cell found retired already (by an earlier walk of a table that a resize
        // then replaced) is only removed.
        // `touch` loads a cell's word ahead of its turn (see `KeyMap::retain`).
        let touch = |cell: &A::Cell| {
            std::hint::black_box(A::retired(cell));
        };
        shard.map.retain(touch, |key, cell| {
            if A::unused(cell) {
                // Never used: its inserter is about to use it, or to take it back
                // (`retire_unused`), and `retire` would refuse it. Looked at first, so that a RETIRED met below is
                // never the inserter's: only a never-used word is taken back, a word seen used
                // never becomes one again, and so a cell this sweep did not see unused here was
                // retired, if at all, by a sweep (which counted it). Otherwise `retire`, loading
                // the RETIRED of a take-back that landed after the check just below, would
                // answer Ok and count as an eviction the key a take-back gives back itself.
                next = next.min(ctx.clock.now());
                return true;
            }
            if A::retired(cell) {
                return false;
            }
            let waited = || ctx.waits.any() && ctx.waits.has_waiters(key);
            match self.algo.retire_unless(cell, &ctx.clock, waited) {
                Ok(()) => {
                    // The key's slot goes back now, not at the end of the walk: a call for the
                    // key that meets the retired cell needs a fresh one, and at the cap, with
                    // the slot still counted (and this shard, being swept, skipped by its
                    // search for room), it was refused as over the cap for the rest of the
                    // walk, though the key had been idle and held. A retired entry still in
                    // the map therefore no longer counts against the cap; it is removed right
                    // below, so at most one per sweeping thread is ever in that state.
                    ctx.release_keys(1);
                    evicted.set(evicted.get() + 1);
                    false
                }
                Err(idle_at) => {
                    next = next.min(idle_at);
                    true
                }
            }
        });
        // Relaxed: the minimum keeps any insert's 0; ordering is carried by the swap above.
        shard.not_before.fetch_min(next, Ordering::Relaxed);
        if !search {
            // `room_at` stays at or below every shard's hint. (A search leaves it at
            // `SEARCHING` until it ends: this one shard's hint would refuse the new keys that
            // arrive meanwhile, though the search may yet find idle keys in other shards.)
            // Release: after the hint's `fetch_min` just above, for the search whose opening
            // swap overwrites this (see `room_at`).
            ctx.room_at.fetch_min(next, Ordering::Release);
        }
        let evicted = evicted.get();
        removed(ctx, shard, evicted);
        // The flag is cleared as `sweeping` drops (Release: pairs with the Acquire above).
        sweeping.finished = true;
        evicted
    }

    /// Sweeps every shard, ignoring the hints that let a sweep skip a shard: for a keyed
    /// concurrency limiter's `sweep`, which promises every idle key evicted now (but in a shard
    /// another thread is sweeping, which `sweep_shard` leaves to that thread). (Its cells
    /// turn idle at no clock time, with a release that lowers the hints, ordered against a
    /// racing sweep: see `KeyedConcurrencyLimiter::key_idled`.)
    pub(crate) fn sweep_all<C: Clock>(&self, ctx: &Ctx<K, C, S>) -> u64 {
        self.forget_hints(ctx);
        self.sweep(ctx)
    }

    /// Lowers every shard's hint and the limiter's `room_at` to 0, so that the next sweeps and
    /// searches for room look at every key again: for when keys may have turned idle earlier
    /// than the hints say (a reconfiguration that shortens the window or speeds the refill, a
    /// release no clock predicts).
    fn forget_hints<C: Clock>(&self, ctx: &Ctx<K, C, S>) {
        for shard in self.shards.iter() {
            // Release: as an insert's lowering (see `first_use`): a sweep whose opening swap
            // reads our 0 also sees what we did before it (the new parameters, the released
            // permit).
            shard.not_before.fetch_min(0, Ordering::Release);
        }
        // Release: after the hints' lowering, for the search that overwrites it (see
        // `room_at`).
        ctx.room_at.fetch_min(0, Ordering::Release);
    }

    pub(crate) fn sweep<C: Clock>(&self, ctx: &Ctx<K, C, S>) -> u64 {
        self.shards
            .iter()
            .map(|shard| self.sweep_shard(ctx, shard, false))
            .sum()
    }

    /// A chain's first pass: would `key` admit `n.max(1)` permits now? Writes nothing and
    /// creates no key; a key not held (or retired) answers as a fresh one, unless the cap is
    /// reached and no key can be evicted yet: then as the commit would (`first_use`), with
    /// `TooManyKeys` or the shared overflow cell's decision.
    ///
    /// Answering "fresh" at the cap made every call for a new key pass the check and fail in
    /// the commit, after the members committed before this one had taken their permits: under
    /// a flood of new keys (what the cap is for) each denial wrote to every such member twice
    /// (commit and refund), and a token bucket's refund, which gives back less the later it
    /// comes, drained it. "No key can be evicted yet" is the hint `make_room` itself trusts
    /// (`room_at`, raised by a search for room that found none), so the first call at the cap
    /// still searches, in its commit, and the ones after it are refused here.
    ///
    /// `count`: whether an answer at the cap counts the call in `overflowed` (see
    /// [`CountOverflow`]). Also says whether the shared overflow cell decided, as
    /// [`chain_commit`](Self::chain_commit) does.
    pub(crate) fn chain_check<C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: usize,
        key: &K,
        n: u32,
        count: CountOverflow,
    ) -> (Result<Admission, TryAcquireError>, bool) {
        let limit = self.algo.limit();
        if n > limit {
            return (Err(too_big(n, limit)), false);
        }
        let outcome = match self.shards[shard]
            .map
            .get(key, |cell| self.algo.check(cell, n, &ctx.clock))
        {
            found @ (Some(Err(TryAcquireError::Closed)) | None) => {
                let now = ctx.clock.now();
                // Relaxed, both: hints, as in `reserve_key` and `make_room`; a stale value only
                // answers as a call a moment earlier or later would have been answered. A key
                // whose cell was just retired has its slot coming back, or the spare (see
                // `with_cell_after`): never full.
                let room_at = ctx.room_at.load(Ordering::Relaxed);
                let full = found.is_none()
                    && ctx.keys.load(Ordering::Relaxed) >= ctx.max_keys as u64
                    && now < room_at
                    && room_at != SEARCHING;
                if !full {
                    // A fresh cell admits any n up to the limit; only the verdict is used.
                    return (Ok(Admission::new(now, 0, limit)), false);
                }
                let outcome = match ctx.overflow {
                    KeyOverflow::Reject => Err(TryAcquireError::TooManyKeys {
                        max_keys: ctx.max_keys,
                    }),
                    KeyOverflow::Shared => {
                        sooner_by_room(ctx, self.algo.check(&self.overflow, n, &ctx.clock))
                    }
                };
                let counted = match count {
                    // The call ends here, as it would have in `first_use`, which counts it; an
                    // admission is counted there, by the commit.
                    CountOverflow::IfRefused => outcome.is_err(),
                    CountOverflow::Always => true,
                    CountOverflow::Never => false,
                };
                if counted {
                    ctx.counters.bump(OVERFLOWED);
                }
                return (outcome, ctx.overflow == KeyOverflow::Shared);
            }
            Some(outcome) => outcome,
        };
        (outcome, false)
    }

    /// [`try_acquire`](Self::try_acquire), also saying whether the call met the key cap (the
    /// shared overflow cell decided it, or `TooManyKeys`), counted in `overflowed` as ever: a
    /// waiting call's fast path, which tells its head attempts whether it is counted already.
    #[inline(always)]
    fn try_acquire_where<C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: usize,
        key: &K,
        n: u32,
    ) -> (Result<Admission, TryAcquireError>, bool) {
        let met_retired = match self.shards[shard]
            .map
            .get(key, |cell| self.algo.try_acquire(cell, n, &ctx.clock))
        {
            Some(Err(TryAcquireError::Closed)) => true,
            None => false,
            Some(outcome) => return (outcome, false),
        };
        match self.decide_in_slot::<true, C>(ctx, shard, key, n, met_retired) {
            Ok((decided, slot)) => (decided, slot == Slot::Overflow),
            Err(error) => {
                let met_cap = matches!(error, TryAcquireError::TooManyKeys { .. });
                (Err(error), met_cap)
            }
        }
    }

    /// `try_acquire` on the key's cell through `with_cell_counting`, the decision (admission or
    /// rejection) coming back inside `Ok` with the slot that made it; only a retired cell's
    /// `Closed` (which `with_cell` retries) and the errors before any cell decided are `Err`.
    /// A refusal by the shared cell comes back past `first_use`'s `sooner_by_room` (which
    /// bounds only an `Err`), so it is bounded here: a head's timer (and a receipt's or a
    /// chain's retry-after) ends no later than when a held key turns idle, as `try_acquire`'s
    /// does (`at_the_cap_a_head_refused_by_the_shared_cell_wakes_when_a_held_key_turns_idle`).
    fn decide_in_slot<const COUNTED: bool, C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: usize,
        key: &K,
        n: u32,
        met_retired: bool,
    ) -> Result<(Result<Admission, TryAcquireError>, Slot), TryAcquireError> {
        let (decided, slot) =
            self.with_cell_counting::<COUNTED, C, _>(ctx, shard, key, n, met_retired, |cell| {
                match self.algo.try_acquire(cell, n, &ctx.clock) {
                    Err(TryAcquireError::Closed) => Err(TryAcquireError::Closed),
                    decided => Ok(decided),
                }
            })?;
        Ok(match slot {
            Slot::Overflow => (sooner_by_room(ctx, decided), slot),
            Slot::Key => (decided, slot),
        })
    }

    /// A chain's commit: `try_acquire` on the key, also saying whether the shared overflow cell
    /// decided it, admission or rejection (so that a refund goes to the same cell, and so that
    /// callers can count the decisions made for keys the limiter had no room for).
    ///
    /// `COUNTED`: a call at the cap counts in `overflowed` (see `with_cell_counting`); a
    /// waiting call's head attempts pass false and count the call once themselves.
    fn chain_commit<const COUNTED: bool, C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: usize,
        key: &K,
        n: u32,
    ) -> (Result<Admission, TryAcquireError>, Committed) {
        // Acquire: pairs with the Release that ends a reset, so that a commit reading the count
        // a reset left comes after that reset's retirement of the key's old cell, and so decides
        // on a cell made after it (see `chain_refund`). Read before deciding.
        let resets = ctx.resets.load(Ordering::Acquire);
        let committed = |overflow| Committed { overflow, resets };
        match self.decide_in_slot::<COUNTED, C>(ctx, shard, key, n, false) {
            Ok((decided, slot)) => (decided, committed(slot == Slot::Overflow)),
            Err(error) => (Err(error), committed(false)),
        }
    }

    /// Gives back an admission `chain_commit` made. The key's cell may have been evicted and
    /// made again since: a cell is evicted only once our admission no longer weighs on it, and
    /// the new cell is used at clock times no earlier than the eviction (see ARCHITECTURE.md),
    /// so every algorithm's refund finds nothing of ours on it and writes nothing.
    ///
    /// A reset retires a cell our admission may still weigh on, so after one the cell found
    /// here may be a new one that never held it: the refund is then dropped (the call's permit
    /// stays spent, which is stricter, never looser). Dropped whenever the reset count differs
    /// from the commit's, or was odd then (a reset was running). A cell made after a reset's
    /// retirement is always seen with that reset's first increment (see `KeyedLimiter::reset`),
    /// and the old cell, retired, takes no refund.
    fn chain_refund<C: Clock>(
        &self,
        ctx: &Ctx<K, C, S>,
        shard: usize,
        key: &K,
        n: u32,
        admission: &Admission,
        committed: Committed,
    ) {
        if committed.overflow {
            // A reset never touches the shared overflow cell.
            self.algo.refund(&self.overflow, n, admission, &ctx.clock);
            return;
        }
        let shard = &self.shards[shard];
        let refunded = shard.map.get(key, |cell| {
            // Relaxed: read after the lookup that found `cell`. If `cell` was made after a
            // reset retired the key's old one, that reset's first increment happens before
            // this load (through the retirement's Release and the map), so by coherence it
            // reads that increment or a later one, never the commit's value.
            let resets = ctx.resets.load(Ordering::Relaxed);
            if resets == committed.resets && resets.is_multiple_of(2) {
                self.algo.refund(cell, n, admission, &ctx.clock);
                // A refund can leave the word exactly fresh (a token bucket's only admission
                // given back at clock time 0 takes its word back to 0). Sweeps skip a
                // never-used word, which they take for one whose inserter is about to use it,
                // so nothing would ever evict the key: it would hold a slot of the cap for
                // good. Take it back as its inserter would (see `retire_unused`): here, on the
                // cell found, with no second lookup of the key that could panic in between.
                if Self::retire_unused(cell) {
                    return Refunded::Fresh;
                }
                // Idle now (it admits all a fresh cell would), sooner than the sweep hints
                // may say: its only admission of the window given back. (A snapshot: a call
                // admitted meanwhile only makes the lowering below a wasted look.)
                if self.algo.available(cell, ctx.clock.now()) >= self.algo.limit() {
                    return Refunded::Idle;
                }
            }
            Refunded::Busy
        });
        match refunded {
            Some(Refunded::Fresh) => self.taken_back(ctx, shard, key),
            // Without lowering the hints, a search for room at the cap that had found every key
            // busy kept refusing new keys (`TooManyKeys`, or the shared cell) until the time it
            // had computed, and sweeps skipped the shard until then.
            Some(Refunded::Idle) => ctx.refunded_idle(shard),
            Some(Refunded::Busy) | None => {}
        }
    }

    /// Forgets `key`'s state (see [`KeyedLimiter::reset`]): retires its cell whatever it holds
    /// and removes it, keeping the books as a sweep that evicts it would (but counted as
    /// forgotten, not evicted). False if the key held nothing to forget (no cell, a never-used
    /// one, or one already retired).
    fn reset<C: Clock>(&self, ctx: &Ctx<K, C, S>, shard: usize, key: &K) -> bool {
        let shard = &self.shards[shard];
        if !shard.map.get(key, A::retire_now).unwrap_or(false) {
            return false;
        }
        // The slot first, as a sweep gives it back (see `sweep_shard`): a caller of the key
        // that meets the retired cell needs a fresh one.
        ctx.release_keys(1);
        // Relaxed: bookkeeping, as in `removed`. Counted before the removal, whose lookup runs
        // the key's `Hash` and `Eq`: should they panic, the key is forgotten all the same (a
        // sweep, or a caller that meets it, removes the dead entry without counting it).
        shard.len.fetch_sub(1, Ordering::Relaxed);
        ctx.forgotten.fetch_add(1, Ordering::Relaxed);
        // The dead entry goes now, unless a caller that met it first removed it already (and
        // inserted a fresh cell, which `remove_if` leaves alone).
        shard.map.remove_if(key, A::retired);
        true
    }

    /// The key's free permits at `now` if it holds a cell; `None` if it holds none.
    fn held_available(&self, shard: usize, key: &K, now: u64) -> Option<u32> {
        self.shards[shard]
            .map
            .get(key, |cell| self.algo.available(cell, now))
    }

    /// The key's free permits if it holds a cell; for a key not held, what its next call would
    /// be decided on: a fresh cell (the limit), unless the cap is reached and no key can be
    /// evicted yet (the hint `chain_check` and `make_room` trust), when the overflow policy
    /// decides it: the shared cell's free permits, or none under `Reject`. (It reported the
    /// full limit there, for a key whose calls the exhausted shared cell or the cap refused.)
    fn available<C: Clock>(&self, ctx: &Ctx<K, C, S>, shard: usize, key: &K) -> u32 {
        let now = ctx.clock.now();
        if let Some(free) = self.held_available(shard, key, now) {
            return free;
        }
        // Relaxed, both: a snapshot, read as `chain_check` reads them; a stale value answers as
        // a call a moment earlier or later would have been answered.
        let room_at = ctx.room_at.load(Ordering::Relaxed);
        let full = ctx.keys.load(Ordering::Relaxed) >= ctx.max_keys as u64
            && now < room_at
            && room_at != SEARCHING;
        if !full {
            return self.algo.limit();
        }
        match ctx.overflow {
            KeyOverflow::Shared => self.algo.available(&self.overflow, now),
            KeyOverflow::Reject => 0,
        }
    }
}

impl<K, C, S> Inner<K, C, S> {
    /// The most permits one call can ask for.
    fn algorithm_limit(&self) -> u32 {
        match &self.store {
            Store::Fixed(s) => s.algo.limit(),
            Store::Sliding(s) => s.algo.limit(),
            Store::Counter(s) => s.algo.limit(),
            Store::Bucket(s) => s.algo.limit(),
        }
    }
}

/// A key's waiter checks the limit in force as it joins the key's queue (see `Wait::capacity`).
impl<K, C, S> Capacity for Inner<K, C, S>
where
    Inner<K, C, S>: Sync,
{
    fn capacity_now(&self) -> u32 {
        self.algorithm_limit()
    }

    fn closed(&self) -> bool {
        self.ctx.waits.is_closed()
    }
}

/// Runs `$body` with `$keyed` bound to the store's `Keyed<A, K, S>`, whatever `A` is.
macro_rules! with_store {
    ($store:expr, $keyed:ident => $body:expr) => {
        match $store {
            Store::Fixed($keyed) => $body,
            Store::Sliding($keyed) => $body,
            Store::Counter($keyed) => $body,
            Store::Bucket($keyed) => $body,
        }
    };
}

impl<K, C: Clock, S> Inner<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone,
{
    /// Evicts every idle key (see [`KeyedLimiter::sweep`]); returns how many.
    ///
    /// A sweep that evicted a key tells the chain callers sleeping on this limiter, after the
    /// slots are given back (as every change is told, see `crate::watchers`): a `KeyedChain`
    /// call for a key new to this limiter at its cap was decided on the shared overflow cell
    /// (`KeyOverflow::Shared`), and slept out that cell's whole `retry_after` though its key
    /// could now get a cell of its own. Nobody is told when nothing was evicted: sweeps run
    /// often (a periodic sweeper), and most evict nothing.
    ///
    /// Only this sweep tells, not the ones a call makes on its way (the sweep an insert pays
    /// for, a search for room at the cap): those run inside a decision, with an admission or a
    /// reserved slot in hand and, for a key's head waiter, under its queue's mutex, where a
    /// chain caller's `Waker` (foreign code, which may panic) must not run.
    fn sweep(&self) -> u64 {
        let evicted = with_store!(&self.store, s => s.sweep(&self.ctx));
        if evicted > 0 {
            self.watchers.changed(None);
        }
        evicted
    }

    /// Wakes the head of every key's queue (see [`KeyedLimiter::chain_wake`]). Every head is
    /// woken even if a `Waker` panics (see `WakeAll`; inside an unwind the second panic is
    /// dropped, not let out).
    fn wake_every_head(&self) {
        // Collected first: no waker runs while the map is being walked.
        let mut heads = Vec::new();
        self.ctx
            .waits
            .map
            .for_each(|_, wait| heads.push(Arc::clone(wait)));
        wake_all(heads, |wait| wait.queue.wake_head());
    }
}

impl<K, C: Clock, S> Clone for KeyedLimiter<K, C, S> {
    fn clone(&self) -> Self {
        KeyedLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, C: Clock, S> fmt::Debug for KeyedLimiter<K, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("algorithm", &*lock(&self.inner.algorithm))
            .field("max_keys", &self.inner.ctx.max_keys)
            .field("overflow", &self.inner.ctx.overflow)
            // Relaxed: a snapshot for display.
            .field("keys", &self.inner.ctx.keys.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Builds a [`KeyedLimiter`] with a chosen clock, key cap, overflow policy or hasher.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, KeyOverflow, KeyedLimiter, ManualClock};
///
/// let limiter = KeyedLimiter::<String, _>::builder(Algorithm::SlidingWindow {
///     limit: 100,
///     window: Duration::from_secs(60),
/// })
/// .clock(ManualClock::new())
/// .max_keys(10_000)
/// .overflow(KeyOverflow::Shared)
/// .build()?;
/// assert_eq!(limiter.max_keys(), 10_000);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct KeyedLimiterBuilder<K, C = DefaultClock, S = crate::sync::RandomHasher> {
    algorithm: Algorithm,
    clock: C,
    hasher: S,
    max_keys: usize,
    overflow: KeyOverflow,
    order: QueueOrder,
    queue_limit: u64,
    max_limit: Option<u32>,
    _key: std::marker::PhantomData<fn(&K)>,
}

impl<K> KeyedLimiter<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A keyed limiter running `algorithm` per key on the [`DefaultClock`], with at most
    /// [`DEFAULT_MAX_KEYS`] keys and [`KeyOverflow::Reject`].
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if a parameter is zero or too large.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let per_user = KeyedLimiter::new(Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(60) })?;
    /// assert!(per_user.try_acquire(&"alice").is_ok());
    /// assert!(per_user.try_acquire(&"alice").is_ok());
    /// assert!(per_user.try_acquire(&"alice").is_err());
    /// assert!(per_user.try_acquire(&"bob").is_ok()); // keys are independent
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn new(algorithm: Algorithm) -> Result<Self, ConfigError> {
        Self::builder(algorithm).build()
    }

    /// A builder starting from `algorithm` with the defaults of [`new`](Self::new).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{Algorithm, KeyedLimiter, Rate};
    ///
    /// let limiter = KeyedLimiter::<u64>::builder(Algorithm::TokenBucket { rate: Rate::per_second(5), burst: 5 })
    ///     .max_keys(1_000)
    ///     .build()?;
    /// assert_eq!(limiter.max_keys(), 1_000);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn builder(algorithm: Algorithm) -> KeyedLimiterBuilder<K> {
        KeyedLimiterBuilder {
            algorithm,
            clock: DefaultClock::new(),
            hasher: crate::sync::RandomHasher::default(),
            max_keys: DEFAULT_MAX_KEYS,
            overflow: KeyOverflow::Reject,
            order: QueueOrder::OldestFirst,
            queue_limit: DEFAULT_QUEUE_LIMIT,
            max_limit: None,
            _key: std::marker::PhantomData,
        }
    }
}

impl<K, C: Clock> KeyedLimiter<K, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A keyed limiter running `algorithm` per key on `clock`, with the defaults of
    /// [`new`](KeyedLimiter::new).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if a parameter is zero or too large.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) },
    ///     clock.clone(),
    /// )?;
    /// limiter.try_acquire(&7u32)?;
    /// assert!(limiter.try_acquire(&7u32).is_err());
    /// clock.advance(Duration::from_secs(1));
    /// assert!(limiter.try_acquire(&7u32).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_clock(algorithm: Algorithm, clock: C) -> Result<Self, ConfigError> {
        KeyedLimiter::<K>::builder(algorithm).clock(clock).build()
    }
}

impl<K, C, S> KeyedLimiterBuilder<K, C, S> {
    /// Uses `clock` (for example a [`ManualClock`](crate::ManualClock) in tests).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Clock, KeyedLimiter, MonotonicClock};
    ///
    /// let limiter = KeyedLimiter::<u64>::builder(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })
    ///     .clock(MonotonicClock::new())
    ///     .build()?;
    /// assert!(limiter.clock().now() < 1_000_000_000);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn clock<C2: Clock>(self, clock: C2) -> KeyedLimiterBuilder<K, C2, S> {
        KeyedLimiterBuilder {
            algorithm: self.algorithm,
            clock,
            hasher: self.hasher,
            max_keys: self.max_keys,
            overflow: self.overflow,
            order: self.order,
            queue_limit: self.queue_limit,
            max_limit: self.max_limit,
            _key: std::marker::PhantomData,
        }
    }

    /// Hashes keys with `hasher` instead of foldhash. Keep it randomly seeded if clients choose
    /// the keys.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::hash::RandomState;
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::<String>::builder(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })
    ///     .hasher(RandomState::new()) // std's SipHash
    ///     .build()?;
    /// assert!(limiter.try_acquire(&"k".to_string()).is_ok());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn hasher<S2: BuildHasher + Clone>(self, hasher: S2) -> KeyedLimiterBuilder<K, C, S2> {
        KeyedLimiterBuilder {
            algorithm: self.algorithm,
            clock: self.clock,
            hasher,
            max_keys: self.max_keys,
            overflow: self.overflow,
            order: self.order,
            queue_limit: self.queue_limit,
            max_limit: self.max_limit,
            _key: std::marker::PhantomData,
        }
    }

    /// Keeps at most `max_keys` keys (default [`DEFAULT_MAX_KEYS`]), plus at most one:
    /// a call that meets its key's cell just evicted or reset may take one spare slot while the
    /// slot of the cell it replaces is being given back (see the limiter's "Hard cap").
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::<u64>::builder(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })
    ///     .max_keys(100)
    ///     .build()?;
    /// assert_eq!(limiter.max_keys(), 100);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// What to do with a new key when the cap is reached and no key is idle (default
    /// [`KeyOverflow::Reject`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyOverflow, KeyedLimiter, ManualClock};
    ///
    /// let limiter = KeyedLimiter::builder(Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(1) })
    ///     .clock(ManualClock::new())
    ///     .max_keys(1)
    ///     .overflow(KeyOverflow::Shared)
    ///     .build()?;
    /// limiter.try_acquire(&1u8)?;
    /// limiter.try_acquire(&2u8)?; // over the cap: the shared limiter
    /// limiter.try_acquire(&3u8)?; // the shared limiter again
    /// assert!(limiter.try_acquire(&4u8).is_err()); // it allows 2 per second, for all of them
    /// assert_eq!(limiter.stats().overflowed, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn overflow(mut self, policy: KeyOverflow) -> Self {
        self.overflow = policy;
        self
    }

    /// The order in which each key's waiters are served (default [`QueueOrder::OldestFirst`]).
    /// Queues are per key: one key's waiters never delay another key.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, QueueOrder};
    ///
    /// let limiter = KeyedLimiter::<u64>::builder(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })
    ///     .queue_order(QueueOrder::NewestFirst)
    ///     .build()?;
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
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::<u64>::builder(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })
    ///     .queue_limit(10)
    ///     .build()?;
    /// assert_eq!(limiter.queue_limit(), 10);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_limit(mut self, permits: u64) -> Self {
        self.queue_limit = permits;
        self
    }

    /// The largest limit a later [`reconfigure`](KeyedLimiter::reconfigure) may set on an exact
    /// sliding window (default: the limit it is built with). Every key's ring of timestamps is
    /// allocated for this many permits (8 bytes each, per key), since a ring cannot grow without
    /// a lock. A `max_limit` below the limit it is built with is raised to that limit (a ring
    /// holds at least the limit), as [`RateLimiterBuilder::max_limit`] does. The other
    /// algorithms keep O(1) state per key and ignore this.
    ///
    /// [`RateLimiterBuilder::max_limit`]: crate::RateLimiterBuilder::max_limit
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let window = Duration::from_secs(1);
    /// // Below the limit: raised to it.
    /// let small = KeyedLimiter::<u64>::builder(Algorithm::SlidingWindow { limit: 2, window })
    ///     .max_limit(0)
    ///     .build()?;
    /// small.reconfigure(Algorithm::SlidingWindow { limit: 2, window })?;
    /// assert!(small.reconfigure(Algorithm::SlidingWindow { limit: 3, window }).is_err());
    /// let limiter = KeyedLimiter::<u64>::builder(Algorithm::SlidingWindow { limit: 2, window })
    ///     .max_limit(8)
    ///     .build()?;
    /// limiter.reconfigure(Algorithm::SlidingWindow { limit: 8, window })?;
    /// assert!(limiter.try_acquire_n(&1, 8).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_limit(mut self, max_limit: u32) -> Self {
        self.max_limit = Some(max_limit);
        self
    }
}

impl<K, C: Clock, S> KeyedLimiterBuilder<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] if an algorithm parameter is zero or too large, or `max_keys` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, ConfigError, KeyedLimiter};
    ///
    /// let bad = KeyedLimiter::<u64>::builder(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })
    ///     .max_keys(0)
    ///     .build();
    /// assert_eq!(bad.unwrap_err(), ConfigError::Zero { what: "max_keys" });
    /// ```
    pub fn build(self) -> Result<KeyedLimiter<K, C, S>, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::Zero { what: "max_keys" });
        }
        let shards = shard_count(self.max_keys);
        let h = &self.hasher;
        let store = match self.algorithm {
            Algorithm::FixedWindow { limit, window } => {
                Store::Fixed(Keyed::new(FixedWindow::new(limit, window)?, shards, h))
            }
            Algorithm::SlidingWindow { limit, window } => {
                let algo = build_sliding(limit, window, self.max_limit)?;
                Store::Sliding(Keyed::new(algo, shards, h))
            }
            Algorithm::SlidingCounter { limit, window } => {
                Store::Counter(Keyed::new(SlidingCounter::new(limit, window)?, shards, h))
            }
            Algorithm::TokenBucket { rate, burst } => {
                Store::Bucket(Keyed::new(TokenBucket::new(rate, burst)?, shards, h))
            }
        };
        Ok(KeyedLimiter {
            inner: Arc::new(Inner {
                store,
                algorithm: Mutex::new(self.algorithm),
                resetting: Mutex::new(()),
                watchers: Watchers::default(),
                overflow_heads: CachePadded::new(AtomicU64::new(0)),
                ctx: Ctx::new(
                    self.clock,
                    self.hasher.clone(),
                    shards,
                    self.max_keys,
                    self.overflow,
                    Waits::new(self.hasher, self.order, self.queue_limit),
                ),
            }),
        })
    }
}

impl<K, C: Clock, S> KeyedLimiter<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// The shard of `key` (a `BanList` locks the stripe it picks).
    #[inline(always)]
    pub(crate) fn shard(&self, key: &K) -> usize {
        self.inner.ctx.shard(key)
    }

    /// Takes one permit for `key` if one is available now. Never blocks.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::SlidingWindow { limit: 1, window: Duration::from_secs(60) })?;
    /// assert!(limiter.try_acquire(&"token-1").is_ok());
    /// assert!(limiter.try_acquire(&"token-1").is_err());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self, key: &K) -> Result<Admission, TryAcquireError> {
        self.try_acquire_n(key, 1)
    }

    /// Takes `n` permits for `key` at once if they are all available now; otherwise takes none.
    /// Never blocks. Same semantics as [`RateLimiter::try_acquire_n`](crate::RateLimiter::try_acquire_n)
    /// on the key's own limiter; a key seen for the first time starts fresh.
    ///
    /// `n == 0` is a probe and never creates a key.
    ///
    /// # Errors
    ///
    /// - [`TryAcquireError::Rejected`]: the key has too few permits now; `retry_after` is exact
    ///   (behind the key's queued waiters, oldest first, a lower bound that counts the permits
    ///   they will take, as for an unkeyed limiter).
    /// - [`TryAcquireError::InsufficientCapacity`]: `n` exceeds the limit (or burst).
    /// - [`TryAcquireError::TooManyKeys`]: a new key, the cap is reached, nothing is idle, and the
    ///   policy is [`KeyOverflow::Reject`].
    /// - [`TryAcquireError::Closed`]: the limiter was [closed](Self::close).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, ManualClock};
    ///
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) },
    ///     ManualClock::new(),
    /// )?;
    /// assert_eq!(limiter.try_acquire_n(&("alice", "/upload"), 8)?.remaining(), 2);
    /// assert!(limiter.try_acquire_n(&("alice", "/upload"), 3).is_err());
    /// assert!(limiter.try_acquire_n(&("alice", "/search"), 3).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_n(&self, key: &K, n: u32) -> Result<Admission, TryAcquireError> {
        let inner = &*self.inner;
        let outcome = if inner.ctx.waits.any() {
            self.try_acquire_queued(key, n)
        } else {
            self.decide(key, n)
        };
        inner
            .ctx
            .counters
            .bump(if outcome.is_ok() { ADMITTED } else { REJECTED });
        outcome
    }

    /// Records `n` permits as used by `key` now, without checking its limit: usage known only
    /// after the fact. Same semantics as [`RateLimiter::charge`](crate::RateLimiter::charge) on
    /// the key's own limiter (per algorithm, the debt and its bounds are stated there).
    ///
    /// The key's cell is found or made as for [`try_acquire_n`](Self::try_acquire_n): a new key
    /// starts fresh and is charged (it then holds a cell like any key that was admitted); a key
    /// whose cell was evicted, or [`reset`](Self::reset), gets a fresh cell; a
    /// [`reconfigure`](Self::reconfigure) applies as to admissions. A new key at the key cap,
    /// with no idle key to evict, is handled as `try_acquire_n` handles it: under
    /// [`KeyOverflow::Reject`] the charge fails with `TooManyKeys` and records nothing; under
    /// [`KeyOverflow::Shared`] it is charged to the shared overflow cell. `n == 0` records
    /// nothing and creates no key. Waiters queued on the key are neither woken nor passed over
    /// (a charge only makes the key stricter; the queue's head retries at its new
    /// `retry_after`), and the charge is not counted in [`stats`](Self::stats) (nor as
    /// `overflowed` when it meets the cap).
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::TooManyKeys`] as above, and [`TryAcquireError::Closed`] once the
    /// limiter is [closed](Self::close) (nothing is recorded); never `Rejected` nor
    /// `InsufficientCapacity`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, ManualClock};
    ///
    /// // 10 requests a minute per user; a failed login costs 5 (a penalty).
    /// let clock = ManualClock::new();
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(60) },
    ///     clock.clone(),
    /// )?;
    /// limiter.try_acquire(&"mallory")?;
    /// assert_eq!(limiter.charge(&"mallory", 5)?.remaining(), 4);
    /// assert_eq!(limiter.charge(&"mallory", 5)?.remaining(), 0); // one over: in debt
    /// assert!(limiter.try_acquire(&"mallory").is_err());
    /// assert!(limiter.try_acquire(&"alice").is_ok());
    /// clock.advance(Duration::from_secs(60)); // the next window starts empty
    /// assert!(limiter.try_acquire(&"mallory").is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge(&self, key: &K, n: u32) -> Result<Admission, TryAcquireError> {
        let inner = &*self.inner;
        let (ctx, shard) = (&inner.ctx, self.shard(key));
        if ctx.waits.is_closed() {
            return Err(TryAcquireError::Closed);
        }
        with_store!(&inner.store, s => loop {
            // The key's cell through the path every keyed call takes (`with_cell`); its checks
            // for a new key are for a call of at most the limit, which a charge may exceed.
            let cell_n = n.min(s.algo.limit());
            // Not counted in `stats()`, `overflowed` included (see the docs above).
            let charged = s.with_cell_counting::<false, _, _>(ctx, shard, key, cell_n, false, |cell| {
                crate::algorithm::Charge::charge(&s.algo, cell, n, &ctx.clock)
            });
            match charged {
                // Only `with_cell` says this (a charge never does): the limit was lowered
                // since we read it. Again, with the new one.
                Err(TryAcquireError::InsufficientCapacity { .. }) => continue,
                charged => break charged.map(|(admission, _)| admission),
            }
        })
    }

    /// The decision for `key`, without counting it.
    #[inline(always)]
    fn decide(&self, key: &K, n: u32) -> Result<Admission, TryAcquireError> {
        let inner = &*self.inner;
        let shard = self.shard(key);
        with_store!(&inner.store, s => s.try_acquire(&inner.ctx, shard, key, n))
    }

    /// `try_acquire` while some key has waiters, or once closed: no barging past this key's
    /// queue under oldest-first order.
    #[cold]
    #[inline(never)]
    fn try_acquire_queued(&self, key: &K, n: u32) -> Result<Admission, TryAcquireError> {
        if self.inner.ctx.waits.is_closed() {
            return Err(TryAcquireError::Closed);
        }
        if self.held_back(key) {
            return Err(self.refused_for_waiters(key, n).0);
        }
        if let Some(heads) = self.behind_overflow_heads(key, n) {
            return Err(self.refused_behind(key, n, heads, true).0);
        }
        self.decide(key, n)
    }

    /// Whether a call for `key`, which has no queue of its own, must not be decided now: heads
    /// of other keys wait on the shared overflow cell (under [`KeyOverflow::Shared`], oldest
    /// first), and that cell would decide this call too. `Some`: what those heads will take
    /// (see [`OverflowWait`]). Only on the slow paths (some key has waiters).
    #[inline]
    fn behind_overflow_heads(&self, key: &K, n: u32) -> Option<Queued> {
        let inner = &*self.inner;
        if inner.ctx.overflow != KeyOverflow::Shared
            || inner.ctx.waits.order != QueueOrder::OldestFirst
        {
            return None;
        }
        // Relaxed: a hint read once, as `Waits::any`: a head counted just after this load is
        // one this call may precede (it was not waiting on the cell yet).
        let heads = inner.overflow_heads.load(Ordering::Relaxed);
        if heads == 0 {
            return None;
        }
        self.decided_by_overflow(key, n).then_some(Queued {
            permits: heads,
            head: 0,
        })
    }

    /// Whether the shared overflow cell would decide a call for `n` permits on `key` now (the
    /// key has no cell, the cap is reached, and no held key is idle yet, as far as the hints
    /// say: `chain_check`'s view, which writes nothing and counts nothing).
    #[cold]
    fn decided_by_overflow(&self, key: &K, n: u32) -> bool {
        let inner = &*self.inner;
        let shard = self.shard(key);
        let count = CountOverflow::Never;
        let (_, shared) =
            with_store!(&inner.store, s => s.chain_check(&inner.ctx, shard, key, n, count));
        shared
    }

    /// Whether calls on `key` must not barge: it has waiters, served oldest first. One load
    /// when no key has waiters.
    #[inline(always)]
    fn held_back(&self, key: &K) -> bool {
        let waits = &self.inner.ctx.waits;
        waits.any() && waits.order == QueueOrder::OldestFirst && waits.has_waiters(key)
    }

    /// The answer to a call that `key`'s waiters hold back (see [`held_back`](Self::held_back)),
    /// and whether the shared overflow cell gave it (the key has no cell and the cap is
    /// reached), as [`chain_decide`](Self::chain_decide) reports a commit's.
    #[cold]
    fn refused_for_waiters(&self, key: &K, n: u32) -> (TryAcquireError, bool) {
        let queued = self.inner.ctx.waits.queued_on(key);
        self.refused_behind(key, n, queued, true)
    }

    /// [`refused_for_waiters`](Self::refused_for_waiters) behind waiters that will take
    /// `queued`: the key's own, or the heads waiting on the shared overflow cell (see
    /// [`behind_overflow_heads`](Self::behind_overflow_heads)), whose state the checks below
    /// read for a key without a cell at the cap. `count`: whether a call that meets the cap is
    /// counted in `overflowed` here (a waiting call's head counts itself once, elsewhere).
    #[cold]
    fn refused_behind(
        &self,
        key: &K,
        n: u32,
        queued: Queued,
        count: bool,
    ) -> (TryAcquireError, bool) {
        let inner = &*self.inner;
        let shard = self.shard(key);
        // As for an unkeyed limiter (see there): when the key's state could admit what its
        // queue will take and this call's permits together. The check writes nothing and
        // creates no key; a key without a cell answers as a fresh one would (or, at the cap,
        // as its overflow policy does), as its queue's head will be answered.
        let first = std::cell::Cell::new(true);
        let shared = std::cell::Cell::new(false);
        let next_window_after = match &inner.store {
            Store::Counter(s) => {
                Some(|after| s.algo.next_window_after(inner.ctx.clock.now(), after))
            }
            _ => None,
        };
        let refused = crate::limiter::refused_for_waiters(
            n,
            inner.algorithm_limit(),
            queued,
            // The first check counts the call in `overflowed` if it meets the cap, whatever the
            // shared cell answers (the call is refused either way); the sliding counter's second
            // one, for the same call, does not.
            |want| {
                let count = match first.replace(false) && count {
                    true => CountOverflow::Always,
                    false => CountOverflow::Never,
                };
                let (outcome, overflow) = with_store!(
                    &inner.store, s => s.chain_check(&inner.ctx, shard, key, want, count)
                );
                shared.set(overflow);
                outcome
            },
            next_window_after,
            |at_limit, extra| {
                let now = inner.ctx.clock.now();
                with_store!(&inner.store, s => s.algo.beyond_limit(now, at_limit, extra))
            },
        );
        (refused, shared.get())
    }

    /// Permits `key` could take now (a snapshot): its own free permits if it is held; for a key
    /// not held, the full limit, unless the limiter holds [`max_keys`](Self::max_keys) keys and
    /// none of them can be evicted yet (as far as the last search for room found): a new key's
    /// calls are then decided by the [`KeyOverflow`] policy, and this reports what that gives,
    /// the shared limiter's free permits under [`KeyOverflow::Shared`], none under
    /// [`KeyOverflow::Reject`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyOverflow, KeyedLimiter, ManualClock};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(60) })?;
    /// limiter.try_acquire_n(&1u64, 2)?;
    /// assert_eq!(limiter.available(&1u64), 3);
    /// assert_eq!(limiter.available(&2u64), 5);
    ///
    /// // At the cap, with every key busy, a new key is served by the shared limiter.
    /// let shared = KeyedLimiter::builder(Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(60) })
    ///     .clock(ManualClock::new())
    ///     .max_keys(1)
    ///     .overflow(KeyOverflow::Shared)
    ///     .build()?;
    /// shared.try_acquire(&1u64)?; // the only key slot, busy for the window
    /// shared.try_acquire(&2u64)?; // one of the shared limiter's two permits
    /// assert_eq!(shared.available(&3u64), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available(&self, key: &K) -> u32 {
        let inner = &*self.inner;
        let shard = self.shard(key);
        with_store!(&inner.store, s => s.available(&inner.ctx, shard, key))
    }

    /// `key`'s free permits if the limiter holds a cell for it; `None` if it holds none (never
    /// seen, evicted, reset), whatever a call for it would be decided on (see
    /// [`available`](Self::available), which answers for the key's next call instead).
    pub(crate) fn held_available(&self, key: &K) -> Option<u32> {
        let inner = &*self.inner;
        let shard = self.shard(key);
        let now = inner.ctx.clock.now();
        with_store!(&inner.store, s => s.held_available(shard, key, now))
    }

    /// Forgets `key`'s state: its next call starts as a key seen for the first time would, with
    /// the full limit (burst). True if the key held state to forget; false if it had none (never
    /// seen, evicted, or its first call still being decided), when nothing changes.
    ///
    /// For what a demanding user resets by hand: a login's failure counter once the password
    /// was right, a client cleared by an operator, a key whose owner bought more quota. The key
    /// keeps no trace (its slot under [`max_keys`](Self::max_keys) is given back), and its
    /// waiters are woken to try again at once (under [`KeyOverflow::Shared`], every key's
    /// head: one waiting on the shared cell may now get the slot).
    ///
    /// Calls that race the reset are decided either before it (and forgotten with the rest) or
    /// after it, on the fresh state; none is lost or decided on the forgotten state. A
    /// [`KeyedChain`](crate::KeyedChain) call that took a permit from this limiter before a
    /// reset and must give it back (another member rejected) does not give it to the fresh
    /// state: any refund that a reset overlaps is dropped, for every key of the limiter, so
    /// such a call costs a permit (stricter, never looser). Resets are serialised by a mutex;
    /// the hot path takes no lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, ManualClock};
    ///
    /// // Five failed logins per user per 15 minutes.
    /// let failures = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(15 * 60) },
    ///     ManualClock::new(),
    /// )?;
    /// for _ in 0..5 {
    ///     failures.try_acquire(&"alice")?;
    /// }
    /// assert!(failures.try_acquire(&"alice").is_err());
    /// // Alice got her password right: her failures are forgiven.
    /// assert!(failures.reset(&"alice"));
    /// assert_eq!(failures.available(&"alice"), 5);
    /// assert!(!failures.reset(&"bob"));
    /// assert_eq!(failures.stats().reset, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset(&self, key: &K) -> bool {
        let inner = &*self.inner;
        let ctx = &inner.ctx;
        let shard = self.shard(key);
        let forgot = {
            let _one_at_a_time = lock(&inner.resetting);
            // Relaxed: to odd. Ordered before the cell's retirement by that CAS's Release
            // (`algorithm::retire_word`): whoever meets the retired cell, and anyone who then
            // finds the key's new cell in the map, sees this increment (see `chain_refund`).
            ctx.resets.fetch_add(1, Ordering::Relaxed);
            // Back to even when this ends, even by an unwind out of the key's `Hash` or `Eq`
            // in the lookups: left odd, the count said a reset was running for good, and every
            // later refund on the limiter was dropped. Dropped before the mutex guard.
            let _ends = ResetEnds(&ctx.resets);
            with_store!(&inner.store, s => s.reset(ctx, shard, key))
        };
        if forgot {
            // Chain callers too (told of every key's reset: they look again, and a caller of
            // another key sleeps on).
            let _watchers = inner.watchers.notify_on_drop();
            // The head may be sleeping until the forgotten state would have let it in. Under
            // `KeyOverflow::Shared`, so may every key's: the forgotten cell's slot under the key
            // cap is free, and a head of a key past the cap, waiting on the shared cell, may now
            // get a cell of its own (as after a sweep, see `Inner::sweep`).
            if inner.ctx.overflow == KeyOverflow::Shared {
                inner.wake_every_head();
            } else if let Some(wait) = inner.ctx.waits.map.get(key, Arc::clone) {
                wait.queue.wake_head();
            }
        }
        forgot
    }

    /// Evicts every idle key now; returns how many were evicted.
    ///
    /// Calls for new keys already evict incrementally, and at the cap; `sweep` is for returning
    /// memory sooner, for example from a periodic task (see
    #[cfg_attr(feature = "tokio", doc = "[`run_sweeper`](Self::run_sweeper)).")]
    #[cfg_attr(not(feature = "tokio"), doc = "`run_sweeper`).")]
    /// It never removes a key that is not idle, and it runs
    /// concurrently with every other call; a shard that another thread is sweeping is skipped.
    /// A sweep that evicts a key wakes the [`KeyedChain`](crate::KeyedChain) callers waiting on
    /// this limiter: a new key at the cap, decided on the shared overflow cell while they
    /// waited, may now get a cell of its own.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, ManualClock};
    ///
    /// let clock = ManualClock::new();
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) },
    ///     clock.clone(),
    /// )?;
    /// for ip in 0..100u32 {
    ///     limiter.try_acquire(&ip)?;
    /// }
    /// assert_eq!(limiter.sweep(), 0); // all busy in this window
    /// clock.advance(Duration::from_secs(1));
    /// assert_eq!(limiter.sweep(), 100);
    /// assert!(limiter.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sweep(&self) -> usize {
        self.inner.sweep() as usize
    }

    /// Sweeps every `every` until the last handle to the limiter is dropped: spawn it on tokio
    /// (`tokio::spawn(limiter.run_sweeper(Duration::from_secs(10)))`) to return memory from idle
    /// keys without waiting for new keys to arrive. Like `acquire`, it runs on any executor: it
    /// sleeps on tokio's timer inside a tokio runtime (with its time driver enabled), on
    /// futures-timer's thread elsewhere. A sweep runs on the task that polls it; each sleep of
    /// `every` starts when the sweep before it ends.
    ///
    /// It holds only a weak reference, so it does not keep the limiter alive (it ends when it
    /// next wakes after the limiter is dropped, within `every`), and the shards' sweep flags
    /// keep it from sweeping a shard that a call is already sweeping.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it holds nothing across its awaits but the weak reference; dropping it stops
    /// the sweeping and leaves the limiter as it was.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) },
    ///     TokioClock::new(),
    /// )?;
    /// let sweeper = tokio::spawn(limiter.run_sweeper(Duration::from_secs(5)));
    /// limiter.try_acquire(&"session-1")?;
    /// tokio::time::sleep(Duration::from_secs(6)).await;
    /// assert!(limiter.is_empty());
    /// drop(limiter);
    /// sweeper.await?; // ends when it next wakes: the limiter is gone
    /// # Ok(())
    /// # }
    /// ```
    // Not under loom: loom's `Arc` has no weak references, and the sweeper is a plain loop over
    // `sweep`, which the models cover.
    #[cfg(all(feature = "tokio", not(turnstile_loom)))]
    pub fn run_sweeper(
        &self,
        every: std::time::Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static
    where
        C: 'static,
    {
        let weak = Arc::downgrade(&self.inner);
        async move {
            let every = every.max(std::time::Duration::from_millis(1));
            loop {
                crate::timer::sleep(every).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                inner.sweep();
            }
        }
    }

    /// Keys held now.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })?;
    /// limiter.try_acquire(&'a')?;
    /// limiter.try_acquire(&'b')?;
    /// assert_eq!(limiter.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        // Relaxed: a snapshot.
        self.inner.ctx.keys.load(Ordering::Relaxed) as usize
    }

    /// The keys held now (a weakly consistent snapshot: a key inserted or evicted meanwhile
    /// may or may not be in it), without the shared overflow cell's.
    pub(crate) fn keys(&self) -> Vec<K> {
        let mut keys = Vec::with_capacity(self.len());
        with_store!(&self.inner.store, s => s.for_each_key(&mut |key| keys.push(key.clone())));
        keys
    }

    /// Whether no key is held.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::<u64>::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })?;
    /// assert!(limiter.is_empty());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counts over all keys. `admitted + rejected + cancelled` is the number of calls once none
    /// is in flight.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(60) })?;
    /// let _ = limiter.try_acquire(&1u16);
    /// let _ = limiter.try_acquire(&1u16);
    /// let stats = limiter.stats();
    /// assert_eq!((stats.admitted, stats.rejected, stats.keys), (1, 1, 1));
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn stats(&self) -> KeyedStats {
        let ctx = &self.inner.ctx;
        let (waiting_keys, waiting, queued_permits) = self.inner.ctx.waits.queued();
        KeyedStats {
            admitted: ctx.counters.sum(ADMITTED),
            rejected: ctx.counters.sum(REJECTED),
            cancelled: ctx.counters.sum(CANCELLED),
            overflowed: ctx.counters.sum(OVERFLOWED),
            // Relaxed: a statistic.
            evicted: ctx.evicted.load(Ordering::Relaxed),
            // Relaxed: a statistic.
            reset: ctx.forgotten.load(Ordering::Relaxed),
            keys: self.len(),
            waiting,
            queued_permits,
            waiting_keys,
        }
    }

    /// The key cap.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, DEFAULT_MAX_KEYS};
    ///
    /// let limiter = KeyedLimiter::<u64>::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })?;
    /// assert_eq!(limiter.max_keys(), DEFAULT_MAX_KEYS);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn max_keys(&self) -> usize {
        self.inner.ctx.max_keys
    }

    /// What a call for a new key gets when the cap is reached and no key is idle.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyOverflow, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::<u64>::builder(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })
    ///     .overflow(KeyOverflow::Shared)
    ///     .build()?;
    /// assert_eq!(limiter.overflow(), KeyOverflow::Shared);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn overflow(&self) -> KeyOverflow {
        self.inner.ctx.overflow
    }

    /// The algorithm every key runs, with its parameters: those it was built with, or the last
    /// successful [`reconfigure`](Self::reconfigure).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{Algorithm, KeyedLimiter, Rate};
    ///
    /// let algorithm = Algorithm::TokenBucket { rate: Rate::per_second(1), burst: 1 };
    /// let limiter = KeyedLimiter::<u64>::new(algorithm)?;
    /// assert_eq!(limiter.algorithm(), algorithm);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn algorithm(&self) -> Algorithm {
        *lock(&self.inner.algorithm)
    }

    /// Changes the limit, window, rate or burst of *every* key at run time, keeping each key's
    /// state, with the semantics of [`RateLimiter::reconfigure`](crate::RateLimiter::reconfigure)
    /// per key. All keys share one parameter set, so the change reaches every key (and keys
    /// created later) at once; each key's queued waiters look again, and those asking for more
    /// than the new capacity fail with [`AcquireError::InsufficientCapacity`].
    ///
    /// Cost: O(1) for the fixed window, the sliding counter and the sliding window (only the
    /// shared parameters change; each key's state is read under them). A token bucket also
    /// visits every key once, to translate its state to the new parameters' epoch (a caller
    /// that meets a key first translates it itself), so that is O(keys); the hot path takes no
    /// lock either way. Reconfigurations are serialised by a mutex.
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::reconfigure`](crate::RateLimiter::reconfigure); on error nothing
    /// changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, ManualClock};
    ///
    /// let window = Duration::from_secs(60);
    /// let limiter = KeyedLimiter::with_clock(Algorithm::FixedWindow { limit: 5, window }, ManualClock::new())?;
    /// limiter.try_acquire_n(&"alice", 5)?;
    /// limiter.try_acquire_n(&"bob", 2)?;
    /// // A plan change for everybody: 3 per minute. Alice is over it until her window ends,
    /// // Bob has one left, a new key gets three.
    /// limiter.reconfigure(Algorithm::FixedWindow { limit: 3, window })?;
    /// assert!(limiter.try_acquire(&"alice").is_err());
    /// assert_eq!(limiter.try_acquire(&"bob")?.remaining(), 0);
    /// assert_eq!(limiter.try_acquire(&"carol")?.remaining(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reconfigure(&self, algorithm: Algorithm) -> Result<(), ConfigError> {
        let inner = &*self.inner;
        let mut current = lock(&inner.algorithm);
        let clock = &inner.ctx.clock;
        let from = *current;
        let kind_changed = || ConfigError::AlgorithmChanged {
            from: from.name(),
            to: algorithm.name(),
        };
        match (&inner.store, algorithm) {
            (Store::Fixed(s), Algorithm::FixedWindow { limit, window }) => {
                let to = FixedWindow::new(limit, window)?;
                s.algo.reconfigure(&to, clock, &|f| s.for_each_cell(f))
            }
            (Store::Sliding(s), Algorithm::SlidingWindow { limit, window }) => {
                let to = SlidingWindow::new(limit, window)?;
                s.algo.reconfigure(&to, clock, &|f| s.for_each_cell(f))
            }
            (Store::Counter(s), Algorithm::SlidingCounter { limit, window }) => {
                let to = SlidingCounter::new(limit, window)?;
                s.algo.reconfigure(&to, clock, &|f| s.for_each_cell(f))
            }
            (Store::Bucket(s), Algorithm::TokenBucket { rate, burst }) => {
                let to = TokenBucket::new(rate, burst)?;
                s.algo.reconfigure(&to, clock, &|f| s.for_each_cell(f))
            }
            _ => Err(kind_changed()),
        }?;
        // Keys may turn idle sooner under the new parameters (a shorter window, a faster
        // refill) than the sweep hints computed under the old ones say: without this, sweeps
        // and the search for room at the cap would skip those keys until the old times.
        with_store!(&inner.store, s => s.forget_hints(&inner.ctx));
        *current = algorithm;
        // SeqCst fence: pairs with the one a waiter makes between looking up its key's queue
        // and joining it, which reads the limit (see `KeyedLimiter::wait`): the walk below finds
        // that queue, or the waiter reads the parameters published above.
        fence(Ordering::SeqCst);
        let capacity = inner.algorithm_limit();
        // Every key's queue is swept under the mutex: swept after it, for a capacity another
        // reconfiguration has since replaced, a queue failed waiters that fit the capacity in
        // force (loom_keyed, `keyed_reconfigure_sweep_never_uses_a_superseded_capacity`).
        let mut woken = Vec::new();
        inner.ctx.waits.map.for_each(|_, wait| {
            woken.push(wait.queue.reconfigure_waiters(&wait.gate, capacity));
        });
        drop(current);
        // Chain callers sleeping on the old parameters look again too, even if a waker panics.
        let _watchers = inner.watchers.notify_on_drop();
        // The wake-ups after it, since a woken task's `Waker` may call `algorithm()`, which
        // takes the same mutex; every key's, even if a waker panics in one of them.
        wake_all(woken, Woken::wake);
        Ok(())
    }

    /// The limiter's clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Clock, KeyedLimiter, ManualClock};
    ///
    /// let limiter = KeyedLimiter::<u64, _>::with_clock(
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) },
    ///     ManualClock::new(),
    /// )?;
    /// limiter.clock().advance(Duration::from_secs(2));
    /// assert_eq!(limiter.clock().now(), 2_000_000_000);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.inner.ctx.clock
    }
}

/// Waiting for a key's permits: per-key fair queues.
impl<K, C: Clock, S> KeyedLimiter<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// The queue order of every key's waiters.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, QueueOrder};
    ///
    /// let limiter = KeyedLimiter::<u64>::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })?;
    /// assert_eq!(limiter.queue_order(), QueueOrder::OldestFirst);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_order(&self) -> QueueOrder {
        self.inner.ctx.waits.order
    }

    /// The queue limit of every key, in permits.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, DEFAULT_QUEUE_LIMIT};
    ///
    /// let limiter = KeyedLimiter::<u64>::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })?;
    /// assert_eq!(limiter.queue_limit(), DEFAULT_QUEUE_LIMIT);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_limit(&self) -> u64 {
        self.inner.ctx.waits.queue_limit
    }

    /// Closes the limiter, for every key: each queued waiter fails with
    /// [`AcquireError::Closed`], and every later `try_acquire`, `acquire`, `charge` or
    /// [`KeyedChain`](crate::KeyedChain) call on it fails at once (`Closed`). Closing twice is
    /// harmless. As for a [`RateLimiter`](crate::RateLimiter): a graceful shutdown's way to
    /// let every task waiting for a key go at once, rather than cancelling each.
    ///
    /// What was admitted stays admitted, and the keys' state is kept until evicted (sweeps
    /// still evict idle keys; [`available`](Self::available), [`stats`](Self::stats) and
    /// [`reset`](Self::reset) still answer). A refund of an admission made before the close
    /// still gives its permits back, to a limiter that admits nothing more.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{AcquireError, Algorithm, KeyedLimiter, TryAcquireError};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(60) })?;
    /// limiter.try_acquire(&"alice")?;
    /// let waiter = std::thread::spawn({
    ///     let limiter = limiter.clone();
    ///     move || limiter.acquire_blocking(&"alice") // waits about a minute, unless closed
    /// });
    /// while limiter.stats().waiting == 0 {
    ///     std::thread::yield_now();
    /// }
    /// limiter.close();
    /// assert_eq!(waiter.join().unwrap(), Err(AcquireError::Closed));
    /// assert!(limiter.is_closed());
    /// assert_eq!(limiter.try_acquire(&"bob"), Err(TryAcquireError::Closed));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(&self) {
        let inner = &*self.inner;
        // Chain callers sleeping on this limiter fail now rather than when their sleep ends;
        // told after the closed bit is set, and even if a queued waiter's waker panics.
        let _watchers = inner.watchers.notify_on_drop();
        inner.ctx.waits.close();
    }

    /// Whether [`close`](Self::close) was called.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter};
    ///
    /// let limiter = KeyedLimiter::<u64>::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) })?;
    /// assert!(!limiter.is_closed());
    /// limiter.close();
    /// assert!(limiter.is_closed());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn is_closed(&self) -> bool {
        self.inner.ctx.waits.is_closed()
    }

    /// Validates and tries without queueing when `key` has no waiters. `Pending`: queue up.
    /// The flag: the call is counted in `overflowed` (see `acquire_fast_with`).
    #[inline(always)]
    fn acquire_fast(&self, key: &K, n: u32) -> (Poll<Result<Admission, AcquireError>>, bool) {
        let inner = &*self.inner;
        let shard = self.shard(key);
        self.acquire_fast_with(
            key,
            n,
            || with_store!(&inner.store, s => s.try_acquire_where(&inner.ctx, shard, key, n)),
        )
    }

    /// [`acquire_fast`](Self::acquire_fast) with `attempt` as the key's decision (for a
    /// receipt, the commit a chain member makes, with what a refund needs).
    ///
    /// `attempt` also says whether it met the key cap (and so counted the call in
    /// `overflowed`); so does what this returns, for the wait that follows a `Pending`.
    #[inline(always)]
    fn acquire_fast_with<T>(
        &self,
        key: &K,
        n: u32,
        attempt: impl Fn() -> (Result<T, TryAcquireError>, bool),
    ) -> (Poll<Result<T, AcquireError>>, bool) {
        let inner = &*self.inner;
        let counters = &inner.ctx.counters;
        let waits = &inner.ctx.waits;
        let any = waits.any();
        if any && waits.is_closed() {
            counters.bump(REJECTED);
            return (Poll::Ready(Err(AcquireError::Closed)), false);
        }
        if !any || !waits.has_waiters(key) {
            if any && self.behind_overflow_heads(key, n).is_some() {
                // Behind the heads waiting on the shared cell: queue up, and the head's first
                // attempt defers to them (see `take_versioned`).
                return (Poll::Pending, false);
            }
            let (decision, met_cap) = attempt();
            let error = match decision {
                Ok(admission) => {
                    counters.bump(ADMITTED);
                    return (Poll::Ready(Ok(admission)), met_cap);
                }
                Err(TryAcquireError::Rejected(_)) => return (Poll::Pending, met_cap),
                Err(error) => waiting_error(error),
            };
            counters.bump(REJECTED);
            return (Poll::Ready(Err(error)), met_cap);
        }
        let capacity = inner.algorithm_limit();
        if n > capacity {
            counters.bump(REJECTED);
            return (
                Poll::Ready(Err(AcquireError::InsufficientCapacity {
                    requested: n,
                    capacity,
                })),
                false,
            );
        }
        if inner.ctx.waits.order == QueueOrder::NewestFirst {
            // Newest first: this caller goes before every queued waiter, so it takes what is
            // free now, as `try_acquire` does, and queues only if it must wait. Queueing first
            // would make a full queue fail its oldest waiter with `QueueFull` to make room for
            // a caller that is then admitted at once. Any refusal: the queue decides.
            let (decision, met_cap) = attempt();
            if let Ok(admission) = decision {
                counters.bump(ADMITTED);
                return (Poll::Ready(Ok(admission)), met_cap);
            }
            return (Poll::Pending, met_cap);
        }
        (Poll::Pending, false)
    }

    /// A receipt's decision: the commit [`try_acquire_refundable`](Self::try_acquire_refundable)
    /// makes (a chain member's), with the parameters' version read before it, and whether the
    /// call met the key cap (the shared overflow cell decided it, admission or refusal, or
    /// `TooManyKeys`), counted in `overflowed` only if `COUNTED`. Ignores the key's queue, as
    /// `decide` does: the callers check it.
    fn commit_versioned_where<const COUNTED: bool>(
        &self,
        key: &K,
        n: u32,
    ) -> (Result<Receipt, TryAcquireError>, bool) {
        let inner = &*self.inner;
        let version = self.params_version();
        let shard = self.shard(key);
        let (decision, committed) =
            with_store!(&inner.store, s => s.chain_commit::<COUNTED, C>(&inner.ctx, shard, key, n));
        let met_cap =
            committed.overflow || matches!(decision, Err(TryAcquireError::TooManyKeys { .. }));
        (
            decision.map(|admission| (admission, committed, version)),
            met_cap,
        )
    }

    /// `acquire_n`'s fast path for a receipt (see
    /// [`commit_versioned_where`](Self::commit_versioned_where)).
    #[inline]
    pub(crate) fn receipt_fast(
        &self,
        key: &K,
        n: u32,
    ) -> (Poll<Result<Receipt, AcquireError>>, bool) {
        self.acquire_fast_with(key, n, || self.commit_versioned_where::<true>(key, n))
    }

    /// The head waiter's attempt: the key's state, ignoring its queue. It commits as a chain
    /// member does, keeping what a refund needs, so that an admission that never reaches its
    /// caller can be given back (see `Wait::run_async`), and a receipt's: the parameters'
    /// version read before the commit, as
    /// [`try_acquire_refundable`](Self::try_acquire_refundable) reads it, so that the refund of
    /// an admission the queue made is checked against the version it was made under (or an
    /// earlier one: then it gives nothing back, which is never looser).
    ///
    /// `me` is the call's standing among the heads waiting on the shared overflow cell (see
    /// [`OverflowWait`]): a head not counted there defers to those that are, as a newcomer
    /// does, when the shared cell would decide its call too.
    fn take_versioned(
        &self,
        key: &K,
        n: u32,
        me: &OverflowWait<'_, K, C, S>,
    ) -> Result<Receipt, Blocked> {
        let inner = &*self.inner;
        inner.ctx.clock.catch_up();
        let blocked = |error| match error {
            TryAcquireError::Rejected(r) => Blocked::Until(r.retry_after_nanos()),
            error => Blocked::Fail(waiting_error(error)),
        };
        if !me.counted()
            && let Some(heads) = self.behind_overflow_heads(key, n)
        {
            me.join(n);
            me.met_cap();
            return Err(blocked(self.refused_behind(key, n, heads, false).0));
        }
        // Uncounted: the call is counted in `overflowed` once, whichever attempt meets the cap.
        let (decision, met_cap) = self.commit_versioned_where::<false>(key, n);
        if met_cap {
            me.met_cap();
        }
        match decision {
            Ok(admitted) => Ok(admitted),
            Err(error) => {
                // Refused at the cap: by the shared cell (`TooManyKeys` ends the call).
                if matches!(error, TryAcquireError::Rejected(_)) && met_cap {
                    me.join(n);
                } else {
                    me.leave();
                }
                Err(blocked(error))
            }
        }
    }

    /// A waiter's view of `wait`, the key's queue it has just looked up. The SeqCst fence pairs
    /// with the one in [`reconfigure`](KeyedLimiter::reconfigure) between publishing the new
    /// parameters and walking the queue map: we wrote the queue's map entry (store-then-load),
    /// or read one whose insert happens before our fence and which a walk that missed it read
    /// before (see ARCHITECTURE.md, "Reconfiguration"), then load the limit as we enqueue;
    /// `reconfigure` stores the parameters, then reads the map. With a fence on each side,
    /// either its walk finds this queue (and its sweep, under the queue's mutex, fails us if we
    /// joined first), or our enqueue reads the new limit: a request a lowering made too big
    /// never waits behind the head for good. [`close`](KeyedLimiter::close) is the same pair,
    /// with the closed bit for the parameters (see `Waits::close`). Only waiters pay it.
    fn wait<'a>(&'a self, wait: &'a KeyWait, n: u32, retry: &'a AtomicU64) -> Wait<'a> {
        fence(Ordering::SeqCst);
        let inner = &*self.inner;
        inner
            .ctx
            .waits
            .wait(wait, &inner.ctx.counters, n, inner, retry)
    }

    /// Waits until one permit for `key` is admitted. See [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future consumes no permit and frees its place in the key's queue.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) },
    ///     TokioClock::new(),
    /// )?;
    /// let start = tokio::time::Instant::now();
    /// limiter.acquire(&"alice").await?;
    /// limiter.acquire(&"bob").await?; // another key: no wait
    /// limiter.acquire(&"alice").await?; // waits for alice's next window
    /// assert_eq!(start.elapsed(), Duration::from_secs(1));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[inline]
    pub fn acquire<'a>(
        &'a self,
        key: &'a K,
    ) -> impl Future<Output = Result<Admission, AcquireError>> + Send + 'a {
        self.acquire_n(key, 1)
    }

    /// Waits until `n` permits for `key` are admitted at once, in the key's own fair, bounded
    /// queue; the same semantics as [`RateLimiter::acquire_n`](crate::RateLimiter::acquire_n) per
    /// key. Keys never wait for each other.
    ///
    /// If `key` has no waiters and its permits are available, this returns at the first poll. A
    /// key's queue exists only while it has waiters (or, briefly, until the last one's exit drops
    /// it), so the per-key cost is paid only by keys that wait. While some key has waiters,
    /// `try_acquire` on *any* key makes one more lookup to check that key's queue (no barging).
    ///
    /// # Errors
    ///
    /// - [`AcquireError::InsufficientCapacity`] at once if `n` exceeds the limit (or burst), or
    ///   as soon as a [`reconfigure`](Self::reconfigure) lowers it below `n` while this call
    ///   waits (a racing one included: the limit is read again as the call joins the queue).
    /// - [`AcquireError::QueueFull`] if the key's queue has no room for `n` more permits (or, under
    ///   [`QueueOrder::NewestFirst`], this waiter was among the oldest failed to make room).
    /// - [`AcquireError::TooManyKeys`] if the key is new, the cap is reached, nothing is idle, and
    ///   the policy is [`KeyOverflow::Reject`].
    /// - [`AcquireError::Closed`] at once if the limiter is [closed](Self::close), or as soon as
    ///   it is closed while this call waits.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future at any await point (a timeout, a `select!` branch, an
    /// aborted task) consumes no permit, frees its place in the key's queue and, if it was the
    /// head, wakes the next waiter; the key's queue is dropped once its last waiter is gone.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedLimiter, Rate, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 5 },
    ///     TokioClock::new(),
    /// )?;
    /// let start = tokio::time::Instant::now();
    /// limiter.acquire_n(&7u64, 5).await?; // the burst, at once
    /// limiter.acquire_n(&7u64, 5).await?; // 500 ms to accrue five more
    /// assert_eq!(start.elapsed(), Duration::from_millis(500));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[inline]
    pub fn acquire_n<'a>(
        &'a self,
        key: &'a K,
        n: u32,
    ) -> impl Future<Output = Result<Admission, AcquireError>> + Send + 'a {
        crate::queue::Acquire::new(KeyedAcquire {
            limiter: self,
            key,
            n,
            overflowed: false,
        })
    }

    #[cfg(feature = "tokio")]
    async fn acquire_slow(
        &self,
        key: &K,
        n: u32,
        overflowed: bool,
    ) -> Result<Admission, AcquireError> {
        self.receipt_slow(key, n, overflowed)
            .await
            .map(|(admission, _, _)| admission)
    }

    /// The wait in `key`'s queue: the head's commit, with what a refund needs (for a receipt;
    /// [`acquire_n`](Self::acquire_n) keeps only the admission). `overflowed`: the fast path
    /// counted the call in `overflowed` already.
    #[cfg(feature = "tokio")]
    pub(crate) async fn receipt_slow(
        &self,
        key: &K,
        n: u32,
        overflowed: bool,
    ) -> Result<Receipt, AcquireError> {
        // Dropped after the wait (declared before it): chain callers held back by this waiter
        // look again once it has given up (see `Watchers::notify_if_given_up`).
        let gave_up = self.inner.watchers.notify_if_given_up();
        let overflow_wait = OverflowWait::new(&self.inner, overflowed);
        loop {
            let wait = self.inner.ctx.waits.key_wait(key);
            let exit = RetireOnExit {
                waits: &self.inner.ctx.waits,
                key,
                wait: &wait,
            };
            let mut timer = crate::queue::Timer::default();
            // Set if the queue was retired before we joined it (see `Waits::wait`).
            let retry = AtomicU64::new(0);
            let outcome = self
                .wait(&wait, n, &retry)
                .run_async(
                    || self.take_versioned(key, n, &overflow_wait),
                    |(admission, committed, _)| self.give_back(key, n, &admission, committed),
                    |cx, nanos| timer.poll(cx, nanos),
                )
                .await;
            drop(exit);
            match outcome {
                // The queue was retired between our lookup and our enqueue: look again. (Any
                // other `Closed` is the limiter's, counted by the queue: we fail.) Relaxed: our
                // own flag.
                Err(AcquireError::Closed) if retry.load(Ordering::Relaxed) != 0 => continue,
                outcome => {
                    gave_up.ended(&outcome);
                    return outcome;
                }
            }
        }
    }

    /// [`acquire_n`](Self::acquire_n) with a time limit; on timeout nothing is consumed.
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
    /// use turnstile::{AcquireError, Algorithm, KeyedLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::SlidingWindow { limit: 1, window: Duration::from_secs(10) },
    ///     TokioClock::new(),
    /// )?;
    /// limiter.acquire(&"k").await?;
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
    ) -> Result<Admission, AcquireError> {
        crate::queue::timeout(timeout, self.acquire_n(key, n)).await
    }

    /// Blocks the calling thread until one permit for `key` is admitted. See
    /// [`acquire_blocking_n`](Self::acquire_blocking_n).
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
    /// use turnstile::{Algorithm, KeyedLimiter, MonotonicClock};
    ///
    /// let limiter = KeyedLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_millis(20) },
    ///     MonotonicClock::new(),
    /// )?;
    /// let first = limiter.acquire_blocking(&1u8)?;
    /// let second = limiter.acquire_blocking(&1u8)?; // key 1's next 20 ms window
    /// let window = |t: Duration| t.as_millis() / 20;
    /// assert!(window(second.at()) > window(first.at()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking(&self, key: &K) -> Result<Admission, AcquireError> {
        self.acquire_blocking_n(key, 1)
    }

    /// Blocks the calling thread until `n` permits for `key` are admitted, in the same per-key
    /// queue as
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n)")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`")]
    /// (async and blocking waiters share it).
    ///
    /// For threads, not async tasks, as
    /// [`RateLimiter::acquire_blocking_n`](crate::RateLimiter::acquire_blocking_n) is: it
    /// stalls the tasks of the thread it blocks, and its head parks for real time, whatever the
    /// limiter's clock.
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
    /// use turnstile::{Algorithm, KeyedLimiter, Rate};
    ///
    /// let limiter = KeyedLimiter::new(Algorithm::TokenBucket { rate: Rate::per_second(1000), burst: 10 })?;
    /// let threads: Vec<_> = (0..4)
    ///     .map(|_| {
    ///         let limiter = limiter.clone();
    ///         std::thread::spawn(move || limiter.acquire_blocking_n(&"shared", 5).map(|_| ()))
    ///     })
    ///     .collect();
    /// for t in threads {
    ///     t.join().unwrap()?;
    /// }
    /// assert_eq!(limiter.stats().admitted, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_n(&self, key: &K, n: u32) -> Result<Admission, AcquireError> {
        self.blocking(key, n, None)
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n) with a time limit (real time); on timeout
    /// nothing is consumed and the waiter leaves the key's queue.
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
    /// let limiter = KeyedLimiter::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(60) })?;
    /// limiter.acquire_blocking(&"k")?;
    /// let late = limiter.acquire_blocking_timeout(&"k", 1, Duration::from_millis(10));
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_timeout(
        &self,
        key: &K,
        n: u32,
        timeout: std::time::Duration,
    ) -> Result<Admission, AcquireError> {
        self.blocking(key, n, std::time::Instant::now().checked_add(timeout))
    }

    fn blocking(
        &self,
        key: &K,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<Admission, AcquireError> {
        let overflowed = match self.acquire_fast(key, n) {
            (Poll::Ready(outcome), _) => return outcome,
            (Poll::Pending, overflowed) => overflowed,
        };
        self.blocking_queued(key, n, deadline, overflowed)
            .map(|(admission, _, _)| admission)
    }

    /// [`blocking`](Self::blocking) for a receipt: the commit, at once or as the head, with
    /// what a refund needs (see [`commit_versioned_where`](Self::commit_versioned_where)).
    pub(crate) fn receipt_blocking(
        &self,
        key: &K,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<Receipt, AcquireError> {
        let overflowed = match self.receipt_fast(key, n) {
            (Poll::Ready(outcome), _) => return outcome,
            (Poll::Pending, overflowed) => overflowed,
        };
        self.blocking_queued(key, n, deadline, overflowed)
    }

    /// The blocking wait in `key`'s queue, once the fast path said to queue up (`overflowed`:
    /// and counted the call in `overflowed`).
    fn blocking_queued(
        &self,
        key: &K,
        n: u32,
        deadline: Option<std::time::Instant>,
        overflowed: bool,
    ) -> Result<Receipt, AcquireError> {
        // As in `receipt_slow`.
        let gave_up = self.inner.watchers.notify_if_given_up();
        let overflow_wait = OverflowWait::new(&self.inner, overflowed);
        loop {
            let wait = self.inner.ctx.waits.key_wait(key);
            let _exit = RetireOnExit {
                waits: &self.inner.ctx.waits,
                key,
                wait: &wait,
            };
            // As in `receipt_slow`.
            let retry = AtomicU64::new(0);
            match self.wait(&wait, n, &retry).run_blocking(
                || self.take_versioned(key, n, &overflow_wait),
                |(admission, committed, _)| self.give_back(key, n, &admission, committed),
                deadline,
            ) {
                // Relaxed: our own flag.
                Err(AcquireError::Closed) if retry.load(Ordering::Relaxed) != 0 => continue,
                outcome => {
                    gave_up.ended(&outcome);
                    return outcome;
                }
            }
        }
    }
}

/// The two halves of [`KeyedLimiter::acquire_n`].
#[cfg(feature = "tokio")]
struct KeyedAcquire<'a, K, C: Clock, S> {
    limiter: &'a KeyedLimiter<K, C, S>,
    key: &'a K,
    n: u32,
    /// The fast path counted the call in `overflowed`.
    overflowed: bool,
}

#[cfg(feature = "tokio")]
impl<'a, K, C: Clock, S> crate::queue::Phases<'a> for KeyedAcquire<'a, K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    type Output = Admission;

    #[inline(always)]
    fn fast(&mut self) -> Poll<Result<Admission, AcquireError>> {
        let (outcome, overflowed) = self.limiter.acquire_fast(self.key, self.n);
        self.overflowed = overflowed;
        outcome
    }

    fn slow(&mut self) -> crate::queue::SlowWait<'a, Admission> {
        Box::pin(self.limiter.acquire_slow(self.key, self.n, self.overflowed))
    }
}

/// Drops a key's queue from the map when a waiter leaves it empty, however the waiter leaves
/// (served, failed, timed out, or its future dropped).
pub(crate) struct RetireOnExit<'a, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    pub(crate) waits: &'a Waits<K, S>,
    pub(crate) key: &'a K,
    pub(crate) wait: &'a Arc<KeyWait>,
}

impl<K, S> Drop for RetireOnExit<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    fn drop(&mut self) {
        self.waits.retire(self.key, self.wait);
    }
}

impl<K, S> Waits<K, S> {
    /// Whether [`close`](Self::close) was called. Only worth asking once [`any`](Self::any)
    /// said yes.
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        // Relaxed: a snapshot, as `any`. Where it must not be missed (a waiter joining a queue
        // that the closing walk does not find), it is read under the queue's mutex after a
        // fence: see `close`.
        self.waiting_keys.load(Ordering::Relaxed) & WAITS_CLOSED != 0
    }
}

impl<K, S> Waits<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    pub(crate) fn new(hasher: S, order: QueueOrder, queue_limit: u64) -> Self {
        Waits {
            map: KeyMap::with_hasher(hasher, &Reclaimer::unflushed()),
            waiting_keys: CachePadded::new(AtomicU64::new(0)),
            order,
            queue_limit,
        }
    }

    /// Whether any key has a queue now.
    #[inline(always)]
    pub(crate) fn any(&self) -> bool {
        // Relaxed: like an unkeyed limiter's gate, a hint read once; a waiter that arrives just
        // after this load is one the caller may precede.
        self.waiting_keys.load(Ordering::Relaxed) != 0
    }

    /// Closes every key's queue for good: sets the closed bit, then fails every queued waiter
    /// with [`AcquireError::Closed`] and wakes it. Later enqueues fail too.
    ///
    /// **No waiter left behind.** A waiter looks up (or creates) its key's queue, fences
    /// (SeqCst: `KeyedLimiter`'s `wait`, `registered` in `keyed_concurrency.rs`, the fences
    /// they make for a reconfiguration), then reads the bit under the queue's mutex as it
    /// enqueues (`Capacity::closed`). We set the bit, fence, then walk the map. Either our walk
    /// finds its queue (and, under the mutex, fails it if it joined first, or leaves the queue
    /// closed so that its enqueue fails), or its enqueue reads the bit. The same pair as
    /// `KeyedLimiter::reconfigure`'s sweep and the capacity read.
    pub(crate) fn close(&self) {
        // Relaxed: the fence below orders it before the walk (and a joining waiter's read of
        // it is ordered by its own fence, see above).
        self.waiting_keys.fetch_or(WAITS_CLOSED, Ordering::Relaxed);
        // SeqCst fence: the pair above, with the one in the limiter's `wait`.
        fence(Ordering::SeqCst);
        self.map.for_each(|_, wait| wait.queue.close(&wait.gate));
    }

    /// Whether `key` has waiters queued now.
    pub(crate) fn has_waiters(&self, key: &K) -> bool {
        self.map
            .get(key, |w| w.gate.load(Ordering::Relaxed) & WAITERS != 0)
            .unwrap_or(false)
    }

    /// What `key`'s waiters will take (see [`WaitQueue::queued`]); nothing if it has no queue.
    pub(crate) fn queued_on(&self, key: &K) -> Queued {
        self.map.get(key, |w| w.queue.queued()).unwrap_or_default()
    }

    /// Keys that have a wait queue now, and the waiters and permits queued over all of them.
    pub(crate) fn queued(&self) -> (usize, usize, u64) {
        let (mut keys, mut waiters, mut permits) = (0, 0, 0);
        self.map.for_each(|_, w| {
            let (n, p) = w.queue.len();
            keys += 1;
            waiters += n;
            permits += p;
        });
        (keys, waiters, permits)
    }

    /// The queue of `key`, created if it has none.
    pub(crate) fn key_wait(&self, key: &K) -> Arc<KeyWait> {
        if let Some(wait) = self.map.get(key, Arc::clone) {
            return wait;
        }
        let fresh = Arc::new(KeyWait {
            gate: AtomicU64::new(0),
            queue: WaitQueue::new(self.order, self.queue_limit),
        });
        // Counted before the insert (and uncounted if another call inserted first): once the
        // queue is in the map, a waiter of the same key can find it, give up and retire it,
        // uncounting it. Counted after the insert, that decrement could come first and take the
        // count from 0 to `u64::MAX`, setting the closed bit it shares a word with: until our
        // increment, every call of every key failed `Closed`
        // (`waiters_creating_and_retiring_queues_never_make_the_limiter_look_closed`).
        // Relaxed: the retirer found the queue through the map, which our increment, sequenced
        // before the insert, happens before; so the increment precedes its decrement in the
        // count's modification order (coherence), and the count never goes below zero.
        self.waiting_keys.fetch_add(1, Ordering::Relaxed);
        // Should the key's `Clone` panic, or its `Hash` or `Eq` inside the map's insert (which
        // then inserts nothing), the count is taken back as the panic unwinds: kept, it stayed
        // one high for good, and every `try_acquire` of every key paid the waiters' lookup.
        let uncount = UncountOnUnwind(&self.waiting_keys);
        let (wait, inserted) = self.map.insert_then(key.clone(), fresh, |wait, _| {
            // The map has placed the key (ours inserted, or another's found): counted right.
            std::mem::forget(uncount);
            Arc::clone(wait)
        });
        if !inserted {
            // Relaxed: our own increment just above, sequenced before.
            self.waiting_keys.fetch_sub(1, Ordering::Relaxed);
        }
        wait
    }

    /// Drops `key`'s queue `wait` from the map if it is empty: closes it first (so that nobody
    /// joins it afterwards), then removes it unless someone else already has.
    pub(crate) fn retire(&self, key: &K, wait: &Arc<KeyWait>) {
        // Relaxed: a hint; `close_if_idle` decides under the queue's mutex.
        if wait.gate.load(Ordering::Relaxed) & WAITERS != 0 || !wait.queue.close_if_idle(&wait.gate)
        {
            return;
        }
        if self.map.remove_if(key, |w| Arc::ptr_eq(w, wait)) {
            // Relaxed: as in `key_wait`.
            self.waiting_keys.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A waiting call's view of `wait`.
    ///
    /// `capacity` is the limiter's, read as the waiter joins the queue, under its mutex: a key's
    /// queue is swept by a lowering of the limit only if the sweep's walk of the map finds it,
    /// and it may be created, or joined, just after (see `Wait::capacity`). The caller fences
    /// between its lookup of `wait` and this enqueue, pairing with the fence its sweeper makes
    /// between storing the new limit and walking the map.
    ///
    /// `retry`: set to 1 if the enqueue found `wait` retired while the limiter is open, uncounted
    /// (see `Wait::retry_closed`): the caller then looks its key up again. A caller that read
    /// the limiter's closed bit itself instead could read it set by a `close` landing just
    /// after, and return that uncounted `Closed`.
    pub(crate) fn wait<'a>(
        &self,
        wait: &'a KeyWait,
        counters: &'a Counters,
        n: u32,
        capacity: &'a dyn Capacity,
        retry: &'a AtomicU64,
    ) -> Wait<'a> {
        Wait {
            queue: &wait.queue,
            gate: &wait.gate,
            counters,
            permits: n,
            retry_closed: Some(retry),
            capacity: Some(capacity),
            room: None,
        }
    }
}

/// A `try_acquire` failure seen by a waiter (never `Rejected`: a waiter waits instead).
pub(crate) fn waiting_error(error: TryAcquireError) -> AcquireError {
    // The store never answers `Closed` (a retired cell is retried inside it): `Closed` is the
    // limiter's `close`, and a rejection here (which a waiter never sees) says closed too.
    error.wait_or_fail().err().unwrap_or(AcquireError::Closed)
}

/// What a [`KeyedChain`](crate::KeyedChain) needs from a keyed member.
impl<K, C: Clock, S> KeyedLimiter<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Without `COMMIT`: would `key` admit `n.max(1)` permits (`n == 0`: the member's own probe)?
    /// With it: takes them. Counts nothing but a call that meets the key cap, in `overflowed`
    /// (a commit's or a probe's decision at the cap, a check's refusal there: the call ends on
    /// it). The flag says the shared overflow cell decided. Like `try_acquire`, refuses while
    /// `key` has waiters served oldest first (no barging).
    pub(crate) fn chain_decide<const COMMIT: bool>(
        &self,
        key: &K,
        n: u32,
    ) -> (Result<Admission, TryAcquireError>, Committed) {
        let (decision, committed, _) = self.chain_decide_counting::<COMMIT, true>(key, n);
        (decision, committed)
    }

    /// [`chain_decide`](Self::chain_decide) for a chain, which counts a call in `overflowed`
    /// itself, once per call however many of its decisions meet the cap (its attempts, its
    /// check and its commit): counts nothing here, and also says whether this decision met the
    /// key cap (the shared overflow cell decided it, admission or refusal, even in a check,
    /// or `TooManyKeys`).
    pub(crate) fn chain_decide_uncounted<const COMMIT: bool>(
        &self,
        key: &K,
        n: u32,
    ) -> (Result<Admission, TryAcquireError>, Committed, bool) {
        self.chain_decide_counting::<COMMIT, false>(key, n)
    }

    /// [`chain_decide`](Self::chain_decide), counting a call that meets the cap in
    /// `overflowed` as it says if `COUNTED`, and nothing otherwise; and whether the call met
    /// the cap (see [`chain_decide_uncounted`](Self::chain_decide_uncounted)).
    fn chain_decide_counting<const COMMIT: bool, const COUNTED: bool>(
        &self,
        key: &K,
        n: u32,
    ) -> (Result<Admission, TryAcquireError>, Committed, bool) {
        let met_cap = |decision: &Result<Admission, TryAcquireError>, overflow: bool| {
            overflow || matches!(decision, Err(TryAcquireError::TooManyKeys { .. }))
        };
        let inner = &*self.inner;
        if inner.ctx.waits.any() && inner.ctx.waits.is_closed() {
            return (Err(TryAcquireError::Closed), Committed::default(), false);
        }
        if self.held_back(key) {
            // Nothing to refund; `overflow` says who refused it, as for a commit.
            let queued = inner.ctx.waits.queued_on(key);
            let (refused, overflow) = self.refused_behind(key, n, queued, COUNTED);
            let committed = Committed {
                overflow,
                ..Committed::default()
            };
            let refused = Err(refused);
            let met = met_cap(&refused, overflow);
            return (refused, committed, met);
        }
        if inner.ctx.waits.any()
            && let Some(heads) = self.behind_overflow_heads(key, n)
        {
            let (refused, overflow) = self.refused_behind(key, n, heads, COUNTED);
            let committed = Committed {
                overflow,
                ..Committed::default()
            };
            let refused = Err(refused);
            let met = met_cap(&refused, overflow);
            return (refused, committed, met);
        }
        let shard = self.shard(key);
        if COMMIT || n == 0 {
            let (decision, committed) = with_store!(
                &inner.store, s => s.chain_commit::<COUNTED, C>(&inner.ctx, shard, key, n)
            );
            let met = met_cap(&decision, committed.overflow);
            (decision, committed, met)
        } else {
            let count = match COUNTED {
                true => CountOverflow::IfRefused,
                false => CountOverflow::Never,
            };
            let (outcome, shared) =
                with_store!(&inner.store, s => s.chain_check(&inner.ctx, shard, key, n, count));
            let met = met_cap(&outcome, shared);
            (outcome, Committed::default(), met)
        }
    }

    /// Gives back an admission `chain_decide::<true>` returned, with what it returned beside.
    pub(crate) fn chain_refund(
        &self,
        key: &K,
        n: u32,
        admission: &Admission,
        committed: Committed,
    ) {
        let inner = &*self.inner;
        let shard = self.shard(key);
        with_store!(&inner.store, s => s.chain_refund(&inner.ctx, shard, key, n, admission, committed));
    }

    /// The parameters' version now, read by a receipt before its admission
    /// ([`try_acquire_refundable`](Self::try_acquire_refundable)).
    pub(crate) fn params_version(&self) -> u64 {
        with_store!(&self.inner.store, s => s.algo.version())
    }

    /// [`chain_refund`](Self::chain_refund) for a receipt: only if the parameters are still
    /// those of `version`, read before the admission, checked and refunded under the
    /// reconfiguration mutex (see `RateLimiter::receipt_refund`).
    pub(crate) fn receipt_refund(
        &self,
        key: &K,
        n: u32,
        admission: &Admission,
        committed: Committed,
        version: u64,
    ) {
        let _reconfiguring = lock(&self.inner.algorithm);
        if self.params_version() == version {
            self.chain_refund(key, n, admission, committed);
        }
    }

    /// Wakes the head waiting on `key`'s queue, if one waits, after a chain refund gave the key
    /// permits back: a waiter that queued while the chain held them sleeps until its own timer
    /// (the window's turn), and `try_acquire` defers to it meanwhile. As `reset` does. A waiter
    /// whose queue this look-up misses (made just now) makes its first attempt after it, on the
    /// refunded state; at worst a head sleeps until its timer, as without the wake. Chain
    /// callers sleeping on this limiter are told as well (`crate::watchers`), all but `except`,
    /// the caller whose refund this is.
    ///
    /// `overflow`: the refund went to the shared overflow cell ([`Committed::overflow`]), whose
    /// waiters wait in their own keys' queues, any key's: then every queue's head is woken, as a
    /// keyed concurrency limiter wakes them when its shared pool frees (rare: only at the key
    /// cap). Waking only `key`'s left them asleep until their timers (a whole window, two for
    /// the sliding counter) with the permits free. A head whose key has a cell of its own looks
    /// again and sleeps on.
    ///
    /// A refund that left `key`'s own cell idle, or took it back, at the key cap under
    /// [`KeyOverflow::Shared`] wakes every queue's head too, as a [`reset`](Self::reset) does:
    /// the key's slot can now be had, and a head of a key past the cap waiting on the shared
    /// cell slept until that cell's `retry_after` (or the time the last search for room had
    /// computed), while a newcomer took the slot at once.
    pub(crate) fn chain_wake(&self, key: &K, overflow: bool, except: Option<&Watcher>) {
        let _watchers = self.inner.watchers.notify_on_drop_except(except);
        if overflow || self.refund_freed_room(key) {
            self.wake_every_head();
        } else if let Some(wait) = self.inner.ctx.waits.map.get(key, Arc::clone) {
            wait.queue.wake_head();
        }
    }

    /// Whether a refund on `key`'s own cell (just made) may have freed room under the key cap
    /// for heads of other keys waiting on the shared overflow cell (see
    /// [`chain_wake`](Self::chain_wake)): under [`KeyOverflow::Shared`], with some key waiting
    /// and the cap reached (or left by one key, the refunded one taken back), `key` has no
    /// waiters (which keep its cell from eviction) and its cell is gone or idle. A snapshot:
    /// a wrong guess costs a wasted look by each head, or a head asleep until its timer, as
    /// before.
    fn refund_freed_room(&self, key: &K) -> bool {
        let ctx = &self.inner.ctx;
        ctx.overflow == KeyOverflow::Shared
            && ctx.waits.any()
            // Relaxed: a snapshot of a count, as `available` reads it.
            && ctx.keys.load(Ordering::Relaxed) + 1 >= ctx.max_keys as u64
            && !ctx.waits.has_waiters(key)
            && self
                .held_available(key)
                .is_none_or(|free| free >= self.inner.algorithm_limit())
    }

    /// Wakes the head of every key's queue: the shared overflow cell got permits back, and its
    /// waiters wait in their own keys' queues, any key's. Every head is woken even if a `Waker`
    /// panics (see `WakeAll`; inside an unwind the second panic is dropped, not let out).
    fn wake_every_head(&self) {
        self.inner.wake_every_head();
    }

    /// Undoes the admission a served head took when handing its turn over unwound (the next
    /// waiter's `Waker` panicked; see `Wait::run_async`). Given back to the shared overflow
    /// cell, it wakes every key's head, as a chain's refund to that cell does
    /// ([`chain_wake`](Self::chain_wake)): a head of another overflow key that looked while
    /// the admission was held sleeps until the cell's `retry_after` otherwise, with the permits
    /// free. Its own key's head is woken again by the queue (see `Granted` in `queue.rs`).
    fn give_back(&self, key: &K, n: u32, admission: &Admission, committed: Committed) {
        // The chain callers sleeping on this limiter are told too (after the refund, as
        // `chain_wake` tells them).
        let _watchers = self.inner.watchers.notify_on_drop();
        let overflow = committed.overflow;
        self.chain_refund(key, n, admission, committed);
        if overflow {
            self.wake_every_head();
        }
    }

    /// The chain callers sleeping on this limiter.
    pub(crate) fn chain_watchers(&self) -> &Watchers {
        &self.inner.watchers
    }

    /// [`chain_watchers`](Self::chain_watchers), for the loom model of a sweep that frees room
    /// under the key cap while a chain caller waits (`loom-tests/loom_chain.rs`).
    #[cfg(turnstile_loom)]
    #[doc(hidden)]
    pub fn watchers_for_model(&self) -> &Watchers {
        self.chain_watchers()
    }

    /// Whether `other` is a handle to this very limiter (a chain member listed twice).
    pub(crate) fn chain_same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether refunds are exact (every algorithm but the exact sliding window).
    pub(crate) fn chain_exact_refund(&self) -> bool {
        with_store!(&self.inner.store, s => s.algo.exact_refund())
    }

    /// [`Algo::beyond_limit`] now, for a chain's refusal behind its queue.
    pub(crate) fn chain_beyond_limit(&self, at_limit: u64, extra: u64) -> u64 {
        let now = self.inner.ctx.clock.now();
        with_store!(&self.inner.store, s => s.algo.beyond_limit(now, at_limit, extra))
    }

    /// The most permits one call can get.
    pub(crate) fn chain_capacity(&self) -> u32 {
        with_store!(&self.inner.store, s => s.algo.limit())
    }

    /// Counts one chain call on this member's statistics.
    pub(crate) fn chain_count(&self, which: usize) {
        self.inner.ctx.counters.bump(which);
    }

    /// Brings the clock up to date before a retry after sleeping.
    pub(crate) fn chain_catch_up(&self) {
        self.inner.ctx.clock.catch_up();
    }
}
