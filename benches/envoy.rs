//! The Envoy rate limit service (`turnstile::envoy`, feature `envoy`): what a `ShouldRateLimit`
//! decision costs, beside the keyed limiter decision it is built on, in one run.
//!
//! - `envoy/keyed_floor`: `KeyedLimiter::try_acquire` on a fixed window keyed by a client
//!   address, with the key already built: the decision every descriptor comes down to.
//! - `envoy/decide/1_descriptor`: `RlsService::should_rate_limit` for one descriptor
//!   (`remote_address` = one of 1,024 addresses, in turn), matched against a configuration of a
//!   per-address limit beside two other limits: the matching, the counter key (the descriptor's
//!   entries), the decision and the response with its status.
//! - `envoy/decide/2_descriptors`: one request with two descriptors (a per-address limit and a
//!   nested per-path limit), both admitted: all or nothing across two limiters.
//! - `envoy/decide/over_limit`: one descriptor over its limit (1 per hour, exhausted): the answer
//!   a flood gets.
//! - `envoy/grpc/1_descriptor`: the same one-descriptor request through tonic, client and server
//!   on 127.0.0.1 in one process (one current-thread runtime): what Envoy's filter waits for,
//!   less the network between the two.
//!
//! Every limit of the configuration is large enough that nothing is rejected during the run but
//! where the name says so.
//!
//! Run: `cargo bench --features envoy --bench envoy`.

#[path = "../tests/common/envoy.rs"]
mod envoy_common;

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use envoy_common::descriptor;
use std::time::Duration;
use turnstile::envoy::proto::{Code, RateLimitDescriptor, RateLimitRequest};
use turnstile::envoy::{RlsConfig, RlsService, SHOULD_RATE_LIMIT_PATH};
use turnstile::{Algorithm, KeyedLimiter};

/// Requests per hour that a bench run never reaches.
const PLENTY: u32 = 4_000_000_000;

fn config() -> RlsConfig {
    RlsConfig::from_yaml_str(&format!(
        r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {{ unit: hour, requests_per_unit: {PLENTY} }}
  - key: path
    value: /api/login
    rate_limit: {{ unit: minute, requests_per_unit: 10 }}
  - key: client
    descriptors:
      - key: path
        rate_limit: {{ unit: hour, requests_per_unit: {PLENTY} }}
  - key: blocked
    rate_limit: {{ unit: hour, requests_per_unit: 1 }}
"#
    ))
    .expect("the bench's configuration loads")
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

/// 1,024 client addresses, one request each, asked in turn.
fn per_address_requests() -> Vec<RateLimitRequest> {
    (0..1024u32)
        .map(|i| {
            let address = format!("10.0.{}.{}", i / 256, i % 256);
            request(vec![descriptor(&[("remote_address", &address)])])
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("envoy");

    let addresses: Vec<String> = (0..1024u32)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect();
    let keyed = KeyedLimiter::<String>::new(Algorithm::FixedWindow {
        limit: PLENTY,
        window: Duration::from_secs(3600),
    })
    .unwrap();
    let mut i = 0;
    group.bench_function("keyed_floor", |b| {
        b.iter(|| {
            i = (i + 1) % addresses.len();
            black_box(keyed.try_acquire(&addresses[i]).is_ok())
        })
    });

    let service = RlsService::new(config()).unwrap();
    let requests = per_address_requests();
    let mut i = 0;
    group.bench_function("decide/1_descriptor", |b| {
        b.iter(|| {
            i = (i + 1) % requests.len();
            let response = service.should_rate_limit(&requests[i]).unwrap();
            black_box(response.overall_code() == Code::Ok)
        })
    });

    let two: Vec<RateLimitRequest> = addresses
        .iter()
        .map(|a| {
            request(vec![
                descriptor(&[("remote_address", a)]),
                descriptor(&[("client", "mobile"), ("path", "/api/orders")]),
            ])
        })
        .collect();
    let mut i = 0;
    group.bench_function("decide/2_descriptors", |b| {
        b.iter(|| {
            i = (i + 1) % two.len();
            let response = service.should_rate_limit(&two[i]).unwrap();
            black_box(response.overall_code() == Code::Ok)
        })
    });

    let over = request(vec![descriptor(&[("blocked", "203.0.113.9")])]);
    let first = service.should_rate_limit(&over).unwrap();
    assert_eq!(
        first.overall_code(),
        Code::Ok,
        "the first request is admitted"
    );
    group.bench_function("decide/over_limit", |b| {
        b.iter(|| {
            let response = service.should_rate_limit(&over).unwrap();
            black_box(response.overall_code() == Code::OverLimit)
        })
    });

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut client = runtime.block_on(envoy_common::serve(RlsService::new(config()).unwrap()));
    let mut i = 0;
    group.bench_function("grpc/1_descriptor", |b| {
        b.iter(|| {
            i = (i + 1) % requests.len();
            let request = tonic::Request::new(requests[i].clone());
            let response: turnstile::envoy::proto::RateLimitResponse = runtime.block_on(async {
                client.ready().await.unwrap();
                let path = http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT_PATH);
                client
                    .unary(request, path, tonic_prost::ProstCodec::default())
                    .await
                    .unwrap()
                    .into_inner()
            });
            black_box(response.overall_code() == Code::Ok)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
