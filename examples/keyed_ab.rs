//! An interleaved A/B check of the keyed limiter against governor's keyed store, for a noisy
//! shared machine where criterion's absolute figures drift between groups: every round runs each
//! contender once, in turn, and the report gives medians of per-round ratios.
//!
//! ```text
//! cargo run --release --example keyed_ab -- calls [rounds [keys]]  # try_acquire vs check_key
//! cargo run --release --example keyed_ab -- sweep [rounds]   # sweep() vs retain_recent, 1M idle keys
//! cargo run --release --example keyed_ab -- mem              # heap bytes per key, empty limiter
//! cargo run --release --example keyed_ab -- spin N SECS      # one thread, fixed window, N keys (for perf)
//! ```
//!
//! Same configurations as `benches/keyed.rs` (admit runs, `u64` keys, pseudo-random lookups,
//! governor on its DashMap store with a 1 ms quanta upkeep clock, the same kind as turnstile's
//! default clock).

#[path = "../benches/common/heap.rs"]
mod heap;

use governor::Quota;
use governor::clock::{FakeRelativeClock, QuantaUpkeepClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use heap::{Heap, key_sequence};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};
use turnstile::{Algorithm, KeyedLimiter, ManualClock, Rate};

const SEQ_LEN: usize = 1 << 16;
const SEED_MAIN: u64 = 0x9E37_79B9_7F4A_7C15;
const SEED_OTHER: u64 = 0xD1B5_4A32_D192_ED03;
const BURST: u32 = 1 << 26;

type Gov<C> = governor::RateLimiter<
    u64,
    DashMapStateStore<u64>,
    C,
    NoOpMiddleware<<C as governor::clock::Clock>::Instant>,
>;

fn fixed() -> Algorithm {
    Algorithm::FixedWindow {
        limit: u32::MAX,
        window: Duration::from_secs(3600),
    }
}

fn bucket() -> Algorithm {
    Algorithm::TokenBucket {
        rate: Rate::per_minute(1),
        burst: BURST,
    }
}

fn populated(alg: Algorithm, n: u64) -> KeyedLimiter<u64> {
    let limiter = KeyedLimiter::new(alg).expect("valid configuration");
    for k in 0..n {
        limiter.try_acquire(&k).expect("first call");
    }
    limiter
}

/// ns per call of one thread running `calls` calls (with a second thread doing the same on
/// `other` if `two`).
fn time_calls(
    keys: &[u64],
    other: &[u64],
    calls: usize,
    two: bool,
    f: &(dyn Fn(u64) -> bool + Sync),
) -> f64 {
    let mask = SEQ_LEN - 1;
    let run = |seq: &[u64]| {
        let mut ok = 0usize;
        for i in 0..calls {
            ok += black_box(f(black_box(seq[i & mask]))) as usize;
        }
        ok
    };
    let elapsed = if two {
        let start = Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                start.wait();
                run(other)
            });
            start.wait();
            let t = Instant::now();
            let ok = run(keys);
            let e = t.elapsed();
            assert_eq!(ok, calls);
            e
        })
    } else {
        let t = Instant::now();
        let ok = run(keys);
        let e = t.elapsed();
        assert_eq!(ok, calls);
        e
    };
    elapsed.as_nanos() as f64 / calls as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn calls(rounds: usize, only: Option<u64>) {
    let upkeep = QuantaUpkeepClock::from_interval(Duration::from_millis(1)).expect("upkeep");
    let quota =
        Quota::per_minute(NonZeroU32::MIN).allow_burst(NonZeroU32::new(BURST).expect("> 0"));
    println!(
        "| keys | threads | turnstile fixed ns | bucket ns | governor ns | fixed ÷ gov | bucket ÷ gov |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (n, calls) in [(1_000u64, 2_000_000usize), (1_000_000, 400_000)] {
        if only.is_some_and(|only| only != n) {
            continue;
        }
        let keys = key_sequence(n, SEQ_LEN, SEED_MAIN);
        let other = key_sequence(n, SEQ_LEN, SEED_OTHER);
        let tf = populated(fixed(), n);
        let tb = populated(bucket(), n);
        let gov: Gov<QuantaUpkeepClock> =
            governor::RateLimiter::dashmap_with_clock(quota, upkeep.clone());
        for k in 0..n {
            gov.check_key(&k).expect("first call");
        }
        let contenders: [&(dyn Fn(u64) -> bool + Sync); 3] = [
            &|k| tf.try_acquire(&k).is_ok(),
            &|k| tb.try_acquire(&k).is_ok(),
            &|k| gov.check_key(&k).is_ok(),
        ];
        for two in [false, true] {
            // Warm-up round, discarded.
            for c in contenders {
                time_calls(&keys, &other, calls / 4, two, c);
            }
            let mut ns = [Vec::new(), Vec::new(), Vec::new()];
            let mut ratio = [Vec::new(), Vec::new()];
            for r in 0..rounds {
                let mut t = [0.0; 3];
                // Rotate the order so that no contender always runs right after another.
                for j in 0..3 {
                    let i = (j + r) % 3;
                    t[i] = time_calls(&keys, &other, calls, two, contenders[i]);
                }
                for i in 0..3 {
                    ns[i].push(t[i]);
                }
                ratio[0].push(t[0] / t[2]);
                ratio[1].push(t[1] / t[2]);
            }
            println!(
                "| {n} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
                if two { 2 } else { 1 },
                median(&mut ns[0]),
                median(&mut ns[1]),
                median(&mut ns[2]),
                median(&mut ratio[0]),
                median(&mut ratio[1]),
            );
        }
    }
}

