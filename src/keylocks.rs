//! [`KeyLocks`]: keyed reader/writer locks whose per-key state ("doorman") exists only while the
//! key is in use.
//!
//! # Layout
//!
//! The keys are split over N shards (a power of two; by default the smallest one ≥ 2 × the
//! available parallelism, at least 4 and at most 1,024) by bits 32.. of the key's hash. Each
//! shard is one cache-padded mutex around
//!
//! - a `hashbrown::HashTable` of the keys in use, each entry holding the key, its hash, an `id`
//!   unique within the shard, and the key's doorman inline;
//! - a bounded free pool of doormen (`Vec<Doorman>`, at most `pool_per_shard`);
//! - the counter that hands out entry ids and waiter tickets.
//!
//! A doorman is `{ readers, writer, queue, waiting }`: the read holds granted, whether the write
//! hold is granted, a FIFO `VecDeque` of waiters (ticket, mode, how to wake it, and whether it was
//! cancelled: see [Cancellation](#cancellation)), and how many of those are live. Its reference
//! count is implicit: `readers + writer + waiting`. When that reaches zero the entry leaves the
//! table and the doorman goes to the pool (its queue keeps up to 16 slots of capacity, which is
//! what pooling saves: the allocation a contended key's queue needs) or is dropped if the pool is
//! full. While the key stays in use, a queue buffer filled to less than a quarter shrinks to twice
//! its length, so that its memory follows the waiters rather than their peak.
//!
//! # Protocol
//!
//! Every state change happens under the shard's mutex, in a short critical section with no await,
//! so correctness reduces to the mutex plus three rules. The only user code run under the mutex is
//! the key's `Borrow::borrow`, `Eq` and `to_owned` and a waker's `clone`, each before the change
//! it belongs to (`Hash` runs before locking, to pick the shard): a panic in any of them leaves
//! a consistent state (the crate ignores mutex poisoning). Wake-ups,
//! and the drops of retired keys, of cancelled waiters' wakers and of wakers replaced by a newer
//! one, run after unlocking (a waker's drop may itself release a guard of these locks).
//!
//! 1. **Admission.** A newcomer gets a read hold iff no writer holds and nobody is queued; a write
//!    hold iff nobody holds and nobody is queued ("queued": live waiters, `waiting > 0`; tombstones
//!    never make a newcomer wait). Otherwise it queues at the back (the `try_*` calls fail
//!    instead). A reader that arrives while a writer waits therefore queues behind it: writers are
//!    not starved.
//! 2. **Grant (hand-off).** After every change (release, cancel, downgrade) the doorman grants from
//!    the front of its queue: the front writer if nobody holds, or every reader at the front up to
//!    the next live writer if no writer holds, skipping tombstones. A granted waiter is *removed*
//!    from the queue and its hold counted in `readers`/`writer` at once, then woken after the mutex
//!    is released. Invariant: after every critical section the queue is empty or its front is a
//!    live waiter that cannot be granted.
//! 3. **Who holds.** A waiter learns it was granted by not finding its ticket in the queue (tickets
//!    increase, so it is a binary search). Only a grant or the waiter's own cancellation takes a
//!    ticket out of the live ones, and a cancelled waiter never looks again, so "absent" means
//!    "granted". A waiting future that is dropped looks once more: if its ticket is still queued
//!    it cancels it; if not, it was granted a hold nobody will ever see, and it releases that hold
//!    (the refund). Both run the grant of rule 2 afterwards.
//!
//! A hold is identified by `(hash, id)`, never by the key: releasing needs no hashing and no key
//! comparison, and a guard does not clone the key. The entry cannot leave the table while a hold
//! or a ticket for it exists (both count in the reference count), and ids are never reused within
//! a shard, so `(hash, id)` always finds the right entry.
//!
//! No lost wake-up: a waiter's look at the queue and the registration of its waker happen under
//! the same mutex as every grant, so a grant either precedes the look (which sees the ticket
//! gone) or finds the waker registered.
//!
//! # Cancellation
//!
//! A cancelled waiter (its future dropped, or a blocking wait timed out) is not removed from the
//! middle of the queue, which would shift up to half of it under the shard's mutex that every key
//! of the shard shares: 40,000 waiters cancelled from the middle of one queue took 231 ms in
//! total, up to 1.6 ms for one cancellation. It is marked cancelled in place, a *tombstone*: its
//! ticket stays, so the queue stays sorted for the binary search, and its waker is taken out and
//! dropped after unlocking, as before. Then, all under the mutex:
//!
//! - tombstones at either end of the queue are popped, and grants pop those that reach the front,
//!   so the front is always a live waiter (the head for rule 2) and `waiting == 0` iff the queue
//!   is empty: an idle doorman pools with an empty queue;
//! - when tombstones outnumber the live waiters the queue is compacted (`retain`), so the queue
//!   holds at most twice its live waiters and its memory (with the trimming above) follows them.
//!   This is checked after every cancellation and also after every grant, which takes live
//!   waiters out of the queue and leaves the tombstones behind them.
//!
//! Each tombstone is dropped once, and a compaction of n entries comes after more than n/2
//! cancellations since the last one, so a cancellation costs O(log n) (the search) plus amortised
//! O(1). The price: a single cancellation that triggers a compaction is O(n), a linear `retain`
//! over at most twice the live waiters, once per that many cancellations; the queue may hold one
//! dead slot per live waiter; and `TryLockError::WriterQueued`, `waiters` and the reference count
//! use the live count `waiting`, never the queue's length.

use crate::error::ConfigError;
use crate::sync::{Arc, Mutex, Signal, lock, wake_all};
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use hashbrown::hash_table::Entry as Slot;
use std::borrow::Borrow;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// The number of idle doormen each shard keeps for reuse unless told otherwise.
///
/// # Examples
///
/// ```
/// use turnstile::{KeyLocks, DEFAULT_POOL_PER_SHARD};
///
/// let locks = KeyLocks::<u64>::new();
/// assert_eq!(locks.pool_per_shard(), DEFAULT_POOL_PER_SHARD);
/// ```
pub const DEFAULT_POOL_PER_SHARD: usize = 64;

/// The most shards a [`KeyLocks`] can have.
const MAX_SHARDS: usize = 1 << 16;

/// A pooled doorman keeps at most this many queue slots; a larger queue buffer is shrunk when the
/// doorman is pooled, so a burst of waiters on one key does not pin memory in the pool.
const POOLED_QUEUE_CAPACITY: usize = 16;

/// The shard index is taken from the hash's bits 32.. (at most 16 of them): hashbrown uses the low
/// bits for the bucket and the top 7 for its control bytes, so this keeps the three independent.
const SHARD_SHIFT: u32 = 32;

/// Why a [`try_read`](KeyLocks::try_read) or [`try_write`](KeyLocks::try_write) did not get its
/// lock.
///
/// # Examples
///
/// ```
/// use turnstile::{KeyLocks, TryLockError};
///
/// let locks = KeyLocks::new();
/// let reading = locks.try_read("user:1")?;
/// assert_eq!(
///     locks.try_write("user:1").unwrap_err(),
///     TryLockError::ReadLocked { readers: 1 }
/// );
/// drop(reading);
/// let writing = locks.try_write("user:1")?;
/// assert_eq!(locks.try_read("user:1").unwrap_err(), TryLockError::WriteLocked);
/// # drop(writing);
/// # Ok::<(), TryLockError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryLockError {
    /// A writer holds the key.
    WriteLocked,
    /// Readers hold the key, so it cannot be written (only `try_write` fails this way).
    ReadLocked {
        /// How many read holds exist (a snapshot).
        readers: u64,
    },
    /// Readers hold the key but a writer is queued for it; a new reader does not overtake the
    /// writer (only `try_read` fails this way).
    WriterQueued {
        /// How many waiters are queued for the key (a snapshot).
        waiters: usize,
    },
}

