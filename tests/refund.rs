//! `try_acquire_refundable`, its waiting counterparts (`acquire_refundable` and its timeout and
//! blocking variants) and the receipts' `refund` (`src/refund.rs`): what comes back, per
//! algorithm and over time; what never does (after a reconfiguration, a reset, an eviction);
//! who is woken; what is counted. Time is a `ManualClock`, or tokio's paused clock for waiters.

mod common;

use common::algorithms::{SECOND, bucket, counter, fixed, of_kind, sliding};

use proptest::prelude::*;
use std::time::Duration;
use turnstile::{
    Admission, Algorithm, Chain, KeyOverflow, KeyedLimiter, ManualClock, Rate, RateLimiter,
    TryAcquireError,
};

fn limiter(algorithm: Algorithm) -> (RateLimiter<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(algorithm, clock.clone()).unwrap();
    (limiter, clock)
}

/// Every later decision of `a` and `b`, one permit at a time, at the same clock times.
fn same_decisions(
    (a, a_clock): &(RateLimiter<ManualClock>, ManualClock),
    (b, b_clock): &(RateLimiter<ManualClock>, ManualClock),
) {
    for step in 0..40 {
        let (x, y) = (a.try_acquire(), b.try_acquire());
        assert_eq!(
            format!("{x:?}"),
            format!("{y:?}"),
            "decision {step} differs from the twin's"
        );
        a_clock.advance(SECOND / 4);
        b_clock.advance(SECOND / 4);
    }
}

/// With the clock where it was at the admission, the fixed window, the sliding counter and the
/// token bucket are left exactly as if the refunded admission had never happened, whatever was
/// admitted around it: every later decision equals a twin's that never made it.
#[test]
fn a_refund_on_an_unmoved_clock_is_exact() {
    for algorithm in [fixed(5), counter(5), bucket(5)] {
        let refunded = limiter(algorithm);
        let twin = limiter(algorithm);
        for (limiter, clock) in [&refunded, &twin] {
            clock.advance(3 * SECOND);
            limiter.try_acquire_n(2).unwrap();
        }
        let taken = refunded.0.try_acquire_refundable(2).unwrap();
        assert_eq!(taken.permits(), 2);
        assert_eq!(taken.admission().remaining(), 1);
        refunded.0.try_acquire().unwrap();
        twin.0.try_acquire().unwrap();
        taken.refund();
        assert_eq!(
            refunded.0.stats().available,
            twin.0.stats().available,
            "{algorithm:?}"
        );
        same_decisions(&refunded, &twin);
    }
}

