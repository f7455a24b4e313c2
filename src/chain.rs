//! [`Chain`] and `KeyedChain`: several limits at once, admitted only if every member admits.
//!
//! **Design: check, then commit with refund.** A call runs in two passes over the members:
//!
//! 1. *check*: every member decides `n` permits without taking them (no writes). If any rejects,
//!    the call is rejected with the largest `retry_after` among the members, and nothing was
//!    written anywhere: a chain's denials are as free as a single limiter's.
//! 2. *commit*: the members take their permits one after the other. If one rejects now (another
//!    thread took what the check saw), every member that already took its permits is given them
//!    back (`Algo::refund`), and the call is rejected.
//!
//! Sequentially the commit never fails after a successful check (every algorithm only gets more
//! permissive as time passes with nothing admitted), so refunds happen only when calls race, or
//! in a `KeyedChain` at a per-key member's key cap with no idle key to evict: its check lets a
//! new key through until a search for room has failed (a check creates no key and searches for
//! none), and its commit then refuses it (`TooManyKeys`, or the shared overflow cell's refusal)
//! after the members before it admitted.
//! Refunds are exact for the fixed window, the sliding counter (before its window rolls over)
//! and the token bucket (when the clock has not moved since the admission), and conservative
//! otherwise; the exact sliding window's refund is positional (a refunded permit comes back once
//! the admissions before it have left the window), so sliding-window members are committed last:
//! with one of them, it is never refunded. ARCHITECTURE.md has the argument per algorithm.
//!
//! Why not check-then-commit alone, or locks: a check is stale the moment it is made, and a lock
//! over several limiters would put a shared write on every call, including every denial.
//!
//! **Charges** (`charge`: usage recorded after the fact) take neither pass: nothing is
//! rejected, so nothing needs checking first or giving back. Every member's own `charge` runs,
//! and a member that fails (closed, or a key cap under `KeyOverflow::Reject`) is reported after
//! the others were charged; the protocol is the members' own, with nothing shared added.
//!
//! **Waiting** (`acquire_n`, `acquire_blocking_n`): fair among chain callers, not across
//! members. A chain (per key, for a `KeyedChain`) has its own FIFO queue of waiting chain
//! callers ([`Line`]): room in it taken from a `ConcurrencyLimiter` of `queue_limit` permits,
//! the turn from a `ConcurrencyLimiter` of 1 (keyed concurrency limiters, per key), so that
//! ordering, bounds, cancellation and the handoff are that limiter's loom-checked queue. Only
//! the caller whose turn it is runs the attempt/sleep loop; a newcomer's `try_acquire` is
//! refused while anyone waits (one load when nobody does). Why not the members' queues:
//! ARCHITECTURE.md, "Waiting" under the chain.
//!
//! **Receipts** (`try_acquire_refundable` and its waiting counterparts, in `refund`): the same
//! attempt, which also reads every member's parameters' version before it decides and keeps each
//! member's admission, so that a later refund can give each member its permits back under that
//! member's own receipt's rules ([`ChainRefundable`], `KeyedChainRefundable`).

use crate::clock::{Clock, DefaultClock};
use crate::concurrency::ConcurrencyLimiter;
use crate::decision::{Admission, Rejection};
use crate::error::{AcquireError, ConfigError, TryAcquireError};
#[cfg(feature = "keyed")]
use crate::keyed::KeyedLimiter;
#[cfg(feature = "keyed")]
use crate::keyed_concurrency::KeyedConcurrencyLimiter;
use crate::limiter::RateLimiter;
use crate::queue::DEFAULT_QUEUE_LIMIT;
#[cfg(feature = "keyed")]
use crate::sync::OVERFLOWED;
use crate::sync::Signal;
use crate::sync::{ADMITTED, Arc, CANCELLED, Counters, REFUNDED, REJECTED, WakeAll};
use crate::watchers::{Watcher, Watchers};
use std::fmt;
#[cfg(feature = "keyed")]
use std::hash::{BuildHasher, Hash};

mod refund;
pub use refund::ChainRefundable;
#[cfg(feature = "keyed")]
pub use refund::KeyedChainRefundable;

/// What a member's commit returns beside its decision, for a refund of it: for a keyed member,
/// whether the shared overflow cell decided (the refund goes there), and the limiter's reset
/// count before the commit (a refund a reset overlapped is dropped: `Keyed::chain_refund`).
/// Nothing for an unkeyed member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Committed {
    /// The shared overflow cell of a keyed limiter at its key cap decided.
    pub(crate) overflow: bool,
    /// The keyed limiter's `Ctx::resets` when the commit began.
    pub(crate) resets: u64,
}

/// A chain's queue of waiting chain callers: one for a [`Chain`], one per key for a
/// `KeyedChain`. A caller that must wait first takes its room ([`join`](Self::join), held until
/// its call ends), then waits for its turn (`turn`: oldest first, in a
/// [`ConcurrencyLimiter`] of 1, whose queue async and blocking callers share); only the caller
/// whose turn it is makes attempts and sleeps between them. Dropping the turn (admitted, failed,
/// timed out, or its future dropped) hands it to the next caller at once, and dropping the room
/// frees it.
///
/// What a caller holds (its room, its turn) is type-erased ([`Held`]), and so is the future of
/// `turn`: a keyed line's permits, and its implementation of this trait, require
/// `K: 'static`, and a chain `acquire` future holding such a type across an await (or naming it
/// through an associated type of this trait) is not provably `Send` for a key type with a
/// lifetime (`&'static str`): the compiler checks a future's `Send` for every lifetime in it.
trait Line<Q: ?Sized>: Send + Sync {
    /// Whether chain callers wait on `key` now (a hint: see the implementations). A call that
    /// finds them does not barge.
    fn busy(&self, key: &Q) -> bool;
    /// Room for a caller of `n` permits (a probe takes one), or `QueueFull`.
    fn join(&self, key: &Q, n: u32) -> Result<Held<'_>, AcquireError>;
    /// `key`'s turn now, if nobody holds it or waits for it.
    fn try_turn(&self, key: &Q) -> Option<Held<'_>>;
    /// Waits for `key`'s turn, in arrival order. Boxed (only callers that wait make one), for
    /// the reason above.
    #[cfg(feature = "tokio")]
    fn turn<'a>(&'a self, key: &'a Q) -> TurnFuture<'a>;
    /// `turn` on the calling thread, until `deadline` if any (then `Timeout`).
    fn turn_blocking(
        &self,
        key: &Q,
        deadline: Option<std::time::Instant>,
    ) -> Result<Held<'_>, AcquireError>;
    /// Chain callers waiting now: each from before it takes its room until after it has given
    /// its room back (so the one whose turn it is, too).
    fn waiting(&self) -> u64;
    /// The permits the chain callers waiting on `key` now ask for, counting only the calls of
    /// at most `capacity` permits (none for a probe, which holds one of the room but takes
    /// nothing); a snapshot, for a refusal's retry-after. A larger call, which a member's
    /// reconfiguration left too big for the chain, fails when its turn comes and takes nothing
    /// (as its own first attempt would have), so it holds nobody back.
    fn queued(&self, key: &Q, capacity: u32) -> u64;
    /// The most permits that may wait at once (per key).
    fn queue_limit(&self) -> u64;
}

/// What [`Line::turn`] returns.
#[cfg(feature = "tokio")]
type TurnFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Held<'a>, AcquireError>> + Send + 'a>,
>;

/// What a waiting caller holds while it waits (its room, its turn), type-erased (see
/// [`Line`]); dropping it gives it back.
type Held<'a> = Box<dyn Send + 'a>;

/// `QueueFull` for a caller of `n` permits.
fn queue_full(n: u32, queue_limit: u64) -> AcquireError {
    AcquireError::QueueFull {
        requested: n,
        queue_limit,
    }
}

/// The room limiter of a queue limit: `queue_limit` permits (at most `u32::MAX`); none for a
/// limit of 0 (nobody waits).
fn room_limit(queue_limit: u64) -> u32 {
    u32::try_from(queue_limit).unwrap_or(u32::MAX)
}

/// A [`Chain`]'s queue.
///
/// **The gate is one load.** Every waiting caller holds its room (`n` permits of `room`) from
/// before it queues for its turn until after it has given the turn up, so "someone waits" is
/// "`room` has permits in use": [`ConcurrencyLimiter::in_use`], one Relaxed load of `room`'s
/// permit word, on a word that only waiting callers write. Relaxed is enough, as for a
/// limiter's own `WAITERS` gate: the flag is a hint nothing else is read by, and a caller that
/// misses a waiter that took its room just after its load was not behind it (it made its own
/// attempt first).
///
/// **`waiting` is a count of callers**, kept as permits of `count` (one per caller, as a
/// `KeyedLine` keeps it): taken before the room, given back after it ([`CountedRoom`]), so a
/// caller is counted for as long as it holds its room, its gap between room and turn and its
/// turn given up included. Only callers that wait pay for it; the gate still loads `room` alone.
/// The turn limiter's holder and queue, counted instead, left out a caller in either gap.
pub(crate) struct ChainLine {
    count: ConcurrencyLimiter,
    room: Option<ConcurrencyLimiter>,
    turn: ConcurrencyLimiter,
    queue_limit: u64,
    /// The waiting callers by the permits they ask for (a probe, `n == 0`, asks for none but
    /// holds one permit of `room`), for [`Line::queued`]: `room` alone cannot tell a call that
    /// a member's reconfiguration left too big, and will take nothing, from one that will
    /// take its permits. Under a mutex that only waiting callers (twice each) and refusals
    /// behind them take; a caller that does not wait never touches it.
    sizes: crate::sync::Mutex<Sizes>,
}

/// A line's waiting callers: how many ask for each number of permits.
type Sizes = std::collections::BTreeMap<u32, u64>;

/// The permits asked for by the callers of `sizes` whose calls fit `capacity` (probes take
/// none).
fn fitting(sizes: &Sizes, capacity: u32) -> u64 {
    if capacity == 0 {
        return 0;
    }
    sizes
        .range(1..=capacity)
        .map(|(&n, &callers)| u64::from(n).saturating_mul(callers))
        .fold(0, u64::saturating_add)
}

/// Counts one caller of `n` permits in `sizes`, or takes it off.
fn tally(sizes: &mut Sizes, n: u32, up: bool) {
    if up {
        *sizes.entry(n).or_insert(0) += 1;
    } else if let Some(callers) = sizes.get_mut(&n) {
        *callers -= 1;
        if *callers == 0 {
            sizes.remove(&n);
        }
    }
}

/// A waiting caller's entry in its line's sizes ([`ChainLine::sizes`], `KeyQueues::sizes`),
/// taken off when its call ends.
struct Waiter<'a, T: SizeCount>(&'a T, T::Key, u32);

/// Where a line counts its waiting callers by size.
trait SizeCount {
    type Key;
    fn add(&self, key: &Self::Key, n: u32, up: bool);
}

impl<T: SizeCount> Drop for Waiter<'_, T> {
    fn drop(&mut self) {
        self.0.add(&self.1, self.2, false);
    }
}

impl SizeCount for ChainLine {
    type Key = ();
    fn add(&self, _: &(), n: u32, up: bool) {
        tally(&mut crate::sync::lock(&self.sizes), n, up);
    }
}

impl ChainLine {
    fn new(queue_limit: u64) -> Result<Self, ConfigError> {
        let room = match room_limit(queue_limit) {
            0 => None,
            permits => Some(
                ConcurrencyLimiter::builder(permits)
                    .queue_limit(0)
                    .build()?,
            ),
        };
        Ok(ChainLine {
            // One permit per waiting caller; each holds at least one of `room`'s (at most
            // `u32::MAX`), so this never refuses.
            count: ConcurrencyLimiter::builder(u32::MAX)
                .queue_limit(0)
                .build()?,
            room,
            // Unbounded: the room bounds it.
            turn: ConcurrencyLimiter::builder(1)
                .queue_limit(u64::MAX)
                .build()?,
            queue_limit,
            sizes: crate::sync::Mutex::new(Sizes::new()),
        })
    }
}

impl<Q: ?Sized> Line<Q> for ChainLine {
    #[inline(always)]
    fn busy(&self, _: &Q) -> bool {
        self.room.as_ref().is_some_and(ConcurrencyLimiter::in_use)
    }

    fn join(&self, _: &Q, n: u32) -> Result<Held<'_>, AcquireError> {
        let full = || queue_full(n, self.queue_limit);
        let room = self.room.as_ref().ok_or_else(full)?;
        let count = self.count.try_acquire().map_err(|_| full())?;
        let room = room.try_acquire_n(n.max(1)).map_err(|_| full())?;
        self.add(&(), n, true);
        // Dropped in this order: the caller's size first, so it never counts a caller that
        // holds no room.
        Ok(Box::new(CountedRoom {
            _room: (Waiter(self, (), n), room),
            _count: count,
        }))
    }

    fn try_turn(&self, _: &Q) -> Option<Held<'_>> {
        let turn = self.turn.try_acquire().ok()?;
        Some(Box::new(turn))
    }

    #[cfg(feature = "tokio")]
    fn turn<'a>(&'a self, _: &'a Q) -> TurnFuture<'a> {
        Box::pin(async move {
            let turn = self.turn.acquire().await?;
            Ok(Box::new(turn) as Held<'a>)
        })
    }

    fn turn_blocking(
        &self,
        _: &Q,
        deadline: Option<std::time::Instant>,
    ) -> Result<Held<'_>, AcquireError> {
        let turn = self.turn.acquire_blocking_until(1, deadline)?;
        Ok(Box::new(turn))
    }

    fn waiting(&self) -> u64 {
        u64::from(u32::MAX - self.count.available())
    }

    fn queued(&self, _: &Q, capacity: u32) -> u64 {
        fitting(&crate::sync::lock(&self.sizes), capacity)
    }

    fn queue_limit(&self) -> u64 {
        self.queue_limit
    }
}

/// A [`KeyedChain`]'s queues, one per key: [`ChainLine`]'s room and turn per key, in keyed
/// concurrency limiters (a key's entries are evicted once idle: [`KeyQueues`]), plus `count`,
/// where every waiting caller of every key holds one permit, so that the gate of a call on a
/// chain where nobody waits is one load (as a keyed limiter's `Waits::any`), and only then a
/// lookup of the key's room. Relaxed, for the reasons given on [`ChainLine`].
///
/// The per-key queues are made by the first caller that waits: a keyed limiter is a few MiB of
/// shards at its default key cap, which a chain whose callers never wait (or a program that
/// makes many chains) should not pay for. They sit behind a trait object, `Send` and `Sync`
/// whatever the key type: the keyed limiters are `Sync` only for `K: 'static`, and a chain
/// `acquire` future that holds its chain across an await would not be provably `Send` for a
/// key type with a lifetime (`&'static str`): the compiler checks a future's `Send` for every
/// lifetime in it.
#[cfg(feature = "keyed")]
pub(crate) struct KeyedLine<K> {
    count: ConcurrencyLimiter,
    keys: std::sync::OnceLock<Box<dyn KeyLines<K> + Send + Sync>>,
    queue_limit: u64,
}

