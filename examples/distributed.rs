//! Several processes sharing one limit through Redis.
//!
//! ```sh
//! cargo run --release --features redis --example distributed            # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --release --features redis --example distributed
//! ```
//!
//! The parent starts three copies of itself. Each runs eight tasks that call `try_acquire` on one
//! subject for three seconds against a sliding window of 100 permits per second, and prints the
//! times Redis assigned to its admissions. The parent merges them and prints, per process, what it
//! got, and the busiest one-second interval on Redis's clock: never more than 100. A process
//! that fails (Redis unreachable, or failing during the run) fails the example, which otherwise
//! checked the admissions of the processes that did run, down to none at all.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use turnstile::redis::{Client, aio::ConnectionManager};
use turnstile::{Algorithm, FailurePolicy, RedisLimiter, TryAcquireError};

const LIMIT: u32 = 100;
const WINDOW: Duration = Duration::from_secs(1);
const PROCESSES: usize = 3;
const RUN: Duration = Duration::from_secs(3);

/// The redis-server this example started: killed when dropped, on every way out of `main`.
struct OwnServer(Child);

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return worker(&args[2]);
    }
    // A server of our own unless one is given.
    let (url, _own) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let child = OwnServer(
                Command::new("redis-server")
                    .args([
                        "--port",
                        &port.to_string(),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ])
                    .stdout(Stdio::null())
                    .spawn()
                    .map_err(|e| {
                        format!("cannot start redis-server ({e}); install it or set REDIS_URL")
                    })?,
            );
            let url = format!("redis://127.0.0.1:{port}/");
            let client = Client::open(url.as_str())?;
            let started = Instant::now();
            while client.get_connection().is_err() {
                if started.elapsed() > Duration::from_secs(10) {
                    return Err("redis-server did not start".into());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            (url, Some(child))
        }
    };
    // A fresh prefix per run, so that earlier runs' state does not count.
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros()
        .to_string();
    let me = std::env::current_exe()?;
    let workers: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&me)
                .args(["worker", &url])
                .env("RUN_ID", &run_id)
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut all = Vec::new();
    let mut failed = 0;
    for (i, worker) in workers.into_iter().enumerate() {
        let output = worker.wait_with_output()?;
        if !output.status.success() {
            // The others are waited for all the same, before the server goes.
            println!("process {i}: failed ({})", output.status);
            failed += 1;
            continue;
        }
        let times: Vec<u64> = String::from_utf8(output.stdout)?
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        println!("process {i}: {} admitted", times.len());
        all.extend(times);
    }
    if failed > 0 {
        return Err(format!("{failed} of {PROCESSES} processes failed: see their errors").into());
    }
    all.sort_unstable();
    // The busiest interval of one window: for each admission, how many lie in [t, t + window).
    let window = WINDOW.as_nanos() as u64;
    let mut busiest = 0;
    let mut end = 0;
    for (start, &t) in all.iter().enumerate() {
        while end < all.len() && all[end] < t + window {
            end += 1;
        }
        busiest = busiest.max(end - start);
    }
    println!(
        "total {} admitted in {RUN:?} by {PROCESSES} processes; busiest {WINDOW:?} on Redis's clock: {busiest} (limit {LIMIT})",
        all.len()
    );
    if busiest > LIMIT as usize {
        return Err("the limit was exceeded".into());
    }
    Ok(())
}

/// One process: eight tasks on one subject; prints the Redis time (ns) of each admission. Fails
/// if a decision does (the limiter fails closed when Redis does): its admissions would be
/// missing from the count.
fn worker(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let connection = ConnectionManager::new(Client::open(url)?).await?;
        let limiter = RedisLimiter::builder(
            Algorithm::SlidingWindow {
                limit: LIMIT,
                window: WINDOW,
            },
            FailurePolicy::FailClosed,
        )
        .prefix(format!("distributed-example-{}", std::env::var("RUN_ID")?))
        .build(connection)?;
        let stop = Instant::now() + RUN;
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let mut times = Vec::new();
                    while Instant::now() < stop {
                        match limiter.try_acquire("shared-api-key").await {
                            Ok(admission) => times.push(admission.at_nanos()),
                            Err(TryAcquireError::Rejected(r)) => {
                                tokio::time::sleep(
                                    r.retry_after()
                                        .min(stop.saturating_duration_since(Instant::now())),
                                )
                                .await
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(times)
                })
            })
            .collect();
        for task in tasks {
            for t in task.await?? {
                println!("{t}");
            }
        }
        Ok(())
    })
}
