//! A chain's own queue of waiting chain callers (`Chain`, and per key `KeyedChain`): served
//! oldest first, not passed by newcomers, bounded, cancel-safe, shared by async and blocking
//! callers. Time is tokio's paused clock (members on a `TokioClock`), or a `ManualClock` for
//! the blocking callers.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use turnstile::{
    AcquireError, Algorithm, Chain, Clock, KeyedChain, KeyedLimiter, ManualClock, Rate,
    RateLimiter, TokioClock, TryAcquireError,
};

/// One permit a second, bursts of 3, drained at the start: 3 permits take 3 s, 1 takes 1 s.
fn drained_bucket() -> RateLimiter<TokioClock> {
    let bucket = RateLimiter::with_clock(
        Algorithm::TokenBucket {
            rate: Rate::per_second(1),
            burst: 3,
        },
        TokioClock::new(),
    )
    .unwrap();
    bucket.try_acquire_n(3).unwrap();
    bucket
}

/// Admissions as (name, seconds since `start`), in the order they happened.
type Log = Arc<Mutex<Vec<(&'static str, Duration)>>>;

fn spawn_waiter(
    chain: &Chain<TokioClock>,
    n: u32,
    name: &'static str,
    log: &Log,
    start: Instant,
) -> tokio::task::JoinHandle<Result<(), AcquireError>> {
    let (chain, log) = (chain.clone(), Arc::clone(log));
    tokio::spawn(async move {
        chain.acquire_n(n).await?;
        log.lock().unwrap().push((name, start.elapsed()));
        Ok(())
    })
}

/// Lets every spawned task run until it waits.
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn chain_waiters_are_admitted_in_arrival_order() {
    let chain = Chain::new([drained_bucket()]).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    // The first asks for 3 (3 s away), the two after it for 1 (1 s away): without a queue they
    // would pass it.
    let a = spawn_waiter(&chain, 3, "a", &log, start);
    settle().await;
    let b = spawn_waiter(&chain, 1, "b", &log, start);
    settle().await;
    let c = spawn_waiter(&chain, 1, "c", &log, start);
    for task in [a, b, c] {
        task.await.unwrap().unwrap();
    }
    let secs = Duration::from_secs;
    assert_eq!(
        *log.lock().unwrap(),
        [("a", secs(3)), ("b", secs(4)), ("c", secs(5))]
    );
    assert_eq!(chain.stats().admitted, 3);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_newcomer_does_not_pass_waiting_chain_callers() {
    let bucket = drained_bucket();
    let chain = Chain::new([bucket.clone()]).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = spawn_waiter(&chain, 3, "a", &log, start);
    settle().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // One permit is free, but the waiting caller is served first: refused, nothing taken.
    let refused = chain.try_acquire().unwrap_err();
    assert!(
        matches!(refused, TryAcquireError::Rejected(_)),
        "{refused:?}"
    );
    assert!(matches!(
        chain.try_acquire_n(0),
        Err(TryAcquireError::Rejected(_))
    ));
    assert_eq!(bucket.stats().available, 1);
    // The member itself has no queue of its own: it admits its own callers.
    let newcomer = spawn_waiter(&chain, 1, "newcomer", &log, start);
    a.await.unwrap().unwrap();
    newcomer.await.unwrap().unwrap();
    let secs = Duration::from_secs;
    assert_eq!(
        *log.lock().unwrap(),
        [("a", secs(3)), ("newcomer", secs(4))]
    );
    // Nobody waits any more: no refusal.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(chain.try_acquire().is_ok());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn dropping_the_head_promotes_the_next_at_once() {
    let bucket = drained_bucket();
    let chain = Chain::new([bucket.clone()]).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = spawn_waiter(&chain, 3, "a", &log, start);
    settle().await;
    let b = spawn_waiter(&chain, 1, "b", &log, start);
    settle().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    settle().await;
    assert!(log.lock().unwrap().is_empty(), "b passed the head");
    a.abort();
    settle().await;
    // b is the head now and takes the permit free since 1 s, without waiting for any timer.
    assert_eq!(*log.lock().unwrap(), [("b", Duration::from_millis(1500))]);
    b.await.unwrap().unwrap();
    assert_eq!(chain.stats().cancelled, 1);
    assert_eq!(bucket.stats().available, 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_head_that_times_out_holds_nothing_and_hands_over() {
    let bucket = drained_bucket();
    let chain = Chain::new([bucket.clone()]).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = tokio::spawn({
        let chain = chain.clone();
        async move { chain.acquire_timeout(3, Duration::from_millis(1500)).await }
    });
    settle().await;
    let b = spawn_waiter(&chain, 1, "b", &log, start);
    assert_eq!(a.await.unwrap(), Err(AcquireError::Timeout));
    b.await.unwrap().unwrap();
    // b waited for the head, and was served the moment it gave up.
    assert_eq!(*log.lock().unwrap(), [("b", Duration::from_millis(1500))]);
    let stats = chain.stats();
    assert_eq!((stats.admitted, stats.cancelled), (1, 1));
    // The head took nothing: b's permit is the only one gone.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(bucket.stats().available, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn keyed_chain_waiters_queue_per_key() {
    let per_key = KeyedLimiter::with_clock(
        Algorithm::TokenBucket {
            rate: Rate::per_second(1),
            burst: 3,
        },
        TokioClock::new(),
    )
    .unwrap();
    per_key.try_acquire_n(&"a", 3).unwrap();
    let chain = KeyedChain::builder()
        .per_key(per_key.clone())
        .build()
        .unwrap();
    let log: Log = Log::default();
    let start = Instant::now();
    let waiter = |key: &'static str, n: u32, name: &'static str| {
        let (chain, log) = (chain.clone(), Arc::clone(&log));
        tokio::spawn(async move {
            chain.acquire_n(&key, n).await?;
            log.lock().unwrap().push((name, start.elapsed()));
            Ok::<_, AcquireError>(())
        })
    };
    let a = waiter("a", 3, "a1");
    settle().await;
    let b = waiter("a", 1, "a2");
    settle().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    settle().await;
    // Key "a" has waiting chain callers: no barging on it. Key "b" has none: served at once.
    assert!(matches!(
        chain.try_acquire(&"a"),
        Err(TryAcquireError::Rejected(_))
    ));
    assert!(chain.try_acquire(&"b").is_ok());
    let other = waiter("b", 1, "b1");
    other.await.unwrap().unwrap();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    let secs = Duration::from_secs;
    assert_eq!(
        *log.lock().unwrap(),
        [("b1", secs(1)), ("a1", secs(3)), ("a2", secs(4))]
    );
}

/// A blocking caller and an async one in the same queue, each way round: the one that came
/// second is not served before the first, though what it asks for is free.
#[test]
fn blocking_and_async_callers_share_one_queue() {
    for blocking_first in [true, false] {
        let clock = Counting::default();
        let window = Duration::from_millis(100);
        let member =
            RateLimiter::with_clock(Algorithm::FixedWindow { limit: 2, window }, clock.clone())
                .unwrap();
        member.try_acquire().unwrap(); // one left in this window
        let chain = Chain::new([member.clone()]).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let run = |blocking: bool, n: u32| {
            let (chain, order) = (chain.clone(), Arc::clone(&order));
            std::thread::spawn(move || {
                let outcome = if blocking {
                    chain.acquire_blocking_n(n)
                } else {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .build()
                        .unwrap()
                        .block_on(chain.acquire_n(n))
                };
                outcome.unwrap();
                order.lock().unwrap().push(blocking);
            })
        };
        // The first asks for 2 (the next window), the second for the 1 that is free now.
        let first = run(blocking_first, 2);
        clock.wait_for_the_head(&chain);
        let second = run(!blocking_first, 1);
        wait_until(|| chain.stats().waiting == 2);
        assert!(
            order.lock().unwrap().is_empty(),
            "the second passed the first"
        );
        assert_eq!(member.stats().available, 1);
        clock.clock.advance(window);
        first.join().unwrap();
        clock.clock.advance(window);
        second.join().unwrap();
        assert_eq!(*order.lock().unwrap(), [blocking_first, !blocking_first]);
        assert_eq!(chain.stats().waiting, 0);
    }
}

/// A [`ManualClock`] that counts its readings. A chain caller reads the clock only to attempt,
/// and once counted as waiting, only while it holds the turn: a reading after it is counted
/// says that it is the head. Counted as waiting, it may not have taken its turn yet (it takes
/// its room, then its turn), and a caller started then could take the turn before it.
#[derive(Clone, Default)]
struct Counting {
    clock: ManualClock,
    reads: Arc<std::sync::atomic::AtomicU64>,
}

impl Clock for Counting {
    fn now(&self) -> u64 {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.clock.now()
    }
}

impl Counting {
    /// Waits until the only caller of `chain` (on another thread, real time) waits as its head:
    /// counted as waiting, then reading the clock (a head that is refused parks for the wait
    /// the member reported, in real time, and attempts again after it).
    fn wait_for_the_head<C: Clock + Clone>(&self, chain: &Chain<C>) {
        wait_until(|| chain.stats().waiting == 1);
        let counted = self.reads.load(std::sync::atomic::Ordering::Relaxed);
        wait_until(|| self.reads.load(std::sync::atomic::Ordering::Relaxed) > counted);
    }
}

/// Polls `done` (real time: another thread must reach its wait).
fn wait_until(done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out");
        std::thread::yield_now();
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_queue_is_bounded_in_permits() {
    let chain = Chain::builder([drained_bucket()])
        .queue_limit(3)
        .build()
        .unwrap();
    assert_eq!(chain.queue_limit(), 3);
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = spawn_waiter(&chain, 2, "a", &log, start);
    settle().await;
    let b = spawn_waiter(&chain, 1, "b", &log, start);
    settle().await;
    assert_eq!(chain.stats().waiting, 2);
    // 3 permits wait: no room for one more, the head's included.
    assert_eq!(
        chain.acquire_n(1).await,
        Err(AcquireError::QueueFull {
            requested: 1,
            queue_limit: 3
        })
    );
    assert_eq!(
        chain.acquire_blocking_n(1),
        Err(AcquireError::QueueFull {
            requested: 1,
            queue_limit: 3
        })
    );
    assert_eq!(chain.stats().rejected, 2);
    // A waiter that gives up frees its room.
    b.abort();
    settle().await;
    assert_eq!(chain.stats().waiting, 1);
    let c = spawn_waiter(&chain, 1, "c", &log, start);
    a.await.unwrap().unwrap();
    c.await.unwrap().unwrap();
    let secs = Duration::from_secs;
    assert_eq!(*log.lock().unwrap(), [("a", secs(2)), ("c", secs(3))]);
    // Nobody may wait at all under a limit of 0; a request above the limit never waits.
    let none = Chain::builder([drained_bucket()])
        .queue_limit(0)
        .build()
        .unwrap();
    assert!(matches!(
        none.acquire().await,
        Err(AcquireError::QueueFull {
            requested: 1,
            queue_limit: 0
        })
    ));
    let small = Chain::builder([drained_bucket()])
        .queue_limit(2)
        .build()
        .unwrap();
    assert!(matches!(
        small.acquire_n(3).await,
        Err(AcquireError::QueueFull {
            requested: 3,
            queue_limit: 2
        })
    ));
    // Admitted at once: no room needed.
    let idle = Chain::builder([RateLimiter::with_clock(
        Algorithm::FixedWindow {
            limit: 5,
            window: Duration::from_secs(1),
        },
        TokioClock::new(),
    )
    .unwrap()])
    .queue_limit(0)
    .build()
    .unwrap();
    assert!(idle.acquire_n(5).await.is_ok());
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_queued_caller_that_times_out_leaves_its_room() {
    let chain = Chain::builder([drained_bucket()])
        .queue_limit(3)
        .build()
        .unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = spawn_waiter(&chain, 2, "a", &log, start);
    settle().await;
    let b = chain.acquire_timeout(1, Duration::from_millis(500)).await;
    assert_eq!(b, Err(AcquireError::Timeout));
    assert_eq!(chain.stats().waiting, 1);
    assert_eq!(chain.stats().cancelled, 1);
    let blocked = chain.acquire_blocking_timeout(1, Duration::from_millis(1));
    assert_eq!(blocked, Err(AcquireError::Timeout));
    assert_eq!(chain.stats().waiting, 1);
    assert_eq!(chain.stats().cancelled, 2);
    a.await.unwrap().unwrap();
    assert_eq!(*log.lock().unwrap(), [("a", Duration::from_secs(2))]);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn keyed_chain_queue_limit_is_per_key() {
    let per_key = KeyedLimiter::with_clock(
        Algorithm::TokenBucket {
            rate: Rate::per_second(1),
            burst: 3,
        },
        TokioClock::new(),
    )
    .unwrap();
    per_key.try_acquire_n(&"a", 3).unwrap();
    per_key.try_acquire_n(&"b", 3).unwrap();
    let chain = KeyedChain::builder()
        .per_key(per_key)
        .queue_limit(1)
        .build()
        .unwrap();
    assert_eq!(chain.queue_limit(), 1);
    let a = tokio::spawn({
        let chain = chain.clone();
        async move { chain.acquire(&"a").await }
    });
    settle().await;
    assert_eq!(chain.stats().waiting, 1);
    assert!(matches!(
        chain.acquire(&"a").await,
        Err(AcquireError::QueueFull {
            requested: 1,
            queue_limit: 1
        })
    ));
    // Another key has room of its own.
    let start = Instant::now();
    chain.acquire(&"b").await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    a.await.unwrap().unwrap();
    assert_eq!(chain.stats().waiting, 0);
}

/// A newcomer held back by waiting chain callers is told when the members could admit what the
/// waiters ask for and its own call, not 0 (as a member's own refusal behind its queue). A
/// bucket of 3, drained; a caller waits for 3 (3 s away). At 1 s one permit is free: the
/// newcomer's call would fit, but the waiter's 3 come first, and a call behind them fits no
/// sooner than 3 permits at once (2 s more), and then one more period for the permit past the
/// burst (3 s: exact). It was a retry-after of 0: "retry now", to a call that cannot get in
/// for 3 s.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_newcomer_behind_chain_waiters_is_told_the_time_their_permits_need() {
    let chain = Chain::new([drained_bucket()]).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = spawn_waiter(&chain, 3, "a", &log, start);
    settle().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for n in [0, 1] {
        match chain.try_acquire_n(n) {
            Err(TryAcquireError::Rejected(r)) => {
                assert_eq!(r.retry_after(), Duration::from_secs(3), "n = {n}")
            }
            other => panic!("n = {n}: {other:?}"),
        }
    }
    a.await.unwrap().unwrap();
}

/// As above, per key: the waiters of one key count for that key only. A sliding counter
/// member answers for the newcomer's call alone (its admissions weigh less once the next
/// window starts, so all of them at once is no lower bound): with a token bucket beside it,
/// the bucket's answer (3 s, as above) is the chain's.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keyed_newcomer_behind_chain_waiters_is_told_the_time_their_permits_need() {
    let bucket = KeyedLimiter::<u32, _>::builder(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 3,
    })
    .clock(TokioClock::new())
    .build()
    .unwrap();
    let counter = KeyedLimiter::<u32, _>::builder(Algorithm::SlidingCounter {
        limit: 100,
        window: Duration::from_secs(60),
    })
    .clock(TokioClock::new())
    .build()
    .unwrap();
    let chain = KeyedChain::builder()
        .per_key(bucket.clone())
        .per_key(counter)
        .build()
        .unwrap();
    bucket.try_acquire_n(&1, 3).unwrap();
    let waiter = {
        let chain = chain.clone();
        tokio::spawn(async move { chain.acquire_n(&1, 3).await.map(drop) })
    };
    settle().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    match chain.try_acquire(&1) {
        Err(TryAcquireError::Rejected(r)) => assert_eq!(r.retry_after(), Duration::from_secs(3)),
        other => panic!("{other:?}"),
    }
    // Another key has nobody waiting: admitted.
    assert!(chain.try_acquire(&2).is_ok());
    waiter.await.unwrap().unwrap();
}

/// A `Waker` that records the chain's `stats().waiting` when woken.
struct Record {
    waiting: Box<dyn Fn() -> u64 + Send + Sync>,
    seen: Mutex<Vec<u64>>,
}

impl std::task::Wake for Record {
    fn wake(self: Arc<Self>) {
        let waiting = (self.waiting)();
        self.seen.lock().unwrap().push(waiting);
    }
}

/// `stats().waiting` counts a caller from before it takes its room until after it has given its
/// turn up, as the gate (`busy`) sees it: when the admitted head hands its turn over, waking the
/// next caller, the head is still inside its call, holding its room. A `Chain` counted only the
/// turn's holder and its queue, so a caller between its room and its turn (or its turn given up
/// and its room still held) went uncounted; a `KeyedChain` counted room holders already.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn waiting_counts_a_caller_for_as_long_as_it_holds_its_room() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let chain = Chain::new([drained_bucket()]).unwrap();
    let bucket = KeyedLimiter::<u32, _>::builder(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 3,
    })
    .clock(TokioClock::new())
    .build()
    .unwrap();
    bucket.try_acquire_n(&1, 3).unwrap();
    let keyed = KeyedChain::builder().per_key(bucket).build().unwrap();
    let record = |waiting: Box<dyn Fn() -> u64 + Send + Sync>| {
        Arc::new(Record {
            waiting,
            seen: Mutex::new(Vec::new()),
        })
    };
    let seen_unkeyed = record(Box::new({
        let chain = chain.clone();
        move || chain.stats().waiting
    }));
    let seen_keyed = record(Box::new({
        let keyed = keyed.clone();
        move || keyed.stats().waiting
    }));
    let head = tokio::spawn({
        let chain = chain.clone();
        async move { chain.acquire_n(1).await.map(drop) }
    });
    let keyed_head = tokio::spawn({
        let keyed = keyed.clone();
        async move { keyed.acquire_n(&1, 1).await.map(drop) }
    });
    settle().await;
    let mut next = Box::pin(chain.acquire_n(1));
    let mut keyed_next = Box::pin(keyed.acquire_n(&1, 1));
    let waker = Waker::from(Arc::clone(&seen_unkeyed));
    assert!(
        next.as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    let waker = Waker::from(Arc::clone(&seen_keyed));
    assert!(
        keyed_next
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );
    assert_eq!((chain.stats().waiting, keyed.stats().waiting), (2, 2));
    tokio::time::sleep(Duration::from_secs(1)).await;
    head.await.unwrap().unwrap();
    keyed_head.await.unwrap().unwrap();
    // Woken by the handover, while each head was still inside its call.
    assert_eq!(*seen_keyed.seen.lock().unwrap(), [2]);
    assert_eq!(*seen_unkeyed.seen.lock().unwrap(), [2]);
    assert_eq!((chain.stats().waiting, keyed.stats().waiting), (1, 1));
    drop((next, keyed_next));
    assert_eq!((chain.stats().waiting, keyed.stats().waiting), (0, 0));
}

/// A `Waker` that panics when woken.
struct Panicky;

impl std::task::Wake for Panicky {
    fn wake(self: Arc<Self>) {
        panic!("this waker panics in wake");
    }
}

/// The head, admitted, hands the turn to the next caller, whose `Waker` panics: the unwind goes
/// through the head's call, which never gets its admission, so the members get their permits
/// back and the call counts as cancelled (as a limiter's served head does), and the next caller
/// is served with them.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_head_whose_handover_panics_gives_its_permits_back() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let bucket = drained_bucket();
    let chain = Chain::new([bucket.clone()]).unwrap();
    let head = tokio::spawn({
        let chain = chain.clone();
        async move { chain.acquire_n(1).await }
    });
    settle().await;
    let mut next = Box::pin(chain.acquire_n(1));
    let panicky = Waker::from(Arc::new(Panicky));
    assert!(
        next.as_mut()
            .poll(&mut Context::from_waker(&panicky))
            .is_pending()
    );
    assert_eq!(chain.stats().waiting, 2);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(head.await.unwrap_err().is_panic());
    let stats = chain.stats();
    assert_eq!((stats.admitted, stats.cancelled, stats.waiting), (0, 1, 1));
    assert_eq!(bucket.stats().available, 1, "the head's permit was lost");
    // The next caller, now the head, takes it at once.
    let noop = Waker::noop();
    assert!(
        next.as_mut()
            .poll(&mut Context::from_waker(noop))
            .is_ready()
    );
    assert_eq!(chain.stats().admitted, 1);
    assert_eq!(bucket.stats().available, 0);
}

/// As above, for a blocking head and an async caller behind it.
#[test]
fn a_blocking_head_whose_handover_panics_gives_its_permits_back() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let clock = Counting::default();
    let window = Duration::from_millis(50);
    let member =
        RateLimiter::with_clock(Algorithm::FixedWindow { limit: 1, window }, clock.clone())
            .unwrap();
    member.try_acquire().unwrap();
    let chain = Chain::new([member.clone()]).unwrap();
    let head = std::thread::spawn({
        let chain = chain.clone();
        move || chain.acquire_blocking()
    });
    clock.wait_for_the_head(&chain);
    let mut next = Box::pin(chain.acquire());
    let panicky = Waker::from(Arc::new(Panicky));
    assert!(
        next.as_mut()
            .poll(&mut Context::from_waker(&panicky))
            .is_pending()
    );
    clock.clock.advance(window);
    assert!(head.join().is_err());
    let stats = chain.stats();
    assert_eq!((stats.admitted, stats.cancelled, stats.waiting), (0, 1, 1));
    assert_eq!(member.stats().available, 1, "the head's permit was lost");
    drop(next);
    assert_eq!(chain.stats().waiting, 0);
}

/// A member closed while a head sleeps and others queue behind it: the head is woken at once,
/// and each caller after it fails at once on its turn; nothing stays in the queue.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_member_closed_under_the_queue_ends_every_caller_at_once() {
    let bucket = drained_bucket();
    let chain = Chain::new([bucket.clone()]).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = spawn_waiter(&chain, 3, "a", &log, start);
    settle().await;
    let b = spawn_waiter(&chain, 1, "b", &log, start);
    let probe = spawn_waiter(&chain, 0, "probe", &log, start);
    settle().await;
    assert_eq!(chain.stats().waiting, 3);
    tokio::time::sleep(Duration::from_millis(100)).await;
    bucket.close();
    settle().await;
    for task in [a, b, probe] {
        assert!(task.is_finished());
        assert_eq!(task.await.unwrap(), Err(AcquireError::Closed));
    }
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    let stats = chain.stats();
    assert_eq!((stats.rejected, stats.waiting), (3, 0));
}