/// A chain caller's room and its count in `waiting` (a [`ChainLine`]'s, or a `KeyedLine`'s
/// over every key): dropped in this order, the room first, so that the count stays up while
/// the room is held.
struct CountedRoom<'a, R> {
    _room: R,
    _count: crate::concurrency::Permit<'a>,
}

/// The per-key half of a [`KeyedLine`].
#[cfg(feature = "keyed")]
trait KeyLines<K> {
    fn busy(&self, key: &K) -> bool;
    fn queued(&self, key: &K, capacity: u32) -> u64;
    fn join(&self, key: &K, n: u32, queue_limit: u64) -> Result<Held<'_>, AcquireError>;
    fn try_turn(&self, key: &K) -> Option<Held<'_>>;
    #[cfg(feature = "tokio")]
    fn turn<'a>(&'a self, key: &'a K) -> TurnFuture<'a>;
    fn turn_blocking(
        &self,
        key: &K,
        deadline: Option<std::time::Instant>,
    ) -> Result<Held<'_>, AcquireError>;
}

/// [`KeyLines`]: per key, room (`None` for a queue limit of 0) and turn.
#[cfg(feature = "keyed")]
struct KeyQueues<K> {
    room: Option<KeyedConcurrencyLimiter<K>>,
    turn: KeyedConcurrencyLimiter<K>,
    /// Per key, its waiting callers by size, as [`ChainLine::sizes`]: only keys that have
    /// some.
    sizes: crate::sync::Mutex<std::collections::HashMap<K, Sizes>>,
}

#[cfg(feature = "keyed")]
impl<K: Hash + Eq + Clone> SizeCount for KeyQueues<K> {
    type Key = K;
    fn add(&self, key: &K, n: u32, up: bool) {
        let mut sizes = crate::sync::lock(&self.sizes);
        if up {
            tally(sizes.entry(key.clone()).or_default(), n, true);
        } else if let Some(of_key) = sizes.get_mut(key) {
            tally(of_key, n, false);
            if of_key.is_empty() {
                sizes.remove(key);
            }
        }
    }
}

#[cfg(feature = "keyed")]
impl<K> KeyLines<K> for KeyQueues<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    fn busy(&self, key: &K) -> bool {
        self.room.as_ref().is_some_and(|room| room.in_use(key))
    }

    fn queued(&self, key: &K, capacity: u32) -> u64 {
        let sizes = crate::sync::lock(&self.sizes);
        sizes.get(key).map_or(0, |of_key| fitting(of_key, capacity))
    }

    fn join(&self, key: &K, n: u32, queue_limit: u64) -> Result<Held<'_>, AcquireError> {
        let full = || queue_full(n, queue_limit);
        let room = self.room.as_ref().ok_or_else(full)?;
        let room = room.try_acquire_n(key, n.max(1)).map_err(|e| match e {
            crate::error::TryPermitError::TooManyKeys { max_keys } => {
                AcquireError::TooManyKeys { max_keys }
            }
            _ => full(),
        })?;
        self.add(key, n, true);
        // Dropped in this order, as for `ChainLine`'s.
        Ok(Box::new((Waiter(self, key.clone(), n), room)))
    }

    fn try_turn(&self, key: &K) -> Option<Held<'_>> {
        let turn = self.turn.try_acquire(key).ok()?;
        Some(Box::new(turn))
    }

    #[cfg(feature = "tokio")]
    fn turn<'a>(&'a self, key: &'a K) -> TurnFuture<'a> {
        Box::pin(async move {
            let turn = self.turn.acquire(key).await?;
            Ok(Box::new(turn) as Held<'a>)
        })
    }

    fn turn_blocking(
        &self,
        key: &K,
        deadline: Option<std::time::Instant>,
    ) -> Result<Held<'_>, AcquireError> {
        let turn = self.turn.acquire_blocking_until(key, 1, deadline)?;
        Ok(Box::new(turn))
    }
}

#[cfg(feature = "keyed")]
impl<K> KeyedLine<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    fn new(queue_limit: u64) -> Result<Self, ConfigError> {
        Ok(KeyedLine {
            count: ConcurrencyLimiter::builder(u32::MAX)
                .queue_limit(0)
                .build()?,
            keys: std::sync::OnceLock::new(),
            queue_limit,
        })
    }

    /// The per-key queues, made on first use; `QueueFull` (for a caller of `n`) in the case,
    /// which cannot happen, that they cannot be built.
    fn queues(&self, n: u32) -> Result<&(dyn KeyLines<K> + Send + Sync), AcquireError> {
        if let Some(keys) = self.keys.get() {
            return Ok(&**keys);
        }
        let full = |_| queue_full(n, self.queue_limit);
        let room = match room_limit(self.queue_limit) {
            0 => None,
            permits => Some(
                KeyedConcurrencyLimiter::builder(permits)
                    .queue_limit(0)
                    .build()
                    .map_err(full)?,
            ),
        };
        let turn = KeyedConcurrencyLimiter::builder(1)
            .queue_limit(u64::MAX)
            .build()
            .map_err(full)?;
        // A racing first caller may have made them too: one of the two is kept.
        let sizes = crate::sync::Mutex::new(std::collections::HashMap::new());
        Ok(&**self
            .keys
            .get_or_init(|| Box::new(KeyQueues { room, turn, sizes })))
    }
}

#[cfg(feature = "keyed")]
impl<K> Line<K> for KeyedLine<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    #[inline(always)]
    fn busy(&self, key: &K) -> bool {
        self.count.in_use() && self.busy_key(key)
    }

    fn join(&self, key: &K, n: u32) -> Result<Held<'_>, AcquireError> {
        if self.queue_limit == 0 {
            return Err(queue_full(n, 0));
        }
        let count = self
            .count
            .try_acquire()
            .map_err(|_| queue_full(n, self.queue_limit))?;
        let room = self.queues(n)?.join(key, n, self.queue_limit)?;
        Ok(Box::new(CountedRoom {
            _room: room,
            _count: count,
        }))
    }

    // The turn is asked for only after `join` made the queues.
    fn try_turn(&self, key: &K) -> Option<Held<'_>> {
        self.queues(1).ok()?.try_turn(key)
    }

    #[cfg(feature = "tokio")]
    fn turn<'a>(&'a self, key: &'a K) -> TurnFuture<'a> {
        match self.queues(1) {
            Ok(keys) => keys.turn(key),
            Err(error) => Box::pin(std::future::ready(Err(error))),
        }
    }

    fn turn_blocking(
        &self,
        key: &K,
        deadline: Option<std::time::Instant>,
    ) -> Result<Held<'_>, AcquireError> {
        self.queues(1)?.turn_blocking(key, deadline)
    }

    fn waiting(&self) -> u64 {
        u64::from(u32::MAX - self.count.available())
    }

    fn queued(&self, key: &K, capacity: u32) -> u64 {
        self.keys.get().map_or(0, |keys| keys.queued(key, capacity))
    }

    fn queue_limit(&self) -> u64 {
        self.queue_limit
    }
}

#[cfg(feature = "keyed")]
impl<K> KeyedLine<K> {
    /// The per-key half of [`busy`](Line::busy), once some key has waiters.
    #[cold]
    #[inline(never)]
    fn busy_key(&self, key: &K) -> bool {
        self.keys.get().is_some_and(|keys| keys.busy(key))
    }
}

/// One member of a chain, as the chain's core sees it. `Q` is the key type (`()` for unkeyed
/// chains).
trait Member<Q: ?Sized> {
    /// Without `COMMIT`: would the member admit `n.max(1)` permits now (`n == 0`: its own probe)?
    /// Writes nothing. With it: takes them, and says what a refund needs ([`Committed`]).
    /// Counts nothing in a keyed member's `overflowed`; the last value says whether the
    /// decision met a per-key member's key cap, for the chain to count the call there once
    /// ([`AtCap`]).
    fn decide<const COMMIT: bool>(
        &self,
        key: &Q,
        n: u32,
    ) -> (Result<Admission, TryAcquireError>, Committed, bool);
    fn refund(&self, key: &Q, n: u32, admission: &Admission, committed: Committed);
    /// The parameters' version now: read by a chain receipt before its attempt, so that each
    /// member's commit is made under that version or a later one.
    fn version(&self) -> u64;
    /// [`refund`](Self::refund) for a receipt, which can come any time later: only if the
    /// member's parameters are still those of `version` (the member's own receipt's rule:
    /// `RateLimiter::receipt_refund`, `KeyedLimiter::receipt_refund`).
    fn receipt_refund(
        &self,
        key: &Q,
        n: u32,
        admission: &Admission,
        committed: Committed,
        version: u64,
    );
    /// Wakes whoever waits on this member for `key` (its queue's head), after a refund gave it
    /// permits back; run only once every refund of the call is done, since a `Waker` may panic.
    /// `overflow`: some refund went to a keyed member's shared overflow cell, whose waiters may
    /// be in any key's queue (`KeyedLimiter::chain_wake`). `except`: the waiting chain caller
    /// whose refund this is, not to be told of it.
    fn wake(&self, key: &Q, overflow: bool, except: Option<&Watcher>);
    /// The member's own `charge`: `n` permits recorded without the limit check.
    fn charge(&self, key: &Q, n: u32) -> Result<Admission, TryAcquireError>;
    /// Whether `other` is a handle to the same limiter (a member listed twice).
    fn same(&self, other: &Self) -> bool;
    fn exact_refund(&self) -> bool;
    /// Whether what the member admits now weighs less later (the sliding counter's previous
    /// window): then a check for many permits at once is no lower bound of when they fit one
    /// after the other.
    fn weighs_less_later(&self) -> bool;
    fn capacity(&self) -> u32;
    /// What the member guarantees of more than its capacity admitted in a row, `extra` beyond
    /// it, from now: its algorithm's `beyond_limit` (see `limiter::refused_for_waiters`).
    fn beyond_limit(&self, at_limit: u64, extra: u64) -> u64;
    /// Counts one finished chain call on the member: `ADMITTED`, `REJECTED` or `CANCELLED`.
    fn count(&self, which: usize);
    /// Counts the chain call in a per-key member's `overflowed` (nothing on other members).
    fn count_overflow(&self);
    fn catch_up(&self);
    /// The chain callers sleeping on this member (see [`crate::watchers`]).
    fn watchers(&self) -> &Watchers;
}

impl<C: Clock, Q: ?Sized> Member<Q> for RateLimiter<C> {
    #[inline]
    fn decide<const COMMIT: bool>(
        &self,
        _: &Q,
        n: u32,
    ) -> (Result<Admission, TryAcquireError>, Committed, bool) {
        (self.chain_decide::<COMMIT>(n), Committed::default(), false)
    }
    fn refund(&self, _: &Q, n: u32, admission: &Admission, _: Committed) {
        self.chain_refund(n, admission);
    }
    fn version(&self) -> u64 {
        self.params_version()
    }
    fn receipt_refund(&self, _: &Q, n: u32, admission: &Admission, _: Committed, version: u64) {
        RateLimiter::receipt_refund(self, n, admission, version);
    }
    fn wake(&self, _: &Q, _: bool, except: Option<&Watcher>) {
        self.chain_wake(except);
    }
    fn charge(&self, _: &Q, n: u32) -> Result<Admission, TryAcquireError> {
        RateLimiter::charge(self, n)
    }
    fn same(&self, other: &Self) -> bool {
        self.chain_same(other)
    }
    fn exact_refund(&self) -> bool {
        self.chain_exact_refund()
    }
    fn weighs_less_later(&self) -> bool {
        matches!(self.algorithm(), crate::Algorithm::SlidingCounter { .. })
    }
    fn capacity(&self) -> u32 {
        RateLimiter::capacity(self)
    }
    fn beyond_limit(&self, at_limit: u64, extra: u64) -> u64 {
        self.chain_beyond_limit(at_limit, extra)
    }
    fn count(&self, which: usize) {
        self.chain_count(which);
    }
    fn count_overflow(&self) {}
    fn catch_up(&self) {
        self.chain_catch_up();
    }
    fn watchers(&self) -> &Watchers {
        self.chain_watchers()
    }
}

/// Where a successful attempt writes, per member (indexed by member), its admission and the
/// [`Committed`] its commit returned (which `give_back` needs), and where every attempt writes
/// the members' parameters' versions, read before it decides anything (which a receipt's
/// refund needs: `refund::Held`).
#[derive(Default)]
struct Slots<'a> {
    admissions: Option<&'a mut [Admission]>,
    flags: Option<&'a mut [Committed]>,
    versions: Option<&'a mut [u64]>,
}

impl<'a> Slots<'a> {
    /// These slots, with every member's admission and flag kept: in the caller's slots, or if
    /// it keeps none, in `own` (sized here for `members`). A waiting call keeps them to give an
    /// admission back if handing its turn over unwinds.
    fn keeping_admissions(
        self,
        members: usize,
        own: &'a mut (Vec<Admission>, Vec<Committed>),
    ) -> Slots<'a> {
        let (own_admissions, own_flags) = own;
        Slots {
            admissions: Some(self.admissions.unwrap_or_else(|| {
                own_admissions.resize(members, Admission::new(0, 0, 0));
                own_admissions
            })),
            flags: Some(self.flags.unwrap_or_else(|| {
                own_flags.resize(members, Committed::default());
                own_flags
            })),
            versions: self.versions,
        }
    }

    /// The same slots, for one more attempt of a waiting call.
    fn reborrow(&mut self) -> Slots<'_> {
        Slots {
            admissions: self.admissions.as_deref_mut(),
            flags: self.flags.as_deref_mut(),
            versions: self.versions.as_deref_mut(),
        }
    }
}

/// The members an attempt admitted and then gave their permits back, after a later member
/// refused in the commit: the first `members` in `Core::order`. `overflow`: one of those
/// refunds went to a keyed member's shared overflow cell, whose waiters wait in any key's queue
/// (every refunded member is then woken as if its own had: a per-key member whose refund went
/// to the key's cell only wakes more heads than it needs to, who look again).
#[derive(Debug, Clone, Copy, Default)]
struct Refunded {
    members: usize,
    overflow: bool,
}

