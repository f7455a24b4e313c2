//! The HTTP layer in front of a real tonic server on 127.0.0.1:0, asked by a real tonic client:
//! `HttpLimiter` (configured from TOML, on a `ManualClock` the test advances; nothing sleeps)
//! behind `Server::builder().layer(..)`, with tonic-health's ready-made Health service.
//!
//! They check that a rejected call is a gRPC status (`RESOURCE_EXHAUSTED` with the rule in the
//! message and `retry-after` as metadata) rather than a transport error, and that the peer IP
//! comes from tonic's `TcpConnectInfo` with no extra code (feature `tonic`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use turnstile::ManualClock;
use turnstile::http::HttpLimiter;

#[path = "common/http_rules.rs"]
mod http_rules;
use http_rules::{PER_IP, limiter};

/// Serves tonic-health's Health service behind `$layer` on 127.0.0.1:0 and evaluates to a
/// client connected to it (a macro: tonic's layer bounds are long to spell out in a function).
macro_rules! serve_behind {
    ($layer:expr) => {{
        let (listener, addr) = bind().await;
        let (_reporter, health) = tonic_health::server::health_reporter();
        let router = Server::builder().layer($layer).add_service(health);
        tokio::spawn(async move {
            router
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .expect("server");
        });
        client(addr).await
    }};
}

/// Serves tonic-health's Health service behind the limiter's layer on 127.0.0.1:0 and returns
/// a client connected to it.
async fn start(limiter: &Arc<HttpLimiter<ManualClock>>) -> HealthClient<Channel> {
    serve_behind!(limiter.layer())
}

async fn bind() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    (listener, addr)
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    HealthClient::new(connect(addr).await)
}

async fn connect(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("valid uri")
        .connect()
        .await
        .expect("connect")
}

/// One Health/Check call for the server's overall status (`""`, serving by default).
async fn check(client: &mut HealthClient<Channel>) -> Result<(), tonic::Status> {
    let response = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    // 1 is SERVING: the call reached the service.
    assert_eq!(response.get_ref().status, 1);
    Ok(())
}

