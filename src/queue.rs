//! The wait queue behind every `acquire`: fair, bounded, cancel-safe, one wake per event.
//!
//! # Protocol: the head acts
//!
//! Waiters are kept in arrival order (a `BTreeMap` keyed by a sequence number, under a mutex that
//! only the slow path takes). The **head** is the oldest waiter ([`QueueOrder::OldestFirst`]) or the
//! newest ([`QueueOrder::NewestFirst`]). Only the head tries to take permits, and it does so itself,
//! under the queue's mutex, through the `take` closure its limiter supplies:
//!
//! - a rate limiter's head runs the algorithm; if it is rejected it sleeps for the exact
//!   `retry_after` the algorithm reports (the oldest timestamp leaving the window, the next window,
//!   the GCRA arrival time) and tries again: no polling, no background task;
//! - a concurrency limiter's head takes permits from the permit word; if too few are free it sleeps
//!   until a release wakes it.
//!
//! When the head leaves (served, cancelled, or failed) the next head is woken: one event wakes one
//! waiter. A concurrency limiter's served or cancelled head wakes it only if its permits are free
//! then (see [`Room`]); otherwise the release that frees them wakes it, so a freed permit costs
//! one wake.
//! Permits are never handed to a waiter that is not running: the head takes them in the
//! same critical section in which it learns it got them, and returns them to its caller without an
//! await in between. That is what makes cancellation trivially safe: dropping a waiter removes its
//! entry and, if it was the head, wakes the next one (a concurrency limiter's, if its permits are
//! free). Nothing else can have been given to it.
//!
//! A `Waker` may panic. A served head wakes the next head before its poll returns, so it holds
//! what it took in a guard until that wake is over, and an unwind gives it back to the limiter
//! and wakes the head again (the next head may have looked, and gone to sleep, in between).
//! A call that wakes several waiters (a close, an eviction, a reconfiguration) wakes all of them
//! before it lets a panic through: each already has its outcome and sees it only when polled.
//! A release or a cancelled wait may run inside an unwind (a permit or a future dropped by a
//! panicking task); the head it wakes then panicking too is dropped rather than let out of the
//! drop, which would abort the process.
//!
//! Dropping a `Waker` may run user code too (its last clone frees what it owns, perhaps a permit
//! of this very limiter, whose release takes the queue's mutex). So no registration is dropped
//! under the mutex: one replaced by a newer waker, or left by a waiter that leaves, is dropped
//! after unlocking.
//!
//! # The gate word
//!
//! Each limiter has one atomic word whose [`WAITERS`] bit says "someone is queued" and whose
//! [`CLOSED`] bit says "closed". `try_acquire` reads it with one load and, under oldest-first
//! order, fails rather than jumping the queue while `WAITERS` is set. The queue sets `WAITERS`
//! (under its mutex) before the first waiter's first attempt and clears it when the last waiter
//! leaves. A concurrency limiter keeps these bits in its permit word, so that a release is one
//! `fetch_sub` (of its permits in use) that also tells it whether to wake the head.
//!
//! No lost wake-up: the head's attempt and the registration of its waker happen under the mutex. A
//! releaser gives its permits back first and then, if it saw `WAITERS`, takes the mutex to wake
//! the head; either its release came before the head's attempt (which then sees the permits) or
//! its wake comes after the registration.

use crate::error::AcquireError;
use crate::sync::{
    ADMITTED, Arc, AtomicU64, CANCELLED, Counters, Mutex, Ordering, REJECTED, Signal, WakeAll,
    lock, wake_all,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Gate bit: at least one waiter is queued.
pub(crate) const WAITERS: u64 = 1 << 32;
/// Gate bit: the limiter is closed. Never cleared.
pub(crate) const CLOSED: u64 = 1 << 33;

/// The queue limit limiters get unless told otherwise: 65,536 queued permits.
///
/// Each waiter costs about 100 bytes while it waits, so the default bounds a limiter's queue at a
/// few MiB even when every waiter asks for one permit.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Algorithm, RateLimiter, DEFAULT_QUEUE_LIMIT};
///
/// let algorithm = Algorithm::FixedWindow { limit: 10, window: Duration::from_secs(1) };
/// assert_eq!(RateLimiter::new(algorithm)?.queue_limit(), DEFAULT_QUEUE_LIMIT);
/// // Smaller for callers that should rather fail fast than wait in a long line.
/// let short = RateLimiter::builder(algorithm).queue_limit(100).build()?;
/// assert_eq!(short.queue_limit(), 100);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
pub const DEFAULT_QUEUE_LIMIT: u64 = 65_536;

/// Which waiter is served first when permits become available.
///
/// # Examples
///
/// ```
/// use turnstile::{ConcurrencyLimiter, QueueOrder};
///
/// let limiter = ConcurrencyLimiter::builder(1)
///     .queue_order(QueueOrder::NewestFirst)
///     .queue_limit(10)
///     .build()?;
/// assert_eq!(limiter.queue_order(), QueueOrder::NewestFirst);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum QueueOrder {
    /// First come, first served (the default). A large request at the head is not overtaken by
    /// smaller ones behind it, and `try_acquire` fails while anyone is queued (no barging).
    /// Keyed limiters keep one queue per key; a `KeyedConcurrencyLimiter` under
    /// `KeyOverflow::Shared` also serves nobody from the shared pool past a waiter waiting for
    /// it (waiters for the pool, from different keys, are served in no particular order).
    #[default]
    OldestFirst,
    /// The newest waiter is served first; when the queue is full, the oldest waiters fail with
    /// [`AcquireError::QueueFull`] to make room (as .NET's `QueueProcessingOrder.NewestFirst`
    /// does). `try_acquire` does not defer to waiters: it is the newest caller of all. Nor does
    /// `acquire` when its permits are free now: only a caller that has to wait joins the queue
    /// (and may fail the oldest waiters to make room).
    NewestFirst,
}

