//! The Envoy service's per-limit counters (features `envoy` and `metrics`), read from a local
//! recorder: counted by hits as envoyproxy/ratelimit counts its stats, labelled by domain and
//! limit. Time is a `ManualClock` that does not move; in Redis, windows are a year long.

#[path = "common/envoy.rs"]
mod envoy_common;
#[path = "common/tally.rs"]
mod tally;

use envoy_common::descriptor;
use std::collections::HashMap;
use tally::Tally;
use turnstile::ManualClock;
use turnstile::envoy::proto::{Code, RateLimitOverride, RateLimitRequest, UInt64Value, Unit};
use turnstile::envoy::{RlsConfig, RlsService};

const CONFIG: &str = "
domain: d
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: shadow
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: user
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: tiny
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: file
    value: report*
    share_threshold: true
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 5 }
";

fn service() -> RlsService<ManualClock> {
    RlsService::with_clock(
        RlsConfig::from_yaml_str(CONFIG).unwrap(),
        ManualClock::new(),
    )
    .unwrap()
}

fn request(descriptors: &[(&str, &str)], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors: descriptors
            .iter()
            .map(|&entry| descriptor(&[entry]))
            .collect(),
        hits_addend: hits,
    }
}

/// Runs `f` with a fresh recorder and returns what it counted, by `name{domain,limit}`.
fn counted(f: impl FnOnce()) -> HashMap<String, u64> {
    let tally = Tally::default();
    let counts = tally.0.clone();
    metrics::with_local_recorder(&tally, f);

    counts.lock().unwrap().clone()
}

/// `limit`'s counts: `[total_hits, over_limit, near_limit, within_limit, shadow_mode]`.
fn of(counts: &HashMap<String, u64>, limit: &str) -> [u64; 5] {
    [
        "total_hits",
        "over_limit",
        "near_limit",
        "within_limit",
        "shadow_mode",
    ]
    .map(|name| {
        counts
            .get(&format!("turnstile_envoy_{name}{{d,{limit}}}"))
            .copied()
            .unwrap_or(0)
    })
}

#[test]
fn admitted_near_and_over_limit_count_by_hits() {
    let rls = service();
    let counts = counted(|| {
        for i in 1..=11 {
            let code = rls.should_rate_limit(&request(&[("k", "x")], 0)).unwrap();
            let expected = if i <= 10 { Code::Ok } else { Code::OverLimit };
            assert_eq!(code.overall_code(), expected, "hit {i}");
        }
    });
    // The 9th and 10th hits pass 80% of 10; the 11th is over.
    assert_eq!(of(&counts, "d.k"), [11, 1, 2, 10, 0]);
}

#[test]
fn hits_addend_splits_a_request_across_the_thresholds() {
    let rls = service();
    let counts = counted(|| {
        let ask = |hits| {
            rls.should_rate_limit(&request(&[("k", "x")], hits))
                .unwrap()
        };
        assert_eq!(ask(7).overall_code(), Code::Ok);
        // 7 → 9: one hit past the near threshold of 8.
        assert_eq!(ask(2).overall_code(), Code::Ok);
        // 9 → 12: the 10th is near, two are over.
        assert_eq!(ask(3).overall_code(), Code::OverLimit);
    });
    assert_eq!(of(&counts, "d.k"), [12, 2, 2, 9, 0]);
    // A descriptor's own hits_addend, as well.
    let counts = counted(|| {
        let mut r = request(&[("k", "y")], 0);
        r.descriptors[0].hits_addend = Some(UInt64Value { value: 4 });
        rls.should_rate_limit(&r).unwrap();
    });
    assert_eq!(of(&counts, "d.k"), [4, 0, 0, 4, 0]);
}

#[test]
fn shadow_mode_counts_over_limit_and_shadow_mode() {
    let rls = service();
    let counts = counted(|| {
        for _ in 0..3 {
            let r = rls
                .should_rate_limit(&request(&[("shadow", "x")], 0))
                .unwrap();
            assert_eq!(r.overall_code(), Code::Ok);
        }
    });
    // Limit 2: near from the 2nd hit (floor(1.6) = 1); the 3rd over, in shadow.
    assert_eq!(of(&counts, "d.shadow"), [3, 1, 1, 2, 1]);
}