/// The keyed twin: a per-key member closed while chain callers of two keys wait (a head and
/// one behind it on "a", a head on "b"): every caller ends at once with `Closed`, a later
/// call fails at once, and no queue is left.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keyed_member_closed_under_the_queues_ends_every_caller_at_once() {
    let per_key = KeyedLimiter::with_clock(
        Algorithm::TokenBucket {
            rate: Rate::per_second(1),
            burst: 3,
        },
        TokioClock::new(),
    )
    .unwrap();
    per_key.try_acquire_n(&"a", 3).unwrap();
    per_key.try_acquire_n(&"b", 3).unwrap();
    let chain = KeyedChain::builder()
        .per_key(per_key.clone())
        .build()
        .unwrap();
    let start = Instant::now();
    let waiter = |key: &'static str, n: u32| {
        let chain = chain.clone();
        tokio::spawn(async move { chain.acquire_n(&key, n).await.map(|_| ()) })
    };
    let a = waiter("a", 3);
    settle().await;
    let (a2, b) = (waiter("a", 1), waiter("b", 2));
    settle().await;
    assert_eq!(chain.stats().waiting, 3);
    tokio::time::sleep(Duration::from_millis(100)).await;
    per_key.close();
    settle().await;
    for task in [a, a2, b] {
        assert!(task.is_finished(), "a chain caller slept on past the close");
        assert_eq!(task.await.unwrap(), Err(AcquireError::Closed));
    }
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!(
        chain.try_acquire(&"c").unwrap_err(),
        TryAcquireError::Closed
    );
    assert_eq!(chain.acquire(&"c").await.unwrap_err(), AcquireError::Closed);
    let stats = chain.stats();
    assert_eq!((stats.rejected, stats.waiting), (5, 0), "{stats:?}");
}