/// Why the head (or a waiter behind it) cannot proceed yet.
pub(crate) enum Blocked {
    /// A rate limiter rejected the head: try again in this many nanoseconds of its clock.
    Until(u64),
    /// Too few permits are free: wait for a release.
    Release,
    /// Not the head: wait to be promoted.
    Behind,
    /// The request can no longer succeed (for example the limiter shrank): fail it.
    Fail(AcquireError),
}

/// What a waiter's turn ended with.
pub(crate) enum Turn<T> {
    /// Served or failed; the waiter has left the queue.
    Done(Result<T, AcquireError>),
    /// Still queued; the waker is registered.
    Wait(Blocked),
}

/// How a waiter wants to be woken.
pub(crate) enum Registration<'a> {
    Task(&'a Waker),
    Thread(&'a Arc<Signal>),
}

enum Wake {
    Nobody,
    Task(Waker),
    Thread(Arc<Signal>),
}

impl Wake {
    fn wake(self) {
        match self {
            Wake::Nobody => {}
            Wake::Task(waker) => waker.wake(),
            Wake::Thread(signal) => signal.notify(),
        }
    }

    /// Registers `who`; returns the registration it replaced, for the caller to drop once it
    /// has unlocked the queue: dropping a `Waker` can run user code (an `ArcWake` that owns a
    /// permit of this very limiter), which must not find the queue's mutex held by its own thread.
    #[must_use = "drop the replaced registration after unlocking"]
    fn register(&mut self, who: Registration<'_>) -> Wake {
        match (who, &*self) {
            (Registration::Task(new), Wake::Task(old)) if old.will_wake(new) => Wake::Nobody,
            (Registration::Task(new), _) => std::mem::replace(self, Wake::Task(new.clone())),
            (Registration::Thread(signal), _) => {
                std::mem::replace(self, Wake::Thread(Arc::clone(signal)))
            }
        }
    }
}

struct Waiter {
    permits: u32,
    wake: Wake,
}

impl Waiter {
    /// The room this waiter takes in the queue: its permits, and one for a probe (`n == 0`
    /// waits for one permit), so that probes are bounded by `queue_limit` like every other
    /// waiter and a limit of 0 means that nobody waits.
    fn room(permits: u32) -> u64 {
        u64::from(permits.max(1))
    }
}

struct Waiters {
    live: BTreeMap<u64, Waiter>,
    /// Waiters failed by `close` or evicted (newest-first), until they look or are dropped.
    failed: BTreeMap<u64, AcquireError>,
    next: u64,
    /// Room taken by `live` waiters ([`Waiter::room`]: their permits, one for a probe).
    permits: u64,
    /// Probes among the `live` waiters: `permits` less this is what the queue will take.
    probes: u64,
    /// The capacity the last [`WaitQueue::reconfigure_waiters_and_bound`] swept for (`u32::MAX`
    /// before any): an enqueue for more fails at once. A caller checks the capacity before it
    /// enqueues, without the mutex; one that read it before a reconfiguration lowered it and
    /// enqueues after that sweep would otherwise wait behind the head, failing only once it
    /// became the head itself, or never while the head waits for good.
    capacity: u32,
    closed: bool,
}

impl Waiters {
    /// Takes a leaving waiter of `permits` out of the counts.
    fn remove_room(&mut self, permits: u32) {
        self.permits -= Waiter::room(permits);
        self.probes -= u64::from(permits == 0);
    }
}

/// What a queue's waiters will take, a snapshot: [`WaitQueue::queued`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Queued {
    /// The permits of every waiter: none for a probe, which waits for one permit but takes
    /// nothing.
    pub(crate) permits: u64,
    /// The head's permits (0: a probe, or nobody).
    pub(crate) head: u32,
}

pub(crate) struct WaitQueue {
    waiters: Mutex<Waiters>,
    order: QueueOrder,
    limit: u64,
}

impl WaitQueue {
    pub(crate) fn new(order: QueueOrder, limit: u64) -> Self {
        WaitQueue {
            waiters: Mutex::new(Waiters {
                live: BTreeMap::new(),
                failed: BTreeMap::new(),
                next: 0,
                permits: 0,
                probes: 0,
                capacity: u32::MAX,
                closed: false,
            }),
            order,
            limit,
        }
    }