/// As envoyproxy/ratelimit counts `shadow_mode`: the hits past the limit, as `over_limit`
/// counts them, not every hit of a request that crosses it.
#[test]
fn a_shadow_request_crossing_its_limit_counts_only_the_hits_past_it_in_shadow_mode() {
    let rls = service();
    let counts = counted(|| {
        assert_eq!(
            rls.should_rate_limit(&request(&[("shadow", "x")], 1))
                .unwrap()
                .overall_code(),
            Code::Ok
        );
        // 1 → 4 on a limit of 2: the 2nd hit near, the 3rd and 4th over.
        assert_eq!(
            rls.should_rate_limit(&request(&[("shadow", "x")], 3))
                .unwrap()
                .overall_code(),
            Code::Ok
        );
    });
    assert_eq!(of(&counts, "d.shadow"), [4, 2, 1, 1, 2]);
}

#[test]
fn detailed_metric_labels_by_the_requests_entries() {
    let rls = service();
    let counts = counted(|| {
        rls.should_rate_limit(&request(&[("user", "alice")], 2))
            .unwrap();
        rls.should_rate_limit(&request(&[("user", "bob")], 0))
            .unwrap();
    });
    assert_eq!(of(&counts, "d.user_alice"), [2, 0, 0, 2, 0]);
    assert_eq!(of(&counts, "d.user_bob"), [1, 0, 0, 1, 0]);
    assert_eq!(of(&counts, "d.user"), [0; 5]);
}

/// envoyproxy/ratelimit names a detailed stat by each entry as `key_value`, the `_` kept when
/// the value is empty (`d.user_`), unless a `share_threshold` wildcard matched one of them.
#[test]
fn detailed_metric_keeps_the_underscore_of_an_empty_value_as_envoys_service_does() {
    let rls = service();
    let counts = counted(|| {
        rls.should_rate_limit(&request(&[("user", "")], 0)).unwrap();
    });
    assert_eq!(of(&counts, "d.user_"), [1, 0, 0, 1, 0]);
    assert_eq!(of(&counts, "d.user"), [0; 5]);
}

/// With `share_threshold`, the values a wildcard matches share one counter, and one label.
#[test]
fn detailed_metric_with_share_threshold_labels_by_the_wildcard() {
    let rls = service();
    let counts = counted(|| {
        rls.should_rate_limit(&request(&[("file", "report-a")], 0))
            .unwrap();
        rls.should_rate_limit(&request(&[("file", "report-b")], 0))
            .unwrap();
    });
    assert_eq!(of(&counts, "d.file_report*"), [2, 0, 0, 2, 0]);
    assert_eq!(of(&counts, "d.file_report-a"), [0; 5]);
}

/// All or nothing: a descriptor within its limit on a request another rejects gets its hits
/// back, and is counted as it decided (a hit within its limit), as envoyproxy/ratelimit counts
/// it.
#[test]
fn a_request_rejected_by_another_descriptor_counts_within_this_one() {
    let rls = service();
    let counts = counted(|| {
        let both = request(&[("k", "x"), ("tiny", "x")], 0);
        assert_eq!(
            rls.should_rate_limit(&both).unwrap().overall_code(),
            Code::Ok
        );
        let r = rls.should_rate_limit(&both).unwrap();
        assert_eq!(r.overall_code(), Code::OverLimit);
        // Given back: 9 left, not 8.
        assert_eq!(r.statuses[0].limit_remaining, 9);
    });
    assert_eq!(of(&counts, "d.k"), [2, 0, 0, 2, 0]);
    // Limit 1: near from the first hit (floor(0.8) = 0).
    assert_eq!(of(&counts, "d.tiny"), [2, 1, 1, 1, 0]);
}

#[test]
fn an_override_counts_under_its_own_label() {
    let rls = service();
    let counts = counted(|| {
        let mut r = request(&[("k", "x")], 0);
        r.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: Unit::Minute as i32,
        });
        assert_eq!(rls.should_rate_limit(&r).unwrap().overall_code(), Code::Ok);
        assert_eq!(
            rls.should_rate_limit(&r).unwrap().overall_code(),
            Code::OverLimit
        );
    });
    assert_eq!(of(&counts, "override:1/minute"), [2, 1, 1, 1, 0]);
    assert_eq!(of(&counts, "d.k"), [0; 5]);
}