/// Later, a refund gives back only what the admission still weighs: the fixed window nothing
/// once its window has ended (the next window is not credited), the token bucket the part of
/// `n·T` not yet replenished.
#[test]
fn a_later_refund_gives_back_only_what_still_weighs() {
    // Fixed window: within the window, all of it; after, nothing.
    let (l, clock) = limiter(fixed(3));
    let within = l.try_acquire_refundable(2).unwrap();
    clock.advance(9 * SECOND);
    within.refund();
    assert_eq!(l.stats().available, 3, "refunded within its window");
    let late = l.try_acquire_refundable(3).unwrap();
    clock.advance(SECOND); // the next window
    l.try_acquire_n(3).unwrap();
    late.refund();
    assert!(
        matches!(l.try_acquire(), Err(TryAcquireError::Rejected(_))),
        "a refund from the previous window credited this one"
    );

    // Token bucket, one token a second, burst 4: 2 taken at 0 to be refunded, 2 kept. At 1.5 s
    // the bucket has replenished 1.5 of the 2 refunded tokens' time: the refund gives back the
    // other 0.5 s. Free then: 2 (1.5 without the refund, 3.5 had the 2 never been taken).
    let (l, clock) = limiter(bucket(4));
    let taken = l.try_acquire_refundable(2).unwrap();
    l.try_acquire_n(2).unwrap();
    clock.advance(SECOND * 3 / 2);
    taken.refund();
    l.try_acquire_n(2).unwrap();
    match l.try_acquire() {
        Err(TryAcquireError::Rejected(r)) => assert_eq!(r.retry_after(), SECOND),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// The exact sliding window's refund is positional: nothing comes back before the ring's turn
/// reaches the refunded tickets, and then the admissions in their places do not wait for them.
/// Never looser than the log without them: the twin below never made the refunded admission.
#[test]
fn a_sliding_window_refund_frees_its_place_in_the_ring() {
    let refunded = limiter(sliding(3));
    let twin = limiter(sliding(3));
    refunded.0.try_acquire().unwrap();
    twin.0.try_acquire().unwrap();
    refunded.1.advance(SECOND);
    twin.1.advance(SECOND);
    let taken = refunded.0.try_acquire_refundable(1).unwrap();
    refunded.0.try_acquire().unwrap();
    twin.0.try_acquire().unwrap();
    taken.refund();
    // The twin has a free permit now; the refunded limiter waits for the ticket at 0 s.
    assert!(twin.0.try_acquire_n(0).is_ok());
    match refunded.0.try_acquire() {
        Err(TryAcquireError::Rejected(r)) => assert_eq!(r.retry_after(), 9 * SECOND),
        other => panic!("expected a rejection, got {other:?}"),
    }
    refunded.1.advance(9 * SECOND);
    // At 10 s the ticket at 0 s has expired: the next takes its place, and the one after that
    // takes the refunded ticket's place without waiting until 11 s.
    refunded.0.try_acquire().unwrap();
    refunded.0.try_acquire().unwrap();
    assert!(refunded.0.try_acquire().is_err(), "three within 10 s");
}

/// A reconfiguration between the admission and the refund: nothing is given back (the
/// admission was decided under other parameters), for every algorithm.
#[test]
fn nothing_comes_back_across_a_reconfiguration() {
    for (before, after) in [
        (fixed(4), fixed(5)),
        (counter(4), counter(5)),
        (bucket(4), bucket(5)),
        (sliding(4), sliding(5)),
    ] {
        let l = RateLimiter::builder(before)
            .max_limit(8)
            .clock(ManualClock::new())
            .build()
            .unwrap();
        let taken = l.try_acquire_refundable(4).unwrap();
        l.reconfigure(after).unwrap();
        let available = l.stats().available;
        taken.refund();
        assert_eq!(l.stats().available, available, "{before:?}");
    }
}

#[test]
fn refundable_calls_are_counted_as_calls_and_refunds_are_not() {
    let (l, _clock) = limiter(fixed(2));
    let taken = l.try_acquire_refundable(2).unwrap();
    assert!(matches!(
        l.try_acquire_refundable(1),
        Err(TryAcquireError::Rejected(_))
    ));
    assert!(matches!(
        l.try_acquire_refundable(3),
        Err(TryAcquireError::InsufficientCapacity { .. })
    ));
    taken.refund();
    let stats = l.stats();
    assert_eq!((stats.admitted, stats.rejected), (1, 2));
    l.close();
    assert!(matches!(
        l.try_acquire_refundable(1),
        Err(TryAcquireError::Closed)
    ));
}

/// A keyed refund goes back to its key and no other, exactly on an unmoved clock.
#[test]
fn a_keyed_refund_goes_back_to_its_key() {
    for algorithm in [fixed(3), counter(3), bucket(3)] {
        let l = KeyedLimiter::with_clock(algorithm, ManualClock::new()).unwrap();
        let taken = l.try_acquire_refundable(&"a", 3).unwrap();
        assert_eq!(*taken.key(), "a");
        l.try_acquire_n(&"b", 3).unwrap();
        taken.refund();
        assert_eq!(l.available(&"a"), 3, "{algorithm:?}");
        assert_eq!(l.available(&"b"), 0, "{algorithm:?}");
        l.try_acquire_n(&"a", 3).unwrap();
    }
}

/// A reset of the key between the admission and the refund: the key's cell may be a new one
/// that never held the admission, so nothing is given back.
#[test]
fn a_keyed_refund_after_a_reset_of_its_key_gives_nothing() {
    let l = KeyedLimiter::with_clock(fixed(3), ManualClock::new()).unwrap();
    let taken = l.try_acquire_refundable(&1, 2).unwrap();
    l.reset(&1);
    l.try_acquire_n(&1, 3).unwrap();
    taken.refund();
    assert_eq!(l.available(&1), 0, "the refund credited the key's new cell");
}

/// The key's cell evicted (its admissions expired) and made again: the refund finds nothing
/// of its admission there and writes nothing.
#[test]
fn a_keyed_refund_after_its_key_was_evicted_gives_nothing() {
    for algorithm in [fixed(3), counter(3), bucket(3), sliding(3)] {
        let clock = ManualClock::new();
        let l = KeyedLimiter::with_clock(algorithm, clock.clone()).unwrap();
        let taken = l.try_acquire_refundable(&1, 3).unwrap();
        clock.advance(30 * SECOND);
        assert_eq!(l.sweep(), 1, "{algorithm:?}: the idle key is evicted");
        l.try_acquire_n(&1, 3).unwrap();
        taken.refund();
        assert_eq!(
            l.available(&1),
            0,
            "{algorithm:?}: the new cell was credited"
        );
    }
}

/// At the key cap with the shared overflow cell, an admission the overflow cell made is
/// refunded there.
#[test]
fn an_overflow_admission_is_refunded_to_the_overflow_cell() {
    let l = KeyedLimiter::builder(fixed(2))
        .clock(ManualClock::new())
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap();
    l.try_acquire_n(&1, 2).unwrap();
    let taken = l.try_acquire_refundable(&2, 2).unwrap(); // on the overflow cell
    assert!(l.try_acquire(&3).is_err(), "the overflow cell is spent");
    taken.refund();
    l.try_acquire_n(&3, 2).unwrap();
    assert_eq!(l.available(&1), 0, "key 1's own cell was credited");
}

/// A reset voids a keyed refund because the key's cell may be a new one; the shared overflow
/// cell is never reset, so a refund of its admission is made across a reset (of any key, the
/// refunded one included), as the docs say.
#[test]
fn a_reset_leaves_a_refund_to_the_overflow_cell_whole() {
    for algorithm in [fixed(2), counter(2), bucket(2), sliding(2)] {
        let l = KeyedLimiter::builder(algorithm)
            .clock(ManualClock::new())
            .max_keys(1)
            .overflow(KeyOverflow::Shared)
            .build()
            .unwrap();
        l.try_acquire(&1).unwrap(); // holds the only key slot, busy
        let taken = l.try_acquire_refundable(&2, 2).unwrap(); // on the overflow cell
        assert!(!l.reset(&2), "key 2 has no cell of its own");
        assert!(!l.reset(&3));
        taken.refund();
        l.try_acquire_n(&3, 2)
            .unwrap_or_else(|e| panic!("{algorithm:?}: the overflow cell got nothing: {e:?}"));
    }
}

/// The shared overflow cell's waiters wait in their own keys' queues: a refund that gives the
/// overflow cell its permits back wakes them, not only the refunded key's queue (which has no
/// waiter here), or they sleep out the cell's `retry_after` (two windows for the sliding
/// counter) with the permit free.
#[tokio::test(start_paused = true)]
async fn an_overflow_refund_wakes_the_waiters_of_other_overflow_keys() {
    for algorithm in [fixed(1), counter(1), bucket(1), sliding(1)] {
        let l = one_key_slot_shared(algorithm);
        l.try_acquire(&"own").unwrap(); // holds the only key slot, busy
        let taken = l.try_acquire_refundable(&"a", 1).unwrap(); // on the overflow cell
        let why = format!("{algorithm:?}: the overflow key's waiter slept out its timer");
        refund_serves_b_at_once(&l, taken, &why).await;
    }
}

/// A keyed limiter on tokio's clock with one key slot and the shared overflow cell.
fn one_key_slot_shared(algorithm: Algorithm) -> KeyedLimiter<&'static str, turnstile::TokioClock> {
    KeyedLimiter::builder(algorithm)
        .clock(turnstile::TokioClock::new())
        .max_keys(1)
        .overflow(KeyOverflow::Shared)
        .build()
        .unwrap()
}

/// Queues a waiter for key "b" on `l`, refunds `taken`, and asserts that the waiter is served
/// at once (`why` says what it would have slept through).
async fn refund_serves_b_at_once<S>(
    l: &KeyedLimiter<&'static str, turnstile::TokioClock, S>,
    taken: turnstile::KeyedRefundable<&'static str, turnstile::TokioClock, S>,
    why: &str,
) where
    S: std::hash::BuildHasher + Clone + Send + Sync + 'static,
{
    let waiter = {
        let l = l.clone();
        tokio::spawn(async move { l.acquire(&"b").await.map(drop) })
    };
    tokio::task::yield_now().await;
    assert_eq!(l.stats().waiting, 1, "{why}");
    let start = tokio::time::Instant::now();
    taken.refund();
    waiter.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "{why}");
}

/// A refund that leaves a key's own cell idle (its only admission given back) frees that key's
/// slot under the key cap, as a reset does: a waiter of a key past the cap, waiting on the full
/// shared overflow cell, is woken and served at once on a cell of its own. Before, only the
/// refunded key's queue was woken: the waiter slept out the shared cell's `retry_after` (a
/// window) while a newcomer's `try_acquire` took the slot at once.
#[tokio::test(start_paused = true)]
async fn a_refund_that_frees_room_under_the_key_cap_wakes_an_overflow_keys_waiter() {
    for algorithm in [fixed(1), counter(1), bucket(1)] {
        let l = one_key_slot_shared(algorithm);
        // Mid-window: the refund leaves the cell idle, not as fresh as a new one.
        tokio::time::advance(SECOND / 2).await;
        let taken = l.try_acquire_refundable(&"own", 1).unwrap(); // the only key slot
        l.try_acquire(&"a").unwrap(); // the shared cell, full
        let why = format!("{algorithm:?}: the overflow key's waiter slept with a key slot free");
        refund_serves_b_at_once(&l, taken, &why).await;
        assert_eq!(
            l.available(&"b"),
            0,
            "{algorithm:?}: served on a cell of its own"
        );
    }
}