    pub(crate) fn order(&self) -> QueueOrder {
        self.order
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    fn head(&self, waiters: &Waiters) -> Option<u64> {
        match self.order {
            QueueOrder::OldestFirst => waiters.live.keys().next().copied(),
            QueueOrder::NewestFirst => waiters.live.keys().next_back().copied(),
        }
    }

    /// Waiters queued now and the room they take (their permits, one per probe).
    pub(crate) fn len(&self) -> (usize, u64) {
        let waiters = lock(&self.waiters);
        (waiters.live.len(), waiters.permits)
    }

    /// What the waiters queued now will take when served (see [`Queued`]). A rejection that
    /// defers to the queue counts it (see `limiter::refused_for_waiters`).
    pub(crate) fn queued(&self) -> Queued {
        let waiters = lock(&self.waiters);
        Queued {
            permits: waiters.permits - waiters.probes,
            head: self
                .head(&waiters)
                .and_then(|seq| waiters.live.get(&seq))
                .map_or(0, |w| w.permits),
        }
    }

    /// Queues a waiter for `permits`; returns its sequence number and the waiters it failed to
    /// make room (newest-first order only), for the caller to wake once it holds its ticket (see
    /// [`Wait::enqueue`]).
    ///
    /// `capacity`, if given, is the limiter's capacity now, read under the queue's mutex in place
    /// of the one the last bounding sweep left (see [`Wait::capacity`]).
    fn enqueue(
        &self,
        gate: &AtomicU64,
        permits: u32,
        capacity: Option<&dyn Capacity>,
    ) -> Result<(u64, Vec<Wake>), AcquireError> {
        let full = |requested| AcquireError::QueueFull {
            requested,
            queue_limit: self.limit,
        };
        let need = Waiter::room(permits);
        let mut evicted = Vec::new();
        let seq = {
            let mut waiters = lock(&self.waiters);
            if waiters.closed || capacity.is_some_and(Capacity::closed) {
                return Err(AcquireError::Closed);
            }
            let capacity = capacity.map_or(waiters.capacity, Capacity::capacity_now);
            if permits > capacity {
                return Err(AcquireError::InsufficientCapacity {
                    requested: permits,
                    capacity,
                });
            }
            if need > self.limit {
                return Err(full(permits));
            }
            while waiters.permits + need > self.limit {
                if self.order == QueueOrder::OldestFirst {
                    return Err(full(permits));
                }
                // Newest first: fail the oldest to make room.
                let Some((seq, old)) = waiters.live.pop_first() else {
                    break;
                };
                waiters.remove_room(old.permits);
                waiters.failed.insert(seq, full(old.permits));
                evicted.push(old.wake);
            }
            if waiters.live.is_empty() {
                // Relaxed: the bit is read and written only by read-modify-writes or by loads that
                // need no other data with it; on the permit word, modification order alone makes a
                // releaser either see it or come before our first attempt (see the module docs).
                gate.fetch_or(WAITERS, Ordering::Relaxed);
            }
            let seq = waiters.next;
            waiters.next += 1;
            waiters.live.insert(
                seq,
                Waiter {
                    permits,
                    wake: Wake::Nobody,
                },
            );
            waiters.permits += need;
            waiters.probes += u64::from(permits == 0);
            seq
        };
        Ok((seq, evicted))
    }

    /// The waiter `seq` looks at its place: if it is the head it runs `take`; otherwise (or if
    /// `take` is blocked) it registers `who` to be woken. A head that leaves also returns the
    /// next head, for the caller to wake once it has secured the outcome (see [`Ticket::turn`]).
    ///
    /// `room`, if given, is asked under the mutex whether the next head's permits are free once
    /// a served head has taken its own; if not, the next head is left asleep (see [`Room`]).
    fn turn<T>(
        &self,
        gate: &AtomicU64,
        seq: u64,
        who: Registration<'_>,
        take: impl FnOnce() -> Result<T, Blocked>,
        room: Option<&dyn Room>,
    ) -> (Turn<T>, Wake) {
        let mut next = Wake::Nobody;
        let mut waiters = lock(&self.waiters);
        let (turn, stale) = self.turn_locked(&mut waiters, gate, seq, who, take, room, &mut next);
        drop(waiters);
        // Only now: a registration replaced or left behind may run user code as it is dropped
        // (see `Wake::register`).
        drop(stale);
        (turn, next)
    }

    /// [`turn`](Self::turn) under the queue's mutex; also returns the registration it replaced
    /// or that the leaving waiter left, to be dropped after unlocking.
    // Each argument is a distinct part of one look (the queue, the gate, the waiter, its
    // registration, its attempt, the next head's room, and where the next head's wake goes).
    #[allow(clippy::too_many_arguments)]
    fn turn_locked<T>(
        &self,
        waiters: &mut Waiters,
        gate: &AtomicU64,
        seq: u64,
        who: Registration<'_>,
        take: impl FnOnce() -> Result<T, Blocked>,
        room: Option<&dyn Room>,
        next: &mut Wake,
    ) -> (Turn<T>, Wake) {
        if let Some(error) = waiters.failed.remove(&seq) {
            return (Turn::Done(Err(error)), Wake::Nobody);
        }
        if self.head(waiters) != Some(seq) {
            return match waiters.live.get_mut(&seq) {
                Some(me) => (Turn::Wait(Blocked::Behind), me.wake.register(who)),
                // Not queued and not failed: cannot happen while the ticket is held; answer as a
                // closed queue rather than wait forever.
                None => (Turn::Done(Err(AcquireError::Closed)), Wake::Nobody),
            };
        }
        match take() {
            Ok(value) => {
                let stale = self.leave(waiters, gate, seq, next, room);
                (Turn::Done(Ok(value)), stale.unwrap_or(Wake::Nobody))
            }
            Err(Blocked::Fail(error)) => {
                let stale = self.leave(waiters, gate, seq, next, None);
                (Turn::Done(Err(error)), stale.unwrap_or(Wake::Nobody))
            }
            Err(blocked) => {
                let stale = match waiters.live.get_mut(&seq) {
                    Some(me) => me.wake.register(who),
                    None => Wake::Nobody,
                };
                (Turn::Wait(blocked), stale)
            }
        }
    }

    /// Removes live waiter `seq`; if it was the head, hands the turn to the next head (returned in
    /// `next` to be woken after unlocking) or clears `WAITERS` when nobody is left. Returns the
    /// waiter's own registration if it was queued, for the caller to drop after unlocking (see
    /// `Wake::register`); `None` if it was not.
    ///
    /// With `room`, the next head is woken only if its permits are free now; otherwise its
    /// registration stays in place for the release that frees them (see [`Room`]).
    fn leave(
        &self,
        waiters: &mut Waiters,
        gate: &AtomicU64,
        seq: u64,
        next: &mut Wake,
        room: Option<&dyn Room>,
    ) -> Option<Wake> {
        let was_head = self.head(waiters) == Some(seq);
        let me = waiters.live.remove(&seq)?;
        waiters.remove_room(me.permits);
        if waiters.live.is_empty() {
            // Relaxed: see `enqueue`.
            gate.fetch_and(!WAITERS, Ordering::Relaxed);
        } else if was_head
            && let Some(head) = self.head(waiters)
            && let Some(h) = waiters.live.get_mut(&head)
            && room.is_none_or(|room| room.free_for(h.permits))
        {
            *next = std::mem::replace(&mut h.wake, Wake::Nobody);
        }
        Some(me.wake)
    }

    /// Drops waiter `seq` (its future was dropped, or it timed out). Returns how it left:
    /// [`Left::Cancelled`] if it was still queued; [`Left::Failed`] if the queue had already
    /// failed it (closed, evicted, or too big after a reconfiguration) and it gave up before it
    /// looked, since that failure was the limiter's decision, not a wait given up; `None` if it
    /// was neither (nothing to count).
    ///
    /// With `room`, a cancelled head wakes the next head only if its permits are free, as a
    /// served head does (see [`Room`]): a waiter that leaves holds nothing (permits are taken
    /// only in a poll that returns them), so its leaving frees nothing, and a release whose wake
    /// it took without looking has freed its permits already, which `free_for` sees (the
    /// release's `fetch_sub` comes before its wake's lock of the mutex, and so before ours).
    fn cancel(&self, gate: &AtomicU64, seq: u64, room: Option<&dyn Room>) -> Option<Left> {
        let mut next = Wake::Nobody;
        let (counted, stale) = {
            let mut waiters = lock(&self.waiters);
            if let Some(error) = waiters.failed.remove(&seq) {
                (Some(Left::Failed(error)), None)
            } else {
                let stale = self.leave(&mut waiters, gate, seq, &mut next, room);
                (stale.as_ref().map(|_| Left::Cancelled), stale)
            }
        };
        // Only now that the queue is unlocked (see `Wake::register`).
        drop(stale);
        // Through `wake_all`: a ticket dropped by an unwinding task must not let the next head's
        // panicking waker out of this drop (see `WakeAll::finish`).
        wake_all([next], Wake::wake);
        counted
    }

    /// Wakes the head (a concurrency limiter's release saw `WAITERS`).
    ///
    /// The release is often a guard's drop, and that drop may run while its holder unwinds; the
    /// head's waker then runs through `wake_all`, so that a panic in it is dropped instead of
    /// aborting the process (see `WakeAll::finish`).
    pub(crate) fn wake_head(&self) {
        let wake = {
            let mut waiters = lock(&self.waiters);
            match self.head(&waiters) {
                Some(head) => match waiters.live.get_mut(&head) {
                    Some(h) => std::mem::replace(&mut h.wake, Wake::Nobody),
                    None => Wake::Nobody,
                },
                None => Wake::Nobody,
            }
        };
        wake_all([wake], Wake::wake);
    }

    /// The limiter's parameters changed: every waiter that asks for more than `capacity` fails
    /// with [`AcquireError::InsufficientCapacity`] at once, and the head (new or not) is woken
    /// to try again under the new parameters (it may be admissible earlier, or later; it
    /// re-arms its timer either way).
    ///
    /// The wake-ups are returned for the caller to run: every caller sweeps under a mutex of
    /// its own (so that sweeps run in the order of the changes they follow) and wakes after
    /// releasing it, since a woken party's `Waker` may run code that takes that mutex.
    ///
    /// For a keyed limiter's queues, which no sweep can bound (a key's queue may be made after
    /// it): their waiters read the capacity in force as they enqueue ([`Wait::capacity`]).
    #[cfg(feature = "keyed")]
    pub(crate) fn reconfigure_waiters(&self, gate: &AtomicU64, capacity: u32) -> Woken {
        self.sweep(gate, capacity, false)
    }

    /// `reconfigure_waiters`, and every later enqueue for more than
    /// `capacity` fails with [`AcquireError::InsufficientCapacity`] at once (until the next
    /// call): for a limiter whose every change of capacity sweeps this queue (an unkeyed one).
    /// A caller that read the old capacity and enqueues after the sweep fails then, instead of
    /// waiting behind the head (`loom_waiters::lowered_limit_vs_enqueue_of_a_request_it_makes_too_big`).
    pub(crate) fn reconfigure_waiters_and_bound(&self, gate: &AtomicU64, capacity: u32) -> Woken {
        self.sweep(gate, capacity, true)
    }

    fn sweep(&self, gate: &AtomicU64, capacity: u32, bound: bool) -> Woken {
        let mut wakes = Vec::new();
        {
            let mut waiters = lock(&self.waiters);
            if bound {
                waiters.capacity = capacity;
            }
            let too_big: Vec<u64> = waiters
                .live
                .iter()
                .filter(|(_, w)| w.permits > capacity)
                .map(|(seq, _)| *seq)
                .collect();
            for seq in too_big {
                if let Some(waiter) = waiters.live.remove(&seq) {
                    waiters.remove_room(waiter.permits);
                    waiters.failed.insert(
                        seq,
                        AcquireError::InsufficientCapacity {
                            requested: waiter.permits,
                            capacity,
                        },
                    );
                    wakes.push(waiter.wake);
                }
            }
            if waiters.live.is_empty() {
                if !wakes.is_empty() {
                    // Relaxed: see `enqueue`.
                    gate.fetch_and(!WAITERS, Ordering::Relaxed);
                }
            } else if let Some(head) = self.head(&waiters)
                && let Some(h) = waiters.live.get_mut(&head)
            {
                wakes.push(std::mem::replace(&mut h.wake, Wake::Nobody));
            }
        }
        Woken(wakes)
    }

    /// Closes the queue if nobody waits in it: later enqueues fail with `Closed`. True if closed
    /// (now or before). A keyed limiter retires a key's queue this way before it drops it from its
    /// map, so that a waiter who found the queue just before cannot join a queue nobody serves:
    /// its enqueue fails and it looks the key up again.
    #[cfg(feature = "keyed")]
    pub(crate) fn close_if_idle(&self, gate: &AtomicU64) -> bool {
        let mut waiters = lock(&self.waiters);
        if waiters.closed {
            return true;
        }
        if !waiters.live.is_empty() {
            return false;
        }
        waiters.closed = true;
        // Relaxed: as in `close`.
        gate.fetch_or(CLOSED, Ordering::Relaxed);
        true
    }

    /// Closes the queue: sets `CLOSED`, fails every waiter with [`AcquireError::Closed`] and wakes
    /// them; later enqueues fail at once.
    pub(crate) fn close(&self, gate: &AtomicU64) {
        // Relaxed: `try_acquire` only needs to see the bit eventually; a call that misses it is
        // ordered before the close.
        gate.fetch_or(CLOSED, Ordering::Relaxed);
        let wakes: Vec<Wake> = {
            let mut waiters = lock(&self.waiters);
            waiters.closed = true;
            waiters.permits = 0;
            waiters.probes = 0;
            let live = std::mem::take(&mut waiters.live);
            let mut wakes = Vec::with_capacity(live.len());
            for (seq, waiter) in live {
                waiters.failed.insert(seq, AcquireError::Closed);
                wakes.push(waiter.wake);
            }
            // Relaxed: see `enqueue`.
            gate.fetch_and(!WAITERS, Ordering::Relaxed);
            wakes
        };
        wake_all(wakes, Wake::wake);
    }
}

/// Wake-ups owed by `WaitQueue::reconfigure_waiters`: each woken party already has its
/// outcome, so they must be run ([`wake`](Self::wake)); dropping this unrun strands them.
#[must_use = "the waiters it holds must be woken"]
pub(crate) struct Woken(Vec<Wake>);

impl Woken {
    /// Wakes every party, all of them even if some wakers panic (see `WakeAll`).
    pub(crate) fn wake(self) {
        wake_all(self.0, Wake::wake);
    }
}

/// How a waiter that gave up left the queue (see [`WaitQueue::cancel`]).
enum Left {
    /// It was still queued: a wait given up ([`CANCELLED`]).
    Cancelled,
    /// The queue had failed it already: the limiter's decision ([`REJECTED`]).
    Failed(AcquireError),
}

impl Left {
    /// The counter the call ends in.
    fn counter(&self) -> usize {
        match self {
            Left::Cancelled => CANCELLED,
            Left::Failed(_) => REJECTED,
        }
    }
}

/// A queued waiter's place. Dropping it while still queued cancels the wait.
struct Ticket<'a> {
    queue: &'a WaitQueue,
    gate: &'a AtomicU64,
    counters: &'a Counters,
    /// See [`Wait::room`].
    room: Option<&'a dyn Room>,
    seq: u64,
    queued: bool,
}