impl fmt::Display for TryLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryLockError::WriteLocked => f.write_str("the key is locked by a writer"),
            TryLockError::ReadLocked { readers } => {
                write!(f, "the key is locked by {readers} reader(s)")
            }
            TryLockError::WriterQueued { waiters } => write!(
                f,
                "the key is read-locked and a writer is queued ({waiters} waiter(s))"
            ),
        }
    }
}

impl std::error::Error for TryLockError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Read,
    Write,
}

/// How a queued waiter wants to be woken, as it registers (borrowed; cloned under the mutex before
/// any state changes, so a panicking waker clone leaves the state as it was).
enum Register<'a> {
    /// Nothing yet: the waiter will look again before it sleeps.
    Nobody,
    Task(&'a Waker),
    Thread(&'a Arc<Signal>),
}

/// A registered wake-up.
enum Wake {
    Nobody,
    Task(Waker),
    Thread(Arc<Signal>),
}

impl Wake {
    fn new(who: Register<'_>) -> Wake {
        match who {
            Register::Nobody => Wake::Nobody,
            Register::Task(waker) => Wake::Task(waker.clone()),
            Register::Thread(signal) => Wake::Thread(Arc::clone(signal)),
        }
    }

    /// Registers `who` in place of the current wake-up; returns the one it replaced, for the
    /// caller to drop after unlocking: a waker's drop is user code, which may use these same locks
    /// (an `ArcWake` that owns a guard), and would then lock the shard's mutex again.
    fn update(&mut self, who: Register<'_>) -> Option<Wake> {
        match (who, &*self) {
            (Register::Nobody, _) => None,
            (Register::Task(new), Wake::Task(old)) if old.will_wake(new) => None,
            // The clone runs first: if it panics, the old wake-up stays in place.
            (who, _) => Some(std::mem::replace(self, Wake::new(who))),
        }
    }

    fn wake(self) {
        match self {
            Wake::Nobody => {}
            Wake::Task(waker) => waker.wake(),
            Wake::Thread(signal) => signal.notify(),
        }
    }
}

/// Wake-ups collected under the mutex, run after it is released. One inline, more in a `Vec` that
/// allocates only when a grant wakes several readers at once.
#[derive(Default)]
struct Wakes {
    first: Option<Wake>,
    more: Vec<Wake>,
}

impl Wakes {
    fn push(&mut self, wake: Wake) {
        if matches!(wake, Wake::Nobody) {
            return;
        }
        match self.first {
            None => self.first = Some(wake),
            Some(_) => self.more.push(wake),
        }
    }

    /// Wakes them all, even if a waker panics: each woken waiter already holds its grant, and one
    /// left unwoken would keep the key locked for good.
    fn wake(self) {
        wake_all(self.first.into_iter().chain(self.more), Wake::wake);
    }
}

struct Waiter {
    ticket: u64,
    mode: Mode,
    /// A tombstone: the waiter was cancelled and is only kept for its ticket's place, so that
    /// cancelling costs no shift of the queue (see "Cancellation" in the module docs). Its
    /// `wake` has been taken out.
    cancelled: bool,
    wake: Wake,
}

/// One key's lock state. Its reference count is `readers + writer + waiting`: tombstones in the
/// queue do not count.
///
/// Invariant after every critical section: the queue is empty or its front and back are live
/// waiters, and it holds at most as many tombstones as live waiters. So `waiting == 0` iff the
/// queue is empty, and the front that grants look at is the first live waiter.
#[derive(Default)]
struct Doorman {
    /// Read holds granted (to guards, or to waiters that have not yet seen their grant).
    readers: u64,
    /// The write hold is granted.
    writer: bool,
    /// Waiters not yet granted, in arrival (ticket) order, with the tombstones of cancelled ones.
    queue: VecDeque<Waiter>,
    /// The live (not cancelled) waiters in `queue`.
    waiting: usize,
}

impl Doorman {
    fn idle(&self) -> bool {
        let idle = self.readers == 0 && !self.writer && self.waiting == 0;
        debug_assert!(
            !idle || self.queue.is_empty(),
            "an idle doorman kept tombstones"
        );
        // Checked here because every change but a newcomer's (which only adds a live waiter)
        // asks this question right after it.
        debug_assert!(
            self.queue.len() - self.waiting <= self.waiting,
            "tombstones outnumber the live waiters"
        );
        idle
    }

    /// Why a newcomer asking for `mode` cannot be admitted now, if it cannot (rule 1).
    fn refuse(&self, mode: Mode) -> Option<TryLockError> {
        if self.writer {
            Some(TryLockError::WriteLocked)
        } else if mode == Mode::Write && self.readers > 0 {
            Some(TryLockError::ReadLocked {
                readers: self.readers,
            })
        } else if self.waiting > 0 {
            // The queue's first live waiter cannot be granted (the invariant) and no writer
            // holds, so readers hold and it is a writer.
            Some(TryLockError::WriterQueued {
                waiters: self.waiting,
            })
        } else {
            None
        }
    }

    fn take(&mut self, mode: Mode) {
        match mode {
            // Cannot overflow: 2^64 holds would take centuries of calls even if every guard were
            // leaked with `mem::forget`.
            Mode::Read => self.readers += 1,
            Mode::Write => self.writer = true,
        }
    }

    fn give_back(&mut self, mode: Mode) {
        match mode {
            Mode::Read => self.readers = self.readers.saturating_sub(1),
            Mode::Write => self.writer = false,
        }
    }

    /// Rule 2: grants the front writer, or the readers at the front up to the next writer, for as
    /// long as the state allows; their wake-ups go to `wakes`. Tombstones are skipped (and
    /// dropped) on the way: a reader batch runs up to the next *live* writer.
    fn grant(&mut self, wakes: &mut Wakes) {
        loop {
            self.pop_dead_front();
            let Some(front) = self.queue.front() else {
                break;
            };
            let grantable = match front.mode {
                Mode::Read => !self.writer,
                Mode::Write => !self.writer && self.readers == 0,
            };
            if !grantable {
                break;
            }
            if let Some(granted) = self.queue.pop_front() {
                self.waiting -= 1;
                self.take(granted.mode);
                wakes.push(granted.wake);
            }
        }
        // A grant takes live waiters out and leaves the tombstones behind them: a reader batch
        // granted ahead of cancelled waiters could otherwise leave a queue of a few live waiters
        // among thousands of tombstones, pinning the buffer of the burst while the batch holds.
        self.compact();
    }

    /// Joins the back of the queue.
    fn push(&mut self, ticket: u64, mode: Mode, wake: Wake) {
        self.queue.push_back(Waiter {
            ticket,
            mode,
            cancelled: false,
            wake,
        });
        self.waiting += 1;
    }

    /// Cancels the live waiter at `at`: it becomes a tombstone in O(1), instead of a
    /// `VecDeque::remove` that shifts up to half the queue under the shard's mutex. Returns its
    /// wake-up, for the caller to drop after unlocking. Tombstones at either end leave at once,
    /// and the queue is compacted when they outnumber the live waiters: both amortised O(1) per
    /// cancellation, as each tombstone is dropped once and a compaction of n entries follows
    /// more than n/2 cancellations since the last one.
    fn cancel(&mut self, at: usize) -> Option<Wake> {
        let waiter = self.queue.get_mut(at)?;
        debug_assert!(!waiter.cancelled, "a waiter was cancelled twice");
        waiter.cancelled = true;
        let wake = std::mem::replace(&mut waiter.wake, Wake::Nobody);
        self.waiting -= 1;
        while self.queue.back().is_some_and(|w| w.cancelled) {
            self.queue.pop_back();
        }
        self.pop_dead_front();
        self.compact();
        Some(wake)
    }

    /// Drops every tombstone once they outnumber the live waiters, so that the queue holds at
    /// most twice its live waiters: its scans and (with [`trim`](Self::trim)) its memory follow
    /// them. Tickets keep their order, so the binary search still holds. Run after every
    /// cancellation (which adds a tombstone) and every grant (which takes live waiters out).
    /// Amortised O(1) per cancellation: a compaction of n entries drops more than n/2
    /// tombstones, and each tombstone, made by one cancellation, is dropped once.
    fn compact(&mut self) {
        if self.queue.len() - self.waiting > self.waiting {
            self.queue.retain(|w| !w.cancelled);
        }
    }

    /// Drops the tombstones at the front, so that the front is a live waiter (or the queue is
    /// empty). Their wakes were taken out when they were cancelled: no user code runs here.
    fn pop_dead_front(&mut self) {
        while self.queue.front().is_some_and(|w| w.cancelled) {
            self.queue.pop_front();
        }
    }

    /// Shrinks a queue buffer that its waiters fill to less than a quarter, so that a burst of
    /// waiters on a key that stays in use does not pin the memory of its peak until the key goes
    /// idle (which a continuously contended key may never do). Amortised O(1): after shrinking
    /// to twice its length, the queue must lose half its waiters before the next shrink. Never
    /// below [`POOLED_QUEUE_CAPACITY`], the buffer a pooled doorman keeps anyway. The length
    /// counts tombstones (they take slots), which are never more than the live waiters.
    fn trim(&mut self) {
        let capacity = self.queue.capacity();
        if capacity > POOLED_QUEUE_CAPACITY && self.queue.len() * 4 < capacity {
            self.queue
                .shrink_to((self.queue.len() * 2).max(POOLED_QUEUE_CAPACITY));
        }
    }

    /// Position of `ticket` in the queue, or `None` if it has been granted. Tombstones keep their
    /// tickets, in order, so the search spans them; a ticket is only looked for by its own
    /// waiter, which never looks again once cancelled, so a found ticket is a live waiter.
    fn find(&self, ticket: u64) -> Option<usize> {
        let at = self.queue.binary_search_by_key(&ticket, |w| w.ticket).ok();
        debug_assert!(at.is_none_or(|at| !self.queue[at].cancelled));
        at
    }
}

/// A key in use.
struct Keyed<K> {
    hash: u64,
    id: u64,
    key: K,
    door: Doorman,
}

struct Shard<K> {
    table: HashTable<Keyed<K>>,
    pool: Vec<Doorman>,
    /// Entry ids and waiter tickets, from one counter; never reused (2^64 of them would take
    /// centuries).
    next: u64,
}

/// What identifies a hold or a waiter's entry: the key's hash and the entry's id.
#[derive(Debug, Clone, Copy)]
struct Hold {
    hash: u64,
    id: u64,
}

/// Things to drop after the shard's mutex is released (they may run user code).
type Retired<K> = Option<(K, Option<Doorman>)>;

struct Inner<K, S> {
    shards: Box<[CachePadded<Mutex<Shard<K>>>]>,
    mask: u64,
    pool_per_shard: usize,
    hasher: S,
}

impl<K, S> Inner<K, S> {
    fn shard(&self, hash: u64) -> &Mutex<Shard<K>> {
        // In bounds: `mask` is the shard count minus one.
        &self.shards[((hash >> SHARD_SHIFT) & self.mask) as usize]
    }

    /// Runs `change` on the doorman of `hold` under its shard's mutex; if that leaves it idle, the
    /// entry leaves the table and the doorman goes to the pool. Wakes whoever `change` granted,
    /// after unlocking; also drops, after unlocking, what `change` returns and the retired key.
    fn update<R>(
        &self,
        hold: Hold,
        change: impl FnOnce(&mut Doorman, &mut Wakes) -> R,
    ) -> Option<R> {
        let mut wakes = Wakes::default();
        let (out, retired): (Option<R>, Retired<K>) = {
            let mut guard = lock(self.shard(hold.hash));
            let shard = &mut *guard;
            match shard.table.find_entry(hold.hash, |e| e.id == hold.id) {
                Ok(mut entry) => {
                    let out = change(&mut entry.get_mut().door, &mut wakes);
                    let retired = if entry.get().door.idle() {
                        let (keyed, _) = entry.remove();
                        let surplus = self.retire(&mut shard.pool, keyed.door);
                        shrink(&mut shard.table);
                        Some((keyed.key, surplus))
                    } else {
                        // Still in use: its queue may have lost waiters (granted or cancelled).
                        entry.get_mut().door.trim();
                        None
                    };
                    (Some(out), retired)
                }
                // Cannot happen: a hold or a ticket keeps its entry in the table (the module
                // docs). Doing nothing is the safe answer in a `Drop`.
                Err(_) => (None, None),
            }
        };
        wakes.wake();
        drop(retired);
        out
    }

    /// Pools an idle doorman, or hands it back to be dropped if the pool is full.
    fn retire(&self, pool: &mut Vec<Doorman>, mut door: Doorman) -> Option<Doorman> {
        if pool.len() >= self.pool_per_shard {
            return Some(door);
        }
        if door.queue.capacity() > POOLED_QUEUE_CAPACITY {
            door.queue.shrink_to(POOLED_QUEUE_CAPACITY);
        }
        pool.push(door);
        None
    }

    /// A guard's release, and a granted-but-unseen waiter's refund.
    fn release(&self, hold: Hold, mode: Mode) {
        self.update(hold, |door, wakes| {
            door.give_back(mode);
            door.grant(wakes);
        });
    }

    /// Turns a write hold into a read hold, granting the readers queued at the front.
    fn downgrade(&self, hold: Hold) {
        self.update(hold, |door, wakes| {
            door.writer = false;
            door.take(Mode::Read);
            door.grant(wakes);
        });
    }

    /// Whether waiter `ticket` has been granted; if not, (re-)registers `who` to be woken.
    fn granted(&self, hold: Hold, ticket: u64, who: Register<'_>) -> bool {
        let mut shard = lock(self.shard(hold.hash));
        let Some(entry) = shard.table.find_mut(hold.hash, |e| e.id == hold.id) else {
            // A queued or granted ticket keeps its entry in the table (rule 3); reaching this
            // would be a bug in this module, and guessing either answer could break exclusion.
            unreachable!("KeyLocks: a waiter's doorman left the table while it was referenced");
        };
        let (granted, replaced) = match entry.door.find(ticket) {
            Some(at) => (
                false,
                entry
                    .door
                    .queue
                    .get_mut(at)
                    .and_then(|waiter| waiter.wake.update(who)),
            ),
            None => (true, None),
        };
        drop(shard);
        // The replaced waker's drop, after unlocking (see `Wake::update`).
        drop(replaced);
        granted
    }

    /// A waiter's future was dropped (or its blocking call unwound) before it saw a grant.
    fn cancel(&self, hold: Hold, ticket: u64, mode: Mode) {
        self.update(hold, |door, wakes| {
            let removed = match door.find(ticket) {
                Some(at) => door.cancel(at),
                None => {
                    // Granted after our last look: give the hold back (the refund).
                    door.give_back(mode);
                    None
                }
            };
            door.grant(wakes);
            removed // its waker is dropped after unlocking
        });
    }
}

/// Shrinks a table that has become mostly empty, so that the map's memory follows the keys in use.
/// Amortised O(1): after shrinking to twice its length, a table must lose three quarters of its
/// keys again before the next shrink.
fn shrink<K>(table: &mut HashTable<Keyed<K>>) {
    let capacity = table.capacity();
    if capacity > 64 && table.len() * 8 < capacity {
        table.shrink_to(table.len() * 2, |e| e.hash);
    }
}

/// What a newcomer found when its request could not be admitted at once.
struct Busy<'s> {
    door: &'s mut Doorman,
    next: &'s mut u64,
    hold: Hold,
    mode: Mode,
    refused: TryLockError,
}

