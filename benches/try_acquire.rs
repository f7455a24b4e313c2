//! `try_acquire` cost: turnstile's four algorithms against governor 0.10 and against the hardware
//! floor of each clock, single-threaded and with two threads sharing one limiter.
//!
//! ```text
//! cargo bench --bench try_acquire                      # ~3 minutes: 1 s warm-up, 2 s measurement each
//! python3 benches/summarize.py                         # markdown table from target/criterion
//! ```
//!
//! Groups (criterion ids are `group/function`):
//!
//! | group | what |
//! |---|---|
//! | `clock` | one clock read, nothing else |
//! | `floor` | Acquire load + clock read + uncontended CAS on a local atomic: the least any lock-free limiter can do on that clock. `upkeep/load_only`: load + clock read + compare, the least a rejection can do |
//! | `admit_1t` | admit path, one thread; `@monotonic` / `@quanta` name a non-default clock |
//! | `reject_1t` | reject path (limiter exhausted at setup), one thread |
//! | `admit_2t`, `reject_2t` | two threads on one limiter: wall time for `iters` calls on each thread, per call. `admit_2t/floor/*`: the floor with both threads on one word |
//!
//! And, only when named (`cargo bench --bench try_acquire -- clock-cpu`, Linux), not a
//! criterion group: the CPU time the clocks' background threads take, idle and read, beside
//! quanta's upkeep thread and `MonotonicClock` (see [`clock_cpu`]).
//!
//! Clocks: turnstile's default is [`UpkeepClock`] (an atomic refreshed every 1 ms by a background
//! thread); governor's default is `QuantaClock` (a TSC read, scaled). `@quanta` rows run turnstile on
//! a bench-only [`Clock`] that reads quanta exactly like governor's `QuantaClock`, and
//! `governor/upkeep_clock` runs governor on quanta's 1 ms upkeep clock, so both libraries are also
//! compared on the same clock.
//!
//! Admit-path limits are chosen so that no call is ever rejected, and each admit limiter's
//! [`RateLimiter::stats`] is checked after its benchmark (a rejection panics: the number would be
//! wrong). Every reject-path limiter is checked to have admitted nothing during its benchmark.

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use governor::Quota;
use governor::clock::{MonotonicClock as GovMonotonicClock, QuantaUpkeepClock};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use turnstile::{Algorithm, Clock, DefaultClock, MonotonicClock, Rate, RateLimiter, UpkeepClock};

/// Upkeep interval of the quanta clock given to governor: the same 1 ms as turnstile's default.
const QUANTA_UPKEEP: Duration = Duration::from_millis(1);

/// Admit-path configurations: nothing is ever rejected.
///
/// - Fixed window / sliding counter: u32::MAX per 1 s. One thread at ≥ 1 ns per call admits at most
///   1e9 per window (two threads together likewise), below u32::MAX; the sliding counter's weighted
///   estimate is at most two windows' counts, still below u32::MAX.
/// - Sliding window: ticket k needs ticket k − limit to be ≥ 1 ns old. With the 1 ms upkeep clock all
///   calls in one tick share a timestamp, so the ring must hold more than one tick's admissions
///   (~10^5 here): 2^20 slots (8 MiB).
/// - Token bucket: emission interval ceil(1e9 / u32::MAX) = 1 ns, tolerance u32::MAX ns (4.3 s).
///   Each admission moves the theoretical arrival time 1 ns ahead and calls take more than 1 ns, so
///   it never runs 4.3 s ahead of the clock.
const ADMIT: [(&str, Algorithm); 4] = [
    (
        "fixed_window",
        Algorithm::FixedWindow {
            limit: u32::MAX,
            window: Duration::from_secs(1),
        },
    ),
    (
        "sliding_window",
        Algorithm::SlidingWindow {
            limit: 1 << 20,
            window: Duration::from_nanos(1),
        },
    ),
    (
        "sliding_counter",
        Algorithm::SlidingCounter {
            limit: u32::MAX,
            window: Duration::from_secs(1),
        },
    ),
    (
        "token_bucket",
        Algorithm::TokenBucket {
            rate: Rate::per_second(u32::MAX),
            burst: u32::MAX,
        },
    ),
];