impl Ticket<'_> {
    /// Looks at the turn; on `Done`, the ticket is spent and the outcome counted.
    ///
    /// A head that leaves wakes the next head here, after its own outcome is secured: that wake
    /// runs a foreign `Waker`, which may panic, and what `take` granted is not yet in the caller's
    /// hands (a concurrency limiter builds its permit guard only once the wait returns). If the
    /// wake unwinds, [`Granted`] hands the grant to `give_back` rather than letting the unwind drop
    /// it with the permits or the admission still taken.
    ///
    /// `after` runs once the queue's mutex is released, after every look: the work `take` owes
    /// that must not run under the mutex (a keyed concurrency limiter's head waking the heads of
    /// *other* keys' queues, whose mutexes it would otherwise take while holding its own: two
    /// heads doing so at once would deadlock). It runs with the next head's wake, both even if
    /// one panics (see `WakeAll`), and inside the grant's guard.
    fn turn<T, G: FnMut(T), A: FnMut()>(
        &mut self,
        who: Registration<'_>,
        take: impl FnOnce() -> Result<T, Blocked>,
        give_back: &mut G,
        after: &mut A,
    ) -> Turn<T> {
        let (turn, next) = self.queue.turn(self.gate, self.seq, who, take, self.room);
        let Turn::Done(outcome) = turn else {
            // Still queued: should `after` panic, the unwind drops the ticket, which leaves the
            // queue and wakes the next head if we were it.
            after();
            return turn;
        };
        self.queued = false;
        let value = match outcome {
            Ok(value) => value,
            Err(error) => {
                // Nothing was granted: a panic in these wakes loses nothing of the caller's.
                self.counters.bump(REJECTED);
                Self::wake_after(next, after);
                return Turn::Done(Err(error));
            }
        };
        let mut granted = Granted {
            value: Some(value),
            give_back,
            queue: self.queue,
            counters: self.counters,
        };
        Self::wake_after(next, after);
        match granted.value.take() {
            Some(value) => {
                self.counters.bump(ADMITTED);
                Turn::Done(Ok(value))
            }
            // Cannot happen (nothing else takes it); failing is kinder than panicking here.
            None => {
                self.counters.bump(REJECTED);
                Turn::Done(Err(AcquireError::Closed))
            }
        }
    }
}

