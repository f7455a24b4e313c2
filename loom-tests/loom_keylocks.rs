//! Loom models of `KeyLocks` (`src/keylocks.rs`).
//!
//! Protocol under test: each shard is a mutex around a table of keys in use; a key's doorman
//! `{ readers, writer, queue, waiting }` is created (or taken from the shard's bounded pool) on
//! first use and leaves the table, back to the pool, when `readers + writer + waiting` (live
//! waiters) reaches zero. Grants are hand-offs: the releaser removes the waiter from the queue,
//! counts its hold, and wakes it after unlocking; a waiter learns it was granted by not finding its
//! ticket. A dropped waiter either cancels its ticket (left as a tombstone that grants skip) or, if
//! granted meanwhile, gives the hold back (the refund).
//!
//! Models (one shard, pool bound 1, so every release of the last hold returns the doorman to the
//! pool and the next first use takes it back out):
//!
//! 1. `acquire_release_pool_*`: blocking writers/readers on one key racing a second key of the same
//!    shard whose doorman cycles through the pool. Mutual exclusion is checked inside every
//!    critical section with a loom atomic; a doorman that left the table while a waiter still
//!    referenced it would hit the `unreachable!` in the waiter's look. At the end the map is empty,
//!    the pool within its bound, and the key free.
//! 2. `cancel_vs_grant_*`: a read or write future polled once (queued behind a held writer) and
//!    then dropped, racing the writer's release, with a blocking writer queued too. Whatever the
//!    order, the lock ends free, nothing is leaked, and the blocking writer is served; a lost
//!    wake-up would leave it blocked forever, which loom reports as a deadlock.
//! 3. `cancel_middle_vs_grant`: three futures queued behind a held writer (reader, writer,
//!    reader); the writer in the middle is dropped, leaving a tombstone, racing the release. The
//!    grant must skip the tombstone into the reader batch whichever comes first, and the tombstone
//!    must not keep the key in use.
//! 4. `blocking_timeout_vs_grant`: a blocking writer with a zero time limit (one look, then it
//!    gives up) racing the holder's release, with a blocking reader queued too: the grant is kept,
//!    refunded or never made, and the reader is served either way.
//! 5. `async_waiter_is_woken`: a task waiting in `read().await` (driven by `block_on` below, whose
//!    waker unparks a loom thread) is woken by the writer's release.
//!
//! Run: `RUSTFLAGS="--cfg turnstile_loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom
//! cargo test --release -p turnstile-loom-tests --test loom_keylocks`
#![cfg(turnstile_loom)]

mod common;
use common::model;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use turnstile::KeyLocks;

fn locks() -> KeyLocks<u8> {
    KeyLocks::builder()
        .shards(1)
        .pool_per_shard(1)
        .build()
        .unwrap()
}

const WRITER: usize = 1 << 16;

/// Who is inside one key's critical section: a writer bit and a reader count.
#[derive(Clone)]
struct Inside(Arc<AtomicUsize>);

impl Inside {
    fn new() -> Self {
        Inside(Arc::new(AtomicUsize::new(0)))
    }

    fn write(&self) {
        let before = self.0.fetch_add(WRITER, Ordering::SeqCst);
        assert_eq!(before, 0, "a writer found others inside");
        self.0.fetch_sub(WRITER, Ordering::SeqCst);
    }