/// A waiter queued on the limiter is woken by the refund, without waiting for its timer.
#[tokio::test(start_paused = true)]
async fn a_refund_wakes_the_waiter_it_frees_a_permit_for() {
    let l = RateLimiter::builder(fixed(1))
        .clock(turnstile::TokioClock::new())
        .build()
        .unwrap();
    let taken = l.try_acquire_refundable(1).unwrap();
    let waiter = {
        let l = l.clone();
        tokio::spawn(async move { l.acquire().await.map(|a| a.at()) })
    };
    tokio::task::yield_now().await;
    assert_eq!(l.stats().waiting, 1);
    let start = tokio::time::Instant::now();
    taken.refund();
    let at = waiter.await.unwrap().unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the waiter slept out its timer"
    );
    assert_eq!(at, Duration::ZERO);
}

/// The same for a key's queue.
#[tokio::test(start_paused = true)]
async fn a_keyed_refund_wakes_the_keys_waiter() {
    let l = KeyedLimiter::builder(fixed(1))
        .clock(turnstile::TokioClock::new())
        .build()
        .unwrap();
    let taken = l.try_acquire_refundable(&"k", 1).unwrap();
    let waiter = {
        let l = l.clone();
        tokio::spawn(async move { l.acquire(&"k").await.map(|a| a.at()) })
    };
    tokio::task::yield_now().await;
    let start = tokio::time::Instant::now();
    taken.refund();
    waiter.await.unwrap().unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "the waiter slept out its timer"
    );
}

/// A chain caller sleeping on a member is told of a refund made on that member directly.
#[tokio::test(start_paused = true)]
async fn a_refund_wakes_a_chain_caller_sleeping_on_the_limiter() {
    let l = RateLimiter::builder(fixed(1))
        .clock(turnstile::TokioClock::new())
        .build()
        .unwrap();
    let chain = Chain::new([l.clone()]).unwrap();
    let taken = l.try_acquire_refundable(1).unwrap();
    let caller = tokio::spawn(async move { chain.acquire().await.map(|_| ()) });
    tokio::task::yield_now().await;
    let start = tokio::time::Instant::now();
    taken.refund();
    caller.await.unwrap().unwrap();
    assert!(
        start.elapsed() < 10 * SECOND,
        "the chain caller slept out the window: {:?}",
        start.elapsed()
    );
}

/// A receipt held across 128 reconfigurations (the exact sliding window's token keeps 7 bits of
/// the parameters' version) must still give nothing back: here the window changes make a later
/// lap's ticket, live, hold exactly the word the refund expects in the refunded ticket's slot,
/// and zeroing it admitted a second permit at one instant under a limit of 1.
#[test]
fn a_sliding_window_refund_after_128_reconfigurations_gives_nothing() {
    let window = |secs| Algorithm::SlidingWindow {
        limit: 1,
        window: secs * SECOND,
    };
    let (l, clock) = limiter(window(10));
    let taken = l.try_acquire_refundable(1).unwrap(); // ticket 0 at 0 s, expires at 10 s
    clock.advance(10 * SECOND);
    l.try_acquire().unwrap(); // ticket 1 at 10 s, expires at 20 s
    clock.advance(10 * SECOND);
    l.reconfigure(window(5)).unwrap();
    l.try_acquire().unwrap(); // ticket 2 at 20 s, expires at 25 s: ticket 0's slot and parity
    for _ in 0..126 {
        l.reconfigure(window(5)).unwrap();
    }
    // The 128th: a refund of ticket 0 now expects expiry 0 s + 25 s, ticket 2's.
    l.reconfigure(window(25)).unwrap();
    taken.refund();
    assert!(
        matches!(l.try_acquire(), Err(TryAcquireError::Rejected(_))),
        "a second permit at 20 s under a limit of 1"
    );
}

/// A charge saturates the fixed window's and the sliding counter's 32-bit count, so past that
/// point the count no longer holds every admission; a refund must not subtract from it. With a
/// limit above 2^31 the refunded admission's permits were then handed out again although the
/// charge alone covers the whole limit.
#[test]
fn a_refund_after_a_charge_saturated_the_count_gives_nothing() {
    const LIMIT: u32 = 3_000_000_000;
    for algorithm in [
        Algorithm::FixedWindow {
            limit: LIMIT,
            window: 10 * SECOND,
        },
        Algorithm::SlidingCounter {
            limit: LIMIT,
            window: 10 * SECOND,
        },
    ] {
        let (l, _clock) = limiter(algorithm);
        let taken = l.try_acquire_refundable(LIMIT).unwrap();
        l.charge(LIMIT).unwrap(); // the count saturates at u32::MAX
        taken.refund();
        // The twin that never took the refunded permits holds the charge of LIMIT: nothing is free.
        assert!(
            matches!(
                l.try_acquire_n(1_000_000_000),
                Err(TryAcquireError::Rejected(_))
            ),
            "{algorithm:?}: the charge alone fills the window"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Exactness under refunds at any age: what stays admitted never breaks the algorithm's contract.

/// One step of [`refunds_keep_what_stays_admitted_exact`].
#[derive(Debug, Clone)]
enum Op {
    /// `try_acquire_n`, kept for good.
    Take(u32),
    /// `try_acquire_refundable`, the receipt kept for a later `Refund`.
    Refundable(u32),
    /// Refunds the outstanding receipt at this index (modulo their number), whatever its age.
    Refund(usize),
    /// Moves the clock on, by milliseconds (windows are 10 s).
    Advance(u64),
    /// Reconfigures to the same parameters (a new version, the same contract).
    Reconfigure,
    /// Keyed only: a sweep, which evicts the key once it is idle.
    Sweep,
    /// Keyed only: forgets the key; the audit starts a new segment.
    Reset,
    /// `charge`: recorded whatever the limit (only [`charged_violations`] audits runs with it).
    Charge(u32),
    /// `acquire_refundable(n)`, polled by hand after every step until the queue serves it; its
    /// receipt then joins the others.
    Wait(u32),
    /// `acquire_blocking_refundable_timeout(n, 0)`: the fast path, or one look as the head.
    WaitBlocking(u32),
    /// Drops every waiter still queued (cancelled waits hold nothing).
    Cancel,
}

/// One step, with charges of up to `limit + 2` permits at weight `charges` (0: none).
fn op_charging(limit: u32, charges: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        charges => (1..=limit + 2).prop_map(Op::Charge),
        3 => (1..=limit).prop_map(Op::Take),
        4 => (1..=limit).prop_map(Op::Refundable),
        4 => any::<usize>().prop_map(Op::Refund),
        2 => (0u64..3_000).prop_map(Op::Advance),
        1 => (3_000u64..25_000).prop_map(Op::Advance),
        1 => Just(Op::Reconfigure),
        1 => Just(Op::Sweep),
        1 => Just(Op::Reset),
        // One arm (a union of more than ten arms refuses the weight 0 of `charges`).
        4 => prop_oneof![
            2 => (1..=limit).prop_map(Op::Wait),
            1 => (1..=limit).prop_map(Op::WaitBlocking),
            1 => Just(Op::Cancel),
        ],
    ]
}

/// A waiting call's future, polled by hand.
type Waiting<'a, R> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<R, turnstile::AcquireError>> + 'a>>;

/// Polls every waiter once, oldest first (a head served hands the turn to the next, which this
/// same pass polls), and returns the receipts of those served; failed ones are dropped.
fn poll_waiters<'a, R>(waiters: &mut Vec<Waiting<'a, R>>) -> Vec<R> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut served = Vec::new();
    waiters.retain_mut(|w| match std::future::Future::poll(w.as_mut(), &mut cx) {
        std::task::Poll::Ready(outcome) => {
            served.extend(outcome.ok());
            false
        }
        std::task::Poll::Pending => true,
    });
    served
}