/// A refund by another chain sharing the member wakes the sleeping head, and the caller after it
/// is served at once from what is left, at the same instant.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_refund_under_the_queue_serves_the_head_and_the_next_at_once() {
    let bucket = RateLimiter::with_clock(
        Algorithm::TokenBucket {
            rate: Rate::per_second(1),
            burst: 3,
        },
        TokioClock::new(),
    )
    .unwrap();
    let receipt = Chain::new([bucket.clone()])
        .unwrap()
        .try_acquire_refundable(3)
        .unwrap();
    let chain = Chain::new([bucket.clone()]).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = spawn_waiter(&chain, 2, "a", &log, start);
    settle().await;
    let b = spawn_waiter(&chain, 1, "b", &log, start);
    settle().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    receipt.refund();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    let at = Duration::from_millis(100);
    assert_eq!(*log.lock().unwrap(), [("a", at), ("b", at)]);
}

/// Waiting futures dropped at either await point (the head in its sleep, a caller waiting for
/// its turn), polled by hand or by a task: each leaves its room and its turn, counts as
/// cancelled, and the whole room is free again.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn waiting_futures_dropped_anywhere_leave_the_whole_room() {
    use std::future::Future;
    use std::task::{Context, Waker};
    let chain = Chain::builder([drained_bucket()])
        .queue_limit(4)
        .build()
        .unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = spawn_waiter(&chain, 3, "a", &log, start);
    settle().await;
    let b = spawn_waiter(&chain, 1, "b", &log, start);
    settle().await;
    assert_eq!(chain.stats().waiting, 2);
    b.abort();
    settle().await;
    assert_eq!(chain.stats().waiting, 1);
    a.abort();
    settle().await;
    assert_eq!(chain.stats().waiting, 0);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..2 {
        let mut head = Box::pin(chain.acquire_n(3));
        assert!(head.as_mut().poll(&mut cx).is_pending());
        let mut next = Box::pin(chain.acquire_n(1));
        assert!(next.as_mut().poll(&mut cx).is_pending());
        assert_eq!(chain.stats().waiting, 2);
        // Four permits wait: the room is full, a probe included.
        assert!(matches!(
            chain.acquire_n(0).await,
            Err(AcquireError::QueueFull {
                requested: 0,
                queue_limit: 4
            })
        ));
        drop(head);
        assert_eq!(chain.stats().waiting, 1);
        drop(next);
        assert_eq!(chain.stats().waiting, 0);
    }
    let stats = chain.stats();
    assert_eq!((stats.cancelled, stats.rejected, stats.admitted), (6, 2, 0));
}