/// The members whose key cap a chain call has met so far, over all its attempts: a per-key
/// member's decision (a check, a commit, a refusal behind waiters) that its shared overflow cell
/// made, admission or refusal, or that the cap refused (`TooManyKeys`). Each such member counts
/// the call once in its `overflowed`, at the first of them, as a keyed limiter counts its own
/// waiting call once however many of its attempts meet the cap; a chain call is counted once on
/// every member, and so once there too. The members decide without counting it themselves
/// ([`Member::decide`]): a waiting call was counted at every attempt, and a call whose check the
/// shared cell admitted but another member refused, never. Allocated at the first member that
/// meets its cap (only at a key cap).
#[derive(Default)]
struct AtCap(Option<Box<[bool]>>);

impl AtCap {
    /// Member `i` of `members` met its cap: whether for the first time in this call.
    fn first(&mut self, i: usize, members: usize) -> bool {
        let met = self
            .0
            .get_or_insert_with(|| vec![false; members].into_boxed_slice());
        !std::mem::replace(&mut met[i], true)
    }
}

/// What a waiting call keeps across its attempts ([`Core::attempt_waiting`]).
#[derive(Default)]
struct Tally {
    /// Whether the call's outcome is counted.
    counted: bool,
    /// The members whose key cap it has met.
    at_cap: AtCap,
}

/// What [`KeyedChain::try_acquire_n_taken`] took from each member, to give back.
#[cfg(feature = "redis")]
pub(crate) struct Taken {
    admissions: Vec<Admission>,
    flags: Vec<Committed>,
}

/// The members and the logic shared by [`Chain`] and `KeyedChain`.
struct Core<L, W> {
    members: Box<[L]>,
    /// Where waiting callers queue ([`Line`]).
    line: W,
    /// Per member, how many times its limiter is listed: a limiter listed twice is charged
    /// twice, so the check asks it for all of that at once (1 for every member of a chain
    /// without repeats).
    times: Box<[u32]>,
    /// Commit order: members with exact refunds first, then the exact sliding windows.
    order: Box<[usize]>,
    counters: Counters,
}

/// Admissions combined: the smallest `remaining`, the largest `reset_after`, the latest `at`.
fn combine(acc: Option<Admission>, a: Admission) -> Admission {
    match acc {
        None => Admission::new(a.at_nanos(), a.reset_after_nanos(), a.remaining()),
        Some(b) => Admission::new(
            a.at_nanos().max(b.at_nanos()),
            a.reset_after_nanos().max(b.reset_after_nanos()),
            a.remaining().min(b.remaining()),
        ),
    }
}

/// The rejection with the largest `retry_after`; the earlier one on a tie.
fn worse(acc: Option<Rejection>, r: Rejection) -> Rejection {
    match acc {
        Some(a) if a.retry_after_nanos() >= r.retry_after_nanos() => a,
        _ => r,
    }
}