fn metadata_secs(status: &tonic::Status, key: &str) -> u64 {
    status
        .metadata()
        .get(key)
        .unwrap_or_else(|| panic!("{key} metadata in {status:?}"))
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a whole number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_call_is_resource_exhausted_then_the_next_second_admits() {
    let (limiter, clock) = limiter(PER_IP);
    let mut client = start(&limiter).await;
    check(&mut client).await.expect("first call admitted");
    check(&mut client).await.expect("second call admitted");

    let status = check(&mut client).await.expect_err("third call rejected");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("per-ip"), "{status:?}");
    assert!(status.message().contains("rate limited"), "{status:?}");
    let retry_after = metadata_secs(&status, "retry-after");
    assert!(retry_after >= 1, "retry-after {retry_after}");
    // What a gRPC client's retry policy waits before its next attempt: the exact wait, in ms.
    let pushback = metadata_secs(&status, "grpc-retry-pushback-ms");
    assert!(
        (1..=1_000).contains(&pushback) && pushback.div_ceil(1_000) <= retry_after,
        "grpc-retry-pushback-ms {pushback}, retry-after {retry_after}"
    );
    assert_eq!(
        status.metadata().get("ratelimit-policy").expect("policy"),
        "\"per-ip\";q=2;w=1"
    );
    // Still rejected until the clock moves: nothing here depends on wall time.
    let again = check(&mut client).await.expect_err("still rejected");
    assert_eq!(again.code(), Code::ResourceExhausted);

    clock.advance(Duration::from_secs(1));
    check(&mut client)
        .await
        .expect("admitted in the next second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_ip_comes_from_tcp_connect_info() {
    // Rules for 127.0.0.1 apply and rules for another address do not, so the layer knew the
    // peer; and with `missing_key = "reject"` an unknown IP would be rejected outright.
    let (limiter, _clock) = limiter(
        r#"
        missing_key = "reject"

        [blocklist]
        ips = ["192.0.2.1"]

        [[ip_rules]]
        ip = "192.0.2.0/24"
        [[ip_rules.rules]]
        name = "elsewhere"
        period = "1s"
        limit = 0

        [[ip_rules]]
        ip = "127.0.0.1"
        [[ip_rules.rules]]
        name = "loopback"
        period = "1s"
        limit = 1
        "#,
    );
    let mut client = start(&limiter).await;
    check(&mut client).await.expect("first call admitted");
    let status = check(&mut client).await.expect_err("loopback rule applies");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("loopback"), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_peer_is_permission_denied_and_whitelisted_peer_is_unlimited() {
    let (blocking, _clock) = limiter("[blocklist]\nips = [\"127.0.0.0/8\"]\n");
    let mut client = start(&blocking).await;
    let status = check(&mut client).await.expect_err("blocked");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("blocked"), "{status:?}");

    let (whitelisting, _clock) =
        limiter(&format!("{PER_IP}\n[whitelist]\nips = [\"127.0.0.1\"]\n"));
    let mut client = start(&whitelisting).await;
    for call in 0..5 {
        check(&mut client)
            .await
            .unwrap_or_else(|status| panic!("call {call} rejected: {status:?}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_off_gives_the_http_429_which_tonic_reports_as_a_protocol_error() {
    let (limiter, _clock) = limiter(&format!("[response]\ngrpc = false\n{PER_IP}"));
    let mut client = start(&limiter).await;
    check(&mut client).await.expect("first call admitted");
    check(&mut client).await.expect("second call admitted");
    let status = check(&mut client).await.expect_err("third call rejected");
    // What the gRPC rejection is for: tonic reads the problem+json body as gRPC frames and
    // reports INTERNAL (a protocol error), not the rate limit.
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(status.message().contains("429"), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_template_becomes_the_grpc_message() {
    let (limiter, _clock) = limiter(&format!(
        "[response]\nbody = \"slow down: {{rule}} allows {{limit}} per {{period}} — 100%\"\n{PER_IP}"
    ));
    let mut client = start(&limiter).await;
    check(&mut client).await.expect("first call admitted");
    check(&mut client).await.expect("second call admitted");
    let status = check(&mut client).await.expect_err("third call rejected");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    // Percent-encoded on the wire, decoded by the client.
    assert_eq!(status.message(), "slow down: per-ip allows 2 per 1s — 100%");
}

/// The concurrency layer's rejection is a gRPC status too: with its only permit held, a call
/// gets `RESOURCE_EXHAUSTED` and `retry-after`; with the permit back, it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_rejection_is_resource_exhausted() {
    let layer = turnstile::http::ConcurrencyLayer::new(
        turnstile::ConcurrencyLimiter::new(1).expect("limit 1"),
    )
    .retry_after(Duration::from_millis(1_500));
    let mut client = serve_behind!(layer.clone());

    check(&mut client).await.expect("a free permit: served");
    let held = layer
        .limiter()
        .try_acquire_owned(1)
        .expect("the only permit");
    let status = check(&mut client).await.expect_err("no permit: rejected");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("concurrency"), "{status:?}");
    assert_eq!(metadata_secs(&status, "retry-after"), 2);
    assert_eq!(metadata_secs(&status, "grpc-retry-pushback-ms"), 1_500);
    drop(held);
    check(&mut client)
        .await
        .expect("the permit is back: served");
}

/// A probe that found nothing, pinned: a server-streaming call (Health/Watch, which streams
/// until the client lets go) holds the concurrency permit for as long as its stream runs over
/// HTTP/2, so another call meanwhile is `RESOURCE_EXHAUSTED`; the client dropping the stream
/// (a reset of the HTTP/2 stream) gives the permit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_permit_is_held_through_a_server_stream_until_the_client_drops_it() {
    let layer = turnstile::http::ConcurrencyLayer::new(
        turnstile::ConcurrencyLimiter::new(1).expect("limit 1"),
    );
    let limiter = layer.limiter().clone();
    let mut client = serve_behind!(layer);
    let mut stream = client
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("a watch")
        .into_inner();
    let first = stream.message().await.expect("a message").expect("one");
    assert_eq!(first.status, 1);
    assert_eq!(limiter.available(), 0, "held while the stream runs");
    let status = check(&mut client).await.expect_err("no permit: rejected");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    drop(stream);
    // The server hears of the reset on its own tasks: real time, bounded.
    for _ in 0..1000 {
        if limiter.available() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(limiter.available(), 1, "given back when the client lets go");
    check(&mut client)
        .await
        .expect("the permit is back: served");
}

/// One raw Health/Check call on `channel` (an empty `HealthCheckRequest`, framed by hand):
/// the response's head, and whether the stream had ended with it.
async fn raw_check(channel: &mut Channel, addr: SocketAddr) -> (http::HeaderMap, bool) {
    use http_body::Body as _;
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        // A message of 0 bytes: not compressed, length 0.
        .body(tonic::body::Body::new(http_body_util::Full::new(
            bytes::Bytes::from_static(&[0, 0, 0, 0, 0]),
        )))
        .expect("a request");
    let response = call_raw(channel, request).await;
    (response.headers().clone(), response.body().is_end_stream())
}

/// Sends `request` on `channel` as it is (no tonic client in between) and returns the
/// response, which must be HTTP 200, as every gRPC answer is.
async fn call_raw(
    channel: &mut Channel,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    use tower::{Service, ServiceExt};
    let response = channel
        .ready()
        .await
        .expect("a connection")
        .call(request)
        .await
        .expect("a response");
    assert_eq!(response.status(), 200);
    response
}

/// A probe that found nothing, pinned: a rejection is trailers-only on the wire, one HEADERS
/// frame that ends the stream (gRPC's "Trailers-Only": grpc-go takes the status from a first
/// HEADERS frame only when it carries END_STREAM, and otherwise waits for trailers), from the
/// concurrency layer and from the rate layer alike, in front of tonic's server. tonic's own
/// client reads the status either way, so the calls are raw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_rejection_is_one_headers_frame_that_ends_the_stream() {
    // The concurrency layer, its only permit held.
    let layer = turnstile::http::ConcurrencyLayer::new(
        turnstile::ConcurrencyLimiter::new(1).expect("limit 1"),
    );
    let _held = layer.limiter().try_acquire_owned(1).expect("the permit");
    let (listener, addr) = bind().await;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let router = Server::builder().layer(layer).add_service(health);
    tokio::spawn(async move {
        router
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("server");
    });
    let mut channel = connect(addr).await;
    let (headers, ended) = raw_check(&mut channel, addr).await;
    assert_eq!(headers["grpc-status"], "8");
    assert!(ended, "trailers-only: {headers:?}");

    // The rate layer: two calls served (with a body and trailers), the third rejected.
    let (limiter, _clock) = limiter(PER_IP);
    let (listener, addr) = bind().await;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let router = Server::builder().layer(limiter.layer()).add_service(health);
    tokio::spawn(async move {
        router
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("server");
    });
    let mut channel = connect(addr).await;
    for _ in 0..2 {
        let (headers, ended) = raw_check(&mut channel, addr).await;
        assert!(headers.get("grpc-status").is_none(), "{headers:?}");
        assert!(!ended, "served: a message and trailers follow");
    }
    let (headers, ended) = raw_check(&mut channel, addr).await;
    assert_eq!(headers["grpc-status"], "8");
    assert!(ended, "trailers-only: {headers:?}");
}

/// A service (at `/big.Big/...`) answering every call with one 64 MiB data frame.
#[derive(Clone)]
struct Big;

impl tonic::server::NamedService for Big {
    const NAME: &'static str = "big.Big";
}

impl tower::Service<http::Request<tonic::body::Body>> for Big {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        let body = http_body_util::Full::new(bytes::Bytes::from(vec![b'x'; BIG]));
        std::future::ready(Ok(http::Response::new(tonic::body::Body::new(body))))
    }
}

const BIG: usize = 64 << 20;

/// A probe that found nothing, pinned: over HTTP/2 too, a response of one large frame holds
/// the concurrency permit while the client has not read it (hyper takes the layer's 64 KiB
/// pieces as the flow-control window allows, and the client's window stops at a few MiB), and
/// gives it back once the client has read it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_permit_is_held_while_an_h2_client_has_not_read_a_large_body() {
    use http_body_util::BodyExt;
    let layer = turnstile::http::ConcurrencyLayer::new(
        turnstile::ConcurrencyLimiter::new(1).expect("limit 1"),
    );
    let limiter = layer.limiter().clone();
    let (listener, addr) = bind().await;
    let router = Server::builder().layer(layer).add_service(Big);
    tokio::spawn(async move {
        router
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .expect("server");
    });
    let mut channel = connect(addr).await;
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/big.Big/Get"))
        .body(tonic::body::Body::empty())
        .expect("a request");
    let response = call_raw(&mut channel, request).await;
    // The server goes on sending on its own tasks: give it time to fill every window.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(limiter.available(), 0, "held while the client has not read");
    let body = response.into_body().collect().await.expect("the body");
    assert_eq!(body.to_bytes().len(), BIG);
    for _ in 0..1000 {
        if limiter.available() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(limiter.available(), 1, "given back once it is all read");
}
