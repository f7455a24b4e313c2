//! An axum app protected by turnstile's HTTP layer, configured from a file that is re-read
//! while the server runs.
//!
//! Run: `cargo run --release --features http,axum --example axum_server` (optional arguments: the
//! config file, default `examples/axum_server.toml`, and the address, default 127.0.0.1:3000),
//! then for example `curl -i http://127.0.0.1:3000/api/values` three times within a second.

use axum::extract::Request;
use axum::routing::get;
use axum::{Router, ServiceExt};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tower::Layer;
use turnstile::http::{HttpConfig, HttpLimiter};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Rejections (debug), bans and reloads (info) and reload failures (error) are tracing events.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .init();
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/axum_server.toml").into()
    });
    let addr: SocketAddr = args.next().as_deref().unwrap_or("127.0.0.1:3000").parse()?;

    let limiter = Arc::new(HttpLimiter::new(HttpConfig::from_file(&path)?)?);
    // Edits to the file take effect within a second; a file that does not load is logged and
    // the previous configuration stays.
    let _watcher = limiter.watch(&path, Duration::from_secs(1));

    let routes = Router::new()
        .route("/api/values", get(|| async { "[\"value1\", \"value2\"]" }))
        .route("/api/values/{id}", get(|| async { "\"value\"" }))
        .route("/health", get(|| async { "ok" }))
        // The routes become services once, here, rather than on every request: a router
        // served inside another service is not converted by `axum::serve` for us.
        .with_state(());
    // The layer goes around the whole router rather than into it (`Router::layer`): a request
    // is decided before it is routed, so a rejection costs no routing, and requests for paths
    // with no route (a scanner's) are counted too. The rules match the request's own path.
    let app = limiter.layer().layer(routes);

    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "listening on http://{}, rules from {path}",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        // axum's `ServiceExt`, named with the request type: the peer address of each
        // connection goes into its requests (`ConnectInfo`), where the layer finds it.
        ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(app),
    )
    .await?;
    Ok(())
}
