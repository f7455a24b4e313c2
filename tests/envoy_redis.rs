//! Envoy's rate limit service counting in Redis (features `envoy` and `redis`), against a
//! `redis-server` (or a Redis Cluster of three) each test starts: shared counts across services,
//! all or nothing in one script, and across Cluster slots by giving back, reloads keeping
//! counts, the failure policy, and the gRPC path. Windows are a year long (Redis's clock is the
//! real one), so that no test meets a window's end.

#[path = "common/envoy.rs"]
mod envoy_common;
#[path = "common/redis_server.rs"]
mod redis_server;

use envoy_common::descriptor;
use redis_server::{RedisCluster, RedisServer};
use std::time::Duration;
use turnstile::FailurePolicy;
use turnstile::envoy::proto::{
    Code, RateLimitOverride, RateLimitRequest, RateLimitResponse, UInt64Value, Unit,
};
use turnstile::envoy::{RlsConfig, RlsService, SHOULD_RATE_LIMIT_PATH};
use turnstile::redis::cluster::ClusterClient;
use turnstile::redis::{Client, aio::ConnectionManager};

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
    // Per-descriptor hits that differ.
    let mut req = request(&[BIG, SMALL]);
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 10 });
    req.descriptors[1].hits_addend = Some(UInt64Value { value: 2 });
    let r = rls.decide(&req).await.unwrap();
    // 2 > the small limit of 1: over without a script, and counted past the limit (as
    // Envoy's service counts it); the big limit is asked all the same (were it over, its
    // hits would count) and given back, answering its count before the request.
    assert_eq!(summary(&r), (OVER, vec![(OK, 100), (OVER, 0)]));
    // So a check of the small limit is over now (as one hit would be), and the request takes
    // nothing from the big one.
    req.descriptors[1].hits_addend = Some(UInt64Value { value: 0 });
    let r = rls.decide(&req).await.unwrap();
    assert_eq!(summary(&r), (OVER, vec![(OK, 100), (OVER, 0)]));
    let r = rls.decide(&request(&[BIG])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 99)]));
}

/// A shadow descriptor counts its hits past its limit in Redis as in memory (and as Envoy's
/// service counts them): a cost past what is left, then a check, then the limit enforced by a
/// reload that keeps the count. Both a cost decided by a script and one above the limit
/// itself (decided without one) count.
#[tokio::test]
async fn a_shadow_descriptor_counts_its_hits_past_the_limit_in_redis_as_in_memory() {
    let yaml = |shadow: bool| {
        format!(
            "domain: d\ndescriptors:\n  - key: budget\n    shadow_mode: {shadow}\n    rate_limit: {{ unit: year, requests_per_unit: 10 }}\n"
        )
    };
    for (first, past) in [(9, 3), (0, 11)] {
        let server = RedisServer::start();
        let rls = service(&server, &yaml(true)).await;
        let memory = RlsService::with_clock(
            RlsConfig::from_yaml_str(&yaml(true)).unwrap(),
            turnstile::ManualClock::new(),
        )
        .unwrap();
        let mut answers = Vec::new();
        for hits in [first, past, 0] {
            let req = costing(&[(BUDGET_X, hits)]);
            let r = rls.decide(&req).await.unwrap();
            assert_eq!(
                summary(&r),
                summary(&memory.should_rate_limit(&req).unwrap())
            );
            answers.push(summary(&r));
        }
        assert_eq!(answers[2], (OK, vec![(OK, 0)]), "{first} then {past}");
        rls.reload(RlsConfig::from_yaml_str(&yaml(false)).unwrap())
            .unwrap();
        let r = rls.decide(&costing(&[(BUDGET_X, 1)])).await.unwrap();
        assert_eq!(summary(&r), (OVER, vec![(OVER, 0)]), "{first} then {past}");
    }
}

/// Global shadow mode in Redis: decided as without it (the big limit given back), answered `OK`.
#[tokio::test]
async fn global_shadow_mode_answers_ok_after_the_same_decision() {
    let server = RedisServer::start();
    let rls = service(&server, CONFIG).await.with_global_shadow_mode(true);
    let r = rls.decide(&request(&[SMALL, BIG])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 0), (OK, 99)]));
    let r = rls.decide(&request(&[BIG, SMALL])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 99), (OVER, 0)]));
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

/// In Redis too, a cost reported after the fact (a check with `hits_addend: 0`, then the cost
/// once known) counts past the limit when it is more than what is left, in the same script,
/// and the checks after it are over; a cost above the limit itself (decided without a script)
/// counts as well. Before, both counted nothing and the checks went on answering `OK`.
#[tokio::test]
async fn a_cost_reported_past_what_is_left_counts_and_turns_the_checks_over() {
    const TOKENS: &str = "
domain: d
descriptors:
  - key: tokens
    rate_limit: { unit: year, requests_per_unit: 1000 }
";
    let server = RedisServer::start();
    let rls = service(&server, TOKENS).await;
    let costs = |who: &str, hits: u64| {
        let entries: &[(&str, &str)] = &[("tokens", who)];
        let mut r = request(&[entries]);
        r.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
        r
    };
    for (who, report) in [("alice", 500), ("bob", 1500)] {
        let r = rls.decide(&costs(who, 900)).await.unwrap();
        assert_eq!(summary(&r), (OK, vec![(OK, 100)]));
        let r = rls.decide(&costs(who, 0)).await.unwrap();
        assert_eq!(summary(&r), (OK, vec![(OK, 100)]), "{who}");
        let r = rls.decide(&costs(who, report)).await.unwrap();
        assert_eq!(summary(&r), (OVER, vec![(OVER, 0)]), "{who}");
        for hits in [0, 1, 0] {
            let r = rls.decide(&costs(who, hits)).await.unwrap();
            assert_eq!(summary(&r), (OVER, vec![(OVER, 0)]), "{who}: {hits} hits");
        }
    }
}