/// Reject-path configurations: one permit per hour, taken at setup.
const REJECT: [(&str, Algorithm); 4] = [
    (
        "fixed_window",
        Algorithm::FixedWindow {
            limit: 1,
            window: Duration::from_secs(3600),
        },
    ),
    (
        "sliding_window",
        Algorithm::SlidingWindow {
            limit: 1,
            window: Duration::from_secs(3600),
        },
    ),
    (
        "sliding_counter",
        Algorithm::SlidingCounter {
            limit: 1,
            window: Duration::from_secs(3600),
        },
    ),
    (
        "token_bucket",
        Algorithm::TokenBucket {
            rate: Rate::per_hour(1),
            burst: 1,
        },
    ),
];

/// quanta's TSC clock read the way governor's `QuantaClock` reads it (`raw` + `delta_as_nanos`).
/// Bench-only: turnstile does not offer it because TSC reads are not guaranteed monotonic across
/// cores. Used single-threaded here, for a same-clock comparison with governor's default.
struct QuantaTsc {
    clock: quanta::Clock,
    start: u64,
}

impl QuantaTsc {
    fn new() -> Self {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        QuantaTsc { clock, start }
    }
}

impl Clock for QuantaTsc {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.start, self.clock.raw())
    }
}

/// quanta's upkeep clock read the way governor's `QuantaUpkeepClock` reads it. Needs quanta's upkeep
/// thread, which this value keeps running (only one may run per process).
struct QuantaRecent {
    clock: quanta::Clock,
    reference: quanta::Instant,
    _upkeep: quanta::Handle,
}

impl QuantaRecent {
    fn start() -> Self {
        let upkeep = quanta::Upkeep::new(QUANTA_UPKEEP)
            .start()
            .expect("quanta upkeep thread");
        let clock = quanta::Clock::new();
        std::thread::sleep(QUANTA_UPKEEP * 3);
        let reference = clock.recent();
        QuantaRecent {
            clock,
            reference,
            _upkeep: upkeep,
        }
    }
}

impl Clock for QuantaRecent {
    #[inline]
    fn now(&self) -> u64 {
        self.clock
            .recent()
            .saturating_duration_since(self.reference)
            .as_nanos() as u64
    }
}

/// The least a lock-free limiter can do to admit: load its word, read the clock, CAS a new word.
#[inline(always)]
fn floor_admit<C: Clock>(state: &AtomicU64, clock: &C) -> u64 {
    let mut current = state.load(Ordering::Acquire);
    loop {
        let now = clock.now();
        let next = current.max(now) + 1;
        match state.compare_exchange_weak(current, next, Ordering::Release, Ordering::Acquire) {
            Ok(_) => return next,
            Err(actual) => current = actual,
        }
    }
}

/// The least a rejection can do: load the word, read the clock, compare.
#[inline(always)]
fn floor_reject<C: Clock>(state: &AtomicU64, clock: &C) -> bool {
    let current = state.load(Ordering::Acquire);
    current > clock.now()
}

/// Builds an admit-path limiter and runs it for 20 ms (several upkeep ticks) to check that the
/// configuration never rejects.
fn admit_limiter<C: Clock>(name: &str, algorithm: Algorithm, clock: C) -> RateLimiter<C> {
    let limiter = RateLimiter::with_clock(algorithm, clock).expect("valid bench configuration");
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(20) {
        for _ in 0..1000 {
            if let Err(e) = limiter.try_acquire() {
                panic!("admit-path limiter {name} rejected during preflight: {e}");
            }
        }
    }
    limiter
}

fn assert_no_rejections<C: Clock>(id: &str, limiter: &RateLimiter<C>) {
    let stats = limiter.stats();
    assert_eq!(
        stats.rejected, 0,
        "{id}: the admit-path benchmark rejected {} of {} calls; its numbers are invalid",
        stats.rejected, stats.admitted
    );
}

/// Builds a reject-path limiter: its one permit is taken here.
fn reject_limiter<C: Clock>(name: &str, algorithm: Algorithm, clock: C) -> RateLimiter<C> {
    let limiter = RateLimiter::with_clock(algorithm, clock).expect("valid bench configuration");
    limiter.try_acquire().expect("the first permit");
    assert!(
        limiter.try_acquire().is_err(),
        "reject-path limiter {name} admitted twice"
    );
    limiter
}

fn assert_no_admissions<C: Clock>(id: &str, limiter: &RateLimiter<C>) {
    let stats = limiter.stats();
    assert_eq!(
        stats.admitted,
        1,
        "{id}: the reject-path benchmark admitted {} calls; its numbers are invalid",
        stats.admitted - 1
    );
}

fn governor_admit_quota() -> Quota {
    // Emission interval 1 ns, burst u32::MAX: governor's equivalent of the token bucket above.
    Quota::per_second(NonZeroU32::MAX)
}

