//! Cancellation stress: many acquires given up at random points — timeouts, `select!` losers,
//! aborted tasks, blocking timeouts — on real threads and a multi-thread runtime. Afterwards every
//! permit must be back, the queue empty, and the statistics must add up exactly:
//! `admitted + rejected + cancelled` equals the number of acquire calls that ran.
//!
//! Real time on purpose: the races between a release, a timer and a drop are what is under test.
//!
//! Last, a served head whose poll unwinds because the next waiter's `Waker` panics: it must give
//! back what it was granted, deterministically, on paused time or by hand.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use turnstile::{
    AcquireError, Admission, Algorithm, ConcurrencyLimiter, MonotonicClock, Rate, RateLimiter,
    TokioClock,
};

mod common;

#[path = "common/wakers.rs"]
mod wakers;
use wakers::{Call, must_panic, panicky, poll_with};

/// xorshift64*: a small deterministic generator per task, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Counts a future in `calls` the first time it is polled: an acquire that is never polled never
/// ran, so it is not in the limiter's statistics either.
struct Counted<F> {
    inner: Pin<Box<F>>,
    calls: Arc<AtomicU64>,
    polled: bool,
}

fn counted<F: Future>(calls: &Arc<AtomicU64>, inner: F) -> Counted<F> {
    Counted {
        inner: Box::pin(inner),
        calls: Arc::clone(calls),
        polled: false,
    }
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        if !self.polled {
            self.polled = true;
            self.calls.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.as_mut().poll(cx)
    }
}

const LIMIT: u32 = 3;

#[test]
fn concurrency_limiter_survives_100k_cancelled_and_completed_acquires() {
    let limiter = ConcurrencyLimiter::new(LIMIT).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();

    const TASKS: u64 = 6;
    const PER_TASK: u64 = 16_000;
    const THREADS: u64 = 2;
    const PER_THREAD: u64 = 8_000;

    // Holds a permit for a moment, checking the limit from inside.
    fn hold(held: &AtomicUsize, n: u32) {
        let now = held.fetch_add(n as usize, Ordering::SeqCst) + n as usize;
        assert!(now <= LIMIT as usize, "{now} permits held at once");
        held.fetch_sub(n as usize, Ordering::SeqCst);
    }

    std::thread::scope(|s| {
        // Blocking waiters with short timeouts, sharing the queue with the async ones.
        for t in 0..THREADS {
            let (limiter, calls, admitted, held) = (&limiter, &calls, &admitted, &held);
            s.spawn(move || {
                let mut rng = Rng::new(1000 + t);
                for _ in 0..PER_THREAD {
                    let n = rng.below(u64::from(LIMIT) + 1) as u32;
                    let timeout = Duration::from_micros(rng.below(60));
                    calls.fetch_add(1, Ordering::Relaxed);
                    if let Ok(permit) = limiter.acquire_blocking_timeout(n, timeout) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                        hold(held, permit.permits());
                    }
                }
            });
        }

        runtime.block_on(async {
            let mut tasks = Vec::new();
            for t in 0..TASKS {
                let (limiter, calls, admitted, held) = (
                    limiter.clone(),
                    Arc::clone(&calls),
                    Arc::clone(&admitted),
                    Arc::clone(&held),
                );
                tasks.push(tokio::spawn(async move {
                    let mut rng = Rng::new(t);
                    for _ in 0..PER_TASK {
                        let n = rng.below(u64::from(LIMIT) + 1) as u32;
                        let acquire = counted(&calls, limiter.acquire_n(n));
                        let permit = match rng.below(3) {
                            // A timeout of 0 to 50 µs.
                            0 => {
                                let d = Duration::from_micros(rng.below(50));
                                tokio::time::timeout(d, acquire).await.ok()
                            }
                            // Lose a select! against a few yields.
                            1 => {
                                let yields = rng.below(4);
                                tokio::select! {
                                    p = acquire => Some(p),
                                    _ = async {
                                        for _ in 0..yields {
                                            tokio::task::yield_now().await;
                                        }
                                    } => None,
                                }
                            }
                            // Wait it out.
                            _ => Some(acquire.await),
                        };
                        if let Some(Ok(permit)) = permit {
                            admitted.fetch_add(1, Ordering::Relaxed);
                            hold(&held, permit.permits());
                            if rng.below(2) == 0 {
                                tokio::task::yield_now().await;
                            }
                        }
                    }
                }));
            }
            // Tasks aborted at random points while waiting (or holding).
            let mut rng = Rng::new(99);
            for _ in 0..4_000 {
                let (limiter, calls, admitted) =
                    (limiter.clone(), Arc::clone(&calls), Arc::clone(&admitted));
                let task = tokio::spawn(async move {
                    let permit = counted(&calls, limiter.acquire_owned(1)).await;
                    if permit.is_ok() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                    drop(permit);
                });
                for _ in 0..rng.below(3) {
                    tokio::task::yield_now().await;
                }
                task.abort();
                let _ = task.await;
            }
            for task in tasks {
                task.await.unwrap();
            }
        });
    });

    let stats = limiter.stats();
    let calls = calls.load(Ordering::Relaxed);
    assert!(calls >= 100_000, "only {calls} acquires ran");
    assert_eq!(
        limiter.available(),
        LIMIT,
        "a permit was lost or duplicated"
    );
    assert_eq!(
        (stats.waiting, stats.queued_permits),
        (0, 0),
        "queue not empty"
    );
    assert_eq!(
        stats.admitted + stats.rejected + stats.cancelled,
        calls,
        "stats do not add up: {stats:?}"
    );
    assert_eq!(stats.admitted, admitted.load(Ordering::Relaxed));
    assert!(stats.cancelled > 1_000, "the test must cancel: {stats:?}");
    assert!(stats.admitted > 10_000, "the test must admit: {stats:?}");
    // Still fully usable afterwards.
    assert_eq!(limiter.try_acquire_n(LIMIT).unwrap().permits(), LIMIT);
}

