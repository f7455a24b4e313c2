//! Chain callers sleeping on a limiter, woken when the limiter changes in a way that can end
//! their wait early or for good: it is closed, reconfigured, a key is reset, another chain call
//! gives it permits back, a waiter of its own queue gives up (its future dropped, a timeout: it
//! held chain calls back, oldest first, for the time its permits and theirs need), or a keyed
//! limiter's `sweep` (or `run_sweeper`) evicts idle keys (room under its key cap for a key that
//! was decided on the shared overflow cell; only a sweep that evicts tells, so the many that
//! evict nothing cost nothing here).
//!
//! A [`Chain`](crate::Chain) or `KeyedChain` that must wait does not join
//! its members' own queues (it needs every member at once, and would hold a place in each). It
//! sleeps for the largest `retry_after` and tries again. Without these watchers, a member closed
//! during that sleep was noticed only when it ended, which for a rule of an hour is an hour, and a
//! raised limit admitted nobody waiting before then either.
//!
//! Protocol, per limiter:
//!
//! - **Changer** ([`Watchers::changed`]): makes its change visible first (the closed bit, the new
//!   parameters, an evicted key's slot given back), then, under the mutex, bumps `epoch` and
//!   takes a copy of every registered watcher, which it notifies after unlocking.
//! - **Chain caller**: reads [`Watchers::epoch`] of every member *before* its first attempt.
//!   When the attempt fails it registers with every member ([`Watchers::watch`], under each
//!   mutex) and then reads the epochs again, under the same mutexes: if any moved, a change
//!   landed between its read and its registration, perhaps unseen by its attempt, and it tries
//!   again as if notified. Either way every later change notifies it. It stays
//!   registered until the call ends (a drop guard unregisters it, so a cancelled call leaves
//!   nothing behind), and a notification that arrives while it is not sleeping is kept (a
//!   `Notify` permit, or the signal's epoch), so it cannot be lost between two attempts. It
//!   sleeps 1 ms (`MIN_BACKOFF`) after every attempt before it heeds one, so that members that
//!   change all the time (two callers whose refunds wake each other, a stream of resets) make
//!   it poll gently rather than loop.
//! - **Its own refunds**: an attempt whose commit failed after its check passed gives back what
//!   the members before the failing one took, and a refund is a change. The caller is not told
//!   of its own (`except` in [`Watchers::changed`]), and at its registration it expects the sum
//!   to have moved by exactly its own bumps (one per refunded member, counted once per listing
//!   of that limiter). Otherwise an attempt that keeps refunding (a member at its key cap whose
//!   search for room cannot evict, or a race lost every time) woke its own caller, or failed
//!   its registration, every time: the caller looped without ever sleeping (a task without
//!   ever yielding) and a blocked caller past its deadline.
//!
//! The mutex orders every registration against every bump: a bump before the registration is
//! seen by the second read, one after it finds the watcher. `loom-tests/loom_chain.rs`
//! (`close_during_a_chain_wait_is_never_missed`; with the caller's own refunds expected at its
//! registration, `a_chain_callers_own_refunds_neither_wake_it_nor_hide_a_change`; a real keyed
//! limiter's sweep against a caller rejected on its overflow cell,
//! `a_sweep_freeing_room_at_the_key_cap_during_a_chain_wait_is_never_missed`) checks this. Only
//! chain callers that wait, and changers, touch the mutex; `try_acquire` and the first read (one
//! atomic load per member) do not.

#[cfg(turnstile_loom)]
use crate::sync::Signal;
use crate::sync::{Arc, AtomicU64, Mutex, Ordering, lock, wake_all};
use std::collections::BTreeMap;

/// Who waits: a task (its `Notify` keeps a permit if notified while it is not sleeping) or a
/// blocked thread (its [`Signal`](crate::sync::Signal) epoch moves).
#[derive(Clone)]
pub(crate) enum Watcher {
    #[cfg(feature = "tokio")]
    Task(std::sync::Arc<tokio::sync::Notify>),
    Thread(Arc<crate::sync::Signal>),
}

impl Watcher {
    /// Whether `other` is this very watcher (a clone of it).
    fn is(&self, other: &Watcher) -> bool {
        match (self, other) {
            #[cfg(feature = "tokio")]
            (Watcher::Task(a), Watcher::Task(b)) => std::sync::Arc::ptr_eq(a, b),
            (Watcher::Thread(a), Watcher::Thread(b)) => Arc::ptr_eq(a, b),
            #[cfg(feature = "tokio")]
            _ => false,
        }
    }