impl<L, W> Core<L, W> {
    fn new<Q: ?Sized>(members: Vec<L>, global_from: usize, line: W) -> Result<Self, ConfigError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        if members.is_empty() {
            return Err(ConfigError::Zero {
                what: "chain members",
            });
        }
        // Exact refunds first; within each group, per-key members before global ones (they are
        // the less contended, so a commit race, and with it a refund, is less likely on them),
        // then the order given.
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by_key(|&i| (!members[i].exact_refund(), i >= global_from));
        // Quadratic, once per chain: chains are short.
        let times = members
            .iter()
            .map(|m| members.iter().filter(|other| m.same(other)).count() as u32)
            .collect();
        Ok(Core {
            members: members.into_boxed_slice(),
            line,
            times,
            order: order.into_boxed_slice(),
            counters: Counters::new(),
        })
    }

    /// The smallest member capacity now: the most permits one call can get (a limiter listed
    /// k times gives a k-th of its own). Read from the members every time, since any of them can
    /// be reconfigured after the chain is built.
    fn capacity<Q: ?Sized>(&self) -> u32
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        self.members
            .iter()
            .zip(self.times.iter())
            .map(|(m, &times)| m.capacity() / times)
            .min()
            .unwrap_or(0)
    }

    /// What member `i` is checked for when a call asks `n`: all the permits the commit will
    /// take from its limiter, `n` for each time it is listed. Without that, a check of `n` on
    /// each listing could pass where the commit then fails on the second one, sequentially,
    /// and a request above a k-th of the limit would be rejected forever rather than refused
    /// as too large. (Saturating: anything that large exceeds every limit, which the member
    /// refuses as too large.)
    #[inline]
    fn checked(&self, i: usize, n: u32) -> u32 {
        n.saturating_mul(self.times[i])
    }

    /// Member `i`'s check in the first pass. A probe (`n == 0`) of a limiter listed k > 1 times
    /// asks whether one more call fits, k permits (the verdict, or the rejection with its
    /// retry-after), and then the limiter's own probe, for the `remaining` and `reset_after`
    /// that a check of k permits does not give.
    fn check<Q: ?Sized>(
        &self,
        i: usize,
        key: &Q,
        n: u32,
        at_cap: &mut AtCap,
    ) -> Result<Admission, TryAcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let times = self.times[i];
        if n == 0 && times > 1 {
            self.decide::<false, Q>(i, key, times, at_cap).0?;
        }
        self.decide::<false, Q>(i, key, self.checked(i, n), at_cap)
            .0
    }

    /// Member `i`'s decision ([`Member::decide`]), counting the call in its `overflowed` if it
    /// is the first of the call's decisions to meet its key cap ([`AtCap`]).
    #[inline]
    fn decide<const COMMIT: bool, Q: ?Sized>(
        &self,
        i: usize,
        key: &Q,
        n: u32,
        at_cap: &mut AtCap,
    ) -> (Result<Admission, TryAcquireError>, Committed)
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let member = &self.members[i];
        let (decision, committed, met_cap) = member.decide::<COMMIT>(key, n);
        if met_cap && at_cap.first(i, self.members.len()) {
            member.count_overflow();
        }
        (decision, committed)
    }

    /// Member `i`'s admission as the chain reports it: `remaining` in calls of the chain, each
    /// of which takes `times` of the member's permits.
    #[inline]
    fn share(&self, i: usize, a: Admission) -> Admission {
        match self.times[i] {
            1 => a,
            times => Admission::new(a.at_nanos(), a.reset_after_nanos(), a.remaining() / times),
        }
    }

    /// `InsufficientCapacity` if `n` exceeds the chain's capacity now: the answer to a request
    /// that can never fit, ahead of any other error a member gave.
    #[cold]
    fn too_big<Q: ?Sized>(&self, n: u32) -> Option<TryAcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let capacity = self.capacity::<Q>();
        (n > capacity).then_some(TryAcquireError::InsufficientCapacity {
            requested: n,
            capacity,
        })
    }

    /// One all-or-nothing attempt; counts nothing and wakes nobody. On success `slots` hold every
    /// member's admission and refund flag (those asked for). `refunded` is set to the members
    /// that admitted and were given their permits back ([`Refunded`]), for the caller to wake
    /// ([`wake_refunded`](Self::wake_refunded)) once it has counted the call.
    fn attempt<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
        mut slots: Slots<'_>,
        refunded: &mut Refunded,
        at_cap: &mut AtCap,
    ) -> Result<Admission, TryAcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        // A receipt's versions, read before anything is decided, as a member's own receipt
        // reads its version: each member's commit is then made under that version or a later
        // one, so a version unchanged at the refund is the commit's own.
        if let Some(versions) = slots.versions.as_deref_mut() {
            for (version, member) in versions.iter_mut().zip(self.members.iter()) {
                *version = member.version();
            }
        }
        // Pass 1: check every member, writing nothing. Each member refuses a request above its
        // own capacity (as it stands now: members can be reconfigured), so a request above the
        // smallest one fails here, whichever member sees it first.
        let mut probed = None;
        let mut rejected = None;
        for i in 0..self.members.len() {
            match self.check(i, key, n, at_cap) {
                Ok(a) => {
                    probed = Some(combine(probed, self.share(i, a)));
                    if let Some(each) = slots.admissions.as_deref_mut() {
                        each[i] = a;
                    }
                }
                Err(TryAcquireError::Rejected(r)) => rejected = Some(worse(rejected, r)),
                // A probe is for one call: one permit, which a limiter listed more times than
                // its limit can never give (in the chain's terms, not the member's).
                Err(e) => return Err(self.too_big::<Q>(n.max(1)).unwrap_or(e)),
            }
        }
        if let Some(r) = rejected {
            return Err(TryAcquireError::Rejected(r));
        }
        if n == 0 {
            // A probe: what the members' own probes said.
            return Ok(probed.expect("a chain has members"));
        }
        // Pass 2: commit in `order`, refunding on the way back if a later member rejects.
        let (failed, error, overflow) = match self.commit(key, n, 0, &mut slots, at_cap) {
            Ok(admission) => return Ok(admission),
            Err(failure) => failure,
        };
        if failed != self.order[0] {
            // Some member had admitted and was given its permits back: those before `failed`
            // in `order` (the commit takes them in that order).
            self.counters.bump(REFUNDED);
            *refunded = Refunded {
                members: self.order.iter().position(|&i| i == failed).unwrap_or(0),
                overflow,
            };
        }
        let TryAcquireError::Rejected(r) = error else {
            return Err(error);
        };
        // The largest retry-after: the member that rejected, and every other one as it stands
        // now (the refunded ones included).
        let mut rejected = None;
        for i in 0..self.members.len() {
            let decision = if i == failed {
                Err(error)
            } else {
                self.check(i, key, n, at_cap)
            };
            match decision {
                Ok(_) => {}
                Err(TryAcquireError::Rejected(r)) => rejected = Some(worse(rejected, r)),
                Err(e) => return Err(e),
            }
        }
        Err(TryAcquireError::Rejected(rejected.unwrap_or(r)))
    }

    /// Commits `order[pos..]`, then returns the combined admission; on failure, refunds what it
    /// took and returns the failing member's index and error, and whether a refund went to a
    /// shared overflow cell. Recursive so that each member's admission waits for its refund on
    /// the stack: no allocation, however long the chain.
    fn commit<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
        pos: usize,
        slots: &mut Slots<'_>,
        at_cap: &mut AtCap,
    ) -> Result<Admission, (usize, TryAcquireError, bool)>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let i = self.order[pos];
        let member = &self.members[i];
        let admission = match self.decide::<true, Q>(i, key, n, at_cap) {
            (Ok(a), flag) => (a, flag),
            (Err(e), _) => return Err((i, e, false)),
        };
        let rest = if pos + 1 < self.order.len() {
            match self.commit(key, n, pos + 1, slots, at_cap) {
                Ok(rest) => Some(rest),
                Err((failed, error, overflow)) => {
                    member.refund(key, n, &admission.0, admission.1);
                    // The failure is reported as a refund only once (by `attempt`); a member
                    // that failed first refunded nothing.
                    return Err((failed, error, overflow || admission.1.overflow));
                }
            }
        } else {
            None
        };
        if let Some(each) = slots.admissions.as_deref_mut() {
            each[i] = admission.0;
        }
        if let Some(flags) = slots.flags.as_deref_mut() {
            flags[i] = admission.1;
        }
        Ok(combine(rest, self.share(i, admission.0)))
    }

    /// Gives back `n` permits a successful attempt took for `key` from every member, from the
    /// admissions and flags it recorded; counted as one refund of the chain. As exact as the
    /// members' refunds (see the module docs).
    #[cfg(feature = "redis")]
    fn give_back<Q: ?Sized>(&self, key: &Q, n: u32, admissions: &[Admission], flags: &[Committed])
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        self.counters.bump(REFUNDED);
        self.return_admission(key, n, admissions, flags);
    }

    /// Gives every member its permits of a successful attempt back, then wakes them all;
    /// counts nothing.
    fn return_admission<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
        admissions: &[Admission],
        flags: &[Committed],
    ) where
        L: Member<Q>,
        W: Line<Q>,
    {
        for ((member, admission), flag) in self.members.iter().zip(admissions).zip(flags) {
            member.refund(key, n, admission, *flag);
        }
        let overflow = flags.iter().map(|flag| flag.overflow);
        self.wake(key, overflow.enumerate(), None);
    }

    /// Wakes the members the last attempt refunded (see [`attempt`](Self::attempt)).
    fn wake_refunded<Q: ?Sized>(&self, key: &Q, refunded: Refunded, except: Option<&Watcher>)
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        if refunded.members > 0 {
            let members = self.order[..refunded.members].iter();
            self.wake(key, members.map(|&i| (i, refunded.overflow)), except);
        }
    }

    /// Wakes members `which` after refunds, every one of them even if a `Waker` panics (the
    /// first panic is re-raised after the last; see `WakeAll`). Only once every refund is done:
    /// a panic out of a refund's wake would otherwise unwind past the members still to refund,
    /// leaving their permits taken for a call that was not admitted. Each member comes with
    /// whether its refund went to a shared overflow cell ([`Member::wake`]).
    fn wake<Q: ?Sized>(
        &self,
        key: &Q,
        which: impl Iterator<Item = (usize, bool)>,
        except: Option<&Watcher>,
    ) where
        L: Member<Q>,
        W: Line<Q>,
    {
        let mut all = WakeAll::default();
        for (i, overflow) in which {
            all.run(|| self.members[i].wake(key, overflow, except));
        }
        all.finish();
    }

    /// `attempt`, counted: once on the chain and once on every member. Refused while chain
    /// callers wait for `key` (no barging past the chain's queue: [`refused`](Self::refused)).
    #[inline]
    fn try_acquire<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
        slots: Slots<'_>,
    ) -> Result<Admission, TryAcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        if self.line.busy(key) {
            return Err(self.refused(key, n));
        }
        let mut refunded = Refunded::default();
        let outcome = self.attempt(key, n, slots, &mut refunded, &mut AtCap::default());
        self.count(if outcome.is_ok() { ADMITTED } else { REJECTED });
        self.wake_refunded(key, refunded, None);
        outcome
    }

    /// The answer to a call that waiting chain callers hold back, counted as rejected: as a
    /// member's own (`refused_for_waiters`), a request that can never fit says so; otherwise a
    /// rejection whose retry-after counts the chain's queue: the latest of the members' answers
    /// to a check (which writes nothing) for the permits the waiting chain callers ask for plus
    /// this call's (one for a probe), at most the chain's capacity. They are served first, and
    /// their admissions only make a member stricter, so this call fits no sooner than all of it
    /// would at once; not so for a sliding counter, whose admissions weigh less once the next
    /// window starts: such a member answers for this call alone, a lower bound still. Beyond a
    /// member's capacity, no sooner than what its algorithm guarantees of that many permits in
    /// a row (its `beyond_limit`, as a member's own refusal counts it). 0 when every member
    /// could admit all of it now and it is within their capacities (the head is about to be
    /// served).
    #[cold]
    #[inline(never)]
    fn refused<Q: ?Sized>(&self, key: &Q, n: u32) -> TryAcquireError
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let error = self
            .too_big::<Q>(n)
            .unwrap_or_else(|| self.behind_the_queue(key, n, &mut AtCap::default()));
        self.count(REJECTED);
        error
    }

    /// [`refused`](Self::refused)'s rejection of a call for `n` that fits the chain.
    #[cold]
    fn behind_the_queue<Q: ?Sized>(&self, key: &Q, n: u32, at_cap: &mut AtCap) -> TryAcquireError
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let capacity = self.capacity::<Q>();
        let total = self
            .line
            .queued(key, capacity)
            .saturating_add(u64::from(n.max(1)));
        let all = u32::try_from(total).unwrap_or(u32::MAX).min(capacity);
        let mut rejected = None;
        for (i, member) in self.members.iter().enumerate() {
            let want = if member.weighs_less_later() { n } else { all };
            // More than the member's capacity in a row: what its algorithm guarantees of that,
            // at least (as a limiter's own refusal behind its queue, `refused_for_waiters`).
            let beyond = |at_once: u64| {
                let permits = total.saturating_mul(u64::from(self.times[i]));
                match permits.checked_sub(u64::from(member.capacity())) {
                    Some(extra) if extra > 0 => member.beyond_limit(at_once, extra),
                    _ => 0,
                }
            };
            match self.check(i, key, want, at_cap) {
                Ok(_) => {
                    let bound = beyond(0);
                    if bound > 0 {
                        let r = Rejection::new(bound, member.capacity());
                        rejected = Some(worse(rejected, r));
                    }
                }
                Err(TryAcquireError::Rejected(r)) => {
                    let at_once = r.retry_after_nanos();
                    let r = Rejection::new(at_once.max(beyond(at_once)), r.limit());
                    rejected = Some(worse(rejected, r));
                }
                // A member reconfigured below it meanwhile: the members' probe, as a call that
                // starts now would meet them.
                Err(_) => {
                    let mut refunded = Refunded::default();
                    return match self.attempt(key, 0, Slots::default(), &mut refunded, at_cap) {
                        Err(error) => error,
                        Ok(_) => TryAcquireError::Rejected(Rejection::new(0, capacity)),
                    };
                }
            }
        }
        TryAcquireError::Rejected(rejected.unwrap_or_else(|| Rejection::new(0, capacity)))
    }

    /// Before a caller queues: `n` above the chain's capacity fails at once, as on the
    /// caller's own first attempt, rather than once its turn comes. A probe asks for one call,
    /// as its attempt does (`attempt`): at a capacity of 0 it can never be admitted.
    #[cold]
    fn too_big_to_wait<Q: ?Sized>(&self, n: u32) -> Option<AcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        self.too_big::<Q>(n.max(1))
            .and_then(|e| e.wait_or_fail().err())
    }

    fn count<Q: ?Sized>(&self, which: usize)
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        self.counters.bump(which);
        for member in self.members.iter() {
            member.count(which);
        }
    }

    /// `try_acquire` that fills `out` with the members' admissions, in member order.
    fn try_acquire_into<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
        out: &mut Vec<Admission>,
    ) -> Result<Admission, TryAcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        out.clear();
        out.resize(self.members.len(), Admission::new(0, 0, 0));
        let outcome = self.try_acquire(
            key,
            n,
            Slots {
                admissions: Some(out.as_mut_slice()),
                flags: None,
                versions: None,
            },
        );
        if outcome.is_err() {
            out.clear();
        }
        outcome
    }

    /// Charges `n` to every member, once per listing, in member order, whatever the others
    /// answer: the combined admission, or the first member's error (every member that could
    /// record the charge has recorded it). No check pass, no refunds, nothing counted: see
    /// [`Chain::charge`] for why.
    fn charge<Q: ?Sized>(&self, key: &Q, n: u32) -> Result<Admission, TryAcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let mut charged = None;
        let mut failed = None;
        for (i, member) in self.members.iter().enumerate() {
            match member.charge(key, n) {
                Ok(a) => charged = Some(combine(charged, self.share(i, a))),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(charged.expect("a chain has members")),
        }
    }

    fn stats<Q: ?Sized>(&self) -> ChainStats
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        ChainStats {
            admitted: self.counters.sum(ADMITTED),
            rejected: self.counters.sum(REJECTED),
            cancelled: self.counters.sum(CANCELLED),
            refunded: self.counters.sum(REFUNDED),
            waiting: self.line.waiting(),
        }
    }

    /// One attempt of a waiting call: `Ok` with how the call ends (counted), or `Err` with how
    /// long to wait before the next attempt (the largest `retry_after`, at least
    /// [`MIN_BACKOFF`]) and how far the attempt's own refunds moved the members' epoch sum
    /// ([`epochs`](Self::epochs)).
    ///
    /// `tally.counted` is set once the call's outcome is counted, before the refunded members are
    /// woken: a `Waker` that panics then must not have the call counted again as cancelled.
    /// `tally.at_cap` keeps the members whose key cap an attempt met, counted once ([`AtCap`]).
    /// `who`, the caller's watcher once it has one, is not told of its own refunds: they are no
    /// change it missed, and each attempt on a chain whose commit keeps failing after its check
    /// passed (a member at its key cap whose search for room cannot evict, or a racing caller)
    /// would wake it for the next at once, and it would never sleep.
    ///
    /// `turn`, the caller's turn in the chain's queue if it holds one, is given up on admission
    /// before the call is counted: that wakes the next caller, whose `Waker` may panic, and the
    /// admission must not then be lost with the unwind (the members charged for a caller that
    /// never gets it). As a limiter's served head does, the call gives its permits back (from
    /// `slots`, which then hold every member's admission and flag), counts as cancelled, and the
    /// panic goes on.
    fn attempt_waiting<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
        mut slots: Slots<'_>,
        tally: &mut Tally,
        who: Option<&Watcher>,
        turn: &mut Option<Held<'_>>,
    ) -> Result<Result<Admission, AcquireError>, (std::time::Duration, u64)>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let mut refunded = Refunded::default();
        let error = match self.attempt(key, n, slots.reborrow(), &mut refunded, &mut tally.at_cap) {
            // Admitted: nothing was refunded.
            Ok(admission) => {
                if let Some(turn) = turn.take() {
                    let handed_over =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(turn)));
                    if let Err(panic) = handed_over {
                        self.count(CANCELLED);
                        tally.counted = true;
                        if let (Some(admissions), Some(flags), true) =
                            (slots.admissions, slots.flags, n > 0)
                        {
                            self.return_admission(key, n, admissions, flags);
                        }
                        std::panic::resume_unwind(panic);
                    }
                }
                self.count(ADMITTED);
                tally.counted = true;
                return Ok(Ok(admission));
            }
            Err(e) => match e.wait_or_fail() {
                // A member that defers to its own queue of waiters may report 0 (its head is
                // about to be served): poll gently.
                Ok(rejection) => {
                    self.wake_refunded(key, refunded, who);
                    // Each refunded member's wake bumps its limiter's epoch once, which the
                    // sum holds once per listing of that limiter.
                    let own = self.order[..refunded.members]
                        .iter()
                        .fold(0, |sum: u64, &i| sum.wrapping_add(u64::from(self.times[i])));
                    return Err((rejection.retry_after().max(MIN_BACKOFF), own));
                }
                Err(error) => error,
            },
        };
        self.count(REJECTED);
        tally.counted = true;
        self.wake_refunded(key, refunded, who);
        Ok(Err(error))
    }

    /// The members' change counts added up: read before a first attempt, and compared by
    /// [`watch`](Self::watch) (every count only grows, so the sum moves if any count does).
    fn epochs<Q: ?Sized>(&self) -> u64
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        self.members.iter().fold(0, |sum: u64, member| {
            sum.wrapping_add(member.watchers().epoch())
        })
    }

    /// Registers `who` with every member, until the returned guard is dropped, and says
    /// whether a member changed since `seen` ([`epochs`](Self::epochs)) was read: the attempt
    /// in between may have missed that change, so the caller looks again as if notified (every
    /// later change notifies it).
    fn watch<Q: ?Sized>(&self, who: &Watcher, seen: u64) -> (Watching<'_>, bool)
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        let mut watching = Watching(Vec::with_capacity(self.members.len()));
        let mut now: u64 = 0;
        for member in self.members.iter() {
            let watchers = member.watchers();
            let (id, epoch) = watchers.watch(who.clone());
            watching.0.push((watchers, id));
            now = now.wrapping_add(epoch);
        }
        (watching, now != seen)
    }

    /// Before the next attempt after a wait: the members' clocks brought up to date.
    fn caught_up<Q: ?Sized>(&self)
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        for member in self.members.iter() {
            member.catch_up();
        }
    }

    /// Retries until every member admits at once, sleeping ([`crate::timer`]) for the largest
    /// `retry_after` in between. `slots` as for [`attempt`](Self::attempt): each attempt
    /// writes them again, so they hold the admitting attempt's.
    ///
    /// One attempt first, unless chain callers wait for `key` already; a caller that must wait
    /// then takes its room in the chain's queue and waits for its turn ([`Line`]), and only
    /// then makes its attempts, sleeping in between, until its call ends and the turn passes
    /// to the next caller.
    #[cfg(feature = "tokio")]
    async fn acquire<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
        mut slots: Slots<'_>,
    ) -> Result<Admission, AcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        /// Counts the call as cancelled if the future is dropped before it finishes.
        struct Finish<'a, L, W, Q: ?Sized>
        where
            L: Member<Q>,
            W: Line<Q>,
        {
            core: &'a Core<L, W>,
            /// Whether the call is counted, and the members whose key cap it has met.
            tally: Tally,
            _key: std::marker::PhantomData<fn(&Q)>,
        }
        impl<L: Member<Q>, W: Line<Q>, Q: ?Sized> Drop for Finish<'_, L, W, Q> {
            fn drop(&mut self) {
                if !self.tally.counted {
                    self.core.count(CANCELLED);
                }
            }
        }
        let mut finish = Finish {
            core: self,
            tally: Tally::default(),
            _key: std::marker::PhantomData,
        };
        // Registered with every member after the first attempt that must wait, until the call
        // ends: a change (a close, a reconfiguration, a refund) cuts the sleep short.
        let mut seen = self.epochs::<Q>();
        // The first attempt's wait, if it was made and failed.
        let mut first = None;
        if !self.line.busy(key) {
            match self.attempt_waiting(key, n, slots.reborrow(), &mut finish.tally, None, &mut None)
            {
                Ok(outcome) => return outcome,
                Err(wait) => first = Some(wait),
            }
        } else if let Some(error) = self.too_big_to_wait::<Q>(n) {
            self.count(REJECTED);
            finish.tally.counted = true;
            return Err(error);
        }
        // Dropped after the turn (locals drop in reverse order): the room is held while the
        // turn is, and a newcomer sees a caller waiting until its turn has passed on.
        let _room = match self.line.join(key, n) {
            Ok(room) => room,
            Err(error) => {
                self.count(REJECTED);
                finish.tally.counted = true;
                return Err(error);
            }
        };
        // The turn at once (nobody else waits): the first attempt stands, and the caller sleeps
        // on its answer. After a wait for it, a fresh attempt.
        let turn = match self.line.try_turn(key) {
            Some(turn) => turn,
            None => match self.line.turn(key).await {
                Ok(turn) => {
                    first = None;
                    seen = self.epochs::<Q>();
                    turn
                }
                Err(error) => {
                    self.count(REJECTED);
                    finish.tally.counted = true;
                    return Err(error);
                }
            },
        };
        // Handing the turn over on admission may unwind (the next caller's `Waker` panics), and
        // the admission is then given back: every member's is kept for that, in the caller's
        // slots or, if it keeps none, here (a caller that waits allocates anyway).
        let mut turn = Some(turn);
        let mut own = (Vec::new(), Vec::new());
        let mut slots = slots.keeping_admissions(self.members.len(), &mut own);
        let mut watching = None;
        // Made at the first wait: a call admitted at once allocates nothing.
        let mut notify: Option<(std::sync::Arc<tokio::sync::Notify>, Watcher)> = None;
        loop {
            let who = notify.as_ref().map(|(_, who)| who);
            let attempt = match first.take() {
                Some(wait) => Err(wait),
                None => {
                    let tally = &mut finish.tally;
                    self.attempt_waiting(key, n, slots.reborrow(), tally, who, &mut turn)
                }
            };
            match attempt {
                Ok(outcome) => return outcome,
                Err((wait, own)) => {
                    let (notify, who) = notify.get_or_insert_with(|| {
                        let notify = std::sync::Arc::new(tokio::sync::Notify::new());
                        (notify.clone(), Watcher::Task(notify))
                    });
                    if watching.is_none() {
                        // The attempt's own refunds moved the sum: not a change it missed.
                        let (registered, moved) = self.watch::<Q>(who, seen.wrapping_add(own));
                        watching = Some(registered);
                        if moved {
                            notify.notify_one();
                        }
                    }
                    sleep_or_notified(wait, notify).await;
                    self.caught_up::<Q>();
                }
            }
        }
    }

    /// As `acquire`, blocking the calling thread: it sleeps (real time) for the
    /// largest `retry_after` between attempts, until `deadline` if there is one. A call that
    /// unwinds from a member's code is not counted.
    fn acquire_blocking<Q: ?Sized>(
        &self,
        key: &Q,
        n: u32,
        mut slots: Slots<'_>,
        deadline: Option<std::time::Instant>,
    ) -> Result<Admission, AcquireError>
    where
        L: Member<Q>,
        W: Line<Q>,
    {
        // The queue as in `acquire`, with the thread's signal (created on this thread, which it
        // wakes).
        let mut seen = self.epochs::<Q>();
        let mut tally = Tally::default();
        let mut first = None;
        if !self.line.busy(key) {
            match self.attempt_waiting(key, n, slots.reborrow(), &mut tally, None, &mut None) {
                Ok(outcome) => return outcome,
                Err(wait) => first = Some(wait),
            }
        } else if let Some(error) = self.too_big_to_wait::<Q>(n) {
            self.count(REJECTED);
            return Err(error);
        }
        let _room = self
            .line
            .join(key, n)
            .inspect_err(|_| self.count(REJECTED))?;
        let turn = match self.line.try_turn(key) {
            Some(turn) => turn,
            None => {
                let turn = self
                    .line
                    .turn_blocking(key, deadline)
                    .inspect_err(|error| {
                        self.count(if *error == AcquireError::Timeout {
                            CANCELLED
                        } else {
                            REJECTED
                        });
                    })?;
                first = None;
                seen = self.epochs::<Q>();
                turn
            }
        };
        // Handing the turn over on admission may unwind (the next caller's `Waker` panics), and
        // the admission is then given back: every member's is kept for that, in the caller's
        // slots or, if it keeps none, here (a caller that waits allocates anyway).
        let mut turn = Some(turn);
        let mut own = (Vec::new(), Vec::new());
        let mut slots = slots.keeping_admissions(self.members.len(), &mut own);
        let mut watching = None;
        // Made at the first wait (its epoch starts at 0): a call admitted at once allocates
        // nothing.
        let mut signal: Option<(Arc<Signal>, Watcher)> = None;
        loop {
            // Before the attempt: a change after it moves the signal's epoch, and the wait
            // below returns at once.
            let signalled = signal.as_ref().map_or(0, |(signal, _)| signal.epoch());
            let who = signal.as_ref().map(|(_, who)| who);
            let attempt = match first.take() {
                Some(wait) => Err(wait),
                None => self.attempt_waiting(key, n, slots.reborrow(), &mut tally, who, &mut turn),
            };
            let (wait, own) = match attempt {
                Ok(outcome) => return outcome,
                Err(wait) => wait,
            };
            // Checked first: a caller woken early, again and again, still ends at its deadline.
            let wait = match deadline {
                None => wait,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        self.count(CANCELLED);
                        return Err(AcquireError::Timeout);
                    }
                    wait.min(left)
                }
            };
            let (signal, who) = signal.get_or_insert_with(|| {
                let signal = Arc::new(Signal::new());
                (Arc::clone(&signal), Watcher::Thread(signal))
            });
            let mut moved = false;
            if watching.is_none() {
                // The attempt's own refunds moved the sum: not a change it missed.
                let registered;
                (registered, moved) = self.watch::<Q>(who, seen.wrapping_add(own));
                watching = Some(registered);
            }
            // As `sleep_or_notified`: the backoff first, whatever the notifications.
            let backoff = MIN_BACKOFF.min(wait);
            std::thread::sleep(backoff);
            if !moved {
                signal.wait_timeout(signalled, wait - backoff);
            }
            self.caught_up::<Q>();
        }
    }
}