impl Busy<'_> {
    /// Joins the back of the queue; returns the waiter's ticket.
    fn enqueue(self, who: Register<'_>) -> (Hold, u64) {
        // The waker is cloned before anything changes.
        let wake = Wake::new(who);
        let ticket = *self.next;
        *self.next = self.next.wrapping_add(1);
        self.door.push(ticket, self.mode, wake);
        (self.hold, ticket)
    }
}

impl<K: Hash + Eq, S: BuildHasher> Inner<K, S> {
    /// Finds or creates `key`'s doorman and takes `mode` if rule 1 admits it; otherwise lets
    /// `busy` decide (fail, or queue), all under the shard's mutex.
    fn enter<Q, E>(&self, key: &Q, mode: Mode, busy: impl FnOnce(Busy<'_>) -> E) -> Result<Hold, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let mut guard = lock(self.shard(hash));
        let shard = &mut *guard;
        match shard
            .table
            .entry(hash, |e| e.key.borrow() == key, |e| e.hash)
        {
            Slot::Occupied(entry) => {
                let keyed = entry.into_mut();
                let hold = Hold { hash, id: keyed.id };
                match keyed.door.refuse(mode) {
                    None => {
                        keyed.door.take(mode);
                        Ok(hold)
                    }
                    Some(refused) => Err(busy(Busy {
                        door: &mut keyed.door,
                        next: &mut shard.next,
                        hold,
                        mode,
                        refused,
                    })),
                }
            }
            Slot::Vacant(vacant) => {
                // User code (`to_owned`) first, before anything changes.
                let key = key.to_owned();
                let mut door = shard.pool.pop().unwrap_or_default();
                door.take(mode);
                let id = shard.next;
                shard.next = id.wrapping_add(1);
                vacant.insert(Keyed {
                    hash,
                    id,
                    key,
                    door,
                });
                Ok(Hold { hash, id })
            }
        }
    }

    fn try_lock<Q>(&self, key: &Q, mode: Mode) -> Result<Hold, TryLockError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.enter(key, mode, |busy| busy.refused)
    }