/// A blocking call with no time to wait, behind an async head: `Timeout` (a probe too), holding
/// nothing, and the head is served as before.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_blocking_call_without_time_behind_a_waiter_times_out_at_once() {
    let chain = Chain::new([drained_bucket()]).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = spawn_waiter(&chain, 3, "a", &log, start);
    settle().await;
    for n in [1, 0] {
        assert_eq!(
            chain.acquire_blocking_timeout(n, Duration::ZERO),
            Err(AcquireError::Timeout)
        );
    }
    let stats = chain.stats();
    assert_eq!((stats.waiting, stats.cancelled), (1, 2));
    a.await.unwrap().unwrap();
    assert_eq!(*log.lock().unwrap(), [("a", Duration::from_secs(3))]);
    assert_eq!(chain.stats().waiting, 0);
}

/// A keyed chain's queues at any queue limit, the largest included (a room of `u32::MAX`
/// permits), with a waiting probe.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keyed_chain_queues_at_any_queue_limit() {
    for limit in [u64::MAX, u64::from(u32::MAX) + 1, u64::from(u32::MAX), 1] {
        let per_key = KeyedLimiter::with_clock(
            Algorithm::TokenBucket {
                rate: Rate::per_second(1),
                burst: 3,
            },
            TokioClock::new(),
        )
        .unwrap();
        per_key.try_acquire_n(&"a", 3).unwrap();
        let chain = KeyedChain::builder()
            .per_key(per_key)
            .queue_limit(limit)
            .build()
            .unwrap();
        let start = Instant::now();
        let probe = tokio::spawn({
            let chain = chain.clone();
            async move { chain.acquire_n(&"a", 0).await }
        });
        settle().await;
        assert_eq!(chain.stats().waiting, 1, "{limit}");
        if limit == 1 {
            assert_eq!(
                chain.acquire_n(&"a", 0).await,
                Err(AcquireError::QueueFull {
                    requested: 0,
                    queue_limit: 1
                })
            );
        }
        probe.await.unwrap().unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1), "{limit}");
        assert_eq!(chain.stats().waiting, 0);
    }
}

