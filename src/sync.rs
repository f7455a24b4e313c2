//! The one shim for every synchronisation primitive the crate uses.
//!
//! Normal builds use `std`; builds with `RUSTFLAGS="--cfg turnstile_loom"` use loom's model-checked
//! replacements so that the protocols in `loom-tests/` are explored under every interleaving. Nothing
//! else in the crate names `std::sync::atomic` or `loom` directly.
//!
//! The cfg is crate-specific on purpose: a global `--cfg loom` would switch tokio into its own loom mode
//! and break its build.

#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(turnstile_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(turnstile_loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

/// The hasher a keyed structure (limiter, chain, ban list, concurrency limiter) uses unless its
/// builder is given another: foldhash, randomly seeded per structure, since clients often choose
/// the keys.
///
/// Under loom a fixed seed instead. Loom replays the choices of earlier executions by their
/// position (the n-th atomic access reads the store it chose before), so every execution of a
/// model must take the same steps up to its new choice. A random seed put a key in another shard
/// from one execution to the next, so the replayed choices landed on another shard's atomics: loom
/// explored interleavings that do not exist and missed ones that do, or failed its own internal
/// assertion (two stores with one modification order, loom's `match_load_to_stores`).
#[cfg(all(feature = "keyed", not(turnstile_loom)))]
pub(crate) type RandomHasher = foldhash::fast::RandomState;
/// See the normal build's alias: a fixed seed so that loom's executions are deterministic.
#[cfg(all(feature = "keyed", turnstile_loom))]
pub(crate) type RandomHasher = foldhash::fast::FixedState;

/// The hasher of [`KeyLocks`](crate::KeyLocks) unless its builder is given another: std's
/// SipHash, randomly keyed per structure. Under loom a fixed key, as for [`RandomHasher`].
#[cfg(all(feature = "keyed", not(turnstile_loom)))]
pub(crate) type RandomSipHasher = std::collections::hash_map::RandomState;
/// See the normal build's alias: fixed keys so that loom's executions are deterministic.
#[cfg(all(feature = "keyed", turnstile_loom))]
pub(crate) type RandomSipHasher =
    std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

/// Locks `mutex`, ignoring poisoning: every critical section in this crate leaves its data
/// consistent before anything in it can panic, so a poisoned lock holds valid data.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(turnstile_loom))]
    {
        mutex
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(turnstile_loom)]
    {
        mutex.lock().unwrap()
    }
}

/// Runs a batch of wake-ups to the end even if some of them panic, then re-raises the first panic.
///
/// A `Waker`'s `wake` may panic. When one call hands out several grants or failures at once (a
/// close, a batch of readers, a reconfiguration), each woken party already owns its outcome and
/// will only see it if it is polled again: stopping at the first panicking waker would strand the
/// rest for good. Each wake-up runs under `catch_unwind` rather than in a drop guard so that a
/// second panicking waker is caught too instead of panicking during unwinding (which aborts).
/// Costs nothing while nobody panics.
#[derive(Default)]
pub(crate) struct WakeAll {
    panic: Option<Box<dyn std::any::Any + Send>>,
}