#[test]
fn rate_limiter_waiters_cancelled_at_random_never_over_admit() {
    let rate = Rate::per_second(100_000);
    let burst = 5;
    let limiter = RateLimiter::with_clock(
        Algorithm::TokenBucket { rate, burst },
        MonotonicClock::new(),
    )
    .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tasks: Vec<_> = (0..8u64)
            .map(|t| {
                let (limiter, calls, times) =
                    (limiter.clone(), Arc::clone(&calls), Arc::clone(&times));
                tokio::spawn(async move {
                    let mut rng = Rng::new(7 + t);
                    let mut mine = Vec::new();
                    for _ in 0..4_000 {
                        let n = 1 + rng.below(u64::from(burst)) as u32;
                        let d = Duration::from_micros(rng.below(100));
                        let acquire = counted(&calls, limiter.acquire_n(n));
                        if let Ok(Ok(a)) = tokio::time::timeout(d, acquire).await {
                            mine.push((a.at_nanos(), u64::from(n)));
                        }
                    }
                    times.lock().unwrap().extend(mine);
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    let stats = limiter.stats();
    let calls = calls.load(Ordering::Relaxed);
    assert_eq!((stats.waiting, stats.queued_permits), (0, 0));
    assert_eq!(stats.admitted + stats.rejected + stats.cancelled, calls);
    assert!(stats.cancelled > 100 && stats.admitted > 100, "{stats:?}");
    // GCRA conformance of everything admitted, through the queue or not.
    let mut admissions = times.lock().unwrap().clone();
    assert_eq!(admissions.len() as u64, stats.admitted);
    admissions.sort_unstable();
    let interval = 1_000_000_000 / 100_000u64;
    let capacity = interval * u64::from(burst);
    let (mut credit, mut last) = (capacity, 0u64);
    for (t, n) in admissions {
        credit = (credit + (t - last)).min(capacity);
        last = t;
        credit = credit
            .checked_sub(n * interval)
            .unwrap_or_else(|| panic!("over-admission at {t} ns"));
    }
}

/// What the callers were told, tallied as the statistics count it.
#[derive(Default, Debug, PartialEq, Eq, Clone, Copy)]
struct Told {
    admitted: u64,
    rejected: u64,
    cancelled: u64,
    /// Of `rejected`: waiters a lowering failed as too big.
    swept: u64,
}

impl Told {
    fn add(&mut self, other: Told) {
        self.admitted += other.admitted;
        self.rejected += other.rejected;
        self.cancelled += other.cancelled;
        self.swept += other.swept;
    }
}

/// A review probe, kept: blocking and async waiters of one exact sliding window, each giving up
/// after a random time limit, while `try_acquire` callers keep trying and a reconfiguration
/// flips the limit between 3 and 5 under them (real threads, a real clock). Nothing is admitted
/// beyond the larger limit in any window; a request that fits both limits is never told it can
/// never fit (only 4 or 5 permits fail with `InsufficientCapacity`, when a lowering sweeps them);
/// the queue ends empty; and each caller's answer is what the statistics count: admitted,
/// rejected (refused, too big) or cancelled (`Timeout`).
#[test]
fn blocking_and_async_rate_waiters_that_give_up_under_limit_flips_never_over_admit() {
    const HIGH: u32 = 5;
    const LOW: u32 = 3;
    const CALLS: u64 = 1_500;
    let window = Duration::from_millis(3);
    let sliding = |limit| Algorithm::SlidingWindow { limit, window };
    let limiter = RateLimiter::builder(sliding(HIGH))
        .clock(MonotonicClock::new())
        .max_limit(HIGH)
        .build()
        .unwrap();
    // One waiting call: tallies its answer, and returns its admission.
    fn tally(
        n: u32,
        outcome: Result<Admission, AcquireError>,
        told: &mut Told,
    ) -> Option<Admission> {
        match outcome {
            Ok(admission) => {
                told.admitted += 1;
                return Some(admission);
            }
            Err(AcquireError::Timeout) => told.cancelled += 1,
            Err(AcquireError::InsufficientCapacity { requested, .. }) => {
                assert!(
                    requested > LOW,
                    "{n} permits fit either limit, told they never will"
                );
                told.rejected += 1;
                told.swept += 1;
            }
            Err(other) => panic!("{n} permits: {other:?}"),
        }
        None
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let (mut admissions, told) = std::thread::scope(|s| {
        s.spawn(|| {
            let mut flips = 0u32;
            while !done.load(Ordering::Relaxed) {
                let to = if flips.is_multiple_of(2) { LOW } else { HIGH };
                limiter.reconfigure(sliding(to)).unwrap();
                flips += 1;
                std::thread::sleep(Duration::from_micros(700));
            }
        });
        let trier = s.spawn(|| {
            let (mut mine, mut told) = (Vec::new(), Told::default());
            let mut rng = Rng::new(5);
            while !done.load(Ordering::Relaxed) {
                let n = rng.below(u64::from(LOW) + 1) as u32;
                match limiter.try_acquire_n(n) {
                    Ok(a) => {
                        told.admitted += 1;
                        mine.push((a.at_nanos(), u64::from(n)));
                    }
                    Err(_) => told.rejected += 1,
                }
                std::thread::sleep(Duration::from_micros(50));
            }
            (mine, told)
        });
        let blockers: Vec<_> = (0..2u64)
            .map(|t| {
                let limiter = &limiter;
                s.spawn(move || {
                    let (mut mine, mut told) = (Vec::new(), Told::default());
                    let mut rng = Rng::new(100 + t);
                    for _ in 0..CALLS {
                        let n = rng.below(u64::from(HIGH) + 1) as u32;
                        let limit = Duration::from_micros(rng.below(3_000));
                        let outcome = limiter.acquire_blocking_timeout(n, limit);
                        if let Some(a) = tally(n, outcome, &mut told) {
                            mine.push((a.at_nanos(), u64::from(n)));
                        }
                    }
                    (mine, told)
                })
            })
            .collect();
        let tasks: Vec<_> = runtime.block_on(async {
            let tasks: Vec<_> = (0..4u64)
                .map(|t| {
                    let limiter = limiter.clone();
                    tokio::spawn(async move {
                        let (mut mine, mut told) = (Vec::new(), Told::default());
                        let mut rng = Rng::new(t);
                        for _ in 0..CALLS {
                            let n = rng.below(u64::from(HIGH) + 1) as u32;
                            let limit = Duration::from_micros(rng.below(3_000));
                            let outcome = limiter.acquire_timeout(n, limit).await;
                            if let Some(a) = tally(n, outcome, &mut told) {
                                mine.push((a.at_nanos(), u64::from(n)));
                            }
                        }
                        (mine, told)
                    })
                })
                .collect();
            let mut all = Vec::new();
            for task in tasks {
                all.push(task.await.unwrap());
            }
            all
        });
        let mut all = tasks;
        all.extend(blockers.into_iter().map(|b| b.join().unwrap()));
        done.store(true, Ordering::Relaxed);
        all.push(trier.join().unwrap());
        let mut admissions = Vec::new();
        let mut told = Told::default();
        for (mine, t) in all {
            admissions.extend(mine);
            told.add(t);
        }
        (admissions, told)
    });
    admissions.sort_unstable();
    let stats = limiter.stats();
    assert_eq!(
        (stats.waiting, stats.queued_permits),
        (0, 0),
        "queue not empty"
    );
    assert_eq!(
        (stats.admitted, stats.rejected, stats.cancelled),
        (told.admitted, told.rejected, told.cancelled),
        "the statistics count other answers than the callers were given"
    );
    assert!(told.admitted > 500 && told.cancelled > 500, "{told:?}");
    assert!(told.swept > 0, "no lowering ever swept a waiter: {told:?}");
    assert_eq!(common::sliding_violations(&admissions, HIGH, window), 0);
}

// A `Waker` may panic in `wake`. A served head wakes the next head in the same poll in which it
// takes its permits; if that wake panics, the unwind must not carry the permits away with it.

#[test]
fn a_panicking_waker_of_the_next_waiter_does_not_cost_the_served_head_its_permit() {
    // Two permits freed at once, so that the served head has one to pass on: it wakes the next
    // head only if a permit is free for it.
    let limiter = ConcurrencyLimiter::new(2).unwrap();
    let held = limiter.try_acquire_n(2).unwrap();
    let mut head = Box::pin(limiter.acquire());
    let mut next = Box::pin(limiter.acquire());
    assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
    assert!(poll_with(next.as_mut(), &panicky()).is_pending());
    drop(held);
    // The head takes the permit, then wakes `next`, whose waker panics.
    must_panic(|| {
        let _ = poll_with(head.as_mut(), Waker::noop());
    });
    drop((head, next));
    assert_eq!(
        limiter.available(),
        2,
        "the permit went down with the panic"
    );
    let stats = limiter.stats();
    assert_eq!(stats.waiting, 0);
    // `held` admitted; the panicked head and the dropped `next` gave up their waits.
    assert_eq!((stats.admitted, stats.rejected, stats.cancelled), (1, 0, 2));
}

#[test]
fn a_panicking_waker_of_the_next_blocking_waiter_does_not_cost_the_served_head_its_permit() {
    // As above: two permits freed, one for the next head.
    let limiter = ConcurrencyLimiter::new(2).unwrap();
    let held = limiter.try_acquire_n(2).unwrap();
    let mut next = Box::pin(limiter.acquire());
    std::thread::scope(|scope| {
        let head = scope.spawn(|| limiter.acquire_blocking().map(drop));
        while limiter.stats().waiting < 1 {
            std::thread::yield_now();
        }
        assert!(poll_with(next.as_mut(), &panicky()).is_pending());
        drop(held);
        // The blocking head is served, wakes `next`, and unwinds.
        assert!(head.join().is_err());
    });
    drop(next);
    assert_eq!(limiter.available(), 2);
    assert_eq!(limiter.stats().waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_waker_of_the_next_waiter_does_not_cost_the_served_head_its_admission() {
    let window = Duration::from_secs(1);
    let limiter = RateLimiter::with_clock(
        Algorithm::FixedWindow { limit: 1, window },
        TokioClock::new(),
    )
    .unwrap();
    limiter.try_acquire().unwrap();
    let mut head = Box::pin(limiter.acquire());
    let mut next = Box::pin(limiter.acquire());
    assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
    assert!(poll_with(next.as_mut(), &panicky()).is_pending());
    tokio::time::advance(window).await;
    // The head is admitted in the new window, then wakes `next`, whose waker panics.
    must_panic(|| {
        let _ = poll_with(head.as_mut(), Waker::noop());
    });
    drop((head, next));
    assert_eq!(
        limiter.stats().available,
        1,
        "the admission went down with the panic"
    );
    assert!(limiter.try_acquire().is_ok());
}

/// A served head whose wake-up of the next waiter panics gives its admission back; a chain
/// caller that looked at the limiter in between (here from inside the panicking `Waker`, as a
/// thread of its own could) and went to sleep until the next window is told, as a chain's own
/// refund tells it, and admitted after its backoff. Before, the give-back told no chain caller:
/// it slept out the window with the permit free.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_served_heads_give_back_after_a_waker_panic_wakes_the_chain_callers() {
    let window = Duration::from_secs(10);
    let limiter = RateLimiter::with_clock(
        Algorithm::FixedWindow { limit: 1, window },
        TokioClock::new(),
    )
    .unwrap();
    let roomy = RateLimiter::with_clock(
        Algorithm::FixedWindow { limit: 100, window },
        TokioClock::new(),
    )
    .unwrap();
    let chain = turnstile::Chain::new([roomy, limiter.clone()]).unwrap();
    limiter.try_acquire().unwrap();
    let caller: Call<_> = Box::pin(async move { chain.acquire().await.map(|a| a.at()) });
    let served = wakers::give_back_after_a_handover_panic(
        limiter.acquire(),
        limiter.acquire(),
        caller,
        window,
    )
    .await;
    assert!(
        matches!(served, Poll::Ready(Ok(at)) if at == window + Duration::from_millis(1)),
        "{served:?}: the chain caller sleeps until 20 s with the permit free"
    );
}

// A guard or a waiting future dropped by a panic in the code that held it wakes the next party
// from inside that unwind. If that party's `Waker` panics too, the panic must not leave the drop:
// a panic in a destructor during unwinding aborts the process.

#[test]
fn a_permit_dropped_by_an_unwinding_holder_wakes_a_panicking_head_without_aborting() {
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire().unwrap();
    let mut head = Box::pin(limiter.acquire());
    assert!(poll_with(head.as_mut(), &panicky()).is_pending());
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _held = held;
        panic!("user code panics while holding a permit");
    }));
    let payload = unwound.expect_err("the user's panic was not propagated");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"user code panics while holding a permit"),
        "the panic that reached catch_unwind is not the user's"
    );
    let Poll::Ready(Ok(permit)) = poll_with(head.as_mut(), Waker::noop()) else {
        panic!("the head was not served by the permit the unwinding holder gave back");
    };
    assert_eq!(limiter.available(), 0);
    drop(permit);
    assert_eq!(limiter.available(), 1);
    assert_eq!(limiter.stats().waiting, 0);
}

#[test]
fn a_waiting_future_dropped_by_an_unwinding_task_wakes_a_panicking_head_without_aborting() {
    let limiter = ConcurrencyLimiter::new(1).unwrap();
    let held = limiter.try_acquire().unwrap();
    let mut head = Box::pin(limiter.acquire());
    let mut next = Box::pin(limiter.acquire());
    assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
    assert!(poll_with(next.as_mut(), &panicky()).is_pending());
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _head = head;
        panic!("user code panics while its acquire waits");
    }));
    let payload = unwound.expect_err("the user's panic was not propagated");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"user code panics while its acquire waits"),
        "the panic that reached catch_unwind is not the user's"
    );
    // `next` is the head now; it is served by the next release.
    assert!(poll_with(next.as_mut(), Waker::noop()).is_pending());
    drop(held);
    let Poll::Ready(Ok(permit)) = poll_with(next.as_mut(), Waker::noop()) else {
        panic!("the new head was not served");
    };
    drop((permit, next));
    assert_eq!(limiter.available(), 1);
    let stats = limiter.stats();
    assert_eq!(stats.waiting, 0);
    // `held` and `next` admitted; the dropped head gave up its wait.
    assert_eq!((stats.admitted, stats.rejected, stats.cancelled), (2, 0, 1));
}

