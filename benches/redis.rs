//! The Redis backend (issue 5): decisions per second against a local redis-server, beside the
//! sorted-set approach and the raw ceiling of the same script from `redis-benchmark`, all in one
//! run; then Redis memory per subject for each algorithm.
//!
//! ```text
//! cargo bench --features redis --bench redis      # about 40 seconds; needs redis-server and redis-benchmark
//! ```
//!
//! Starts its own `redis-server` (no persistence) on a free port. Every figure is measured for
//! [`RUN`] after a warm-up:
//!
//! - `turnstile/<algorithm>` at 1, 16 and 64 concurrent tokio tasks (4 worker threads) sharing one
//!   `RedisLimiter` over one `ConnectionManager` (one multiplexed connection); each call takes one
//!   permit for the next of 10,000 subjects, with limits high enough that calls are admitted
//!   (the admit path writes; it is the costlier one).
//! - `bare EVALSHA (GCRA)`: the same GCRA script sent by plain redis-rs over the same
//!   connection, without the limiter: the difference is what the limiter adds on the client.
//! - `zset pipeline`: the sorted-set approach, per decision one pipelined round trip of
//!   `ZREMRANGEBYSCORE` + `ZADD` + `ZCARD` + `PEXPIRE` on the same connection type and subjects (it
//!   adds before it checks, so it is not even a correct limiter: the baseline of the articles).
//! - `redis-benchmark -P 1` and `-P 16`: the same GCRA script by `EVALSHA` from
//!   `redis-benchmark -c N` with random subjects, one request in flight per connection or 16
//!   pipelined: the server's ceiling for this script. (Our client pipelines too: the tasks'
//!   requests share one connection, so `-P 16` is the fair ceiling at 16 and 64 tasks.)
//!
//! - `2 rules, one script` (with the feature `http` too): requests per second through
//!   `HttpLimiter::decide_async` with two rules (per IP, per client) counted in Redis, each request
//!   one script for both; `2 rules, two passes`: the probe-then-charge it replaced (a probe, then
//!   a charge, of each rule: four round trips), emulated with two `RedisLimiter`s.
//!
//! Results are printed and written to `target/redis-bench.txt`.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use turnstile::redis::{self, Client, aio::ConnectionManager};
use turnstile::{Algorithm, FailurePolicy, Rate, RedisLimiter};

const RUN: Duration = Duration::from_secs(2);
const WARMUP: Duration = Duration::from_millis(300);
const SUBJECTS: u64 = 10_000;
const TASKS: [usize; 3] = [1, 16, 64];

struct Server {
    child: std::process::Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port");
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("cannot run redis-server: apt-get install -y redis-server");
    let client = Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let started = Instant::now();
    while client.get_connection().is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Server { child, port }
}

/// Runs `tasks` tasks calling `decide(task, i)` in a loop; decisions per second over [`RUN`].
async fn throughput<F, Fut>(tasks: usize, decide: F) -> f64
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let decide = Arc::new(decide);
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (decide, counting, stop, count) = (
                decide.clone(),
                counting.clone(),
                stop.clone(),
                count.clone(),
            );
            tokio::spawn(async move {
                let mut i = t as u64 * 7919;
                while !stop.load(Ordering::Relaxed) {
                    decide(t, i).await;
                    i += 1;
                    if counting.load(Ordering::Relaxed) {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(WARMUP).await;
    counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(RUN).await;
    let done = count.load(Ordering::Relaxed);
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.await.unwrap();
    }
    done as f64 / elapsed.as_secs_f64()
}

fn algorithms() -> [(&'static str, Algorithm); 4] {
    let window = Duration::from_secs(1);
    [
        (
            "token_bucket (GCRA)",
            Algorithm::TokenBucket {
                rate: Rate::per_second(1_000_000),
                burst: 1_000_000,
            },
        ),
        (
            "fixed_window",
            Algorithm::FixedWindow {
                limit: 1_000_000,
                window,
            },
        ),
        (
            "sliding_counter",
            Algorithm::SlidingCounter {
                limit: 1_000_000,
                window,
            },
        ),
        (
            "sliding_window",
            Algorithm::SlidingWindow {
                limit: 100_000,
                window,
            },
        ),
    ]
}

/// Server CPU per decision from `INFO commandstats` since the last `CONFIG RESETSTAT`: the µs
/// spent in `commands`, divided by the calls of `per` (one per decision). Commands a script calls
/// are inside the script's own time, so a script is counted once.
fn server_micros(con: &mut redis::Connection, commands: &[&str], per: &str) -> f64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).unwrap();
    let (mut usec, mut calls) = (0.0, 0.0);
    for line in info.lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |f: &str| -> f64 {
            stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(f))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        if commands.contains(&name) {
            usec += field("usec=");
        }
        if name == per {
            calls = field("calls=");
        }
    }
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(con).unwrap();
    usec / calls
}