fn governor_reject_quota() -> Quota {
    Quota::per_hour(NonZeroU32::MIN)
}

fn bench_clocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock");
    let upkeep = UpkeepClock::new();
    g.bench_function("turnstile::UpkeepClock::now", |b| b.iter(|| upkeep.now()));
    let monotonic = MonotonicClock::new();
    g.bench_function("turnstile::MonotonicClock::now", |b| {
        b.iter(|| monotonic.now())
    });
    g.bench_function("std::time::Instant::now", |b| b.iter(Instant::now));
    let quanta = quanta::Clock::new();
    g.bench_function("quanta::Clock::now", |b| b.iter(|| quanta.now()));
    let recent = QuantaRecent::start();
    g.bench_function("quanta::Clock::recent", |b| {
        b.iter(|| recent.clock.recent())
    });
    g.finish();
}

fn bench_floors(c: &mut Criterion) {
    let mut g = c.benchmark_group("floor");
    fn floors<C: Clock>(g: &mut BenchmarkGroup<'_, WallTime>, name: &str, clock: &C) {
        let state = AtomicU64::new(0);
        g.bench_function(name, |b| b.iter(|| floor_admit(&state, clock)));
    }
    let upkeep = UpkeepClock::new();
    floors(&mut g, "upkeep", &upkeep);
    floors(&mut g, "monotonic", &MonotonicClock::new());
    floors(&mut g, "quanta", &QuantaTsc::new());
    {
        let recent = QuantaRecent::start();
        floors(&mut g, "quanta_upkeep", &recent);
    }
    // Rejection floor: nothing written. The word holds a time far in the future.
    let far = AtomicU64::new(u64::MAX);
    g.bench_function("upkeep/load_only", |b| {
        b.iter(|| floor_reject(&far, &upkeep))
    });
    g.finish();
}

fn bench_admit_1t(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit_1t");
    fn one<C: Clock>(g: &mut BenchmarkGroup<'_, WallTime>, id: &str, alg: Algorithm, clock: C) {
        let limiter = admit_limiter(id, alg, clock);
        g.bench_function(id, |b| b.iter(|| limiter.try_acquire()));
        assert_no_rejections(id, &limiter);
    }
    for (name, alg) in ADMIT {
        one(
            &mut g,
            &format!("turnstile/{name}"),
            alg,
            DefaultClock::new(),
        );
    }
    // The same calls when the caller only looks at `is_ok()`: `try_acquire` returns a 48-byte
    // `Result` through memory, and copying all of it (as a black-boxed value is copied) costs a few
    // ns that a caller reading one field does not pay. governor's `check()` returns `Ok(())`.
    for (name, alg) in ADMIT {
        let id = format!("turnstile/{name} (is_ok)");
        let limiter = admit_limiter(&id, alg, DefaultClock::new());
        g.bench_function(&id, |b| b.iter(|| limiter.try_acquire().is_ok()));
        assert_no_rejections(&id, &limiter);
    }
    for (name, alg) in ADMIT {
        one(
            &mut g,
            &format!("turnstile/{name}@monotonic"),
            alg,
            MonotonicClock::new(),
        );
    }
    for (name, alg) in ADMIT {
        one(
            &mut g,
            &format!("turnstile/{name}@quanta"),
            alg,
            QuantaTsc::new(),
        );
    }

    let gov = governor::RateLimiter::direct(governor_admit_quota());
    assert!(gov.check().is_ok());
    g.bench_function("governor/default_clock", |b| b.iter(|| gov.check()));
    assert!(gov.check().is_ok());

    {
        let clock = QuantaUpkeepClock::from_interval(QUANTA_UPKEEP).expect("quanta upkeep thread");
        std::thread::sleep(QUANTA_UPKEEP * 3);
        let gov = governor::RateLimiter::direct_with_clock(governor_admit_quota(), clock);
        assert!(gov.check().is_ok());
        g.bench_function("governor/upkeep_clock", |b| b.iter(|| gov.check()));
        assert!(gov.check().is_ok());
    }

    let gov = governor::RateLimiter::direct_with_clock(governor_admit_quota(), GovMonotonicClock);
    assert!(gov.check().is_ok());
    g.bench_function("governor/monotonic_clock", |b| b.iter(|| gov.check()));
    assert!(gov.check().is_ok());
    g.finish();
}

