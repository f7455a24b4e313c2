//! A manual clock that runs a hook inside one of its readings: the deterministic way to put a
//! racing call at an exact point of another call (the `countdown`-th clock reading after
//! `arm`), on the reading thread. `arm_after` runs it after the reading is taken instead: the
//! reader is "preempted" between its clock read and what it does next.

#![allow(dead_code)] // each test binary uses the parts it needs

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use turnstile::Clock;

pub type Hook = Box<dyn FnOnce() + Send>;

#[derive(Default)]
pub struct HookState {
    pub now: AtomicU64,
    /// Nanoseconds every reading moves the clock on, after it is taken (0: a still clock).
    pub tick: AtomicU64,
    /// Readings left before the hook fires (0: disarmed).
    countdown: AtomicUsize,
    /// Whether the hook runs after the reading is taken (`arm_after`) rather than before.
    after: AtomicBool,
    hook: Mutex<Option<Hook>>,
}

/// A manual clock whose `countdown`-th reading from now runs a hook first (once).
#[derive(Clone, Default)]
pub struct HookClock(pub Arc<HookState>);

impl HookClock {
    pub fn advance(&self, nanos: u64) {
        self.0.now.fetch_add(nanos, Ordering::SeqCst);
    }

    pub fn arm(&self, readings: usize, hook: Hook) {
        self.0.after.store(false, Ordering::SeqCst);
        *self.0.hook.lock().unwrap() = Some(hook);
        self.0.countdown.store(readings, Ordering::SeqCst);
    }

    /// As `arm`, but the hook runs after that reading is taken (everything it does is later
    /// than the reading, so the clock stays monotonic for the reader).
    pub fn arm_after(&self, readings: usize, hook: Hook) {
        self.0.after.store(true, Ordering::SeqCst);
        *self.0.hook.lock().unwrap() = Some(hook);
        self.0.countdown.store(readings, Ordering::SeqCst);
    }

    /// Disarms; true if the hook had fired.
    pub fn disarm(&self) -> bool {
        self.0.countdown.store(0, Ordering::SeqCst);
        self.0.hook.lock().unwrap().take().is_none()
    }
}

impl Clock for HookClock {
    fn now(&self) -> u64 {
        let fire = self
            .0
            .countdown
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1))
            == Ok(1);
        let after = fire && self.0.after.load(Ordering::SeqCst);
        if fire && !after {
            let hook = self.0.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook();
            }
        }
        let tick = self.0.tick.load(Ordering::SeqCst);
        let now = self.0.now.fetch_add(tick, Ordering::SeqCst);
        if after {
            let hook = self.0.hook.lock().unwrap().take();
            if let Some(hook) = hook {
                hook();
            }
        }
        now
    }
}
