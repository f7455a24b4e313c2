//! A drop-in for Envoy's rate limit service (feature `envoy`): the
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` gRPC API that Envoy's
//! `envoy.filters.http.ratelimit` filter calls, answered from envoyproxy/ratelimit's YAML
//! configuration files, loaded as they are.
//!
//! - [`RlsConfig`]: the configuration (one YAML file per domain), with errors naming the field.
//! - [`RlsService`]: the decisions, hot [`reload`](RlsService::reload), and the tonic service
//!   to mount with `Server::builder().add_service(..)`. It counts in memory, or (feature
//!   `redis`) in Redis or Valkey, shared by every instance: standalone (`with_redis`) or a
//!   Cluster (`with_redis_cluster`, one script per slot, all or nothing across slots by giving
//!   back what the other slots took).
//! - [`HealthService`]: gRPC's health checking protocol (`grpc.health.v1.Health/Check`), as
//!   envoyproxy/ratelimit serves it beside `ShouldRateLimit`.
//! - [`JsonService`]: envoyproxy/ratelimit's HTTP endpoints, `/json` (the same decisions, in
//!   the proto3 JSON mapping) and `/healthcheck`, as a tower service.
//! - [`proto`]: the request and response messages, written by hand with Envoy's field numbers.
//!
//! # Examples
//!
//! ```no_run
//! use turnstile::envoy::{RlsConfig, RlsService};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let service = RlsService::new(RlsConfig::from_files(["config/edge.yaml"])?)?;
//! # let serve = |_s: RlsService| async { Ok::<(), Box<dyn std::error::Error>>(()) };
//! // tonic::transport::Server::builder().add_service(service.clone()).serve(addr).await?;
//! # serve(service.clone()).await?;
//! // later, on a signal:
//! service.reload(RlsConfig::from_files(["config/edge.yaml"])?)?;
//! # Ok(())
//! # }
//! ```

mod config;
mod json;
mod metrics;
pub mod proto;
#[cfg(feature = "redis")]
mod remote;
mod service;

pub use config::{RlsConfig, RlsConfigError};
pub use json::{JsonService, MAX_JSON_REQUEST_BYTES};
pub use service::{
    DEFAULT_NEAR_LIMIT_RATIO, HEALTH_CHECK_PATH, HEALTH_SERVICE_NAME, HealthService,
    MAX_OVERRIDE_LIMITS, ResponseHeaders, RlsService, SHOULD_RATE_LIMIT_PATH, UnixClock,
};