/// The limiter's GCRA script, assembled as `src/backend/mod.rs` assembles it.
const GCRA_BODY: &str = concat!(
    include_str!("../src/backend/scripts/prelude.lua"),
    include_str!("../src/backend/scripts/token_bucket.lua"),
    "\nreturn single(token_bucket)\n"
);

/// `redis-benchmark`'s requests per second for the GCRA script with `clients` connections.
fn redis_benchmark(port: u16, clients: usize, pipeline: usize) -> Option<f64> {
    let mut con = Client::open(format!("redis://127.0.0.1:{port}/"))
        .ok()?
        .get_connection()
        .ok()?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(GCRA_BODY)
        .query(&mut con)
        .ok()?;
    let output = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-c", &clients.to_string()])
        .args([
            "-n",
            "300000",
            "-P",
            &pipeline.to_string(),
            "-r",
            "10000",
            "-q",
        ])
        .args([
            "EVALSHA",
            &sha,
            "1",
            "bench:{__rand_int__}:tb",
            "1",
            "1",
            "1000000",
        ])
        .output()
        .ok()?;
    // "EVALSHA ...: 123456.78 requests per second, p50=..."
    let text = String::from_utf8_lossy(&output.stdout).replace('\r', "\n");
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("requests per second"))?;
    let (_, rest) = line.rsplit_once(": ")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// A request matching two rules (per IP and per client) counted in Redis: the HTTP layer's one
/// script for both, beside the two passes it replaced (a probe, then a charge, of each rule: four
/// round trips), emulated with two `RedisLimiter`s. Requests per second.
#[cfg(feature = "http")]
async fn several_rules(url: &str, connection: &ConnectionManager, line: &mut impl FnMut(String)) {
    use turnstile::http::{HttpConfig, HttpLimiter, RequestInfo};
    let config = HttpConfig::from_toml_str(&format!(
        "[backend]\nkind = \"redis\"\nurl = \"{url}\"\nprefix = \"rules\"\ndeadline = \"1s\"\n\
         [[rules]]\nname = \"ip\"\nperiod = \"1s\"\nlimit = 1000000\nalgorithm = \"token_bucket\"\n\
         [[rules]]\nname = \"client\"\nkey = \"client\"\nperiod = \"1m\"\nlimit = 1000000\nalgorithm = \"token_bucket\"\n"
    ))
    .unwrap();
    let http = Arc::new(HttpLimiter::connect(config).await.unwrap());
    let mut row = format!("{:<24}", "2 rules, one script");
    for tasks in TASKS {
        let http = http.clone();
        let rate = throughput(tasks, move |_, i| {
            let http = http.clone();
            async move {
                let client = format!("client-{}", i % SUBJECTS);
                let request = RequestInfo {
                    method: &http::Method::GET,
                    path: "/",
                    client_ip: Some(std::net::IpAddr::from(
                        ((i % SUBJECTS) as u32).to_be_bytes(),
                    )),
                    client_id: Some(&client),
                };
                assert!(http.decide_async(&request).await.outcome.is_admitted());
            }
        })
        .await;
        let _ = write!(row, " {rate:>14.0}");
    }
    line(row);
    let limiter = |prefix: &str, period: Duration| {
        RedisLimiter::builder(
            Algorithm::TokenBucket {
                rate: Rate::new(1_000_000, period),
                burst: 1_000_000,
            },
            FailurePolicy::FailClosed,
        )
        .prefix(prefix)
        .deadline(Duration::from_secs(1))
        .build(connection.clone())
        .unwrap()
    };
    let pair = Arc::new([
        limiter("passes-ip", Duration::from_secs(1)),
        limiter("passes-client", Duration::from_secs(60)),
    ]);
    let mut row = format!("{:<24}", "2 rules, two passes");
    for tasks in TASKS {
        let pair = pair.clone();
        let rate = throughput(tasks, move |_, i| {
            let pair = pair.clone();
            async move {
                let subjects = [format!("i{}", i % SUBJECTS), format!("c{}", i % SUBJECTS)];
                for (limiter, subject) in pair.iter().zip(&subjects) {
                    limiter.try_acquire_n(subject, 0).await.unwrap();
                }
                for (limiter, subject) in pair.iter().zip(&subjects) {
                    limiter.try_acquire(subject).await.unwrap();
                }
            }
        })
        .await;
        let _ = write!(row, " {rate:>14.0}");
    }
    line(row);
}

