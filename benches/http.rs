//! Requests per second through the HTTP layer, beside the same app without it, in one run
//! (issue 6): an axum app on 127.0.0.1:0 and a Rust load generator of keep-alive HTTP/1.1
//! connections in the same process.
//!
//! The apps: `bare` (no layer), `admitted` (the layer with one per-IP rule that admits every
//! request, so every request pays the full decision and the `RateLimit` headers), `rejected`
//! (the same rule with a limit the first request exhausts, so every later request is a 429),
//! and the peer, tower_governor (governor keyed by peer IP, admitting every request) with its
//! two `x-ratelimit-*` headers. The paired parts add a breakdown: `admitted` without the
//! `RateLimit` headers, the app behind a no-op tower layer (what wrapping the router costs for
//! any layer), a no-op layer that adds two constant headers as long as the `RateLimit` pair
//! (what sending those headers costs any layer, decision aside), and tower_governor without
//! headers. Every layer wraps the whole router, as in
//! `examples/axum_server.rs`, so requests are decided before they are routed; `http-service`
//! also measures the layer put into the router with `Router::layer`.
//! Each criterion sample sends a batch of requests over `CONNECTIONS` connections at once and
//! reports the time per request; requests per second is its inverse. axum is built with its
//! default features here (tower_governor's dependency on it enables them), as an app that
//! depends on `axum = "0.8"` gets them.
//!
//! **Without a network** (`http-service`): the router called directly with and without the layer,
//! one request at a time on one thread: the layer's own CPU per request, undiluted by TCP and the
//! client.
//!
//! **Paired ratios** (`http-paired`, not criterion; after the group): criterion measures the
//! apps one after the other, and on a shared 2-core machine the load can change in between. This
//! part alternates them in rounds (a batch of `PAIR_BATCH` requests each, the order rotating
//! every round) for `PAIR_TIME`, and prints the median µs per request of each and the medians of
//! the per-round ratios (admitted ÷ bare, rejected ÷ admitted, the breakdown, and the layer
//! against tower_governor) with a 95% confidence interval.
//! Written to `target/criterion/http-paired/` (`paired.json`, `paired.md`).
//!
//! **wrk** (`http-wrk`, only when named): the same paired comparison with `wrk` (from apt) as
//! the load generator, a separate process that does not build header maps, pinned to the second
//! CPU while the server (one worker thread) has the first: the server's own CPU per request,
//! the client's left out; written to `target/criterion/http-paired/wrk.md`. `http-wrk-shared`:
//! the same with nothing pinned (the server's two workers and `wrk -t2` share both cores, as a
//! load test on one machine runs by default); written to `wrk-shared.md`.
//!
//! **Decisions on two cores** (`http-decide`, criterion): `HttpLimiter::decide` beside
//! governor's keyed check, on one thread and on two at once, each thread deciding for its own
//! client: whether a decision writes memory that decisions for other clients write too.
//!
//! **The client address behind a proxy** (`http-client-ip`, criterion): `client_ip` on a
//! forwarding header of 2 entries beside one with 1,000 entries the client wrote before them.
//!
//! **Instructions** (`http-count`, only when named, needs valgrind): each app called directly
//! under callgrind, twice with different request counts; the exact instructions per request,
//! which a noisy machine cannot move; written to `target/criterion/http-paired/instructions.md`.
//!
//! Run: `cargo bench --features http,axum --bench http` (`-- http-paired` for the paired part
//! only, `-- http-wrk` or `-- http-wrk-shared` for a wrk part, `-- http-count` for the
//! instruction counts). In criterion's test mode (`cargo test --benches`) the paired part runs
//! briefly and writes nothing.

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tower::Layer;
use turnstile::http::{HttpConfig, HttpLimiter, RateLimitService};

const CONNECTIONS: usize = 16;

fn app() -> Router {
    Router::new().route("/api/values", get(|| async { "value" }))
}

/// The app's routes turned into services once (`with_state(())`, as `Router::into_make_service`
/// does): a `Router` called as a service without it converts its routes on every request.
fn routes() -> Router {
    app().with_state(())
}

/// The app behind the layer with one per-IP rule of `limit` per hour; `headers`: whether
/// admitted responses get the `RateLimit` headers (the default) or not (a breakdown of the
/// paired part: the decision without the headers on the wire). The layer wraps the whole
/// router, as in `examples/axum_server.rs`: a request is decided before it is routed.
fn limited(limit: u64, headers: bool) -> RateLimitService<Router, HttpLimiter> {
    limiter(limit, headers).layer().layer(routes())
}

