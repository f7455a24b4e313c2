//! A drop-in for Envoy's rate limit service (feature `envoy`): the
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` gRPC API that Envoy's
//! `envoy.filters.http.ratelimit` filter calls, answered from envoyproxy/ratelimit's YAML
//! configuration files, loaded as they are.
//!
//! - [`RlsConfig`]: the configuration (one YAML file per domain), with errors naming the field.
//! - [`proto`]: the request and response messages, written by hand with Envoy's field numbers.

mod config;
pub mod proto;

pub use config::{RlsConfig, RlsConfigError};
