//! Envoy's rate limit service counting in Redis (features `envoy` and `redis`), against a
//! `redis-server` each test starts: shared counts across services, all or nothing in one
//! script, reloads keeping counts, and the gRPC path. Windows are a year long (Redis's clock
//! is the real one), so that no test meets a window's end.

#[path = "common/envoy.rs"]
mod envoy_common;
#[path = "common/redis_server.rs"]
mod redis_server;

use envoy_common::descriptor;
use redis_server::RedisServer;
use std::time::Duration;
use turnstile::envoy::proto::{Code, RateLimitRequest, RateLimitResponse, UInt64Value};
use turnstile::envoy::{RlsConfig, RlsService, SHOULD_RATE_LIMIT_PATH};
use turnstile::redis::{aio::ConnectionManager, Client};
use turnstile::FailurePolicy;

const CONFIG: &str = "
domain: d
descriptors:
  - key: small
    rate_limit: { unit: year, requests_per_unit: 1 }
  - key: big
    rate_limit: { unit: year, requests_per_unit: 100 }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: year, requests_per_unit: 1 }
";

async fn service(server: &RedisServer, yaml: &str) -> RlsService {
    let connection = ConnectionManager::new(Client::open(server.url()).unwrap())
        .await
        .unwrap();
    RlsService::with_redis(
        RlsConfig::from_yaml_str(yaml).unwrap(),
        connection,
        "rls",
        FailurePolicy::FailClosed,
    )
    .unwrap()
}

fn request(descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors: descriptors
            .iter()
            .map(|entries| descriptor(entries))
            .collect(),
        hits_addend: 0,
    }
}

fn summary(r: &RateLimitResponse) -> (Code, Vec<(Code, u32)>) {
    (
        r.overall_code(),
        r.statuses
            .iter()
            .map(|s| (s.code(), s.limit_remaining))
            .collect(),
    )
}

const SMALL: &[(&str, &str)] = &[("small", "x")];
const BIG: &[(&str, &str)] = &[("big", "x")];
const SHADOW: &[(&str, &str)] = &[("shadow", "x")];
use Code::{Ok as OK, OverLimit as OVER};

#[tokio::test]
async fn two_services_on_one_redis_share_the_counts_all_or_nothing() {
    let server = RedisServer::start();
    let a = service(&server, CONFIG).await;
    let b = service(&server, CONFIG).await;
    let r = a.decide(&request(&[SMALL, BIG])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 0), (OK, 99)]));
    // The other service sees the count; the big limit is not charged by the rejected request
    // (the script answers its state untouched).
    let r = b.decide(&request(&[BIG, SMALL])).await.unwrap();
    assert_eq!(summary(&r), (OVER, vec![(OK, 99), (OVER, 0)]));
    let left = Duration::try_from(r.statuses[1].duration_until_reset.unwrap()).unwrap();
    assert!(left > Duration::ZERO && left <= Duration::from_secs(365 * 86_400));
    // Now the small subject is in `b`'s deny cache: rejected with no round trip, the big
    // descriptor not asked (reported OK, with no count and no window).
    for _ in 0..3 {
        let r = b.decide(&request(&[BIG, SMALL])).await.unwrap();
        assert_eq!(summary(&r), (OVER, vec![(OK, 0), (OVER, 0)]));
        assert_eq!(r.statuses[0].duration_until_reset, None);
    }
    let r = a.decide(&request(&[BIG])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 98)]));
    // The in-memory entry point refuses, rather than count in the wrong place.
    let err = a.should_rate_limit(&request(&[BIG])).unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
}

#[tokio::test]
async fn shadow_mode_hits_addend_and_limit_zero() {
    let server = RedisServer::start();
    let rls = service(&server, CONFIG).await;
    // Shadow: counted when the request is admitted, never enforced.
    for expected in [0, 0, 0] {
        let r = rls.decide(&request(&[SHADOW])).await.unwrap();
        assert_eq!(summary(&r), (OK, vec![(OK, expected)]));
    }
    // Per-descriptor hits that differ: one round trip each, stopping at the first over.
    let mut req = request(&[BIG, SMALL]);
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 10 });
    req.descriptors[1].hits_addend = Some(UInt64Value { value: 2 });
    let r = rls.decide(&req).await.unwrap();
    // 2 > the small limit of 1: over without a round trip, and nothing charged.
    assert_eq!(summary(&r), (OVER, vec![(OK, 0), (OVER, 0)]));
    req.descriptors[1].hits_addend = Some(UInt64Value { value: 0 });
    let r = rls.decide(&req).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 90), (OK, 1)]));
}

#[tokio::test]
async fn a_reload_keeps_the_counts_in_redis_and_the_grpc_server_counts_there() {
    let server = RedisServer::start();
    let rls = service(&server, CONFIG).await;
    rls.decide(&request(&[BIG])).await.unwrap();
    rls.reload(
        RlsConfig::from_yaml_str(
            "
domain: d
descriptors:
  - key: big
    rate_limit: { unit: year, requests_per_unit: 50, name: moved }
",
        )
        .unwrap(),
    )
    .unwrap();

    let mut client = envoy_common::serve(rls.clone()).await;
    client.ready().await.unwrap();
    let r: RateLimitResponse = client
        .unary(
            tonic::Request::new(request(&[BIG])),
            http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT_PATH),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(summary(&r), (OK, vec![(OK, 48)]));
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "moved");
}

#[tokio::test]
async fn one_counter_named_twice_in_a_request_counts_twice() {
    let server = RedisServer::start();
    let rls = service(&server, CONFIG).await;
    // The same subject twice, against a limit of 1: the second hit is over, and all or nothing
    // leaves the counter as it was.
    let r = rls.decide(&request(&[SMALL, SMALL])).await.unwrap();
    assert_eq!(r.overall_code(), OVER);
    let r = rls.decide(&request(&[SMALL])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 0)]));
}

#[tokio::test]
async fn a_silent_redis_is_answered_by_the_failure_policy_within_the_deadline() {
    let server = RedisServer::start();
    let connection = || async {
        ConnectionManager::new(Client::open(server.url()).unwrap())
            .await
            .unwrap()
    };
    let config = || RlsConfig::from_yaml_str(CONFIG).unwrap();
    let open = RlsService::with_redis(config(), connection().await, "rls", FailurePolicy::FailOpen)
        .unwrap();
    let closed = RlsService::with_redis(
        config(),
        connection().await,
        "rls",
        FailurePolicy::FailClosed,
    )
    .unwrap();
    server.pause();
    let big = request(&[BIG]);
    let r = tokio::time::timeout(Duration::from_secs(5), open.decide(&big)).await;
    let r = r.expect("no hang").unwrap();
    assert_eq!(r.overall_code(), OK);
    let r = tokio::time::timeout(Duration::from_secs(5), closed.decide(&big)).await;
    assert_eq!(r.expect("no hang").unwrap().overall_code(), OVER);
    server.resume();
}