#[tokio::test]
async fn one_counter_named_twice_in_a_request_counts_twice() {
    let server = RedisServer::start();
    let rls = service(&server, CONFIG).await;
    // The same subject twice, against a limit of 1: the second hit is over and counts past
    // the limit (as Envoy's service counts it), and all or nothing gives the first one back.
    let r = rls.decide(&request(&[SMALL, SMALL])).await.unwrap();
    assert_eq!(r.overall_code(), OVER);
    let r = rls.decide(&request(&[SMALL])).await.unwrap();
    assert_eq!(summary(&r), (OVER, vec![(OVER, 0)]), "1 of 1 counted");
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

/// A descriptor of more hits than its limit beside one that Redis decides: the charge that
/// counts the first past its limit goes in the same round as the second's script, so that a
/// silent Redis holds the request one deadline (50 ms), not one after the other. Real time:
/// the deadline is what is measured.
#[tokio::test]
async fn a_cost_above_its_limit_beside_another_descriptor_waits_one_deadline_on_a_silent_redis() {
    let server = RedisServer::start();
    let rls = service(&server, CONFIG).await;
    server.pause();
    let mut req = request(&[SMALL, BIG]);
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    let started = std::time::Instant::now();
    let r = rls.decide(&req).await.unwrap();
    let took = started.elapsed();
    server.resume();
    assert_eq!(summary(&r), (OVER, vec![(OVER, 0), (OVER, 0)]));
    // Two deadlines one after the other take 100 ms at least (a timer never fires early).
    assert!(took < Duration::from_millis(100), "{took:?}");
}

/// Different per-descriptor `hits_addend`s on one server: one script per cost, and a request
/// that one of them rejects costs nothing in the others either (given back).
#[tokio::test]
async fn descriptors_of_different_costs_are_all_or_nothing() {
    let server = RedisServer::start();
    let rls = service(&server, CONFIG).await;
    let r = rls.decide(&request(&[SMALL])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 0)]));
    let mut req = request(&[BIG, SMALL]);
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 10 });
    let r = rls.decide(&req).await.unwrap();
    // The big limit took 10 in its script, and gave them back: 100 left, as before.
    assert_eq!(summary(&r), (OVER, vec![(OK, 100), (OVER, 0)]));
    let r = rls.decide(&request(&[BIG])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 99)]));
}

/// A big descriptor whose key's slot (7490) falls on another master of three than `SMALL`'s
/// (11491): slots are split in thirds (the tests check where the keys landed).
const BIG_B: &[(&str, &str)] = &[("big", "b")];

/// A service counting in `cluster` under the prefix `rls`.
async fn cluster_service(cluster: &RedisCluster, yaml: &str, policy: FailurePolicy) -> RlsService {
    let connection = ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    RlsService::with_redis_cluster(
        RlsConfig::from_yaml_str(yaml).unwrap(),
        connection,
        "rls",
        policy,
    )
    .unwrap()
}

/// The (node, slot) of each key under `rls:` whose name holds `needle`, in `cluster`.
fn keys_of(cluster: &RedisCluster, needle: &str) -> Vec<(usize, i64)> {
    let mut found = Vec::new();
    for (n, node) in cluster.nodes.iter().enumerate() {
        let mut con = node.connection();
        for key in redis_server::assert_all_keys_expire(&mut con, "rls") {
            if key.contains(needle) {
                let slot: i64 = turnstile::redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(&key)
                    .query(&mut con)
                    .unwrap();
                found.push((n, slot));
            }
        }
    }
    found
}

/// `EVALSHA` and `EVAL` calls so far, over every node of `cluster`.
fn scripts_run(cluster: &RedisCluster) -> u64 {
    let mut calls = 0;
    for node in &cluster.nodes {
        let info: String = turnstile::redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut node.connection())
            .unwrap();
        for line in info.lines() {
            if line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:") {
                let calls_field = line
                    .split([':', ','])
                    .find_map(|f| f.strip_prefix("calls="));
                calls += calls_field.unwrap().parse::<u64>().unwrap();
            }
        }
    }
    calls
}