impl WakeAll {
    /// Runs one wake-up; a panic in it is kept (the first one) for [`finish`](Self::finish).
    pub(crate) fn run(&mut self, wake: impl FnOnce()) {
        // Unwind safety: whatever `wake` touches is consumed by it (a waker, a signal) or is
        // left consistent before the wake-ups start (every caller unlocks first).
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(wake)) {
            self.panic.get_or_insert(panic);
        }
    }

    /// Re-raises the first panic, once every wake-up has run; unless the thread is already
    /// unwinding, as when a guard whose release wakes others is dropped by a panic in the code
    /// that held it. A panic out of that drop would abort the process ("panic in a destructor
    /// during cleanup"), so the waker's panic, already reported by the panic hook, is dropped
    /// instead and the first panic goes on unwinding. Every party was woken either way.
    pub(crate) fn finish(self) {
        if let Some(panic) = self.panic {
            if std::thread::panicking() {
                drop(panic);
            } else {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

/// Calls `wake` on every item of `wakes`, all of them even if some panic (see [`WakeAll`]).
pub(crate) fn wake_all<W>(wakes: impl IntoIterator<Item = W>, wake: impl Fn(W)) {
    let mut all = WakeAll::default();
    for item in wakes {
        all.run(|| wake(item));
    }
    all.finish();
}

/// A one-thread wake-up signal for blocking waiters: an epoch counter that [`notify`](Self::notify)
/// bumps.
///
/// Normal builds wait on the counter with atomic-wait's futex `wait`/`wake_one` (untimed waits,
/// for example for a release) or park the thread with a timeout (waits for time, or with a
/// deadline; atomic-wait has no timed wait); `notify` does both wake-ups. Under loom, whose model
/// threads cannot block in the kernel, a `Mutex<u32>` + `Condvar` stands in, and a timed wait
/// returns at once (callers treat every return as possibly spurious and look again).
pub(crate) struct Signal {
    #[cfg(not(turnstile_loom))]
    epoch: std::sync::atomic::AtomicU32,
    #[cfg(not(turnstile_loom))]
    thread: std::thread::Thread,
    #[cfg(turnstile_loom)]
    epoch: loom::sync::Mutex<u32>,
    #[cfg(turnstile_loom)]
    changed: loom::sync::Condvar,
}

impl Signal {
    /// A signal owned by the calling thread.
    pub(crate) fn new() -> Self {
        Signal {
            #[cfg(not(turnstile_loom))]
            epoch: std::sync::atomic::AtomicU32::new(0),
            #[cfg(not(turnstile_loom))]
            thread: std::thread::current(),
            #[cfg(turnstile_loom)]
            epoch: loom::sync::Mutex::new(0),
            #[cfg(turnstile_loom)]
            changed: loom::sync::Condvar::new(),
        }
    }

    /// The current epoch: read it *before* checking the condition, then wait on it.
    pub(crate) fn epoch(&self) -> u32 {
        #[cfg(not(turnstile_loom))]
        {
            // Acquire: pairs with the Release in `notify`, so whatever the notifier did before
            // notifying is visible once we see its epoch.
            self.epoch.load(Ordering::Acquire)
        }
        #[cfg(turnstile_loom)]
        {
            *self.epoch.lock().unwrap()
        }
    }

    /// Blocks until the epoch differs from `seen` (or spuriously).
    pub(crate) fn wait(&self, seen: u32) {
        #[cfg(not(turnstile_loom))]
        atomic_wait::wait(&self.epoch, seen);
        #[cfg(turnstile_loom)]
        {
            let mut epoch = self.epoch.lock().unwrap();
            while *epoch == seen {
                epoch = self.changed.wait(epoch).unwrap();
            }
        }
    }

    /// Blocks until the epoch differs from `seen`, `timeout` passes, or spuriously.
    pub(crate) fn wait_timeout(&self, seen: u32, timeout: std::time::Duration) {
        #[cfg(not(turnstile_loom))]
        {
            // A notify between this check and the park leaves an unpark token, so the park
            // returns at once: no lost wake-up.
            if self.epoch() == seen {
                std::thread::park_timeout(timeout);
            }
        }
        #[cfg(turnstile_loom)]
        {
            let _ = (seen, timeout);
            loom::thread::yield_now();
        }
    }

    /// Wakes the owner thread.
    pub(crate) fn notify(&self) {
        #[cfg(not(turnstile_loom))]
        {
            // Release: pairs with the Acquire in `epoch`.
            self.epoch.fetch_add(1, Ordering::Release);
            atomic_wait::wake_one(&self.epoch);
            self.thread.unpark();
        }
        #[cfg(turnstile_loom)]
        {
            *self.epoch.lock().unwrap() += 1;
            self.changed.notify_all();
        }
    }
}

/// `N` parameter words that the hot path reads without a lock and a rare writer replaces: a
/// seqlock built from atomics (no `unsafe`).
///
/// | `version` | meaning |
/// |---|---|
/// | even `2g` | generation `g` is published: `words` hold it |
/// | odd | a writer is replacing the words; readers retry |
///
/// **Reader** ([`load`](Self::load)): version (Acquire), every word (Relaxed), `fence(Acquire)`,
/// version again (Relaxed); the snapshot is used only if both versions are the same even number.
/// **Writer** ([`begin`](Self::begin), the writer's clock read, then [`Writing::finish`];
/// serialised by its caller's mutex): version + 1 (SeqCst),
/// `fence(SeqCst)` (a release fence, and more: see `begin`), the words (Relaxed), version + 2
/// (Release).
///
/// Why a snapshot is never torn: if a reader's Relaxed load of a word returns a value a writer
/// stored, that store comes after the writer's release fence, so the reader's acquire fence
/// synchronises with it and the reader's second version load sees the writer's odd version or
/// later: the versions differ and the reader retries. If it returns only older values while the
/// first version load saw the final (Release) version of a later writer, the Acquire on that
/// load made every word of that writer visible first, so coherence forbids the older values.
/// This is Boehm's seqlock ("Can seqlocks get along with programming language memory models?",
/// 2012), the variant with fences; `loom-tests/loom_reconfigure.rs` checks it.
///
/// On x86 and AArch64 the reader is N + 2 plain loads; the line is written only by a
/// reconfiguration, so it stays shared in every core's cache.
pub(crate) struct Params<const N: usize> {
    version: AtomicU64,
    words: [AtomicU64; N],
}

impl<const N: usize> Params<N> {
    pub(crate) fn new(words: [u64; N]) -> Self {
        Params {
            version: AtomicU64::new(0),
            words: std::array::from_fn(|i| AtomicU64::new(words[i])),
        }
    }

    /// A consistent snapshot of the words and the version it was published under.
    #[inline(always)]
    pub(crate) fn load(&self) -> ([u64; N], u64) {
        match self.try_load() {
            Some(snapshot) => snapshot,
            None => self.load_contended(),
        }
    }

    /// One attempt of [`load`](Self::load): the snapshot, or `None` while a writer is between
    /// `begin` and its publication (or published during the attempt).
    #[inline(always)]
    fn try_load(&self) -> Option<([u64; N], u64)> {
        // Acquire: pairs with the writer's final Release store, so its words are visible.
        let before = self.version.load(Ordering::Acquire);
        let words = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
        // Acquire fence: if any word load above read a store made after a writer's release
        // fence, the version load below sees that writer's odd version (or later).
        fence(Ordering::Acquire);
        let after = self.version.load(Ordering::Relaxed);
        (before == after && before & 1 == 0).then_some((words, before))
    }

    /// [`load`](Self::load) while a writer is at work: tries again with one backoff across the
    /// attempts, so that it spins a little, then yields the thread to the writer. (A fresh
    /// backoff per attempt never got past its first spin: readers busy-spun for as long as a
    /// writer stayed descheduled between `begin` and its publication, which a reconfiguration
    /// on a loaded machine can be, its clock read included.)
    #[cold]
    #[inline(never)]
    fn load_contended(&self) -> ([u64; N], u64) {
        let spin = Spin::new();
        loop {
            spin.snooze();
            if let Some(snapshot) = self.try_load() {
                return snapshot;
            }
        }
    }

    /// Whether a writer has started since the snapshot of `version` was taken. Callers read
    /// their clock first: a writer that reads its clock after `begin` then sees a time no
    /// earlier than any caller that finds the version unchanged (see [`begin`](Self::begin)).
    ///
    /// Its other use needs no more than Relaxed: a caller that loaded a cell word written under
    /// newer parameters (with Acquire, from a writer that had loaded those parameters with
    /// Acquire) sees the newer version by coherence (see ARCHITECTURE.md).
    #[inline(always)]
    pub(crate) fn changed(&self, version: u64) -> bool {
        // SeqCst: in the single order of SeqCst operations, the caller's clock read (SeqCst in
        // this crate's atomic clocks) comes before this load, and this load before a writer's
        // odd version (`begin`) that it does not see, which comes before the writer's clock
        // read; so that read returns a time no earlier than the caller's. On x86 a plain load,
        // as Relaxed; on AArch64 a load-acquire.
        self.version.load(Ordering::SeqCst) != version
    }

    /// The words as they are now. Only for the writer, under its caller's mutex (so the last
    /// store happens before this load).
    pub(crate) fn current(&self) -> [u64; N] {
        std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed))
    }

    /// Starts a replacement: the version turns odd, so that a decision under the current words
    /// that has not made its re-check yet ([`changed`](Self::changed)) decides again under the
    /// next ones, and [`load`](Self::load) waits for them. A writer whose new words depend on
    /// the time reads its clock after this, then calls [`Writing::finish`]: every decision
    /// that still commits under the old words found them unchanged at its re-check, so it read
    /// its clock before the writer did, and its word says nothing about a later time that the
    /// new words could read differently. (Reading the clock first and publishing after left a
    /// window as long as the writer could be descheduled in between, in which a decision under
    /// the old words at a later time committed a word the new ones misread: a fixed window's
    /// next window read as stale, a fresh limit handed out twice at one instant.)
    ///
    /// The clock is the caller's code and may panic: a [`Writing`] dropped unfinished (by that
    /// unwind) publishes the words it found, so the version is even again and the old
    /// parameters stay in force. Left odd, every later [`load`](Self::load) would spin for good
    /// waiting for a writer that is gone.
    pub(crate) fn begin(&self) -> Writing<'_, N> {
        let version = self.version.load(Ordering::Relaxed);
        // SeqCst: in the single order of SeqCst operations before the writer's clock read; see
        // `changed` for the other half of the argument.
        self.version.store(version + 1, Ordering::SeqCst);
        // SeqCst fence: keeps a clock that is no atomic (the OS clock) from being read before
        // the odd version is visible, a store then a load needing a full fence; and orders the
        // odd version before every word store in `publish`, for any reader whose acquire fence
        // follows a load of one of them (see the type's docs).
        fence(Ordering::SeqCst);
        Writing {
            params: self,
            finished: false,
        }
    }

    /// Ends a replacement: the words, then the even version.
    fn publish(&self, words: [u64; N]) {
        let version = self.version.load(Ordering::Relaxed);
        for (word, value) in self.words.iter().zip(words) {
            word.store(value, Ordering::Relaxed);
        }
        // Release: a reader that loads this version (Acquire) sees every word stored above.
        self.version.store(version + 1, Ordering::Release);
    }
}

