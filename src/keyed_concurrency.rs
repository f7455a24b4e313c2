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
    CountOverflow, Ctx, DEFAULT_MAX_KEYS, KeyOverflow, Keyed, KeyedStats, RetireOnExit, Shard,
    Slot, Unused, Waits, evicted_here, shard_count, waiting_error,
};
use crate::queue::{Blocked, Capacity, DEFAULT_QUEUE_LIMIT, QueueOrder, WAITERS, Woken, no_timer};
use crate::sync::{
    ADMITTED, Arc, AtomicU64, CANCELLED, Mutex, OVERFLOWED, Ordering, REJECTED, WakeAll, fence,
    lock, wake_all,
};
use crossbeam_utils::CachePadded;
use std::cell::Cell;
use std::fmt;
use std::hash::{BuildHasher, Hash};

/// Cell bit: the cell has given out permits at least once. A cell without it is one its inserter
/// has not used yet, which is never retired (see [`Algo::retire`]).
const USED: u64 = 1 << 33;

/// One step of the permit word's wake tag (bits 62..34), bumped by every release that consumes
/// a head's `WAITERS` mark: a sweep's compare-and-swap from an idle word it judged then fails if
/// a head was woken since (see [`Concurrency::retire_unless`]).
const WAKE_TAG: u64 = 1 << 34;

/// The wake tag's bits (62..34; bit 63 stays clear, so a live word is never [`RETIRED`]).
const WAKE_TAGS: u64 = ((1 << 29) - 1) << 34;

/// The word after a release consumed the head's mark: `WAITERS` cleared, the tag bumped (it
/// wraps within its bits).
#[inline]
fn consumed(word: u64) -> u64 {
    (word & !WAITERS & !WAKE_TAGS) | (word & WAKE_TAGS).wrapping_add(WAKE_TAG) & WAKE_TAGS
}

/// Permits in use in a permit word (its low 32 bits).
#[inline(always)]
fn used(word: u64) -> u32 {
    word as u32
}

/// Permits free under `limit` when `in_use` are held (0 while a lowered limit drains).
#[inline(always)]
fn free_of(limit: u32, in_use: u32) -> u32 {
    limit.saturating_sub(in_use)
}

/// The limit in a `config` word (its low 32 bits; the high 32 are the generation).
#[inline(always)]
fn limit_of(config: u64) -> u32 {
    config as u32
}

/// One step of the `config` word's generation (bits 63..32), bumped by every `set_limit`.
const CONFIG_GENERATION: u64 = 1 << 32;

/// What a [`Concurrency::take`] that gave back a stale admission owes the key (see
/// [`Concurrency::take`]): a wake for a head that marked the word meanwhile, and an idle hint if
/// the word is back to idle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Undone {
    pub(crate) wake: bool,
    pub(crate) idle: bool,
}

impl Undone {
    /// Both debts.
    fn and(self, other: Undone) -> Undone {
        Undone {
            wake: self.wake | other.wake,
            idle: self.idle | other.idle,
        }
    }
}

/// The outcome of a take, `Ok(Ok(remaining))` taken, `Ok(Err(free))` too few free (nothing
/// kept), or an error; and, *whatever the outcome*, the debts of any stale admission given back
/// on the way. A take that gave back and then met a retired cell (`Closed`) or a limit lowered
/// below `n` (`InsufficientCapacity`) still owes them: the give-back may have consumed a head's
/// `WAITERS` mark, and nobody else will wake that head.
pub(crate) type Taken = (Result<Result<u32, u32>, TryAcquireError>, Undone);

/// The debts of stale admissions given back during one `with_cell` call, by the kind of cell
/// they were given back to. One call can give back on a key's cell and end elsewhere: on a fresh
/// cell (the old one was retired once the give-back left it idle), on the shared pool, or in an
/// error. So the take closure records them here, and the caller pays them after `with_cell`
/// returns, whatever it returned.
///
/// `room`: the sweeps the call ran on its way (a search for room at the cap, the sweep an
/// insert pays for) evicted keys, and gave their slots back; one may be left over once the call
/// has taken its own (see [`Inner::room_made`]).
#[derive(Default)]
struct Owed {
    key: Cell<Undone>,
    pool: Cell<Undone>,
    room: Cell<bool>,
}

/// The debts ([`Owed`]) of a waiting call's head attempts, kept until the attempt has released
/// its queue's mutex, when the call pays them ([`Inner::pay_head_debts`]).
///
/// **Lock order: no queue's mutex is taken under another's.** A head's attempt runs under its
/// queue's mutex, and paying a pool debt wakes the heads of *other* keys' queues, each under
/// that queue's mutex (`wake_pool_heads`). Paid inside the attempt, two heads owing each other
/// a wake at once (stale admissions given back after a `set_limit`, both consuming a pool mark)
/// would each hold its own queue's mutex and wait for the other's: a deadlock (the loom model
/// `two_pool_heads_owing_each_other_a_wake_do_not_deadlock`). So the attempt only records them
/// here, and the queue runs the payment after unlocking, in the same turn (`Ticket::turn`'s
/// `after`): every debt is still paid, only later, which delays a wake and loses none.
///
/// An atomic (not a `Cell`) only so that an `acquire` future holding it stays `Send`; only the
/// owning call touches it, so Relaxed everywhere.
struct HeadDebts {
    bits: AtomicU64,
}

impl HeadDebts {
    const KEY_WAKE: u64 = 1;
    const KEY_IDLE: u64 = 2;
    const POOL_WAKE: u64 = 4;
    const POOL_IDLE: u64 = 8;
    const ROOM: u64 = 16;

    fn new() -> Self {
        HeadDebts {
            bits: AtomicU64::new(0),
        }
    }

    /// Adds what `owed` records (nothing written when it records nothing: the common case).
    fn defer(&self, owed: &Owed) {
        let (key, pool) = (owed.key.get(), owed.pool.get());
        let bits = [
            (key.wake, Self::KEY_WAKE),
            (key.idle, Self::KEY_IDLE),
            (pool.wake, Self::POOL_WAKE),
            (pool.idle, Self::POOL_IDLE),
            (owed.room.get(), Self::ROOM),
        ]
        .iter()
        .filter(|(owes, _)| *owes)
        .fold(0, |bits, (_, bit)| bits | bit);
        if bits != 0 {
            // Relaxed: only the owning call touches it (see the type).
            self.bits.fetch_or(bits, Ordering::Relaxed);
        }
    }

    /// Takes every debt recorded so far, leaving none.
    fn take(&self) -> Owed {
        // Relaxed: as in `defer`. A load first, so that the common turn writes nothing.
        if self.bits.load(Ordering::Relaxed) == 0 {
            return Owed::default();
        }
        let bits = self.bits.swap(0, Ordering::Relaxed);
        let has = |bit| bits & bit != 0;
        let owed = Owed::default();
        owed.key.set(Undone {
            wake: has(Self::KEY_WAKE),
            idle: has(Self::KEY_IDLE),
        });
        owed.pool.set(Undone {
            wake: has(Self::POOL_WAKE),
            idle: has(Self::POOL_IDLE),
        });
        owed.room.set(has(Self::ROOM));
        owed
    }
}

/// A sweep's answer for a cell it found busy (permits out, or a head marked): `u64::MAX`, "idle
/// only after a release" (no clock time says when), confirmed by a read-modify-write that
/// changes nothing; or 0, "look again at once", if that RMW finds the cell idle after all.
///
/// An RMW, not the load that judged it: a release that leaves the cell idle writes it (its
/// AcqRel `fetch_sub`), then loads the sweep hints to lower them (`Ctx::idle_hint`), and the
/// sweep swapped the shard's hint (and a search `room_at`) before looking at the cell. With a
/// load on our side that is store-then-load on both, and both could miss the other: we said
/// "never" for a key that had just turned idle, the release read the hints from before our
/// swaps and lowered nothing, and at the cap every new key was refused until another release
/// or a `sweep()` (loom: `a_release_racing_a_search_for_room_at_the_cap_leaves_room`). RMWs on
/// one word are ordered: if the release's comes after ours, it reads ours (Release) with its
/// Acquire, so our swaps happen before its loads of the hints, which it then lowers; if
/// before, we read the cell idle. The cost falls on sweeps (one RMW per busy key), not on
/// releases, which keep a load of each hint and no fence while the hints are 0.
fn busy_until_a_release(cell: &AtomicU64) -> u64 {
    // AcqRel: Release for the release that reads this (above); Acquire as the sweep's load.
    let word = cell.fetch_or(0, Ordering::AcqRel);
    if word != RETIRED && word & USED != 0 && (used(word) != 0 || word & WAITERS != 0) {
        u64::MAX
    } else {
        0
    }
}