fn limiter(limit: u64, headers: bool) -> Arc<HttpLimiter> {
    let config = HttpConfig::from_toml_str(&format!(
        r#"
        [[rules]]
        name = "per-ip"
        endpoint = "*"
        period = "1h"
        limit = {limit}
        [response]
        ietf_headers = {headers}
        "#
    ))
    .expect("bench config");
    Arc::new(HttpLimiter::new(config).expect("bench limiter"))
}

/// The app behind the layer with the `admitted` app's rule and the client (127.0.0.1) on the
/// blocklist: every request rejected before any rule counts it, as a flood from a blocked
/// address is.
fn blocklisted() -> RateLimitService<Router, HttpLimiter> {
    let config = HttpConfig::from_toml_str(&format!(
        "[[rules]]\nname = \"per-ip\"\nperiod = \"1h\"\nlimit = {}\n[blocklist]\nips = [\"127.0.0.1\"]\n",
        u32::MAX / 2
    ))
    .expect("bench config");
    Arc::new(HttpLimiter::new(config).expect("bench limiter"))
        .layer()
        .layer(routes())
}

type Identity = fn(axum::response::Response) -> axum::response::Response;

/// The app behind a tower layer that does nothing (it passes every response on as it is), also
/// around the whole router: what wrapping the router in any layer costs, the floor of the
/// breakdown.
fn noop_layer() -> tower::util::MapResponse<Router, Identity> {
    tower::util::MapResponseLayer::new((|response| response) as Identity).layer(routes())
}

type AddHeaders = fn(axum::response::Response) -> axum::response::Response;

/// The app behind a tower layer that makes no decision but adds two constant headers of the
/// length of the layer's `RateLimit-Policy` and `RateLimit` (made once, at compile time): what
/// any layer pays to send those two headers at all (the map inserts, hyper writing them, the
/// kernel copying them), the floor of the headers' share in the breakdown.
fn constant_headers() -> tower::util::MapResponse<Router, AddHeaders> {
    const POLICY: http::HeaderName = http::HeaderName::from_static("ratelimit-policy");
    const RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");
    const POLICY_VALUE: http::HeaderValue =
        http::HeaderValue::from_static("\"per-ip\";q=1073741823;w=3600");
    const RATELIMIT_VALUE: http::HeaderValue =
        http::HeaderValue::from_static("\"per-ip\";r=1073741822;t=3599");
    tower::util::MapResponseLayer::new(
        (|mut response: axum::response::Response| {
            response.headers_mut().insert(POLICY, POLICY_VALUE);
            response.headers_mut().insert(RATELIMIT, RATELIMIT_VALUE);
            response
        }) as AddHeaders,
    )
    .layer(routes())
}

/// `body` with `app` bound to the router behind tower_governor (governor keyed by peer IP) with
/// a quota that admits every request, with its `x-ratelimit-*` headers (`use_headers`, which
/// changes the config's type, hence a macro) when `headers` is true.
macro_rules! governed {
    ($headers:expr, |$app:ident| $body:expr) => {{
        use tower_governor::GovernorLayer;
        use tower_governor::governor::GovernorConfigBuilder;
        let mut builder = GovernorConfigBuilder::default();
        builder.per_second(1).burst_size(u32::MAX / 2);
        if $headers {
            let config = builder.use_headers().finish().expect("governor config");
            let $app = GovernorLayer::new(config).layer(routes());
            $body
        } else {
            let config = builder.finish().expect("governor config");
            let $app = GovernorLayer::new(config).layer(routes());
            $body
        }
    }};
}

/// The app behind the peer, tower_governor (governor keyed by peer IP), with a quota that admits
/// every request, around the whole router like the layer; `headers`: its
/// `x-ratelimit-limit`/`-remaining` on every response (`use_headers`), the counterpart of the
/// `RateLimit` headers.
async fn serve_governed(headers: bool) -> SocketAddr {
    governed!(headers, |app| serve(app).await)
}

/// Serves `app` on 127.0.0.1:0 with the peer address of each connection in its requests'
/// extensions, as `axum::serve` with `into_make_service_with_connect_info` does.
async fn serve<S>(app: S) -> SocketAddr
where
    S: tower::Service<
            axum::extract::Request,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send,
{
    use axum::ServiceExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve")
    });
    addr
}

async fn connect(addr: SocketAddr) -> Vec<SendRequest<Empty<Bytes>>> {
    let mut senders = Vec::new();
    for _ in 0..CONNECTIONS {
        let stream = TcpStream::connect(addr).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(connection);
        senders.push(sender);
    }
    senders
}