/// A tokio runtime on paused time, for the timer a head waiter arms (it never fires: the
/// waiters are polled by hand, on the `ManualClock`).
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// The admissions of one reset-free stretch, as `(at, permits)`; a refunded one is `None`.
#[derive(Default)]
struct Audit {
    segments: Vec<Vec<Option<(u64, u64)>>>,
    /// Per segment, which entries are charges (never audited themselves).
    charged: Vec<Vec<bool>>,
}

impl Audit {
    fn admit(&mut self, admission: &Admission, n: u32) -> (usize, usize) {
        self.record(admission, n, false)
    }

    fn record(&mut self, admission: &Admission, n: u32, charge: bool) -> (usize, usize) {
        if self.segments.is_empty() {
            self.reset();
        }
        let segment = self.segments.len() - 1;
        let at = admission.at().as_nanos() as u64;
        self.segments[segment].push(Some((at, u64::from(n))));
        self.charged[segment].push(charge);
        (segment, self.segments[segment].len() - 1)
    }

    fn refunded(&mut self, (segment, index): (usize, usize)) {
        self.segments[segment][index] = None;
    }

    fn reset(&mut self) {
        self.segments.push(Vec::new());
        self.charged.push(Vec::new());
    }

    /// As [`violations`](Self::violations), with charges: they count against later decisions,
    /// but only the admissions are audited.
    fn charged_violations(&self, algorithm: Algorithm) -> usize {
        self.segments
            .iter()
            .zip(&self.charged)
            .map(|(segment, charged)| {
                let kept: Vec<(u64, u64, bool)> = segment
                    .iter()
                    .zip(charged)
                    .filter_map(|(e, &c)| e.map(|(t, n)| (t, n, c)))
                    .collect();
                charged_violations(algorithm, &kept)
            })
            .sum()
    }

    fn violations(&self, algorithm: Algorithm) -> usize {
        self.segments
            .iter()
            .map(|segment| {
                let kept: Vec<(u64, u64)> = segment.iter().flatten().copied().collect();
                common::violations(algorithm, &kept)
            })
            .sum()
    }
}

/// Runs `ops` on an unkeyed limiter (sweeps and resets skipped) and returns the audit.
fn run_unkeyed(algorithm: Algorithm, max_limit: Option<u32>, ops: &[Op]) -> Audit {
    let clock = ManualClock::new();
    let mut builder = RateLimiter::builder(algorithm).clock(clock.clone());
    if let Some(max) = max_limit {
        builder = builder.max_limit(max);
    }
    let l = builder.build().unwrap();
    let runtime = paused_runtime();
    let _entered = runtime.enter();
    let mut audit = Audit::default();
    let mut receipts = Vec::new();
    let mut waiters: Vec<Waiting<'_, _>> = Vec::new();
    for op in ops {
        match *op {
            Op::Take(n) => {
                if let Ok(a) = l.try_acquire_n(n) {
                    audit.admit(&a, n);
                }
            }
            Op::Refundable(n) => {
                if let Ok(r) = l.try_acquire_refundable(n) {
                    let at = audit.admit(&r.admission(), n);
                    receipts.push((r, at));
                }
            }
            Op::Wait(n) => waiters.push(Box::pin(l.acquire_refundable(n))),
            Op::WaitBlocking(n) => {
                if let Ok(r) = l.acquire_blocking_refundable_timeout(n, Duration::ZERO) {
                    let at = audit.admit(&r.admission(), r.permits());
                    receipts.push((r, at));
                }
            }
            Op::Cancel => waiters.clear(),
            Op::Refund(i) if !receipts.is_empty() => {
                let (r, at) = receipts.swap_remove(i % receipts.len());
                r.refund();
                audit.refunded(at);
            }
            Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
            Op::Reconfigure => l.reconfigure(algorithm).unwrap(),
            Op::Charge(n) => {
                let a = l.charge(n).unwrap();
                audit.record(&a, n, true);
            }
            _ => {}
        }
        for r in poll_waiters(&mut waiters) {
            let at = audit.admit(&r.admission(), r.permits());
            receipts.push((r, at));
        }
    }
    audit
}

