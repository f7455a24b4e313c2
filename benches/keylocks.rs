//! Keyed reader/writer locks: turnstile's `KeyLocks` against a naive
//! `std::sync::Mutex<HashMap<K, Arc<tokio::sync::RwLock<()>>>>` and against the published
//! `key-rwlock` crate (a `tokio::sync::Mutex<HashMap<K, Arc<RwLock<()>>>>` cleaned every 1000
//! accesses), in the same run.
//!
//! ```text
//! cargo bench --bench keylocks          # about 1 min 30 s: 1 s warm-up, 2 s measurement each
//! ```
//!
//! Groups (criterion ids are `group/function`; keys are `u64`, hashed with std's `RandomState`
//! everywhere):
//!
//! | group | what |
//! |---|---|
//! | `keylocks_write_fresh` | write lock + unlock on a new key every time (the entry is created and removed each time; key-rwlock's map grows to 1000 keys between clean-ups) |
//! | `keylocks_write_hot` | write lock + unlock on one key nobody else uses |
//! | `keylocks_read_hot` | read lock + unlock on one key nobody else uses |
//! | `keylocks_mix_2t` | two threads on two shared keys, 3 reads to 1 write, lock + unlock: wall time for `iters` operations on each thread, per operation. Async rows run each thread's loop on its own current-thread tokio runtime |
//! | `keylocks_cancel_middle` | turnstile only: one key held by a writer with 2N async waiters queued (readers and writers alternating); the time to cancel (drop) the middle N of them, in arrival order, so every cancellation is N/2 or more waiters away from either end of the queue. N = 1,000 and 10,000; criterion's throughput line gives the time per cancellation. Queueing the waiters and clearing up are not timed |
//!
//! Async lock calls in the single-thread groups are polled once with a no-op waker and must be
//! ready (nothing else holds the key); a pending poll panics, so a number can never hide a wait.
//! `turnstile/try_*` rows use the non-async `try_read`/`try_write`.

use criterion::{Criterion, criterion_group, criterion_main};
use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::{Arc, Barrier, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};
use turnstile::KeyLocks;

/// Polls `fut` once; it must be ready.
#[inline(always)]
fn ready<F: Future>(fut: F) -> F::Output {
    let fut = pin!(fut);
    match fut.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an uncontended lock call was not ready at its first poll"),
    }
}

/// The naive keyed lock: a std mutex around a map of `Arc<tokio::sync::RwLock<()>>`; a guard's
/// drop removes the entry when the `Arc`'s strong count shows no other user (the map's reference
/// and the guard's). Users only get the `Arc` through the map under its mutex, so the check is
/// race-free. A cancelled wait leaves its entry behind until the key's next user releases.
#[derive(Default)]
struct Naive {
    map: Mutex<HashMap<u64, Arc<RwLock<()>>>>,
}

struct NaiveGuard<'a, G: LockOf> {
    naive: &'a Naive,
    key: u64,
    guard: Option<G>,
}

trait LockOf {
    fn lock_of(&self) -> &Arc<RwLock<()>>;
}

impl LockOf for OwnedRwLockReadGuard<()> {
    fn lock_of(&self) -> &Arc<RwLock<()>> {
        OwnedRwLockReadGuard::rwlock(self)
    }
}

impl LockOf for OwnedRwLockWriteGuard<()> {
    fn lock_of(&self) -> &Arc<RwLock<()>> {
        OwnedRwLockWriteGuard::rwlock(self)
    }
}

impl<G: LockOf> Drop for NaiveGuard<'_, G> {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        {
            let mut map = self.naive.map.lock().unwrap();
            // The map's reference and ours: nobody else holds or waits.
            if Arc::strong_count(guard.lock_of()) == 2 {
                map.remove(&self.key);
            }
        }
        drop(guard);
    }
}

impl Naive {
    fn entry(&self, key: u64) -> Arc<RwLock<()>> {
        Arc::clone(self.map.lock().unwrap().entry(key).or_default())
    }