/// On a Cluster, a request's descriptors in different slots (here on different masters) are
/// each limited, shared by every service, and all or nothing: the one over its limit is
/// rejected in its slot, and the one admitted in the other slot gives its hit back.
#[tokio::test]
async fn cluster_descriptors_in_different_slots_are_all_or_nothing() {
    let cluster = RedisCluster::start(3);
    let a = cluster_service(&cluster, CONFIG, FailurePolicy::FailClosed).await;
    let b = cluster_service(&cluster, CONFIG, FailurePolicy::FailClosed).await;
    let r = a.decide(&request(&[SMALL, BIG_B])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 0), (OK, 99)]));
    let (small, big) = (keys_of(&cluster, "small"), keys_of(&cluster, "big"));
    assert_eq!((small.len(), big.len()), (1, 1));
    assert_ne!(
        small[0].0, big[0].0,
        "on different masters: {small:?} {big:?}"
    );
    // The other service: the small limit is over in its slot, the big one admits in its own
    // and gives its hit back (99 left: the count as it stands).
    let r = b.decide(&request(&[BIG_B, SMALL])).await.unwrap();
    assert_eq!(summary(&r), (OVER, vec![(OK, 99), (OVER, 0)]));
    let left = Duration::try_from(r.statuses[1].duration_until_reset.unwrap()).unwrap();
    assert!(left > Duration::ZERO && left <= Duration::from_secs(365 * 86_400));
    let r = a.decide(&request(&[BIG_B])).await.unwrap();
    assert_eq!(
        summary(&r),
        (OK, vec![(OK, 98)]),
        "the rejected request cost nothing"
    );
    // Now the small subject is in `b`'s deny cache: rejected with no round trip to any slot,
    // the big descriptor not asked.
    let before = scripts_run(&cluster);
    for _ in 0..3 {
        let r = b.decide(&request(&[BIG_B, SMALL])).await.unwrap();
        assert_eq!(summary(&r), (OVER, vec![(OK, 0), (OVER, 0)]));
        assert_eq!(r.statuses[0].duration_until_reset, None);
    }
    assert_eq!(scripts_run(&cluster), before);
    let r = a.decide(&request(&[BIG_B])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 97)]));
}

/// On a Cluster, descriptors whose keys share a slot (one subject: the same entries, under a
/// configured limit and a request's `limit` override) are decided in one script, one round
/// trip, all or nothing; and a reload keeps the counts.
#[tokio::test]
async fn cluster_descriptors_in_one_slot_are_one_script_and_a_reload_keeps_counts() {
    let cluster = RedisCluster::start(3);
    let rls = cluster_service(&cluster, CONFIG, FailurePolicy::FailClosed).await;
    let mut req = request(&[SMALL, SMALL]);
    req.descriptors[1].limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: Unit::Year as i32,
    });
    let r = rls.decide(&req).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 0), (OK, 4)]));
    let keys = keys_of(&cluster, "small");
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "one node, one slot");
    let before = scripts_run(&cluster);
    let r = rls.decide(&req).await.unwrap();
    assert_eq!(summary(&r), (OVER, vec![(OVER, 0), (OK, 4)]));
    assert_eq!(scripts_run(&cluster), before + 1, "one script");
    let r = rls.decide(&request(&[BIG])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 99)]));
    // The override's count was not charged by the rejected request.
    let mut alone = request(&[SMALL]);
    alone.descriptors[0].limit = req.descriptors[1].limit;
    let r = rls.decide(&alone).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 3)]));

    rls.reload(
        RlsConfig::from_yaml_str(
            "
domain: d
descriptors:
  - key: big
    rate_limit: { unit: year, requests_per_unit: 50, name: moved }
  - key: small
    rate_limit: { unit: year, requests_per_unit: 3 }
",
        )
        .unwrap(),
    )
    .unwrap();
    // The small limit's count is 2: its hit and the rejected request's, counted past the
    // limit of 1 as Envoy's service counts it.
    let r = rls.decide(&request(&[BIG, SMALL])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 48), (OK, 0)]));
}

/// On a Cluster whose node for one descriptor's slot does not answer, that descriptor is
/// decided by the failure policy and the other's slot by Redis: failing closed rejects the
/// request and gives the other's hit back; failing open admits it, charged in Redis.
#[tokio::test]
async fn cluster_failure_policy_decides_the_slot_that_does_not_answer() {
    let cluster = RedisCluster::start(3);
    let closed = cluster_service(&cluster, CONFIG, FailurePolicy::FailClosed).await;
    let open = cluster_service(&cluster, CONFIG, FailurePolicy::FailOpen).await;
    let r = closed.decide(&request(&[SMALL, BIG_B])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 0), (OK, 99)]));
    let (small, big) = (keys_of(&cluster, "small"), keys_of(&cluster, "big"));
    assert_ne!(small[0].0, big[0].0);
    let small_node = &cluster.nodes[small[0].0];
    small_node.pause();
    let probe = request(&[BIG_B, SMALL]);
    let r = tokio::time::timeout(Duration::from_secs(5), closed.decide(&probe)).await;
    let r = r.expect("no hang").unwrap();
    assert_eq!(summary(&r), (OVER, vec![(OK, 99), (OVER, 0)]));
    let r = tokio::time::timeout(Duration::from_secs(5), open.decide(&probe)).await;
    let r = r.expect("no hang").unwrap();
    assert_eq!(r.overall_code(), OK);
    assert_eq!(r.statuses[0].limit_remaining, 98, "charged in Redis");
    small_node.resume();
    let r = closed.decide(&request(&[BIG_B])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 97)]));
}

