//! Loom model of the upkeep clock's protocol (`Upkeep` in `src/clock.rs`).
//!
//! Protocol: one word holds the reading (shifted left by two) and a state in its low bits. One
//! thread ticks (raises the reading) while the clock is read and parks when it is not. The state
//! says which: `READ` (read since the last tick), `QUIET` (not), `ASLEEP` (the thread is
//! parked). Every write is a compare-and-swap that keeps the larger reading. Only the thread
//! moves `READ → QUIET → ASLEEP`, the last after enough quiet ticks and with `Release`; a reader
//! moves `QUIET → READ`, and while the thread is asleep takes the OS clock itself and raises the
//! reading to it, in the same swap moving `ASLEEP → READ` (`Acquire`) when its reading came within
//! `wake_within` of the one before, and then unparks the thread. A parked thread parks again
//! unless the state has left `ASLEEP`.
//!
//! The models drive the crate's own `Upkeep` with a stand-in for the OS clock: one loom atomic
//! that every reading advances (`fetch_add`), so readings are distinct, increase along
//! happens-before, and "real time" is that atomic's value. The thread's loop is the one of
//! `upkeep` in `src/clock.rs`, bounded. They assert:
//! - no lost wake-up: a reader that moved the state out of `ASLEEP` and unparked the thread sees
//!   it resume (a wake-up lost between the thread's move to `ASLEEP` and its park would leave it
//!   parked for ever: a loom deadlock at the join);
//! - monotone along happens-before: a read that happens after another (through a Release/Acquire
//!   pair, as two decisions of a limiter are ordered by its state word) never returns an earlier
//!   time, whichever of the thread's ticks, its sleep and the readers' own readings are between;
//! - exact while asleep: a read that found the thread asleep returns at least real time at the
//!   read's start.

#![cfg(turnstile_loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::thread;
use turnstile::Upkeep;

/// Readings closer than this (in the model's time units) wake the thread (`wake_within`).
const INTERVAL: u64 = 1_000;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// The stand-in for the OS clock: every reading is one unit later than the one before.
#[derive(Clone)]
struct RealTime(Arc<AtomicU64>);

impl RealTime {
    fn new() -> Self {
        RealTime(Arc::new(AtomicU64::new(10 * INTERVAL)))
    }

    fn reading(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// What the model's upkeep thread did.
#[derive(Debug, Default, Clone, Copy)]
struct ThreadLog {
    slept: bool,
    resumed: bool,
}

/// `upkeep` from `src/clock.rs`, bounded to `ticks` ticks before and one after a sleep. Starts a
/// quiet tick short of parking, so that the model reaches the sleep in one tick. `alive` false
/// plus an unpark is the last clock's drop.
fn upkeep_thread(
    upkeep: Arc<Upkeep>,
    time: RealTime,
    alive: Arc<AtomicBool>,
    ticks: usize,
) -> ThreadLog {
    let mut log = ThreadLog::default();
    let mut quiet = u32::MAX - 1;
    for _ in 0..ticks {
        if !upkeep.tick(time.reading(), &mut quiet) {
            continue;
        }
        log.slept = true;
        loop {
            thread::park();
            if !alive.load(Ordering::Acquire) {
                return log;
            }
            if upkeep.woken() {
                upkeep.catch_up(time.reading());
                log.resumed = true;
                return log;
            }
        }
    }
    log
}

/// One read, checked against real time: exact when the thread was asleep. Returns the value and whether this read woke the thread.
fn read(upkeep: &Upkeep, time: &RealTime, thread: &thread::Thread) -> (u64, bool) {
    let start = time.now();
    let mut took_own = false;
    let mut woke = false;
    let value = upkeep.read(
        INTERVAL,
        || {
            took_own = true;
            time.reading()
        },
        || {
            woke = true;
            thread.unpark();
        },
    );
    if took_own {
        assert!(value > start, "a read while asleep returned an old time");
    }
    (value, woke)
}

/// One model's shared state and its upkeep thread.
struct Clock {
    upkeep: Arc<Upkeep>,
    time: RealTime,
    alive: Arc<AtomicBool>,
    handle: thread::JoinHandle<ThreadLog>,
    thread: thread::Thread,
}

impl Clock {
    /// A clock whose thread ticks at most `ticks` times before and once after a sleep.
    fn start(ticks: usize) -> Self {
        let upkeep = Arc::new(Upkeep::new());
        let time = RealTime::new();
        let alive = Arc::new(AtomicBool::new(true));
        let handle = {
            let (upkeep, time, alive) = (upkeep.clone(), time.clone(), alive.clone());
            thread::spawn(move || upkeep_thread(upkeep, time, alive, ticks))
        };
        let thread = handle.thread().clone();
        Clock {
            upkeep,
            time,
            alive,
            handle,
            thread,
        }
    }

    /// Shuts the thread down unless a reader woke it, and joins it. A reader that woke it
    /// needs no help: if its wake-up were lost, the join would deadlock.
    fn finish(self, woken_by_reader: bool) -> ThreadLog {
        if !woken_by_reader {
            self.alive.store(false, Ordering::Release);
            self.thread.unpark();
        }
        let log = self.handle.join().unwrap();
        if woken_by_reader {
            assert!(
                log.resumed,
                "a reader woke the thread, which did not resume"
            );
        }
        log
    }
}

/// Two reads in a row race the thread's tick and its sleep: the second read, within an
/// interval of the first, wakes a sleeping thread, and the wake-up is not lost whether it comes
/// before, during or after the thread's park.
#[test]
fn reads_close_together_wake_a_sleeping_thread() {
    model(|| {
        let clock = Clock::start(2);
        let (first, woke_first) = read(&clock.upkeep, &clock.time, &clock.thread);
        let (second, woke_second) = read(&clock.upkeep, &clock.time, &clock.thread);
        assert!(second >= first, "the clock went back: {second} < {first}");
        let log = clock.finish(woke_first || woke_second);
        assert!(!(woke_first && woke_second), "one sleep, woken twice");
        if log.slept && !log.resumed {
            // Asleep to the end: neither read found it asleep with a reading close before, so
            // neither woke it; its reads were the thread's ticks or their own.
            assert!(!woke_first && !woke_second);
        }
    });
}

/// A read that happens after another (a Release/Acquire pair, as a limiter's state word orders
/// two decisions) never sees an earlier time, with one reader on the published reading and the
/// other possibly on its own, around the thread's sleep.
#[test]
fn reads_ordered_by_happens_before_are_monotone() {
    model(|| {
        let clock = Clock::start(1);
        let seen = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let first = {
            let (upkeep, time) = (clock.upkeep.clone(), clock.time.clone());
            let thread = clock.thread.clone();
            let (seen, done) = (seen.clone(), done.clone());
            thread::spawn(move || {
                let (value, woke) = read(&upkeep, &time, &thread);
                seen.store(value, Ordering::Relaxed);
                done.store(true, Ordering::Release);
                woke
            })
        };
        let mut woke = false;
        if done.load(Ordering::Acquire) {
            let before = seen.load(Ordering::Relaxed);
            let (value, woke_here) = read(&clock.upkeep, &clock.time, &clock.thread);
            woke |= woke_here;
            assert!(
                value >= before,
                "a read ordered after another saw an earlier time: {value} < {before}"
            );
        }
        woke |= first.join().unwrap();
        clock.finish(woke);
    });
}