    /// Waits on the calling thread until granted. `sleep(signal, seen)` blocks until woken (or
    /// spuriously), or gives up with `Err`: the ticket's drop then cancels the wait, or refunds a
    /// grant that came after the last look.
    fn lock_blocking<Q, E>(
        &self,
        key: &Q,
        mode: Mode,
        mut sleep: impl FnMut(&Signal, u32) -> Result<(), E>,
    ) -> Result<Hold, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (hold, number) = match self.enter(key, mode, |busy| busy.enqueue(Register::Nobody)) {
            Ok(hold) => return Ok(hold),
            Err(queued) => queued,
        };
        let mut ticket = Ticket::new(self, hold, number, mode);
        // Allocated only when the thread has to wait; registered by the first look below.
        let signal = Arc::new(Signal::new());
        loop {
            // The epoch is read before the look, so a grant after the look changes it and the
            // sleep returns at once.
            let seen = signal.epoch();
            if let Some(hold) = ticket.poll(Register::Thread(&signal)) {
                return Ok(hold);
            }
            sleep(&signal, seen)?;
        }
    }

    /// Blocks until granted.
    fn lock_blocking_forever<Q>(&self, key: &Q, mode: Mode) -> Hold
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let Ok(hold) = self.lock_blocking(key, mode, |signal, seen| {
            signal.wait(seen);
            Ok::<(), std::convert::Infallible>(())
        });
        hold
    }

    /// Blocks until granted or `timeout` passes.
    fn lock_blocking_timeout<Q>(&self, key: &Q, mode: Mode, timeout: Duration) -> Option<Hold>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // No deadline at all if `now + timeout` overflows `Instant`.
        let deadline = Instant::now().checked_add(timeout);
        self.lock_blocking(key, mode, |signal, seen| {
            let Some(deadline) = deadline else {
                signal.wait(seen);
                return Ok(());
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(());
            }
            signal.wait_timeout(seen, deadline - now);
            Ok(())
        })
        .ok()
    }

    /// Waiters queued for `key`.
    fn waiters<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = lock(self.shard(hash));
        shard
            .table
            .find(hash, |e| e.key.borrow() == key)
            .map_or(0, |e| e.door.waiting)
    }
}

/// A queued waiter's place. Dropping it before the grant is seen cancels the wait (or refunds a
/// grant that came in the meantime).
struct Ticket<'a, K, S> {
    locks: &'a Inner<K, S>,
    hold: Hold,
    number: u64,
    mode: Mode,
    live: bool,
}

impl<'a, K, S> Ticket<'a, K, S> {
    fn new(locks: &'a Inner<K, S>, hold: Hold, number: u64, mode: Mode) -> Self {
        Ticket {
            locks,
            hold,
            number,
            mode,
            live: true,
        }
    }

    /// The hold, if granted (the ticket is then spent); otherwise registers `who`.
    fn poll(&mut self, who: Register<'_>) -> Option<Hold> {
        if self.locks.granted(self.hold, self.number, who) {
            // From here the hold belongs to the guard the caller builds; nothing in between can
            // panic.
            self.live = false;
            Some(self.hold)
        } else {
            None
        }
    }
}

impl<K, S> Drop for Ticket<'_, K, S> {
    fn drop(&mut self) {
        if self.live {
            self.locks.cancel(self.hold, self.number, self.mode);
        }
    }
}

/// The future behind `read().await` and `write().await`: the first poll enters (and queues if it
/// must, registering the task's waker); later polls look at the ticket. Dropping it drops the
/// ticket, which cancels the wait or refunds a grant it has not seen.
struct Lock<'s, 'k, K, S, Q: ?Sized> {
    locks: &'s Inner<K, S>,
    key: &'k Q,
    mode: Mode,
    ticket: Option<Ticket<'s, K, S>>,
}

impl<'s, 'k, K, S, Q: ?Sized> Lock<'s, 'k, K, S, Q> {
    fn new(locks: &'s Inner<K, S>, key: &'k Q, mode: Mode) -> Self {
        Lock {
            locks,
            key,
            mode,
            ticket: None,
        }
    }
}