/// On a Cluster under `Fallback`, a descriptor whose slot does not answer is charged in the
/// local fallback; when the other slot rejects the request, the fallback gives its hit back.
#[tokio::test]
async fn cluster_fallback_gives_back_when_another_slot_rejects() {
    let cluster = RedisCluster::start(3);
    let policy = FailurePolicy::Fallback { share: 0.5 };
    let rls = cluster_service(&cluster, CONFIG, policy).await;
    let r = rls.decide(&request(&[SMALL, BIG_B])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 0), (OK, 99)]));
    let (small, big) = (keys_of(&cluster, "small"), keys_of(&cluster, "big"));
    assert_ne!(small[0].0, big[0].0);
    let big_node = &cluster.nodes[big[0].0];
    big_node.pause();
    // The big limit's fallback (50 here) admits, the small limit in Redis is over: the
    // fallback's hit is given back, so the next one leaves 49, not 48.
    let (both, big_alone) = (request(&[BIG_B, SMALL]), request(&[BIG_B]));
    let r = tokio::time::timeout(Duration::from_secs(5), rls.decide(&both)).await;
    let r = r.expect("no hang").unwrap();
    assert_eq!(summary(&r), (OVER, vec![(OK, 50), (OVER, 0)]));
    let r = tokio::time::timeout(Duration::from_secs(5), rls.decide(&big_alone)).await;
    let r = r.expect("no hang").unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 49)]));
    big_node.resume();
}

/// One counter named by two descriptors of different costs is decided in two scripts (one per
/// cost), one after the other: the second rejects on what the first took, and the first then
/// gives it back. That rejection counted hits the request no longer holds, so the deny cache
/// must not keep it: kept, it answered every later one-hit request on the counter over the
/// limit, without asking Redis, for the rest of the window (a year here), with the counter at 0.
#[tokio::test]
async fn a_rejection_counting_another_call_s_given_back_hits_is_not_cached() {
    const PAIR_CONFIG: &str = "
domain: d
descriptors:
  - key: pair
    rate_limit: { unit: year, requests_per_unit: 2 }
";
    const PAIR: &[(&str, &str)] = &[("pair", "x")];
    let server = RedisServer::start();
    let rls = service(&server, PAIR_CONFIG).await;
    let mut req = request(&[PAIR, PAIR]);
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    let r = rls.decide(&req).await.unwrap();
    assert_eq!(r.overall_code(), OVER);
    // The two hits were given back; the rejected one counts past the limit (as Envoy's
    // service counts it): 1 of 2, so one hit is within the limit, and the next is over.
    let r = rls.decide(&request(&[PAIR])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 0)]));
    let r = rls.decide(&request(&[PAIR])).await.unwrap();
    assert_eq!(summary(&r), (OVER, vec![(OVER, 0)]));
}

/// A counter named twice in a call that is given back (another call, of another cost,
/// rejected): the call took its hits twice and gives them back twice, so both descriptors
/// answer the count as before the request, not the second one a hit short of it.
#[tokio::test]
async fn a_counter_named_twice_and_given_back_answers_its_count_before_the_request_twice() {
    const TRIO_CONFIG: &str = "
domain: d
descriptors:
  - key: trio
    rate_limit: { unit: year, requests_per_unit: 3 }
  - key: big
    rate_limit: { unit: year, requests_per_unit: 100 }
";
    const TRIO: &[(&str, &str)] = &[("trio", "x")];
    let server = RedisServer::start();
    let rls = service(&server, TRIO_CONFIG).await;
    let mut spend = request(&[BIG]);
    spend.descriptors[0].hits_addend = Some(UInt64Value { value: 99 });
    let r = rls.decide(&spend).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 1)]));
    let mut req = request(&[TRIO, TRIO, BIG]);
    req.descriptors[2].hits_addend = Some(UInt64Value { value: 2 });
    let r = rls.decide(&req).await.unwrap();
    assert_eq!(summary(&r), (OVER, vec![(OK, 3), (OK, 3), (OVER, 0)]));
    // Nothing was kept: the counter of three admits three.
    let r = rls.decide(&request(&[TRIO])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 2)]));
}

/// The same requests, in memory (`RlsService::with_clock`) and in Redis: each request's
/// overall code, and each status's code, in both. Statuses a rejected Redis request leaves
/// unasked (reported `OK` with no window) are compared by code only, as are all others.
async fn in_memory_and_in_redis(yaml: &str, requests: &[RateLimitRequest]) {
    let server = RedisServer::start();
    in_memory_and_in(&service(&server, yaml).await, yaml, requests).await;
}

/// [`in_memory_and_in_redis`] with the Redis side `redis`, a service of `yaml`.
async fn in_memory_and_in(redis: &RlsService, yaml: &str, requests: &[RateLimitRequest]) {
    let memory = RlsService::with_clock(
        RlsConfig::from_yaml_str(yaml).unwrap(),
        turnstile::ManualClock::new(),
    )
    .unwrap();
    for (step, req) in requests.iter().enumerate() {
        let codes = |r: &RateLimitResponse| {
            let (overall, statuses) = summary(r);
            (
                overall,
                statuses.into_iter().map(|(c, _)| c).collect::<Vec<_>>(),
            )
        };
        let m = memory.should_rate_limit(req).unwrap();
        let r = redis.decide(req).await.unwrap();
        assert_eq!(codes(&r), codes(&m), "step {step}: {req:?}");
    }
}