/// A replacement of [`Params`]' words that [`Params::begin`] started: [`finish`](Self::finish)
/// publishes the new words; dropped unfinished (a panic between the two), it publishes the
/// words as they were (the writer's steps with unchanged words: readers see the old parameters).
#[must_use = "the replacement ends when it is finished"]
pub(crate) struct Writing<'a, const N: usize> {
    params: &'a Params<N>,
    finished: bool,
}

impl<const N: usize> Writing<'_, N> {
    /// Publishes `words`: the words, then the even version.
    pub(crate) fn finish(mut self, words: [u64; N]) {
        self.finished = true;
        self.params.publish(words);
    }
}

impl<const N: usize> Drop for Writing<'_, N> {
    fn drop(&mut self) {
        if !self.finished {
            // Under the writer's mutex still (the unwind drops this first): the words are the
            // last ones published.
            self.params.publish(self.params.current());
        }
    }
}

/// Waits politely while another thread finishes a short critical step (for example publishing a
/// slot it has just claimed).
///
/// Under loom a spin must yield, or the model checker would explore the spin forever.
pub(crate) struct Spin {
    #[cfg(not(turnstile_loom))]
    backoff: crossbeam_utils::Backoff,
}

impl Spin {
    pub(crate) fn new() -> Self {
        Spin {
            #[cfg(not(turnstile_loom))]
            backoff: crossbeam_utils::Backoff::new(),
        }
    }