impl<K, S, Q> Future for Lock<'_, '_, K, S, Q>
where
    K: Hash + Eq + Borrow<Q>,
    S: BuildHasher,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    type Output = Hold;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Hold> {
        // `Lock` is `Unpin`: it holds only references and the ticket.
        let this = self.get_mut();
        if let Some(ticket) = &mut this.ticket {
            return match ticket.poll(Register::Task(cx.waker())) {
                Some(hold) => Poll::Ready(hold),
                None => Poll::Pending,
            };
        }
        let mode = this.mode;
        match this.locks.enter(this.key, mode, |busy| {
            busy.enqueue(Register::Task(cx.waker()))
        }) {
            Ok(hold) => Poll::Ready(hold),
            Err((hold, number)) => {
                this.ticket = Some(Ticket::new(this.locks, hold, number, mode));
                Poll::Pending
            }
        }
    }
}

/// Keyed reader/writer locks: many readers or one writer per key, for any number of keys, with
/// memory only for the keys in use.
///
/// `read(&key).await`, `write(&key).await`, [`try_read`](Self::try_read),
/// [`try_write`](Self::try_write), and blocking variants return guards that release on `Drop`.
/// Owned variants return `'static` guards for spawned tasks. Keys are looked up by any borrowed
/// form (`&str` for `String` keys).
///
/// - **Only keys in use take memory.** A key's lock state (its "doorman") is created on first use
///   and removed from the map when its last holder or waiter leaves; idle doormen are kept in a
///   bounded per-shard pool and reused, so a hot set of keys does not allocate.
/// - **Fair.** Waiters are served in arrival order; the readers at the front of the queue are
///   granted together. A reader arriving while a writer waits queues behind it, so a stream of
///   readers cannot starve a writer, and `try_*` never jumps the queue.
/// - **Cancel-safe.** Dropping a waiting future frees its place, hands on whatever it was granted
///   in the meantime, and never leaves a doorman referenced.
/// - **Hash-flooding resistant** by default: keys are hashed with std's randomly keyed SipHash
///   ([`RandomState`](std::collections::hash_map::RandomState)); another hasher can be chosen with [`KeyLocksBuilder::hasher`].
/// - Runtime-agnostic: no timer, no background task. Async and blocking callers share one queue.
/// - **Not re-entrant**, as tokio's `RwLock`: a task that holds a key's read lock and asks for
///   it again waits behind any writer queued in between, which waits for the first read lock:
///   a deadlock. Nor does a write lock upgrade; take the write lock from the start, or use
///   [`OwnedWriteGuard::downgrade`] to go the other way.
/// - **No poisoning**, as tokio's `RwLock`: a guard dropped by a panic in the code that held it
///   releases its key like any other drop, and the next holder is not told. If a panic can leave
///   what the key protects half-updated, catch it and repair the state before the guard goes.
///
/// Clones share the locks.
///
/// # Examples
///
/// ```
/// use turnstile::KeyLocks;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let locks: KeyLocks<String> = KeyLocks::new();
/// {
///     let _a = locks.read("account:7").await;
///     let _b = locks.read("account:7").await; // readers share
///     assert!(locks.try_write("account:7").is_err());
///     let _other = locks.write("account:8").await; // other keys are independent
///     assert_eq!(locks.len(), 2);
/// }
/// assert_eq!(locks.len(), 0); // the map holds only keys in use
/// # }
/// ```
pub struct KeyLocks<K, S = crate::sync::RandomSipHasher> {
    inner: Arc<Inner<K, S>>,
}

impl<K, S> Clone for KeyLocks<K, S> {
    fn clone(&self) -> Self {
        KeyLocks {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, S> fmt::Debug for KeyLocks<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyLocks")
            .field("shards", &self.shards())
            .field("pool_per_shard", &self.pool_per_shard())
            .field("len", &self.len())
            .field("pooled", &self.pooled())
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq> Default for KeyLocks<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq> KeyLocks<K> {
    /// Keyed locks with the default shard count, [`DEFAULT_POOL_PER_SHARD`] and std's
    /// [`RandomState`](std::collections::hash_map::RandomState) hasher.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks = KeyLocks::<u64>::new();
    /// assert!(locks.shards().is_power_of_two());
    /// assert!(locks.is_empty());
    /// ```
    pub fn new() -> Self {
        assemble(
            crate::sync::RandomSipHasher::default(),
            default_shards(),
            DEFAULT_POOL_PER_SHARD,
        )
    }
}

impl<K> KeyLocks<K> {
    /// A builder for the shard count, the pool bound and the hasher.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<String> = KeyLocks::builder().shards(8).pool_per_shard(4).build()?;
    /// assert_eq!(locks.shards(), 8);
    /// assert_eq!(locks.pool_per_shard(), 4);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn builder() -> KeyLocksBuilder<K> {
        KeyLocksBuilder::new()
    }
}

fn default_shards() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores.saturating_mul(2)).clamp(4, 1024).next_power_of_two()
}

impl<K, S> KeyLocks<K, S> {
    /// Keys in use now: keys with a holder or a waiter (a snapshot, summed over the shards).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks = KeyLocks::new();
    /// let a = locks.try_write(&1u32)?;
    /// let b = locks.try_read(&2u32)?;
    /// assert_eq!(locks.len(), 2);
    /// drop((a, b));
    /// assert_eq!(locks.len(), 0);
    /// # Ok::<(), turnstile::TryLockError>(())
    /// ```
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| lock(shard).table.len())
            .sum()
    }

    /// Whether no key is in use (a snapshot).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks = KeyLocks::new();
    /// assert!(locks.is_empty());
    /// let guard = locks.try_read("k")?;
    /// assert!(!locks.is_empty());
    /// # drop(guard);
    /// # Ok::<(), turnstile::TryLockError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.inner
            .shards
            .iter()
            .all(|shard| lock(shard).table.is_empty())
    }

    /// Idle doormen kept for reuse, over all shards; never more than
    /// [`shards`](Self::shards) × [`pool_per_shard`](Self::pool_per_shard).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<u32> = KeyLocks::builder().shards(1).pool_per_shard(2).build()?;
    /// let guards: Vec<_> = (0..5).map(|k| locks.try_write(&k).unwrap()).collect();
    /// assert_eq!(locks.pooled(), 0);
    /// drop(guards);
    /// assert_eq!(locks.pooled(), 2); // the other three were freed
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn pooled(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| lock(shard).pool.len())
            .sum()
    }

    /// The number of shards (a power of two).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<u64> = KeyLocks::builder().shards(5).build()?;
    /// assert_eq!(locks.shards(), 8); // rounded up
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn shards(&self) -> usize {
        self.inner.shards.len()
    }

    /// The most idle doormen one shard keeps.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<u64> = KeyLocks::builder().pool_per_shard(0).build()?;
    /// assert_eq!(locks.pool_per_shard(), 0); // no pooling
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn pool_per_shard(&self) -> usize {
        self.inner.pool_per_shard
    }
}