const BUDGET: &str = "
domain: d
descriptors:
  - key: small
    rate_limit: { unit: year, requests_per_unit: 1 }
  - key: budget
    rate_limit: { unit: year, requests_per_unit: 10 }
  - key: zero
    rate_limit: { unit: year, requests_per_unit: 0 }
";

/// A request of descriptors `(entries, hits)`.
fn costing(descriptors: &[(&[(&str, &str)], u64)]) -> RateLimitRequest {
    let mut r = request(&descriptors.iter().map(|(e, _)| *e).collect::<Vec<_>>());
    for (d, (_, hits)) in r.descriptors.iter_mut().zip(descriptors) {
        d.hits_addend = Some(UInt64Value { value: *hits });
    }
    r
}

const BUDGET_X: &[(&str, &str)] = &[("budget", "x")];
const ZERO: &[(&str, &str)] = &[("zero", "x")];

/// A cost past what is left counts (as Envoy's service counts it) even when another
/// descriptor of the request is over without a round trip (more hits than its limit, a
/// limit of 0) or is a check that is over: the budget's checks after it are over, in memory
/// and in Redis alike.
#[tokio::test]
async fn a_cost_past_what_is_left_counts_when_another_descriptor_is_over_first() {
    for first in [(SMALL, 2), (ZERO, 1), (ZERO, 0)] {
        in_memory_and_in_redis(
            BUDGET,
            &[
                costing(&[(BUDGET_X, 5)]),
                costing(&[first, (BUDGET_X, 8)]),
                costing(&[(BUDGET_X, 0)]),
            ],
        )
        .await;
    }
    // The check over: the small limit filled first.
    in_memory_and_in_redis(
        BUDGET,
        &[
            costing(&[(SMALL, 1), (BUDGET_X, 5)]),
            costing(&[(SMALL, 0), (BUDGET_X, 8)]),
            costing(&[(BUDGET_X, 0)]),
        ],
    )
    .await;
}

/// One counter named at two costs in a request another descriptor rejects first (a limit of
/// 0, or a check that is over): the second cost meets the first's hits, as in memory, where
/// every descriptor is decided in turn, so it is over and counts; the first is given back.
#[tokio::test]
async fn a_counter_at_two_costs_in_a_request_rejected_first_counts_as_in_memory() {
    for first in [(ZERO, 1), (SMALL, 0)] {
        in_memory_and_in_redis(
            BUDGET,
            &[
                costing(&[(SMALL, 1)]),
                costing(&[first, (BUDGET_X, 4), (BUDGET_X, 8)]),
                costing(&[(BUDGET_X, 0)]),
                costing(&[(BUDGET_X, 3)]),
            ],
        )
        .await;
    }
}

/// One counter named twice, first at a cost above its whole limit: the second's hits meet
/// the first's, which count past the limit, so it is over too, as in memory and in Envoy's
/// service (11 then 3 of 10: both over). In Redis the first was charged beside the second's
/// script, which decided at 0 of 10 and admitted it. A check reads the count as it was before
/// the request wherever it is named (documented on `RlsService`), and hits named before the
/// cost above the limit are decided at that count.
#[tokio::test]
async fn a_cost_above_the_limit_then_another_on_the_same_counter_are_both_over() {
    let y: &[(&str, &str)] = &[("budget", "y")];
    let z: &[(&str, &str)] = &[("budget", "z")];
    in_memory_and_in_redis(
        BUDGET,
        &[
            costing(&[(BUDGET_X, 11), (BUDGET_X, 3)]),
            costing(&[(BUDGET_X, 0)]),
            costing(&[(y, 11), (y, 0)]),
            costing(&[(z, 1), (z, 11)]),
            costing(&[(z, 0), (z, 11)]),
            costing(&[(z, 0)]),
        ],
    )
    .await;
}

/// One counter named twice, a hit then a check, the hit taking the last of the limit.
#[tokio::test]
async fn a_check_after_a_hit_on_the_same_counter_decides_alike() {
    in_memory_and_in_redis(
        BUDGET,
        &[
            costing(&[(BUDGET_X, 9)]),
            costing(&[(BUDGET_X, 1), (BUDGET_X, 0)]),
            costing(&[(BUDGET_X, 0)]),
        ],
    )
    .await;
}