/// Global shadow mode: the per-limit counters count as without it (the rejected hit over, the
/// admitted one given back and counted within), and `turnstile_envoy_global_shadow_mode`
/// counts, by domain, each request whose answer it turned into `OK`.
#[test]
fn global_shadow_mode_counts_the_requests_it_let_through_by_domain() {
    let rls = service().with_global_shadow_mode(true);
    let counts = counted(|| {
        let both = request(&[("k", "x"), ("tiny", "x")], 0);
        for _ in 0..3 {
            let r = rls.should_rate_limit(&both).unwrap();
            assert_eq!(r.overall_code(), Code::Ok);
        }
    });
    assert_eq!(of(&counts, "d.k"), [3, 0, 0, 3, 0]);
    assert_eq!(of(&counts, "d.tiny"), [3, 2, 1, 1, 0]);
    assert_eq!(
        counts.get("turnstile_envoy_global_shadow_mode{d}"),
        Some(&2)
    );
    // A request admitted anyway is not counted; nor is one with the mode off.
    let counts = counted(|| {
        rls.should_rate_limit(&request(&[("k", "y")], 0)).unwrap();
        rls.set_global_shadow_mode(false);
        let r = rls
            .should_rate_limit(&request(&[("tiny", "x")], 0))
            .unwrap();
        assert_eq!(r.overall_code(), Code::OverLimit);
    });
    assert_eq!(counts.get("turnstile_envoy_global_shadow_mode{d}"), None);
}

/// The near-limit ratio (envoyproxy/ratelimit's `NEAR_LIMIT_RATIO`) moves the near threshold;
/// 0 and 1 are its ends.
#[test]
fn the_near_limit_ratio_sets_where_near_limit_starts() {
    let eleven = |rls: &RlsService<ManualClock>| {
        counted(|| {
            for _ in 0..11 {
                rls.should_rate_limit(&request(&[("k", "x")], 0)).unwrap();
            }
        })
    };
    let rls = service().with_near_limit_ratio(0.5).unwrap();
    assert_eq!(rls.near_limit_ratio(), 0.5);
    // Limit 10, ratio 0.5: near from the 6th hit (floor(5)), up to the 10th.
    assert_eq!(of(&eleven(&rls), "d.k"), [11, 1, 5, 10, 0]);
    let rls = service().with_near_limit_ratio(0.0).unwrap();
    assert_eq!(of(&eleven(&rls), "d.k"), [11, 1, 10, 10, 0]);
    let rls = service().with_near_limit_ratio(1.0).unwrap();
    assert_eq!(of(&eleven(&rls), "d.k"), [11, 1, 0, 10, 0]);
    // Set at run time: a request passing the limit splits at the new threshold.
    rls.set_near_limit_ratio(0.7).unwrap();
    let counts = counted(|| {
        rls.should_rate_limit(&request(&[("k", "y")], 12)).unwrap();
    });
    // 0 → 12 over a limit of 10: 2 over, the 8th to the 10th near (floor(7) = 7).
    assert_eq!(of(&counts, "d.k"), [12, 2, 3, 0, 0]);
}

#[test]
fn a_near_threshold_rounded_past_the_limit_in_single_precision_counts_no_near_hits() {
    // 16777219 is not a single-precision number: times 1.0 it rounds up to 16777220, past the
    // limit. The near-limit range then is empty, not negative.
    let rls = RlsService::with_clock(
        RlsConfig::from_yaml_str(
            "
domain: d
descriptors:
  - key: big
    rate_limit: { unit: minute, requests_per_unit: 16777219 }
",
        )
        .unwrap(),
        ManualClock::new(),
    )
    .unwrap()
    .with_near_limit_ratio(1.0)
    .unwrap();
    let counts = counted(|| {
        let response = rls
            .should_rate_limit(&request(&[("big", "x")], 16_777_220))
            .unwrap();
        assert_eq!(response.overall_code(), Code::OverLimit);
    });
    assert_eq!(of(&counts, "d.big"), [16_777_220, 1, 0, 0, 0]);
}

#[cfg(feature = "redis")]
#[path = "common/redis_server.rs"]
mod redis_server;

/// The configuration's service counting in `server`, with yearly windows (so that none ends
/// within a test), and the runtime to drive it.
#[cfg(feature = "redis")]
fn in_redis(server: &redis_server::RedisServer) -> (tokio::runtime::Runtime, RlsService) {
    use turnstile::FailurePolicy;
    use turnstile::redis::{Client, aio::ConnectionManager};

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let yaml = CONFIG.replace("unit: minute", "unit: year");
    let rls = runtime.block_on(async {
        let connection = ConnectionManager::new(Client::open(server.url()).unwrap())
            .await
            .unwrap();
        RlsService::with_redis(
            RlsConfig::from_yaml_str(&yaml).unwrap(),
            connection,
            "rls",
            FailurePolicy::FailClosed,
        )
        .unwrap()
    });
    (runtime, rls)
}