/// A chain caller's registrations with its members' [`Watchers`], removed when dropped (the
/// call ended, or its future was dropped).
struct Watching<'a>(Vec<(&'a Watchers, u64)>);

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        for (watchers, id) in self.0.drain(..) {
            watchers.unwatch(id);
        }
    }
}

/// Sleeps for `wait`, or less if `notify` is (or was, since the caller registered) notified;
/// but for [`MIN_BACKOFF`] first (no `wait` is shorter) whatever the notifications, which are
/// kept meanwhile. A change that lands during every attempt (two callers whose attempts keep
/// failing in the commit, each one's refund telling the other; a stream of resets of other
/// keys) would otherwise have the caller try again without a pause for as long as it lasts: a
/// task without ever yielding to its timer, under paused time for ever.
#[cfg(feature = "tokio")]
async fn sleep_or_notified(wait: std::time::Duration, notify: &tokio::sync::Notify) {
    let backoff = MIN_BACKOFF.min(wait);
    crate::timer::sleep(backoff).await;
    crate::watchers::sleep_unless(wait - backoff, std::pin::pin!(notify.notified())).await;
}

/// The shortest sleep between two attempts of a chain's `acquire`: a member whose own queue has
/// waiters (oldest first) rejects with a `retry_after` of 0 when its head is about to be served,
/// and the chain must not spin on it;
/// nor on members that change all the time (see `sleep_or_notified`).
const MIN_BACKOFF: std::time::Duration = std::time::Duration::from_millis(1);

/// Counts kept by a [`Chain`] or
#[cfg_attr(feature = "keyed", doc = "[`KeyedChain`].")]
#[cfg_attr(not(feature = "keyed"), doc = "`KeyedChain`.")]
///
/// Every call ends in exactly one of `admitted`, `rejected` or `cancelled`. A chain call is
/// also counted once on every member (as admitted, rejected or cancelled; keyed members, which
/// count no cancellations, as rejected), so a member's statistics cover the calls it was asked
/// about, whether it was the one that refused or not; and once in a per-key member's
/// `overflowed` if it met that member's key cap (the shared overflow cell decided for it, even
/// at the check, or `TooManyKeys`), however many of its attempts met it. Charges ([`Chain::charge`],
/// `KeyedChain::charge`) are not calls: like a limiter's own charges, they are counted nowhere.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, Chain, ManualClock, RateLimiter};
///
/// let clock = ManualClock::new();
/// let window = Duration::from_secs(1);
/// let small = RateLimiter::with_clock(Algorithm::FixedWindow { limit: 1, window }, clock.clone())?;
/// let large = RateLimiter::with_clock(Algorithm::FixedWindow { limit: 9, window }, clock)?;
/// let chain = Chain::new([small.clone(), large.clone()])?;
/// chain.try_acquire()?;
/// assert!(chain.try_acquire().is_err());
/// let stats = chain.stats();
/// assert_eq!((stats.admitted, stats.rejected, stats.refunded), (1, 1, 0));
/// assert_eq!((large.stats().admitted, large.stats().rejected), (1, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ChainStats {
    /// Calls that got their permits from every member (probes included).
    pub admitted: u64,
    /// Calls that failed: rejections, requests that can never fit, a closed member, a full
    /// key cap.
    pub rejected: u64,
    /// `acquire` futures dropped before they got their permits, and timeouts.
    pub cancelled: u64,
    /// Attempts that passed the check pass but were refused in the commit pass, so that members
    /// which had already admitted were given their permits back: a race lost to another
    /// caller, or, in a
    #[cfg_attr(feature = "keyed", doc = "[`KeyedChain`],")]
    #[cfg_attr(not(feature = "keyed"), doc = "`KeyedChain`,")]
    /// a new key at a per-key member's key cap with no idle key to evict, which the member's
    /// check lets through until a search for room has failed and its commit then refuses (no
    /// other call in flight needed). A `try_acquire` so refused is also counted in `rejected`;
    /// a waiting call counts each of its attempts so refused that goes on waiting, so it may
    /// end admitted (or cancelled) after any number of them: `refunded` is not a part of
    /// `rejected`.
    pub refunded: u64,
    /// Chain callers waiting now in the chain's queue (for a
    #[cfg_attr(feature = "keyed", doc = "[`KeyedChain`],")]
    #[cfg_attr(not(feature = "keyed"), doc = "`KeyedChain`,")]
    /// over every key),
    /// the ones whose turn it is included: a snapshot, not a count of calls. A caller counts
    /// from just before it takes its room in the queue until just after it gives it back, as
    /// the queue's own gate sees it (so it is still counted while it hands its turn on).
    pub waiting: u64,
}

/// Several rate limiters at once: a call is admitted only if every member admits it.
///
/// For example 10 per second *and* 1,000 per hour: a chain of two [`RateLimiter`]s. The
/// members are ordinary limiters (cloned handles: their state is shared with every other
/// handle) on one clock type; each keeps its own algorithm and its own clock.
///
/// - **All or nothing.** When a member rejects, the others are not charged: every member is
///   first *checked* without writing anything, and only if all admit are the permits taken; a
///   member that loses a race in that second pass makes the chain give the permits it already
///   took back (refunds: exact for the fixed window, the token bucket and the sliding counter
///   when the clock has not moved on, conservative otherwise; see ARCHITECTURE.md).
/// - **Denials are free**: a call that a member rejects at the check writes no shared memory.
/// - **The answer is combined.** An admission reports the smallest `remaining` and the largest
///   `reset_after` over the members (and the latest `at`); a rejection the largest
///   `retry_after`, with the `limit` of the member that said so. With nothing else admitted
///   meanwhile, that is exactly when the whole chain admits: each member's answer only improves
///   with time.
/// - **Usage known after the fact** ([`charge`](Self::charge)) is recorded on every member
///   that can record it, without a check: it may leave members in debt, and a member that
///   fails (closed) does not keep the charge from the others.
/// - A limiter listed twice is charged twice, so one call can get at most half its limit
///   ([`capacity`](Self::capacity) says so), and it is checked for both charges at once; the
///   combined `remaining` counts its free permits in such calls (half of them). Its own
///   [`stats`](RateLimiter::stats) count the call once per listing.
///
/// Cloning is cheap and clones share state.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, Chain, ManualClock, RateLimiter};
///
/// let clock = ManualClock::new();
/// let per_second = RateLimiter::with_clock(
///     Algorithm::SlidingWindow { limit: 10, window: Duration::from_secs(1) },
///     clock.clone(),
/// )?;
/// let per_hour = RateLimiter::with_clock(
///     Algorithm::SlidingWindow { limit: 1_000, window: Duration::from_secs(3600) },
///     clock.clone(),
/// )?;
/// let chain = Chain::new([per_second.clone(), per_hour.clone()])?;
///
/// assert_eq!(chain.try_acquire_n(10)?.remaining(), 0); // the per-second limit is spent
/// let rejection = *chain.try_acquire().unwrap_err().rejection().unwrap();
/// assert_eq!(rejection.retry_after(), Duration::from_secs(1));
/// assert_eq!(per_hour.stats().available, 990); // the rejected call took nothing per hour
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Chain<C: Clock = DefaultClock> {
    core: Arc<Core<RateLimiter<C>, ChainLine>>,
}

impl<C: Clock> Clone for Chain<C> {
    fn clone(&self) -> Self {
        Chain {
            core: Arc::clone(&self.core),
        }
    }
}