/// One counter named at two costs, each occurrence decided in the request's order (as in
/// memory, and in Envoy's service, which counts them in order), not grouped by cost: the
/// answers (`limit_remaining` too, when admitted) and the counts left are the same in memory
/// and in Redis. Grouped by cost, the occurrences of cost 1 (in one script, sent first) were decided
/// before the one of cost 10 between them: `[1, 10, 1]` answered the last `OK` (memory: over,
/// counted past the limit); `[5, 1]` beside a cost of 1 reported 4 then 9 left (memory: 5 then
/// 4); and a cost of 1 in a script that another descriptor rejected took nothing, so that the
/// cost of 10 after it was admitted (memory: over, meeting the 1).
#[tokio::test]
async fn a_counter_named_at_two_costs_is_decided_in_the_request_s_order() {
    let y: &[(&str, &str)] = &[("budget", "y")];
    let z: &[(&str, &str)] = &[("budget", "z")];
    let sequences = [
        vec![
            costing(&[(BUDGET_X, 1), (BUDGET_X, 10), (BUDGET_X, 1)]),
            costing(&[(BUDGET_X, 0)]),
        ],
        vec![
            costing(&[(BUDGET_X, 1), (y, 5), (y, 1)]),
            costing(&[(y, 0)]),
        ],
        vec![
            costing(&[(SMALL, 1)]),
            costing(&[(z, 1), (SMALL, 1), (z, 10)]),
            costing(&[(z, 0)]),
        ],
    ];
    // The codes; and what is left, on an admitted request (a descriptor given back answers its
    // count before the request in Redis, after the others' in memory: see `with_redis`).
    let answers = |r: &RateLimitResponse| {
        let admitted = r.overall_code() == OK;
        let statuses: Vec<_> = (r.statuses.iter())
            .map(|s| (s.code(), admitted.then_some(s.limit_remaining)))
            .collect();
        (r.overall_code(), statuses)
    };
    for requests in sequences {
        let server = RedisServer::start();
        let redis = service(&server, BUDGET).await;
        let memory = RlsService::with_clock(
            RlsConfig::from_yaml_str(BUDGET).unwrap(),
            turnstile::ManualClock::new(),
        )
        .unwrap();
        for (step, req) in requests.iter().enumerate() {
            let m = memory.should_rate_limit(req).unwrap();
            let r = redis.decide(req).await.unwrap();
            assert_eq!(answers(&r), answers(&m), "step {step}: {req:?}");
        }
    }
}

/// A shadow counter named twice in an admitted request, the first occurrence over its limit:
/// the second meets the hits the first counted past the limit, as Envoy's service counts them
/// in order, in memory and in Redis alike. Before, memory counted a shadow descriptor's hits
/// over the limit only after every descriptor was decided (`[3, 1]` at 1 of 3: the 1 answered
/// 1 left); and Redis asked the 1 of `[11, 1]` (11 above the limit, charged beside it) at the
/// count before the charge (2 left; memory too, then).
#[tokio::test]
async fn a_shadow_counter_named_twice_meets_the_hits_its_first_occurrence_counted() {
    const SHADOWED: &str = "
domain: d
descriptors:
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: year, requests_per_unit: 3 }
";
    let x: &[(&str, &str)] = &[("shadow", "x")];
    let y: &[(&str, &str)] = &[("shadow", "y")];
    let steps = [
        (costing(&[(x, 1)]), vec![(OK, 2)]),
        (costing(&[(x, 3), (x, 1)]), vec![(OK, 0), (OK, 0)]),
        (costing(&[(y, 11), (y, 1)]), vec![(OK, 0), (OK, 0)]),
        (costing(&[(x, 0), (y, 0)]), vec![(OK, 0), (OK, 0)]),
    ];
    let server = RedisServer::start();
    let redis = service(&server, SHADOWED).await;
    let memory = RlsService::with_clock(
        RlsConfig::from_yaml_str(SHADOWED).unwrap(),
        turnstile::ManualClock::new(),
    )
    .unwrap();
    for (step, (req, expected)) in steps.iter().enumerate() {
        let m = memory.should_rate_limit(req).unwrap();
        assert_eq!(summary(&m), (OK, expected.clone()), "memory, step {step}");
        let r = redis.decide(req).await.unwrap();
        assert_eq!(summary(&r), (OK, expected.clone()), "Redis, step {step}");
    }
}

/// More hits than `u32::MAX` against a limit of `u32::MAX` are more than the limit: over, in
/// memory as in Redis (which compares the 64-bit hits with the limit), not taken as
/// `u32::MAX` hits that fit.
#[tokio::test]
async fn more_hits_than_u32_max_are_over_a_limit_of_u32_max() {
    const HUGE: &str = "
domain: d
descriptors:
  - key: huge
    rate_limit: { unit: year, requests_per_unit: 4294967295 }
";
    let huge: &[(&str, &str)] = &[("huge", "x")];
    let past = u64::from(u32::MAX) + 1;
    in_memory_and_in_redis(
        HUGE,
        &[costing(&[(huge, past)]), costing(&[(huge, u64::MAX)])],
    )
    .await;
}

/// Sequences of requests whose every answer (overall and per descriptor) is the same in
/// memory and in Redis: several descriptors over at once (each counting its hits), a counter
/// named twice at one cost and at two, shadow descriptors beside enforced ones, a limit of 0
/// beside a limit the request fits, rejections repeated (the deny cache answering them in
/// Redis), and an override over by its cost.
#[tokio::test]
async fn memory_and_redis_answer_alike() {
    const CONFIG: &str = "
domain: d
descriptors:
  - key: small
    rate_limit: { unit: year, requests_per_unit: 1 }
  - key: budget
    rate_limit: { unit: year, requests_per_unit: 10 }
  - key: zero
    rate_limit: { unit: year, requests_per_unit: 0 }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: year, requests_per_unit: 2 }