/// The same on one key of a keyed limiter, with sweeps and resets.
fn run_keyed(algorithm: Algorithm, max_limit: Option<u32>, ops: &[Op]) -> Audit {
    let clock = ManualClock::new();
    let mut builder = KeyedLimiter::builder(algorithm).clock(clock.clone());
    if let Some(max) = max_limit {
        builder = builder.max_limit(max);
    }
    let l = builder.build().unwrap();
    let runtime = paused_runtime();
    let _entered = runtime.enter();
    let mut audit = Audit::default();
    let mut receipts = Vec::new();
    let key = "k";
    let mut waiters: Vec<Waiting<'_, _>> = Vec::new();
    for op in ops {
        match *op {
            Op::Take(n) => {
                if let Ok(a) = l.try_acquire_n(&key, n) {
                    audit.admit(&a, n);
                }
            }
            Op::Refundable(n) => {
                if let Ok(r) = l.try_acquire_refundable(&key, n) {
                    let at = audit.admit(&r.admission(), n);
                    receipts.push((r, at));
                }
            }
            Op::Wait(n) => waiters.push(Box::pin(l.acquire_refundable(&key, n))),
            Op::WaitBlocking(n) => {
                if let Ok(r) = l.acquire_blocking_refundable_timeout(&key, n, Duration::ZERO) {
                    let at = audit.admit(&r.admission(), r.permits());
                    receipts.push((r, at));
                }
            }
            Op::Cancel => waiters.clear(),
            Op::Refund(i) if !receipts.is_empty() => {
                let (r, at) = receipts.swap_remove(i % receipts.len());
                r.refund();
                audit.refunded(at);
            }
            Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
            Op::Reconfigure => l.reconfigure(algorithm).unwrap(),
            Op::Sweep => {
                l.sweep();
            }
            Op::Reset => {
                l.reset(&key);
                audit.reset();
            }
            Op::Charge(n) => {
                let a = l.charge(&key, n).unwrap();
                audit.record(&a, n, true);
            }
            Op::Refund(_) => {}
        }
        for r in poll_waiters(&mut waiters) {
            let at = audit.admit(&r.admission(), r.permits());
            receipts.push((r, at));
        }
    }
    audit
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 800, ..ProptestConfig::default() })]

    /// Random admissions, receipts (from `try_acquire_refundable` and from the waiting calls,
    /// served at once or from the queue) refunded at any age (after their window, after the ring
    /// lapped, after roll-overs, reconfigurations, sweeps and resets), clock advances, and in
    /// half the runs charges (debt, overdrawn logs): the admissions never refunded satisfy the
    /// algorithm's exactness audit; with charges, no admission that stays is one the
    /// never-refunded history, charges included, would have refused.
    #[test]
    fn refunds_keep_what_stays_admitted_exact(
        kind in 0u8..4,
        limit in 1u32..=4,
        wider in any::<bool>(),
        keyed in any::<bool>(),
        ops in (1u32..=4, 0u32..=1).prop_flat_map(|(l, charges)| {
            proptest::collection::vec(op_charging(l, charges), 1..120)
        }),
    ) {
        let algorithm = of_kind(kind, limit);
        let max_limit = (wider && kind == 3).then_some(8);
        let audit = if keyed {
            run_keyed(algorithm, max_limit, &ops)
        } else {
            run_unkeyed(algorithm, max_limit, &ops)
        };
        let violations = if ops.iter().any(|op| matches!(op, Op::Charge(_))) {
            audit.charged_violations(algorithm)
        } else {
            audit.violations(algorithm)
        };
        prop_assert_eq!(violations, 0);
    }
}

fn send_sync<T: Send + Sync>(_: &T) {}

/// Receipts can be handed to another task or thread to be refunded there; a refund on a
/// closed limiter gives the permits back and wakes nobody, without a panic.
#[test]
fn receipts_are_send_and_sync_and_refund_after_close() {
    let (l, _clock) = limiter(fixed(2));
    let taken = l.try_acquire_refundable(2).unwrap();
    send_sync(&taken);
    l.close();
    std::thread::spawn(move || taken.refund()).join().unwrap();
    assert!(matches!(l.try_acquire(), Err(TryAcquireError::Closed)));
    assert_eq!(l.stats().available, 2);

    let k = KeyedLimiter::with_clock(fixed(2), ManualClock::new()).unwrap();
    let taken = k.try_acquire_refundable(&"k", 2).unwrap();
    send_sync(&taken);
    std::thread::spawn(move || taken.refund()).join().unwrap();
    assert_eq!(k.available(&"k"), 2);
}

/// The reset counter a refund checks is the limiter's, not the key's: a reset of any other key
/// between the admission and the refund also makes the refund give nothing back (conservative;
/// the docs say so).
#[test]
fn a_reset_of_another_key_also_makes_a_keyed_refund_give_nothing() {
    let l = KeyedLimiter::with_clock(fixed(3), ManualClock::new()).unwrap();
    let taken = l.try_acquire_refundable(&1, 2).unwrap();
    l.try_acquire(&2).unwrap();
    assert!(l.reset(&2));
    taken.refund();
    assert_eq!(l.available(&1), 1);
}

/// A refundable call is counted as `try_acquire_n` counts the same call: admitted, rejected and
/// overflowed (at the key cap, the shared cell or a `TooManyKeys` refusal).
#[test]
fn refundable_calls_are_counted_as_plain_ones_at_the_key_cap() {
    for overflow in [KeyOverflow::Shared, KeyOverflow::Reject] {
        let make = || {
            KeyedLimiter::builder(fixed(2))
                .clock(ManualClock::new())
                .max_keys(1)
                .overflow(overflow)
                .build()
                .unwrap()
        };
        let (plain, refundable) = (make(), make());
        let mut outcomes = (Vec::new(), Vec::new());
        for key in [1, 2, 2, 2, 1, 1] {
            outcomes
                .0
                .push(format!("{:?}", plain.try_acquire_n(&key, 1)));
            outcomes.1.push(format!(
                "{:?}",
                refundable
                    .try_acquire_refundable(&key, 1)
                    .map(|r| r.admission())
            ));
        }
        assert_eq!(outcomes.0, outcomes.1, "{overflow:?}");
        assert_eq!(
            format!("{:?}", plain.stats()),
            format!("{:?}", refundable.stats()),
            "{overflow:?}"
        );
    }
}

/// The token bucket's charge holds `tat` at 2^63 − 2 ns, where it no longer holds every
/// admission; a refund from there handed out, at the clock's cap (146 years on), a permit the
/// charge alone forbids.
#[test]
fn a_token_bucket_refund_after_a_charge_saturated_tat_gives_nothing() {
    let interval = (1u64 << 61) - 1;
    let (l, clock) = limiter(Algorithm::TokenBucket {
        rate: Rate::new(1, Duration::from_nanos(interval)),
        burst: 2,
    });
    let taken = l.try_acquire_refundable(2).unwrap();
    l.charge(8).unwrap(); // tat saturates
    taken.refund();
    clock.advance(Duration::from_nanos((1 << 62) - 1));
    assert!(
        matches!(l.try_acquire(), Err(TryAcquireError::Rejected(_))),
        "the charge's debt alone outlasts the clock"
    );
}