    fn notify(self) {
        match self {
            #[cfg(feature = "tokio")]
            Watcher::Task(notify) => notify.notify_one(),
            Watcher::Thread(signal) => signal.notify(),
        }
    }
}

#[derive(Default)]
struct List {
    next: u64,
    who: BTreeMap<u64, Watcher>,
}

/// The watchers of one limiter. See the module docs.
#[derive(Default)]
#[doc(hidden)]
// Public only for the loom model, which reaches it through a re-export under `turnstile_loom`.
#[cfg_attr(not(turnstile_loom), allow(unreachable_pub))]
pub struct Watchers {
    /// Bumped under `list`'s mutex by every change. Read without it before a first attempt.
    epoch: AtomicU64,
    list: Mutex<List>,
}

impl std::fmt::Debug for Watchers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchers")
            .field("epoch", &self.epoch.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Watchers {
    /// The change count, to read before the attempt that a registration follows.
    pub(crate) fn epoch(&self) -> u64 {
        // Acquire: pairs with the Release in `changed`. A caller that reads a bump also sees the
        // change made before it (the closed bit, the parameters), so the attempt that follows
        // decides under it; a caller that reads the epoch before the bump is caught by the
        // second read under the mutex (`watch`).
        self.epoch.load(Ordering::Acquire)
    }

    /// Registers `who`; returns its id and the epoch now (read under the mutex, so a bump that
    /// this registration missed shows as a moved epoch).
    pub(crate) fn watch(&self, who: Watcher) -> (u64, u64) {
        let mut list = lock(&self.list);
        let id = list.next;
        list.next += 1;
        list.who.insert(id, who);
        // Relaxed: the epoch is written only under this mutex, which orders this read.
        (id, self.epoch.load(Ordering::Relaxed))
    }

    /// Removes the registration `id`.
    pub(crate) fn unwatch(&self, id: u64) {
        let removed = lock(&self.list).who.remove(&id);
        // Dropped after unlocking: the last reference to a task's `Notify` runs no user code,
        // but a dropped `Signal` is kept out of the critical section all the same.
        drop(removed);
    }

    /// The limiter changed (call after the change is visible): every watcher is notified but
    /// `except`, a chain caller whose own refund is the change (it knows what it gave back;
    /// told of it, it would try again at once, perhaps refund again, and never sleep). The
    /// epoch moves all the same.
    pub(crate) fn changed(&self, except: Option<&Watcher>) {
        let who: Vec<Watcher> = {
            let list = lock(&self.list);
            // Release: pairs with the Acquire in `epoch`, so a reader of this bump sees the
            // change. The mutex orders it against `watch`.
            self.epoch.fetch_add(1, Ordering::Release);
            (list.who.values())
                .filter(|who| except.is_none_or(|except| !who.is(except)))
                .cloned()
                .collect()
        };
        // After unlocking: a notified task's waker may run code that comes back here.
        wake_all(who, Watcher::notify);
    }

    /// [`changed`](Self::changed), for the loom model.
    #[cfg(turnstile_loom)]
    pub fn changed_for_model(&self) {
        self.changed(None);
    }

    /// [`changed`](Self::changed) when the guard is dropped: at the end of the caller's scope,
    /// or while it unwinds from a panicking waker of its own wake-ups (a limiter's queue), so
    /// that the watchers are told either way.
    pub(crate) fn notify_on_drop(&self) -> NotifyOnDrop<'_> {
        self.notify_on_drop_except(None)
    }

    /// [`changed`](Self::changed) if the wait the guard covers is given up: held by a waiter of
    /// the limiter's own queue, which may leave it without permits (its future dropped, a
    /// timeout). A chain caller that the limiter refused because that waiter was queued (oldest
    /// first, no barging) sleeps until the time the waiter's permits and its own need; once the
    /// waiter is gone, it may fit at once, and without this it slept on with the permits free.
    /// A wait that ends otherwise tells nobody here ([`ended`](GaveUp::ended)): served, it took
    /// permits; failed by a close or a reconfiguration, that change told the watchers; refused
    /// at once (a full queue), it held nobody back, and a storm of such refusals must not take
    /// the watchers' mutex each.
    pub(crate) fn notify_if_given_up(&self) -> GaveUp<'_> {
        GaveUp(Some(self))
    }

    /// [`notify_on_drop`](Self::notify_on_drop), telling every watcher but `except`.
    pub(crate) fn notify_on_drop_except<'a>(
        &'a self,
        except: Option<&'a Watcher>,
    ) -> NotifyOnDrop<'a> {
        NotifyOnDrop(self, except)
    }
}