impl<C: Clock> fmt::Debug for Chain<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain")
            .field("members", &self.core.members)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Chain<C> {
    /// A chain of `members`, in the order given (which only decides the order of
    /// [`try_acquire_n_into`](Self::try_acquire_n_into)'s admissions and which of two equally
    /// late rejections is reported).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] if `members` is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Chain, ConfigError, Rate, RateLimiter};
    ///
    /// let chain = Chain::new([
    ///     RateLimiter::token_bucket(Rate::per_second(10), 20)?,
    ///     RateLimiter::fixed_window(1_000, Duration::from_secs(3600))?,
    /// ])?;
    /// assert_eq!(chain.capacity(), 20);
    /// assert_eq!(
    ///     Chain::new(Vec::<RateLimiter>::new()).unwrap_err(),
    ///     ConfigError::Zero { what: "chain members" },
    /// );
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn new(members: impl IntoIterator<Item = RateLimiter<C>>) -> Result<Self, ConfigError> {
        Self::builder(members).build()
    }

    /// A builder for a chain of `members` with queue settings
    /// ([`queue_limit`](ChainBuilder::queue_limit)); [`new`](Self::new) is
    /// `builder(members).build()`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Chain, RateLimiter, DEFAULT_QUEUE_LIMIT};
    ///
    /// let members = [RateLimiter::fixed_window(10, Duration::from_secs(1))?];
    /// let chain = Chain::builder(members.clone()).queue_limit(100).build()?;
    /// assert_eq!(chain.queue_limit(), 100);
    /// assert_eq!(Chain::new(members)?.queue_limit(), DEFAULT_QUEUE_LIMIT);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn builder(members: impl IntoIterator<Item = RateLimiter<C>>) -> ChainBuilder<C> {
        ChainBuilder {
            members: members.into_iter().collect(),
            queue_limit: DEFAULT_QUEUE_LIMIT,
        }
    }

    /// The most permits that chain callers may wait for at once (see
    /// [`ChainBuilder::queue_limit`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Chain, RateLimiter};
    ///
    /// let chain = Chain::builder([RateLimiter::fixed_window(1, Duration::from_secs(1))?])
    ///     .queue_limit(8)
    ///     .build()?;
    /// assert_eq!(chain.queue_limit(), 8);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_limit(&self) -> u64 {
        Line::<()>::queue_limit(&self.core.line)
    }

    /// Takes one permit from every member, or none. See [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Chain, RateLimiter};
    ///
    /// let chain = Chain::new([RateLimiter::fixed_window(1, Duration::from_secs(60))?])?;
    /// assert!(chain.try_acquire().is_ok());
    /// assert!(chain.try_acquire().is_err());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Result<Admission, TryAcquireError> {
        self.try_acquire_n(1)
    }

    /// Takes `n` permits from every member if every member admits them now; otherwise takes none
    /// from any. Never blocks.
    ///
    /// `n == 0` is a probe: admitted iff every member has a permit now (a limiter listed k
    /// times: k), consuming nothing (the admission combines the members' own probes).
    ///
    /// A member with waiters queued in its own
    #[cfg_attr(feature = "tokio", doc = "[`acquire`](RateLimiter::acquire)")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire`")]
    /// (oldest first)
    /// rejects, as its own `try_acquire` would: chains do not barge either. Nor past the chain's
    /// own queue: while chain callers wait in
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n)")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`")]
    /// (or its blocking
    /// and timeout variants), the call is rejected and takes nothing, whatever the members have
    /// free. When nobody waits, that check is one atomic load.
    ///
    /// # Errors
    ///
    /// - [`TryAcquireError::Rejected`]: some member has too few permits now; `retry_after` is
    ///   the largest over the members (exact when nothing else is admitted meanwhile), `limit`
    ///   that member's limit. Also while chain callers wait: then a lower bound that counts them, when the
    ///   members could admit the permits they ask for and this call's at once (up to the
    ///   chain's capacity; a sliding counter member answers for this call alone; beyond a
    ///   member's capacity, no sooner than its algorithm allows that many in a row, as a
    ///   limiter's own refusal behind its queue), or a `retry_after` of 0 with the chain's
    ///   capacity as `limit` if they could now.
    /// - [`TryAcquireError::InsufficientCapacity`]: `n` exceeds the chain's
    ///   [`capacity`](Self::capacity).
    /// - [`TryAcquireError::Closed`]: a member was closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Chain, ManualClock, RateLimiter, TryAcquireError};
    ///
    /// let clock = ManualClock::new();
    /// let minute = RateLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 3, window: Duration::from_secs(60) },
    ///     clock.clone(),
    /// )?;
    /// let second = RateLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(1) },
    ///     clock.clone(),
    /// )?;
    /// let chain = Chain::new([minute.clone(), second])?;
    /// chain.try_acquire_n(2)?;
    /// clock.advance(Duration::from_secs(1));
    /// // The per-second member admits 2 again, the per-minute member only 1: nothing is taken.
    /// let err = chain.try_acquire_n(2).unwrap_err();
    /// assert_eq!(err.rejection().unwrap().retry_after(), Duration::from_secs(59));
    /// assert_eq!(minute.stats().available, 1);
    /// assert!(matches!(chain.try_acquire_n(3), Err(TryAcquireError::InsufficientCapacity { capacity: 2, .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_n(&self, n: u32) -> Result<Admission, TryAcquireError> {
        self.core.try_acquire(&(), n, Slots::default())
    }

    /// [`try_acquire_n`](Self::try_acquire_n) that also reports every member's own admission:
    /// on success `each` holds one per member, in member order (for example for one rate-limit
    /// header per policy); on failure it is left empty. `each` is reused, so a caller that keeps
    /// it allocates nothing after the first call.
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
    /// let clock = ManualClock::new();
    /// let chain = Chain::new([
    ///     RateLimiter::with_clock(Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) }, clock.clone())?,
    ///     RateLimiter::with_clock(Algorithm::FixedWindow { limit: 100, window: Duration::from_secs(60) }, clock)?,
    /// ])?;
    /// let mut each = Vec::new();
    /// let all = chain.try_acquire_n_into(4, &mut each)?;
    /// assert_eq!(each.iter().map(|a| a.remaining()).collect::<Vec<_>>(), [6, 96]);
    /// assert_eq!(all.remaining(), 6);
    /// assert_eq!(all.reset_after(), Duration::from_secs(60));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_n_into(
        &self,
        n: u32,
        each: &mut Vec<Admission>,
    ) -> Result<Admission, TryAcquireError> {
        self.core.try_acquire_into(&(), n, each)
    }

    /// Records `n` permits as used now on every member, without checking any limit: usage known
    /// only after the fact (the tokens an LLM reply used, the bytes a response sent). Each member
    /// is charged as by its own [`RateLimiter::charge`], whose documentation gives the debt and
    /// its bounds per algorithm. The charge is never rejected: members it takes over their limit
    /// are left in debt, and the chain then refuses calls until every member's debt has passed,
    /// with the largest `retry_after` among them, as for any chain rejection.
    ///
    /// **Every member that can record the charge records it; there is no all or nothing.** A
    /// chain call is checked on every member first because a rejection must cost nothing; a
    /// charge has nothing to reject (the usage has happened), so there is no check pass and
    /// nothing is refunded. A member that fails (it is closed) records nothing, every other
    /// member is charged all the same, and the call reports the failure. Leaving the others out
    /// would let them admit calls that their limits, counting the usage, must refuse. And
    /// "charge none if any would fail" is not a promise a chain could keep: a member can be
    /// closed between any check and its charge, and a charge cannot be taken back exactly
    /// (counts saturate, the exact sliding window overdraws).
    ///
    /// What is guaranteed, therefore, is per member: once `charge` returns, every member that
    /// did not fail has recorded the `n` permits (a limiter listed k times, k times `n`), and
    /// every call on it that starts afterwards sees them. Each member's charge is atomic on its
    /// own, as its own `charge` is; the chain's is not one atomic step: the members are charged
    /// one after the other, so a call racing the charge may see some members charged and others
    /// not yet. A member closed during the charge either records it or reports `Closed`, never
    /// both.
    ///
    /// `n == 0` records nothing and reports the members' combined state, as a probe does, but
    /// never fails for a full chain. The returned [`Admission`] combines the members' as
    /// [`try_acquire_n`](Self::try_acquire_n) does: the smallest `remaining` (0 while any member
    /// is in debt; a limiter listed k times counts its free permits in calls of k), the largest
    /// `reset_after` (until every member is back to full capacity, if nothing else is taken),
    /// the latest `at`. Waiters queued on a member are neither woken nor passed over. Charges are
    /// not counted in [`stats`](Self::stats), the chain's or the members'.
    ///
    /// # Errors
    ///
    /// [`TryAcquireError::Closed`] if a member is closed: it recorded nothing, and every other
    /// member was charged. If several fail, the first in member order is reported. Never
    /// `Rejected` nor `InsufficientCapacity`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Chain, ManualClock, Rate, RateLimiter, TryAcquireError};
    ///
    /// // 100 LLM tokens per second (bursts of 100), and 1,000 per hour.
    /// let clock = ManualClock::new();
    /// let per_second = RateLimiter::with_clock(
    ///     Algorithm::TokenBucket { rate: Rate::per_second(100), burst: 100 },
    ///     clock.clone(),
    /// )?;
    /// let per_hour = RateLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 1_000, window: Duration::from_secs(3600) },
    ///     clock.clone(),
    /// )?;
    /// let chain = Chain::new([per_second.clone(), per_hour.clone()])?;
    /// chain.try_acquire()?; // admit the request on one token...
    /// let state = chain.charge(149)?; // ...then charge the 149 its reply used
    /// assert_eq!(state.remaining(), 0); // the bucket is 50 tokens in debt
    /// assert_eq!(per_hour.stats().available, 850);
    /// let rejection = *chain.try_acquire().unwrap_err().rejection().unwrap();
    /// assert_eq!(rejection.retry_after(), Duration::from_millis(510)); // the bucket's debt + 1
    /// clock.advance(Duration::from_millis(510));
    /// assert!(chain.try_acquire().is_ok());
    ///
    /// // A closed member records nothing; the others are charged all the same.
    /// per_second.close();
    /// assert_eq!(chain.charge(10), Err(TryAcquireError::Closed));
    /// assert_eq!(per_hour.stats().available, 839);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge(&self, n: u32) -> Result<Admission, TryAcquireError> {
        self.core.charge(&(), n)
    }

    /// Waits until one permit is admitted by every member. See [`acquire_n`](Self::acquire_n).
    ///
    /// # Errors
    ///
    /// As [`acquire_n`](Self::acquire_n).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`acquire_n`](Self::acquire_n): no member's permit is held across an
    /// await, and dropping the future consumes nothing and leaves the chain's queue (passing
    /// the turn on if it was the caller's).
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
    /// let chain = Chain::new([RateLimiter::with_clock(
    ///     Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) },
    ///     clock,
    /// )?])?;
    /// let start = tokio::time::Instant::now();
    /// chain.acquire().await?;
    /// chain.acquire().await?; // the next window
    /// assert_eq!(start.elapsed(), Duration::from_secs(1));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire(&self) -> Result<Admission, AcquireError> {
        self.acquire_n(1).await
    }

    /// Waits until every member admits `n` permits at once.
    ///
    /// Each attempt is an all-or-nothing [`try_acquire_n`](Self::try_acquire_n); after a
    /// rejection the caller sleeps for its `retry_after` (the largest over the members, at
    /// least 1 ms) and tries again. The sleep ends early when a member changes: it
    /// is closed, reconfigured, a key of it is reset, another chain call gives it permits
    /// back, or a waiter of the member's own queue (which the chain defers to) gives up its
    /// wait (but not within its first millisecond, so that a member changing all the time
    /// cannot make it try again without a pause).
    /// Runs on any executor: it sleeps on tokio's timer inside a tokio runtime (which must then
    /// have its time driver enabled) and on futures-timer's helper thread anywhere else; with
    /// tokio's paused time, give the members a [`TokioClock`](crate::TokioClock).
    ///
    /// **Fair among chain callers: one queue, oldest first.** A caller that must wait joins the
    /// chain's own queue (bounded: [`ChainBuilder::queue_limit`]), shared with the blocking
    /// callers of [`acquire_blocking_n`](Self::acquire_blocking_n). Only the caller at its head
    /// makes attempts and sleeps between them; the others wait behind it in arrival order, and
    /// the next one takes its place at once when it leaves (admitted, failed, timed out or
    /// dropped). A caller that finds others waiting queues behind them without an attempt of
    /// its own, and [`try_acquire_n`](Self::try_acquire_n) is refused meanwhile: newcomers do
    /// not pass waiting chain callers. A small request waits behind a large one at the head.
    ///
    /// **Not fair across members.** The queue is the chain's, not the members': callers of a
    /// member itself (its own `try_acquire`, or another chain that shares it) can take the
    /// permits the head waits for, so under sustained contention on a member the head can wait
    /// indefinitely. The head does defer to a member's own queued waiters (oldest-first members
    /// reject chain attempts while anyone is queued).
    ///
    /// # Errors
    ///
    /// - [`AcquireError::InsufficientCapacity`] at once if `n` exceeds the smallest capacity (a
    ///   probe asks for one call: a chain of capacity 0 never admits it), whether or not others
    ///   wait.
    /// - [`AcquireError::Closed`] if a member is or gets closed.
    /// - [`AcquireError::QueueFull`] if the caller must wait and the chain's queue has no room
    ///   for `n` permits (a probe counts as one).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: between attempts the call holds no permit of any member (each attempt takes
    /// all or nothing without awaiting), so dropping the future at its await (a timeout, a
    /// `select!` branch, an aborted task) consumes nothing. It also leaves the chain's queue:
    /// its room is freed and, if it was the head, the next caller becomes the head at once. It
    /// is counted as cancelled.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, Chain, Rate, RateLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let clock = TokioClock::new();
    /// let chain = Chain::new([
    ///     RateLimiter::with_clock(Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 5 }, clock.clone())?,
    ///     RateLimiter::with_clock(Algorithm::FixedWindow { limit: 8, window: Duration::from_secs(2) }, clock)?,
    /// ])?;
    /// let start = tokio::time::Instant::now();
    /// chain.acquire_n(5).await?; // both admit at once
    /// chain.acquire_n(3).await?; // the bucket needs 300 ms to refill 3 permits
    /// assert_eq!(start.elapsed(), Duration::from_millis(300));
    /// chain.acquire_n(1).await?; // the window's 8 are spent: wait for the next one, at 2 s
    /// assert_eq!(start.elapsed(), Duration::from_secs(2));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_n(&self, n: u32) -> Result<Admission, AcquireError> {
        self.core.acquire(&(), n, Slots::default()).await
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
    /// use turnstile::{AcquireError, Algorithm, Chain, RateLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let chain = Chain::new([RateLimiter::with_clock(
    ///     Algorithm::SlidingWindow { limit: 1, window: Duration::from_secs(10) },
    ///     TokioClock::new(),
    /// )?])?;
    /// chain.acquire().await?;
    /// let late = chain.acquire_timeout(1, Duration::from_secs(1)).await;
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// assert_eq!(chain.stats().cancelled, 1);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_timeout(
        &self,
        n: u32,
        timeout: std::time::Duration,
    ) -> Result<Admission, AcquireError> {
        match crate::timer::timeout(timeout, self.acquire_n(n)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(AcquireError::Timeout),
        }
    }

    /// Blocks the calling thread until one permit is admitted by every member. See
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
    /// use turnstile::{Algorithm, Chain, MonotonicClock, RateLimiter};
    ///
    /// let window = Duration::from_millis(20);
    /// let chain = Chain::new([
    ///     RateLimiter::with_clock(Algorithm::FixedWindow { limit: 1, window }, MonotonicClock::new())?,
    ///     RateLimiter::with_clock(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(60) }, MonotonicClock::new())?,
    /// ])?;
    /// let first = chain.acquire_blocking()?;
    /// let second = chain.acquire_blocking()?; // the next 20 ms window of the first member
    /// assert!(second.at() >= first.at());
    /// assert_eq!(chain.stats().admitted, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking(&self) -> Result<Admission, AcquireError> {
        self.acquire_blocking_n(1)
    }

    /// Blocks the calling thread until every member admits `n` permits at once: for programs
    /// on plain threads, as
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n)")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`")]
    /// is for async ones.
    ///
    /// Each attempt is an all-or-nothing [`try_acquire_n`](Self::try_acquire_n); after a
    /// rejection the thread sleeps (real time) for its `retry_after`, the largest over the
    /// members (at least 1 ms), or until a member changes (as for
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n)),")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`),")]
    /// and tries again. Fairness as
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n):")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`:")]
    /// oldest first among chain callers, in the same queue as the async ones (only its head
    /// makes attempts), none across members, and it defers to a member's own queued waiters.
    /// With a [`ManualClock`](crate::ManualClock) that nobody advances, it waits forever.
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
    /// use turnstile::{Algorithm, Chain, Rate, RateLimiter};
    ///
    /// // 1,000 per second, bursts of 10, and at most 40 per minute.
    /// let chain = Chain::new([
    ///     RateLimiter::token_bucket(Rate::per_second(1000), 10)?,
    ///     RateLimiter::fixed_window(40, std::time::Duration::from_secs(60))?,
    /// ])?;
    /// let threads: Vec<_> = (0..4)
    ///     .map(|_| {
    ///         let chain = chain.clone();
    ///         std::thread::spawn(move || chain.acquire_blocking_n(10).map(|_| ()))
    ///     })
    ///     .collect();
    /// for t in threads {
    ///     t.join().unwrap()?;
    /// }
    /// assert_eq!(chain.stats().admitted, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_n(&self, n: u32) -> Result<Admission, AcquireError> {
        self.core.acquire_blocking(&(), n, Slots::default(), None)
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n) with a time limit (real time); on
    /// timeout nothing is consumed, and the call counts as cancelled.
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
    /// chain.acquire_blocking()?;
    /// let late = chain.acquire_blocking_timeout(1, Duration::from_millis(10));
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// assert_eq!(chain.stats().cancelled, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_timeout(
        &self,
        n: u32,
        timeout: std::time::Duration,
    ) -> Result<Admission, AcquireError> {
        let deadline = std::time::Instant::now().checked_add(timeout);
        self.core
            .acquire_blocking(&(), n, Slots::default(), deadline)
    }

    /// The members, in the order given.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Chain, RateLimiter};
    ///
    /// let chain = Chain::new([RateLimiter::fixed_window(5, Duration::from_secs(1))?])?;
    /// chain.try_acquire_n(2)?;
    /// assert_eq!(chain.members()[0].stats().available, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn members(&self) -> &[RateLimiter<C>] {
        &self.core.members
    }

    /// The most permits one call can get: the smallest member capacity (a limiter listed k
    /// times counts a k-th of its own).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Chain, Rate, RateLimiter};
    ///
    /// let chain = Chain::new([
    ///     RateLimiter::token_bucket(Rate::per_second(100), 7)?,
    ///     RateLimiter::fixed_window(50, Duration::from_secs(1))?,
    /// ])?;
    /// assert_eq!(chain.capacity(), 7);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn capacity(&self) -> u32 {
        self.core.capacity::<()>()
    }

    /// Counts so far. See [`ChainStats`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Chain, RateLimiter};
    ///
    /// let chain = Chain::new([RateLimiter::fixed_window(1, Duration::from_secs(60))?])?;
    /// let _ = chain.try_acquire();
    /// let _ = chain.try_acquire();
    /// assert_eq!((chain.stats().admitted, chain.stats().rejected), (1, 1));
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn stats(&self) -> ChainStats {
        self.core.stats::<()>()
    }
}