/// In Redis: admissions as in memory; a rejection's count before it is not known there, so all
/// its hits count over the limit.
#[cfg(feature = "redis")]
#[test]
fn in_redis_the_same_counters_count() {
    let server = redis_server::RedisServer::start();
    let (runtime, rls) = in_redis(&server);
    let counts = counted(|| {
        runtime.block_on(async {
            let k = |hits| request(&[("k", "x")], hits);
            assert_eq!(rls.decide(&k(9)).await.unwrap().overall_code(), Code::Ok);
            let r = rls.decide(&k(2)).await.unwrap();
            assert_eq!(r.overall_code(), Code::OverLimit);
            for _ in 0..3 {
                rls.decide(&request(&[("shadow", "x")], 0)).await.unwrap();
            }
            rls.decide(&request(&[("user", "carol")], 0)).await.unwrap();
        });
    });
    assert_eq!(of(&counts, "d.k"), [11, 2, 1, 9, 0]);
    assert_eq!(of(&counts, "d.shadow"), [3, 1, 1, 2, 1]);
    assert_eq!(of(&counts, "d.user_carol"), [1, 0, 0, 1, 0]);
    // The near-limit ratio applies in Redis as well: 6 more hits on a fresh counter, limit 10
    // and ratio 0.5: the 6th is near.
    rls.set_near_limit_ratio(0.5).unwrap();
    let counts = counted(|| {
        runtime.block_on(async {
            let r = rls.decide(&request(&[("k", "z")], 6)).await.unwrap();
            assert_eq!(r.overall_code(), Code::Ok);
        });
    });
    assert_eq!(of(&counts, "d.k"), [6, 0, 1, 6, 0]);
}

/// In Redis, one script decides both descriptors: when one rejects, the script charges
/// neither, and the other reports its count untouched. Its hit is counted from that count (as
/// in memory: within, and near when it crosses the threshold), not as if it had been charged.
#[cfg(feature = "redis")]
#[test]
fn in_redis_a_descriptor_another_rejects_counts_from_its_untouched_count() {
    let server = redis_server::RedisServer::start();
    let (runtime, rls) = in_redis(&server);
    runtime.block_on(async {
        // k at 8 of 10 (the near threshold), tiny at its limit.
        let r = rls.decide(&request(&[("k", "x")], 8)).await.unwrap();
        assert_eq!(r.overall_code(), Code::Ok);
        let r = rls.decide(&request(&[("tiny", "x")], 0)).await.unwrap();
        assert_eq!(r.overall_code(), Code::Ok);
    });
    let counts = counted(|| {
        runtime.block_on(async {
            let both = request(&[("k", "x"), ("tiny", "x")], 0);
            let r = rls.decide(&both).await.unwrap();
            assert_eq!(r.overall_code(), Code::OverLimit);
            // Not charged: 2 left, as before the request.
            assert_eq!(r.statuses[0].limit_remaining, 2);
        });
    });
    // The 9th hit on k: past floor(10 × 0.8) = 8, so near its limit, and within it.
    assert_eq!(of(&counts, "d.k"), [1, 0, 1, 1, 0]);
    assert_eq!(of(&counts, "d.tiny"), [1, 1, 0, 0, 0]);
}

/// A descriptor whose hits are given back because another descriptor of the request rejects is
/// counted as it decided, within its limit, in Redis (where its call admitted, then gave back)
/// as in memory (where its admission is refunded), and as Envoy counts it; the rejecting one
/// counts over. Different costs make two calls in Redis, so the give-back path is the one taken.
#[cfg(feature = "redis")]
#[test]
fn a_descriptor_given_back_counts_within_its_limit_in_redis_as_in_memory() {
    let server = redis_server::RedisServer::start();
    let (runtime, remote) = in_redis(&server);
    let local = service();
    let mut both = request(&[("k", "x"), ("tiny", "x")], 0);
    both.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
    for rls in [Err(&local), Ok(&remote)] {
        let decide = |r: &RateLimitRequest| match rls {
            Err(local) => local.should_rate_limit(r).unwrap(),
            Ok(remote) => runtime.block_on(remote.decide(r)).unwrap(),
        };
        // tiny at its limit (1 of 1), admitted: nothing for a deny cache to remember.
        assert_eq!(
            decide(&request(&[("tiny", "x")], 0)).overall_code(),
            Code::Ok
        );
        let counts = counted(|| {
            let r = decide(&both);
            assert_eq!(r.overall_code(), Code::OverLimit);
            // k's 3 hits were given back: 10 left.
            assert_eq!(r.statuses[0].limit_remaining, 10, "{rls:?}");
        });
        assert_eq!(of(&counts, "d.k"), [3, 0, 0, 3, 0], "{rls:?}");
        assert_eq!(of(&counts, "d.tiny"), [1, 1, 0, 0, 0], "{rls:?}");
    }
}