/// Sends about `total` requests spread over the connections (each connection one request at a
/// time, all connections at once), checks every status against `expect`, and returns the time
/// scaled to exactly `total` requests.
async fn batch(senders: &mut Vec<SendRequest<Empty<Bytes>>>, total: u64, expect: u16) -> Duration {
    let per = total.div_ceil(senders.len() as u64).max(1);
    let sent = per * senders.len() as u64;
    let start = Instant::now();
    let tasks: Vec<_> = senders
        .drain(..)
        .map(|mut sender| {
            tokio::spawn(async move {
                for _ in 0..per {
                    sender.ready().await.expect("ready");
                    let request = http::Request::get("/api/values")
                        .header("host", "bench")
                        .body(Empty::<Bytes>::new())
                        .expect("request");
                    let response = sender.send_request(request).await.expect("response");
                    assert_eq!(response.status().as_u16(), expect);
                    response.into_body().collect().await.expect("body");
                }
                sender
            })
        })
        .collect();
    for task in tasks {
        senders.push(task.await.expect("client task"));
    }
    start.elapsed().mul_f64(total as f64 / sent as f64)
}

type Senders = Vec<SendRequest<Empty<Bytes>>>;

/// Serves the apps (in the order of `NAMES`) and takes the rejected app's only permit with a
/// first request, so that every later request to it is a 429.
async fn serve_all() -> [SocketAddr; APPS] {
    let addrs = [
        serve(routes()).await,
        serve(limited(u32::MAX as u64 / 2, true)).await,
        serve(limited(1, true)).await,
        serve(limited(u32::MAX as u64 / 2, false)).await,
        serve(noop_layer()).await,
        serve_governed(true).await,
        serve_governed(false).await,
        serve(constant_headers()).await,
    ];
    let mut first = connect(addrs[2]).await;
    first.truncate(1);
    batch(&mut first, 1, 200).await;
    addrs
}

/// The apps served, and `CONNECTIONS` connections to each.
fn servers(runtime: &Runtime) -> [Senders; APPS] {
    runtime.block_on(async {
        let mut senders: [Senders; APPS] = Default::default();
        for (senders, addr) in senders.iter_mut().zip(serve_all().await) {
            *senders = connect(addr).await;
        }
        senders
    })
}

/// Whether this run is the instruction count part (`http-count`), which the criterion groups
/// leave alone: their servers and connections would add start-up work that varies from run
/// to run.
fn counting() -> bool {
    std::env::args().any(|a| a == "http-count")
}

fn http(c: &mut Criterion) {
    if counting() {
        return;
    }
    let runtime = Runtime::new().expect("runtime");
    let [
        mut bare,
        mut admitted,
        mut rejected,
        _,
        _,
        mut governor,
        _,
        _,
    ] = servers(&runtime);
    let mut group = c.benchmark_group("http");
    group.measurement_time(Duration::from_secs(8));
    group.bench_function("bare", |b| {
        b.iter_custom(|iters| runtime.block_on(batch(&mut bare, iters, 200)))
    });
    group.bench_function("admitted", |b| {
        b.iter_custom(|iters| runtime.block_on(batch(&mut admitted, iters, 200)))
    });
    group.bench_function("rejected", |b| {
        b.iter_custom(|iters| runtime.block_on(batch(&mut rejected, iters, 429)))
    });
    group.bench_function("tower_governor", |b| {
        b.iter_custom(|iters| runtime.block_on(batch(&mut governor, iters, 200)))
    });
    group.finish();
}

/// Requests per timed batch of the paired part (100 per connection): about 15–20 ms.
const PAIR_BATCH: u64 = 1_600;
/// How long the paired part measures (after a tenth of it as warm-up).
const PAIR_TIME: Duration = Duration::from_secs(12);
/// The apps: criterion measures the first three and tower_governor with headers, the paired
/// part all of them.
const APPS: usize = 8;
const NAMES: [&str; APPS] = [
    "bare",
    "admitted",
    "rejected",
    "admitted, no RateLimit headers",
    "a no-op layer (breakdown)",
    "tower_governor, x-ratelimit headers (peer)",
    "tower_governor, no headers (peer)",
    "two constant RateLimit headers, no decision (breakdown)",
];
const STATUS: [u16; APPS] = [200, 200, 429, 200, 200, 200, 200, 200];

/// Whether a ratio meets its target (`met` of a ratio: on the target's side). Met only when the
/// whole confidence interval is on the target's side (`high`, its upper end); a median on it
/// with an interval across the line shows nothing either way.
fn verdict(median: f64, high: f64, met: &dyn Fn(f64) -> bool) -> &'static str {
    if met(high) {
        "met"
    } else if met(median) {
        "not shown (the CI crosses the target)"
    } else {
        "**missed**"
    }
}