impl Ticket<'_> {
    /// A leaving head's last wakes: the next head's, and `after`'s (see [`turn`](Self::turn)),
    /// each run even if the other panics, the first panic re-raised after both.
    fn wake_after(next: Wake, after: &mut impl FnMut()) {
        let mut all = WakeAll::default();
        all.run(|| next.wake());
        all.run(after);
        all.finish();
    }

    /// A blocking waiter's deadline passed: it leaves the queue. Returns what the call ends in:
    /// [`AcquireError::Timeout`] (counted cancelled), unless the queue had failed it already (a
    /// `close`, an eviction or a reconfiguration that landed after its last look): then that
    /// failure, counted rejected as the queue decided, so that the caller's answer and the
    /// statistics agree.
    fn time_out(&mut self) -> AcquireError {
        self.queued = false;
        match self.queue.cancel(self.gate, self.seq, self.room) {
            Some(left) => {
                self.counters.bump(left.counter());
                match left {
                    Left::Failed(error) => error,
                    Left::Cancelled => AcquireError::Timeout,
                }
            }
            None => AcquireError::Timeout,
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.queued
            && let Some(left) = self.queue.cancel(self.gate, self.seq, self.room)
        {
            self.counters.bump(left.counter());
            #[cfg(feature = "tokio")]
            if let Left::Failed(error) = left {
                timed_out::failed(error);
            }
        }
    }
}