    fn read(&self) {
        let before = self.0.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before & WRITER, 0, "a reader found a writer inside");
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The end state every model must reach.
fn assert_quiescent(locks: &KeyLocks<u8>) {
    assert_eq!(locks.len(), 0, "a doorman is still in the map");
    assert!(locks.pooled() <= 1, "the pool outgrew its bound");
    assert!(locks.try_write(&0).is_ok(), "the key is not free");
    assert_eq!(locks.len(), 0);
}

fn poll_once<F: Future>(fut: std::pin::Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// A waker that unparks a loom thread.
struct Unpark(loom::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// Drives `fut` to completion on the current loom thread, parking while it is pending. loom's
/// own `block_on` needs its `futures` feature; this is the same idea with `park`/`unpark`
/// (an unpark before the park is kept as a token, as in std). A wake-up that never comes leaves
/// every thread parked, which loom reports as a deadlock.
fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let waker = Waker::from(std::sync::Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        thread::park();
    }
}

/// A blocking writer and a blocking reader on key 0, while the main thread cycles key 1's doorman
/// through the pool of the same shard and also tries key 0.
#[test]
fn acquire_release_pool_writer_reader() {
    model(|| {
        let locks = locks();
        let inside = Inside::new();
        let writer = {
            let (locks, inside) = (locks.clone(), inside.clone());
            thread::spawn(move || {
                let _w = locks.write_blocking(&0);
                inside.write();
            })
        };
        let reader = {
            let (locks, inside) = (locks.clone(), inside.clone());
            thread::spawn(move || {
                let _r = locks.read_blocking(&0);
                inside.read();
            })
        };
        drop(locks.try_write(&1).expect("key 1 is only used here"));
        if let Ok(_w) = locks.try_write(&0) {
            inside.write();
        }
        writer.join().unwrap();
        reader.join().unwrap();
        assert_quiescent(&locks);
    });
}

/// Two blocking writers on key 0 (one waits for the other, hand-off on release) while the main
/// thread reads key 0 and cycles key 1 through the pool.
#[test]
fn acquire_release_pool_two_writers() {
    model(|| {
        let locks = locks();
        let inside = Inside::new();
        let writers: Vec<_> = (0..2)
            .map(|_| {
                let (locks, inside) = (locks.clone(), inside.clone());
                thread::spawn(move || {
                    let _w = locks.write_blocking(&0);
                    inside.write();
                })
            })
            .collect();
        if let Ok(_r) = locks.try_read(&0) {
            inside.read();
        }
        drop(locks.try_read(&1).expect("key 1 is only used here"));
        for w in writers {
            w.join().unwrap();
        }
        assert_quiescent(&locks);
    });
}

/// Two blocking readers (sharing) and a blocking writer on key 0, so the doorman's reference count
/// goes above one and its last holder is either kind; the main thread also cycles key 1.
#[test]
fn acquire_release_pool_two_readers_writer() {
    model(|| {
        let locks = locks();
        let inside = Inside::new();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (locks, inside) = (locks.clone(), inside.clone());
                thread::spawn(move || {
                    let _r = locks.read_blocking(&0);
                    inside.read();
                })
            })
            .collect();
        {
            let _w = locks.write_blocking(&0);
            inside.write();
        }
        drop(locks.try_write(&1).expect("key 1 is only used here"));
        for r in readers {
            r.join().unwrap();
        }
        assert_quiescent(&locks);
    });
}

/// A future for key 0 is polled once while a writer holds the key (so it queues, unless the
/// release came first) and then dropped, racing the writer's release; a blocking writer waits
/// too. Covers: cancel while queued, cancel after the grant (refund), and grant after cancel.
fn cancel_vs_grant(write: bool) {
    model(move || {
        let locks = locks();
        let inside = Inside::new();
        let held = locks.try_write_owned(&0).unwrap();
        let canceller = {
            let (locks, inside) = (locks.clone(), inside.clone());
            thread::spawn(move || {
                if write {
                    let fut = pin!(locks.write(&0));
                    if let Poll::Ready(_w) = poll_once(fut) {
                        inside.write();
                    }
                } else {
                    let fut = pin!(locks.read(&0));
                    if let Poll::Ready(_r) = poll_once(fut) {
                        inside.read();
                    }
                }
                // The future is dropped here, queued or granted.
            })
        };
        let releaser = thread::spawn(move || drop(held));
        {
            let _w = locks.write_blocking(&0);
            inside.write();
        }
        canceller.join().unwrap();
        releaser.join().unwrap();
        assert_quiescent(&locks);
    });
}