/// A ratio of the tables: its label, the apps divided (`a ÷ b`), and its target if it has one
/// (the target's text, and whether a ratio is on its side).
type Row<'a> = (
    &'a str,
    usize,
    usize,
    Option<(&'a str, &'a dyn Fn(f64) -> bool)>,
);

/// The two tables of a paired run: each app's median µs per request, and the medians of the
/// per-round ratios with their CI, the targets' verdicts, the breakdown and the peer.
fn tables(rounds: &[[f64; APPS]]) -> String {
    let mut table = String::from("| app | µs per request | requests/s |\n|---|---|---|\n");
    for (app, name) in NAMES.iter().enumerate() {
        let us = median(rounds.iter().map(|r| r[app]).collect());
        table += &format!("| {name} | {us:.2} | {:.0} |\n", 1e6 / us);
    }
    table += "\n| ratio (median of per-round ratios) | value [95% CI] | target | verdict |\n";
    table += "|---|---|---|---|\n";
    let within: &dyn Fn(f64) -> bool = &|r| r <= 1.05;
    let below: &dyn Fn(f64) -> bool = &|r| r < 1.0;
    let rows: [Row; 10] = [
        ("admitted ÷ bare", 1, 0, Some(("≤ 1.05×", within))),
        ("rejected ÷ admitted", 2, 1, Some(("< 1×", below))),
        (
            "admitted without RateLimit headers ÷ bare (breakdown)",
            3,
            0,
            None,
        ),
        ("a no-op layer ÷ bare (breakdown)", 4, 0, None),
        (
            "two constant headers, no decision ÷ bare (breakdown: the headers' floor)",
            7,
            0,
            None,
        ),
        (
            "admitted ÷ two constant headers (breakdown: the decision and the values)",
            1,
            7,
            None,
        ),
        ("tower_governor, headers ÷ bare (peer)", 5, 0, None),
        ("tower_governor, no headers ÷ bare (peer)", 6, 0, None),
        (
            "admitted ÷ tower_governor, headers (against the peer)",
            1,
            5,
            None,
        ),
        (
            "admitted without headers ÷ tower_governor, no headers (against the peer)",
            3,
            6,
            None,
        ),
    ];
    for (label, a, b, target) in rows {
        let (m, low, high) = median_ci(rounds.iter().map(|r| r[a] / r[b]).collect());
        let (target, verdict) = match target {
            Some((text, met)) => (text, verdict(m, high, met)),
            None => ("—", "—"),
        };
        table += &format!("| {label} | {m:.3}× [{low:.3}–{high:.3}] | {target} | {verdict} |\n");
    }
    table
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median of `ratios` and a distribution-free 95% confidence interval for it (the order
/// statistics at ranks n/2 ∓ 0.98·√n).
fn median_ci(mut ratios: Vec<f64>) -> (f64, f64, f64) {
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    let half = 0.98 * (n as f64).sqrt();
    let low = ((n as f64 / 2.0 - half).floor().max(0.0) as usize).min(n - 1);
    let high = ((n as f64 / 2.0 + half).ceil() as usize).min(n - 1);
    (ratios[n / 2], ratios[low], ratios[high])
}

/// Whether the paired part runs, and for how long: `PAIR_TIME` under `cargo bench`, briefly in
/// criterion's test mode, not at all with `--list` or a filter that "http-paired" does not
/// contain.
fn paired_length() -> Option<Duration> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args.iter().find(|a| !a.starts_with('-'));
    if args.iter().any(|a| a == "--list")
        || filter.is_some_and(|f| !"http-paired".contains(f.as_str()))
    {
        return None;
    }
    Some(if args.iter().any(|a| a == "--bench") {
        PAIR_TIME
    } else {
        Duration::from_millis(300)
    })
}

fn output_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home).join("http-paired");
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("criterion")
        .join("http-paired")
}