/// An `acquire` with a time limit (every limiter's `acquire_timeout`).
///
/// `future` is polled first, as [`crate::timer::timeout`] does. When the time passes it is
/// dropped, and the call answers [`AcquireError::Timeout`], counted cancelled by the waiter's
/// ticket, unless the queue had failed that waiter already (a `close`, an eviction or a lowered
/// limit that landed after its last look, on another thread): the ticket then counts the call
/// rejected, as the queue decided, and the call answers that failure, as
/// [`Wait::run_blocking`] does at its deadline. Answering `Timeout` there told the caller one
/// thing and `stats()` another (`an_acquire_timeout_failed_as_its_time_passes_answers_what_stats_count`).
#[cfg(feature = "tokio")]
pub(crate) async fn timeout<T>(
    after: std::time::Duration,
    future: impl Future<Output = Result<T, AcquireError>>,
) -> Result<T, AcquireError> {
    let mut future = std::pin::pin!(Some(future));
    let polled = crate::timer::timeout(
        after,
        std::future::poll_fn(|cx| match future.as_mut().as_pin_mut() {
            Some(future) => future.poll(cx),
            // Not polled again once dropped (below), nor once ready (`timer::timeout` returns).
            None => Poll::Ready(Err(AcquireError::Timeout)),
        }),
    )
    .await;
    match polled {
        Ok(outcome) => outcome,
        Err(_) => {
            Err(timed_out::drop_and_learn(|| future.set(None)).unwrap_or(AcquireError::Timeout))
        }
    }
}

/// How a timed-out `acquire` learns what its dropped waiter was counted as (see [`timeout`]):
/// the ticket's `Drop` runs inside `future.set(None)`, on this thread, and leaves the failure
/// in a thread-local slot that only [`drop_and_learn`](timed_out::drop_and_learn) opens.
#[cfg(feature = "tokio")]
mod timed_out {
    use crate::error::AcquireError;
    use std::cell::Cell;

    std::thread_local! {
        /// `Some` while a timed-out acquire is being dropped on this thread: the first failure a
        /// ticket dropped in it had been given by its queue.
        static SLOT: Cell<Option<Option<AcquireError>>> = const { Cell::new(None) };
    }

    /// A ticket the queue had failed is dropped with `error` (counted rejected).
    pub(super) fn failed(error: AcquireError) {
        SLOT.with(|slot| {
            if let Some(None) = slot.get() {
                slot.set(Some(Some(error)));
            }
        });
    }

    /// Runs `drop` and returns the first failure of a ticket dropped in it. A timed-out
    /// acquire holds one ticket; only a failed ticket of another call, dropped first by user
    /// code that this drop runs (the `Drop` of a `Waker` it lets go), would be taken for it.
    pub(super) fn drop_and_learn(drop: impl FnOnce()) -> Option<AcquireError> {
        /// Puts back the slot of an enclosing call, even if `drop` unwinds.
        struct Restore(Option<Option<AcquireError>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                SLOT.with(|slot| slot.set(self.0));
            }
        }
        let restore = Restore(SLOT.with(|slot| slot.replace(Some(None))));
        drop();
        let learnt = SLOT.with(Cell::get).flatten();
        std::mem::drop(restore);
        learnt
    }
}

/// What a served head was granted, held while it wakes the next head. Dropped with the grant
/// still inside only when that wake unwinds: it then gives the grant back to the limiter, wakes
/// the head again, and counts the call as cancelled (its poll panicked; the future cannot be
/// used again).
///
/// The head is woken again because the next head may have looked while the grant was still
/// taken (its task polled on another thread after the wake, before the panic), and be asleep
/// until the time the algorithm reported then: without a wake it would sleep with the permits
/// free, and `try_acquire` would defer to it all that time
/// (`a_served_heads_give_back_after_a_waker_panic_wakes_the_next_head`).
struct Granted<'a, 'g, T, G: FnMut(T)> {
    value: Option<T>,
    give_back: &'g mut G,
    queue: &'a WaitQueue,
    counters: &'a Counters,
}

impl<T, G: FnMut(T)> Drop for Granted<'_, '_, T, G> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            (self.give_back)(value);
            // Inside the unwind: `wake_head` lets no second panic out (see `WakeAll::finish`).
            self.queue.wake_head();
            self.counters.bump(CANCELLED);
        }
    }
}

/// Everything a waiting call needs from its limiter.
pub(crate) struct Wait<'a> {
    pub(crate) queue: &'a WaitQueue,
    pub(crate) gate: &'a AtomicU64,
    pub(crate) counters: &'a Counters,
    pub(crate) permits: u32,
    /// `Some` for a queue that its caller replaces and retries when it finds it closed (a keyed
    /// limiter's per-key queue, closed by its retirement): an enqueue that fails with `Closed`
    /// while the limiter is open is then not counted as a rejection, and sets this flag to 1,
    /// which tells the caller to look its key up again. The caller must go by the flag, not
    /// by a read of the limiter's closed bit of its own: a `close` that landed between our read
    /// and its read made it return `Closed` uncounted, and `stats()` lost the call (the loom
    /// model `a_close_racing_a_queues_retirement_counts_every_waiter_once`). Only the owning
    /// call reads or writes it.
    pub(crate) retry_closed: Option<&'a AtomicU64>,
    /// The limiter's capacity now, for a queue that no sweep bounds (a keyed limiter's: a key's
    /// queue may be created after the sweep of a lowering): the enqueue reads it under the
    /// queue's mutex and fails with [`AcquireError::InsufficientCapacity`] if `permits` is
    /// above it. `None`: the capacity the last [`WaitQueue::reconfigure_waiters_and_bound`] left.
    ///
    /// Why under the mutex: the caller checked the capacity in its fast path, without it, and may
    /// enqueue after a lowering swept this queue; it would then wait behind the head for a
    /// request that can never fit (for good, while the head waits for good). With the read under
    /// the mutex, either the sweep takes the mutex after the enqueue (and fails the waiter), or
    /// before it, and the enqueue reads the lowered capacity its sweeper stored before the sweep.
    /// A sweep that misses the queue altogether (created, or looked up, during the walk) is the
    /// keyed limiters' fence pair (`registered` in `keyed_concurrency.rs`, `KeyedLimiter`'s
    /// `reconfigure`): either the walk finds the queue, or the read sees the new capacity.
    pub(crate) capacity: Option<&'a dyn Capacity>,
    /// Whether a head's permits are free now, for a limiter whose every freeing of permits
    /// wakes the head (a concurrency limiter's release): a served or cancelled head then wakes
    /// the next head only if its permits are free, instead of waking it to look, find nothing
    /// and sleep again.
    /// `None`: the next head is always woken (a rate limiter's must arm its own timer).
    pub(crate) room: Option<&'a dyn Room>,
}