";
    let small: &[(&str, &str)] = &[("small", "x")];
    let budget: &[(&str, &str)] = &[("budget", "x")];
    let zero: &[(&str, &str)] = &[("zero", "x")];
    let shadow: &[(&str, &str)] = &[("shadow", "x")];
    let sequences: Vec<Vec<RateLimitRequest>> = vec![
        // Two over at once, both counting: the budget's check is over after.
        vec![
            costing(&[(small, 1), (budget, 5)]),
            costing(&[(small, 1), (budget, 8)]),
            costing(&[(budget, 0)]),
            costing(&[(budget, 1)]),
        ],
        // One counter twice: at one cost, then at two costs, the second over.
        vec![
            costing(&[(budget, 2), (budget, 2)]),
            costing(&[(budget, 2), (budget, 5)]),
            costing(&[(budget, 0)]),
            costing(&[(budget, 1), (budget, 3)]),
            costing(&[(budget, 0)]),
        ],
        // Shadow beside enforced: never over itself, the request over only by the enforced.
        vec![
            costing(&[(shadow, 1), (budget, 4)]),
            costing(&[(shadow, 3), (budget, 4)]),
            costing(&[(shadow, 0), (budget, 4)]),
            costing(&[(shadow, 1), (budget, 0)]),
        ],
        // A limit of 0 beside one the request fits, which is given back.
        vec![
            costing(&[(zero, 0), (budget, 3)]),
            costing(&[(zero, 1), (budget, 3)]),
            costing(&[(budget, 7)]),
            costing(&[(budget, 0)]),
        ],
        // A rejection repeated.
        vec![
            costing(&[(small, 1)]),
            costing(&[(small, 1), (budget, 1)]),
            costing(&[(small, 1), (budget, 1)]),
            costing(&[(small, 1), (budget, 1)]),
            costing(&[(budget, 10)]),
        ],
    ];
    // An override (a limiter of its own) over by its cost, beside the configured limit.
    let overridden = |hits: u64| {
        let mut r = costing(&[(budget, hits), (budget, 1)]);
        r.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 4,
            unit: Unit::Year as i32,
        });
        r
    };
    let sequences = sequences.into_iter().chain([vec![
        overridden(3),
        overridden(2),
        overridden(0),
        overridden(1),
    ]]);
    for requests in sequences {
        in_memory_and_in_redis(CONFIG, &requests).await;
    }
}

/// On a Cluster, descriptors in different slots: a cost past what is left counts when
/// another descriptor (in another slot) is over first, and two over at once both count, as
/// in memory.
#[tokio::test]
async fn cluster_counts_over_limit_hits_as_memory_does() {
    let cluster = RedisCluster::start(3);
    let rls = cluster_service(&cluster, BUDGET, FailurePolicy::FailClosed).await;
    // Subjects spread over slots (and nodes): each descriptor its own.
    let a: &[(&str, &str)] = &[("budget", "a")];
    let b: &[(&str, &str)] = &[("budget", "b")];
    let c: &[(&str, &str)] = &[("small", "c")];
    in_memory_and_in(
        &rls,
        BUDGET,
        &[
            costing(&[(a, 5), (b, 5)]),
            costing(&[(c, 2), (a, 8), (b, 1)]),
            costing(&[(a, 0)]),
            costing(&[(b, 4)]),
            costing(&[(a, 7), (b, 7)]),
            costing(&[(b, 0)]),
        ],
    )
    .await;
}

/// Redis down under `Fallback`: a request rejected before its scripts (here by a limit of 0)
/// sends them as `CountedOnly`, which takes nothing from the descriptors within their limits.
/// Their fallbacks were charged all the same, as for an admission, and nothing gave it back:
/// two such requests spent a limit of 2, and the next request within it was over.
#[tokio::test]
async fn redis_down_a_request_rejected_early_spends_no_fallback() {
    const BLOCK_CONFIG: &str = "
domain: d
descriptors:
  - key: zero
    rate_limit: { unit: year, requests_per_unit: 0 }
  - key: two
    rate_limit: { unit: year, requests_per_unit: 2 }
";
    const ZERO: &[(&str, &str)] = &[("zero", "x")];
    const TWO: &[(&str, &str)] = &[("two", "x")];
    let mut server = RedisServer::start();
    let connection = ConnectionManager::new(Client::open(server.url()).unwrap())
        .await
        .unwrap();
    let rls = RlsService::with_redis(
        RlsConfig::from_yaml_str(BLOCK_CONFIG).unwrap(),
        connection,
        "rls",
        FailurePolicy::Fallback { share: 1.0 },
    )
    .unwrap();
    server.kill();
    for _ in 0..3 {
        let r = rls.decide(&request(&[ZERO, TWO])).await.unwrap();
        assert_eq!(r.overall_code(), OVER);
    }
    let r = rls.decide(&request(&[TWO])).await.unwrap();
    assert_eq!(summary(&r), (OK, vec![(OK, 1)]));
}