/// Alternates the apps in rounds of one batch each (the order rotating every round) and
/// reports the median per-round ratios: see the module documentation.
fn http_paired() {
    let Some(length) = paired_length() else {
        return;
    };
    let runtime = Runtime::new().expect("runtime");
    let mut senders = servers(&runtime);
    let round = |senders: &mut [Senders; APPS], index: usize| {
        let mut micros = [0.0; APPS];
        for k in 0..APPS {
            let app = (index + k) % APPS;
            let elapsed = runtime.block_on(batch(&mut senders[app], PAIR_BATCH, STATUS[app]));
            micros[app] = elapsed.as_secs_f64() * 1e6 / PAIR_BATCH as f64;
        }
        micros
    };
    let warm_up = Instant::now() + length / 10;
    let mut index = 0;
    while Instant::now() < warm_up {
        round(&mut senders, index);
        index += 1;
    }
    let mut rounds: Vec<[f64; APPS]> = Vec::new();
    let end = Instant::now() + length;
    while Instant::now() < end || rounds.len() < 3 {
        rounds.push(round(&mut senders, index));
        index += 1;
    }
    let mut table = format!(
        "HTTP layer, paired: {} rounds of {PAIR_BATCH} requests per app over {CONNECTIONS} \
         connections, order rotating, for {length:?}; medians\n\n",
        rounds.len()
    );
    table += &tables(&rounds);
    println!("\n{table}");
    if length < PAIR_TIME {
        println!("Testing http-paired\nSuccess");
        return;
    }
    // The raw rounds (µs per request of each app, in the order of `apps`), from which every
    // figure of the tables can be computed again.
    let names: Vec<String> = NAMES.iter().map(|n| format!("{n:?}")).collect();
    let rows: Vec<String> = rounds
        .iter()
        .map(|r| {
            let values: Vec<String> = r.iter().map(|v| format!("{v:.4}")).collect();
            format!("[{}]", values.join(","))
        })
        .collect();
    let json = format!(
        "{{\"batch\":{PAIR_BATCH},\"connections\":{CONNECTIONS},\"apps\":[{}],\"us_per_request\":[{}]}}\n",
        names.join(","),
        rows.join(",")
    );
    let dir = output_dir();
    std::fs::create_dir_all(&dir).expect("create the output directory");
    std::fs::write(dir.join("paired.json"), json).expect("write the JSON");
    std::fs::write(dir.join("paired.md"), table).expect("write the table");
    println!("written to {}", dir.display());
}

/// How long each `wrk` run of the wrk part lasts, and how many rounds (every app once per round)
/// it takes.
const WRK_RUN: &str = "2s";
const WRK_ROUNDS: usize = 16;
/// Rounds of the unpinned wrk part.
const WRK_SHARED_ROUNDS: usize = 24;

/// Requests per second `wrk` reports for `addr`, and how many of its responses were not 2xx.
/// How wrk and the server share the machine.
#[derive(Clone, Copy, PartialEq)]
enum Placement {
    /// The server on CPU 0 (one worker) and `wrk -t1` on CPU 1: the server's own CPU.
    Pinned,
    /// Neither pinned: the server's two workers and `wrk -t2` share both cores, as a load
    /// test on one machine runs by default.
    Shared,
}

/// One `WRK_RUN` wrk run against `addr`: requests per second, and the non-2xx responses.
fn wrk(addr: SocketAddr, placement: Placement) -> (f64, u64) {
    let mut command = match placement {
        // On the second CPU, away from the server (see `http_wrk`).
        Placement::Pinned => {
            let mut command = std::process::Command::new("taskset");
            command.args(["-c", "1", "wrk", "-t1"]);
            command
        }
        Placement::Shared => {
            let mut command = std::process::Command::new("wrk");
            command.arg("-t2");
            command
        }
    };
    let output = command
        .args([format!("-c{CONNECTIONS}"), format!("-d{WRK_RUN}")])
        .arg(format!("http://{addr}/api/values"))
        .output()
        .expect("run wrk (and taskset): install wrk with `apt-get install -y wrk`");
    assert!(output.status.success(), "wrk failed: {output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    let number = |label: &str| {
        text.lines()
            .find_map(|line| line.trim().strip_prefix(label))
            .map(|rest| {
                rest.trim()
                    .parse::<f64>()
                    .expect("a number after the label")
            })
    };
    let rps = number("Requests/sec:").unwrap_or_else(|| panic!("no Requests/sec in {text}"));
    let non_2xx = number("Non-2xx or 3xx responses:").unwrap_or(0.0) as u64;
    (rps, non_2xx)
}