fn main() {
    let server = start_server();
    let url = format!("redis://127.0.0.1:{}/", server.port);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let mut report = String::new();
    let mut line = |s: String| {
        println!("{s}");
        report.push_str(&s);
        report.push('\n');
    };
    line(format!(
        "{:<24} {:>14} {:>14} {:>14}",
        "decisions/s", "1 task", "16 tasks", "64 tasks"
    ));
    let mut gcra_64 = 0.0;
    let mut stats_con = Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut costs = Vec::new();
    runtime.block_on(async {
        let connection = ConnectionManager::new(Client::open(url.as_str()).unwrap())
            .await
            .unwrap();
        for (name, algorithm) in algorithms() {
            let limiter = RedisLimiter::builder(algorithm, FailurePolicy::FailClosed)
                .prefix("bench")
                .deadline(Duration::from_secs(1))
                .build(connection.clone())
                .unwrap();
            let subjects: Arc<Vec<String>> =
                Arc::new((0..SUBJECTS).map(|i| format!("subject-{i}")).collect());
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(&mut stats_con)
                .unwrap();
            let mut row = format!("turnstile/{name:<14}");
            for tasks in TASKS {
                let (limiter, subjects) = (limiter.clone(), subjects.clone());
                let rate = throughput(tasks, move |_, i| {
                    let (limiter, subjects) = (limiter.clone(), subjects.clone());
                    async move {
                        let _ = limiter
                            .try_acquire(&subjects[(i % SUBJECTS) as usize])
                            .await;
                    }
                })
                .await;
                if name.starts_with("token_bucket") && tasks == 64 {
                    gcra_64 = rate;
                }
                let _ = write!(row, " {rate:>14.0}");
            }
            line(row);
            costs.push((
                format!("turnstile/{name}"),
                server_micros(&mut stats_con, &["evalsha"], "evalsha"),
            ));
            let stats = limiter.stats();
            assert_eq!(stats.errors + stats.timeouts, 0, "{name}: {stats:?}");
        }
        // The GCRA script sent by plain redis-rs over the same connection type: what the limiter
        // adds on the client (keys, deadline, deny cache, counters) is the difference.
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(GCRA_BODY)
            .query(&mut stats_con)
            .unwrap();
        let sha = Arc::new(sha);
        let mut row = format!("{:<24}", "bare EVALSHA (GCRA)");
        for tasks in TASKS {
            let (connection, sha) = (connection.clone(), sha.clone());
            let rate = throughput(tasks, move |_, i| {
                let (mut connection, sha) = (connection.clone(), sha.clone());
                async move {
                    let _: Result<Vec<i64>, _> = redis::cmd("EVALSHA")
                        .arg(&*sha)
                        .arg(1)
                        .arg(format!("bare:{{subject-{}}}:tb", i % SUBJECTS))
                        .arg(1)
                        .arg(1)
                        .arg(1_000_000)
                        .query_async(&mut connection)
                        .await;
                }
            })
            .await;
            let _ = write!(row, " {rate:>14.0}");
        }
        line(row);
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut stats_con)
            .unwrap();
        let mut row = format!("{:<24}", "zset pipeline");
        let mut zset_64 = 0.0;
        for tasks in TASKS {
            let connection = connection.clone();
            let rate = throughput(tasks, move |t, i| {
                let mut connection = connection.clone();
                async move {
                    let key = format!("zset:{{subject-{}}}", i % SUBJECTS);
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_micros() as u64;
                    let member = format!("{now}-{t}-{i}");
                    let _: Result<((), (), u64, ()), _> = redis::pipe()
                        .cmd("ZREMRANGEBYSCORE")
                        .arg(&key)
                        .arg(0)
                        .arg(now - 1_000_000)
                        .ignore()
                        .cmd("ZADD")
                        .arg(&key)
                        .arg(now)
                        .arg(&member)
                        .cmd("ZCARD")
                        .arg(&key)
                        .cmd("PEXPIRE")
                        .arg(&key)
                        .arg(1000)
                        .query_async(&mut connection)
                        .await;
                }
            })
            .await;
            if tasks == 64 {
                zset_64 = rate;
            }
            let _ = write!(row, " {rate:>14.0}");
        }
        line(row);
        costs.push((
            "zset pipeline".to_owned(),
            server_micros(
                &mut stats_con,
                &["zremrangebyscore", "zadd", "zcard", "pexpire"],
                "zadd",
            ),
        ));
        #[cfg(feature = "http")]
        several_rules(&url, &connection, &mut line).await;
        line(String::new());
        line("Redis CPU per decision (INFO commandstats, µs):".to_owned());
        for (name, micros) in &costs {
            line(format!("  {name:<36} {micros:>6.2}"));
        }
        line(String::new());
        let mut ceiling_64 = [0.0; 2];
        for (p, pipeline) in [1usize, 16].into_iter().enumerate() {
            let mut row = format!("{:<24}", format!("redis-benchmark -P {pipeline}"));
            for clients in TASKS {
                match redis_benchmark(server.port, clients, pipeline) {
                    Some(rate) => {
                        if clients == 64 {
                            ceiling_64[p] = rate;
                        }
                        let _ = write!(row, " {rate:>14.0}");
                    }
                    None => {
                        let _ = write!(row, " {:>14}", "n/a");
                    }
                }
            }
            line(row);
        }
        if ceiling_64[1] > 0.0 && zset_64 > 0.0 {
            line(format!(
                "GCRA at 64 tasks: {:.2}x redis-benchmark -P 1, {:.2}x redis-benchmark -P 16, {:.2}x the zset pipeline",
                gcra_64 / ceiling_64[0],
                gcra_64 / ceiling_64[1],
                gcra_64 / zset_64
            ));
        }

        // Memory per subject.
        let mut con = Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
        line(String::new());
        line("MEMORY USAGE per subject (bytes, key and value, SAMPLES 0):".to_owned());
        let measure =
            |name: &str, limiter: RedisLimiter, permits: u32| (name.to_owned(), limiter, permits);
        let window = Duration::from_secs(60);
        let mut cases = vec![
            measure(
                "fixed_window",
                RedisLimiter::builder(
                    Algorithm::FixedWindow { limit: 10, window },
                    FailurePolicy::FailClosed,
                )
                .prefix("mem")
                .build(connection.clone())
                .unwrap(),
                1,
            ),
            measure(
                "sliding_counter",
                RedisLimiter::builder(
                    Algorithm::SlidingCounter { limit: 10, window },
                    FailurePolicy::FailClosed,
                )
                .prefix("mem")
                .build(connection.clone())
                .unwrap(),
                1,
            ),
            measure(
                "token_bucket",
                RedisLimiter::builder(
                    Algorithm::TokenBucket {
                        rate: Rate::per_second(10),
                        burst: 10,
                    },
                    FailurePolicy::FailClosed,
                )
                .prefix("mem")
                .build(connection.clone())
                .unwrap(),
                1,
            ),
        ];
        for members in [1u32, 10, 100, 1_000, 10_000] {
            let limiter = RedisLimiter::builder(
                Algorithm::SlidingWindow {
                    limit: 10_000,
                    window,
                },
                FailurePolicy::FailClosed,
            )
            .prefix(format!("mem{members}"))
            .build(connection.clone())
            .unwrap();
            cases.push((
                format!("sliding_window, {members} in the log"),
                limiter,
                members,
            ));
        }
        for (name, limiter, permits) in cases {
            let mut left = permits;
            while left > 0 {
                let n = left.min(1000);
                limiter.try_acquire_n("subject-0", n).await.unwrap();
                left -= n;
            }
            let bytes: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(limiter.key("subject-0"))
                .arg("SAMPLES")
                .arg(0)
                .query(&mut con)
                .unwrap();
            let per = if name.starts_with("sliding_window") {
                format!(" ({:.0} per permit)", bytes as f64 / f64::from(permits))
            } else {
                String::new()
            };
            line(format!("  {name:<36} {bytes:>9}{per}"));
        }
    });
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    let _ = std::fs::create_dir_all(&target);
    let _ = std::fs::write(target.join("redis-bench.txt"), report);
    drop(server);
}