impl<K, S> KeyLocks<K, S>
where
    K: Hash + Eq,
    S: BuildHasher,
{
    /// Waits for a read lock on `key`: shared with other readers, exclusive of writers.
    ///
    /// Granted at the first poll if no writer holds the key and nobody is queued for it;
    /// otherwise the caller queues in arrival order and is woken when a release grants it. Needs
    /// no runtime features (no timer); wrap it in `tokio::time::timeout` for a time limit.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future frees its place in the queue; if it had been granted the
    /// lock without yet returning it, the lock is released and passed on. Nothing stays
    /// referenced.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let locks: KeyLocks<String> = KeyLocks::new();
    /// let a = locks.read("report").await;
    /// let b = locks.read("report").await;
    /// assert!(locks.try_write("report").is_err());
    /// drop((a, b));
    /// assert!(locks.try_write("report").is_ok());
    /// # }
    /// ```
    pub async fn read<Q>(&self, key: &Q) -> ReadGuard<'_, K, S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = Lock::new(&self.inner, key, Mode::Read).await;
        ReadGuard {
            held: Held::new(&self.inner, hold, Mode::Read),
        }
    }

    /// Waits for the write lock on `key`: exclusive of readers and other writers.
    ///
    /// Granted at the first poll if nobody holds or waits for the key; otherwise the caller queues
    /// in arrival order. Readers that arrive after it queue behind it.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future frees its place in the queue (readers queued behind it
    /// are granted if they now can); if it had been granted the lock without yet returning it, the
    /// lock is released and passed on. Nothing stays referenced.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let locks = KeyLocks::new();
    /// let writing = locks.write(&42u64).await;
    /// let waiter = {
    ///     let locks = locks.clone();
    ///     tokio::spawn(async move { locks.read_owned(&42u64).await })
    /// };
    /// tokio::task::yield_now().await; // the reader queues
    /// assert_eq!(locks.waiters(&42u64), 1);
    /// drop(writing); // grants the reader
    /// let reading = waiter.await.unwrap();
    /// # drop(reading);
    /// # }
    /// ```
    pub async fn write<Q>(&self, key: &Q) -> WriteGuard<'_, K, S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = Lock::new(&self.inner, key, Mode::Write).await;
        WriteGuard {
            held: Held::new(&self.inner, hold, Mode::Write),
        }
    }

    /// Takes a read lock on `key` if no writer holds it and nobody is queued for it. Never waits.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WriteLocked`], or [`TryLockError::WriterQueued`] (readers hold the key but
    /// a writer waits: a new reader does not overtake it).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{KeyLocks, TryLockError};
    ///
    /// let locks = KeyLocks::new();
    /// let a = locks.try_read("k")?;
    /// let b = locks.try_read("k")?; // readers share
    /// let w = locks.try_write("k");
    /// assert!(matches!(w, Err(TryLockError::ReadLocked { readers: 2 })));
    /// # drop((a, b));
    /// # Ok::<(), TryLockError>(())
    /// ```
    pub fn try_read<Q>(&self, key: &Q) -> Result<ReadGuard<'_, K, S>, TryLockError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = self.inner.try_lock(key, Mode::Read)?;
        Ok(ReadGuard {
            held: Held::new(&self.inner, hold, Mode::Read),
        })
    }

    /// Takes the write lock on `key` if nobody holds it or waits for it. Never waits.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WriteLocked`] or [`TryLockError::ReadLocked`].
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{KeyLocks, TryLockError};
    ///
    /// let locks = KeyLocks::new();
    /// let w = locks.try_write("k")?;
    /// assert_eq!(locks.try_write("k").unwrap_err(), TryLockError::WriteLocked);
    /// assert!(locks.try_write("other").is_ok());
    /// # drop(w);
    /// # Ok::<(), TryLockError>(())
    /// ```
    pub fn try_write<Q>(&self, key: &Q) -> Result<WriteGuard<'_, K, S>, TryLockError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = self.inner.try_lock(key, Mode::Write)?;
        Ok(WriteGuard {
            held: Held::new(&self.inner, hold, Mode::Write),
        })
    }

    /// Blocks the calling thread until it holds a read lock on `key`, in the same queue as the
    /// async waiters. The thread sleeps on a futex (atomic-wait) until a release grants it.
    ///
    /// Do not call it from an async task: it blocks the executor's thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<String> = KeyLocks::new();
    /// let writing = locks.write_blocking("k");
    /// std::thread::scope(|s| {
    ///     let reader = s.spawn(|| {
    ///         let _r = locks.read_blocking("k"); // waits for the writer
    ///     });
    ///     while locks.waiters("k") == 0 {
    ///         std::thread::yield_now();
    ///     }
    ///     drop(writing);
    ///     reader.join().unwrap();
    /// });
    /// assert!(locks.is_empty());
    /// ```
    pub fn read_blocking<Q>(&self, key: &Q) -> ReadGuard<'_, K, S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = self.inner.lock_blocking_forever(key, Mode::Read);
        ReadGuard {
            held: Held::new(&self.inner, hold, Mode::Read),
        }
    }

    /// Blocks the calling thread until it holds the write lock on `key`, in the same queue as the
    /// async waiters.
    ///
    /// Do not call it from an async task: it blocks the executor's thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use turnstile::KeyLocks;
    ///
    /// let locks = KeyLocks::new();
    /// let inside = AtomicU32::new(0);
    /// std::thread::scope(|s| {
    ///     for _ in 0..4 {
    ///         s.spawn(|| {
    ///             for _ in 0..100 {
    ///                 let _w = locks.write_blocking(&"counter");
    ///                 assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
    ///                 inside.fetch_sub(1, Ordering::SeqCst);
    ///             }
    ///         });
    ///     }
    /// });
    /// assert!(locks.is_empty());
    /// ```
    pub fn write_blocking<Q>(&self, key: &Q) -> WriteGuard<'_, K, S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = self.inner.lock_blocking_forever(key, Mode::Write);
        WriteGuard {
            held: Held::new(&self.inner, hold, Mode::Write),
        }
    }

    /// [`read_blocking`](Self::read_blocking) with a time limit: `None` if the read lock was not
    /// granted within `timeout`. Giving up frees the caller's place in the queue (and passes on a
    /// grant that arrived at the last moment), exactly as a dropped future does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<String> = KeyLocks::new();
    /// let writing = locks.try_write("k")?;
    /// assert!(locks.read_blocking_timeout("k", Duration::from_millis(5)).is_none());
    /// assert_eq!(locks.waiters("k"), 0); // the timed-out reader left the queue
    /// drop(writing);
    /// assert!(locks.read_blocking_timeout("k", Duration::ZERO).is_some());
    /// # Ok::<(), turnstile::TryLockError>(())
    /// ```
    pub fn read_blocking_timeout<Q>(
        &self,
        key: &Q,
        timeout: Duration,
    ) -> Option<ReadGuard<'_, K, S>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = self.inner.lock_blocking_timeout(key, Mode::Read, timeout)?;
        Some(ReadGuard {
            held: Held::new(&self.inner, hold, Mode::Read),
        })
    }

    /// [`write_blocking`](Self::write_blocking) with a time limit: `None` if the write lock was
    /// not granted within `timeout`; the caller's place in the queue is freed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<String> = KeyLocks::new();
    /// let reading = locks.try_read("k")?;
    /// assert!(locks.write_blocking_timeout("k", Duration::from_millis(5)).is_none());
    /// drop(reading);
    /// assert!(locks.write_blocking_timeout("k", Duration::from_secs(1)).is_some());
    /// assert!(locks.is_empty());
    /// # Ok::<(), turnstile::TryLockError>(())
    /// ```
    pub fn write_blocking_timeout<Q>(
        &self,
        key: &Q,
        timeout: Duration,
    ) -> Option<WriteGuard<'_, K, S>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = self
            .inner
            .lock_blocking_timeout(key, Mode::Write, timeout)?;
        Some(WriteGuard {
            held: Held::new(&self.inner, hold, Mode::Write),
        })
    }

    /// [`read`](Self::read) returning a `'static` guard (it keeps the locks alive), for guards
    /// that move into spawned tasks or outlive the borrow of `self`.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`read`](Self::read).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let locks: KeyLocks<String> = KeyLocks::new();
    /// let guard = locks.read_owned("k").await;
    /// let task = tokio::spawn(async move { drop(guard) });
    /// task.await.unwrap();
    /// assert!(locks.is_empty());
    /// # }
    /// ```
    pub async fn read_owned<Q>(&self, key: &Q) -> OwnedReadGuard<K, S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = Lock::new(&self.inner, key, Mode::Read).await;
        OwnedReadGuard {
            held: OwnedHeld::new(self.clone(), hold, Mode::Read),
        }
    }

    /// [`write`](Self::write) returning a `'static` guard.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe, as [`write`](Self::write).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let locks = KeyLocks::new();
    /// let guard = locks.write_owned(&7u8).await;
    /// assert!(locks.try_read(&7u8).is_err());
    /// tokio::spawn(async move { drop(guard) }).await.unwrap();
    /// assert!(locks.try_read(&7u8).is_ok());
    /// # }
    /// ```
    pub async fn write_owned<Q>(&self, key: &Q) -> OwnedWriteGuard<K, S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = Lock::new(&self.inner, key, Mode::Write).await;
        OwnedWriteGuard {
            held: OwnedHeld::new(self.clone(), hold, Mode::Write),
        }
    }

    /// [`try_read`](Self::try_read) returning a `'static` guard.
    ///
    /// # Errors
    ///
    /// As [`try_read`](Self::try_read).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<String> = KeyLocks::new();
    /// let guard = locks.try_read_owned("k")?;
    /// std::thread::spawn(move || drop(guard)).join().unwrap();
    /// assert!(locks.is_empty());
    /// # Ok::<(), turnstile::TryLockError>(())
    /// ```
    pub fn try_read_owned<Q>(&self, key: &Q) -> Result<OwnedReadGuard<K, S>, TryLockError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = self.inner.try_lock(key, Mode::Read)?;
        Ok(OwnedReadGuard {
            held: OwnedHeld::new(self.clone(), hold, Mode::Read),
        })
    }

    /// [`try_write`](Self::try_write) returning a `'static` guard.
    ///
    /// # Errors
    ///
    /// As [`try_write`](Self::try_write).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<String> = KeyLocks::new();
    /// let guard = locks.try_write_owned("k")?;
    /// assert!(locks.try_read("k").is_err());
    /// std::thread::spawn(move || drop(guard)).join().unwrap();
    /// assert!(locks.try_read("k").is_ok());
    /// # Ok::<(), turnstile::TryLockError>(())
    /// ```
    pub fn try_write_owned<Q>(&self, key: &Q) -> Result<OwnedWriteGuard<K, S>, TryLockError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hold = self.inner.try_lock(key, Mode::Write)?;
        Ok(OwnedWriteGuard {
            held: OwnedHeld::new(self.clone(), hold, Mode::Write),
        })
    }

    /// How many waiters are queued for `key` now (a snapshot; 0 for a key not in use).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<String> = KeyLocks::new();
    /// assert_eq!(locks.waiters("k"), 0);
    /// let _held = locks.try_write("k")?;
    /// assert_eq!(locks.waiters("k"), 0); // held, but nobody waits
    /// # Ok::<(), turnstile::TryLockError>(())
    /// ```
    pub fn waiters<Q>(&self, key: &Q) -> usize
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.waiters(key)
    }
}