/// A served head whose handover unwinds gives its admission back; the next waiter, which looked
/// in between (from inside its own `Waker`, as its task polled on another thread could, before
/// that `Waker` panicked) and went to sleep until the next window, is woken by the give-back,
/// and admitted at once. Before, the give-back woke no waiter: the next head slept out the
/// window with the permit free, and `try_acquire` deferred to it all that time.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_served_heads_give_back_after_a_waker_panic_wakes_the_next_head() {
    let window = Duration::from_secs(10);
    let limiter = RateLimiter::with_clock(
        Algorithm::FixedWindow { limit: 1, window },
        TokioClock::new(),
    )
    .unwrap();
    limiter.try_acquire().unwrap();
    let mut head = Box::pin(limiter.acquire());
    assert!(poll_with(head.as_mut(), Waker::noop()).is_pending());
    let l = limiter.clone();
    let next: Call<_> = Box::pin(async move { l.acquire().await.map(|a| a.at()) });
    let (woken, next_waker) = wakers::counting();
    let hook = wakers::PollThenPanic::new(next, next_waker);
    assert!(hook.poll(&Waker::from(Arc::clone(&hook))).is_pending());
    tokio::time::advance(window).await;
    // The head is admitted, wakes `next`, which looks (the permit is the head's: it sleeps
    // until 20 s), and the wake panics: the head gives its admission back.
    must_panic(|| {
        let _ = poll_with(head.as_mut(), Waker::noop());
    });
    drop(head);
    assert_eq!(limiter.stats().available, 1);
    assert_eq!(woken.wakes(), 1, "the give-back wakes the next head");
    assert_eq!(hook.poll(Waker::noop()), Poll::Ready(Ok(window)));
}