/// The concurrency "algorithm": a cell is one permit word; the limit, shared by every key, lives
/// in one `config` word beside the cells.
///
/// Permit word (one per key, and the shared overflow pool):
///
/// | bit 63 | bits 62..34 | bit 33 | bit 32 | bits 31..0 |
/// |---|---|---|---|---|
/// | zero | wake tag: releases that consumed a mark (wraps) | `USED` | `WAITERS`: a blocked head wants the next release to wake it | permits in use |
///
/// `config` (one per limiter):
///
/// | bits 63..32 | bits 31..0 |
/// |---|---|
/// | generation (bumped by every `set_limit`, wraps) | the limit |
///
/// | operation | effect |
/// |---|---|
/// | take `n` | load `config` (c1), load word, in use + n ≤ limit(c1): CAS in use + n, then load `config` (c2); c2 ≠ c1: give the permits back (`fetch_sub`, a release whose wake and idle hint the caller owes whatever the take ends in) and decide again |
/// | head's take (under its queue's mutex) | as take, clearing `WAITERS` (on a key's cell; the shared pool's mark is left to the next release, as other keys' heads may have set it), or set `WAITERS` if short (by a CAS even when it is set, so that the mark a release reads is this head's too: on the pool it may be another key's head's, on a key's cell a departed head's) |
/// | release of `n` | `fetch_sub(n)`; if `WAITERS` was set, consume it (a CAS loop: clear it and bump the wake tag, unless another release did or the word is retired) and, if this release consumed it, wake the key's head |
/// | release leaving a key idle, under `Shared` | then a SeqCst fence and a load of the pool's word; if `WAITERS`, consume the pool's mark as above and wake every head (room under the cap); the pool head's side: mark, SeqCst fence, look once more |
/// | a head at the cap joins the pool's waiters (oldest first; `Inner::join_pool`) | count it, `fetch_or(WAITERS)` (Release, even if set), SeqCst fence, load the count; a call without a queue takes nothing from the pool while the count is non-zero |
/// | a pool waiter's call ends (`Inner::leave_pool`) | uncount, SeqCst fence, load the pool's word; if `WAITERS` and permits free, consume the mark (Acquire) and wake every head |
/// | retire (sweep) | load a word with nothing in use and no mark, ask whether the key has waiters (none), then CAS from that word (tag included) to [`RETIRED`] |
/// | `set_limit` | store `config` (new generation, new limit), then wake every queued key's head |
///
/// In use never exceeds `u32::MAX` (every CAS checks in use + n ≤ limit ≤ `u32::MAX`, and a
/// release gives back exactly what was taken), so no update carries into the flags, the tag
/// changes only by [`consumed`], and bit 63 stays zero: a live word is below 2^63 and never
/// equals [`RETIRED`] (`u64::MAX`).
///
/// Idle ⇔ nothing in use, no mark, and no waiter queued for the key. The last is not in the
/// word: a release that consumes a head's mark leaves the word with nothing in use and no mark
/// while the woken head has yet to run, and evicting the key then would take its place under
/// the key cap from the head the release was meant for. So the sweep asks the key's queue, after
/// its load; the wake tag makes its CAS fail if a mark was consumed between the load and the CAS
/// (a take, a new head's mark and a release bringing the word back to the same count). None of
/// this depends on the limit, so a limit change can neither make a busy key look idle nor an
/// idle key busy. The clock is never read: a concurrency cell's idleness is not a matter of
/// time.
pub(crate) struct Concurrency {
    /// Generation and limit; see the table above. Written only by `set_limit`, under its mutex.
    config: AtomicU64,
}

impl Concurrency {
    pub(crate) fn new(limit: u32) -> Self {
        Concurrency {
            config: AtomicU64::new(u64::from(limit)),
        }
    }

    /// The `config` word now.
    #[inline(always)]
    fn config(&self) -> u64 {
        // SeqCst: the stale-admission check in `take` is a store-then-load on each side
        // (`set_limit` stores `config` and then its caller is done; a taker CASes its word and
        // then loads `config`), which only a single total order over both makes sound; see
        // `take`. On x86 a SeqCst load is a plain load.
        self.config.load(Ordering::SeqCst)
    }

    /// The limit in force.
    pub(crate) fn current_limit(&self) -> u32 {
        limit_of(self.config())
    }

    /// Replaces the limit (callers serialise this with a mutex).
    pub(crate) fn set_limit(&self, limit: u32) {
        // Relaxed: we are the only writer (the caller's mutex orders writers).
        let old = self.config.load(Ordering::Relaxed);
        let next = (old & !u64::from(u32::MAX)).wrapping_add(CONFIG_GENERATION) | u64::from(limit);
        // SeqCst: see `config` and `take`: this store and every taker's CAS and `config` loads
        // are in one total order.
        self.config.store(next, Ordering::SeqCst);
    }

    /// Takes `n` permits if free (`n == 0`: checks that one is), with the queue head's `WAITERS`
    /// handling when `mark`. `Err(Closed)`: retired; `Err(InsufficientCapacity)`: `n` is above
    /// the limit in force.
    ///
    /// **A CAS prepared under an old limit is never kept.** The limit is not in the word, so
    /// `set_limit` cannot make a stale CAS fail without visiting every key. Instead, after a
    /// successful CAS the taker loads `config` again: if it is the one it decided under, no
    /// `set_limit` lies between its first `config` load and this one in the SeqCst total order,
    /// and the CAS sits between them, so the admission was decided under the limit in force at
    /// its CAS. Otherwise it gives the permits back (a release: our permits are counted, so the
    /// key cannot have been retired meanwhile) and decides again under the new limit. That
    /// release's debts (a wake for a head whose `WAITERS` mark it consumed, the idle hint) come
    /// back with every outcome, errors included: the give-back may leave the cell idle, so the
    /// decision again can find it retired (`Closed`, and the caller retries on a fresh cell), or
    /// `n` above a lowered limit, and the head would otherwise never be woken. A stale
    /// admission is thus only ever visible inside the word, for the moments before it is given
    /// back, where it can make others *reject*, never admit; it never reaches a caller. (The
    /// generation makes "config unchanged" exact even when a limit is set back to its old value;
    /// it wraps after 2^32 changes.)
    ///
    /// `shared`: `cell` is the shared overflow pool, whose `WAITERS` mark may also stand for
    /// other keys' heads (each overflow key has its own queue), so a head's take keeps it.
    #[inline(always)]
    fn take_with(&self, cell: &AtomicU64, n: u32, mark: bool, shared: bool) -> Taken {
        let mut undone = Undone::default();
        'config: loop {
            let config = self.config();
            let limit = limit_of(config);
            if n > limit {
                let error = TryAcquireError::InsufficientCapacity {
                    requested: n,
                    capacity: limit,
                };
                return (Err(error), undone);
            }
            // Acquire: a word we see RETIRED (or retire races with) must carry the retire's
            // synchronisation to the fresh cell our caller then makes; see `retire`.
            let mut word = cell.load(Ordering::Acquire);
            loop {
                if word == RETIRED {
                    return (Err(TryAcquireError::Closed), undone);
                }
                let available = free_of(limit, used(word));
                let fits = available >= n.max(1);
                if !fits && !mark {
                    return (Ok(Err(available)), undone);
                }
                if fits && n == 0 && !mark {
                    return (Ok(Ok(available)), undone);
                }
                let next = if fits {
                    // `used + n ≤ limit ≤ u32::MAX`: no carry. A key's head that asked for a
                    // wake needs none now (on a key's cell only its head marks). On the shared
                    // pool the mark may be another key's head's, still short: it stays, and the
                    // next release consumes it and wakes every head.
                    let next = (word + u64::from(n)) | USED;
                    if mark && !shared {
                        next & !WAITERS
                    } else {
                        next
                    }
                } else {
                    // Marked again even if the word is marked already: the CAS (a Release RMW
                    // writing the same word) puts our mark in the word's order, so a release
                    // that reads it also sees our queue in the queue map; or, if the release
                    // came first, our CAS fails and the next look sees its permits. A mark we
                    // found may be another head's: on the shared pool another key's, and on a
                    // key's cell a departed head's, whose queue may have been retired from the
                    // map since and ours made anew. A release synchronising only with that
                    // head's CAS could look the key up without seeing our queue's insertion
                    // (on a weakly ordered CPU; x86 orders the writes anyway). Under
                    // newest-first nothing else writes the pool for us (`join_pool` is
                    // oldest-first's). Only a short head's attempt comes here.
                    word | WAITERS
                };
                // SeqCst on success: in the total order with `set_limit`'s store and our
                // `config` loads (see above); it is also Acquire (the releases that freed these
                // permits happen before us: a semaphore's contract) and Release (a releaser that
                // reads our `WAITERS` mark with its AcqRel `fetch_sub` sees the key's queue in
                // the queue map, which it looks up to wake us). On x86 the same instruction as
                // AcqRel. Acquire on failure: as the load above.
                match cell.compare_exchange_weak(word, next, Ordering::SeqCst, Ordering::Acquire) {
                    Ok(_) if !fits => return (Ok(Err(available)), undone),
                    Ok(_) => {
                        if n == 0 || self.config() == config {
                            return (Ok(Ok(available - n)), undone);
                        }
                        // Decided under a limit no longer in force: give it back, decide again.
                        // What the give-back owes is returned with every outcome from here on.
                        undone = undone.and(Self::give_back(cell, n));
                        continue 'config;
                    }
                    Err(actual) => word = actual,
                }
            }
        }
    }

    /// Takes `n` permits if free; nothing written when short.
    #[inline(always)]
    pub(crate) fn take(&self, cell: &AtomicU64, n: u32) -> Taken {
        self.take_with(cell, n, false, false)
    }

    /// The queue head's attempt, under its queue's mutex: takes `n` permits if free (and clears
    /// `WAITERS`), otherwise sets `WAITERS` so that the next release wakes it.
    pub(crate) fn take_or_mark(&self, cell: &AtomicU64, n: u32) -> Taken {
        self.take_with(cell, n, true, false)
    }

    /// As [`take_or_mark`](Self::take_or_mark) on the shared overflow pool, except that a take
    /// keeps `WAITERS`: heads of other overflow keys (each in its own queue) may have set it and
    /// still be short, and the next release must wake them.
    pub(crate) fn take_or_mark_pool(&self, cell: &AtomicU64, n: u32) -> Taken {
        self.take_with(cell, n, true, true)
    }

    /// Gives `n` permits back to `cell` (a release); says whether a head must be woken and
    /// whether the cell is idle now.
    #[inline]
    pub(crate) fn give_back(cell: &AtomicU64, n: u32) -> Undone {
        // AcqRel. Release: our holder's work happens before the next taker's (pairs with the
        // CAS in `take_with`). Acquire: if we read a head's `WAITERS` mark (a Release CAS), its
        // key's queue is visible to our caller's lookup. The mark comes back with the old value:
        // the head's mark and our subtraction are RMWs of one word, so either ours comes first
        // (the head's attempt sees the permits) or we see the mark and our caller wakes it under
        // its queue's mutex, which it held while marking and registering its waker. We held `n`,
        // so in use ≥ n: no borrow from the flags.
        let before = cell.fetch_sub(u64::from(n), Ordering::AcqRel);
        // We consume the mark and our caller wakes the head, unless another release read the
        // same mark and consumed it first (its caller wakes the head, which then sees our
        // permits: our subtraction came before that consumption). If the head marked again
        // meanwhile, we consume the new mark and the wake still comes after its registration
        // (see queue.rs); it marks again if it is still short. Never on a retired word: once
        // the other release consumed the mark the key may have turned idle and been evicted,
        // and clearing a bit of RETIRED would make it a live word with every permit in use.
        // Relaxed: the mark was read (Acquire) by our `fetch_sub`; this only clears it and
        // bumps the tag, both RMWs in the mark's release sequence.
        let wake = before & WAITERS != 0 && Self::consume_mark(cell);
        Undone {
            wake,
            idle: used(before) == n,
        }
    }

    /// Clears `cell`'s `WAITERS` and bumps its wake tag, unless it is clear already (another
    /// release consumed the mark) or the word is retired; true if this call consumed it, and
    /// so owes the wake.
    #[inline]
    pub(crate) fn consume_mark(cell: &AtomicU64) -> bool {
        // Acquire on success: the caller read a mark with Acquire, but the word it consumes may
        // carry a later mark (on the shared pool, a head joining its waiters sets `WAITERS`
        // again with a Release `fetch_or`, see `Inner::join_pool`); reading it synchronises
        // with that head, so the wake that follows finds its queue. Free on x86 (an RMW).
        // Relaxed on failure: nothing consumed, nothing owed.
        cell.fetch_update(Ordering::Acquire, Ordering::Relaxed, |word| {
            (word != RETIRED && word & WAITERS != 0).then(|| consumed(word))
        })
        .is_ok()
    }
}