fn sweep(rounds: usize, with_governor: bool) {
    const N: u64 = 1_000_000;
    let mut turn = Vec::new();
    let mut gov_t = Vec::new();
    for _ in 0..rounds {
        let clock = ManualClock::new();
        let limiter = KeyedLimiter::builder(Algorithm::FixedWindow {
            limit: 10,
            window: Duration::from_secs(1),
        })
        .clock(clock.clone())
        .max_keys(2_000_000)
        .build()
        .expect("valid");
        for k in 0..N {
            limiter.try_acquire(&k).expect("first");
        }
        clock.advance(Duration::from_secs(2));
        let t = Instant::now();
        let evicted = limiter.sweep();
        turn.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(evicted, N as usize);
        drop(limiter);
        if !with_governor {
            gov_t.push(1.0);
            continue;
        }

        let clock = FakeRelativeClock::default();
        let gov: Gov<FakeRelativeClock> = governor::RateLimiter::dashmap_with_clock(
            Quota::per_second(NonZeroU32::new(10).expect("> 0")),
            clock.clone(),
        );
        for k in 0..N {
            gov.check_key(&k).expect("first");
        }
        clock.advance(Duration::from_secs(2));
        let t = Instant::now();
        gov.retain_recent();
        gov_t.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(gov.len(), 0);
    }
    let mut ratio: Vec<f64> = turn.iter().zip(&gov_t).map(|(a, b)| a / b).collect();
    println!(
        "sweep of 1M idle keys: turnstile {:.1} ms, governor retain_recent {:.1} ms, ratio {:.2} (medians of {rounds})",
        median(&mut turn),
        median(&mut gov_t),
        median(&mut ratio)
    );
}

fn mem() {
    let per_key = |name: &str, n: u64, build: &dyn Fn(u64) -> Box<dyn std::any::Any>| {
        let before = Heap::now();
        let s = build(n);
        let after = Heap::now();
        drop(s);
        let bytes = after.live - before.live;
        let chunks = after.chunks - before.chunks;
        if n == 0 {
            println!("{name}, empty: {bytes} bytes ({chunks} as malloc chunks)");
        } else {
            println!(
                "{name}, {n} keys: {:.1} bytes/key ({:.1} as malloc chunks)",
                bytes as f64 / n as f64,
                chunks as f64 / n as f64
            );
        }
    };
    for (name, alg) in [
        (
            "turnstile fixed_window",
            Algorithm::FixedWindow {
                limit: 10,
                window: Duration::from_secs(1),
            },
        ),
        (
            "turnstile token_bucket",
            Algorithm::TokenBucket {
                rate: Rate::per_second(10),
                burst: 10,
            },
        ),
    ] {
        for (n, sweep) in [(0, false), (1_000_000, false), (1_000_000, true)] {
            let label = if sweep {
                format!("{name} after a sweep")
            } else {
                name.to_string()
            };
            per_key(&label, n, &|n| {
                let limiter = KeyedLimiter::builder(alg)
                    .clock(ManualClock::new())
                    .build()
                    .expect("valid");
                for k in 0..n {
                    limiter.try_acquire(&k).expect("first");
                }
                if sweep {
                    assert_eq!(limiter.sweep(), 0);
                }
                Box::new(limiter)
            });
        }
    }
    for n in [0, 1_000_000] {
        per_key("governor keyed (DashMap)", n, &|n| {
            let gov =
                governor::RateLimiter::keyed(Quota::per_second(NonZeroU32::new(10).expect("> 0")));
            for k in 0..n {
                gov.check_key(&k).expect("first");
            }
            Box::new(gov)
        });
    }
}

fn spin(n: u64, secs: u64) {
    let limiter = populated(fixed(), n);
    let keys = key_sequence(n, SEQ_LEN, SEED_MAIN);
    let end = Instant::now() + Duration::from_secs(secs);
    let mut calls = 0u64;
    while Instant::now() < end {
        for &k in &keys {
            black_box(limiter.try_acquire(black_box(&k)).is_ok());
        }
        calls += SEQ_LEN as u64;
    }
    println!("{calls} calls");
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: u64| {
        args.get(i)
            .map_or(default, |s| s.parse().expect("a number"))
    };
    match args.first().map(String::as_str) {
        Some("calls") => calls(num(1, 11) as usize, args.get(2).map(|_| num(2, 0))),
        Some("sweep") => sweep(num(1, 3) as usize, true),
        Some("sweep-only") => sweep(num(1, 1) as usize, false),
        Some("mem") => mem(),
        Some("spin") => spin(num(1, 1000), num(2, 5)),
        _ => eprintln!("usage: keyed_ab calls|sweep|mem|spin [...]"),
    }
}