/// Callers on several threads race to be a keyed chain's first waiter (who makes its queues):
/// every one is served, and none stays counted as waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_waiters_of_a_keyed_chain_race_to_make_its_queues() {
    for round in 0..10u32 {
        let per_key = KeyedLimiter::new(Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_millis(5),
        })
        .unwrap();
        per_key.try_acquire(&round).unwrap();
        let chain = KeyedChain::builder().per_key(per_key).build().unwrap();
        let callers: Vec<_> = (0..4)
            .map(|_| {
                let chain = chain.clone();
                tokio::spawn(async move { chain.acquire(&round).await })
            })
            .collect();
        for caller in callers {
            caller.await.unwrap().unwrap();
        }
        let stats = chain.stats();
        assert_eq!((stats.admitted, stats.waiting), (4, 0));
    }
}

/// A chain caller queued for a probe (`acquire_n(0)`) waits for one permit but takes none: a
/// newcomer behind it is told when its own permit fits, as behind a limiter's queued probe,
/// not when two would (a probe counted as a permit made the bound longer than the wait).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_newcomer_behind_a_chain_probe_is_told_when_its_own_permit_fits() {
    let chain = Chain::new([drained_bucket()]).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let probe = spawn_waiter(&chain, 0, "probe", &log, start);
    settle().await;
    match chain.try_acquire_n(1) {
        Err(TryAcquireError::Rejected(r)) => assert_eq!(r.retry_after(), Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    probe.await.unwrap().unwrap();
    assert_eq!(*log.lock().unwrap(), [("probe", Duration::from_secs(1))]);
    assert!(
        chain.try_acquire_n(1).is_ok(),
        "fits once the probe is through"
    );
}

/// As above, per key, and only for the key the probe waits on.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keyed_newcomer_behind_a_chain_probe_is_told_when_its_own_permit_fits() {
    let bucket = KeyedLimiter::<u32, _>::builder(Algorithm::TokenBucket {
        rate: Rate::per_second(1),
        burst: 3,
    })
    .clock(TokioClock::new())
    .build()
    .unwrap();
    let chain = KeyedChain::builder()
        .per_key(bucket.clone())
        .build()
        .unwrap();
    bucket.try_acquire_n(&1, 3).unwrap();
    let spawn = |n| {
        let chain = chain.clone();
        tokio::spawn(async move { chain.acquire_n(&1, n).await.map(drop) })
    };
    let probe = spawn(0);
    settle().await;
    let retry = || match chain.try_acquire(&1) {
        Err(TryAcquireError::Rejected(r)) => r.retry_after(),
        other => panic!("{other:?}"),
    };
    assert_eq!(retry(), Duration::from_secs(1));
    // A caller of one permit behind the probe counts.
    let one = spawn(1);
    settle().await;
    assert_eq!(retry(), Duration::from_secs(2));
    probe.await.unwrap().unwrap();
    one.await.unwrap().unwrap();
}