/// The paired comparison again with `wrk` (a separate process, C, that parses responses without
/// building header maps) as the load generator: the apps alternate in rounds of one `WRK_RUN`
/// run each, order rotating; per-round ratios of requests per second. Runs only when asked for
/// by name, and then needs `wrk` on the PATH: `-- http-wrk` pinned (the server's own CPU),
/// `-- http-wrk-shared` unpinned (`WRK_SHARED_ROUNDS` rounds: the shared cores make it noisier).
fn http_wrk() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let placement = if args.iter().any(|a| a == "http-wrk") {
        Placement::Pinned
    } else if args.iter().any(|a| a == "http-wrk-shared") {
        Placement::Shared
    } else {
        return;
    };
    let runtime = match placement {
        // The server on CPU 0 and wrk on CPU 1 (`taskset`, from util-linux): each has a core of
        // its own, so the requests per second are what one core of server does, and the ratios
        // are the server's CPU per request with and without the layer, the client's cost left
        // out. One worker thread, so that the server does not compete with itself for its core.
        Placement::Pinned => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            let pinned = std::process::Command::new("taskset")
                .args(["-a", "-p", "-c", "0", &std::process::id().to_string()])
                .output()
                .expect("run taskset (util-linux)");
            assert!(pinned.status.success(), "taskset failed: {pinned:?}");
            runtime
        }
        Placement::Shared => Runtime::new().expect("runtime"),
    };
    let addrs = runtime.block_on(serve_all());
    // Warm-up: one run each.
    for addr in addrs {
        wrk(addr, placement);
    }
    let total = match placement {
        Placement::Pinned => WRK_ROUNDS,
        Placement::Shared => WRK_SHARED_ROUNDS,
    };
    let mut rounds: Vec<[f64; APPS]> = Vec::new();
    for index in 0..total {
        let mut us = [0.0; APPS];
        for k in 0..APPS {
            let app = (index + k) % APPS;
            let (rps, non_2xx) = wrk(addrs[app], placement);
            if STATUS[app] == 200 {
                assert_eq!(non_2xx, 0, "{}: every request admitted", NAMES[app]);
            } else {
                assert!(non_2xx as f64 >= rps * 0.9, "{}: rejected", NAMES[app]);
            }
            us[app] = 1e6 / rps;
        }
        rounds.push(us);
    }
    let (how, file) = match placement {
        Placement::Pinned => (
            format!(
                "`wrk -t1 -c{CONNECTIONS}` run per app, order rotating, the server on CPU 0 and wrk on CPU 1"
            ),
            "wrk.md",
        ),
        Placement::Shared => (
            format!(
                "`wrk -t2 -c{CONNECTIONS}` run per app, order rotating, wrk and the server's two workers sharing both cores"
            ),
            "wrk-shared.md",
        ),
    };
    let mut table =
        format!("HTTP layer, paired with wrk: {total} rounds of one {WRK_RUN} {how}; medians\n\n");
    table += &tables(&rounds);
    println!("\n{table}");
    let dir = output_dir();
    std::fs::create_dir_all(&dir).expect("create the output directory");
    std::fs::write(dir.join(file), table).expect("write the table");
}

/// One request through `service` with no network: built, decided, answered, dropped. The
/// router's futures are ready at once, so polling once with a no-op waker finishes them.
fn one_request<S>(service: &mut S) -> u16
where
    S: tower::Service<http::Request<axum::body::Body>, Response = axum::response::Response>,
    S::Error: std::fmt::Debug,
{
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let mut cx = Context::from_waker(Waker::noop());
    let mut request = http::Request::get("/api/values")
        .header("host", "bench")
        .body(axum::body::Body::empty())
        .expect("request");
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(SocketAddr::from((
            [127, 0, 0, 1],
            4000,
        ))));
    assert!(service.poll_ready(&mut cx).is_ready());
    let mut future = std::pin::pin!(service.call(request));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(response) => response.expect("response").status().as_u16(),
        Poll::Pending => panic!("the router answers at once"),
    }
}

/// `app` after a first request that takes the rejected apps' only permit.
fn spent<S>(mut app: S) -> S
where
    S: tower::Service<http::Request<axum::body::Body>, Response = axum::response::Response>,
    S::Error: std::fmt::Debug,
{
    assert_eq!(one_request(&mut app), 200);
    app
}

/// The layer's own cost without a network: the router called directly, through the layer or
/// not, one request at a time on this thread (ns per request, criterion's median). The layer
/// goes around the whole router, as in the other parts, and for comparison into it with
/// `Router::layer`, which wraps (and boxes) every route's service and so runs after routing.
fn http_service(c: &mut Criterion) {
    if counting() {
        return;
    }
    let mut group = c.benchmark_group("http-service");
    fn measure<S>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, mut app: S, status: u16)
    where
        S: tower::Service<http::Request<axum::body::Body>, Response = axum::response::Response>,
        S::Error: std::fmt::Debug,
    {
        group.bench_function(name, |b| {
            b.iter(|| assert_eq!(one_request(&mut app), status))
        });
    }
    measure(&mut group, "bare", routes(), 200);
    measure(
        &mut group,
        "admitted",
        limited(u32::MAX as u64 / 2, true),
        200,
    );
    measure(&mut group, "rejected", spent(limited(1, true)), 429);
    measure(&mut group, "rejected, blocklist", blocklisted(), 429);
    // `with_state(())` after `Router::layer`: the routes (with the layer) become services once,
    // as `axum::serve` does.
    let in_router = |limit| app().layer(limiter(limit, true).layer()).with_state(());
    measure(
        &mut group,
        "admitted, Router::layer",
        in_router(u32::MAX as u64 / 2),
        200,
    );
    measure(
        &mut group,
        "rejected, Router::layer",
        spent(in_router(1)),
        429,
    );
    group.finish();
}