/// Builds a [`Chain`]; see [`Chain::builder`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Chain, Rate, RateLimiter};
///
/// let chain = Chain::builder([
///     RateLimiter::token_bucket(Rate::per_second(10), 10)?,
///     RateLimiter::fixed_window(1_000, Duration::from_secs(3600))?,
/// ])
/// .queue_limit(50)
/// .build()?;
/// assert_eq!(chain.capacity(), 10);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct ChainBuilder<C: Clock = DefaultClock> {
    members: Vec<RateLimiter<C>>,
    queue_limit: u64,
}

impl<C: Clock> fmt::Debug for ChainBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChainBuilder")
            .field("members", &self.members)
            .field("queue_limit", &self.queue_limit)
            .finish()
    }
}

impl<C: Clock> ChainBuilder<C> {
    /// The most permits that chain callers may wait for at once in the chain's queue (default
    /// [`DEFAULT_QUEUE_LIMIT`]), the caller whose turn it is included; a waiting probe
    /// (`n == 0`) counts as one, and limits above `u32::MAX` count as `u32::MAX`. A caller that
    /// must wait and finds no room fails with [`AcquireError::QueueFull`], as a member's own
    /// waiter does; with a limit of 0 nobody waits. A caller admitted at once takes no room.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{AcquireError, Chain, RateLimiter};
    ///
    /// let member = RateLimiter::fixed_window(1, Duration::from_secs(3600))?;
    /// let chain = Chain::builder([member]).queue_limit(0).build()?;
    /// chain.acquire_blocking()?; // admitted at once: no room needed
    /// assert_eq!(
    ///     chain.acquire_blocking(),
    ///     Err(AcquireError::QueueFull { requested: 1, queue_limit: 0 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queue_limit(mut self, permits: u64) -> Self {
        self.queue_limit = permits;
        self
    }

    /// Builds the chain.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] if there are no members.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{Chain, ConfigError, RateLimiter};
    ///
    /// let empty = Chain::builder(Vec::<RateLimiter>::new()).build();
    /// assert_eq!(empty.unwrap_err(), ConfigError::Zero { what: "chain members" });
    /// ```
    pub fn build(self) -> Result<Chain<C>, ConfigError> {
        let global_from = self.members.len();
        let line = ChainLine::new(self.queue_limit)?;
        Ok(Chain {
            core: Arc::new(Core::new::<()>(self.members, global_from, line)?),
        })
    }
}

/// A member of a [`KeyedChain`]: a limiter per key, or one limiter for every key.
#[cfg(feature = "keyed")]
enum Link<K, C: Clock, S> {
    PerKey(KeyedLimiter<K, C, S>),
    Global(RateLimiter<C>),
}

#[cfg(feature = "keyed")]
impl<K, C, S> Member<K> for Link<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    #[inline]
    fn decide<const COMMIT: bool>(
        &self,
        key: &K,
        n: u32,
    ) -> (Result<Admission, TryAcquireError>, Committed, bool) {
        match self {
            Link::PerKey(l) => l.chain_decide_uncounted::<COMMIT>(key, n),
            Link::Global(l) => (l.chain_decide::<COMMIT>(n), Committed::default(), false),
        }
    }
    fn refund(&self, key: &K, n: u32, admission: &Admission, committed: Committed) {
        match self {
            Link::PerKey(l) => l.chain_refund(key, n, admission, committed),
            Link::Global(l) => l.chain_refund(n, admission),
        }
    }
    fn version(&self) -> u64 {
        match self {
            Link::PerKey(l) => l.params_version(),
            Link::Global(l) => l.params_version(),
        }
    }
    fn receipt_refund(
        &self,
        key: &K,
        n: u32,
        admission: &Admission,
        committed: Committed,
        version: u64,
    ) {
        match self {
            Link::PerKey(l) => {
                KeyedLimiter::receipt_refund(l, key, n, admission, committed, version);
            }
            Link::Global(l) => RateLimiter::receipt_refund(l, n, admission, version),
        }
    }
    fn wake(&self, key: &K, overflow: bool, except: Option<&Watcher>) {
        match self {
            Link::PerKey(l) => l.chain_wake(key, overflow, except),
            Link::Global(l) => l.chain_wake(except),
        }
    }
    fn charge(&self, key: &K, n: u32) -> Result<Admission, TryAcquireError> {
        match self {
            Link::PerKey(l) => l.charge(key, n),
            Link::Global(l) => l.charge(n),
        }
    }
    fn same(&self, other: &Self) -> bool {
        match (self, other) {
            (Link::PerKey(a), Link::PerKey(b)) => a.chain_same(b),
            (Link::Global(a), Link::Global(b)) => a.chain_same(b),
            _ => false,
        }
    }
    fn exact_refund(&self) -> bool {
        match self {
            Link::PerKey(l) => l.chain_exact_refund(),
            Link::Global(l) => l.chain_exact_refund(),
        }
    }
    fn weighs_less_later(&self) -> bool {
        let algorithm = match self {
            Link::PerKey(l) => l.algorithm(),
            Link::Global(l) => l.algorithm(),
        };
        matches!(algorithm, crate::Algorithm::SlidingCounter { .. })
    }
    fn capacity(&self) -> u32 {
        match self {
            Link::PerKey(l) => l.chain_capacity(),
            Link::Global(l) => l.capacity(),
        }
    }
    fn beyond_limit(&self, at_limit: u64, extra: u64) -> u64 {
        match self {
            Link::PerKey(l) => l.chain_beyond_limit(at_limit, extra),
            Link::Global(l) => l.chain_beyond_limit(at_limit, extra),
        }
    }
    fn count(&self, which: usize) {
        match self {
            // Keyed statistics count no cancellations: a given-up wait ended without permits.
            Link::PerKey(l) => l.chain_count(if which == CANCELLED { REJECTED } else { which }),
            Link::Global(l) => l.chain_count(which),
        }
    }
    fn count_overflow(&self) {
        if let Link::PerKey(l) = self {
            l.chain_count(OVERFLOWED);
        }
    }
    fn catch_up(&self) {
        match self {
            Link::PerKey(l) => l.chain_catch_up(),
            Link::Global(l) => l.chain_catch_up(),
        }
    }
    fn watchers(&self) -> &Watchers {
        match self {
            Link::PerKey(l) => l.chain_watchers(),
            Link::Global(l) => l.chain_watchers(),
        }
    }
}

/// Several limits per key at once, plus limits shared by every key: a call for a key is admitted
/// only if every per-key member admits it for that key and every global member admits it.
///
/// For example 10 per second and 1,000 per hour per user, plus 5,000 per second for the whole
/// service. The semantics are [`Chain`]'s (check every member, then commit, refunding on a lost
/// race or at a key cap, below; the combined admission and the largest `retry_after`); the
/// per-key members are [`KeyedLimiter`]s on the same key type, the global ones
/// [`RateLimiter`]s, all on one clock type. Build one with [`KeyedChain::builder`].
///
/// A check creates no key; a key is created by its first commit, as with the keyed limiter's
/// own `try_acquire`. At a per-key member's key cap, once that member has searched for room and
/// found no key it could evict yet, the check answers a new key as the commit would
/// ([`TooManyKeys`](TryAcquireError::TooManyKeys), or the shared overflow limiter's decision),
/// so that a flood of new keys is refused without touching the other members. Until such a
/// search has failed, a new key's check passes there, and a commit that then finds no room and
/// is refused (`TooManyKeys`, or by the shared overflow limiter) comes after the members before
/// it admitted, which give their permits back (counted in [`ChainStats::refunded`]) with no
/// other call in flight. Refunds find the key's cell again by its key; a cell evicted meanwhile
/// no longer held anything of the refunded admission, and its replacement is left alone.
///
/// Cloning is cheap and clones share state.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, ManualClock, RateLimiter};
///
/// let clock = ManualClock::new();
/// let per_user = KeyedLimiter::with_clock(
///     Algorithm::FixedWindow { limit: 2, window: Duration::from_secs(1) },
///     clock.clone(),
/// )?;
/// let everyone = RateLimiter::with_clock(
///     Algorithm::FixedWindow { limit: 3, window: Duration::from_secs(1) },
///     clock.clone(),
/// )?;
/// let chain = KeyedChain::builder().per_key(per_user).global(everyone).build()?;
///
/// chain.try_acquire_n(&"alice", 2)?;
/// assert!(chain.try_acquire(&"alice").is_err()); // alice's 2 per second
/// chain.try_acquire(&"bob")?;
/// assert!(chain.try_acquire(&"carol").is_err()); // everyone's 3 per second
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[cfg(feature = "keyed")]
pub struct KeyedChain<K, C: Clock = DefaultClock, S = crate::sync::RandomHasher> {
    core: Arc<Core<Link<K, C, S>, KeyedLine<K>>>,
}

#[cfg(feature = "keyed")]
impl<K, C: Clock, S> Clone for KeyedChain<K, C, S> {
    fn clone(&self) -> Self {
        KeyedChain {
            core: Arc::clone(&self.core),
        }
    }
}

#[cfg(feature = "keyed")]
impl<K, C: Clock, S> fmt::Debug for KeyedChain<K, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("KeyedChain");
        for member in self.core.members.iter() {
            match member {
                Link::PerKey(l) => d.field("per_key", l),
                Link::Global(l) => d.field("global", l),
            };
        }
        d.finish_non_exhaustive()
    }
}

/// Builds a [`KeyedChain`]: per-key members and global members, in the order added.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, Rate, RateLimiter};
///
/// let chain = KeyedChain::builder()
///     .per_key(KeyedLimiter::<u64>::new(Algorithm::TokenBucket { rate: Rate::per_second(10), burst: 10 })?)
///     .per_key(KeyedLimiter::new(Algorithm::SlidingWindow { limit: 1_000, window: Duration::from_secs(3600) })?)
///     .global(RateLimiter::token_bucket(Rate::per_second(5_000), 5_000)?)
///     .build()?;
/// assert!(chain.try_acquire(&42).is_ok());
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[cfg(feature = "keyed")]
#[must_use = "a builder does nothing until `build` is called"]
pub struct KeyedChainBuilder<K, C: Clock = DefaultClock, S = crate::sync::RandomHasher> {
    per_key: Vec<KeyedLimiter<K, C, S>>,
    global: Vec<RateLimiter<C>>,
    queue_limit: u64,
}

#[cfg(feature = "keyed")]
impl<K, C: Clock, S> fmt::Debug for KeyedChainBuilder<K, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedChainBuilder")
            .field("per_key", &self.per_key)
            .field("global", &self.global)
            .field("queue_limit", &self.queue_limit)
            .finish()
    }
}

#[cfg(feature = "keyed")]
impl<K, C: Clock, S> KeyedChainBuilder<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Adds a member limiting each key on its own.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::<&str>::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(60) })?)
    ///     .build()?;
    /// assert!(chain.try_acquire(&"a").is_ok());
    /// assert!(chain.try_acquire(&"a").is_err());
    /// assert!(chain.try_acquire(&"b").is_ok());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn per_key(mut self, limiter: KeyedLimiter<K, C, S>) -> Self {
        self.per_key.push(limiter);
        self
    }

    /// Adds a member shared by every key.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedChain, RateLimiter};
    ///
    /// let chain = KeyedChain::<u32>::builder()
    ///     .global(RateLimiter::fixed_window(1, Duration::from_secs(60))?)
    ///     .build()?;
    /// assert!(chain.try_acquire(&1).is_ok());
    /// assert!(chain.try_acquire(&2).is_err()); // one per minute for all keys together
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn global(mut self, limiter: RateLimiter<C>) -> Self {
        self.global.push(limiter);
        self
    }

    /// The most permits that chain callers may wait for at once in each key's queue (default
    /// [`DEFAULT_QUEUE_LIMIT`]): [`ChainBuilder::queue_limit`], per key. Besides, at most
    /// [`DEFAULT_MAX_KEYS`](crate::DEFAULT_MAX_KEYS) keys have chain callers waiting at once;
    /// a caller of another key that must wait then fails with
    /// [`AcquireError::TooManyKeys`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{AcquireError, Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let per_key = KeyedLimiter::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(3600) })?;
    /// let chain = KeyedChain::builder().per_key(per_key).queue_limit(0).build()?;
    /// chain.acquire_blocking(&"k")?; // admitted at once: no room needed
    /// assert_eq!(
    ///     chain.acquire_blocking(&"k"),
    ///     Err(AcquireError::QueueFull { requested: 1, queue_limit: 0 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queue_limit(mut self, permits: u64) -> Self {
        self.queue_limit = permits;
        self
    }

    /// Builds the chain.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] if no member was added.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConfigError, KeyedChain};
    ///
    /// let empty = KeyedChain::<u64>::builder().build();
    /// assert_eq!(empty.unwrap_err(), ConfigError::Zero { what: "chain members" });
    /// ```
    pub fn build(self) -> Result<KeyedChain<K, C, S>, ConfigError> {
        let global_from = self.per_key.len();
        let members: Vec<Link<K, C, S>> = self
            .per_key
            .into_iter()
            .map(Link::PerKey)
            .chain(self.global.into_iter().map(Link::Global))
            .collect();
        let line = KeyedLine::new(self.queue_limit)?;
        Ok(KeyedChain {
            core: Arc::new(Core::new::<K>(members, global_from, line)?),
        })
    }
}

