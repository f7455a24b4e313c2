//! A drop-in for Envoy's rate limit service (feature `envoy`): the
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` gRPC API that Envoy's
//! `envoy.filters.http.ratelimit` filter calls.
//!
//! - [`proto`]: the request and response messages, written by hand with Envoy's field numbers.

pub mod proto;