/// Decisions per second on one and on two threads, each thread deciding for a client of its
/// own (`http-decide`): [`HttpLimiter::decide`] with one per-IP rule, beside governor's keyed
/// check (tower_governor's decision). ns per decision per thread, so a decision that scales
/// takes as long on two threads as on one; one that writes a cache line shared by every client
/// (a reference count, a statistic) takes longer, each core waiting for the line in turn.
fn http_decide(c: &mut Criterion) {
    if counting() {
        return;
    }
    use governor::{Quota, RateLimiter};
    use std::net::IpAddr;
    use std::num::NonZeroU32;
    use turnstile::http::RequestInfo;
    /// `iters` calls of `decide` on each of `threads` threads at once, client `10.0.0.{thread}`;
    /// the time per call on a thread.
    fn run<D>(threads: u8, iters: u64, decide: Arc<D>) -> Duration
    where
        D: Fn(IpAddr) -> bool + Send + Sync + 'static,
    {
        let barrier = Arc::new(std::sync::Barrier::new(usize::from(threads) + 1));
        let handles: Vec<_> = (1..=threads)
            .map(|t| {
                let (decide, barrier) = (Arc::clone(&decide), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let ip = IpAddr::from([10, 0, 0, t]);
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..iters {
                        assert!(decide(std::hint::black_box(ip)));
                    }
                    start.elapsed()
                })
            })
            .collect();
        barrier.wait();
        let times: Vec<Duration> = handles
            .into_iter()
            .map(|h| h.join().expect("decide thread"))
            .collect();
        times.into_iter().max().expect("a thread")
    }
    let limiter = limiter(u32::MAX as u64 / 2, true);
    let ours = Arc::new(move |ip| {
        limiter
            .decide(&RequestInfo {
                method: &http::Method::GET,
                path: "/api/values",
                client_ip: Some(ip),
                client_id: None,
            })
            .outcome
            .is_admitted()
    });
    let governor = Arc::new(RateLimiter::keyed(
        Quota::per_second(NonZeroU32::MIN)
            .allow_burst(NonZeroU32::new(u32::MAX / 2).expect("burst")),
    ));
    let peer = Arc::new(move |ip| governor.check_key(&ip).is_ok());
    let mut group = c.benchmark_group("http-decide");
    for threads in [1, 2] {
        let ours = Arc::clone(&ours);
        group.bench_function(format!("turnstile, {threads} thread(s)"), |b| {
            b.iter_custom(|iters| run(threads, iters, Arc::clone(&ours)))
        });
        let peer = Arc::clone(&peer);
        group.bench_function(format!("governor keyed, {threads} thread(s)"), |b| {
            b.iter_custom(|iters| run(threads, iters, Arc::clone(&peer)))
        });
    }
    group.finish();
}

