//! Chain fast paths: `Chain::try_acquire` and `KeyedChain::try_acquire` when nobody waits, admitted
//! and rejected, for the cost of the chain's queue gate (one load when nobody waits).
//!
//! ```text
//! cargo bench --bench chain                  # ~30 s: 1 s warm-up, 3 s measurement each
//! cargo bench --bench chain -- keyed_chain   # a filter
//! ```
//!
//! | group | what |
//! |---|---|
//! | `chain` | a chain of two limiters on the default clock: `admit` (limits never reached), `reject` (the second member exhausted at setup) |
//! | `keyed_chain` | a per-key limiter and a global one, one key: `admit`, `reject` (the key exhausted at setup) |
//!
//! Admit limits are `u32::MAX` per second: one thread cannot reach them.

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;
use turnstile::{Algorithm, Chain, KeyedChain, KeyedLimiter, RateLimiter};

fn window(limit: u32) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        window: Duration::from_secs(if limit == u32::MAX { 1 } else { 3600 }),
    }
}

fn chains(c: &mut Criterion) {
    let mut group = c.benchmark_group("chain");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    let admit = Chain::new([
        RateLimiter::new(window(u32::MAX)).unwrap(),
        RateLimiter::new(window(u32::MAX)).unwrap(),
    ])
    .unwrap();
    group.bench_function("admit", |b| b.iter(|| black_box(admit.try_acquire())));
    assert_eq!(admit.stats().rejected, 0);
    let full = RateLimiter::new(window(1)).unwrap();
    full.try_acquire().unwrap();
    let reject = Chain::new([RateLimiter::new(window(u32::MAX)).unwrap(), full]).unwrap();
    group.bench_function("reject", |b| b.iter(|| black_box(reject.try_acquire())));
    assert_eq!(reject.stats().admitted, 0);
    group.finish();

    let mut group = c.benchmark_group("keyed_chain");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    let admit = KeyedChain::builder()
        .per_key(KeyedLimiter::new(window(u32::MAX)).unwrap())
        .global(RateLimiter::new(window(u32::MAX)).unwrap())
        .build()
        .unwrap();
    group.bench_function("admit", |b| b.iter(|| black_box(admit.try_acquire(&7u64))));
    assert_eq!(admit.stats().rejected, 0);
    let per_key = KeyedLimiter::new(window(1)).unwrap();
    per_key.try_acquire(&7u64).unwrap();
    let reject = KeyedChain::builder()
        .per_key(per_key)
        .global(RateLimiter::new(window(u32::MAX)).unwrap())
        .build()
        .unwrap();
    group.bench_function("reject", |b| {
        b.iter(|| black_box(reject.try_acquire(&7u64)))
    });
    assert_eq!(reject.stats().admitted, 0);
    group.finish();
}

criterion_group!(benches, chains);
criterion_main!(benches);