fn bench_reject_1t(c: &mut Criterion) {
    let mut g = c.benchmark_group("reject_1t");
    for (name, alg) in REJECT {
        let id = format!("turnstile/{name}");
        let limiter = reject_limiter(&id, alg, DefaultClock::new());
        g.bench_function(&id, |b| b.iter(|| limiter.try_acquire()));
        assert_no_admissions(&id, &limiter);
    }

    let gov = governor::RateLimiter::direct(governor_reject_quota());
    assert!(gov.check().is_ok() && gov.check().is_err());
    g.bench_function("governor/default_clock", |b| b.iter(|| gov.check()));
    assert!(gov.check().is_err());

    {
        let clock = QuantaUpkeepClock::from_interval(QUANTA_UPKEEP).expect("quanta upkeep thread");
        std::thread::sleep(QUANTA_UPKEEP * 3);
        let gov = governor::RateLimiter::direct_with_clock(governor_reject_quota(), clock);
        assert!(gov.check().is_ok() && gov.check().is_err());
        g.bench_function("governor/upkeep_clock", |b| b.iter(|| gov.check()));
        assert!(gov.check().is_err());
    }
    g.finish();
}

/// Runs `call` `iters` times on each of two threads started together; returns the wall time from the
/// first thread's start to the last thread's end (thread spawn and join are not timed).
fn two_threads<R>(iters: u64, call: impl Fn() -> R + Sync) -> Duration {
    let barrier = Barrier::new(2);
    let run = || {
        barrier.wait();
        let start = Instant::now();
        for _ in 0..iters {
            black_box(call());
        }
        (start, Instant::now())
    };
    let ((s1, e1), (s2, e2)) = std::thread::scope(|s| {
        let a = s.spawn(run);
        let b = s.spawn(run);
        (a.join().unwrap(), b.join().unwrap())
    });
    e1.max(e2) - s1.min(s2)
}

