//! The one shim for every synchronisation primitive the crate uses.
//!
//! Normal builds use `std`; builds with `RUSTFLAGS="--cfg turnstile_loom"` use loom's model-checked
//! replacements so that the protocols in `loom-tests/` are explored under every interleaving. Nothing
//! else in the crate names `std::sync::atomic` or `loom` directly.
//!
//! The cfg is crate-specific on purpose: a global `--cfg loom` would switch tokio into its own loom mode
//! and break its build.

#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::Arc;

#[cfg(turnstile_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(turnstile_loom)]
pub(crate) use loom::sync::Arc;

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
    per_thread: thread_local::ThreadLocal<crossbeam_utils::CachePadded<[AtomicU64; 2]>>,
    #[cfg(turnstile_loom)]
    shared: [AtomicU64; 2],
}

/// Index of the "admitted" counter.
pub(crate) const ADMITTED: usize = 0;
/// Index of the "rejected" counter.
pub(crate) const REJECTED: usize = 1;

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            #[cfg(not(turnstile_loom))]
            per_thread: thread_local::ThreadLocal::new(),
            #[cfg(turnstile_loom)]
            shared: [AtomicU64::new(0), AtomicU64::new(0)],
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
