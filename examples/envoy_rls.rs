//! turnstile as Envoy's rate limit service: the `ShouldRateLimit` gRPC API on a tonic server,
//! configured by a file in envoyproxy/ratelimit's YAML format that is re-read while the server
//! runs.
//!
//! Run: `cargo run --release --features envoy --example envoy_rls` (optional arguments: the
//! configuration file, default `examples/envoy_rls.yaml`, and the address, default
//! 127.0.0.1:8081, the port envoyproxy/ratelimit serves gRPC on). The example asks its own
//! server a few questions and prints the answers, then serves until stopped: point Envoy's
//! `envoy.filters.http.ratelimit` filter (a `rate_limit_service` with `transport_api_version:
//! V3`) at the address. Beside it, on 127.0.0.1:8080 (envoyproxy/ratelimit's HTTP port), the
//! same service answers `POST /json` and `GET /healthcheck`:
//!
//! ```sh
//! curl -s -XPOST localhost:8080/json -d '{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}'
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Channel, Server};
use turnstile::envoy::proto::{Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use turnstile::envoy::{RlsConfig, RlsService, SHOULD_RATE_LIMIT_PATH};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path: PathBuf = args
        .next()
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/examples/envoy_rls.yaml").into())
        .into();
    let addr: SocketAddr = args.next().as_deref().unwrap_or("127.0.0.1:8081").parse()?;

    let service = RlsService::new(RlsConfig::from_file(&path)?)?;
    tokio::spawn(watch(service.clone(), path.clone()));

    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    println!(
        "Envoy rate limit service on {addr}, configuration from {}",
        path.display()
    );
    tokio::spawn(serve_json(service.clone(), "127.0.0.1:8080".parse()?));
    let server = tokio::spawn(
        Server::builder()
            .add_service(service.health_service())
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    // What Envoy would ask: a client IP, and the slow path for one client.
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = tonic::client::Grpc::new(channel);
    for (what, entries) in [
        ("10.0.0.1", vec![("remote_address", "10.0.0.1")]),
        (
            "192.0.2.66 (blocked)",
            vec![("remote_address", "192.0.2.66")],
        ),
        (
            "slow path, alice",
            vec![("generic_key", "slowpath"), ("client_id", "alice")],
        ),
        (
            "slow path, alice",
            vec![("generic_key", "slowpath"), ("client_id", "alice")],
        ),
        (
            "slow path, alice",
            vec![("generic_key", "slowpath"), ("client_id", "alice")],
        ),
        (
            "slow path, bob",
            vec![("generic_key", "slowpath"), ("client_id", "bob")],
        ),
    ] {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: entries
                    .into_iter()
                    .map(|(key, value)| Entry {
                        key: key.into(),
                        value: value.into(),
                    })
                    .collect(),
                ..Default::default()
            }],
            hits_addend: 0,
        };
        client.ready().await?;
        let response: RateLimitResponse = client
            .unary(
                tonic::Request::new(request),
                http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT_PATH),
                tonic_prost::ProstCodec::default(),
            )
            .await?
            .into_inner();
        let status = &response.statuses[0];
        println!(
            "{what:<22} {:?}: {} left, window resets in {:?}",
            response.overall_code(),
            status.limit_remaining,
            status
                .duration_until_reset
                .and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default(),
        );
    }
    println!("serving; edit {} to reload, Ctrl-C to stop", path.display());
    server.await??;
    Ok(())
}

/// Serves the service's `/json` and `/healthcheck` endpoints over HTTP/1.1 with hyper, sharing
/// the gRPC service's counts; a port already taken is reported, and gRPC serves on.
async fn serve_json(service: RlsService, addr: SocketAddr) {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("no /json endpoint: {addr}: {e}");
            return;
        }
    };
    println!("/json and /healthcheck on http://{addr}");
    let json = service.json_service();
    while let Ok((stream, _)) = listener.accept().await {
        let json = hyper_util::service::TowerToHyperService::new(json.clone());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), json)
                .await;
        });
    }
}

/// Reloads the configuration when the file changes (checked every second); a file that does
/// not load is reported and the previous configuration stays. Unchanged limits keep counting.
async fn watch(service: RlsService, path: PathBuf) {
    let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut seen = modified(&path);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = modified(&path);
        if now == seen {
            continue;
        }
        seen = now;
        match RlsConfig::from_file(&path).and_then(|c| service.reload(c)) {
            Ok(()) => println!("reloaded {}", path.display()),
            Err(e) => eprintln!("kept the previous configuration: {e}"),
        }
    }
}