/// A limiter whose every freeing of permits wakes the queue's head (see [`Wait::room`]).
///
/// Why a served or cancelled head may leave the next head asleep: that head stays registered,
/// and every later freeing wakes the head of the moment under the queue's mutex (a release that
/// saw `WAITERS`, which stays set while anyone is queued; a raise's sweep). `free_for` runs under
/// the mutex, after the served head's take; a release it does not see comes after its read in
/// the permit word's modification order, so it sees `WAITERS` and wakes the head once the mutex
/// is free (`loom_waiters::served_head_leaves_the_next_asleep_vs_release`, and
/// `cancelled_head_leaves_the_next_asleep_vs_release` for a head that leaves unserved).
pub(crate) trait Room: Sync {
    /// Whether a waiter for `permits` (a probe: one) could take them now.
    fn free_for(&self, permits: u32) -> bool;
}

/// A limiter whose capacity an enqueue reads under the queue's mutex: see [`Wait::capacity`].
pub(crate) trait Capacity: Sync {
    /// The most permits one call can get now.
    fn capacity_now(&self) -> u32;

    /// Whether the limiter (not only this queue) is closed now: the enqueue then fails with
    /// [`AcquireError::Closed`], counted, even where a closed queue means "retired, look again"
    /// ([`Wait::retry_closed`]). Read under the queue's mutex for the same reason as the
    /// capacity: a keyed limiter's `close` walks the queues it can find, and a queue created
    /// during the walk is the same fence pair's other side (see `Waits::close` in `keyed.rs`).
    fn closed(&self) -> bool {
        false
    }
}

impl<'a> Wait<'a> {
    fn enqueue(&self) -> Result<Ticket<'a>, AcquireError> {
        match self.queue.enqueue(self.gate, self.permits, self.capacity) {
            Ok((seq, evicted)) => {
                let ticket = Ticket {
                    queue: self.queue,
                    gate: self.gate,
                    counters: self.counters,
                    room: self.room,
                    seq,
                    queued: true,
                };
                // Woken only now that our place has a ticket: if a waker panics, the unwind drops
                // the ticket, which takes our waiter out of the queue. Before, nothing would have,
                // and the queue would keep a waiter that nobody polls.
                wake_all(evicted, Wake::wake);
                Ok(ticket)
            }
            // A retired queue: the caller looks again, uncounted, told by the flag; unless the
            // limiter is closed (then the caller fails, and this is its one count).
            Err(AcquireError::Closed)
                if self.retry_closed.is_some() && !self.capacity.is_some_and(Capacity::closed) =>
            {
                if let Some(retry) = self.retry_closed {
                    // Relaxed: the owning call's own flag (see `Wait::retry_closed`).
                    retry.store(1, Ordering::Relaxed);
                }
                Err(AcquireError::Closed)
            }
            Err(error) => {
                self.counters.bump(REJECTED);
                Err(error)
            }
        }
    }

    /// Waits in the queue as an async task. `take` is the head's attempt; `give_back` undoes one
    /// that succeeded, for the rare poll that unwinds between the two (see [`Ticket::turn`]).
    /// `sleep` is called when the head must wait for time (`Blocked::Until`): it arms a timer
    /// for that many nanoseconds and polls it.
    ///
    /// Cancel safety: dropping the returned future at its await removes the waiter (the ticket's
    /// `Drop`) and, if it was the head, wakes the next one. Permits are taken only inside a poll
    /// that then returns `Ready`, so a dropped future never holds any.
    pub(crate) async fn run_async<T>(
        self,
        take: impl FnMut() -> Result<T, Blocked>,
        give_back: impl FnMut(T),
        sleep: impl FnMut(&mut Context<'_>, u64) -> Poll<()>,
    ) -> Result<T, AcquireError> {
        self.run_async_then(take, give_back, sleep, || {}).await
    }

    /// [`run_async`](Self::run_async), running `after` after every attempt once the queue's
    /// mutex is released (the work the attempt owes that must not run under it; see
    /// `Ticket::turn`).
    pub(crate) async fn run_async_then<T>(
        self,
        mut take: impl FnMut() -> Result<T, Blocked>,
        mut give_back: impl FnMut(T),
        mut sleep: impl FnMut(&mut Context<'_>, u64) -> Poll<()>,
        mut after: impl FnMut(),
    ) -> Result<T, AcquireError> {
        let mut ticket = self.enqueue()?;
        std::future::poll_fn(|cx| {
            loop {
                let who = Registration::Task(cx.waker());
                match ticket.turn(who, &mut take, &mut give_back, &mut after) {
                    Turn::Done(outcome) => return Poll::Ready(outcome),
                    Turn::Wait(Blocked::Until(nanos)) => match sleep(cx, nanos) {
                        Poll::Ready(()) => continue,
                        Poll::Pending => return Poll::Pending,
                    },
                    Turn::Wait(_) => return Poll::Pending,
                }
            }
        })
        .await
    }

    /// Waits in the queue on the calling thread, until served, failed, or `deadline` passes.
    /// `take` and `give_back` as for [`run_async`](Self::run_async).
    pub(crate) fn run_blocking<T>(
        self,
        take: impl FnMut() -> Result<T, Blocked>,
        give_back: impl FnMut(T),
        deadline: Option<std::time::Instant>,
    ) -> Result<T, AcquireError> {
        self.run_blocking_then(take, give_back, deadline, || {})
    }

    /// [`run_blocking`](Self::run_blocking), running `after` as
    /// [`run_async_then`](Self::run_async_then) does.
    pub(crate) fn run_blocking_then<T>(
        self,
        mut take: impl FnMut() -> Result<T, Blocked>,
        mut give_back: impl FnMut(T),
        deadline: Option<std::time::Instant>,
        mut after: impl FnMut(),
    ) -> Result<T, AcquireError> {
        let mut ticket = self.enqueue()?;
        let signal = Arc::new(Signal::new());
        loop {
            let seen = signal.epoch();
            let who = Registration::Thread(&signal);
            let blocked = match ticket.turn(who, &mut take, &mut give_back, &mut after) {
                Turn::Done(outcome) => return outcome,
                Turn::Wait(blocked) => blocked,
            };
            let left = match deadline {
                Some(deadline) => {
                    let now = std::time::Instant::now();
                    if now >= deadline {
                        // Leaves the queue and counts the call; a failure the queue decided
                        // since our look (a racing `close`) is what we answer, as counted.
                        return Err(ticket.time_out());
                    }
                    Some(deadline - now)
                }
                None => None,
            };
            match (blocked, left) {
                (Blocked::Until(nanos), left) => {
                    let until = std::time::Duration::from_nanos(nanos.max(1));
                    signal.wait_timeout(seen, left.map_or(until, |l| l.min(until)));
                }
                (_, Some(left)) => signal.wait_timeout(seen, left),
                (_, None) => signal.wait(seen),
            }
        }
    }
}

/// The timer of a head that waits for time (tokio's inside a tokio runtime, futures-timer's
/// elsewhere: [`crate::timer`]); allocated on first use, then reset.
#[cfg(feature = "tokio")]
#[derive(Default)]
pub(crate) struct Timer {
    sleep: Option<crate::timer::Sleep>,
}

#[cfg(feature = "tokio")]
impl Timer {
    /// Arms the timer `nanos` from now (at least 1 ns) and polls it.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>, nanos: u64) -> Poll<()> {
        let after = std::time::Duration::from_nanos(nanos.max(1));
        let sleep = match &mut self.sleep {
            Some(sleep) => {
                sleep.reset(after);
                sleep
            }
            None => self.sleep.insert(crate::timer::Sleep::new(after)),
        };
        Pin::new(sleep).poll(cx)
    }
}