/// Sleeps for `wait` ([`crate::timer`]), or less if `notified` completes first.
#[cfg(feature = "tokio")]
pub(crate) async fn sleep_unless(
    wait: std::time::Duration,
    mut notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
) {
    use std::future::Future;
    let mut sleep = crate::timer::Sleep::new(wait);
    std::future::poll_fn(|cx| {
        if notified.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(());
        }
        std::pin::Pin::new(&mut sleep).poll(cx)
    })
    .await;
}

/// See [`Watchers::notify_if_given_up`]. Declared before the wait it covers, so that it is
/// dropped after it: the watchers are told once the waiter has left the queue.
#[must_use = "the watchers are told when this is dropped"]
pub(crate) struct GaveUp<'a>(Option<&'a Watchers>);

impl GaveUp<'_> {
    /// The wait ended with `outcome`: the watchers are told if it timed out, and not otherwise
    /// (dropped without this, the wait was given up: they are told).
    pub(crate) fn ended<T>(mut self, outcome: &Result<T, crate::error::AcquireError>) {
        if !matches!(outcome, Err(crate::error::AcquireError::Timeout)) {
            self.0 = None;
        }
    }
}

impl Drop for GaveUp<'_> {
    fn drop(&mut self) {
        if let Some(watchers) = self.0 {
            watchers.changed(None);
        }
    }
}

/// See [`Watchers::notify_on_drop`].
#[must_use = "the watchers are told when this is dropped"]
pub(crate) struct NotifyOnDrop<'a>(&'a Watchers, Option<&'a Watcher>);

impl Drop for NotifyOnDrop<'_> {
    fn drop(&mut self) {
        self.0.changed(self.1);
    }
}

/// The watchers of a model, for `loom-tests/loom_chain.rs` only: one waiter registered with a
/// [`Signal`] against one changer.
#[cfg(turnstile_loom)]
#[doc(hidden)]
pub struct ModelWaiter {
    signal: Arc<Signal>,
}

#[cfg(turnstile_loom)]
impl Default for ModelWaiter {
    fn default() -> Self {
        ModelWaiter {
            signal: Arc::new(Signal::new()),
        }
    }
}

#[cfg(turnstile_loom)]
impl ModelWaiter {
    /// The chain caller's side: `seen` read before `attempt`; if the attempt fails, registers,
    /// compares the epoch (attempting again at once, still registered, if it moved; the real
    /// caller sleeps its backoff first), and waits (untimed,
    /// unlike a real chain, so that a lost notification is a deadlock loom reports) until
    /// notified; then attempts again. Returns when `attempt` succeeds.
    pub fn wait_until(&self, watchers: &Watchers, attempt: impl FnMut() -> bool) {
        self.wait(watchers, attempt, false);
    }

    /// As [`wait_until`](Self::wait_until), each failed attempt giving permits back as a
    /// chain's commit that lost a race does: a change of the limiter, which does not wake the
    /// caller and which its registration expects, so that it is not taken for a change it
    /// missed. The model checks that this expectation never hides a change it did miss (a
    /// deadlock); that the caller sleeps rather than loops is for the tests (`tests/chain.rs`),
    /// loom scheduling the other thread into a loop either way.
    pub fn wait_until_refunding(&self, watchers: &Watchers, attempt: impl FnMut() -> bool) {
        self.wait(watchers, attempt, true);
    }

    fn wait(&self, watchers: &Watchers, mut attempt: impl FnMut() -> bool, refunds: bool) {
        let me = Watcher::Thread(Arc::clone(&self.signal));
        let seen = watchers.epoch();
        let mut registered = None;
        loop {
            // Before the attempt: a notification after it moves the signal's epoch.
            let signal_epoch = self.signal.epoch();
            if attempt() {
                if let Some(id) = registered {
                    watchers.unwatch(id);
                }
                return;
            }
            // The attempt's refund, as `Core::attempt_waiting` makes it: one bump of its own.
            let own = u64::from(refunds);
            if refunds {
                watchers.changed(Some(&me));
            }
            if registered.is_none() {
                // Registered from here on, whatever the epoch says.
                let (id, now) = watchers.watch(me.clone());
                registered = Some(id);
                if now != seen.wrapping_add(own) {
                    continue;
                }
            }
            self.signal.wait(signal_epoch);
        }
    }
}