/// Behind waiting chain callers whose permits and the newcomer's are more than the chain's
/// capacity, the newcomer is told what its members guarantee of that many in a row (a token
/// bucket: one more period per permit past the burst), as a limiter's own refusal behind its
/// queue is, not when the capacity alone fits.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_newcomer_behind_chain_waiters_beyond_the_capacity_is_told_their_whole_wait() {
    let chain = Chain::new([drained_bucket()]).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let a = spawn_waiter(&chain, 3, "a", &log, start);
    settle().await;
    let b = spawn_waiter(&chain, 3, "b", &log, start);
    settle().await;
    for n in [0, 1] {
        match chain.try_acquire_n(n) {
            // 3 s for a's, 3 s for b's, 1 s for this call's.
            Err(TryAcquireError::Rejected(r)) => {
                assert_eq!(r.retry_after(), Duration::from_secs(7), "n = {n}")
            }
            other => panic!("n = {n}: {other:?}"),
        }
    }
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        [("a", Duration::from_secs(3)), ("b", Duration::from_secs(6))]
    );
}

/// A waiting caller that a member's reconfiguration left larger than the chain's capacity will
/// take nothing (its turn fails it, as its first attempt would have): a newcomer behind it is
/// told when its own permits fit, not a wait for permits nobody will take. The line counted the
/// permits its room held, and told this newcomer 2 s.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_caller_left_too_big_by_a_reconfiguration_holds_no_refusal_back() {
    let window = |limit| Algorithm::FixedWindow {
        limit,
        window: Duration::from_secs(1),
    };
    let member = RateLimiter::with_clock(window(4), TokioClock::new()).unwrap();
    let chain = Chain::new([member.clone()]).unwrap();
    member.try_acquire_n(4).unwrap();
    let (log, start): (Log, _) = (Log::default(), Instant::now());
    let big = spawn_waiter(&chain, 3, "big", &log, start);
    settle().await;
    let retry = || match chain.try_acquire_n(1) {
        Err(TryAcquireError::Rejected(r)) => r.retry_after(),
        other => panic!("{other:?}"),
    };
    // Behind 3 waiting permits, 4 of a 4-per-second window: the next window.
    assert_eq!(retry(), Duration::from_secs(1));
    member.reconfigure(window(2)).unwrap();
    assert_eq!(
        retry(),
        Duration::from_secs(1),
        "the caller of 3 takes nothing"
    );
    let one = spawn_waiter(&chain, 1, "one", &log, start);
    assert!(matches!(
        big.await.unwrap(),
        Err(AcquireError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        })
    ));
    one.await.unwrap().unwrap();
    assert_eq!(*log.lock().unwrap(), [("one", Duration::from_secs(1))]);
}

