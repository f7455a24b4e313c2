//! Requests per second through the HTTP layer, beside the same app without it, in one run
//! (issue 6): an axum app on 127.0.0.1:0 and a Rust load generator of keep-alive HTTP/1.1
//! connections in the same process.
//!
//! Three apps: `bare` (no layer), `admitted` (the layer with one per-IP rule that admits every
//! request, so every request pays the full decision and the `RateLimit` headers), `rejected`
//! (the same rule with a limit the first request exhausts, so every later request is a 429).
//! Each criterion sample sends a batch of requests over `CONNECTIONS` connections at once and
//! reports the time per request; requests per second is its inverse.
//!
//! Run: `cargo bench --features http --bench http`.

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use turnstile::http::{HttpConfig, HttpLimiter};

const CONNECTIONS: usize = 16;

fn app() -> Router {
    Router::new().route("/api/values", get(|| async { "value" }))
}

fn limited(limit: u64) -> Router {
    let config = HttpConfig::from_toml_str(&format!(
        r#"
        [[rules]]
        name = "per-ip"
        endpoint = "*"
        period = "1h"
        limit = {limit}
        "#
    ))
    .expect("bench config");
    let limiter = Arc::new(HttpLimiter::new(config).expect("bench limiter"));
    app().layer(limiter.layer())
}

async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
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

fn http(c: &mut Criterion) {
    let runtime = Runtime::new().expect("runtime");
    let (mut bare, mut admitted, mut rejected) = runtime.block_on(async {
        let bare = connect(serve(app()).await).await;
        let admitted = connect(serve(limited(u32::MAX as u64 / 2)).await).await;
        let mut rejected = connect(serve(limited(1)).await).await;
        // The first request takes the rule's only permit; every later one is rejected.
        let mut first = vec![rejected.pop().expect("a connection")];
        batch(&mut first, 1, 200).await;
        rejected.extend(first);
        (bare, admitted, rejected)
    });
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
    group.finish();
}

criterion_group!(benches, http);
criterion_main!(benches);
