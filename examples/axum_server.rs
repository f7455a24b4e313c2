//! An axum app protected by turnstile's HTTP layer, configured from a file that is re-read
//! while the server runs.
//!
//! Run: `cargo run --release --features http,axum --example axum_server` (optional arguments: the
//! config file, default `examples/axum_server.toml`, and the address, default 127.0.0.1:3000),
//! then for example `curl -i http://127.0.0.1:3000/api/values` three times within a second.

use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use turnstile::http::{HttpConfig, HttpLimiter};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Rejections (debug), bans and reload failures (warn) are tracing events.
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

    let app = Router::new()
        .route("/api/values", get(|| async { "[\"value1\", \"value2\"]" }))
        .route("/api/values/{id}", get(|| async { "\"value\"" }))
        .route("/health", get(|| async { "ok" }))
        .layer(limiter.layer());

    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!(
        "listening on http://{}, rules from {path}",
        listener.local_addr()?
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
