//! Blocking waiters racing a limiter's `close`, on real threads (shared by the keyed limiters'
//! tests).

use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::Duration;

/// Starts `threads` threads, released together, each waiting through `wait(key)`: even ones on
/// a key of their own (1, 3, ...: they make its queue), odd ones on key 0 (they share one).
/// `close` runs once they are released, after a spin that varies with `round`, so that it lands
/// before, during or after their enqueues. Returns every thread's answer; panics if one has
/// not answered 30 s after the close (it was left waiting in a queue the close missed).
pub fn waiters_racing_close<T: Send + 'static>(
    threads: u64,
    round: u64,
    wait: impl Fn(u64) -> T + Send + Sync + 'static,
    close: impl FnOnce(),
) -> Vec<T> {
    let wait = Arc::new(wait);
    let (done, ended) = mpsc::channel();
    let barrier = Arc::new(Barrier::new(threads as usize + 1));
    for t in 0..threads {
        let (wait, done, barrier) = (Arc::clone(&wait), done.clone(), Arc::clone(&barrier));
        std::thread::spawn(move || {
            barrier.wait();
            let key = if t % 2 == 0 { t + 1 } else { 0 };
            done.send(wait(key)).unwrap();
        });
    }
    barrier.wait();
    for _ in 0..round % 7 * 50 {
        std::hint::spin_loop();
    }
    close();
    (0..threads)
        .map(|_| {
            ended
                .recv_timeout(Duration::from_secs(30))
                .expect("a waiter was left waiting after the close")
        })
        .collect()
}