/// Seeded random requests (1 to 4 descriptors each: limits of 1, 10 and 0, a shadow limit,
/// an unlimited one, none, a nested pair whose default limit `replaces` the valued one, a
/// `share_threshold` wildcard; costs of 0, 1 to 12, 4 and `u64::MAX`; request-level
/// `hits_addend`; overrides), in memory and in Redis: the same overall code and the same
/// status codes, but for the descriptors Redis leaves unasked (`OK` with no window, as
/// `with_redis` says); on an admitted request, the same `limit_remaining` too. (On a rejected
/// one, Redis answers a descriptor given back with the count before the request, memory with
/// the count after it.)
#[tokio::test]
async fn random_requests_decide_alike_in_memory_and_in_redis() {
    let server = RedisServer::start();
    random_requests_alike(&service(&server, RANDOM_CONFIG).await).await;
}

/// As [`random_requests_decide_alike_in_memory_and_in_redis`], on a Cluster of three: the
/// descriptors of a request in different slots, decided by a script per slot.
#[tokio::test]
async fn random_requests_decide_alike_in_memory_and_in_a_cluster() {
    let cluster = RedisCluster::start(3);
    let rls = cluster_service(&cluster, RANDOM_CONFIG, FailurePolicy::FailClosed).await;
    random_requests_alike(&rls).await;
}

const RANDOM_CONFIG: &str = "
domain: d
descriptors:
  - key: small
    rate_limit: { unit: year, requests_per_unit: 1 }
  - key: budget
    rate_limit: { unit: year, requests_per_unit: 10 }
  - key: zero
    rate_limit: { unit: year, requests_per_unit: 0 }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: year, requests_per_unit: 3 }
  - key: free
    rate_limit: { unlimited: true }
  - key: n
    descriptors:
      - key: m
        value: a
        rate_limit: { unit: year, requests_per_unit: 2, name: na }
      - key: m
        rate_limit: { unit: year, requests_per_unit: 5, replaces: [ { name: na } ] }
  - key: w
    value: p*
    share_threshold: true
    rate_limit: { unit: year, requests_per_unit: 4 }
";

/// The requests of [`random_requests_decide_alike_in_memory_and_in_redis`], decided by `redis`
/// (a service of [`RANDOM_CONFIG`]) and in memory.
async fn random_requests_alike(redis: &RlsService) {
    let memory = RlsService::with_clock(
        RlsConfig::from_yaml_str(RANDOM_CONFIG).unwrap(),
        turnstile::ManualClock::new(),
    )
    .unwrap();
    // Redis loads each script at its first use, a round trip more: made before the requests
    // compared, on counters of their own, so that a loaded machine does not take those past
    // the 50 ms deadline (the failure policy would answer them).
    let warm: &[(&str, &str)] = &[("small", "warm")];
    let warm_budget: &[(&str, &str)] = &[("budget", "warm")];
    let warm_shadow: &[(&str, &str)] = &[("shadow", "warm")];
    for hits in [0, 1, 2] {
        let mut req = request(&[warm, warm_budget, warm_budget, warm_shadow]);
        for d in &mut req.descriptors[..2] {
            // 0: checks; 2: more than `small`'s limit (a charge of its own).
            d.hits_addend = Some(UInt64Value { value: hits });
        }
        redis.decide(&req).await.unwrap();
    }
    // xorshift64: the same requests every run.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut below = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let keys = [
        "small", "budget", "zero", "shadow", "free", "none", "n", "w",
    ];
    for sequence in 0..200 {
        // Each sequence on counters of its own.
        let value = format!("s{sequence}");
        for step in 0..6 {
            let mut req = request(&[]);
            req.hits_addend = below(3) as u32;
            for _ in 0..=below(4) {
                let mut d = match keys[below(keys.len() as u64) as usize] {
                    "n" => descriptor(&[("n", &value), ("m", ["a", "b"][below(2) as usize])]),
                    "w" => descriptor(&[("w", &format!("p{value}{}", below(2)))]),
                    key => descriptor(&[(key, &value)]),
                };
                d.hits_addend = match below(6) {
                    0 => Some(0),
                    1 => Some(1 + below(12)),
                    2 => Some([4, u64::MAX][usize::from(below(4) == 0)]),
                    _ => None,
                }
                .map(|value| UInt64Value { value });
                if below(10) == 0 {
                    d.limit = Some(RateLimitOverride {
                        requests_per_unit: below(4) as u32,
                        unit: Unit::Year as i32,
                    });
                }
                req.descriptors.push(d);
            }
            let m = memory.should_rate_limit(&req).unwrap();
            let r = redis.decide(&req).await.unwrap();
            let at = format!("sequence {sequence}, step {step}: {req:?}\n{m:?}\n{r:?}");
            assert_eq!(m.overall_code(), r.overall_code(), "{at}");
            let admitted = r.overall_code() == OK;
            for (ms, rs) in m.statuses.iter().zip(&r.statuses) {
                let unasked = rs.current_limit.is_some() && rs.duration_until_reset.is_none();
                if !unasked {
                    assert_eq!(ms.code(), rs.code(), "{at}");
                    if admitted {
                        assert_eq!(ms.limit_remaining, rs.limit_remaining, "{at}");
                    }
                }
            }
        }
    }
}