    /// Spins a little, then yields the thread (crossbeam's `Backoff::snooze`).
    pub(crate) fn snooze(&self) {
        #[cfg(not(turnstile_loom))]
        self.backoff.snooze();
        #[cfg(turnstile_loom)]
        loom::thread::yield_now();
    }
}

/// Event counters that a thread can bump without touching a cache line another thread writes.
///
/// Normal builds keep one cache-padded pair of counters per thread (the `thread_local` crate), which
/// only its owner thread writes, with a plain load + store: no read-modify-write, no cache-line
/// ping-pong. That is what lets a rejected `try_acquire` leave every shared cache line untouched.
/// `sum` adds the per-thread values up; it is exact once the counting threads have stopped and may
/// lag by in-flight increments otherwise.
///
/// Under loom every model thread runs on one OS thread, so per-OS-thread storage would be shared;
/// there a single atomic with `fetch_add` keeps the counts exact.
pub(crate) struct Counters {
    #[cfg(not(turnstile_loom))]
    per_thread: thread_local::ThreadLocal<crossbeam_utils::CachePadded<[AtomicU64; 4]>>,
    #[cfg(turnstile_loom)]
    shared: [AtomicU64; 4],
}

/// Index of the "admitted" counter.
pub(crate) const ADMITTED: usize = 0;
/// Index of the "rejected" counter.
pub(crate) const REJECTED: usize = 1;
/// Index of the "cancelled" counter: waits given up (future dropped, timed out).
pub(crate) const CANCELLED: usize = 2;
/// Index of the "overflowed" counter: keyed calls for a new key that found the key cap reached.
#[cfg(feature = "keyed")]
pub(crate) const OVERFLOWED: usize = 3;
/// Index of a chain's "refunded" counter: calls in which a member admitted and had to be given
/// its permits back. (A chain has no keys of its own, so it uses the slot of `OVERFLOWED`.)
pub(crate) const REFUNDED: usize = 3;

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            #[cfg(not(turnstile_loom))]
            per_thread: thread_local::ThreadLocal::new(),
            #[cfg(turnstile_loom)]
            shared: [
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
            ],
        }
    }

    /// Adds one to counter `which`.
    #[inline]
    pub(crate) fn bump(&self, which: usize) {
        #[cfg(not(turnstile_loom))]
        {
            let mine = self.per_thread.get_or(Default::default);
            // Only this thread ever writes `mine`, so load + store loses no update; Relaxed because the
            // counters order nothing else.
            let slot = &mine[which];
            slot.store(
                slot.load(Ordering::Relaxed).wrapping_add(1),
                Ordering::Relaxed,
            );
        }
        #[cfg(turnstile_loom)]
        self.shared[which].fetch_add(1, Ordering::Relaxed);
    }

    /// The total of counter `which` over all threads.
    pub(crate) fn sum(&self, which: usize) -> u64 {
        #[cfg(not(turnstile_loom))]
        {
            self.per_thread
                .iter()
                .map(|c| c[which].load(Ordering::Relaxed))
                .fold(0u64, u64::wrapping_add)
        }
        #[cfg(turnstile_loom)]
        self.shared[which].load(Ordering::Relaxed)
    }
}