    async fn read(&self, key: u64) -> NaiveGuard<'_, OwnedRwLockReadGuard<()>> {
        let guard = self.entry(key).read_owned().await;
        NaiveGuard {
            naive: self,
            key,
            guard: Some(guard),
        }
    }

    async fn write(&self, key: u64) -> NaiveGuard<'_, OwnedRwLockWriteGuard<()>> {
        let guard = self.entry(key).write_owned().await;
        NaiveGuard {
            naive: self,
            key,
            guard: Some(guard),
        }
    }

    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

fn bench_single_thread(c: &mut Criterion) {
    // Fresh key every time.
    {
        let mut g = c.benchmark_group("keylocks_write_fresh");
        let locks: KeyLocks<u64> = KeyLocks::new();
        let mut key = 0u64;
        g.bench_function("turnstile", |b| {
            b.iter(|| {
                key += 1;
                drop(black_box(ready(locks.write(&key))));
            })
        });
        g.bench_function("turnstile/try_write", |b| {
            b.iter(|| {
                key += 1;
                drop(black_box(locks.try_write(&key).unwrap()));
            })
        });
        assert!(locks.is_empty());
        let naive = Naive::default();
        g.bench_function("naive_mutex_hashmap", |b| {
            b.iter(|| {
                key += 1;
                drop(black_box(ready(naive.write(key))));
            })
        });
        assert_eq!(naive.len(), 0);
        let krw = key_rwlock::KeyRwLock::<u64>::new();
        g.bench_function("key_rwlock", |b| {
            b.iter(|| {
                key += 1;
                drop(black_box(ready(krw.write(key))));
            })
        });
        g.finish();
    }
    // One hot key, written.
    {
        let mut g = c.benchmark_group("keylocks_write_hot");
        let locks: KeyLocks<u64> = KeyLocks::new();
        g.bench_function("turnstile", |b| {
            b.iter(|| drop(black_box(ready(locks.write(&7)))))
        });
        g.bench_function("turnstile/try_write", |b| {
            b.iter(|| drop(black_box(locks.try_write(&7).unwrap())))
        });
        assert!(locks.is_empty());
        let naive = Naive::default();
        g.bench_function("naive_mutex_hashmap", |b| {
            b.iter(|| drop(black_box(ready(naive.write(7)))))
        });
        let krw = key_rwlock::KeyRwLock::<u64>::new();
        g.bench_function("key_rwlock", |b| {
            b.iter(|| drop(black_box(ready(krw.write(7)))))
        });
        g.finish();
    }
    // One hot key, read.
    {
        let mut g = c.benchmark_group("keylocks_read_hot");
        let locks: KeyLocks<u64> = KeyLocks::new();
        g.bench_function("turnstile", |b| {
            b.iter(|| drop(black_box(ready(locks.read(&7)))))
        });
        g.bench_function("turnstile/try_read", |b| {
            b.iter(|| drop(black_box(locks.try_read(&7).unwrap())))
        });
        assert!(locks.is_empty());
        let naive = Naive::default();
        g.bench_function("naive_mutex_hashmap", |b| {
            b.iter(|| drop(black_box(ready(naive.read(7)))))
        });
        let krw = key_rwlock::KeyRwLock::<u64>::new();
        g.bench_function("key_rwlock", |b| {
            b.iter(|| drop(black_box(ready(krw.read(7)))))
        });
        g.finish();
    }
}

/// The mixed workload's `i`-th operation: (key, write?). Two hot keys, one write in four.
#[inline(always)]
fn op(i: u64) -> (u64, bool) {
    (i % 2, i % 4 == 3)
}

/// Runs `run(thread, iters)` on each of two threads (thread = 0, 1) started together; returns the
/// wall time from the first start to the last end (thread spawn and join are not timed).
fn two_threads<R: Fn(usize, u64) + Sync>(iters: u64, run: R) -> Duration {
    let barrier = Barrier::new(2);
    let thread = |t| {
        barrier.wait();
        let start = Instant::now();
        run(t, iters);
        (start, Instant::now())
    };
    let ((s1, e1), (s2, e2)) = std::thread::scope(|s| {
        let a = s.spawn(|| thread(0));
        let b = s.spawn(|| thread(1));
        (a.join().unwrap(), b.join().unwrap())
    });
    e1.max(e2) - s1.min(s2)
}