/// As above, per key.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_keyed_caller_left_too_big_by_a_reconfiguration_holds_no_refusal_back() {
    let window = |limit| Algorithm::FixedWindow {
        limit,
        window: Duration::from_secs(1),
    };
    let member = KeyedLimiter::<u32, _>::builder(window(4))
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let chain = KeyedChain::builder()
        .per_key(member.clone())
        .build()
        .unwrap();
    member.try_acquire_n(&1, 4).unwrap();
    let big = {
        let chain = chain.clone();
        tokio::spawn(async move { chain.acquire_n(&1, 3).await.map(drop) })
    };
    settle().await;
    let retry = || match chain.try_acquire(&1) {
        Err(TryAcquireError::Rejected(r)) => r.retry_after(),
        other => panic!("{other:?}"),
    };
    assert_eq!(retry(), Duration::from_secs(1));
    member.reconfigure(window(2)).unwrap();
    assert_eq!(
        retry(),
        Duration::from_secs(1),
        "the caller of 3 takes nothing"
    );
    assert!(matches!(
        big.await.unwrap(),
        Err(AcquireError::InsufficientCapacity {
            requested: 3,
            capacity: 2
        })
    ));
}

/// A time limit of `Duration::MAX` never passes (no `Instant` overflow, no panic), on tasks and
/// on threads; and a call for `u32::MAX` permits, on a member of that limit and a queue that has
/// room for it, waits its turn for the next window and is admitted then.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_largest_time_limits_and_calls_wait_as_any_other() {
    let start = Instant::now();
    let chain = Chain::new([drained_bucket()]).unwrap();
    assert!(chain.acquire_timeout(1, Duration::MAX).await.is_ok());
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    let keyed = KeyedChain::builder()
        .per_key(
            KeyedLimiter::with_clock(
                Algorithm::FixedWindow {
                    limit: 1,
                    window: Duration::from_secs(2),
                },
                TokioClock::new(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    keyed.try_acquire(&"k").unwrap();
    assert!(keyed.acquire_timeout(&"k", 1, Duration::MAX).await.is_ok());
    // The key's next window, 2 s after its clock's start at 1 s.
    assert_eq!(start.elapsed(), Duration::from_secs(3));

    let window = Duration::from_secs(5);
    let widest = RateLimiter::with_clock(
        Algorithm::FixedWindow {
            limit: u32::MAX,
            window,
        },
        TokioClock::new(),
    )
    .unwrap();
    let chain = Chain::builder([widest.clone()])
        .queue_limit(u64::MAX)
        .build()
        .unwrap();
    chain.acquire_n(u32::MAX).await.unwrap();
    let waiting = tokio::spawn({
        let chain = chain.clone();
        async move { chain.acquire_n(u32::MAX).await }
    });
    settle().await;
    assert_eq!(chain.stats().waiting, 1);
    assert!(matches!(
        chain.try_acquire(),
        Err(TryAcquireError::Rejected(_))
    ));
    assert_eq!(waiting.await.unwrap().unwrap().remaining(), 0);
    // The next window, 5 s after its clock's start at 3 s.
    assert_eq!(start.elapsed(), Duration::from_secs(8));
    // The default queue has no room for so many.
    let default = Chain::new([widest]).unwrap();
    assert!(matches!(
        default.acquire_n(u32::MAX).await,
        Err(AcquireError::QueueFull {
            requested: u32::MAX,
            ..
        })
    ));
}

/// The same time limit for a blocked thread: it waits as without one (real time, a 20 ms
/// window).
#[test]
fn a_blocking_time_limit_of_duration_max_never_passes() {
    let chain = Chain::new([RateLimiter::with_clock(
        Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_millis(20),
        },
        turnstile::MonotonicClock::new(),
    )
    .unwrap()])
    .unwrap();
    chain.acquire_blocking_timeout(1, Duration::MAX).unwrap();
    chain.acquire_blocking_timeout(1, Duration::MAX).unwrap();
    assert_eq!(chain.stats().admitted, 2);
}

/// A probe (`acquire_n(0)`) on a chain whose capacity a reconfiguration took to 0 (a limiter
/// listed twice, down to a limit of 1) can never be admitted: its own attempt says
/// `InsufficientCapacity`, as `try_acquire_n(0)` does, and so must a probe that finds callers
/// waiting, at once, async or blocking. It queued behind them instead (pending, or a blocking
/// probe timed out, with room in the queue), and with the room taken was told `QueueFull`, a
/// wait it never needed.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_probe_at_capacity_0_fails_at_once_behind_waiters() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let window = |limit| Algorithm::FixedWindow {
        limit,
        window: Duration::from_secs(1),
    };
    for queue_limit in [3, 4] {
        let twice = RateLimiter::with_clock(window(4), TokioClock::new()).unwrap();
        let chain = Chain::builder([twice.clone(), twice.clone()])
            .queue_limit(queue_limit)
            .build()
            .unwrap();
        twice.try_acquire_n(4).unwrap();
        let (log, start): (Log, _) = (Log::default(), Instant::now());
        let head = spawn_waiter(&chain, 2, "head", &log, start);
        settle().await;
        let behind = spawn_waiter(&chain, 1, "behind", &log, start);
        settle().await;
        assert_eq!(chain.stats().waiting, 2);
        twice.reconfigure(window(1)).unwrap();
        assert_eq!(chain.capacity(), 0);
        assert_eq!(
            chain.try_acquire_n(0).unwrap_err(),
            TryAcquireError::InsufficientCapacity {
                requested: 1,
                capacity: 0
            }
        );
        // Polled once, before the head has run.
        let mut probe = std::pin::pin!(chain.acquire_n(0));
        assert_eq!(
            probe.as_mut().poll(&mut Context::from_waker(Waker::noop())),
            Poll::Ready(Err(AcquireError::InsufficientCapacity {
                requested: 1,
                capacity: 0
            })),
            "queue limit {queue_limit}"
        );
        // As for a blocking probe (it waited out its time limit behind the head).
        assert_eq!(
            chain.acquire_blocking_timeout(0, Duration::from_millis(50)),
            Err(AcquireError::InsufficientCapacity {
                requested: 1,
                capacity: 0
            }),
            "queue limit {queue_limit}"
        );
        for (waiter, requested) in [(head, 2), (behind, 1)] {
            assert_eq!(
                waiter.await.unwrap(),
                Err(AcquireError::InsufficientCapacity {
                    requested,
                    capacity: 0
                })
            );
        }
        assert!(log.lock().unwrap().is_empty());
    }
}