/// A held lock; releases it on drop.
struct Held<'a, K, S> {
    locks: &'a Inner<K, S>,
    hold: Hold,
    mode: Mode,
}

impl<'a, K, S> Held<'a, K, S> {
    fn new(locks: &'a Inner<K, S>, hold: Hold, mode: Mode) -> Self {
        Held { locks, hold, mode }
    }
}

impl<K, S> Drop for Held<'_, K, S> {
    fn drop(&mut self) {
        self.locks.release(self.hold, self.mode);
    }
}

/// A held lock that keeps its [`KeyLocks`] alive; releases it on drop.
struct OwnedHeld<K, S> {
    locks: KeyLocks<K, S>,
    hold: Hold,
    mode: Mode,
}

impl<K, S> OwnedHeld<K, S> {
    fn new(locks: KeyLocks<K, S>, hold: Hold, mode: Mode) -> Self {
        OwnedHeld { locks, hold, mode }
    }
}

impl<K, S> Drop for OwnedHeld<K, S> {
    fn drop(&mut self) {
        self.locks.inner.release(self.hold, self.mode);
    }
}

/// A read lock on one key of a [`KeyLocks`]; released on drop.
///
/// # Examples
///
/// ```
/// use turnstile::KeyLocks;
///
/// let locks: KeyLocks<String> = KeyLocks::new();
/// let guard = locks.try_read("k")?;
/// assert!(locks.try_write("k").is_err());
/// drop(guard);
/// assert!(locks.try_write("k").is_ok());
/// # Ok::<(), turnstile::TryLockError>(())
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct ReadGuard<'a, K, S = crate::sync::RandomSipHasher> {
    #[expect(dead_code, reason = "held for its Drop, which releases the lock")]
    held: Held<'a, K, S>,
}

/// The write lock on one key of a [`KeyLocks`]; released on drop.
///
/// # Examples
///
/// ```
/// use turnstile::KeyLocks;
///
/// let locks: KeyLocks<String> = KeyLocks::new();
/// let guard = locks.try_write("k")?;
/// assert!(locks.try_read("k").is_err());
/// drop(guard);
/// assert!(locks.try_read("k").is_ok());
/// # Ok::<(), turnstile::TryLockError>(())
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct WriteGuard<'a, K, S = crate::sync::RandomSipHasher> {
    held: Held<'a, K, S>,
}

/// A `'static` read lock that keeps its [`KeyLocks`] alive; released on drop.
///
/// # Examples
///
/// ```
/// use turnstile::{KeyLocks, OwnedReadGuard};
///
/// let locks: KeyLocks<String> = KeyLocks::new();
/// let guard: OwnedReadGuard<String> = locks.try_read_owned("k")?;
/// drop(locks); // the guard keeps the locks alive
/// drop(guard);
/// # Ok::<(), turnstile::TryLockError>(())
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct OwnedReadGuard<K, S = crate::sync::RandomSipHasher> {
    #[expect(dead_code, reason = "held for its Drop, which releases the lock")]
    held: OwnedHeld<K, S>,
}

/// A `'static` write lock that keeps its [`KeyLocks`] alive; released on drop.
///
/// # Examples
///
/// ```
/// use turnstile::{KeyLocks, OwnedWriteGuard};
///
/// let locks: KeyLocks<String> = KeyLocks::new();
/// let guard: OwnedWriteGuard<String> = locks.try_write_owned("k")?;
/// let handle = std::thread::spawn(move || drop(guard));
/// handle.join().unwrap();
/// assert!(locks.is_empty());
/// # Ok::<(), turnstile::TryLockError>(())
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct OwnedWriteGuard<K, S = crate::sync::RandomSipHasher> {
    held: OwnedHeld<K, S>,
}