/// For waiters that never wait for time (a concurrency limiter's): `Blocked::Until` does not occur.
pub(crate) fn no_timer(_: &mut Context<'_>, _: u64) -> Poll<()> {
    Poll::Pending
}

/// The queued part of an acquire, boxed: built only when the fast path says to queue up, so the
/// future a caller awaits stays a few words long.
pub(crate) type SlowWait<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, AcquireError>> + Send + 'a>>;

/// The two halves of an `acquire`: what [`Acquire`] runs.
pub(crate) trait Phases<'a>: Unpin {
    /// What an admitted call returns (an admission, a permit guard).
    type Output;

    /// Validates and tries without queueing; `Pending` means "queue up". Counts what it decides.
    /// (It returns the very type the future does, so that the answer needs no repacking.)
    fn fast(&mut self) -> Poll<Result<Self::Output, AcquireError>>;

    /// The wait in the queue, once `fast` has said to queue up.
    fn slow(&mut self) -> SlowWait<'a, Self::Output>;
}

/// The future behind every `acquire`.
///
/// Its first poll runs the fast path inline and, when that decides, returns `Ready` at once: on a
/// free limiter an `.await` costs what `try_acquire` does, with no nested `async fn` state machine
/// to step through and no copy of the answer between frames. Only a caller that must queue builds
/// (and boxes) the slow future, in a cold function.
///
/// Cancel safety: before the first poll nothing has happened; the fast path returns `Ready` in the
/// same poll in which it takes permits; the slow future is cancel-safe (see [`Wait::run_async`]).
pub(crate) struct Acquire<'a, P: Phases<'a>> {
    phases: P,
    slow: Option<SlowWait<'a, P::Output>>,
    done: bool,
}

impl<'a, P: Phases<'a>> Acquire<'a, P> {
    #[inline(always)]
    pub(crate) fn new(phases: P) -> Self {
        Acquire {
            phases,
            slow: None,
            done: false,
        }
    }

    #[cold]
    #[inline(never)]
    fn poll_slow(&mut self, cx: &mut Context<'_>) -> Poll<Result<P::Output, AcquireError>> {
        // As an `async fn` would: a finished future has nothing left to give.
        assert!(
            !self.done,
            "an acquire future was polled after it completed"
        );
        let phases = &mut self.phases;
        let slow = self.slow.get_or_insert_with(|| phases.slow());
        let outcome = std::task::ready!(slow.as_mut().poll(cx));
        self.slow = None;
        self.done = true;
        Poll::Ready(outcome)
    }
}

impl<'a, P: Phases<'a>> Future for Acquire<'a, P> {
    type Output = Result<P::Output, AcquireError>;

    // Always inlined, as `try_acquire` is: the caller knows the limiter's clock type, and an
    // out-of-line poll returns the whole answer through memory.
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.slow.is_none() && !this.done {
            // Marked done first, so that the answer goes straight to the caller (setting the flag
            // between computing and returning it made the compiler copy it through the stack).
            this.done = true;
            let fast = this.phases.fast();
            if fast.is_ready() {
                return fast;
            }
            this.done = false;
        }
        this.poll_slow(cx)
    }
}