/// The memory reclaimer that a keyed store's maps share (seize's, behind papaya): one per store
/// rather than one per map, so that an empty store costs a few hundred bytes per shard instead
/// of about 17 KB, and so that what one shard retires (removed entries, tables replaced by a
/// resize) is freed as the store's traffic as a whole fills reclamation batches, rather than
/// waiting for that one shard to fill a batch of its own. Under loom there is nothing to share.
#[cfg(feature = "keyed")]
#[derive(Clone)]
pub(crate) struct Reclaimer {
    #[cfg(not(turnstile_loom))]
    collector: std::sync::Arc<seize::Collector>,
}

#[cfg(feature = "keyed")]
impl Reclaimer {
    /// Retired entries a thread collects before it reclaims them. Each reclamation costs a
    /// `membarrier` system call (seize's heavy barrier); seize's default of 32 made one call per
    /// 32 evictions (32,256 for a sweep of 1M idle keys). A batch holds pointers to garbage only,
    /// and the store also flushes it explicitly (after every shard sweep, and every 256 inserts
    /// into a shard), so the larger batch does not hold replaced tables for long.
    #[cfg(not(turnstile_loom))]
    const BATCH: usize = 512;

    /// The reclaimer of a store's shards (a large batch; the store flushes it itself).
    pub(crate) fn new() -> Self {
        Reclaimer {
            #[cfg(not(turnstile_loom))]
            collector: std::sync::Arc::new(seize::Collector::new().batch_size(Self::BATCH)),
        }
    }