impl Algo for Concurrency {
    type Cell = AtomicU64;

    /// Never called: a keyed concurrency limiter changes its limit with
    /// [`Concurrency::set_limit`] (one shared word; cells need no translation).
    fn reconfigure<C: Clock>(
        &self,
        _to: &Self,
        _clock: &C,
        _cells: EachCell<'_, AtomicU64>,
    ) -> Result<(), ConfigError> {
        Ok(())
    }

    fn cell(&self) -> AtomicU64 {
        // Nothing in use, never used: the same whatever the limit.
        AtomicU64::new(0)
    }

    fn limit(&self) -> u32 {
        self.current_limit()
    }

    /// No parameters version: nothing is refunded here (see `refund`).
    fn version(&self) -> u64 {
        0
    }

    /// A rejection here says `retry_after` 0, and that is no claim that permits are free at
    /// once: a concurrency limit has no time to wait for (permits come back when their holders
    /// release them, at a time nobody knows), and nothing better can be said. Nor does the 0
    /// reach anyone: `try_acquire` answers [`TryPermitError::NoPermits`] (with the permits free
    /// now) instead, the HTTP concurrency layer its own configured `Retry-After` (at least 1 s),
    /// and chains take no concurrency members.
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
            let limit = self.current_limit();
            let free = free_of(limit, used(word));
            return if free >= want {
                Ok(Admission::new(0, 0, free - want))
            } else {
                Err(TryAcquireError::Rejected(Rejection::new(0, limit)))
            };
        }
        // Chains never take concurrency members, so nobody waits on this cell's debts; a
        // stale admission given back here would owe a wake only to a head of this key, which
        // chains cannot have.
        match self.take(cell, n).0? {
            Ok(remaining) => Ok(Admission::new(0, 0, remaining)),
            Err(_) => Err(TryAcquireError::Rejected(Rejection::new(
                0,
                self.current_limit(),
            ))),
        }
    }

    fn refund<C: Clock>(&self, _cell: &AtomicU64, _n: u32, _admission: &Admission, _clock: &C) {
        // Chains take rate limiters only; a concurrency permit goes back through its guard's
        // release, which also wakes the key's waiters. Giving nothing back here is the
        // conservative answer (never looser) should anything ever call it.
    }

    fn available(&self, cell: &AtomicU64, _now: u64) -> u32 {
        // Relaxed: a snapshot.
        let limit = self.current_limit();
        match cell.load(Ordering::Relaxed) {
            RETIRED => limit,
            word => free_of(limit, used(word)),
        }
    }

    fn retire_unless<C: Clock>(
        &self,
        cell: &AtomicU64,
        _clock: &C,
        waited: impl FnOnce() -> bool,
    ) -> Result<(), u64> {
        // Acquire: if the word is a release's consumption of a head's mark, this synchronises
        // with the head's marking CAS (the consumption is in its release sequence), so the
        // head's place in its key's queue, made before it marked, is visible to `waited`.
        let word = cell.load(Ordering::Acquire);
        if word == RETIRED {
            return Ok(());
        }
        if word & USED == 0 {
            // Never used: its inserter is about to take permits from it.
            return Err(0);
        }
        // Idle whatever the limit: nothing in use, nobody marked (see the type's table). So a
        // `set_limit` racing this sweep changes nothing here: the CAS below succeeds only on a
        // word with no permit out and no blocked head, before or after the change.
        if used(word) != 0 || word & WAITERS != 0 {
            // Permits out or a head blocked: idle only after a release, which lowers the hints
            // (`Ctx::idle_hint`); no clock time says when.
            return Err(busy_until_a_release(cell));
        }
        if waited() {
            // A waiter (a head a release just woke) is about to take from this cell. When it
            // has, its release lowers the hints; if it leaves instead, nothing does, so: look
            // again at once.
            return Err(0);
        }
        // AcqRel on success. Acquire: the last releases happen before us. Release: whoever sees
        // RETIRED (an Acquire load in `take`) and re-creates the key then happens after them
        // too, so the semaphore's happens-before survives eviction. Relaxed on failure: a take
        // landed, or a mark was consumed since our load (the tag moved); we report "busy" as
        // a read-modify-write sees it.
        cell.compare_exchange(word, RETIRED, Ordering::AcqRel, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| busy_until_a_release(cell))
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

/// A never-used permit word is exactly 0: every take that succeeds sets `USED`, and a head
/// never marks `WAITERS` on a fresh word (a take that fits on it, which `n ≤ limit` guarantees,
/// takes instead). So a first take that failed on a fresh cell (`n` above a limit lowered after
/// the store's check) leaves it 0 unless someone else has taken from it since.
impl Unused for Concurrency {
    /// `try_acquire_n(key, 0)` says whether a permit is free for `key`, and a key at the cap
    /// gets one only by the overflow policy: the answer must be that of a take of one, as
    /// [`KeyedConcurrencyLimiter::available`] reports it.
    const PROBE_MEETS_CAP: bool = true;

    fn unused(cell: &AtomicU64) -> bool {
        // Relaxed: a hint; `retire_unused`'s CAS decides.
        cell.load(Ordering::Relaxed) == 0
    }

    fn retire_unused(cell: &AtomicU64) -> bool {
        // Release on success, as `retire`'s: whoever sees RETIRED (an Acquire load or failed CAS
        // in `take_with`) and re-creates the key happens after us, without relying on the map
        // to carry that. (The word held nothing: no permit was ever given out or back on it.)
        // Relaxed on failure: a take landed first; the cell is in use and stays.
        cell.compare_exchange(0, RETIRED, Ordering::Release, Ordering::Relaxed)
            .is_ok()
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
/// their permits back on `Drop`: one lookup of the key and one `fetch_sub`, lock-free unless
/// someone waits for that key.
///
/// Under [`KeyOverflow::Shared`] all overflow keys share one pool of `limit` permits; under
/// [`QueueOrder::OldestFirst`] nobody is served from it past a waiter waiting for it.
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
pub struct KeyedConcurrencyLimiter<K, S = crate::sync::RandomHasher> {
    inner: Arc<Inner<K, S>>,
}

struct Inner<K, S> {
    store: Keyed<Concurrency, K, S>,
    ctx: Ctx<K, NoClock, S>,
    /// Serialises [`KeyedConcurrencyLimiter::set_limit`] calls; the hot path never takes it.
    reconfig: Mutex<()>,
    /// Heads waiting for the shared pool under [`QueueOrder::OldestFirst`] (see [`PoolWait`]):
    /// while non-zero, a call that has no queue of its own is not served from the pool (no
    /// barging). The pool's `WAITERS` mark cannot say this: a head's take leaves it set (it may
    /// be another head's). Written only by pool waiters joining and leaving; read (Relaxed) only
    /// by calls at the cap under [`KeyOverflow::Shared`].
    pool_waiters: CachePadded<AtomicU64>,
}

/// A waiting call's standing among the shared pool's waiters ([`Inner::pool_waiters`]).
///
/// | state | counted in `pool_waiters` | its head's next take on the pool |
/// |---|---|---|
/// | [`FRESH`](PoolWait::FRESH) | no | joins (and takes nothing) if others wait; else takes, or joins if short |
/// | [`JOINED`](PoolWait::JOINED) | yes | in the same attempt, after the fence: takes only if no other waiter is counted |
/// | [`WAITING`](PoolWait::WAITING) | yes | takes if the permits are free (pool waiters are not ordered among themselves) |
///
/// Joining counts the call and marks the pool (an RMW: see `join_pool`); a blocked attempt
/// turns `JOINED` into `WAITING`; the call leaves when it ends, however (served, failed,
/// timed out, its future dropped): `leave_pool`, run by its drop guard ([`LeavePool`]) after
/// it has left its queue, never under the queue's mutex. A head served, or blocked on a cell
/// of its own (room under the cap), stays counted until then: the others may defer to it
/// until its call ends, a delay bounded by that call. Only under [`QueueOrder::OldestFirst`];
/// newest first, a call stays `FRESH`.
struct PoolWait {
    /// One of the states above. Relaxed everywhere: only the owning call reads or writes it
    /// (in its attempts, under its queue's mutex, and in its drop guard).
    state: AtomicU64,
    /// 1 once the call is counted in [`KeyedStats::overflowed`], which counts calls, not
    /// attempts: by its fast path's take (the store counts a take that meets the cap) or by
    /// the first of its head's attempts that meets it. Relaxed, as `state`.
    overflowed: AtomicU64,
}

impl PoolWait {
    const FRESH: u64 = 0;
    const JOINED: u64 = 1;
    const WAITING: u64 = 2;

    /// `overflowed`: the call's fast path met the cap, and was counted.
    fn new(overflowed: bool) -> Self {
        PoolWait {
            state: AtomicU64::new(Self::FRESH),
            overflowed: AtomicU64::new(u64::from(overflowed)),
        }
    }

    fn get(&self) -> u64 {
        self.state.load(Ordering::Relaxed)
    }

    fn set(&self, state: u64) {
        self.state.store(state, Ordering::Relaxed);
    }
}

/// Leaves the pool's waiters when a waiting call ends, however it ends (a future dropped too),
/// and, unless the call was served, tells the pool's heads of the room its key may leave
/// ([`Inner::left_key`]). Dropped after the call has left its key's queue.
struct LeavePool<'a, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    inner: &'a Inner<K, S>,
    key: &'a K,
    shard: usize,
    me: PoolWait,
    /// The call returns permits (`n > 0`): its key, if served on the key's own cell, is busy
    /// until their release, which announces its room; if served by the pool, the key had no
    /// cell at that attempt for its waiting to keep.
    served: bool,
}

impl<K, S> Drop for LeavePool<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        self.inner.leave_pool(&self.me);
        if !self.served {
            self.inner.left_key(self.key, self.shard);
        }
    }
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
            .field("limit", &self.inner.store.algo.current_limit())
            .field("max_keys", &self.inner.ctx.max_keys)
            .field("overflow", &self.inner.ctx.overflow)
            // Relaxed: a snapshot for display.
            .field("keys", &self.inner.ctx.keys.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A key's waiter checks the limit in force as it joins the key's queue (see `Wait::capacity`).
impl<K, S> Capacity for Inner<K, S>
where
    Inner<K, S>: Sync,
{
    fn capacity_now(&self) -> u32 {
        self.store.algo.current_limit()
    }

    fn closed(&self) -> bool {
        self.ctx.waits.is_closed()
    }
}

impl<K, S> Inner<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn limit(&self) -> u32 {
        self.store.algo.current_limit()
    }

    /// Takes `n` permits for `key` ignoring its queue, and says from which cell (the shared
    /// pool's: the call met the cap, and the store counted it as overflowed). `Err(free)`: too
    /// few free (or, at the cap, heads wait for the shared pool: no barging).
    #[inline(always)]
    fn decide(
        &self,
        key: &K,
        shard: usize,
        n: u32,
    ) -> Result<(Result<u32, u32>, Slot), TryAcquireError> {
        let owed = Owed::default();
        let evicted = self.evicted_here();
        let taken = self.store.with_cell(&self.ctx, shard, key, n, |cell| {
            self.take(cell, n, None, &owed)
        });
        self.room_made(evicted, &owed);
        self.pay(key, shard, &owed, false);
        taken
    }

    /// One take on `cell` inside `with_cell` (the head's, which marks, when `head` is its
    /// standing among the pool's waiters), recording in `owed` what any stale admission given
    /// back on the way owes, whatever the outcome.
    ///
    /// On the shared pool under oldest-first order, no barging past its waiters: a call with no
    /// queue takes nothing while a head waits for the pool (`Ok(Err(free))`: it is refused, or
    /// queues), and a head defers as [`PoolWait`] says.
    #[inline(always)]
    fn take(
        &self,
        cell: &AtomicU64,
        n: u32,
        head: Option<&PoolWait>,
        owed: &Owed,
    ) -> Result<Result<u32, u32>, TryAcquireError> {
        let algo = &self.store.algo;
        let pool = || std::ptr::eq(cell, &*self.store.overflow);
        let (outcome, undone) = match head {
            // The pool is reached only at the cap under `Shared`: the common path pays one
            // comparison of addresses here.
            None if pool() && self.pool_held_back() => return Ok(Err(algo.available(cell, 0))),
            None => algo.take(cell, n),
            Some(me) if pool() && self.ctx.waits.order == QueueOrder::OldestFirst => {
                match self.take_pool_in_order(cell, n, me) {
                    Some(taken) => taken,
                    None => return Ok(Err(algo.available(cell, 0))),
                }
            }
            Some(_) if pool() => algo.take_or_mark_pool(cell, n),
            Some(_) => algo.take_or_mark(cell, n),
        };
        if undone != Undone::default() {
            let debts = if pool() { &owed.pool } else { &owed.key };
            debts.set(debts.get().and(undone));
        }
        outcome
    }

    /// Pays the debts recorded in `owed` (see [`settle`](Self::settle) for `by_head`). A key's
    /// debts are paid to the key's queue and shard, whichever of its cells (a retired one or
    /// its successor) they were incurred on. Never under a queue's mutex (see [`HeadDebts`]).
    #[inline(always)]
    fn pay(&self, key: &K, shard: usize, owed: &Owed, by_head: bool) {
        for (slot, undone) in [(Slot::Key, &owed.key), (Slot::Overflow, &owed.pool)] {
            if undone.get() != Undone::default() {
                self.settle(key, shard, slot, undone.get(), by_head);
            }
        }
        // Only while a slot is free: a search that evicted one key and took its slot made no
        // room for anyone (under a flood of new keys at the cap, that is every call), and waking
        // every head for it would send each on a search of its own. Relaxed: a slot taken since
        // our evictions is none the heads could have had; one given back after this load is
        // announced by whoever gives it back (a release that leaves a key idle, an eviction).
        // Every head, a head's own queue's too (see `room_freed`): a head whose search's
        // evictions went to other calls may have marked the pool in this very attempt, and the
        // mark we consume may be its own, which nobody would then read for it.
        if owed.room.get() && self.ctx.keys.load(Ordering::Relaxed) < self.ctx.max_keys as u64 {
            self.room_freed();
        }
    }

    /// [`evicted_here`] under [`KeyOverflow::Shared`] (0 otherwise: nobody waits for room),
    /// read before a call's decision for [`room_made`](Self::room_made).
    #[inline(always)]
    fn evicted_here(&self) -> u64 {
        if self.ctx.overflow == KeyOverflow::Shared {
            evicted_here()
        } else {
            0
        }
    }

    /// Records in `owed` whether the sweeps of the decision just made evicted keys (`before`:
    /// [`evicted_here`](Self::evicted_here) before it), which the call then announces as
    /// `room_freed` does once it holds no queue's mutex ([`pay`](Self::pay)).
    ///
    /// A search for room at the cap evicts every idle key of each shard it walks, and takes one
    /// slot; the sweep an insert pays for takes none. The slots left over are room for a head
    /// waiting on the shared pool, and nobody else tells it: its own looks skip a shard that
    /// another call is sweeping (left to that sweeper), and a search that found nothing leaves
    /// `room_at` at "never" for the next. It slept, with a slot free, until a pool permit came
    /// back (`a_pool_head_is_woken_by_the_room_another_keys_search_leaves_over`). The same pair
    /// as a release that leaves a key idle: our slots given back, then `room_freed`'s fence and
    /// load of the pool's mark, against the head's mark, fence and second look, whose
    /// reservation of a slot reads the key count.
    #[inline(always)]
    fn room_made(&self, before: u64, owed: &Owed) {
        if self.evicted_here() != before {
            owed.room.set(true);
        }
    }

    /// Pays what `key`'s head's attempts owe ([`HeadDebts`]): run by the queue after each turn,
    /// once the attempt has released the queue's mutex.
    #[inline]
    fn pay_head_debts(&self, key: &K, shard: usize, debts: &HeadDebts) {
        self.pay(key, shard, &debts.take(), true);
    }

    /// Pays what permits given back owe (a release, or a stale admission undone by
    /// [`Concurrency::take`], recorded in an [`Owed`]): the idle hint if the key's cell is idle
    /// now, and a wake for the head that marked it. `by_head`: the debts of an attempt of
    /// `key`'s head, paid once it released its queue's mutex ([`HeadDebts`]). A mark on the key's
    /// own cell can only have been that head's, and its own queue needs no wake: the head took
    /// (clearing its mark), marked again (the next release wakes it), or left (and the queue
    /// woke its next head). The room a key going idle makes is announced to every head, its
    /// own included (see [`room_freed`](Self::room_freed)).
    #[cold]
    fn settle(&self, key: &K, shard: usize, slot: Slot, undone: Undone, by_head: bool) {
        if slot == Slot::Key && undone.idle {
            self.key_idled(&self.store.shards[shard]);
        }
        if !undone.wake {
            return;
        }
        match slot {
            Slot::Key if by_head => {}
            Slot::Key => {
                if let Some(wait) = self.ctx.waits.map.get(key, Arc::clone) {
                    wait.queue.wake_head();
                }
            }
            Slot::Overflow => self.wake_pool_heads(by_head.then_some(key)),
        }
    }

    /// The shared pool's waiters may be in any key's queue: wakes every head (rare: only
    /// overflow keys at the cap wait on the pool), even if one's waker panics (`WakeAll`);
    /// `except`'s own not (a head owes itself nothing, see `settle`).
    ///
    /// **Lock order.** Each wake takes that queue's mutex (`wake_head`), so this never runs
    /// under a queue's mutex: a head's attempt (under its own) defers what it owes to after
    /// unlocking ([`HeadDebts`]), and a pool waiter leaves the pool's waiters from its call's
    /// guard, after it has left its queue ([`LeavePool`]). Otherwise two heads waking each
    /// other's queue, each holding its own mutex, would deadlock.
    #[cold]
    fn wake_pool_heads(&self, except: Option<&K>) {
        let mut all = WakeAll::default();
        self.ctx.waits.map.for_each(|k, wait| {
            if except != Some(k) {
                all.run(|| wait.queue.wake_head());
            }
        });
        all.finish();
    }

    fn try_acquire(&self, key: &K, shard: usize, n: u32) -> Result<Slot, TryPermitError> {
        let outcome = self.try_decide(key, shard, n);
        self.ctx
            .counters
            .bump(if outcome.is_ok() { ADMITTED } else { REJECTED });
        outcome
    }

    fn try_decide(&self, key: &K, shard: usize, n: u32) -> Result<Slot, TryPermitError> {
        // No barging past this key's queue under oldest-first order. (`n` above the limit is
        // checked here only when that refuses; otherwise `take` checks it against the same
        // `config` it decides with, saving the hot path a load.) Closed: the same load says
        // so (see `Waits::waiting_keys`).
        let any = self.ctx.waits.any();
        if any && self.ctx.waits.is_closed() {
            return Err(TryPermitError::Closed);
        }
        if any && self.ctx.waits.order == QueueOrder::OldestFirst && self.ctx.waits.has_waiters(key)
        {
            let limit = self.limit();
            if n > limit {
                return Err(TryPermitError::InsufficientCapacity {
                    requested: n,
                    capacity: limit,
                });
            }
            // A call that meets the key cap is counted in `overflowed` though its waiters refuse
            // it first, as a `KeyedLimiter` counts it (`refused_for_waiters`): a key without a
            // cell at the cap, no held key idle as far as the hints say. The check writes
            // nothing else and creates no key.
            let _ = (self.store).chain_check(&self.ctx, shard, key, n, CountOverflow::Always);
            return Err(TryPermitError::NoPermits {
                available: self.available(key, shard),
                requested: n,
            });
        }
        match self.decide(key, shard, n) {
            Ok((Ok(_), slot)) => Ok(slot),
            Ok((Err(available), _)) => Err(TryPermitError::NoPermits {
                available,
                requested: n,
            }),
            Err(error) => Err(permit_error(error)),
        }
    }

    /// What a take for `key` could get now (see [`KeyedConcurrencyLimiter::available`]): its
    /// cell's free permits; for a key without a cell, the limit while there is a key slot free,
    /// and at the cap what the overflow policy gives (the pool's free permits, or none).
    fn available(&self, key: &K, shard: usize) -> u32 {
        let algo = &self.store.algo;
        if let Some(free) = self.store.shards[shard]
            .map
            .get(key, |cell| algo.available(cell, 0))
        {
            return free;
        }
        // Relaxed: a snapshot, like the cell's load; the count may move before the caller
        // acts either way. (Above the cap by the spare slot counts as at it.)
        if self.ctx.keys.load(Ordering::Relaxed) < self.ctx.max_keys as u64 {
            return self.limit();
        }
        match self.ctx.overflow {
            // The pool's limit is the key's: its free permits never exceed it.
            KeyOverflow::Shared => algo.available(&self.store.overflow, 0),
            KeyOverflow::Reject => 0,
        }
    }

    /// Validates and tries without queueing when `key` has no waiters (newest first: whether or
    /// not it has). `Ok(Err(overflowed))`: queue up, the call counted as overflowed already if
    /// it met the cap.
    fn acquire_fast(
        &self,
        key: &K,
        shard: usize,
        n: u32,
    ) -> Result<Result<Slot, bool>, AcquireError> {
        let counters = &self.ctx.counters;
        let limit = self.limit();
        let error = if self.ctx.waits.any() && self.ctx.waits.is_closed() {
            AcquireError::Closed
        } else if n > limit {
            AcquireError::InsufficientCapacity {
                requested: n,
                capacity: limit,
            }
        } else if self.ctx.waits.order == QueueOrder::OldestFirst
            && self.ctx.waits.any()
            && self.ctx.waits.has_waiters(key)
        {
            // No barging past the key's queue. Newest first, this caller goes before every
            // queued waiter: it takes what is free now, as `try_acquire` does, and queues only
            // if it must wait (queueing first would make a full queue fail its oldest waiter
            // with `QueueFull` to make room for a caller that is then admitted at once).
            return Ok(Err(false));
        } else {
            match self.decide(key, shard, n) {
                Ok((Ok(_), slot)) => {
                    counters.bump(ADMITTED);
                    return Ok(Ok(slot));
                }
                Ok((Err(_), slot)) => return Ok(Err(slot == Slot::Overflow)),
                Err(error) => waiting_error(error),
            }
        };
        counters.bump(REJECTED);
        Err(error)
    }

    /// The head waiter's attempt (under its queue's mutex): take, or mark the cell so that the
    /// next release wakes this key's head.
    ///
    /// Short on the shared pool, it has marked the pool, and a pool release will wake it; but so
    /// may room under the key cap (another key going idle, which a call at the cap evicts), and
    /// a release that leaves its key idle wakes the pool's heads only if it sees the mark
    /// (`room_freed`). So after marking, it looks once more: either that release saw the mark,
    /// or this look sees the key it made idle.
    ///
    /// Under oldest-first order it also keeps its standing among the pool's waiters (`me`, see
    /// [`PoolWait`]): joined when it blocks on the pool (or defers to the heads already
    /// there); the call leaves them when it ends.
    ///
    /// What stale admissions given back on the way owe is recorded in `debts`, for the call to
    /// pay once the queue's mutex is released ([`HeadDebts`]): paying may wake other keys' heads.
    fn take_head(
        &self,
        key: &K,
        shard: usize,
        n: u32,
        me: &PoolWait,
        debts: &HeadDebts,
    ) -> Result<Slot, Blocked> {
        let mut looked_again = false;
        loop {
            let owed = Owed::default();
            let evicted = self.evicted_here();
            // Uncounted: the call is counted once, below, not once per attempt.
            let taken = self.store.with_cell_counting::<false, _, _>(
                &self.ctx,
                shard,
                key,
                n,
                false,
                |cell| self.take(cell, n, Some(me), &owed),
            );
            self.room_made(evicted, &owed);
            debts.defer(&owed);
            let met_cap = matches!(
                taken,
                Ok((_, Slot::Overflow)) | Err(TryAcquireError::TooManyKeys { .. })
            );
            if met_cap && me.overflowed.swap(1, Ordering::Relaxed) == 0 {
                self.ctx.counters.bump(OVERFLOWED);
            }
            let blocked = match taken {
                Ok((Err(_), Slot::Overflow)) if !looked_again => {
                    // SeqCst fence: store-then-load on both sides (we marked the pool, then
                    // look at the keys; `room_freed`'s release made its key idle, then loads
                    // the pool's word). With a fence on each side, either it reads our mark and
                    // wakes us, or our second look finds its key idle and evicts it for room.
                    // It is also the fence of `join_pool`'s pair with `leave_pool` (we marked
                    // the pool, then our second look loads `pool_waiters`).
                    fence(Ordering::SeqCst);
                    looked_again = true;
                    continue;
                }
                // Served or failed: the call's `LeavePool` guard leaves the pool's waiters once
                // it has left the queue (its wake must not run under our queue's mutex: heads
                // of two queues waking each other's would each wait for the other's lock).
                Ok((Ok(_), slot)) => return Ok(slot),
                Err(error) => return Err(Blocked::Fail(waiting_error(error))),
                // Short on the pool after our second look, or on a cell of its own (rare:
                // another call of our key made it and took from it meanwhile; still counted,
                // see `PoolWait`).
                Ok((Err(_), _)) => Blocked::Release,
            };
            // Asleep from here: a head that joined in this attempt now waits as the others do
            // (its next attempts take whatever is free; it marked the pool before our fence).
            if me.get() == PoolWait::JOINED {
                me.set(PoolWait::WAITING);
            }
            return Err(blocked);
        }
    }

    /// Whether a call with no queue of its own must not take from the shared pool now: heads
    /// wait for it, served oldest first.
    #[inline]
    fn pool_held_back(&self) -> bool {
        // Relaxed: a hint read once, as `Waits::any`: a head that joins just after this load
        // is one the caller may precede (it was not waiting yet). It never makes the caller
        // wait for nothing for long: every waiter counted leaves (`leave_pool`) and is woken
        // while it waits (see `join_pool`).
        self.ctx.waits.order == QueueOrder::OldestFirst
            && self.pool_waiters.load(Ordering::Relaxed) != 0
    }

    /// A head's take on the shared pool under oldest-first order, by its standing `me` (see
    /// [`PoolWait`]). `None`: it defers to the pool's other waiters (having joined them) and
    /// takes nothing; the caller answers "short".
    fn take_pool_in_order(&self, cell: &AtomicU64, n: u32, me: &PoolWait) -> Option<Taken> {
        let algo = &self.store.algo;
        match me.get() {
            PoolWait::FRESH => {
                // Relaxed: as `pool_held_back` (a hint; the pair that matters is the one
                // `join_pool` makes with `leave_pool`).
                if self.pool_waiters.load(Ordering::Relaxed) != 0 {
                    self.join_pool(cell, me);
                    return None;
                }
                let taken = algo.take_or_mark_pool(cell, n);
                if matches!(taken.0, Ok(Err(_))) {
                    self.join_pool(cell, me);
                }
                Some(taken)
            }
            // Our second look, after the fence. Relaxed: the fence orders it (see `join_pool`).
            PoolWait::JOINED if self.pool_waiters.load(Ordering::Relaxed) > 1 => None,
            _ => Some(algo.take_or_mark_pool(cell, n)),
        }
    }

    /// Counts `me` among the pool's waiters and marks the pool, so that the next release (or
    /// another waiter leaving with permits free) wakes every head.
    ///
    /// **No lost wake-up between waiters.** A head that joins while others are counted takes
    /// nothing, though permits may be free (another waiter is about to take them). Should that
    /// waiter leave without taking them all (served and some left over, timed out, cancelled,
    /// served on a cell of its own), nothing else may come to wake us. So it is a Dekker pair:
    /// we mark the pool (an RMW), fence (SeqCst, in `take_head`), and load the count in our
    /// second look; `leave_pool` uncounts itself, fences, and loads the pool's word. Either our
    /// second look sees it gone (and we take if we are the only one left), or its load sees our
    /// mark (or a later word: a consumption of it, whose consumer woke us) and it wakes every
    /// head if permits are free, else a release of the permits out reads the mark.
    fn join_pool(&self, cell: &AtomicU64, me: &PoolWait) {
        me.set(PoolWait::JOINED);
        // Relaxed: a count read as a hint (`pool_held_back`) or ordered by the fences of the
        // pair above.
        self.pool_waiters.fetch_add(1, Ordering::Relaxed);
        // Release: whoever consumes this mark (an Acquire RMW in `consume_mark`, or a release's
        // AcqRel `fetch_sub` reading it) sees our key's queue in the queue map, made before,
        // and wakes us under its mutex, which we hold until our waker is registered. An RMW
        // even when `WAITERS` is set already, so that it has a place in the word's order for
        // the pair with `leave_pool`. Never a retired word: the pool is never retired.
        cell.fetch_or(WAITERS, Ordering::Release);
    }

    /// `me` leaves the pool's waiters (no-op if it never joined): uncounts it and, if another
    /// head marked the pool and permits are free, consumes the mark and wakes every head (the
    /// other side of `join_pool`'s pair). Called by the call's guard, outside its queue's mutex
    /// (it may wake its own queue's next head too).
    fn leave_pool(&self, me: &PoolWait) {
        if me.get() == PoolWait::FRESH {
            return;
        }
        me.set(PoolWait::FRESH);
        // Relaxed: as in `join_pool`.
        self.pool_waiters.fetch_sub(1, Ordering::Relaxed);
        // SeqCst fence: pairs with the one in `take_head` after a joining head marks the pool
        // (we uncounted ourselves before it; the load below comes after it): either its second
        // look sees us gone, or we read its mark.
        fence(Ordering::SeqCst);
        let pool = &*self.store.overflow;
        // Acquire: as in `room_freed`, a head's mark (Release) makes its queue visible to the
        // wake's lookup.
        let word = pool.load(Ordering::Acquire);
        if word & WAITERS != 0
            && free_of(self.limit(), used(word)) > 0
            && Concurrency::consume_mark(pool)
        {
            self.wake_pool_heads(None);
        }
    }

    /// A release (or a stale admission given back) left `key`'s cell of `shard` idle: lowers
    /// the sweep hints (`Ctx::idle_hint`) and announces the room (`room_freed`). A sweep racing
    /// the release either sees the cell idle or has its "never" lowered by it: the sweep
    /// confirms a busy cell with a read-modify-write that the release's own RMW on the word is
    /// ordered with (`busy_until_a_release`), so this path needs no fence while the hints are 0.
    #[inline]
    fn key_idled<V>(&self, shard: &Shard<K, V, S>) {
        self.ctx.idle_hint(shard);
        self.room_freed();
    }

    /// A release (or a stale admission given back) left `key` idle, or the sweeps of a call for
    /// `key` evicted keys ([`room_made`](Self::room_made)): under [`KeyOverflow::Shared`],
    /// that is room under the key cap for a head blocked on the shared pool, which is woken
    /// only by releases that consume the pool's mark. Consumes that mark and wakes every head,
    /// as a pool release does (a head still short marks again). Without the shared pool,
    /// nothing: nobody waits for room.
    ///
    /// Every head, `key`'s own too, also when a head's attempt owes this (paid once it has
    /// released its queue's mutex, see [`HeadDebts`]): the attempt may have given back a stale
    /// admission that left its key's cell idle, then (that cell retired by a sweep, the key
    /// slot taken by others) blocked on the pool and marked it, and the mark we consume may be
    /// its own. Sparing its queue left it asleep with nothing to read a mark for it: even the
    /// pool's permits coming back woke nobody
    /// (`a_heads_debt_for_its_key_going_idle_wakes_its_own_head_too`). A spurious re-look at
    /// worst.
    #[inline]
    fn room_freed(&self) {
        if self.ctx.overflow != KeyOverflow::Shared {
            return;
        }
        // SeqCst fence: pairs with the one in `take_head` after a head marks the pool (our
        // release made the key idle and lowered the sweep hints before it; the load below
        // comes after it): either we read the head's mark, or its second look finds the key
        // idle. After the hints' lowering, not before it: the head's look skips a shard whose
        // hint still says "never" (loom: `a_pool_head_is_served_by_another_key_going_idle`
        // deadlocks with a fence before the lowering instead).
        fence(Ordering::SeqCst);
        // Acquire: as the `fetch_sub` in `give_back`, reading a head's mark (its Release CAS)
        // makes its key's queue visible to the wake's lookup.
        let pool = &*self.store.overflow;
        if pool.load(Ordering::Acquire) & WAITERS != 0 && Concurrency::consume_mark(pool) {
            self.wake_pool_heads(None);
        }
    }

    /// After a [`sweep`](KeyedConcurrencyLimiter::sweep), which runs under no queue's mutex.
    /// A head blocked on the shared pool that looked for room while the sweep held a shard
    /// skipped that shard (a search leaves a shard being swept to its sweeper, see
    /// `sweep_shard`), and the room there is then announced by nobody: the keys the sweep
    /// evicted gave their slots back silently, and a key that turned idle behind its walk was
    /// announced (`room_freed`) to a head whose look then skipped it. The head slept, with room
    /// under the cap, until a pool permit came back. So under [`KeyOverflow::Shared`] the sweep,
    /// once it has released every shard (and given back the slots of the keys it evicted),
    /// consumes the pool's mark and wakes every head, as `room_freed` does. SeqCst fence: pairs
    /// with the one a head makes after marking, before its second look (store-then-load on
    /// both sides): either that look loads our shards released and our slots given back, or
    /// we read its mark.
    #[cold]
    fn swept(&self) {
        if self.ctx.overflow != KeyOverflow::Shared {
            return;
        }
        fence(Ordering::SeqCst);
        // Acquire: as in `room_freed`, a head's mark (Release) makes its queue visible to the
        // wake's lookup.
        let pool = &*self.store.overflow;
        if pool.load(Ordering::Acquire) & WAITERS != 0 && Concurrency::consume_mark(pool) {
            self.wake_pool_heads(None);
        }
    }

    /// A waiting call for `key` ended unserved (failed, timed out, its future dropped; or a
    /// probe, `n == 0`, served holding nothing), after it left the key's queue. While it
    /// waited, a sweep spared the key however idle its cell (`retire_unless` keeps a key with
    /// waiters), so a release that left the cell idle woke the shared pool's heads
    /// (`room_freed`) for nothing: their second look found the key kept. Its last waiter
    /// leaving is room that no release announces: without this, a head blocked on the pool
    /// slept, with room under the cap, until a pool permit came back. Under
    /// [`KeyOverflow::Shared`], if nobody else waits for `key` (the last to leave does it) and
    /// its cell is idle, this wakes them as such a release does: the same Dekker pair with a
    /// head's second look (our leaving the queue, which clears its gate, is the store before
    /// our fence; the head's look at the key's waiters is the load after its own).
    #[cold]
    fn left_key(&self, key: &K, shard: usize) {
        if self.ctx.overflow != KeyOverflow::Shared || self.ctx.waits.has_waiters(key) {
            return;
        }
        // SeqCst fence: see above. The cell is looked at after it: the release that left it
        // idle either fenced before us (we see its word) or reads the head's mark itself.
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence; only the idle word a sweep would evict counts (used,
        // nothing in use, no mark), so that calls ending on a busy key wake nobody.
        let idle = self.store.shards[shard]
            .map
            .get(key, |cell| {
                let word = cell.load(Ordering::Relaxed);
                word != RETIRED && word & USED != 0 && used(word) == 0 && word & WAITERS == 0
            })
            .unwrap_or(false);
        let pool = &*self.store.overflow;
        // Acquire: as in `room_freed`, a head's mark (Release) makes its queue visible to the
        // wake's lookup.
        if idle && pool.load(Ordering::Acquire) & WAITERS != 0 && Concurrency::consume_mark(pool) {
            self.wake_pool_heads(None);
        }
    }

    /// Between a waiter's lookup (or insert) of its key's queue in the queue map and its
    /// enqueue (which loads the limit, see `Wait::capacity`) and first attempt: pairs with the
    /// fence in `set_limit` between its `config` store and its walk of the queue map.
    fn registered() {
        // SeqCst fence: store-then-load on both sides (we wrote the queue's map entry, or read
        // one whose insert happens before this fence and which a walk that missed it read
        // before: the same order, see ARCHITECTURE.md "Reconfiguration"; then we load `config`;
        // `set_limit` stores `config`, then reads the map). With a fence on each side, either
        // `set_limit`'s walk finds this queue (and wakes its head, or fails us if we joined
        // first and ask for more than the new limit, under its mutex), or our enqueue and
        // attempts load the new `config`: a raise is never missed by a waiter that
        // queued during the change, and a lowering never leaves one waiting behind the head
        // for a request that can no longer fit. Only waiters pay it.
        fence(Ordering::SeqCst);
    }

    async fn acquire_slow(
        &self,
        key: &K,
        shard: usize,
        n: u32,
        overflowed: bool,
    ) -> Result<Slot, AcquireError> {
        let mut pool = LeavePool {
            inner: self,
            key,
            shard,
            me: PoolWait::new(overflowed),
            served: false,
        };
        let debts = HeadDebts::new();
        loop {
            let wait = self.ctx.waits.key_wait(key);
            Self::registered();
            let exit = RetireOnExit {
                waits: &self.ctx.waits,
                key,
                wait: &wait,
            };
            // Set if the queue was retired before we joined it (see `Waits::wait`).
            let retry = AtomicU64::new(0);
            let outcome = self
                .ctx
                .waits
                .wait(&wait, &self.ctx.counters, n, self, &retry)
                .run_async_then(
                    || self.take_head(key, shard, n, &pool.me, &debts),
                    |slot| self.release(key, shard, n, slot),
                    no_timer,
                    || self.pay_head_debts(key, shard, &debts),
                )
                .await;
            drop(exit);
            match outcome {
                // The queue was retired between our lookup and our enqueue: look again. (Any
                // other `Closed` is the limiter's, counted by the queue: we fail.) Relaxed: our
                // own flag.
                Err(AcquireError::Closed) if retry.load(Ordering::Relaxed) != 0 => continue,
                outcome => {
                    pool.served = n > 0 && outcome.is_ok();
                    return outcome;
                }
            }
        }
    }

    async fn acquire(&self, key: &K, shard: usize, n: u32) -> Result<Slot, AcquireError> {
        let overflowed = match self.acquire_fast(key, shard, n)? {
            Ok(slot) => return Ok(slot),
            Err(overflowed) => overflowed,
        };
        // Boxed so that the fast path's future stays small.
        Box::pin(self.acquire_slow(key, shard, n, overflowed)).await
    }

    fn blocking(
        &self,
        key: &K,
        shard: usize,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<Slot, AcquireError> {
        let overflowed = match self.acquire_fast(key, shard, n)? {
            Ok(slot) => return Ok(slot),
            Err(overflowed) => overflowed,
        };
        let mut pool = LeavePool {
            inner: self,
            key,
            shard,
            me: PoolWait::new(overflowed),
            served: false,
        };
        let debts = HeadDebts::new();
        loop {
            let wait = self.ctx.waits.key_wait(key);
            Self::registered();
            let _exit = RetireOnExit {
                waits: &self.ctx.waits,
                key,
                wait: &wait,
            };
            // As in `acquire_slow`.
            let retry = AtomicU64::new(0);
            match self
                .ctx
                .waits
                .wait(&wait, &self.ctx.counters, n, self, &retry)
                .run_blocking_then(
                    || self.take_head(key, shard, n, &pool.me, &debts),
                    |slot| self.release(key, shard, n, slot),
                    deadline,
                    || self.pay_head_debts(key, shard, &debts),
                ) {
                // Relaxed: our own flag.
                Err(AcquireError::Closed) if retry.load(Ordering::Relaxed) != 0 => continue,
                outcome => {
                    pool.served = n > 0 && outcome.is_ok();
                    return outcome;
                }
            }
        }
    }

    /// Gives `n` permits of `key` back to the cell they came from. Lock-free unless a head is
    /// blocked on that cell.
    fn release(&self, key: &K, shard: usize, n: u32, slot: Slot) {
        if n == 0 {
            return;
        }
        let shard_ref = &self.store.shards[shard];
        let undone = match slot {
            // The key's cell is the one we took from: a cell with permits out is never retired.
            Slot::Key => shard_ref
                .map
                .get(key, |cell| Concurrency::give_back(cell, n)),
            Slot::Overflow => Some(Concurrency::give_back(&self.store.overflow, n)),
        };
        let Some(undone) = undone else {
            debug_assert!(false, "a key with permits out lost its cell");
            return;
        };
        // The idle hint inline (most releases of a lightly used key bring it to idle; the hint
        // is one load when already lowered), the rare wake out of line.
        if slot == Slot::Key && undone.idle {
            self.key_idled(shard_ref);
        }
        if undone.wake {
            self.settle(
                key,
                shard,
                slot,
                Undone {
                    wake: true,
                    idle: false,
                },
                false,
            );
        }
    }
}

/// Permits taken for `key` whose guard is not made yet: dropped (only by an unwind out of the
/// key's `Clone`, see [`KeyedConcurrencyLimiter::permit`]), it gives them back.
struct Untaken<'a, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    inner: &'a Inner<K, S>,
    key: &'a K,
    shard: usize,
    permits: u32,
    slot: Slot,
}

impl<K, S> Drop for Untaken<'_, K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        self.inner
            .release(self.key, self.shard, self.permits, self.slot);
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
            hasher: crate::sync::RandomHasher::default(),
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
    /// The guard of `permits` just taken for `key`. The guard keeps a clone of the key, made
    /// here, after the take: should `K::clone` panic, the permits go back as it unwinds
    /// ([`Untaken`]) rather than stay in use for good (the key then never idle, its slot of the
    /// cap never free).
    fn permit(&self, key: &K, shard: usize, permits: u32, slot: Slot) -> KeyedPermit<'_, K, S> {
        let untaken = Untaken {
            inner: &self.inner,
            key,
            shard,
            permits,
            slot,
        };
        let key = key.clone();
        // The clone returned: the guard below owns the permits now.
        std::mem::forget(untaken);
        KeyedPermit {
            limiter: self,
            key,
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
    /// **No barging.** Under [`QueueOrder::OldestFirst`] this fails while `key` has waiters,
    /// and, for a key served from the shared pool ([`KeyOverflow::Shared`], at the cap), while
    /// any key's waiter waits for the pool.
    ///
    /// # Errors
    ///
    /// - [`TryPermitError::NoPermits`]: too few free for `key` now (or others wait for them).
    /// - [`TryPermitError::InsufficientCapacity`]: `n` exceeds the limit.
    /// - [`TryPermitError::TooManyKeys`]: a new key, the cap is reached, no key is idle, and the
    ///   policy is [`KeyOverflow::Reject`].
    /// - [`TryPermitError::Closed`]: the limiter was [closed](Self::close).
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
    /// - [`AcquireError::InsufficientCapacity`] at once if `n` exceeds the limit, or as soon as
    ///   a [`set_limit`](Self::set_limit) lowers it below `n` while this call waits (a racing
    ///   one included: the limit is read again as the call joins the queue).
    /// - [`AcquireError::QueueFull`] if the key's queue has no room for `n` more permits (or,
    ///   under [`QueueOrder::NewestFirst`], this waiter was among the oldest failed to make room).
    /// - [`AcquireError::TooManyKeys`] if the key is new, the cap is reached, nothing is idle, and
    ///   the policy is [`KeyOverflow::Reject`].
    /// - [`AcquireError::Closed`] at once if the limiter is [closed](Self::close), or as soon as
    ///   it is closed while this call waits.
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

    /// [`acquire_n`](Self::acquire_n) with a time limit (on tokio's timer inside a tokio runtime,
    /// on futures-timer's helper thread anywhere else); on timeout nothing is held and the waiter
    /// has left the key's queue.
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
        crate::queue::timeout(timeout, self.acquire_n(key, n)).await
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

    /// Permits `key` could take now (a snapshot): its own free permits if it is held; for a key
    /// not held, the full limit while the limiter holds fewer than
    /// [`max_keys`](Self::max_keys) keys. At the cap a new key is served by the
    /// [`KeyOverflow`] policy, and this reports what that gives: the shared pool's free permits
    /// under [`KeyOverflow::Shared`], none under [`KeyOverflow::Reject`]. (A take at the cap
    /// first looks for an idle key to evict, and then gets the full limit on a cell of its
    /// own; this snapshot evicts nothing and does not search, so at the cap it is a lower
    /// bound.)
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{KeyOverflow, KeyedConcurrencyLimiter};
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(5)?;
    /// let _two = limiter.try_acquire_n(&1u64, 2)?;
    /// assert_eq!(limiter.available(&1u64), 3);
    /// assert_eq!(limiter.available(&2u64), 5);
    ///
    /// // At the cap, a new key is served from the shared pool: it sees the pool's free permits.
    /// let shared = KeyedConcurrencyLimiter::builder(2)
    ///     .max_keys(1)
    ///     .overflow(KeyOverflow::Shared)
    ///     .build()?;
    /// let _own = shared.try_acquire(&1u64)?; // the only key slot, busy
    /// let _pooled = shared.try_acquire(&2u64)?; // one of the pool's two permits
    /// assert_eq!(shared.available(&3u64), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available(&self, key: &K) -> u32 {
        self.inner.available(key, self.inner.ctx.shard(key))
    }

    /// Whether `key` holds any permit now (a snapshot: a lookup of its cell, and one load), for a
    /// keyed chain's gate (`chain::KeyedLine`), whose waiting callers each hold permits of such a
    /// limiter for their key for as long as they wait. Only for a limiter under
    /// [`KeyOverflow::Reject`], whose permits always come from the key's own cell.
    pub(crate) fn in_use(&self, key: &K) -> bool {
        let shard = self.inner.ctx.shard(key);
        self.inner.store.shards[shard]
            .map
            // Relaxed: a hint, as the unkeyed `ConcurrencyLimiter::in_use`. A retired cell holds
            // nothing.
            .get(key, |cell| match cell.load(Ordering::Relaxed) {
                RETIRED => false,
                word => used(word) != 0,
            })
            .unwrap_or(false)
    }

    /// [`acquire_blocking_n`](Self::acquire_blocking_n) until `deadline`, if any.
    pub(crate) fn acquire_blocking_until(
        &self,
        key: &K,
        n: u32,
        deadline: Option<std::time::Instant>,
    ) -> Result<KeyedPermit<'_, K, S>, AcquireError> {
        let shard = self.inner.ctx.shard(key);
        let slot = self.inner.blocking(key, shard, n, deadline)?;
        Ok(self.permit(key, shard, n, slot))
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

    /// Changes the limit of **every** key at run time (keys held now, keys created later, and
    /// keys evicted and created again), keeping each key's permits in flight and its queue: per
    /// key, the semantics of [`ConcurrencyLimiter::set_limit`](crate::ConcurrencyLimiter::set_limit).
    ///
    /// - **Raising** admits more at once: every key's queued head is woken and takes what fits.
    /// - **Lowering** revokes nothing: permits held stay valid and drain as usual, and a key's
    ///   new acquisitions wait until its in use + n ≤ the new limit. Queued waiters asking for
    ///   more than the new limit fail at once with [`AcquireError::InsufficientCapacity`].
    ///
    /// Once this returns, every acquisition decides under the new limit: one decided under the
    /// old limit whose compare-and-swap lands after the change is given back and decided again
    /// before its caller sees it. Eviction is unaffected: a key is idle when nothing is in use
    /// and nobody waits, whatever the limit.
    ///
    /// Cost: the limit is one word shared by every key, so the change itself is O(1); waking
    /// waiters visits the keys that have a wait queue now (only keys with waiters have one, each
    /// holding at most [`queue_limit`](Self::queue_limit) permits of waiters), never the keys
    /// without. Calls are serialised by a mutex the hot path never takes.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] if `limit` is 0; nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConfigError, KeyedConcurrencyLimiter, TryPermitError};
    ///
    /// let per_user = KeyedConcurrencyLimiter::new(4)?;
    /// let alice = per_user.try_acquire_n(&"alice", 3)?;
    /// // Lowered below what alice holds: nothing is revoked, nothing new for her until it drains.
    /// per_user.set_limit(2)?;
    /// assert_eq!((per_user.limit(), per_user.available(&"alice")), (2, 0));
    /// assert!(matches!(per_user.try_acquire(&"alice"), Err(TryPermitError::NoPermits { .. })));
    /// assert_eq!(per_user.available(&"bob"), 2); // every key, new ones too
    /// drop(alice);
    /// assert_eq!(per_user.available(&"alice"), 2);
    /// // Raised: more at once, for everybody.
    /// per_user.set_limit(5)?;
    /// assert_eq!(per_user.try_acquire_n(&"alice", 5)?.permits(), 5);
    /// // Zero is an error and changes nothing.
    /// assert_eq!(per_user.set_limit(0), Err(ConfigError::Zero { what: "limit" }));
    /// assert_eq!(per_user.limit(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_limit(&self, limit: u32) -> Result<(), ConfigError> {
        if limit == 0 {
            return Err(ConfigError::Zero { what: "limit" });
        }
        let inner = &*self.inner;
        let guard = lock(&inner.reconfig);
        // From here every take that loads `config` decides under `limit`, and a take that
        // decided under the old one and CASes after this store gives its permits back (see
        // `Concurrency::take_with`).
        inner.store.algo.set_limit(limit);
        // SeqCst fence: pairs with the fence of a waiter that queued during this call (see
        // `Inner::registered`): the walk below finds its queue, or its attempts see the limit.
        fence(Ordering::SeqCst);
        // Every key with waiters (and the shared pool's, which sit in some key's queue): those
        // asking for more than `limit` fail, each head looks again. The head's attempt and this
        // sweep (which takes its waker) are both under that queue's mutex, so a raise cannot slip
        // between the head's failed attempt and its registration. Bounded by the keys that have
        // waiters now.
        // The sweeps run under the mutex, so that racing changes sweep in their order; the
        // wake-ups after it, since a woken party's `Waker` runs code of its own (which may call
        // `set_limit`). Every key's, even if a waker panics in one of them (see `WakeAll`).
        let mut woken = Vec::new();
        inner.ctx.waits.map.for_each(|_, wait| {
            woken.push(wait.queue.reconfigure_waiters(&wait.gate, limit));
        });
        drop(guard);
        wake_all(woken, Woken::wake);
        Ok(())
    }

    /// Evicts every idle key now (all permits back, nobody waiting); returns how many. Never
    /// removes a key with a permit out; runs concurrently with every other call. A shard that
    /// another call is sweeping at that moment (a search for room at the cap, the sweep an
    /// insert pays for, another `sweep`) is skipped and left to that sweep, whose walk may have
    /// passed a key before it turned idle: such a key stays until a later sweep or search. Under
    /// [`KeyOverflow::Shared`] it then wakes the calls waiting for the shared pool, for which
    /// the keys it evicted are room under the cap.
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
        let evicted = self.inner.store.sweep_all(&self.inner.ctx) as usize;
        self.inner.swept();
        evicted
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
        self.inner.ctx.waits.order
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
        self.inner.ctx.waits.queue_limit
    }

    /// Closes the limiter, for every key: each queued waiter fails with
    /// [`AcquireError::Closed`], and every later `try_acquire` ([`TryPermitError::Closed`]) or
    /// `acquire` fails at once. Permits already held stay valid and are returned as usual (as
    /// for a [`ConcurrencyLimiter`](crate::ConcurrencyLimiter), or tokio's `Semaphore`).
    /// Closing twice is harmless. A graceful shutdown's way to let every task waiting for a key
    /// go at once, rather than cancelling each.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{AcquireError, KeyedConcurrencyLimiter, TryPermitError};
    ///
    /// let limiter = KeyedConcurrencyLimiter::new(1)?;
    /// let held = limiter.try_acquire_owned("alice".to_string(), 1)?;
    /// let waiter = std::thread::spawn({
    ///     let limiter = limiter.clone();
    ///     move || limiter.acquire_blocking(&"alice".to_string()).map(drop)
    /// });
    /// while limiter.stats().waiting == 0 {
    ///     std::thread::yield_now();
    /// }
    /// limiter.close();
    /// assert_eq!(waiter.join().unwrap(), Err(AcquireError::Closed));
    /// assert!(limiter.is_closed());
    /// assert_eq!(limiter.try_acquire(&"bob".to_string()).unwrap_err(), TryPermitError::Closed);
    /// drop(held); // still returned as usual
    /// assert_eq!(limiter.available(&"alice".to_string()), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(&self) {
        self.inner.ctx.waits.close();
    }

    /// Whether [`close`](Self::close) was called.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyedConcurrencyLimiter;
    ///
    /// let limiter = KeyedConcurrencyLimiter::<u64>::new(1)?;
    /// assert!(!limiter.is_closed());
    /// limiter.close();
    /// assert!(limiter.is_closed());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn is_closed(&self) -> bool {
        self.inner.ctx.waits.is_closed()
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
        let (waiting_keys, waiting, queued_permits) = self.inner.ctx.waits.queued();
        KeyedStats {
            admitted: ctx.counters.sum(ADMITTED),
            rejected: ctx.counters.sum(REJECTED),
            cancelled: ctx.counters.sum(CANCELLED),
            overflowed: ctx.counters.sum(OVERFLOWED),
            // Relaxed: a statistic.
            evicted: ctx.evicted.load(Ordering::Relaxed),
            // A concurrency limit has no reset: permits in use are not forgotten.
            reset: 0,
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
pub struct KeyedConcurrencyLimiterBuilder<K, S = crate::sync::RandomHasher> {
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

    /// Keeps at most `max_keys` keys (default [`DEFAULT_MAX_KEYS`]), plus at most one:
    /// a call that meets its key's cell just evicted or reset may take one spare slot while the
    /// slot of the cell it replaces is being given back (see [`KeyedLimiter`](crate::KeyedLimiter)'s "Hard cap").
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
        let store = Keyed::new(Concurrency::new(self.limit), shards, &self.hasher);
        Ok(KeyedConcurrencyLimiter {
            inner: Arc::new(Inner {
                store,
                ctx: Ctx::new(
                    NoClock,
                    self.hasher.clone(),
                    shards,
                    self.max_keys,
                    self.overflow,
                    Waits::new(self.hasher, self.order, self.queue_limit),
                ),
                reconfig: Mutex::new(()),
                pool_waiters: CachePadded::new(AtomicU64::new(0)),
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
pub struct KeyedPermit<'a, K, S = crate::sync::RandomHasher>
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
pub struct OwnedKeyedPermit<K, S = crate::sync::RandomHasher>
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

    /// Counts its wakes.
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            // Relaxed: a count read by the test's thread, which made the wakes itself.
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A head's attempt whose stale admission, given back after a `set_limit`, left its key's
    /// cell idle, and which then ended blocked on the shared pool (the old cell retired by a
    /// sweep, the key slot and the spare taken by others), owes the room announcement
    /// (`room_freed`), paid after its turn. That consumes the pool's mark, which may be the
    /// head's own, made later in the same attempt: the wake skipped the head's own queue, and
    /// nothing read a mark for it again. The race itself needs a `set_limit` between a take's
    /// CAS and its second `config` load, a sweep and two other callers; the state it leaves is
    /// built here (the head marked the pool, the debt recorded) and the debt paid as the
    /// queue's turn pays it. Before: the head was never woken, even once the pool's permit
    /// came back (no mark was left for that release to read).
    #[test]
    fn a_heads_debt_for_its_key_going_idle_wakes_its_own_head_too() {
        let limiter = KeyedConcurrencyLimiter::<u64>::builder(1)
            .max_keys(1)
            .overflow(KeyOverflow::Shared)
            .build()
            .unwrap();
        let _held = limiter.try_acquire(&1).unwrap(); // the one key slot, busy
        let pooled = limiter.try_acquire(&3).unwrap(); // the pool's one permit
        assert!(pooled.slot == Slot::Overflow);
        let wakes = Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)));
        let waker = std::task::Waker::from(Arc::clone(&wakes));
        let mut cx = std::task::Context::from_waker(&waker);
        let mut head = std::pin::pin!(limiter.acquire(&2));
        assert!(head.as_mut().poll(&mut cx).is_pending());
        let pool = &*limiter.inner.store.overflow;
        // Relaxed: this thread made every write.
        assert_ne!(pool.load(Ordering::Relaxed) & WAITERS, 0, "the head marked");
        let owed = Owed::default();
        owed.key.set(Undone {
            wake: false,
            idle: true,
        });
        let debts = HeadDebts::new();
        debts.defer(&owed);
        let shard = limiter.inner.ctx.shard(&2);
        limiter.inner.pay_head_debts(&2, shard, &debts);
        drop(pooled);
        // Relaxed: as in `Wakes`.
        assert!(
            wakes.0.load(Ordering::Relaxed) > 0,
            "the head was never woken, the pool's permit free"
        );
        let std::task::Poll::Ready(Ok(permit)) = head.as_mut().poll(&mut cx) else {
            panic!("the pool's permit is free");
        };
        assert_eq!(permit.permits(), 1);
    }

    #[test]
    fn cell_retires_only_when_idle_and_never_equals_retired() {
        let algo = Concurrency::new(u32::MAX);
        let clock = ManualClock::new();
        let cell = algo.cell();
        assert_eq!(
            algo.retire(&cell, &clock),
            Err(0),
            "never used: left to its inserter"
        );
        assert_eq!(algo.take(&cell, u32::MAX), (Ok(Ok(0)), Undone::default()));
        assert!(algo.retire(&cell, &clock).is_err());
        // The largest live word: every permit in use, both flags set.
        cell.fetch_or(WAITERS, Ordering::Relaxed);
        assert_ne!(cell.load(Ordering::Relaxed), RETIRED);
        assert!(
            algo.retire(&cell, &clock).is_err(),
            "a key with permits out is kept"
        );
        let undone = Concurrency::give_back(&cell, u32::MAX);
        assert_eq!(
            undone,
            Undone {
                wake: true,
                idle: true
            }
        );
        assert_eq!(algo.retire(&cell, &clock), Ok(()));
        assert_eq!(algo.take(&cell, 1).0, Err(TryAcquireError::Closed));
        assert_eq!(algo.take_or_mark(&cell, 1).0, Err(TryAcquireError::Closed));
    }

    #[test]
    fn head_marks_when_short_and_clears_when_served() {
        let algo = Concurrency::new(2);
        let cell = algo.cell();
        assert_eq!(algo.take(&cell, 2), (Ok(Ok(0)), Undone::default()));
        assert_eq!(algo.take_or_mark(&cell, 1), (Ok(Err(0)), Undone::default()));
        assert_ne!(cell.load(Ordering::Relaxed) & WAITERS, 0);
        assert_eq!(
            Concurrency::give_back(&cell, 1),
            Undone {
                wake: true,
                idle: false
            }
        );
        assert_eq!(algo.take_or_mark(&cell, 1), (Ok(Ok(0)), Undone::default()));
        assert_eq!(cell.load(Ordering::Relaxed) & WAITERS, 0);
    }

    #[test]
    fn idleness_does_not_depend_on_the_limit() {
        let algo = Concurrency::new(3);
        let clock = ManualClock::new();
        let cell = algo.cell();
        assert_eq!(algo.take(&cell, 2), (Ok(Ok(1)), Undone::default()));
        // Lowered below what is held: the key stays, nothing is free, nothing is revoked.
        algo.set_limit(1);
        assert!(algo.retire(&cell, &clock).is_err());
        assert_eq!(algo.available(&cell, 0), 0);
        assert_eq!(algo.take(&cell, 1), (Ok(Err(0)), Undone::default()));
        assert_eq!(
            algo.take(&cell, 2).0,
            Err(TryAcquireError::InsufficientCapacity {
                requested: 2,
                capacity: 1
            })
        );
        Concurrency::give_back(&cell, 2);
        assert_eq!(algo.available(&cell, 0), 1);
        // Raised while idle: still idle, and evictable.
        algo.set_limit(7);
        assert_eq!(algo.available(&cell, 0), 7);
        assert_eq!(algo.retire(&cell, &clock), Ok(()));
    }

    #[test]
    fn config_generation_changes_even_when_the_limit_does_not() {
        let algo = Concurrency::new(4);
        let before = algo.config();
        algo.set_limit(4);
        assert_ne!(algo.config(), before);
        assert_eq!(algo.current_limit(), 4);
    }
}