fn bench_two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("admit_2t");
    // The contended floor, measured in the same minute as the limiters: both threads CAS one word.
    // Cross-core CAS cost on this VM moves with where the host runs the two vCPUs, so compare the
    // 2-thread rows with these rather than with the single-thread floor.
    let upkeep = UpkeepClock::new();
    let shared = AtomicU64::new(0);
    g.bench_function("floor/upkeep", |b| {
        b.iter_custom(|iters| two_threads(iters, || floor_admit(&shared, &upkeep)))
    });
    let quanta = QuantaTsc::new();
    g.bench_function("floor/quanta", |b| {
        b.iter_custom(|iters| two_threads(iters, || floor_admit(&shared, &quanta)))
    });
    for (name, alg) in ADMIT {
        let id = format!("turnstile/{name}");
        let limiter = admit_limiter(&id, alg, DefaultClock::new());
        g.bench_function(&id, |b| {
            b.iter_custom(|iters| two_threads(iters, || limiter.try_acquire()))
        });
        assert_no_rejections(&id, &limiter);
    }
    let gov = governor::RateLimiter::direct(governor_admit_quota());
    g.bench_function("governor/default_clock", |b| {
        b.iter_custom(|iters| two_threads(iters, || gov.check()))
    });
    assert!(gov.check().is_ok());
    g.finish();

    let mut g = c.benchmark_group("reject_2t");
    for (name, alg) in REJECT {
        let id = format!("turnstile/{name}");
        let limiter = reject_limiter(&id, alg, DefaultClock::new());
        g.bench_function(&id, |b| {
            b.iter_custom(|iters| two_threads(iters, || limiter.try_acquire()))
        });
        assert_no_admissions(&id, &limiter);
    }
    let gov = governor::RateLimiter::direct(governor_reject_quota());
    assert!(gov.check().is_ok() && gov.check().is_err());
    g.bench_function("governor/default_clock", |b| {
        b.iter_custom(|iters| two_threads(iters, || gov.check()))
    });
    assert!(gov.check().is_err());
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_clocks, bench_floors, bench_admit_1t, bench_reject_1t, bench_two_threads
}
/// This process's threads and the CPU time each has run so far, in nanoseconds (the first field
/// of `/proc/self/task/*/schedstat`; Linux).
fn thread_cpu_ns() -> std::collections::HashMap<std::ffi::OsString, u64> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (Linux)")
        .filter_map(|task| {
            let task = task.ok()?;
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            Some((
                task.file_name(),
                stat.split_whitespace().next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// The number of threads this process has now.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (Linux)")
        .count()
}

/// The cases of `clock-cpu`: what runs during each one-second window.
const CPU_CASES: [&str; 7] = [
    "nothing",
    "turnstile `UpkeepClock` (1 ms), never read",
    "quanta `Upkeep` (1 ms; governor's `QuantaUpkeepClock`), never read",
    "turnstile `UpkeepClock`, read every 5 ms",
    "`MonotonicClock`, read every 5 ms",
    "turnstile `UpkeepClock`, read every 0.2 ms",
    "`MonotonicClock`, read every 0.2 ms",
];

/// Reads `clock` every `every` for `window`.
fn read_every<C: Clock>(clock: &C, every: Duration, window: Duration) {
    let end = Instant::now() + window;
    while Instant::now() < end {
        black_box(clock.now());
        std::thread::sleep(every);
    }
}

/// The CPU (all threads) that one window of `case` takes, in milliseconds per second.
fn cpu_window(case: usize) -> f64 {
    let window = Duration::from_secs(1);
    // The CPU each thread alive at the end ran during the window (a thread that exits within
    // it would take its time out of a plain sum).
    let measure = |run: &dyn Fn()| {
        let (start, before) = (Instant::now(), thread_cpu_ns());
        run();
        let cpu: u64 = thread_cpu_ns()
            .iter()
            .map(|(tid, ns)| ns.saturating_sub(before.get(tid).copied().unwrap_or(0)))
            .sum();
        cpu as f64 / 1e6 / start.elapsed().as_secs_f64()
    };
    let upkeep = || UpkeepClock::with_interval(Duration::from_millis(1)).expect("1 ms");
    match case {
        0 => measure(&|| std::thread::sleep(window)),
        1 => {
            let clock = upkeep();
            // Its thread parks after a few ticks with no read.
            std::thread::sleep(Duration::from_millis(50));
            let cpu = measure(&|| std::thread::sleep(window));
            drop(clock);
            cpu
        }
        2 => {
            let handle = quanta::Upkeep::new(QUANTA_UPKEEP)
                .start()
                .expect("quanta upkeep thread");
            std::thread::sleep(Duration::from_millis(50));
            let cpu = measure(&|| std::thread::sleep(window));
            drop(handle);
            cpu
        }
        3 | 5 => {
            let clock = upkeep();
            let every = Duration::from_micros(if case == 3 { 5_000 } else { 200 });
            measure(&|| read_every(&clock, every, window))
        }
        4 | 6 => {
            let clock = MonotonicClock::new();
            let every = Duration::from_micros(if case == 4 { 5_000 } else { 200 });
            measure(&|| read_every(&clock, every, window))
        }
        _ => unreachable!("no case {case}"),
    }
}

/// **CPU of the clocks' threads** (`clock-cpu`, only when named; Linux): each case of
/// [`CPU_CASES`] for one second, the order rotating, `ROUNDS` rounds; the medians of the
/// process's CPU time per second (all threads). An upkeep thread woken every millisecond is not
/// free, least of all in a VM, where each wake-up of an idle vCPU goes through the hypervisor.
fn clock_cpu() {
    const ROUNDS: usize = 7;
    if !std::env::args().any(|a| a == "clock-cpu") {
        return;
    }
    let threads = thread_count();
    let mut rounds = vec![Vec::new(); CPU_CASES.len()];
    for round in 0..ROUNDS {
        for k in 0..CPU_CASES.len() {
            let case = (round + k) % CPU_CASES.len();
            // The clock threads of the case before have exited (a thread that exits within a
            // window would take its CPU time out of the sum).
            let deadline = Instant::now() + Duration::from_secs(10);
            while thread_count() > threads {
                assert!(
                    Instant::now() < deadline,
                    "a clock thread outlived its clock"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            rounds[case].push(cpu_window(case));
        }
    }
    let mut table = format!(
        "CPU time of the process per second of wall time, all threads: medians of {ROUNDS} \
         one-second windows, order rotating\n\n| case | ms of CPU per s | min–max |\n|---|---|---|\n"
    );
    for (name, mut values) in CPU_CASES.iter().zip(rounds) {
        values.sort_by(f64::total_cmp);
        table += &format!(
            "| {name} | {:.2} | {:.2}–{:.2} |\n",
            values[values.len() / 2],
            values[0],
            values[values.len() - 1]
        );
    }
    println!("\n{table}");
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(
            || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
            Into::into,
        )
        .join("criterion");
    std::fs::create_dir_all(&dir).expect("create the output directory");
    std::fs::write(dir.join("clock-cpu.md"), table).expect("write the table");
}

criterion_main!(benches, clock_cpu);