impl<'a, K, S> WriteGuard<'a, K, S> {
    /// Turns the write lock into a read lock without letting a writer in between. Readers queued
    /// at the front (up to the next queued writer) are granted at the same time.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<String> = KeyLocks::new();
    /// let writing = locks.try_write("k")?;
    /// let reading = writing.downgrade();
    /// let other = locks.try_read("k")?; // shared now
    /// assert!(locks.try_write("k").is_err());
    /// # drop((reading, other));
    /// # Ok::<(), turnstile::TryLockError>(())
    /// ```
    pub fn downgrade(mut self) -> ReadGuard<'a, K, S> {
        // The mode first: `downgrade` wakes the readers it grants, and if a waker panics, the
        // unwind drops this guard, which must then give back the read hold it now is.
        self.held.mode = Mode::Read;
        self.held.locks.downgrade(self.held.hold);
        ReadGuard { held: self.held }
    }
}

impl<K, S> OwnedWriteGuard<K, S> {
    /// Turns the write lock into a read lock without letting a writer in between; see
    /// [`WriteGuard::downgrade`].
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<String> = KeyLocks::new();
    /// let reading = locks.try_write_owned("k")?.downgrade();
    /// assert!(locks.try_read("k").is_ok());
    /// assert!(locks.try_write("k").is_err());
    /// # drop(reading);
    /// # Ok::<(), turnstile::TryLockError>(())
    /// ```
    pub fn downgrade(mut self) -> OwnedReadGuard<K, S> {
        // The mode first: `downgrade` wakes the readers it grants, and if a waker panics, the
        // unwind drops this guard, which must then give back the read hold it now is.
        self.held.mode = Mode::Read;
        self.held.locks.inner.downgrade(self.held.hold);
        OwnedReadGuard { held: self.held }
    }
}

impl<K, S> fmt::Debug for ReadGuard<'_, K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadGuard").finish_non_exhaustive()
    }
}

impl<K, S> fmt::Debug for WriteGuard<'_, K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteGuard").finish_non_exhaustive()
    }
}

impl<K, S> fmt::Debug for OwnedReadGuard<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedReadGuard").finish_non_exhaustive()
    }
}

impl<K, S> fmt::Debug for OwnedWriteGuard<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedWriteGuard").finish_non_exhaustive()
    }
}

/// Settings for a [`KeyLocks`]: shard count, pool bound, hasher.
///
/// # Examples
///
/// ```
/// use std::hash::BuildHasherDefault;
/// use std::collections::hash_map::DefaultHasher;
/// use turnstile::KeyLocks;
///
/// let locks: KeyLocks<u64, BuildHasherDefault<DefaultHasher>> = KeyLocks::builder()
///     .shards(16)
///     .pool_per_shard(8)
///     .hasher(BuildHasherDefault::default())
///     .build()?;
/// assert_eq!(locks.shards(), 16);
/// # Ok::<(), turnstile::ConfigError>(())
/// ```
pub struct KeyLocksBuilder<K, S = crate::sync::RandomSipHasher> {
    shards: Option<usize>,
    pool_per_shard: usize,
    hasher: S,
    keys: PhantomData<fn() -> K>,
}

impl<K, S> fmt::Debug for KeyLocksBuilder<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyLocksBuilder")
            .field("shards", &self.shards)
            .field("pool_per_shard", &self.pool_per_shard)
            .finish_non_exhaustive()
    }
}

impl<K> KeyLocksBuilder<K> {
    fn new() -> Self {
        KeyLocksBuilder {
            shards: None,
            pool_per_shard: DEFAULT_POOL_PER_SHARD,
            hasher: crate::sync::RandomSipHasher::default(),
            keys: PhantomData,
        }
    }
}

impl<K, S> KeyLocksBuilder<K, S> {
    /// The number of shards (independent mutexes), rounded up to a power of two. Default: the
    /// smallest power of two ≥ 2 × [`std::thread::available_parallelism`], at least 4 and at
    /// most 1,024 (more can be asked for here, up to 65,536).
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConfigError, KeyLocks};
    ///
    /// let locks: KeyLocks<u64> = KeyLocks::builder().shards(3).build()?;
    /// assert_eq!(locks.shards(), 4);
    /// assert!(KeyLocks::<u64>::builder().shards(0).build().is_err());
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// How many idle doormen each shard keeps for reuse (0: none). Default
    /// [`DEFAULT_POOL_PER_SHARD`].
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<u64> = KeyLocks::builder().pool_per_shard(1).build()?;
    /// assert_eq!(locks.pool_per_shard(), 1);
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn pool_per_shard(mut self, doormen: usize) -> Self {
        self.pool_per_shard = doormen;
        self
    }

    /// The hasher for keys; one instance is shared by every lookup. Keep a randomly keyed one
    /// (the default, std's [`RandomState`](std::collections::hash_map::RandomState)) if keys can be chosen by an attacker: with a fixed
    /// hash function, keys chosen to collide make every lookup in their shard linear.
    ///
    /// The hash must spread over all 64 bits: the shard is chosen by bits 32 and up (the low bits
    /// pick the slot within the shard's table, the top 7 its control byte). An identity "hash"
    /// of integer keys below 2³² (`nohash-hasher`, a `u32` written as is) puts every key in the
    /// first shard, behind one mutex.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::hash_map::RandomState;
    /// use turnstile::KeyLocks;
    ///
    /// let locks: KeyLocks<&str> = KeyLocks::builder().hasher(RandomState::new()).build()?;
    /// assert!(locks.try_write(&"k").is_ok());
    /// # Ok::<(), turnstile::ConfigError>(())
    /// ```
    pub fn hasher<S2>(self, hasher: S2) -> KeyLocksBuilder<K, S2> {
        KeyLocksBuilder {
            shards: self.shards,
            pool_per_shard: self.pool_per_shard,
            hasher,
            keys: PhantomData,
        }
    }

    /// Builds the locks.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] for zero shards, [`ConfigError::TooLarge`] for more than 65,536.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::{ConfigError, KeyLocks};
    ///
    /// let err = KeyLocks::<u64>::builder().shards(1 << 20).build().unwrap_err();
    /// assert_eq!(err, ConfigError::TooLarge { what: "shards", max: "65536" });
    /// ```
    pub fn build(self) -> Result<KeyLocks<K, S>, ConfigError> {
        let shards = match self.shards {
            None => default_shards(),
            Some(0) => return Err(ConfigError::Zero { what: "shards" }),
            Some(n) if n > MAX_SHARDS => {
                return Err(ConfigError::TooLarge {
                    what: "shards",
                    max: "65536",
                });
            }
            Some(n) => n.next_power_of_two(),
        };
        Ok(assemble(self.hasher, shards, self.pool_per_shard))
    }
}

/// Only for `shards` a power of two in 1..=[`MAX_SHARDS`].
fn assemble<K, S>(hasher: S, shards: usize, pool_per_shard: usize) -> KeyLocks<K, S> {
    let shards: Box<[_]> = (0..shards)
        .map(|_| {
            CachePadded::new(Mutex::new(Shard {
                table: HashTable::new(),
                pool: Vec::new(),
                next: 0,
            }))
        })
        .collect();
    KeyLocks {
        inner: Arc::new(Inner {
            mask: shards.len() as u64 - 1,
            shards,
            pool_per_shard,
            hasher,
        }),
    }
}