/// The admissions (not the charges) of `kept`, `(time, permits, charged)` in time order, that the
/// algorithm could not have admitted given every entry before them, charges included: for the
/// windows, the permits in the window (the fixed one, the last `window` for the exact sliding
/// window, the weighted estimate for the counter); for the token bucket, the credit, which a
/// charge may take below zero.
fn charged_violations(algorithm: Algorithm, kept: &[(u64, u64, bool)]) -> usize {
    let mut violations = 0;
    match algorithm {
        Algorithm::FixedWindow { limit, window } => {
            let w = window.as_nanos() as u64;
            let mut per_window = std::collections::HashMap::<u64, u64>::new();
            for &(t, n, charged) in kept {
                let count = per_window.entry(t / w).or_default();
                if !charged && *count + n > u64::from(limit) {
                    violations += 1;
                }
                *count += n;
            }
        }
        Algorithm::SlidingWindow { limit, window } => {
            let w = window.as_nanos() as u64;
            for (i, &(t, n, charged)) in kept.iter().enumerate() {
                let before: u64 = kept[..i]
                    .iter()
                    .filter(|&&(u, _, _)| u + w > t)
                    .map(|&(_, m, _)| m)
                    .sum();
                if !charged && before + n > u64::from(limit) {
                    violations += 1;
                }
            }
        }
        Algorithm::SlidingCounter { limit, window } => {
            let w = u128::from(window.as_nanos() as u64);
            let mut counts = std::collections::HashMap::<u64, u128>::new();
            for &(t, n, charged) in kept {
                let (k, e) = (u128::from(t) / w, u128::from(t) % w);
                let prev = if k == 0 {
                    0
                } else {
                    counts.get(&((k - 1) as u64)).copied().unwrap_or(0)
                };
                let cur = counts.get(&(k as u64)).copied().unwrap_or(0);
                if !charged && prev * (w - e) + (cur + u128::from(n)) * w > u128::from(limit) * w {
                    violations += 1;
                }
                *counts.entry(k as u64).or_default() += u128::from(n);
            }
        }
        Algorithm::TokenBucket { rate, burst } => {
            let interval =
                i128::from((rate.period.as_nanos() as u64).div_ceil(u64::from(rate.permits)));
            let capacity = interval * i128::from(burst);
            let (mut credit, mut last) = (capacity, 0u64);
            for &(t, n, charged) in kept {
                credit = (credit + i128::from(t - last)).min(capacity);
                last = t;
                let cost = i128::from(n) * interval;
                if !charged && credit < cost {
                    violations += 1;
                }
                credit -= cost;
            }
        }
        other => panic!("no contract check for {other:?}"),
    }
    violations
}

// ---------------------------------------------------------------------------------------------
// Receipts from the waiting calls: `acquire_refundable(n).await`, its timeout, and the blocking
// counterparts, served from the fair queue and refunded as a `try_acquire_refundable`'s receipt.

/// A limiter on tokio's paused clock, so that a head waiter's timer and the limiter agree.
fn waiting_limiter(algorithm: Algorithm) -> RateLimiter<turnstile::TokioClock> {
    RateLimiter::builder(algorithm)
        .clock(turnstile::TokioClock::new())
        .build()
        .unwrap()
}