/// The client address behind a trusted proxy (`http-client-ip`): [`client_ip`] on a request
/// whose forwarding header holds two entries (the client and the proxy before ours), beside the
/// same header after the client sent 1,000 made-up entries of its own before them, as a proxy
/// that appends to `X-Forwarded-For` passes on. The walk is right to left and stops at the
/// first untrusted address, so what the client wrote before it should cost next to nothing.
///
/// [`client_ip`]: turnstile::http::client_ip
fn http_client_ip(c: &mut Criterion) {
    if counting() {
        return;
    }
    use turnstile::http::{ClientIpConfig, ForwardedHeader, client_ip};
    let mut config = ClientIpConfig::default();
    config.trusted_proxies = vec!["10.0.0.0/8".parse().expect("a range")];
    let peer = Some("10.0.0.1".parse().expect("an address"));
    let spoofed: Vec<String> = (0..1_000u32)
        .map(|i| format!("198.51.{}.{}", i / 256, i % 256))
        .collect();
    let mut group = c.benchmark_group("http-client-ip");
    for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
        config.headers = vec![header.clone()];
        let name = match header {
            ForwardedHeader::Forwarded => "forwarded",
            _ => "x-forwarded-for",
        };
        let line = |ips: &[String]| match header {
            ForwardedHeader::Forwarded => ips
                .iter()
                .map(|ip| format!("for={ip};proto=https"))
                .collect::<Vec<_>>()
                .join(", "),
            _ => ips.join(", "),
        };
        let honest = [String::from("203.0.113.9"), String::from("10.0.0.2")];
        let long: Vec<String> = spoofed.iter().chain(&honest).cloned().collect();
        for (label, entries) in [("2 entries", &honest[..]), ("1,002 entries", &long[..])] {
            let mut headers = http::HeaderMap::new();
            headers.insert(name, line(entries).parse().expect("a header value"));
            group.bench_function(format!("{name}, {label}"), |b| {
                b.iter(|| {
                    let found = client_ip(peer, std::hint::black_box(&headers), &config);
                    assert_eq!(found, Some("203.0.113.9".parse().expect("an address")));
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, http, http_service, http_decide, http_client_ip);
/// Requests per callgrind run of the instruction count part: two runs, and the difference over
/// the difference in requests is the count per request, the start-up (the runtime, the apps,
/// criterion's own) cancelled out.
const COUNT_REQUESTS: [u64; 2] = [2_000, 6_000];
/// Set in a run under callgrind: `app index:requests`.
const COUNT_ENV: &str = "TURNSTILE_HTTP_COUNT";

/// Sends `requests` requests through `app` with [`one_request`], each answered with `status`.
fn count_requests<S>(mut app: S, status: u16, requests: u64)
where
    S: tower::Service<http::Request<axum::body::Body>, Response = axum::response::Response>,
    S::Error: std::fmt::Debug,
{
    for _ in 0..requests {
        assert_eq!(one_request(&mut app), status);
    }
}

/// The app of `NAMES[index]` as a service, called directly (no network) `requests` times.
fn count_app(index: usize, requests: u64) {
    let status = STATUS[index];
    match index {
        0 => count_requests(routes(), status, requests),
        1 => count_requests(limited(u32::MAX as u64 / 2, true), status, requests),
        2 => count_requests(spent(limited(1, true)), status, requests),
        3 => count_requests(limited(u32::MAX as u64 / 2, false), status, requests),
        4 => count_requests(noop_layer(), status, requests),
        5 => governed!(true, |app| count_requests(app, status, requests)),
        6 => governed!(false, |app| count_requests(app, status, requests)),
        7 => count_requests(constant_headers(), status, requests),
        _ => panic!("no app {index}"),
    }
}

/// The instructions one run of this bench under callgrind executes with `COUNT_ENV` set.
fn callgrind(app: usize, requests: u64) -> u64 {
    let output = std::process::Command::new("valgrind")
        .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .arg(std::env::current_exe().expect("the bench's path"))
        .args(["--bench", "http-count"])
        .env(COUNT_ENV, format!("{app}:{requests}"))
        .output()
        .expect("run valgrind: install it with `apt-get install -y valgrind`");
    assert!(output.status.success(), "valgrind failed: {output:?}");
    let log = String::from_utf8_lossy(&output.stderr);
    // The largest count: a process forked to look for gnuplot (criterion does) reports its own.
    log.lines()
        .filter_map(|line| line.split("Collected :").nth(1)?.trim().parse().ok())
        .max()
        .unwrap_or_else(|| panic!("no instruction count in {log}"))
}

/// **Instructions** (`http-count`, only when named, with valgrind on the PATH): each app called
/// directly, as in `http-service`, under callgrind, `COUNT_REQUESTS` times in two runs; the
/// instructions per request, exact and repeatable where the timed parts are at the mercy of a
/// shared machine. Written to `target/criterion/http-paired/instructions.md`.
fn http_count() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") || !counting() {
        return;
    }
    if let Ok(spec) = std::env::var(COUNT_ENV) {
        // Under callgrind: this run only sends the requests.
        let (app, requests) = spec.split_once(':').expect("app:requests");
        count_app(
            app.parse().expect("an app index"),
            requests.parse().expect("a request count"),
        );
        return;
    }
    let [few, many] = COUNT_REQUESTS;
    let per_request: Vec<f64> = (0..APPS)
        .map(|app| {
            let (a, b) = (callgrind(app, few), callgrind(app, many));
            (b as f64 - a as f64) / (many - few) as f64
        })
        .collect();
    let mut table = format!(
        "HTTP layer, instructions per request (callgrind, the router called directly, \
         {many} − {few} requests)\n\n| app | instructions | − bare |\n|---|---|---|\n"
    );
    for (name, count) in NAMES.iter().zip(&per_request) {
        table += &format!("| {name} | {count:.0} | {:+.0} |\n", count - per_request[0]);
    }
    println!("\n{table}");
    let dir = output_dir();
    std::fs::create_dir_all(&dir).expect("create the output directory");
    std::fs::write(dir.join("instructions.md"), table).expect("write the table");
}

criterion_main!(benches, http_paired, http_wrk, http_count);