#[test]
fn cancel_vs_grant_read() {
    cancel_vs_grant(false);
}

#[test]
fn cancel_vs_grant_write() {
    cancel_vs_grant(true);
}

/// Queue: R1 W R2 behind a held writer, all queued on the main thread before the race. One thread
/// drops W, another releases the writer, and the main thread waits for R1 and then R2. If the
/// cancel comes first, W is a tombstone in the middle and the release grants R1 and R2 together,
/// skipping it; if the release comes first, it grants R1 only, and the cancel either finds W at
/// the front (and grants R2) or, if R1 has already come and gone, finds W granted and refunds it
/// (which grants R2). Either way both readers get in (a lost grant is a deadlock) and the key
/// ends free with nothing left in the map.
#[test]
fn cancel_middle_vs_grant() {
    model(|| {
        let locks = locks();
        let inside = Inside::new();
        let held = locks.try_write_owned(&0).unwrap();
        let reader = |locks: KeyLocks<u8>, inside: Inside| {
            Box::pin(async move {
                let _r = locks.read(&0).await;
                inside.read();
            })
        };
        let mut r1 = reader(locks.clone(), inside.clone());
        assert!(poll_once(r1.as_mut()).is_pending());
        let mut w = {
            let (locks, inside) = (locks.clone(), inside.clone());
            Box::pin(async move {
                let _w = locks.write(&0).await;
                inside.write();
            })
        };
        assert!(poll_once(w.as_mut()).is_pending());
        let mut r2 = reader(locks.clone(), inside.clone());
        assert!(poll_once(r2.as_mut()).is_pending());
        assert_eq!(locks.waiters(&0), 3);
        let canceller = thread::spawn(move || drop(w));
        let releaser = thread::spawn(move || drop(held));
        block_on(r1);
        block_on(r2);
        canceller.join().unwrap();
        releaser.join().unwrap();
        assert_quiescent(&locks);
    });
}

/// A blocking wait with a time limit gives up racing the grant: with `Duration::ZERO` the thread
/// queues behind the held writer (unless the release came first), registers its signal in one
/// look, and gives up at once, whatever the clock says. The release may come before the look
/// (granted: it keeps the lock), between the look and the giving up (the grant is refunded, and
/// its signal is notified after the thread has left), or after (a plain cancel). A blocking
/// reader queued too must be served in every case: a grant kept by the thread that gave up is a
/// deadlock.
#[test]
fn blocking_timeout_vs_grant() {
    model(|| {
        let locks = locks();
        let inside = Inside::new();
        let held = locks.try_write_owned(&0).unwrap();
        let giver_up = {
            let (locks, inside) = (locks.clone(), inside.clone());
            thread::spawn(move || {
                if let Some(_w) = locks.write_blocking_timeout(&0, std::time::Duration::ZERO) {
                    inside.write();
                }
            })
        };
        let releaser = thread::spawn(move || drop(held));
        {
            let _r = locks.read_blocking(&0);
            inside.read();
        }
        giver_up.join().unwrap();
        releaser.join().unwrap();
        assert_quiescent(&locks);
    });
}

/// An async reader waits behind a writer and is woken by the release (`block_on` parks the model
/// thread until its waker is called: a lost wake-up is a deadlock).
#[test]
fn async_waiter_is_woken() {
    model(|| {
        let locks = locks();
        let inside = Inside::new();
        let held = locks.try_write_owned(&0).unwrap();
        let reader = {
            let (locks, inside) = (locks.clone(), inside.clone());
            thread::spawn(move || {
                block_on(async {
                    let _r = locks.read(&0).await;
                    inside.read();
                })
            })
        };
        drop(held);
        reader.join().unwrap();
        assert_quiescent(&locks);
    });
}