    /// A reclaimer with seize's default batch, for a map that nothing flushes (the per-key wait
    /// queues: their removed queues are freed after 32 retirements, as before).
    pub(crate) fn unflushed() -> Self {
        Reclaimer {
            #[cfg(not(turnstile_loom))]
            collector: std::sync::Arc::new(seize::Collector::new()),
        }
    }
}

/// The concurrent map behind keyed limiters: key → cell of atomic state, the cell stored inline in
/// the map's entry (no `Arc` per key).
///
/// Normal builds use `papaya::HashMap` (chosen by `benches/keyed_map.rs`, see ARCHITECTURE.md):
/// lookups are lock-free and write no shared memory, entries never move once inserted (a
/// reference stays the live value until removal), and removed entries are reclaimed only after
/// every reader that could see them has left. Under loom a `Mutex<HashMap<K, Arc<V>>>` stands in:
/// it is linearizable like papaya, and callers run their closures *outside* its lock, so the model
/// explores every interleaving of the cells' own atomics with the map's operations.
///
/// The API is closure-based so that a reference never outlives the lookup that produced it.
#[cfg(feature = "keyed")]
pub(crate) struct KeyMap<K, V, S> {
    #[cfg(not(turnstile_loom))]
    map: papaya::HashMap<K, V, S>,
    #[cfg(turnstile_loom)]
    map: Mutex<std::collections::HashMap<K, Arc<V>, S>>,
}