#[cfg(feature = "keyed")]
impl<K, C: Clock, S> KeyedChain<K, C, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// An empty builder; add members with [`per_key`](KeyedChainBuilder::per_key) and
    /// [`global`](KeyedChainBuilder::global).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::<u64>::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) })?)
    ///     .build()?;
    /// assert_eq!(chain.capacity(), 5);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn builder() -> KeyedChainBuilder<K, C, S> {
        KeyedChainBuilder {
            per_key: Vec::new(),
            global: Vec::new(),
            queue_limit: DEFAULT_QUEUE_LIMIT,
        }
    }

    /// Takes one permit for `key` from every member, or none. See
    /// [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](Self::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::new(Algorithm::SlidingWindow { limit: 1, window: Duration::from_secs(60) })?)
    ///     .build()?;
    /// assert!(chain.try_acquire(&"token-1").is_ok());
    /// assert!(chain.try_acquire(&"token-1").is_err());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self, key: &K) -> Result<Admission, TryAcquireError> {
        self.try_acquire_n(key, 1)
    }

    /// Takes `n` permits for `key` from every member if all admit them now; otherwise takes none
    /// from any. Never blocks. Same semantics as [`Chain::try_acquire_n`], with each per-key
    /// member deciding on `key`'s own state; refused while chain callers wait for `key` (only
    /// for `key`: when no key has any, one atomic load says so).
    ///
    /// # Errors
    ///
    /// As [`Chain::try_acquire_n`], and [`TryAcquireError::TooManyKeys`] if a per-key member
    /// cannot take a new key (see [`KeyOverflow`](crate::KeyOverflow)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, ManualClock, RateLimiter};
    ///
    /// let clock = ManualClock::new();
    /// let per_key = KeyedLimiter::with_clock(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(1) }, clock.clone())?;
    /// let global = RateLimiter::with_clock(Algorithm::FixedWindow { limit: 6, window: Duration::from_secs(1) }, clock)?;
    /// let chain = KeyedChain::builder().per_key(per_key.clone()).global(global).build()?;
    /// chain.try_acquire_n(&1u8, 4)?;
    /// // Key 2 could take 3, but the global member has only 2 left: key 2 is charged nothing.
    /// assert!(chain.try_acquire_n(&2u8, 3).is_err());
    /// assert_eq!(per_key.available(&2u8), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_n(&self, key: &K, n: u32) -> Result<Admission, TryAcquireError> {
        self.core.try_acquire(key, n, Slots::default())
    }

    /// [`try_acquire_n`](Self::try_acquire_n) that also reports every member's admission: on
    /// success `each` holds one per member, per-key members first, each group in the order
    /// added; on failure it is left empty.
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
    /// let clock = ManualClock::new();
    /// let chain = KeyedChain::builder()
    ///     .global(RateLimiter::with_clock(Algorithm::FixedWindow { limit: 100, window: Duration::from_secs(1) }, clock.clone())?)
    ///     .per_key(KeyedLimiter::with_clock(Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) }, clock)?)
    ///     .build()?;
    /// let mut each = Vec::new();
    /// chain.try_acquire_n_into(&"k", 3, &mut each)?;
    /// assert_eq!(each.iter().map(|a| a.remaining()).collect::<Vec<_>>(), [7, 97]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_n_into(
        &self,
        key: &K,
        n: u32,
        each: &mut Vec<Admission>,
    ) -> Result<Admission, TryAcquireError> {
        self.core.try_acquire_into(key, n, each)
    }

    /// Records `n` permits as used now by `key` on every member, without checking any limit:
    /// [`Chain::charge`] (its semantics and its reasons), with each per-key member charging
    /// `key` as [`KeyedLimiter::charge`] does (a new key is made, and starts with the charge) and
    /// each global member charging the call as [`RateLimiter::charge`] does.
    ///
    /// Every member that can record the charge records it, and a member's failure is reported
    /// after the others were charged. A per-key member at its key cap, with no idle key to
    /// evict, treats a new key as its own `charge` does: under
    /// [`KeyOverflow::Reject`](crate::KeyOverflow::Reject) it records nothing and the call
    /// reports [`TooManyKeys`](TryAcquireError::TooManyKeys), the other members charged (the
    /// usage still counts against the global limits, and against every per-key member that
    /// tracks the key); under [`KeyOverflow::Shared`](crate::KeyOverflow::Shared) the shared
    /// overflow cell is charged, which is no error. Checking the cap first could not promise
    /// more: another thread's new key can fill it between the check and the charge.
    ///
    /// # Errors
    ///
    /// - [`TryAcquireError::TooManyKeys`]: a per-key member could not take the new key, as
    ///   above.
    /// - [`TryAcquireError::Closed`]: a member is closed, global or per key (it recorded
    ///   nothing).
    ///
    /// If several members fail, the first in member order (per-key members first) is reported.
    /// Never `Rejected` nor `InsufficientCapacity`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{
    ///     Algorithm, KeyOverflow, KeyedChain, KeyedLimiter, ManualClock, RateLimiter, TryAcquireError,
    /// };
    ///
    /// // 10 logins a minute per user and 100 for everyone; a failed login costs 5.
    /// let clock = ManualClock::new();
    /// let minute = Duration::from_secs(60);
    /// let per_user = KeyedLimiter::builder(Algorithm::FixedWindow { limit: 10, window: minute })
    ///     .clock(clock.clone())
    ///     .max_keys(1)
    ///     .overflow(KeyOverflow::Reject)
    ///     .build()?;
    /// let everyone = RateLimiter::with_clock(Algorithm::FixedWindow { limit: 100, window: minute }, clock.clone())?;
    /// let chain = KeyedChain::builder().per_key(per_user).global(everyone.clone()).build()?;
    /// chain.try_acquire(&"mallory")?;
    /// assert_eq!(chain.charge(&"mallory", 5)?.remaining(), 4);
    /// assert_eq!(chain.charge(&"mallory", 5)?.remaining(), 0); // one over: in debt
    /// assert!(chain.try_acquire(&"mallory").is_err());
    /// // The key cap is full: a new key is refused by the per-key member, charged globally.
    /// assert_eq!(chain.charge(&"eve", 5), Err(TryAcquireError::TooManyKeys { max_keys: 1 }));
    /// assert_eq!(everyone.stats().available, 84);
    /// clock.advance(minute); // the next window starts empty
    /// assert!(chain.try_acquire(&"mallory").is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge(&self, key: &K, n: u32) -> Result<Admission, TryAcquireError> {
        self.core.charge(key, n)
    }

    /// [`try_acquire_n`](Self::try_acquire_n) that, on success, also returns what
    /// [`give_back`](Self::give_back) needs to return the permits: for a request that several
    /// chains must admit all or nothing (the HTTP rules counted in Redis, decided by their local
    /// fallbacks while Redis is away: charged one after the other, the earlier given back when
    /// a later one rejects).
    #[cfg(feature = "redis")]
    pub(crate) fn try_acquire_n_taken(
        &self,
        key: &K,
        n: u32,
    ) -> Result<(Admission, Taken), TryAcquireError> {
        let members = self.core.members.len();
        let mut taken = Taken {
            admissions: vec![Admission::new(0, 0, 0); members],
            flags: vec![Committed::default(); members],
        };
        let admission = self.core.try_acquire(
            key,
            n,
            Slots {
                admissions: Some(&mut taken.admissions),
                flags: Some(&mut taken.flags),
                versions: None,
            },
        )?;
        Ok((admission, taken))
    }

    /// Gives back the `n` permits that [`try_acquire_n_taken`](Self::try_acquire_n_taken) took
    /// for `key`.
    #[cfg(feature = "redis")]
    pub(crate) fn give_back(&self, key: &K, n: u32, taken: &Taken) {
        self.core.give_back(key, n, &taken.admissions, &taken.flags);
    }

    /// Waits until one permit for `key` is admitted by every member. See
    /// [`acquire_n`](Self::acquire_n).
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
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::with_clock(
    ///         Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(1) },
    ///         TokioClock::new(),
    ///     )?)
    ///     .build()?;
    /// let start = tokio::time::Instant::now();
    /// chain.acquire(&"alice").await?;
    /// chain.acquire(&"bob").await?; // another key: no wait
    /// chain.acquire(&"alice").await?; // alice's next window
    /// assert_eq!(start.elapsed(), Duration::from_secs(1));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire(&self, key: &K) -> Result<Admission, AcquireError> {
        self.acquire_n(key, 1).await
    }

    /// Waits until every member admits `n` permits for `key` at once; see
    /// [`Chain::acquire_n`] for how it waits and its fairness: one queue of chain callers per
    /// key, oldest first (callers for other keys neither wait in it nor are refused for it),
    /// none across members. Besides the changes
    /// that end its sleep there, a per-key member's [`sweep`](KeyedLimiter::sweep) (or
    /// `run_sweeper`) that evicts idle keys ends it too (a key new to a member at its cap,
    /// decided on the shared overflow cell, may now get a cell of its own).
    ///
    /// # Errors
    ///
    /// As [`Chain::acquire_n`] (`QueueFull` when the key's queue has no room), and
    /// [`AcquireError::TooManyKeys`] at once if a per-key member cannot take a new key, or if
    /// the caller must wait while chain callers of
    /// [`DEFAULT_MAX_KEYS`](crate::DEFAULT_MAX_KEYS) other keys wait.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: between attempts the call holds no permit of any member, so dropping the
    /// future consumes nothing; it leaves its key's queue (the next caller for the key becomes
    /// the head at once if it was the head).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, Rate, RateLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let clock = TokioClock::new();
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::with_clock(Algorithm::TokenBucket { rate: Rate::per_second(2), burst: 2 }, clock.clone())?)
    ///     .global(RateLimiter::with_clock(Algorithm::TokenBucket { rate: Rate::per_second(100), burst: 100 }, clock)?)
    ///     .build()?;
    /// let start = tokio::time::Instant::now();
    /// chain.acquire_n(&7u32, 2).await?;
    /// chain.acquire_n(&7u32, 2).await?; // key 7 refills 2 permits in a second
    /// assert_eq!(start.elapsed(), Duration::from_secs(1));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_n(&self, key: &K, n: u32) -> Result<Admission, AcquireError> {
        self.core.acquire(key, n, Slots::default()).await
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
    /// use turnstile::{AcquireError, Algorithm, KeyedChain, KeyedLimiter, TokioClock};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::with_clock(
    ///         Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(60) },
    ///         TokioClock::new(),
    ///     )?)
    ///     .build()?;
    /// chain.acquire(&1u64).await?;
    /// let late = chain.acquire_timeout(&1u64, 1, Duration::from_secs(1)).await;
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
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
        match crate::timer::timeout(timeout, self.acquire_n(key, n)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(AcquireError::Timeout),
        }
    }

    /// Blocks the calling thread until one permit for `key` is admitted by every member. See
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
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, RateLimiter};
    ///
    /// let window = Duration::from_millis(20);
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::<&str>::new(Algorithm::FixedWindow { limit: 1, window })?)
    ///     .global(RateLimiter::fixed_window(100, Duration::from_secs(1))?)
    ///     .build()?;
    /// chain.acquire_blocking(&"alice")?;
    /// chain.acquire_blocking(&"bob")?; // another key: no wait
    /// chain.acquire_blocking(&"alice")?; // alice's next 20 ms window
    /// assert_eq!(chain.stats().admitted, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking(&self, key: &K) -> Result<Admission, AcquireError> {
        self.acquire_blocking_n(key, 1)
    }

    /// Blocks the calling thread until every member admits `n` permits for `key` at once; see
    /// [`Chain::acquire_blocking_n`] for how it waits and its fairness (per key, in the same
    /// queues as the async callers), and
    #[cfg_attr(feature = "tokio", doc = "[`acquire_n`](Self::acquire_n)")]
    #[cfg_attr(not(feature = "tokio"), doc = "`acquire_n`")]
    /// for what else ends its wait early.
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
    /// use turnstile::{AcquireError, Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::<u32>::new(Algorithm::FixedWindow { limit: 4, window: Duration::from_secs(1) })?)
    ///     .build()?;
    /// assert_eq!(chain.acquire_blocking_n(&1u32, 3)?.remaining(), 1);
    /// assert_eq!(
    ///     chain.acquire_blocking_n(&1u32, 5),
    ///     Err(AcquireError::InsufficientCapacity { requested: 5, capacity: 4 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_n(&self, key: &K, n: u32) -> Result<Admission, AcquireError> {
        self.core.acquire_blocking(key, n, Slots::default(), None)
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n) with a time limit (real time); on
    /// timeout nothing is consumed, and the call counts as cancelled.
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
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::<&str>::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(3600) })?)
    ///     .build()?;
    /// chain.acquire_blocking(&"k")?;
    /// let late = chain.acquire_blocking_timeout(&"k", 1, Duration::from_millis(10));
    /// assert_eq!(late.unwrap_err(), AcquireError::Timeout);
    /// assert_eq!(chain.stats().cancelled, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_timeout(
        &self,
        key: &K,
        n: u32,
        timeout: std::time::Duration,
    ) -> Result<Admission, AcquireError> {
        let deadline = std::time::Instant::now().checked_add(timeout);
        self.core
            .acquire_blocking(key, n, Slots::default(), deadline)
    }

    /// The per-key members, in the order added.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::new(Algorithm::FixedWindow { limit: 5, window: Duration::from_secs(60) })?)
    ///     .build()?;
    /// chain.try_acquire_n(&"k", 2)?;
    /// assert_eq!(chain.per_key().next().unwrap().available(&"k"), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn per_key(&self) -> impl Iterator<Item = &KeyedLimiter<K, C, S>> + '_ {
        self.core.members.iter().filter_map(|m| match m {
            Link::PerKey(l) => Some(l),
            Link::Global(_) => None,
        })
    }

    /// The global members, in the order added.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedChain, RateLimiter};
    ///
    /// let chain = KeyedChain::<u8>::builder()
    ///     .global(RateLimiter::fixed_window(5, Duration::from_secs(60))?)
    ///     .build()?;
    /// chain.try_acquire(&1)?;
    /// assert_eq!(chain.global().next().unwrap().stats().available, 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn global(&self) -> impl Iterator<Item = &RateLimiter<C>> + '_ {
        self.core.members.iter().filter_map(|m| match m {
            Link::PerKey(_) => None,
            Link::Global(l) => Some(l),
        })
    }

    /// The most permits one call can get: the smallest member capacity (a limiter listed k
    /// times counts a k-th of its own).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, RateLimiter};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::<u64>::new(Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) })?)
    ///     .global(RateLimiter::fixed_window(4, Duration::from_secs(1))?)
    ///     .build()?;
    /// assert_eq!(chain.capacity(), 4);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn capacity(&self) -> u32 {
        self.core.capacity::<K>()
    }

    /// The most permits that chain callers may wait for at once per key (see
    /// [`KeyedChainBuilder::queue_limit`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter, DEFAULT_QUEUE_LIMIT};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::<u64>::new(Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) })?)
    ///     .build()?;
    /// assert_eq!(chain.queue_limit(), DEFAULT_QUEUE_LIMIT);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn queue_limit(&self) -> u64 {
        Line::<K>::queue_limit(&self.core.line)
    }

    /// Counts so far. See [`ChainStats`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Algorithm, KeyedChain, KeyedLimiter};
    ///
    /// let chain = KeyedChain::builder()
    ///     .per_key(KeyedLimiter::new(Algorithm::FixedWindow { limit: 1, window: Duration::from_secs(60) })?)
    ///     .build()?;
    /// let _ = chain.try_acquire(&'x');
    /// let _ = chain.try_acquire(&'x');
    /// assert_eq!((chain.stats().admitted, chain.stats().rejected), (1, 1));
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn stats(&self) -> ChainStats {
        self.core.stats::<K>()
    }
}