/// Per algorithm: a caller that waited in the queue for its permit, then finds the work
/// unnecessary, gives the permit back, and the next caller gets it at once.
#[tokio::test(start_paused = true)]
async fn a_waiter_served_from_the_queue_gives_its_permit_back() {
    for algorithm in [fixed(1), counter(1), bucket(1), sliding(1)] {
        let l = waiting_limiter(algorithm);
        l.try_acquire().unwrap();
        let start = tokio::time::Instant::now();
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move { l.acquire_refundable(1).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(l.stats().waiting, 1, "{algorithm:?}: the caller queued");
        let taken = waiter.await.unwrap().unwrap();
        assert!(start.elapsed() > Duration::ZERO, "{algorithm:?}");
        assert_eq!(taken.permits(), 1);
        assert_eq!(taken.admission().remaining(), 0, "{algorithm:?}");
        assert!(
            l.try_acquire().is_err(),
            "{algorithm:?}: the waiter holds it"
        );
        taken.refund();
        l.try_acquire()
            .unwrap_or_else(|e| panic!("{algorithm:?}: the refund freed nothing: {e:?}"));
        assert_eq!(l.stats().admitted, 3, "{algorithm:?}");
    }
}

/// The same for a key's queue: the permit goes back to the key.
#[tokio::test(start_paused = true)]
async fn a_keyed_waiter_served_from_the_queue_gives_its_permit_back() {
    for algorithm in [fixed(1), counter(1), bucket(1), sliding(1)] {
        let l = KeyedLimiter::builder(algorithm)
            .clock(turnstile::TokioClock::new())
            .build()
            .unwrap();
        l.try_acquire(&"k").unwrap();
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move { l.acquire_refundable(&"k", 1).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(l.stats().waiting, 1, "{algorithm:?}: the caller queued");
        let taken = waiter.await.unwrap().unwrap();
        assert_eq!((*taken.key(), taken.permits()), ("k", 1));
        assert!(l.try_acquire(&"k").is_err(), "{algorithm:?}");
        taken.refund();
        l.try_acquire(&"k")
            .unwrap_or_else(|e| panic!("{algorithm:?}: the refund freed nothing: {e:?}"));
    }
}

/// The receipt's parameters' version is read at the admission the queue makes, not when the
/// call started: a reconfiguration while it waited does not void the refund of an admission
/// made after it, and one after the admission does.
#[tokio::test(start_paused = true)]
async fn a_queue_served_receipt_is_voided_only_by_a_reconfiguration_after_its_admission() {
    let l = waiting_limiter(fixed(1));
    l.try_acquire().unwrap();
    let waiter = {
        let l = l.clone();
        tokio::spawn(async move { l.acquire_refundable(1).await })
    };
    tokio::task::yield_now().await;
    l.reconfigure(fixed(1)).unwrap();
    let taken = waiter.await.unwrap().unwrap();
    taken.refund();
    assert!(
        l.try_acquire().is_ok(),
        "a reconfiguration before the admission voided it"
    );

    let k = KeyedLimiter::builder(fixed(1))
        .clock(turnstile::TokioClock::new())
        .build()
        .unwrap();
    k.try_acquire(&"k").unwrap();
    let waiter = {
        let k = k.clone();
        tokio::spawn(async move { k.acquire_refundable(&"k", 1).await })
    };
    tokio::task::yield_now().await;
    k.reconfigure(fixed(1)).unwrap();
    let taken = waiter.await.unwrap().unwrap();
    k.reconfigure(fixed(1)).unwrap();
    taken.refund();
    assert!(
        k.try_acquire(&"k").is_err(),
        "refunded across a reconfiguration"
    );
}

/// A receipt from the fast path (nobody queued, permits free) is a receipt too.
#[tokio::test(start_paused = true)]
async fn a_waiting_call_admitted_at_once_gives_a_receipt_too() {
    let l = waiting_limiter(counter(2));
    let taken = l.acquire_refundable(2).await.unwrap();
    taken.refund();
    assert_eq!(l.stats().available, 2);
    let k = KeyedLimiter::builder(counter(2))
        .clock(turnstile::TokioClock::new())
        .build()
        .unwrap();
    let taken = k.acquire_refundable(&7, 2).await.unwrap();
    taken.refund();
    assert_eq!(k.available(&7), 2);
}

/// The timeout variants time out holding nothing: the token bucket's one token accrued while
/// the caller waited for two is there for the next caller.
#[tokio::test(start_paused = true)]
async fn a_refundable_wait_that_times_out_holds_nothing() {
    let rate = Rate::new(1, SECOND);
    let l = waiting_limiter(Algorithm::TokenBucket { rate, burst: 2 });
    l.try_acquire_n(2).unwrap();
    let late = l.acquire_refundable_timeout(2, SECOND).await;
    assert_eq!(late.unwrap_err(), turnstile::AcquireError::Timeout);
    assert_eq!(l.stats().waiting, 0);
    assert_eq!(l.stats().cancelled, 1);
    l.try_acquire().unwrap();

    let k = KeyedLimiter::builder(Algorithm::TokenBucket { rate, burst: 2 })
        .clock(turnstile::TokioClock::new())
        .build()
        .unwrap();
    k.try_acquire_n(&"k", 2).unwrap();
    let late = k.acquire_refundable_timeout(&"k", 2, SECOND).await;
    assert_eq!(late.unwrap_err(), turnstile::AcquireError::Timeout);
    assert_eq!(k.stats().waiting, 0);
    k.try_acquire(&"k").unwrap();
}

/// The blocking counterpart: a thread queued behind a receipt's admission is served when that
/// receipt is refunded (the refund wakes the head; the clock never moves), and its own receipt
/// gives the permit back in turn.
#[test]
fn a_blocking_waiter_served_from_the_queue_gives_its_permit_back() {
    for algorithm in [fixed(1), counter(1), bucket(1), sliding(1)] {
        let (l, _clock) = limiter(algorithm);
        let first = l.try_acquire_refundable(1).unwrap();
        let taken = std::thread::scope(|s| {
            let waiter = s.spawn(|| l.acquire_blocking_refundable(1));
            while l.stats().waiting < 1 {
                std::thread::yield_now();
            }
            first.refund();
            waiter.join().unwrap()
        })
        .unwrap();
        assert!(l.try_acquire().is_err(), "{algorithm:?}");
        taken.refund();
        l.try_acquire()
            .unwrap_or_else(|e| panic!("{algorithm:?}: the refund freed nothing: {e:?}"));
    }
}

/// The same for a key's queue, and the blocking timeouts give up holding nothing.
#[test]
fn a_blocking_keyed_waiter_gives_its_permit_back_and_a_timeout_holds_nothing() {
    let k = KeyedLimiter::with_clock(counter(1), ManualClock::new()).unwrap();
    let first = k.try_acquire_refundable(&"k", 1).unwrap();
    let taken = std::thread::scope(|s| {
        let waiter = s.spawn(|| k.acquire_blocking_refundable(&"k", 1));
        while k.stats().waiting < 1 {
            std::thread::yield_now();
        }
        first.refund();
        waiter.join().unwrap()
    })
    .unwrap();
    assert_eq!(k.available(&"k"), 0);
    assert_eq!(
        k.acquire_blocking_refundable_timeout(&"k", 1, Duration::ZERO)
            .unwrap_err(),
        turnstile::AcquireError::Timeout
    );
    taken.refund();
    assert_eq!(k.available(&"k"), 1);

    let (l, clock) = limiter(fixed(1));
    l.try_acquire().unwrap();
    assert_eq!(
        l.acquire_blocking_refundable_timeout(1, Duration::ZERO)
            .unwrap_err(),
        turnstile::AcquireError::Timeout
    );
    assert_eq!(l.stats().waiting, 0);
    clock.advance(10 * SECOND);
    assert_eq!(l.try_acquire().unwrap().remaining(), 0);
}

/// One step of [`refunds_at_the_key_cap_keep_what_stays_admitted_exact`], on key `key` (0 or 1).
#[derive(Debug, Clone)]
enum KeyOp {
    Take(u8, u32),
    Refundable(u8, u32),
    /// Refunds the outstanding receipt at this index (modulo their number), whatever its age.
    Refund(usize),
    /// Moves the clock on, by milliseconds (windows are 10 s).
    Advance(u64),
    Reconfigure,
    Sweep,
    /// Forgets the key; its audit starts a new segment.
    Reset(u8),
}

fn key_op(limit: u32) -> impl Strategy<Value = KeyOp> {
    prop_oneof![
        3 => (0u8..2, 1..=limit).prop_map(|(k, n)| KeyOp::Take(k, n)),
        4 => (0u8..2, 1..=limit).prop_map(|(k, n)| KeyOp::Refundable(k, n)),
        4 => any::<usize>().prop_map(KeyOp::Refund),
        2 => (0u64..3_000).prop_map(KeyOp::Advance),
        2 => (3_000u64..25_000).prop_map(KeyOp::Advance),
        1 => Just(KeyOp::Reconfigure),
        1 => Just(KeyOp::Sweep),
        1 => (0u8..2).prop_map(KeyOp::Reset),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// Two keys of a limiter that holds one (calls for a new key are refused until the other
    /// is idle, which then makes room by evicting it): receipts of either key refunded at any
    /// age, across evictions and re-creations of their key's cell by the other key's calls,
    /// sweeps, resets of either key and reconfigurations. Each key's admissions never refunded
    /// satisfy the algorithm's exactness audit (a segment per reset of that key): a refund
    /// never lands on a cell made after its admission's.
    #[test]
    fn refunds_at_the_key_cap_keep_what_stays_admitted_exact(
        kind in 0u8..4,
        limit in 1u32..=4,
        ops in proptest::collection::vec(key_op(4), 1..120),
    ) {
        let algorithm = of_kind(kind, limit);
        let clock = ManualClock::new();
        let l = KeyedLimiter::builder(algorithm)
            .clock(clock.clone())
            .max_keys(1)
            .overflow(KeyOverflow::Reject)
            .build()
            .unwrap();
        let mut audits = [Audit::default(), Audit::default()];
        let mut receipts = Vec::new();
        for op in &ops {
            match *op {
                KeyOp::Take(k, n) => {
                    let n = n.min(limit);
                    if let Ok(a) = l.try_acquire_n(&k, n) {
                        audits[usize::from(k)].admit(&a, n);
                    }
                }
                KeyOp::Refundable(k, n) => {
                    let n = n.min(limit);
                    if let Ok(r) = l.try_acquire_refundable(&k, n) {
                        let at = audits[usize::from(k)].admit(&r.admission(), n);
                        receipts.push((r, k, at));
                    }
                }
                KeyOp::Refund(i) if !receipts.is_empty() => {
                    let (r, k, at) = receipts.swap_remove(i % receipts.len());
                    r.refund();
                    audits[usize::from(k)].refunded(at);
                }
                KeyOp::Refund(_) => {}
                KeyOp::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                KeyOp::Reconfigure => l.reconfigure(algorithm).unwrap(),
                KeyOp::Sweep => {
                    l.sweep();
                }
                KeyOp::Reset(k) => {
                    l.reset(&k);
                    audits[usize::from(k)].reset();
                }
            }
        }
        for (k, audit) in audits.iter().enumerate() {
            prop_assert_eq!(audit.violations(algorithm), 0, "key {}", k);
        }
    }
}

/// Extreme parameters: limits and bursts of `u32::MAX`, windows of `u64::MAX` ns, a bucket
/// decades long, and a clock anywhere in its range, past the algorithms' cap of
/// 2^62 ns too (where their time stands still). A receipt given back on an unmoved clock frees
/// what it took (exact), without an overflow; given back at the end of the clock's range, it
/// never leaves more than the limit free.
///
/// Past the cap the token bucket's and the exact sliding window's refunds compared the
/// admission's capped time with the clock's uncapped reading: the clock seemed to have moved
/// by up to 2^63 ns, and nothing came back.
#[test]
fn extreme_parameters_refund_exactly_without_overflow() {
    let longest = Duration::from_nanos(u64::MAX);
    // (algorithm, what a receipt takes): a window of u32::MAX taken one short of full (see
    // `a_full_window_of_u32_max_gives_nothing_back`).
    let cases = [
        (
            Algorithm::FixedWindow {
                limit: u32::MAX,
                window: longest,
            },
            u32::MAX - 1,
        ),
        (
            Algorithm::SlidingCounter {
                limit: u32::MAX,
                window: longest,
            },
            u32::MAX - 1,
        ),
        (
            Algorithm::SlidingWindow {
                limit: 1 << 16,
                window: longest,
            },
            1 << 16,
        ),
        (
            Algorithm::SlidingWindow {
                limit: 2,
                window: 10 * SECOND,
            },
            2,
        ),
        (
            // A bucket 73 years long: the longest, emptied at the capped time, lands on the
            // saturated arrival time of a charge, where a refund gives nothing back (the
            // token bucket's `refund` says so).
            Algorithm::TokenBucket {
                rate: Rate::new(1, Duration::from_nanos(u64::MAX / 8)),
                burst: 1,
            },
            1,
        ),
        (
            Algorithm::TokenBucket {
                rate: Rate::new(u32::MAX, Duration::from_nanos(u64::from(u32::MAX))),
                burst: u32::MAX,
            },
            u32::MAX,
        ),
        (bucket(2), 2),
    ];
    for start in [0, (1 << 62) - 2, 1 << 62, u64::MAX / 2, u64::MAX - 10] {
        for (algorithm, n) in cases {
            let (l, clock) = limiter(algorithm);
            clock.advance(Duration::from_nanos(start));
            let limit = l.capacity();
            let free = l.stats().available;
            let taken = l.try_acquire_refundable(n).unwrap();
            assert_eq!(l.stats().available, free - n, "{algorithm:?} at {start}");
            taken.refund();
            assert_eq!(
                l.stats().available,
                free,
                "{algorithm:?} at {start}: the refund gave back {} of {n}",
                l.stats().available - (free - n)
            );
            let again = l.try_acquire_n(n);
            assert!(again.is_ok(), "{algorithm:?} at {start}: {again:?}");
            // Given back at the end of the clock's range: never more than the limit free.
            let taken = l.try_acquire_refundable(1);
            clock.advance(Duration::MAX);
            if let Ok(taken) = taken {
                taken.refund();
            }
            let free = l.stats().available;
            assert!(free <= limit, "{algorithm:?} at {start}: {free} free");
        }
    }
}

/// A window of limit `u32::MAX` filled to the last permit holds the count a charge saturates
/// at, where the count no longer holds every admission: the two cannot be told apart, so a
/// refund from there gives nothing back (stricter, never looser), as the docs say.
#[test]
fn a_full_window_of_u32_max_gives_nothing_back() {
    let window = 10 * SECOND;
    for algorithm in [
        Algorithm::FixedWindow {
            limit: u32::MAX,
            window,
        },
        Algorithm::SlidingCounter {
            limit: u32::MAX,
            window,
        },
    ] {
        let (l, _clock) = limiter(algorithm);
        let taken = l.try_acquire_refundable(u32::MAX).unwrap();
        taken.refund();
        assert_eq!(l.stats().available, 0, "{algorithm:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// The shared overflow cell: a limiter of one key, held by key 0 and kept busy (charged to
    /// the full after every step that moves the clock), so that keys 1 and 2 are always decided
    /// on the one cell they share. Their receipts refunded at any age, across resets of either
    /// (which never touch the shared cell, so they void none of its refunds), sweeps and
    /// reconfigurations (which void them): the admissions of both keys never refunded satisfy
    /// the algorithm's exactness audit as one cell's.
    #[test]
    fn overflow_refunds_keep_what_stays_admitted_exact(
        kind in 0u8..4,
        limit in 1u32..=4,
        ops in proptest::collection::vec(key_op(4), 1..120),
    ) {
        let algorithm = of_kind(kind, limit);
        let clock = ManualClock::new();
        let l = KeyedLimiter::builder(algorithm)
            .clock(clock.clone())
            .max_keys(1)
            .overflow(KeyOverflow::Shared)
            .build()
            .unwrap();
        let pin = |l: &KeyedLimiter<u8, ManualClock>| l.charge(&0, u32::MAX).unwrap();
        pin(&l);
        let mut audit = Audit::default();
        let mut receipts = Vec::new();
        // Keys 1 and 2 (the ops name 0 and 1).
        let key = |k: u8| k + 1;
        for op in &ops {
            match *op {
                KeyOp::Take(k, n) => {
                    let n = n.min(limit);
                    if let Ok(a) = l.try_acquire_n(&key(k), n) {
                        audit.admit(&a, n);
                    }
                }
                KeyOp::Refundable(k, n) => {
                    let n = n.min(limit);
                    if let Ok(r) = l.try_acquire_refundable(&key(k), n) {
                        let at = audit.admit(&r.admission(), n);
                        receipts.push((r, at));
                    }
                }
                KeyOp::Refund(i) if !receipts.is_empty() => {
                    let (r, at) = receipts.swap_remove(i % receipts.len());
                    r.refund();
                    audit.refunded(at);
                }
                KeyOp::Refund(_) => {}
                KeyOp::Advance(ms) => {
                    clock.advance(Duration::from_millis(ms));
                    pin(&l);
                }
                KeyOp::Reconfigure => l.reconfigure(algorithm).unwrap(),
                KeyOp::Sweep => {
                    l.sweep();
                }
                KeyOp::Reset(k) => {
                    l.reset(&key(k));
                }
            }
        }
        let stats = l.stats();
        prop_assert_eq!((stats.evicted, stats.keys), (0, 1), "key 0 lost its cell");
        prop_assert_eq!(audit.violations(algorithm), 0);
    }
}