#[cfg(feature = "keyed")]
impl<K, V, S> KeyMap<K, V, S>
where
    // 'static: papaya's shared collector may free entries after the map itself is gone.
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: Send + Sync + 'static,
    S: std::hash::BuildHasher,
{
    /// An empty map reclaiming through `reclaimer`.
    ///
    /// Resizes block writers until the copy is done (papaya's `ResizeMode::Blocking`) instead of
    /// moving 64 entries per write: with incremental resizing a burst of inserts left many maps
    /// mid-resize, so lookups probed two tables and the first walk of a map finished the copy
    /// (profiled: a walk of a freshly filled map 262 → 7.7 ns per key, 1M-key lookups about 30 %
    /// faster; ARCHITECTURE.md). A shard holds a few thousand keys at most, so the blocking copy
    /// stays short.
    pub(crate) fn with_hasher(hasher: S, reclaimer: &Reclaimer) -> Self {
        #[cfg(turnstile_loom)]
        let _ = reclaimer;
        KeyMap {
            #[cfg(not(turnstile_loom))]
            map: papaya::HashMap::builder()
                .hasher(hasher)
                .shared_collector(std::sync::Arc::clone(&reclaimer.collector))
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
            #[cfg(turnstile_loom)]
            map: Mutex::new(std::collections::HashMap::with_hasher(hasher)),
        }
    }

    /// Runs `f` on the value of `key`, if present.
    #[inline(always)]
    pub(crate) fn get<R>(&self, key: &K, f: impl FnOnce(&V) -> R) -> Option<R> {
        #[cfg(not(turnstile_loom))]
        {
            let guard = self.map.guard();
            self.map.get(key, &guard).map(f)
        }
        #[cfg(turnstile_loom)]
        {
            let value = lock(&self.map).get(key).cloned();
            value.map(|v| f(&v))
        }
    }

    /// Inserts `value` under `key` unless the key is present, then runs `f` on the value now
    /// there (ours or the one found) and whether ours was inserted; the flag says that too.
    pub(crate) fn insert_then<R>(
        &self,
        key: K,
        value: V,
        f: impl FnOnce(&V, bool) -> R,
    ) -> (R, bool) {
        #[cfg(not(turnstile_loom))]
        {
            let guard = self.map.guard();
            match self.map.try_insert(key, value, &guard) {
                Ok(ours) => (f(ours, true), true),
                Err(occupied) => (f(occupied.current, false), false),
            }
        }
        #[cfg(turnstile_loom)]
        {
            let (value, inserted) = {
                let mut map = lock(&self.map);
                match map.get(&key) {
                    Some(v) => (Arc::clone(v), false),
                    None => {
                        let v = Arc::new(value);
                        map.insert(key, Arc::clone(&v));
                        (v, true)
                    }
                }
            };
            (f(&value, inserted), inserted)
        }
    }

    /// Removes `key` if `pred` holds for its value; true if this call removed it.
    pub(crate) fn remove_if(&self, key: &K, pred: impl Fn(&V) -> bool) -> bool {
        #[cfg(not(turnstile_loom))]
        {
            let guard = self.map.guard();
            matches!(self.map.remove_if(key, |_, v| pred(v), &guard), Ok(Some(_)))
        }
        #[cfg(turnstile_loom)]
        {
            let mut map = lock(&self.map);
            if map.get(key).is_some_and(|v| pred(v)) {
                map.remove(key);
                true
            } else {
                false
            }
        }
    }

    /// Calls `keep` on every entry and removes those it answers false for, each in one step from
    /// the entry `keep` saw (an entry replaced meanwhile is not removed), with one guard per
    /// call: no second lookup per removal. A weakly consistent walk under concurrent changes;
    /// `keep` may be called more than once for an entry (papaya retries a table that a resize
    /// replaced), so it must be idempotent in its answer.
    ///
    /// `touch` is called on values ahead of `keep`, to load them early (see below); it must
    /// only read.
    pub(crate) fn retain(&self, touch: impl Fn(&V), mut keep: impl FnMut(&K, &V) -> bool) {
        #[cfg(not(turnstile_loom))]
        {
            use seize::Guard as _;
            let guard = self.map.guard();
            // The entries are separate allocations, met in table (hash) order, so in a map
            // larger than the cache every one is a miss, and `keep`'s compare-and-swaps (and
            // papaya's, removing) keep the CPU from running ahead into the next miss. So before
            // every `BATCH` calls of `keep`, an iterator over the same table has `touch` load the
            // next `BATCH` values back to back, with nothing in between to stop their misses
            // from overlapping. (The iterator reads only the table; the two walks skip the same
            // empty slots, so it stays in step but for entries changed meanwhile, which only
            // makes a touch useless, never wrong.)
            const BATCH: usize = 32;
            let mut ahead = self.map.iter(&guard);
            let mut until_touch = 0;
            self.map.retain(
                |k, v| {
                    if until_touch == 0 {
                        ahead.by_ref().take(BATCH).for_each(|(_, next)| touch(next));
                        until_touch = BATCH;
                    }
                    until_touch -= 1;
                    keep(k, v)
                },
                &guard,
            );
            // Hand what this thread retired (entries removed here, tables that inserts' resizes
            // replaced) to reclamation now rather than when a full batch is reached: it is freed
            // as soon as no reader can hold it, at the latest when `guard` is dropped, if no
            // other thread is reading. One `membarrier` system call per walk.
            guard.flush();
        }
        #[cfg(turnstile_loom)]
        {
            let _ = touch;
            let entries: Vec<(K, Arc<V>)> = lock(&self.map)
                .iter()
                .map(|(k, v)| (k.clone(), Arc::clone(v)))
                .collect();
            for (k, v) in entries {
                if !keep(&k, &v) {
                    let mut map = lock(&self.map);
                    // As papaya's compare-and-swap on the entry: only the entry `keep` saw.
                    if map.get(&k).is_some_and(|now| Arc::ptr_eq(now, &v)) {
                        map.remove(&k);
                    }
                }
            }
        }
    }

    /// Hands what this thread has retired (removed entries, replaced tables) to reclamation now
    /// instead of when its batch is full; it is freed once no reader can still hold it.
    pub(crate) fn flush(&self) {
        #[cfg(not(turnstile_loom))]
        {
            use seize::Guard as _;
            self.map.guard().flush();
        }
    }

    /// Calls `f` on every entry (a weakly consistent snapshot under concurrent changes).
    pub(crate) fn for_each(&self, mut f: impl FnMut(&K, &V)) {
        #[cfg(not(turnstile_loom))]
        {
            let guard = self.map.guard();
            for (k, v) in self.map.iter(&guard) {
                f(k, v);
            }
        }
        #[cfg(turnstile_loom)]
        {
            let entries: Vec<(K, Arc<V>)> = lock(&self.map)
                .iter()
                .map(|(k, v)| (k.clone(), Arc::clone(v)))
                .collect();
            for (k, v) in entries {
                f(&k, &v);
            }
        }
    }
}