/// Runs an async loop to completion on `runtime`.
fn on_runtime<F: Future<Output = ()>>(runtime: &tokio::runtime::Runtime, fut: F) {
    runtime.block_on(fut);
}

fn bench_mix_two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("keylocks_mix_2t");
    let runtimes: Vec<_> = (0..2)
        .map(|_| {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
        })
        .collect();
    // One current-thread runtime per bench thread, built once, outside the timed region.

    let locks: KeyLocks<u64> = KeyLocks::new();
    g.bench_function("turnstile", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |t, n| {
                on_runtime(&runtimes[t], async {
                    for i in 0..n {
                        let (key, write) = op(i);
                        if write {
                            drop(black_box(locks.write(&key).await));
                        } else {
                            drop(black_box(locks.read(&key).await));
                        }
                    }
                })
            })
        })
    });
    g.bench_function("turnstile/blocking", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |_, n| {
                for i in 0..n {
                    let (key, write) = op(i);
                    if write {
                        drop(black_box(locks.write_blocking(&key)));
                    } else {
                        drop(black_box(locks.read_blocking(&key)));
                    }
                }
            })
        })
    });
    assert!(locks.is_empty());

    let naive = Naive::default();
    g.bench_function("naive_mutex_hashmap", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |t, n| {
                on_runtime(&runtimes[t], async {
                    for i in 0..n {
                        let (key, write) = op(i);
                        if write {
                            drop(black_box(naive.write(key).await));
                        } else {
                            drop(black_box(naive.read(key).await));
                        }
                    }
                })
            })
        })
    });
    assert_eq!(naive.len(), 0);

    let krw = key_rwlock::KeyRwLock::<u64>::new();
    g.bench_function("key_rwlock", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, |t, n| {
                on_runtime(&runtimes[t], async {
                    for i in 0..n {
                        let (key, write) = op(i);
                        if write {
                            drop(black_box(krw.write(key).await));
                        } else {
                            drop(black_box(krw.read(key).await));
                        }
                    }
                })
            })
        })
    });
    g.finish();
}

/// Cancellation in the middle of one key's queue: what one hot key's cancellations cost the shard
/// mutex that every other key of the shard shares.
fn bench_cancel_middle(c: &mut Criterion) {
    let mut g = c.benchmark_group("keylocks_cancel_middle");
    // An iteration takes milliseconds (it builds 2N futures): fewer, flat samples.
    g.sample_size(10)
        .sampling_mode(criterion::SamplingMode::Flat);
    let locks: KeyLocks<u64> = KeyLocks::new();
    for n in [1_000usize, 10_000] {
        g.throughput(criterion::Throughput::Elements(n as u64));
        g.bench_function(criterion::BenchmarkId::new("turnstile", n), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let held = locks.try_write(&0).unwrap();
                    let mut waiting: Vec<Option<std::pin::Pin<Box<dyn Future<Output = ()>>>>> = (0
                        ..2 * n)
                        .map(|i| {
                            let wait: std::pin::Pin<Box<dyn Future<Output = ()>>> = if i % 2 == 0 {
                                Box::pin(async { drop(locks.read(&0).await) })
                            } else {
                                Box::pin(async { drop(locks.write(&0).await) })
                            };
                            Some(wait)
                        })
                        .collect();
                    for wait in waiting.iter_mut().flatten() {
                        let pending = wait
                            .as_mut()
                            .poll(&mut Context::from_waker(Waker::noop()))
                            .is_pending();
                        assert!(pending, "a waiter was granted while the key was held");
                    }
                    let start = Instant::now();
                    for wait in &mut waiting[n / 2..n / 2 + n] {
                        drop(black_box(wait.take()));
                    }
                    timed += start.elapsed();
                    assert_eq!(locks.waiters(&0), n);
                    drop(held);
                    drop(waiting);
                    assert!(locks.is_empty());
                }
                timed
            })
        });
    }
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
    targets = bench_single_thread, bench_mix_two_threads, bench_cancel_middle
}
criterion_main!(benches);
