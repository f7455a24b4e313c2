//! The Envoy rate limit service (feature `envoy`): the wire format of the hand-written
//! messages, envoyproxy/ratelimit's configuration files, and the decisions, asked by a real
//! tonic client of a real tonic server on 127.0.0.1:0. Time is a `ManualClock` the tests
//! advance; nothing sleeps.

#[path = "common/envoy.rs"]
mod envoy_common;

use envoy_common::descriptor;
use proptest::prelude::*;
use prost::Message;
use std::time::Duration;
use tonic::transport::Channel;
use turnstile::ManualClock;
use turnstile::envoy::proto::{
    Code, DescriptorStatus, Entry, ProtoDuration, RateLimit, RateLimitDescriptor,
    RateLimitOverride, RateLimitRequest, RateLimitResponse, UInt64Value, Unit,
};
use turnstile::envoy::{
    ResponseHeaders, RlsConfig, RlsConfigError, RlsService, SHOULD_RATE_LIMIT_PATH,
};

// ---------------------------------------------------------------------------------------------
// Wire format

/// The bytes, derived by hand from the field numbers of rls.proto and ratelimit.proto: each
/// field is its key `(number << 3) | wire type` (0 varint, 2 length-delimited), then its value.
#[test]
fn a_request_encodes_with_envoys_field_numbers() {
    let request = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            limit: Some(RateLimitOverride {
                requests_per_unit: 10,
                unit: Unit::Minute as i32,
            }),
            hits_addend: Some(UInt64Value { value: 5 }),
        }],
        hits_addend: 2,
    };
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0x0a, 0x01, b'd',                         // 1 domain: "d"
        0x12, 0x12,                               // 2 descriptors: 18 bytes
          0x0a, 0x06,                             //   1 entries: 6 bytes
            0x0a, 0x01, b'k', 0x12, 0x01, b'v',   //     1 key "k", 2 value "v"
          0x12, 0x04,                             //   2 limit: 4 bytes
            0x08, 0x0a, 0x10, 0x02,               //     1 requests_per_unit 10, 2 unit MINUTE
          0x1a, 0x02,                             //   3 hits_addend (UInt64Value): 2 bytes
            0x08, 0x05,                           //     1 value 5
        0x18, 0x02,                               // 3 hits_addend: 2
    ];
    assert_eq!(request.encode_to_vec(), expected);
    assert_eq!(RateLimitRequest::decode(expected).unwrap(), request);
}

#[test]
fn a_response_decodes_from_envoys_field_numbers() {
    #[rustfmt::skip]
    let bytes: &[u8] = &[
        0x08, 0x02,                               // 1 overall_code: OVER_LIMIT
        0x12, 0x11,                               // 2 statuses: 17 bytes
          0x08, 0x02,                             //   1 code: OVER_LIMIT
          0x12, 0x07,                             //   2 current_limit: 7 bytes
            0x08, 0x01, 0x10, 0x01,               //     1 requests_per_unit 1, 2 unit SECOND
            0x1a, 0x01, b'n',                     //     3 name "n"
          0x18, 0x03,                             //   3 limit_remaining: 3
          0x22, 0x02, 0x08, 0x01,                 //   4 duration_until_reset: 1 s
        0x22, 0x06,                               // 4 request_headers_to_add: 6 bytes
          0x0a, 0x01, b'h', 0x12, 0x01, b'x',     //   1 key "h", 2 value "x"
        0xa2, 0x06, 0x00,                         // 100: a field unknown here, skipped
    ];
    let response = RateLimitResponse::decode(bytes).unwrap();
    assert_eq!(response.overall_code(), Code::OverLimit);
    assert_eq!(
        response.statuses,
        [DescriptorStatus {
            code: Code::OverLimit as i32,
            current_limit: Some(RateLimit {
                name: "n".into(),
                requests_per_unit: 1,
                unit: Unit::Second as i32,
            }),
            limit_remaining: 3,
            duration_until_reset: Some(ProtoDuration {
                seconds: 1,
                nanos: 0
            }),
        }]
    );
    assert_eq!(response.request_headers_to_add[0].key, "h");
}

// ---------------------------------------------------------------------------------------------
// A real server and client

struct Rls {
    service: RlsService<ManualClock>,
    clock: ManualClock,
    client: tonic::client::Grpc<Channel>,
}

async fn start(yamls: &[&str]) -> Rls {
    let clock = ManualClock::new();
    let config = RlsConfig::from_yaml_strs(yamls.iter().copied()).expect("config");
    let service = RlsService::with_clock(config, clock.clone()).expect("service");
    let client = envoy_common::serve(service.clone()).await;
    Rls {
        service,
        clock,
        client,
    }
}

impl Rls {
    async fn ask(&mut self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        self.client.ready().await.expect("ready");
        let codec = tonic_prost::ProstCodec::default();
        let path = http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT_PATH);
        self.client
            .unary(tonic::Request::new(request), path, codec)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn call(&mut self, domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitResponse {
        self.call_hits(domain, descriptors, 0).await
    }

    async fn call_hits(
        &mut self,
        domain: &str,
        descriptors: &[&[(&str, &str)]],
        hits_addend: u32,
    ) -> RateLimitResponse {
        self.ask(RateLimitRequest {
            domain: domain.into(),
            descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
            hits_addend,
        })
        .await
        .expect("a response")
    }
}

/// One request of one descriptor, decided by `service` directly (no gRPC).
fn decide(
    service: &RlsService<ManualClock>,
    domain: &str,
    entries: &[(&str, &str)],
) -> RateLimitResponse {
    service
        .should_rate_limit(&RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![descriptor(entries)],
            hits_addend: 0,
        })
        .expect("a response")
}

fn codes(response: &RateLimitResponse) -> (Code, Vec<Code>) {
    (
        response.overall_code(),
        response.statuses.iter().map(|s| s.code()).collect(),
    )
}

fn remaining(response: &RateLimitResponse) -> Vec<u32> {
    response
        .statuses
        .iter()
        .map(|s| s.limit_remaining)
        .collect()
}

fn reset(status: &DescriptorStatus) -> Duration {
    Duration::try_from(status.duration_until_reset.expect("duration_until_reset")).unwrap()
}

use Code::{Ok as OK, OverLimit as OVER};

const PER_MINUTE_1: &str = "
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      unit: minute
      requests_per_unit: 1
";

#[tokio::test]
async fn the_second_request_over_a_one_per_minute_limit_is_over_limit_until_the_minute_ends() {
    let mut rls = start(&[PER_MINUTE_1]).await;
    let d: &[(&str, &str)] = &[("category", "account")];
    rls.clock.advance(Duration::from_secs(15));
    let first = rls.call("rl", &[d]).await;
    assert_eq!(codes(&first), (OK, vec![OK]));
    assert_eq!(remaining(&first), [0]);
    assert_eq!(
        first.statuses[0].current_limit,
        Some(RateLimit {
            name: String::new(),
            requests_per_unit: 1,
            unit: Unit::Minute as i32
        })
    );
    assert_eq!(reset(&first.statuses[0]), Duration::from_secs(45));

    rls.clock.advance(Duration::from_secs(5));
    let second = rls.call("rl", &[d]).await;
    assert_eq!(codes(&second), (OVER, vec![OVER]));
    assert_eq!(remaining(&second), [0]);
    assert_eq!(reset(&second.statuses[0]), Duration::from_secs(40));

    // The next minute starts empty.
    rls.clock.advance(Duration::from_secs(40));
    assert_eq!(codes(&rls.call("rl", &[d]).await), (OK, vec![OK]));
}

#[tokio::test]
async fn an_unknown_domain_or_an_unmatched_descriptor_is_ok_with_no_limit() {
    let mut rls = start(&[PER_MINUTE_1]).await;
    for _ in 0..3 {
        let r = rls.call("elsewhere", &[&[("category", "account")]]).await;
        assert_eq!(codes(&r), (OK, vec![OK]));
        assert_eq!(r.statuses[0].current_limit, None);
        let r = rls.call("rl", &[&[("category", "other")]]).await;
        assert_eq!(codes(&r), (OK, vec![OK]));
        assert_eq!(r.statuses[0].current_limit, None);
    }
}

#[tokio::test]
async fn an_empty_domain_or_descriptor_list_is_invalid_argument() {
    let mut rls = start(&[PER_MINUTE_1]).await;
    let err = rls
        .ask(RateLimitRequest {
            domain: String::new(),
            descriptors: vec![descriptor(&[("category", "account")])],
            hits_addend: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = rls
        .ask(RateLimitRequest {
            domain: "rl".into(),
            descriptors: vec![],
            hits_addend: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

// The examples of envoyproxy/ratelimit's README (its "Examples" section), loaded as they are.

const EXAMPLE_1: &str = "
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
";

#[tokio::test]
async fn example_1_two_values_of_one_key_each_get_500_per_second() {
    let mut rls = start(&[EXAMPLE_1]).await;
    let users: &[(&str, &str)] = &[("database", "users")];
    let default: &[(&str, &str)] = &[("database", "default")];
    let r = rls.call_hits("mongo_cps", &[users], 500).await;
    assert_eq!((codes(&r), remaining(&r)), ((OK, vec![OK]), vec![0]));
    assert_eq!(codes(&rls.call("mongo_cps", &[users]).await).0, OVER);
    let r = rls.call("mongo_cps", &[default]).await;
    assert_eq!((codes(&r), remaining(&r)), ((OK, vec![OK]), vec![499]));
    rls.clock.advance(Duration::from_secs(1));
    assert_eq!(codes(&rls.call("mongo_cps", &[users]).await).0, OK);
}

const EXAMPLE_2: &str = "
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
";

#[tokio::test]
async fn example_2_nested_descriptors_and_a_value_less_key_counting_each_number_apart() {
    let mut rls = start(&[EXAMPLE_2]).await;
    let marketing_1: &[(&str, &str)] =
        &[("message_type", "marketing"), ("to_number", "2061111111")];
    let number_1: &[(&str, &str)] = &[("to_number", "2061111111")];
    let marketing_2: &[(&str, &str)] =
        &[("message_type", "marketing"), ("to_number", "2062222222")];
    for i in 0..5 {
        let r = rls.call("messaging", &[marketing_1, number_1]).await;
        assert_eq!(codes(&r), (OK, vec![OK, OK]));
        assert_eq!(remaining(&r), [4 - i, 99 - i]);
    }
    // The sixth marketing message to that number is over; another number has its own 5.
    let r = rls.call("messaging", &[marketing_1, number_1]).await;
    assert_eq!(codes(&r), (OVER, vec![OVER, OK]));
    assert_eq!(
        rls.call("messaging", &[marketing_2]).await.statuses[0].limit_remaining,
        4
    );
    // The placeholder level alone has no limit.
    let r = rls
        .call("messaging", &[&[("message_type", "marketing")]])
        .await;
    assert_eq!(r.statuses[0].current_limit, None);
    // Non-marketing messages to the number count only against the 100: the rejected request
    // above took nothing from them (all or nothing).
    let r = rls.call("messaging", &[number_1]).await;
    assert_eq!(remaining(&r), [94]);
    assert_eq!(reset(&r.statuses[0]), Duration::from_secs(86_400));
}

const EXAMPLE_3: &str = "
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
";

#[tokio::test]
async fn example_3_key_and_value_match_before_key_alone_and_zero_blocks() {
    let mut rls = start(&[EXAMPLE_3]).await;
    let r = rls
        .call("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.5")]])
        .await;
    assert_eq!(codes(&r), (OVER, vec![OVER]));
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
    for i in 0..10 {
        let r = rls
            .call("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.1")]])
            .await;
        assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![9 - i]));
    }
    let r = rls
        .call("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.1")]])
        .await;
    assert_eq!(codes(&r).0, OVER);
}

const EXAMPLE_4_FLAT: &str = "
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
";

const EXAMPLE_4_NESTED: &str = "
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
";

#[tokio::test]
async fn example_4_the_request_depth_must_equal_the_configured_depth() {
    let two: &[(&str, &str)] = &[("key", "value"), ("subkey", "subvalue")];
    let mut flat = start(&[EXAMPLE_4_FLAT]).await;
    assert_eq!(
        flat.call("example4", &[two]).await.statuses[0].current_limit,
        None
    );
    let mut nested = start(&[EXAMPLE_4_NESTED]).await;
    let r = nested.call("example4", &[two]).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        300
    );
    assert_eq!(remaining(&r), [299]);
}

const EXAMPLE_5: &str = "
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
";

#[tokio::test]
async fn example_5_unlimited_is_ok_with_u32_max_remaining_and_counts_nothing() {
    let mut rls = start(&[EXAMPLE_5]).await;
    for _ in 0..3 {
        let r = rls
            .call_hits("internal", &[&[("ldap", "x")], &[("azure", "y")]], 40)
            .await;
        assert_eq!(r.statuses[0].code(), OK);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert_eq!(r.statuses[0].current_limit, None);
    }
    // Two of the three 40s fitted in azure's 100; the third was over, and counted past the
    // limit (120 of 100, as in Envoy's service): over for any hit, or a check, until the minute
    // ends.
    for hits in [20, 1] {
        let r = rls.call_hits("internal", &[&[("azure", "y")]], hits).await;
        assert_eq!((codes(&r).0, remaining(&r)), (OVER, vec![0]), "{hits} hits");
    }
    rls.clock.advance(Duration::from_secs(60));
    let r = rls.call_hits("internal", &[&[("azure", "y")]], 20).await;
    assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![80]));
}

const EXAMPLE_6: &str = "
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
";

#[tokio::test]
async fn example_6_shadow_mode_passes_and_reports_zero_remaining() {
    let mut rls = start(&[EXAMPLE_6]).await;
    let a: &[(&str, &str)] = &[("service", "auth-service"), ("user", "user-a")];
    let b: &[(&str, &str)] = &[("service", "auth-service"), ("user", "user-b")];
    for i in 0..10 {
        assert_eq!(remaining(&rls.call("example6", &[a]).await), [9 - i]);
    }
    for _ in 0..5 {
        let r = rls.call("example6", &[a]).await;
        assert_eq!(codes(&r), (OK, vec![OK]));
        assert_eq!(remaining(&r), [0]);
        assert_eq!(reset(&r.statuses[0]), Duration::from_secs(1));
    }
    for _ in 0..20 {
        assert_eq!(codes(&rls.call("example6", &[b]).await).0, OK);
    }
    assert_eq!(codes(&rls.call("example6", &[b]).await).0, OVER);
    // A shadow descriptor never makes a request over the limit, but a real one still does.
    assert_eq!(
        codes(&rls.call("example6", &[a, b]).await),
        (OVER, vec![OK, OVER])
    );
}

const EXAMPLE_7: &str = "
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
";

#[tokio::test]
async fn example_7_a_replacing_limit_drops_the_replaced_one_for_the_request() {
    let mut rls = start(&[EXAMPLE_7]).await;
    let one: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let two: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    for i in 0..10 {
        let r = rls.call("example7", &[one, two]).await;
        assert_eq!(codes(&r), (OK, vec![OK, OK]));
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(remaining(&r)[1], 9 - i);
    }
    assert_eq!(codes(&rls.call("example7", &[one, two]).await).0, OVER);
    // The 5 per second was not touched.
    let r = rls.call("example7", &[one]).await;
    assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![4]));
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "specific_limit"
    );
}

#[tokio::test]
async fn an_unlimited_limit_replaces_the_limits_it_names_as_in_envoy() {
    // envoyproxy/ratelimit gathers `replaces` from every matched limit, unlimited ones too,
    // before it sets the unlimited ones aside.
    let mut rls = start(&["
domain: d
descriptors:
  - key: vip
    rate_limit:
      unlimited: true
      replaces: [{ name: per_ip }]
  - key: ip
    rate_limit: { unit: minute, requests_per_unit: 1, name: per_ip }
"])
    .await;
    let vip: &[(&str, &str)] = &[("vip", "yes")];
    let ip: &[(&str, &str)] = &[("ip", "10.0.0.1")];
    for _ in 0..3 {
        let r = rls.call("d", &[vip, ip]).await;
        assert_eq!(codes(&r), (OK, vec![OK, OK]));
        assert_eq!(remaining(&r)[0], u32::MAX);
        assert_eq!(r.statuses[1].current_limit, None, "per_ip is replaced");
    }
    // Without the unlimited descriptor, per_ip applies (and was not counted above).
    assert_eq!(codes(&rls.call("d", &[ip]).await).0, OK);
    assert_eq!(codes(&rls.call("d", &[ip]).await).0, OVER);
}

const EXAMPLE_8: &str = "
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
";

const EXAMPLE_9: &str = "
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
";

#[tokio::test]
async fn examples_8_and_9_detailed_metric_loads_and_a_trailing_star_matches_a_prefix() {
    let mut rls = start(&[EXAMPLE_8, EXAMPLE_9]).await;
    let r = rls
        .call(
            "example8",
            &[&[("key1", "unspecified")], &[("key1", "value1")]],
        )
        .await;
    assert_eq!(remaining(&r), [9, 19]);
    for value in ["value_1", "value_2", "value"] {
        let r = rls.call("example9", &[&[("key1", value)]]).await;
        assert_eq!(remaining(&r), [19], "{value}: each value counts apart");
    }
    let r = rls.call("example9", &[&[("key1", "other")]]).await;
    assert_eq!(r.statuses[0].current_limit, None);
}

// ---------------------------------------------------------------------------------------------
// hits_addend, overrides, all or nothing

#[tokio::test]
async fn hits_addend_per_request_and_per_descriptor_with_zero_only_checking() {
    let mut rls = start(&["
domain: d
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 10 }
"])
    .await;
    let mut request = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![descriptor(&[("k", "a")]), descriptor(&[("k", "b")])],
        hits_addend: 3,
    };
    request.descriptors[1].hits_addend = Some(UInt64Value { value: 7 });
    let r = rls.ask(request.clone()).await.unwrap();
    assert_eq!(remaining(&r), [7, 3]);
    // An explicit 0 only checks.
    request.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    request.descriptors[1].hits_addend = Some(UInt64Value { value: 0 });
    let r = rls.ask(request.clone()).await.unwrap();
    assert_eq!((codes(&r), remaining(&r)), ((OK, vec![OK, OK]), vec![7, 3]));
    // More than the limit in one request: over, and counted past the limit, as Envoy's
    // service counts it: a check is over from then on (answered as one hit would be).
    request.descriptors[1].hits_addend = Some(UInt64Value { value: 11 });
    let r = rls.ask(request.clone()).await.unwrap();
    assert_eq!(codes(&r), (OVER, vec![OK, OVER]));
    assert_eq!(remaining(&r), [7, 0]);
    request.descriptors[1].hits_addend = Some(UInt64Value { value: 0 });
    let r = rls.ask(request.clone()).await.unwrap();
    assert_eq!(
        (codes(&r), remaining(&r)),
        ((OVER, vec![OK, OVER]), vec![7, 0])
    );
    // More than u32::MAX: over as well, no panic.
    request.descriptors[1].hits_addend = Some(UInt64Value { value: u64::MAX });
    assert_eq!(rls.ask(request).await.unwrap().overall_code(), OVER);
}

/// A request that only checks the descriptor of `entries` (its own `hits_addend` of 0).
fn check_of(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    let mut check = descriptor(entries);
    check.hits_addend = Some(UInt64Value { value: 0 });
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![check],
        hits_addend: 0,
    }
}

/// A cost reported after the fact (a check with `hits_addend: 0` before the work, then the
/// work's cost once known, as for a budget of tokens) counts past the limit when it is more
/// than what is left, as Envoy's service counts it, and the checks after it are over until the
/// window ends. Before, such a report was over and counted nothing: the checks went on
/// answering `OK` with what was left, and the budget was spent several times over.
#[tokio::test]
async fn a_cost_reported_past_what_is_left_counts_and_turns_the_checks_over() {
    let mut rls = start(&["
domain: d
descriptors:
  - key: tokens
    rate_limit: { unit: minute, requests_per_unit: 1000 }
"])
    .await;
    let k: &[(&str, &str)] = &[("tokens", "alice")];
    let check = check_of("d", k);
    let r = rls.call_hits("d", &[k], 900).await;
    assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![100]));
    let r = rls.ask(check.clone()).await.unwrap();
    assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![100]));
    let r = rls.call_hits("d", &[k], 500).await;
    assert_eq!((codes(&r).0, remaining(&r)), (OVER, vec![0]));
    for _ in 0..3 {
        let r = rls.ask(check.clone()).await.unwrap();
        assert_eq!(
            (codes(&r).0, remaining(&r)),
            (OVER, vec![0]),
            "1400 of 1000"
        );
        let r = rls.call_hits("d", &[k], 1).await;
        assert_eq!(codes(&r).0, OVER);
    }
    rls.clock.advance(Duration::from_secs(60));
    let r = rls.ask(check).await.unwrap();
    assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![1000]));
}

/// A check answers as one hit would, counting nothing: over once the count has reached the
/// limit. Envoy's service answers `OK` with 0 left at exactly the limit (and over only past
/// it), so a client that checks before each request and reports it after makes one request
/// more per window there.
#[tokio::test]
async fn a_check_is_over_once_the_count_reaches_the_limit() {
    let mut rls = start(&["
domain: d
descriptors:
  - key: k
    rate_limit: { unit: minute, requests_per_unit: 2 }
"])
    .await;
    let k: &[(&str, &str)] = &[("k", "v")];
    let check = check_of("d", k);
    for left in [2, 1] {
        let r = rls.ask(check.clone()).await.unwrap();
        assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![left]));
        assert_eq!(codes(&rls.call("d", &[k]).await).0, OK);
    }
    let r = rls.ask(check).await.unwrap();
    assert_eq!((codes(&r).0, remaining(&r)), (OVER, vec![0]));
}

#[tokio::test]
async fn a_request_rejected_by_one_descriptor_charges_no_other() {
    let mut rls = start(&[SMALL_AND_BIG]).await;
    let small: &[(&str, &str)] = &[("small", "x")];
    let big: &[(&str, &str)] = &[("big", "x")];
    assert_eq!(remaining(&rls.call("d", &[small, big]).await), [0, 99]);
    for _ in 0..5 {
        let r = rls.call("d", &[big, small]).await;
        assert_eq!(codes(&r), (OVER, vec![OK, OVER]));
        assert_eq!(
            remaining(&r),
            [99, 0],
            "the big limit was given its hit back"
        );
    }
    assert_eq!(remaining(&rls.call("d", &[big]).await), [98]);
}

const SMALL_AND_BIG: &str = "
domain: d
descriptors:
  - key: small
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: big
    rate_limit: { unit: minute, requests_per_unit: 100 }
";

/// Global shadow mode (envoyproxy/ratelimit's `SHADOW_MODE=true`): the request is decided as
/// without it, all or nothing included (the big limit gets its hit back), and only the overall
/// answer becomes `OK`; the statuses stay as decided, as in Envoy's service.
#[tokio::test]
async fn global_shadow_mode_answers_ok_and_counts_exactly_as_without_it() {
    let mut rls = start(&[SMALL_AND_BIG]).await;
    assert!(!rls.service.global_shadow_mode());
    rls.service.set_global_shadow_mode(true);
    assert!(rls.service.global_shadow_mode());
    let small: &[(&str, &str)] = &[("small", "x")];
    let big: &[(&str, &str)] = &[("big", "x")];
    assert_eq!(remaining(&rls.call("d", &[small, big]).await), [0, 99]);
    for _ in 0..3 {
        let r = rls.call("d", &[big, small]).await;
        assert_eq!(codes(&r), (OK, vec![OK, OVER]));
        assert_eq!(
            remaining(&r),
            [99, 0],
            "the big limit was given its hit back"
        );
    }
    assert_eq!(remaining(&rls.call("d", &[big]).await), [98]);
    // Kept across a reload; off again, the small limit is enforced.
    rls.service
        .reload(RlsConfig::from_yaml_str(SMALL_AND_BIG).unwrap())
        .unwrap();
    assert_eq!(codes(&rls.call("d", &[small]).await), (OK, vec![OVER]));
    rls.service.set_global_shadow_mode(false);
    assert_eq!(codes(&rls.call("d", &[small]).await), (OVER, vec![OVER]));
}

#[test]
fn global_shadow_mode_can_be_set_as_the_service_is_made() {
    let config = RlsConfig::from_yaml_str(SMALL_AND_BIG).unwrap();
    let service = RlsService::with_clock(config, ManualClock::new())
        .unwrap()
        .with_global_shadow_mode(true);
    assert!(service.global_shadow_mode());
    let request = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![descriptor(&[("small", "x")])],
        hits_addend: 2,
    };
    let r = service.should_rate_limit(&request).unwrap();
    assert_eq!(r.overall_code(), OK);
    assert_eq!(r.statuses[0].code(), OVER);
}

/// The near-limit ratio is a share of the limit: 0 to 1 (Envoy's default 0.8); anything else
/// is refused with a typed error, and the ratio set before stays.
#[test]
fn a_near_limit_ratio_outside_zero_to_one_is_refused() {
    let config = RlsConfig::from_yaml_str(SMALL_AND_BIG).unwrap();
    let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
    assert_eq!(service.near_limit_ratio(), 0.8);
    for ok in [0.0, 0.25, 1.0] {
        service.set_near_limit_ratio(ok).unwrap();
        assert_eq!(service.near_limit_ratio(), ok);
    }
    for bad in [-0.1, 1.01, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let err = service.set_near_limit_ratio(bad).unwrap_err();
        assert!(
            matches!(&err, RlsConfigError::InvalidSetting { setting, .. } if setting == "near_limit_ratio"),
            "{err:?}"
        );
        assert!(err.to_string().contains("from 0 to 1"), "{err}");
        assert_eq!(service.near_limit_ratio(), 1.0, "unchanged by {bad}");
    }
    let made = RlsService::with_clock(RlsConfig::default(), ManualClock::new())
        .unwrap()
        .with_near_limit_ratio(2.0);
    assert!(made.is_err());
}

#[tokio::test]
async fn a_limit_override_counts_in_its_own_limiter() {
    let mut rls = start(&[PER_MINUTE_1]).await;
    let mut d = descriptor(&[("category", "account")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: Unit::Hour as i32,
    });
    let request = RateLimitRequest {
        domain: "rl".into(),
        descriptors: vec![d],
        hits_addend: 0,
    };
    for i in 0..3 {
        let r = rls.ask(request.clone()).await.unwrap();
        assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![2 - i]));
        let limit = r.statuses[0].current_limit.clone().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit()), (3, Unit::Hour));
    }
    assert_eq!(rls.ask(request.clone()).await.unwrap().overall_code(), OVER);
    // The configured 1 per minute is untouched.
    assert_eq!(
        codes(&rls.call("rl", &[&[("category", "account")]]).await).0,
        OK
    );
    // An override with an unknown unit is ignored: the configured limit applies.
    let mut odd = request;
    odd.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1000,
        unit: 99,
    });
    let r = rls.ask(odd).await.unwrap();
    assert_eq!(r.overall_code(), OVER);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
}

/// The extremes of every number a request or a configuration can hold: a limit of `u32::MAX`
/// takes a request of `u32::MAX` hits whole and then nothing more; an override of `u32::MAX`
/// a year does the same; a descriptor's own 64-bit `hits_addend` past any limit is over with
/// nothing taken. Typed answers throughout, no overflow.
#[tokio::test]
async fn the_largest_limits_and_hits_decide_without_overflow() {
    let mut rls = start(&["
domain: d
descriptors:
  - key: k
    rate_limit: { unit: second, requests_per_unit: 4294967295 }
"])
    .await;
    let k: &[(&str, &str)] = &[("k", "v")];
    let r = rls.call_hits("d", &[k], u32::MAX).await;
    assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![0]));
    let r = rls.call("d", &[k]).await;
    assert_eq!((codes(&r).0, remaining(&r)), (OVER, vec![0]));
    assert_eq!(reset(&r.statuses[0]), Duration::from_secs(1));

    let mut d = descriptor(&[("k", "w")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: u32::MAX,
        unit: Unit::Year as i32,
    });
    let mut request = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![d],
        hits_addend: u32::MAX - 1,
    };
    let r = rls.ask(request.clone()).await.unwrap();
    assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![1]));
    assert_eq!(reset(&r.statuses[0]), Duration::from_secs(365 * 86_400));
    request.descriptors[0].hits_addend = Some(UInt64Value { value: u64::MAX });
    // Over, and counted past the limit (the count saturates): nothing is left.
    let r = rls.ask(request.clone()).await.unwrap();
    assert_eq!((codes(&r).0, remaining(&r)), (OVER, vec![0]));
    request.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    let r = rls.ask(request).await.unwrap();
    assert_eq!((codes(&r).0, remaining(&r)), (OVER, vec![0]));
}

/// A descriptor with no entries, or with an empty key, matches no limit of a known domain:
/// `OK` with no `current_limit`, as in Envoy's service (whose lookup walks the entries).
#[tokio::test]
async fn a_descriptor_with_no_entries_or_an_empty_key_matches_no_limit() {
    let mut rls = start(&[PER_MINUTE_1]).await;
    for entries in [&[][..], &[("", "")][..], &[("", "account")][..]] {
        let r = rls.call("rl", &[entries]).await;
        assert_eq!(codes(&r), (OK, vec![OK]));
        assert_eq!(r.statuses[0].current_limit, None);
        assert_eq!(r.statuses[0].duration_until_reset, None);
    }
}

/// A reload that lowers a limit below the count of its window keeps the count: the next hit
/// is over at once (as in Envoy's service, whose count is past the new limit) and counted, and
/// raising the limit again leaves the room the count leaves, not a fresh window.
#[tokio::test]
async fn a_reload_lowering_a_limit_below_its_count_rejects_until_the_window_ends() {
    let at = |limit: u32| {
        RlsConfig::from_yaml_str(&format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: minute, requests_per_unit: {limit} }}\n"
        ))
        .unwrap()
    };
    let mut rls = start(&["domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n"]).await;
    let k: &[(&str, &str)] = &[("k", "v")];
    assert_eq!(remaining(&rls.call_hits("d", &[k], 8).await), [2]);
    rls.service.reload(at(3)).unwrap();
    let r = rls.call("d", &[k]).await;
    assert_eq!((codes(&r).0, remaining(&r)), (OVER, vec![0]));
    rls.service.reload(at(10)).unwrap();
    assert_eq!(
        remaining(&rls.call("d", &[k]).await),
        [0],
        "8, 1 over, and this one"
    );
    rls.clock.advance(Duration::from_secs(60));
    assert_eq!(remaining(&rls.call("d", &[k]).await), [9]);
}

// ---------------------------------------------------------------------------------------------
// Reload

#[tokio::test]
async fn reload_keeps_the_counts_of_limits_at_the_same_path_and_unit() {
    let v1 = "
domain: d
descriptors:
  - key: a
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: b
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: u
    rate_limit: { unit: minute, requests_per_unit: 5 }
";
    // `a` is the same limit, moved and renamed; `b` has a new limit in the same unit (its count
    // is kept, as Envoy's counters do not depend on the limit); `u` changed its unit.
    let v2 = "
domain: d
descriptors:
  - key: c
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: u
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: b
    rate_limit: { unit: minute, requests_per_unit: 6 }
  - key: a
    rate_limit: { unit: minute, requests_per_unit: 5, name: renamed }
";
    let mut rls = start(&[v1]).await;
    let a: &[(&str, &str)] = &[("a", "1")];
    let b: &[(&str, &str)] = &[("b", "1")];
    let u: &[(&str, &str)] = &[("u", "1")];
    assert_eq!(
        remaining(&rls.call_hits("d", &[a, b, u], 3).await),
        [2, 2, 2]
    );
    rls.service
        .reload(RlsConfig::from_yaml_str(v2).unwrap())
        .unwrap();
    let r = rls.call("d", &[a, b, u]).await;
    assert_eq!(remaining(&r), [1, 2, 4]);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().name,
        "renamed"
    );
    assert_eq!(
        r.statuses[1]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        6
    );
    // A domain dropped by a reload is unknown afterwards.
    rls.service
        .reload(RlsConfig::from_yaml_str("domain: other\n").unwrap())
        .unwrap();
    assert_eq!(rls.call("d", &[a]).await.statuses[0].current_limit, None);
}

// ---------------------------------------------------------------------------------------------
// Configuration errors

fn invalid(yaml: &str) -> (String, String) {
    match RlsConfig::from_yaml_str(yaml).unwrap_err() {
        RlsConfigError::Invalid { field, message, .. } => (field, message),
        other => panic!("{other}"),
    }
}

#[test]
fn configuration_errors_name_the_field_path() {
    let nested = "
domain: d
descriptors:
  - key: a
  - key: b
    descriptors:
      - key: c
        rate_limit: { unit: fortnight, requests_per_unit: 1 }
";
    let (field, message) = invalid(nested);
    assert_eq!(field, "descriptors[1].descriptors[0].rate_limit.unit");
    assert!(message.contains("fortnight"), "{message}");

    let cases = [
        ("domain: d\nextra: 1\n", "extra"),
        ("descriptors: []\n", "domain"),
        ("domain: ''\n", "domain"),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "descriptors[0].key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    colour: red\n",
            "descriptors[0].colour",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: -1 }\n",
            "descriptors[0].rate_limit.requests_per_unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 4294967296 }\n",
            "descriptors[0].rate_limit.requests_per_unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { requests_per_unit: 1 }\n",
            "descriptors[0].rate_limit.unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: second }\n",
            "descriptors[0].rate_limit.unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1, replaces: [{ nom: x }] }\n",
            "descriptors[0].rate_limit.replaces[0].nom",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "descriptors[1]",
        ),
        ("domain: d\ndescriptors: 3\n", "descriptors"),
    ];
    for (yaml, expected) in cases {
        assert_eq!(invalid(yaml).0, expected, "{yaml}");
    }
    // Duplicate composite keys are named as Envoy names them.
    let (_, message) =
        invalid("domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n");
    assert!(message.contains("d.k_v"), "{message}");
    // Units in any case, requests_per_unit 0, and the same domain twice.
    RlsConfig::from_yaml_str(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: HOUR, requests_per_unit: 0 }\n",
    )
    .unwrap();
    assert!(matches!(
        RlsConfig::from_yaml_strs(["domain: d\n", "domain: d\n"]),
        Err(RlsConfigError::DuplicateDomain { .. })
    ));
    assert!(matches!(
        RlsConfig::from_yaml_str("domain: [unclosed"),
        Err(RlsConfigError::Yaml { .. })
    ));
}

#[test]
fn descriptors_whose_key_value_joins_alike_are_duplicates_as_in_envoy() {
    // Envoy's service keys a level's descriptors by `key_value` (or `key`), so it refuses
    // these pairs as one composite key given twice.
    let cases = [
        "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n  - key: a_b\n    value: c\n",
        "domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n",
        "domain: d\ndescriptors:\n  - key: x\n    descriptors:\n      - key: a\n        value: b*\n      - key: a_b*\n",
    ];
    for yaml in cases {
        let (field, message) = invalid(yaml);
        assert!(field.ends_with("descriptors[1]"), "{yaml}: {field}");
        assert!(
            message.contains("duplicate descriptor composite key"),
            "{message}"
        );
    }
    // The same key and value under two parents is no duplicate.
    RlsConfig::from_yaml_str(
        "domain: d\ndescriptors:\n  - key: a\n    value: b_c\n  - key: x\n    descriptors:\n      - key: a_b\n        value: c\n",
    )
    .unwrap();
}

const EDGE_A: &str = "
domain: edge
descriptors:
  - key: a
    rate_limit: { unit: minute, requests_per_unit: 1 }
";
const EDGE_B: &str = "
domain: edge
descriptors:
  - key: b
    value: x
    rate_limit: { unit: minute, requests_per_unit: 2 }
    descriptors:
      - key: c
        rate_limit: { unit: minute, requests_per_unit: 3 }
";

/// Files in a directory of their own under the system's temporary directory, removed on drop.
struct TempFiles(std::path::PathBuf);

impl TempFiles {
    fn new(name: &str, files: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("turnstile-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
        }
        TempFiles(dir)
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`: off (the default), a domain in two files is
/// refused, naming the second; merged, the files' descriptors make one domain, each limit
/// counting as if the domain had been one file.
#[test]
fn two_files_of_one_domain_are_refused_unless_merged() {
    let files = TempFiles::new(
        "envoy-merge",
        &[
            ("a.yaml", EDGE_A),
            ("b.yaml", EDGE_B),
            ("other.yaml", PER_MINUTE_1),
        ],
    );
    let paths = [
        files.path("a.yaml"),
        files.path("b.yaml"),
        files.path("other.yaml"),
    ];
    assert_eq!(
        RlsConfig::from_files(&paths).unwrap_err(),
        RlsConfigError::DuplicateDomain {
            source: files.path("b.yaml").display().to_string(),
            domain: "edge".into(),
        }
    );
    assert!(matches!(
        RlsConfig::from_yaml_strs([EDGE_A, EDGE_B]),
        Err(RlsConfigError::DuplicateDomain { .. })
    ));

    let config = RlsConfig::from_files_merged(&paths).unwrap();
    let mut domains: Vec<_> = config.domains().collect();
    domains.sort_unstable();
    assert_eq!(domains, ["edge", "rl"]);
    let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
    let ask = |entries: &[(&str, &str)]| {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor(entries)],
            hits_addend: 0,
        };
        let r = service.should_rate_limit(&request).unwrap();
        (
            r.overall_code(),
            r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit),
        )
    };
    assert_eq!(ask(&[("a", "1")]), (OK, Some(1)));
    assert_eq!(ask(&[("a", "1")]), (OVER, Some(1)));
    assert_eq!(ask(&[("b", "x")]), (OK, Some(2)));
    assert_eq!(ask(&[("b", "x"), ("c", "1")]), (OK, Some(3)));

    let merged = RlsConfig::from_yaml_strs_merged([EDGE_A, EDGE_B]).unwrap();
    assert_eq!(merged.domains().collect::<Vec<_>>(), ["edge"]);
}

/// Merging adds descriptors, it does not merge them: the same key and value at the top level of
/// two files (compared as Envoy compares them, `key_value`) is refused, naming both files, as
/// Envoy refuses it within one file; so is the same descriptor twice in one file.
#[test]
fn merging_refuses_a_descriptor_configured_in_two_files_naming_both() {
    let again = "
domain: edge
descriptors:
  - key: z
  - key: a
    rate_limit: { unit: hour, requests_per_unit: 5 }
";
    let files = TempFiles::new(
        "envoy-merge-dup",
        &[("a.yaml", EDGE_A), ("again.yaml", again)],
    );
    let err =
        RlsConfig::from_files_merged([files.path("a.yaml"), files.path("again.yaml")]).unwrap_err();
    let RlsConfigError::Invalid {
        source,
        field,
        message,
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(*source, files.path("again.yaml").display().to_string());
    assert_eq!(field, "descriptors[1]");
    assert!(message.contains("edge.a"), "{message}");
    let first = files.path("a.yaml").display().to_string();
    assert!(message.contains(&first), "{message}");

    // Joined alike: key `a` value `b_c` is key `a_b` value `c`.
    let err = RlsConfig::from_yaml_strs_merged([
        "domain: e\ndescriptors:\n  - key: a\n    value: b_c\n",
        "domain: e\ndescriptors:\n  - key: a_b\n    value: c\n",
    ])
    .unwrap_err();
    assert!(
        matches!(&err, RlsConfigError::Invalid { source, field, message }
            if source == "document 2" && field == "descriptors[0]" && message.contains("document 1")),
        "{err:?}"
    );
    // Twice in one file, merging or not: refused as before, naming that file alone.
    let twice = "domain: e\ndescriptors:\n  - key: a\n  - key: a\n";
    let err = RlsConfig::from_yaml_strs_merged(["domain: e\n", twice]).unwrap_err();
    assert!(
        matches!(&err, RlsConfigError::Invalid { source, field, message }
            if source == "document 2" && field == "descriptors[1]" && !message.contains("document 1")),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_unlimited_limit_with_a_unit_envoy_does_not_know_loads_as_in_envoy() {
    // Envoy's service refuses only a valid unit on an unlimited limit; `unknown` or a word it
    // does not know is no unit to it.
    for unit in ["unknown", "UNKNOWN", "fortnight"] {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unlimited: true, unit: {unit} }}\n"
        );
        let mut rls = start(&[&yaml]).await;
        let r = rls.call("d", &[&[("k", "v")]]).await;
        assert_eq!(codes(&r), (OK, vec![OK]), "{unit}");
        assert_eq!(remaining(&r), [u32::MAX], "{unit}");
    }
}

// ---------------------------------------------------------------------------------------------
// Never a panic

fn yaml_scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("second".to_owned()),
        Just("minute".to_owned()),
        Just("DAY".to_owned()),
        Just("year".to_owned()),
        Just("0".to_owned()),
        Just("1".to_owned()),
        Just("-3".to_owned()),
        Just("4294967296".to_owned()),
        Just("true".to_owned()),
        Just("~".to_owned()),
        Just("a*".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        "[a-c]{0,2}",
    ]
}

fn yaml_field() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("key".to_owned()),
        Just("value".to_owned()),
        Just("unit".to_owned()),
        Just("requests_per_unit".to_owned()),
        Just("unlimited".to_owned()),
        Just("shadow_mode".to_owned()),
        Just("share_threshold".to_owned()),
        Just("name".to_owned()),
        Just("rate_limit".to_owned()),
        Just("descriptors".to_owned()),
        Just("replaces".to_owned()),
        Just("bogus".to_owned()),
    ]
}

/// A YAML tree of the configuration's own fields, nested, with values good and bad.
fn yaml_node(depth: u32) -> BoxedStrategy<String> {
    let leaf = (yaml_field(), yaml_scalar()).prop_map(|(k, v)| format!("{{{k}: {v}}}"));
    if depth == 0 {
        return leaf.boxed();
    }
    prop_oneof![
        leaf,
        proptest::collection::vec((yaml_field(), yaml_node(depth - 1)), 0..4).prop_map(|fields| {
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            format!("{{{}}}", body.join(", "))
        }),
        proptest::collection::vec(yaml_node(depth - 1), 0..3)
            .prop_map(|items| format!("[{}]", items.join(", "))),
    ]
    .boxed()
}

fn descriptor_config(depth: u32) -> BoxedStrategy<String> {
    let rate_limit = (
        prop_oneof![Just("second"), Just("minute"), Just("hour")],
        0u32..4,
        any::<bool>(),
    )
        .prop_map(|(unit, rpu, unlimited)| {
            if unlimited {
                ", rate_limit: { unlimited: true }".to_owned()
            } else {
                format!(", rate_limit: {{ unit: {unit}, requests_per_unit: {rpu}, name: n{rpu}, replaces: [{{ name: n{} }}] }}", (rpu + 1) % 4)
            }
        });
    let value = prop_oneof![
        Just(String::new()),
        "[ab]\\*?".prop_map(|v| format!(", value: '{v}'"))
    ];
    let children = if depth == 0 {
        Just(String::new()).boxed()
    } else {
        proptest::collection::vec(descriptor_config(depth - 1), 0..3)
            .prop_map(|c| format!(", descriptors: [{}]", c.join(", ")))
            .boxed()
    };
    (
        "[kl]",
        value,
        proptest::option::of(rate_limit),
        any::<bool>(),
        children,
    )
        .prop_map(|(key, value, rl, shadow, children)| {
            format!(
                "{{ key: {key}{value}{}{}{children} }}",
                rl.unwrap_or_default(),
                if shadow { ", shadow_mode: true" } else { "" }
            )
        })
        .boxed()
}

fn request() -> impl Strategy<Value = RateLimitRequest> {
    let entry = ("[kl]", "[ab]{0,2}").prop_map(|(key, value)| Entry { key, value });
    let limit = proptest::option::of((0u32..3, -1i32..8).prop_map(|(r, u)| RateLimitOverride {
        requests_per_unit: r,
        unit: u,
    }));
    let hits = proptest::option::of(prop_oneof![0u64..4, Just(u64::MAX)]);
    let d =
        (proptest::collection::vec(entry, 0..4), limit, hits).prop_map(|(entries, limit, hits)| {
            RateLimitDescriptor {
                entries,
                limit,
                hits_addend: hits.map(|value| UInt64Value { value }),
            }
        });
    (
        prop_oneof![
            Just("d".to_owned()),
            Just(String::new()),
            Just("x".to_owned())
        ],
        proptest::collection::vec(d, 0..4),
        0u32..3,
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

proptest! {
    /// Any text, YAML or not: a configuration or an error, never a panic.
    #[test]
    fn any_text_loads_or_fails_without_panicking(text in "\\PC{0,200}") {
        let _ = RlsConfig::from_yaml_str(&text);
    }

    /// Trees of the configuration's own fields, good and bad: no panic either.
    #[test]
    fn any_tree_of_fields_loads_or_fails_without_panicking(node in yaml_node(3)) {
        let _ = RlsConfig::from_yaml_str(&node);
        let _ = RlsConfig::from_yaml_str(&format!("domain: d\ndescriptors: [{node}]"));
    }

    /// Random valid configurations and random requests: always a response with one status per
    /// descriptor (or INVALID_ARGUMENT for an empty domain or list), whatever the time.
    #[test]
    fn every_request_gets_an_answer(
        descriptors in proptest::collection::vec(descriptor_config(2), 0..4),
        requests in proptest::collection::vec(request(), 1..8),
        steps in proptest::collection::vec(0u64..3_000, 1..8),
    ) {
        let yaml = format!("domain: d\ndescriptors: [{}]", descriptors.join(", "));
        let Ok(config) = RlsConfig::from_yaml_str(&yaml) else { return Ok(()) };
        let clock = ManualClock::new();
        let service = RlsService::with_clock(config.clone(), clock.clone()).unwrap();
        for (i, request) in requests.iter().enumerate() {
            clock.advance(Duration::from_millis(steps[i % steps.len()]));
            match service.should_rate_limit(request) {
                Ok(response) => {
                    prop_assert_eq!(response.statuses.len(), request.descriptors.len());
                    let over = response.statuses.iter().any(|s| s.code() == Code::OverLimit);
                    prop_assert_eq!(response.overall_code() == Code::OverLimit, over);
                }
                Err(status) => {
                    prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
                    prop_assert!(request.domain.is_empty() || request.descriptors.is_empty());
                }
            }
            if i == 3 {
                service.reload(config.clone()).unwrap();
            }
        }
    }
}

/// envoyproxy/ratelimit answers `duration_until_reset` in whole seconds (the unit's seconds
/// less the Unix seconds into the window): 1.5 s into a minute is 59 s, not 58.5 s.
#[tokio::test]
async fn duration_until_reset_is_whole_seconds_rounded_up_as_envoys_service_answers() {
    let mut rls = start(&[PER_MINUTE_1]).await;
    let d: &[(&str, &str)] = &[("category", "account")];
    rls.clock.advance(Duration::from_millis(1_500));
    let r = rls.call("rl", &[d]).await;
    assert_eq!(
        (codes(&r).0, reset(&r.statuses[0])),
        (OK, Duration::from_secs(59))
    );
    rls.clock.advance(Duration::from_millis(57_501));
    let r = rls.call("rl", &[d]).await;
    assert_eq!(
        (codes(&r).0, reset(&r.statuses[0])),
        (OVER, Duration::from_secs(1))
    );
}

/// The default clock reads Unix time, about 1.8 × 10^18 ns: the windows still start on the
/// unit's multiples of it (a whole UTC minute here), and the real clock admits and resets.
#[tokio::test]
async fn windows_align_to_whole_units_at_unix_time_scale() {
    let mut rls = start(&[PER_MINUTE_1]).await;
    let d: &[(&str, &str)] = &[("category", "account")];
    // 2026-11-27 16:00:10 UTC.
    rls.clock.set(Duration::from_secs(1_795_795_210));
    let r = rls.call("rl", &[d]).await;
    assert_eq!(
        (codes(&r).0, reset(&r.statuses[0])),
        (OK, Duration::from_secs(50))
    );
    assert_eq!(codes(&rls.call("rl", &[d]).await).0, OVER);
    rls.clock.advance(Duration::from_secs(50));
    assert_eq!(codes(&rls.call("rl", &[d]).await).0, OK);

    let real = RlsService::new(RlsConfig::from_yaml_str(PER_MINUTE_1).unwrap()).unwrap();
    let request = RateLimitRequest {
        domain: "rl".into(),
        descriptors: vec![descriptor(d)],
        hits_addend: 0,
    };
    let r = real.should_rate_limit(&request).unwrap();
    assert_eq!(r.overall_code(), OK);
    let left = reset(&r.statuses[0]);
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    // The window ends on a whole minute, give or take the clocks' drift and tick.
    let end = (unix + left).as_millis() % 60_000;
    assert!(
        !(2_000..=58_000).contains(&end),
        "window ends {end} ms into a minute"
    );
    assert_eq!(
        real.should_rate_limit(&request).unwrap().overall_code(),
        OVER
    );
}

#[tokio::test]
async fn response_headers_report_the_descriptor_closest_to_its_limit_when_enabled() {
    let mut rls = start(&["
domain: d
descriptors:
  - key: small
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: big
    rate_limit: { unit: hour, requests_per_unit: 100 }
"])
    .await;
    let small: &[(&str, &str)] = &[("small", "x")];
    let big: &[(&str, &str)] = &[("big", "x")];
    let headers = |r: &RateLimitResponse| -> Vec<(String, String)> {
        r.response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    };
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    // Off by default, as in Envoy's service.
    assert!(headers(&rls.call("d", &[big]).await).is_empty());

    rls.service
        .set_response_headers(Some(ResponseHeaders::default()));
    rls.clock.advance(Duration::from_millis(20_500));
    let r = rls.call("d", &[big, small]).await;
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Limit", "2"),
            ("RateLimit-Remaining", "1"),
            ("RateLimit-Reset", "40"), // 39.5 s, rounded up
        ])
    );
    rls.call("d", &[small]).await;
    let r = rls.call("d", &[small, big]).await;
    assert_eq!(r.overall_code(), OVER);
    assert_eq!(
        headers(&r),
        pairs(&[
            ("RateLimit-Limit", "2"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "40"),
        ])
    );
    // Other names, and a reload keeps the setting.
    rls.service.set_response_headers(Some(ResponseHeaders {
        limit: "X-RateLimit-Limit".into(),
        remaining: "X-RateLimit-Remaining".into(),
        reset: "X-RateLimit-Reset".into(),
    }));
    rls.service
        .reload(RlsConfig::from_yaml_str("domain: d\ndescriptors:\n  - key: big\n    rate_limit: { unit: hour, requests_per_unit: 100 }\n").unwrap())
        .unwrap();
    let r = rls.call("d", &[big]).await;
    assert_eq!(headers(&r)[1], pairs(&[("X-RateLimit-Remaining", "97")])[0]);
    // Nothing limited: no headers.
    assert!(headers(&rls.call("d", &[&[("other", "x")]]).await).is_empty());
}

#[tokio::test]
async fn share_threshold_makes_the_values_a_wildcard_matches_share_one_counter() {
    let mut rls = start(&["
domain: d
descriptors:
  - key: files
    value: report*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: path
    value: /api/*
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 2 }
"])
    .await;
    let r = rls.call("d", &[&[("files", "report-1")]]).await;
    assert_eq!(remaining(&r), [1]);
    let r = rls.call("d", &[&[("files", "report-2")]]).await;
    assert_eq!(remaining(&r), [0]);
    assert_eq!(
        codes(&rls.call("d", &[&[("files", "report-3")]]).await).0,
        OVER
    );
    // Shared at the wildcard's level, apart by user below it.
    for path in ["/api/a", "/api/b"] {
        let r = rls.call("d", &[&[("path", path), ("user", "alice")]]).await;
        assert_eq!(codes(&r).0, OK);
    }
    let r = rls
        .call("d", &[&[("path", "/api/c"), ("user", "alice")]])
        .await;
    assert_eq!(codes(&r).0, OVER);
    let r = rls
        .call("d", &[&[("path", "/api/c"), ("user", "bob")]])
        .await;
    assert_eq!(remaining(&r), [1]);
}

#[test]
fn share_threshold_needs_a_wildcard_and_a_limit_cannot_replace_itself() {
    let (field, message) =
        invalid("domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n");
    assert_eq!(field, "descriptors[0].share_threshold");
    assert!(message.contains('*'), "{message}");
    let (field, _) = invalid(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1, name: a, replaces: [{ name: a }] }\n",
    );
    assert_eq!(field, "descriptors[0].rate_limit.replaces[0].name");
}

#[tokio::test]
async fn response_headers_of_several_descriptors_over_report_the_last_as_envoy_does() {
    let mut rls = start(&["
domain: d
descriptors:
  - key: one
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: two
    rate_limit: { unit: minute, requests_per_unit: 2 }
"])
    .await;
    rls.service
        .set_response_headers(Some(ResponseHeaders::default()));
    // Three hits: over both limits, whose statuses both say OVER_LIMIT.
    let r = rls
        .call_hits("d", &[&[("one", "x")], &[("two", "x")]], 3)
        .await;
    assert_eq!(codes(&r), (OVER, vec![OVER, OVER]));
    let limit = r
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "RateLimit-Limit")
        .map(|h| h.value.as_str());
    // envoyproxy/ratelimit lets each status over its limit replace the one chosen before.
    assert_eq!(limit, Some("2"), "the last descriptor over its limit");
}

#[tokio::test]
async fn reload_keeps_each_limit_apart_when_two_limits_share_a_composite_path() {
    // Key `a.b`, and key `b` under key `a`, both have the composite path `d.a.b`: two limits,
    // with their own requests per unit, before and after a reload.
    let yaml = "
domain: d
descriptors:
  - key: a.b
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: a
    descriptors:
      - key: b
        rate_limit: { unit: minute, requests_per_unit: 5 }
";
    let mut rls = start(&[yaml]).await;
    let five: &[(&str, &str)] = &[("a", "x"), ("b", "y")];
    assert_eq!(codes(&rls.call_hits("d", &[five], 2).await).0, OK);
    rls.service
        .reload(RlsConfig::from_yaml_str(yaml).unwrap())
        .unwrap();
    let r = rls.call_hits("d", &[five], 2).await;
    assert_eq!(codes(&r).0, OK, "5 per minute still: 2 + 2 hits fit");
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );
    let one: &[(&str, &str)] = &[("a.b", "z")];
    assert_eq!(codes(&rls.call("d", &[one]).await).0, OK);
    assert_eq!(codes(&rls.call("d", &[one]).await).0, OVER);
}

#[tokio::test]
async fn one_counter_named_twice_in_a_request_counts_twice_and_is_refunded_once_each() {
    let mut rls = start(&[PER_MINUTE_1]).await;
    let d: &[(&str, &str)] = &[("category", "account")];
    // Two hits on a limit of 1: the second is over, and counts past the limit, as Envoy's
    // service counts it; all or nothing gives the first hit back.
    assert_eq!(codes(&rls.call("rl", &[d, d]).await).0, OVER);
    let r = rls.call("rl", &[d]).await;
    assert_eq!(
        (codes(&r).0, remaining(&r)),
        (OVER, vec![0]),
        "1 of 1 counted"
    );
    rls.clock.advance(Duration::from_secs(60));
    let r = rls.call("rl", &[d]).await;
    assert_eq!((codes(&r).0, remaining(&r)), (OK, vec![0]));
}

/// A rejected request gives every descriptor's hits back before any status reads its counter:
/// a counter named twice reports, both times, the count as it was before the request (the
/// first occurrence read 8 of 10, the second's 2 hits still held, before they were given back).
#[test]
fn a_counter_named_twice_in_a_rejected_request_reports_its_count_after_all_is_given_back() {
    let service = RlsService::with_clock(
        RlsConfig::from_yaml_str(
            "domain: d\ndescriptors:\n  - key: budget\n    rate_limit: { unit: hour, requests_per_unit: 10 }\n  - key: zero\n    rate_limit: { unit: hour, requests_per_unit: 0 }\n",
        )
        .unwrap(),
        ManualClock::new(),
    )
    .unwrap();
    let budget: &[(&str, &str)] = &[("budget", "x")];
    let zero: &[(&str, &str)] = &[("zero", "x")];
    let mut request = RateLimitRequest {
        domain: "d".into(),
        descriptors: vec![descriptor(budget), descriptor(budget), descriptor(zero)],
        hits_addend: 0,
    };
    request.descriptors[1].hits_addend = Some(UInt64Value { value: 2 });
    let r = service.should_rate_limit(&request).unwrap();
    assert_eq!(codes(&r), (OVER, vec![OK, OK, OVER]));
    assert_eq!(remaining(&r), [10, 10, 0]);
    // Nothing stayed counted.
    let mut check = request.clone();
    check.descriptors.truncate(1);
    assert_eq!(remaining(&service.should_rate_limit(&check).unwrap()), [9]);
}

#[tokio::test]
async fn a_request_that_is_not_a_rate_limit_request_gets_a_grpc_error() {
    use http_body_util::{BodyExt, Full};
    use tower::Service;
    let mut service = RlsService::with_clock(
        RlsConfig::from_yaml_str(PER_MINUTE_1).unwrap(),
        ManualClock::new(),
    )
    .unwrap();
    // A gRPC frame (uncompressed, 3 bytes) holding field 1 as a varint: `domain` is a string.
    static FRAME: [u8; 8] = [0, 0, 0, 0, 3, 0x08, 0x96, 0x01];
    let request = http::Request::builder()
        .method("POST")
        .uri(SHOULD_RATE_LIMIT_PATH)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(&FRAME[..]))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), service.call(request))
        .await
        .expect("answered")
        .unwrap();
    let status = match response.headers().get("grpc-status") {
        Some(s) => s.to_str().unwrap().to_owned(),
        None => {
            let collected = response.into_body().collect().await.unwrap();
            let trailers = collected.trailers().expect("trailers").clone();
            trailers["grpc-status"].to_str().unwrap().to_owned()
        }
    };
    assert_eq!(
        status, "13",
        "a decode error is INTERNAL, as tonic answers it"
    );
}

// ---------------------------------------------------------------------------------------------
// The HTTP JSON endpoint (envoyproxy/ratelimit's `/json` and `/healthcheck`)

/// Asks `service`'s JSON endpoint: `(status, content type, body)`.
fn http_ask(
    service: &RlsService<ManualClock>,
    method: &str,
    path: &str,
    body: impl Into<Vec<u8>>,
) -> (u16, Option<String>, String) {
    use tower::Service as _;
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .body(http_body_util::Full::new(bytes::Bytes::from(body.into())))
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let response = runtime
        .block_on(service.json_service().call(request))
        .unwrap();
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned());
    (
        response.status().as_u16(),
        content_type,
        response.into_body(),
    )
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn json_service() -> (RlsService<ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let config = RlsConfig::from_yaml_strs([PER_MINUTE_1, SMALL_AND_BIG]).unwrap();
    (
        RlsService::with_clock(config, clock.clone()).unwrap(),
        clock,
    )
}

/// A `RateLimitRequest` in the proto3 JSON mapping gets the `RateLimitResponse` in it: 200
/// when the request is under its limits, 429 when over; enums by name, a Duration as
/// seconds with an `s`, fields at their default value (0, empty) left out, as protojson
/// writes them.
#[test]
fn the_json_endpoint_answers_200_then_429_with_the_response_in_proto3_json() {
    let (service, clock) = json_service();
    let body = r#"{"domain": "rl", "descriptors": [{"entries": [{"key": "category", "value": "account"}]}]}"#;
    let (status, content_type, answer) = http_ask(&service, "POST", "/json", body);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(content_type.as_deref(), Some("application/json"));
    assert_eq!(
        json(&answer),
        json(
            r#"{"overallCode": "OK", "statuses": [{"code": "OK",
            "currentLimit": {"requestsPerUnit": 1, "unit": "MINUTE"},
            "durationUntilReset": "60s"}]}"#
        )
    );
    clock.advance(Duration::from_millis(1500));
    let (status, _, answer) = http_ask(&service, "POST", "/json", body);
    assert_eq!(status, 429, "{answer}");
    assert_eq!(
        json(&answer),
        json(
            r#"{"overallCode": "OVER_LIMIT", "statuses": [{"code": "OVER_LIMIT",
            "currentLimit": {"requestsPerUnit": 1, "unit": "MINUTE"},
            "durationUntilReset": "59s"}]}"#
        )
    );
}

/// The request's other fields, under either of the names proto3 JSON allows (`hitsAddend`,
/// `hits_addend`), numbers as numbers or strings, an override's unit by name or number; the
/// remaining count and the response headers come back.
#[test]
fn the_json_endpoint_reads_hits_addend_overrides_and_writes_remaining_and_headers() {
    let (service, _clock) = json_service();
    service.set_response_headers(Some(ResponseHeaders::default()));
    let body = r#"{"domain": "d", "hitsAddend": 3, "descriptors": [
        {"entries": [{"key": "big", "value": "x"}]},
        {"entries": [{"key": "big", "value": "y"}], "hits_addend": "10"},
        {"entries": [{"key": "big", "value": "z"}], "limit": {"requestsPerUnit": "5", "unit": "HOUR"}},
        {"entries": [{"key": "big", "value": "w"}], "limit": {"requests_per_unit": 7, "unit": 2}}
    ]}"#;
    let (status, _, answer) = http_ask(&service, "POST", "/json", body);
    assert_eq!(status, 200, "{answer}");
    let answer = json(&answer);
    let statuses = answer["statuses"].as_array().unwrap();
    let left: Vec<_> = statuses
        .iter()
        .map(|s| s["limitRemaining"].clone())
        .collect();
    assert_eq!(left, [json("97"), json("90"), json("2"), json("4")]);
    assert_eq!(
        statuses[2]["currentLimit"],
        json(r#"{"requestsPerUnit": 5, "unit": "HOUR"}"#)
    );
    assert_eq!(
        statuses[3]["currentLimit"],
        json(r#"{"requestsPerUnit": 7, "unit": "MINUTE"}"#)
    );
    assert_eq!(
        answer["responseHeadersToAdd"],
        json(
            r#"[{"key": "RateLimit-Limit", "value": "5"},
                 {"key": "RateLimit-Remaining", "value": "2"},
                 {"key": "RateLimit-Reset", "value": "3600"}]"#
        )
    );
}

/// Bad requests get 400 with a message naming what is wrong; other paths 404;
/// `/healthcheck` 200.
#[test]
fn the_json_endpoint_refuses_bad_requests_with_400_and_a_message() {
    let (service, _clock) = json_service();
    let cases = [
        ("{", "not JSON"),
        ("[]", "JSON object"),
        (r#"{"domain": 1}"#, "domain"),
        (r#"{"domain": "rl", "color": "red"}"#, "color"),
        (
            r#"{"domain": "rl", "descriptors": [{"entries": [{"key": "k", "value": []}]}]}"#,
            "descriptors[0].entries[0].value",
        ),
        (
            r#"{"domain": "rl", "hitsAddend": -1, "descriptors": []}"#,
            "hitsAddend",
        ),
        (
            r#"{"domain": "rl", "hitsAddend": 4294967296}"#,
            "hitsAddend",
        ),
        (
            r#"{"domain": "rl", "descriptors": [{"limit": {"unit": "FORTNIGHT"}}]}"#,
            "descriptors[0].limit.unit",
        ),
        (
            r#"{"domain": "rl", "descriptors": [{"hitsAddend": "x"}]}"#,
            "descriptors[0].hitsAddend",
        ),
        // Valid JSON, but not a request the service takes (as over gRPC).
        (
            r#"{"domain": "", "descriptors": [{}]}"#,
            "domain must not be empty",
        ),
        (r#"{"domain": "rl"}"#, "descriptor list must not be empty"),
    ];
    for (body, expected) in cases {
        let (status, _, answer) = http_ask(&service, "POST", "/json", body);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(expected), "{body}: {answer}");
    }
    let (status, _, answer) = http_ask(&service, "POST", "/json", vec![0xff, 0xfe]);
    assert_eq!(status, 400, "{answer}");
    let too_big = format!(
        r#"{{"domain": "{}"}}"#,
        "x".repeat(turnstile::envoy::MAX_JSON_REQUEST_BYTES)
    );
    assert_eq!(http_ask(&service, "POST", "/json", too_big).0, 413);
    assert_eq!(http_ask(&service, "POST", "/other", "{}").0, 404);
    let (status, _, answer) = http_ask(&service, "GET", "/healthcheck", "");
    assert_eq!((status, answer.as_str()), (200, "OK"));
}

/// envoyproxy/ratelimit's `/healthcheck` fails (500, no body) once the service drains (on
/// SIGTERM there), so that load balancers stop sending to it; `/json` is still answered.
#[test]
fn the_health_check_answers_500_with_no_body_while_the_service_drains() {
    let (service, _clock) = json_service();
    service.set_draining(true);
    assert!(!service.is_healthy());
    let (status, _, answer) = http_ask(&service, "GET", "/healthcheck", "");
    assert_eq!((status, answer.as_str()), (500, ""));
    let ask = r#"{"domain": "rl", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}"#;
    assert_eq!(http_ask(&service, "POST", "/json", ask).0, 200);
    service.set_draining(false);
    let (status, _, answer) = http_ask(&service, "GET", "/healthcheck", "");
    assert_eq!((status, answer.as_str()), (200, "OK"));
}

/// envoyproxy/ratelimit also serves gRPC's health checking protocol (`grpc.health.v1.Health`)
/// on its gRPC port, for Envoy's gRPC health checks: `ratelimit` is `SERVING` while healthy
/// and `NOT_SERVING` while draining, the server as a whole (`""`) `SERVING`, any other name
/// `NOT_FOUND`.
#[tokio::test]
async fn the_grpc_health_check_answers_for_ratelimit_as_envoys_service_does() {
    use turnstile::envoy::proto::{HealthCheckRequest, HealthCheckResponse, ServingStatus};
    let service = RlsService::with_clock(
        RlsConfig::from_yaml_str(PER_MINUTE_1).unwrap(),
        ManualClock::new(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = tonic::transport::Server::builder()
        .add_service(service.clone())
        .add_service(service.health_service());
    tokio::spawn(router.serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)));
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = tonic::client::Grpc::new(channel);
    let mut check = async |service: &str| {
        client.ready().await.expect("ready");
        let path = http::uri::PathAndQuery::from_static(turnstile::envoy::HEALTH_CHECK_PATH);
        client
            .unary::<_, HealthCheckResponse, _>(
                tonic::Request::new(HealthCheckRequest {
                    service: service.into(),
                }),
                path,
                tonic_prost::ProstCodec::default(),
            )
            .await
            .map(|r| r.into_inner().status())
    };
    assert_eq!(check("ratelimit").await.unwrap(), ServingStatus::Serving);
    assert_eq!(check("").await.unwrap(), ServingStatus::Serving);
    assert_eq!(
        check("other").await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    service.set_draining(true);
    assert_eq!(check("ratelimit").await.unwrap(), ServingStatus::NotServing);
    assert_eq!(check("").await.unwrap(), ServingStatus::Serving);
}

/// envoyproxy/ratelimit's `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: unhealthy while the
/// configuration has no domain, healthy from a load that has one, unhealthy again after a
/// load without any; a draining service stays unhealthy whatever is loaded.
#[test]
fn healthy_with_at_least_one_config_loaded_fails_the_health_check_without_a_domain() {
    let service = RlsService::with_clock(RlsConfig::default(), ManualClock::new()).unwrap();
    assert!(service.is_healthy());
    service.set_healthy_with_at_least_one_config_loaded(true);
    assert_eq!(http_ask(&service, "GET", "/healthcheck", "").0, 500);
    service
        .reload(RlsConfig::from_yaml_str("domain: d\n").unwrap())
        .unwrap();
    assert_eq!(http_ask(&service, "GET", "/healthcheck", "").0, 200);
    service.set_draining(true);
    assert_eq!(http_ask(&service, "GET", "/healthcheck", "").0, 500);
    service.set_draining(false);
    service.reload(RlsConfig::default()).unwrap();
    assert_eq!(http_ask(&service, "GET", "/healthcheck", "").0, 500);
}

#[test]
fn yaml_merge_keys_share_settings_between_descriptors_as_envoys_yaml_reader_does() {
    // envoyproxy/ratelimit's YAML reader applies `<<` merge keys; configurations use them to
    // share a rate limit between descriptors.
    let config = RlsConfig::from_yaml_str(
        "
domain: d
descriptors:
  - key: a
    rate_limit: &one_per_minute { unit: minute, requests_per_unit: 1 }
  - key: b
    rate_limit:
      <<: *one_per_minute
      requests_per_unit: 2
",
    )
    .unwrap();
    let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
    let ask = |key: &str| {
        let response = decide(&service, "d", &[(key, "x")]);
        response.statuses[0].current_limit.clone().unwrap()
    };
    let b = ask("b");
    assert_eq!((b.requests_per_unit, b.unit()), (2, Unit::Minute));
    assert_eq!(ask("a").requests_per_unit, 1);
}

/// envoyproxy/ratelimit looks a request entry up at each level by the joined string: its
/// `key_value`, then each wildcard of the level (in file order) as a prefix of that, then its
/// `key`. Where keys hold `_`, an entry so matches a descriptor of another key, and a key
/// written with a trailing `*` (no value) is a wildcard over keys; the answers are the same
/// here.
#[test]
fn descriptors_match_by_the_joined_key_and_value_as_in_envoys_service() {
    let config = RlsConfig::from_yaml_str(
        "
domain: d
descriptors:
  - key: user_id
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: tenant_acme
    value: gold
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: ip*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: plan
    rate_limit: { unit: minute, requests_per_unit: 4 }
",
    )
    .unwrap();
    let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
    let ask = |key: &str, value: &str| {
        let r = decide(&service, "d", &[(key, value)]);
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, r.statuses[0].limit_remaining))
    };
    // `user` + `id` is `user_id`, the key-only descriptor.
    assert_eq!(ask("user", "id"), Some((1, 0)));
    // `tenant` + `acme_gold` is `tenant_acme_gold`.
    assert_eq!(ask("tenant", "acme_gold"), Some((2, 1)));
    // `ip*` is a prefix of `ipv4_10.0.0.1` and of `ip6_::1`; with `share_threshold` the
    // values of one key share a counter (named by the key and the wildcard, as there).
    assert_eq!(ask("ipv4", "10.0.0.1"), Some((3, 2)));
    assert_eq!(ask("ipv4", "10.0.0.2"), Some((3, 1)));
    assert_eq!(ask("ip6", "::1"), Some((3, 2)));
    assert_eq!(ask("plan", "x"), Some((4, 3)));
    assert_eq!(ask("other", "x"), None);
}

/// envoyproxy/ratelimit checks field names against one list for the whole file, and reads
/// each level's own fields: a known name at another level (`shadow_mode` inside `rate_limit`,
/// `name` on a descriptor) loads there, with no effect. Such files load here, with the same
/// answers; a name Envoy does not know is still refused.
/// envoyproxy/ratelimit's `/json` takes the request whatever the method: a client that sends
/// it with `PUT` (or `GET` with a body) is answered, and one with no body gets 400.
#[test]
fn the_json_endpoint_answers_whatever_the_method_as_envoys_service_does() {
    let (service, _clock) = json_service();
    let body = r#"{"domain": "rl", "descriptors": [{"entries": [{"key": "category", "value": "account"}]}]}"#;
    assert_eq!(http_ask(&service, "PUT", "/json", body).0, 200);
    assert_eq!(http_ask(&service, "GET", "/json", body).0, 429);
    assert_eq!(http_ask(&service, "GET", "/json", "").0, 400);
}

#[test]
fn a_known_field_at_another_level_loads_with_no_effect_as_in_envoys_service() {
    let config = RlsConfig::from_yaml_str(
        "
domain: d
key: ignored
descriptors:
  - key: k
    name: ignored
    unit: hour
    rate_limit:
      unit: minute
      requests_per_unit: 0
      shadow_mode: true
      replaces:
        - name: other
          unit: second
",
    )
    .unwrap();
    let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
    let r = decide(&service, "d", &[("k", "x")]);
    assert_eq!(r.overall_code(), Code::OverLimit);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().unwrap().unit(),
        Unit::Minute
    );
    let err = RlsConfig::from_yaml_str(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, color: red }\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("rate_limit.color"), "{err}");
}

/// envoyproxy/ratelimit's YAML reader (go-yaml v2) applies a `<<` merge key where it stands in
/// the mapping: keys before it are overridden by the merged ones, keys after it override them;
/// of a list of merged mappings the earlier ones win. A file with `<<` after a key answers there
/// with the merged value.
#[test]
fn a_yaml_merge_key_overrides_the_keys_before_it_as_envoys_yaml_reader_does() {
    let config = RlsConfig::from_yaml_str(
        "
domain: d
descriptors:
  - key: a
    rate_limit: &one { unit: minute, requests_per_unit: 1 }
  - key: hour
    rate_limit: &hour { unit: hour, requests_per_unit: 7 }
  - key: before
    rate_limit:
      requests_per_unit: 2
      <<: *one
  - key: after
    rate_limit:
      <<: *one
      requests_per_unit: 3
  - key: list
    rate_limit:
      <<: [*hour, *one]
",
    )
    .unwrap();
    let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
    let ask = |key: &str| {
        let response = decide(&service, "d", &[(key, "x")]);
        let limit = response.statuses[0].current_limit.clone().unwrap();
        (limit.requests_per_unit, limit.unit())
    };
    assert_eq!(ask("before"), (1, Unit::Minute));
    assert_eq!(ask("after"), (3, Unit::Minute));
    assert_eq!(ask("list"), (7, Unit::Hour));
}

/// envoyproxy/ratelimit's YAML reader (YAML 1.1) takes `yes`, `no`, `on` and `off` as
/// booleans: files that write flags so load, and mean the same here.
#[test]
fn yaml_1_1_booleans_set_flags_as_envoys_yaml_reader_reads_them() {
    let config = RlsConfig::from_yaml_str(
        "
domain: d
descriptors:
  - key: shadow
    shadow_mode: yes
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: enforced
    shadow_mode: Off
    detailed_metric: NO
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: free
    rate_limit: { unlimited: on }
",
    )
    .unwrap();
    let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
    let ask = |key: &str| {
        let r = decide(&service, "d", &[(key, "x")]);
        (r.overall_code(), r.statuses[0].limit_remaining)
    };
    assert_eq!(ask("shadow"), (Code::Ok, 0));
    assert_eq!(ask("enforced"), (Code::OverLimit, 0));
    assert_eq!(ask("free"), (Code::Ok, u32::MAX));
    // Other words are still refused.
    let err =
        RlsConfig::from_yaml_str("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n")
            .unwrap_err();
    assert!(
        err.to_string().contains("descriptors[0].shadow_mode"),
        "{err}"
    );
}

/// envoyproxy/ratelimit reads a descriptor's `key` and `value` (and the `domain`) into strings,
/// and go-yaml v2 gives a string field a plain scalar's text as written: `value: 0x1F` is
/// "0x1F", `+1` is "+1", `True` is "True". Read as the number or flag it also spells, a value
/// became another text ("31", "1", "true"), and the requests naming it as written, which Envoy
/// limits, matched nothing and were never limited.
#[test]
fn a_value_spelled_as_a_number_or_flag_matches_its_text_as_written() {
    let spellings = [
        "0x1F", "+1", "-0", "0o17", "0b11", "True", "FALSE", "010", "1_000", "\"1.10\"",
    ];
    let mut yaml = String::from("domain: 0x250\ndescriptors:\n");
    for (i, value) in spellings.iter().enumerate() {
        let key = ["0x10", "k"][i % 2];
        yaml.push_str(&format!(
            "  - key: {key}\n    value: {value}\n    rate_limit: {{ unit: minute, requests_per_unit: 0 }}\n",
        ));
    }
    let config = RlsConfig::from_yaml_str(&yaml).unwrap();
    let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
    for (i, value) in spellings.iter().enumerate() {
        let key = ["0x10", "k"][i % 2];
        let value = value.trim_matches('"');
        let r = decide(&service, "0x250", &[(key, value)]);
        assert_eq!(
            (r.overall_code(), r.statuses[0].current_limit.is_some()),
            (Code::OverLimit, true),
            "{key}={value}: its limit of 0"
        );
    }
    // Through anchors, aliases and `<<` merges too.
    let config = RlsConfig::from_yaml_str(
        "
domain: d
descriptors:
  - &first
    key: k
    value: &v 0x10
    rate_limit: &zero { unit: minute, requests_per_unit: 00 }
  - <<: *first
    value: +5
  - key: alias
    value: *v
    rate_limit: *zero
",
    )
    .unwrap();
    let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
    for (key, value) in [("k", "0x10"), ("k", "+5"), ("alias", "0x10")] {
        let r = decide(&service, "d", &[(key, value)]);
        assert_eq!(r.overall_code(), Code::OverLimit, "{key}={value}");
    }
}

/// envoyproxy/ratelimit checks every leaf of the file before reading it and refuses the file
/// over a float (`1.10`, `1e3`, `.inf`) or an integer past 2^63 − 1, wherever it stands, and
/// over a list of anything but mappings or an unknown field name anywhere, also under a field
/// it ignores where it stands. Such files loaded here: `value: 1.10` as "1.1" (before reading
/// values as written), and what stood under an ignored field unchecked.
#[test]
fn a_file_envoys_service_refuses_for_its_leaves_or_shape_is_refused_naming_the_field() {
    let descriptor = |body: &str| format!("domain: d\ndescriptors:\n  - key: k\n{body}");
    for (body, field, says) in [
        ("    value: 1.10\n", "descriptors[0].value", "quote it"),
        ("    value: 1e3\n", "descriptors[0].value", "quote it"),
        ("    value: .inf\n", "descriptors[0].value", "quote it"),
        (
            "    value: 9223372036854775808\n",
            "descriptors[0].value",
            "quote it",
        ),
        (
            "    rate_limit: { unit: hour, requests_per_unit: 1.0 }\n",
            "descriptors[0].rate_limit.requests_per_unit",
            "quote it",
        ),
        (
            "    rate_limit: { unit: hour, requests_per_unit: 1, descriptors: [{ key: a, color: red }] }\n",
            "descriptors[0].rate_limit.descriptors[0].color",
            "unknown field",
        ),
        (
            "    rate_limit: { unit: hour, requests_per_unit: 1, descriptors: [x] }\n",
            "descriptors[0].rate_limit.descriptors[0]",
            "must be a mapping",
        ),
        (
            "    rate_limit: { unit: hour, requests_per_unit: 1, name: 2.5 }\n",
            "descriptors[0].rate_limit.name",
            "quote it",
        ),
    ] {
        let err = RlsConfig::from_yaml_str(&descriptor(body))
            .expect_err(body)
            .to_string();
        assert!(err.contains(field) && err.contains(says), "{body}: {err}");
    }
    // Quoted, a float's text is a string; the largest integer Envoy's reader takes is one.
    for body in ["    value: \"1.10\"\n", "    value: 9223372036854775807\n"] {
        RlsConfig::from_yaml_str(&descriptor(body)).expect(body);
    }
}

/// go-yaml v2 (YAML 1.1) reads `requests_per_unit` spellings that YAML 1.2 does not: digit
/// separators (`1_000`) and a leading zero for octal (`010` is 8). Such files load there and
/// mean the same here.
#[test]
fn requests_per_unit_spelled_as_envoys_yaml_reader_reads_it() {
    let limit = |spelled: &str| {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: hour, requests_per_unit: {spelled} }}\n"
        );
        let config = RlsConfig::from_yaml_str(&yaml).map_err(|e| e.to_string())?;
        let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
        let r = decide(&service, "d", &[("k", "x")]);
        Ok::<_, String>(
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
        )
    };
    for (spelled, n) in [
        ("1_000", 1000),
        ("010", 8),
        ("0x10", 16),
        ("0o10", 8),
        ("0b101", 5),
        ("+7", 7),
        ("4_294_967_295", u32::MAX),
    ] {
        assert_eq!(limit(spelled), Ok(n), "{spelled}");
    }
    for refused in [
        "1e3",
        "100.0",
        "08",
        "-1",
        "4294967296",
        ".inf",
        "1__0x",
        "ten",
        "[1]",
    ] {
        let err = limit(refused).expect_err(refused);
        assert!(
            err.contains("descriptors[0].rate_limit.requests_per_unit"),
            "{refused}: {err}"
        );
    }
}

/// A field left empty (YAML null) is absent to envoyproxy/ratelimit: `rate_limit:` is no
/// limit, `requests_per_unit:` is 0, `replaces:` replaces nothing. Such files load there.
#[test]
fn empty_rate_limit_fields_load_as_absent_as_in_envoys_service() {
    let config = RlsConfig::from_yaml_str(
        "
domain: d
descriptors:
  - key: nothing
    rate_limit:
  - key: zero
    rate_limit:
      unit: minute
      requests_per_unit:
      replaces:
",
    )
    .unwrap();
    let service = RlsService::with_clock(config, ManualClock::new()).unwrap();
    let ask = |key: &str| {
        let r = decide(&service, "d", &[(key, "x")]);
        (r.overall_code(), r.statuses[0].current_limit.is_some())
    };
    assert_eq!(ask("nothing"), (Code::Ok, false));
    assert_eq!(ask("zero"), (Code::OverLimit, true));
}

#[test]
fn the_json_endpoint_refuses_a_64_bit_number_past_the_range_written_as_a_float() {
    // 2^64 and past it are read as floats, which round u64::MAX up to 2^64: still out of range.
    let (service, _clock) = json_service();
    for n in ["18446744073709551616", "1.8446744073709552e19", "1e20"] {
        let body = format!(
            r#"{{"domain": "rl", "descriptors": [{{"entries": [{{"key": "k", "value": "v"}}], "hitsAddend": {n}}}]}}"#
        );
        let (status, _, answer) = http_ask(&service, "POST", "/json", body);
        assert_eq!(status, 400, "{n}: {answer}");
        assert!(
            answer.contains("descriptors[0].hitsAddend"),
            "{n}: {answer}"
        );
    }
}

/// The request `{"domain": "d", "descriptors": [<descriptor>]}` with one descriptor on the big
/// limit (100 a minute) whose other fields are `fields`.
fn big_request(fields: &str) -> String {
    format!(
        r#"{{"domain": "d", "descriptors": [{{"entries": [{{"key": "big", "value": "x"}}]{fields}}}]}}"#
    )
}

/// A number written as a string must be the number alone, as protojson reads it: no `+`, no
/// whitespace around it inside the quotes. The message names the field.
#[test]
fn the_json_endpoint_refuses_numeric_strings_with_a_sign_or_whitespace() {
    let (service, _clock) = json_service();
    for n in [
        r#""+1""#, r#"" 1""#, r#""1 ""#, r#""\t1""#, r#""1\n""#, r#""+0""#,
    ] {
        for (body, field) in [
            (
                format!(r#"{{"domain": "d", "hitsAddend": {n}, "descriptors": [{{}}]}}"#),
                "hitsAddend",
            ),
            (
                big_request(&format!(r#", "hitsAddend": {n}"#)),
                "descriptors[0].hitsAddend",
            ),
            (
                big_request(&format!(
                    r#", "limit": {{"requestsPerUnit": {n}, "unit": "HOUR"}}"#
                )),
                "descriptors[0].limit.requestsPerUnit",
            ),
        ] {
            let (status, _, answer) = http_ask(&service, "POST", "/json", body.clone());
            assert_eq!(status, 400, "{body}: {answer}");
            assert!(answer.contains(field), "{body}: {answer}");
        }
    }
}

/// A 64-bit or 32-bit number, as a JSON number or a string of one, is read as protojson reads
/// it: exactly, in decimal, a fraction or exponent allowed if the value is whole (`1e2`, `"1.0"`,
/// `"-0"`, u64::MAX written with `.0`), refused when it is not (`1.00000000000000000001`, which
/// a float would round to 1) or when the exponent takes it past 20 digits.
#[test]
fn the_json_endpoint_reads_whole_numbers_exactly_as_protojson_does() {
    let (service, _clock) = json_service();
    // requestsPerUnit (uint32) comes back in the status's current limit.
    for (n, expected) in [
        (r#""1e2""#, 100),
        ("1e2", 100),
        (r#""1.0""#, 1),
        (r#""100e-2""#, 1),
        (r#""0.5e1""#, 5),
        (r#""2.50E+1""#, 25),
        ("4294967295.0", u32::MAX),
        (r#""4294967295""#, u32::MAX),
    ] {
        let body = big_request(&format!(
            r#", "limit": {{"requestsPerUnit": {n}, "unit": "HOUR"}}"#
        ));
        // 429 once an override's counter is spent: "1.0" and "100e-2" share one.
        let (status, _, answer) = http_ask(&service, "POST", "/json", body.clone());
        assert!(matches!(status, 200 | 429), "{body}: {answer}");
        assert_eq!(
            json(&answer)["statuses"][0]["currentLimit"]["requestsPerUnit"],
            expected,
            "{body}: {answer}"
        );
    }
    // hitsAddend (uint64): 0 only checks, so the remaining count stays at the limit.
    for n in [r#""-0""#, "-0", r#""-0.0""#, r#""0e5""#] {
        let body = big_request(&format!(r#", "hitsAddend": {n}"#));
        let (status, _, answer) = http_ask(&service, "POST", "/json", body.clone());
        assert_eq!(status, 200, "{body}: {answer}");
        assert_eq!(
            json(&answer)["statuses"][0]["limitRemaining"],
            100,
            "{body}"
        );
    }
    // u64::MAX is read (and is over the limit), however it is written.
    for n in [
        "18446744073709551615.0",
        r#""18446744073709551615.000""#,
        "1844674407370955161.5e1",
    ] {
        let body = big_request(&format!(r#", "hitsAddend": {n}"#));
        let (status, _, answer) = http_ask(&service, "POST", "/json", body.clone());
        assert_eq!(status, 429, "{body}: {answer}");
    }
    for n in [
        "1.00000000000000000001",
        r#""1.00000000000000000001""#,
        "1e-1",
        r#""1.5""#,
        "0.00000000000000000000000001e26",
        r#""01""#,
        r#""0x10""#,
        r#""1e""#,
        r#""""#,
        r#""1 2""#,
    ] {
        let body = big_request(&format!(r#", "hitsAddend": {n}"#));
        let (status, _, answer) = http_ask(&service, "POST", "/json", body.clone());
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer.contains("descriptors[0].hitsAddend"),
            "{body}: {answer}"
        );
    }
}

/// An enum given by number is read as protojson reads an integer, exactly: `2.0` and `3e0` are
/// MINUTE and HOUR; a number in a string is not an enum's name, and a fraction is refused.
#[test]
fn the_json_endpoint_reads_a_unit_number_written_with_a_fraction_or_exponent() {
    let (service, _clock) = json_service();
    for (n, expected) in [("2.0", "MINUTE"), ("3e0", "HOUR"), ("30e-1", "HOUR")] {
        let body = big_request(&format!(
            r#", "limit": {{"requestsPerUnit": 5, "unit": {n}}}"#
        ));
        let (status, _, answer) = http_ask(&service, "POST", "/json", body.clone());
        assert_eq!(status, 200, "{body}: {answer}");
        assert_eq!(
            json(&answer)["statuses"][0]["currentLimit"]["unit"],
            expected,
            "{body}: {answer}"
        );
    }
    for n in ["2.5", r#""2""#, "2147483648"] {
        let body = big_request(&format!(
            r#", "limit": {{"requestsPerUnit": 5, "unit": {n}}}"#
        ));
        let (status, _, answer) = http_ask(&service, "POST", "/json", body.clone());
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer.contains("descriptors[0].limit.unit"),
            "{body}: {answer}"
        );
    }
}

/// `null` in a list of messages is refused, as protojson refuses it (a `null` field is its
/// default, but a list's element must be the message).
#[test]
fn the_json_endpoint_refuses_null_in_a_list_of_descriptors_or_entries() {
    let (service, _clock) = json_service();
    for (body, field) in [
        (
            r#"{"domain": "d", "descriptors": [null]}"#.to_owned(),
            "descriptors[0]",
        ),
        (
            r#"{"domain": "d", "descriptors": [{"entries": [{"key": "big", "value": "x"}, null]}]}"#.to_owned(),
            "descriptors[0].entries[1]",
        ),
    ] {
        let (status, _, answer) = http_ask(&service, "POST", "/json", body.clone());
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(field), "{body}: {answer}");
    }
}

/// A field given twice in one object is refused, as protojson refuses a duplicate field, rather
/// than the last one counting; `null` included. The message names the field.
#[test]
fn the_json_endpoint_refuses_a_field_given_twice() {
    let (service, _clock) = json_service();
    for (body, field) in [
        (
            r#"{"domain": "d", "domain": "d", "descriptors": [{"entries": [{"key": "big", "value": "x"}]}]}"#.to_owned(),
            "domain",
        ),
        (
            r#"{"domain": "d", "hitsAddend": 1, "hitsAddend": 2, "descriptors": [{}]}"#.to_owned(),
            "hitsAddend",
        ),
        (
            r#"{"domain": "d", "descriptors": [], "descriptors": [{"entries": [{"key": "big", "value": "x"}]}]}"#.to_owned(),
            "descriptors",
        ),
        (
            big_request(r#", "hitsAddend": null, "hitsAddend": 5"#),
            "descriptors[0].hitsAddend",
        ),
        (
            big_request(r#", "entries": []"#),
            "descriptors[0].entries",
        ),
        (
            r#"{"domain": "d", "descriptors": [{"entries": [{"key": "big", "key": "small", "value": "x"}]}]}"#.to_owned(),
            "descriptors[0].entries[0].key",
        ),
        (
            big_request(r#", "limit": {"unit": "HOUR", "requestsPerUnit": 5, "unit": "MINUTE"}"#),
            "descriptors[0].limit.unit",
        ),
        (
            big_request(r#", "limit": null, "limit": {"requestsPerUnit": 5, "unit": "HOUR"}"#),
            "descriptors[0].limit",
        ),
    ] {
        let (status, _, answer) = http_ask(&service, "POST", "/json", body.clone());
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(field), "{body}: {answer}");
        assert!(answer.contains("twice"), "{body}: {answer}");
    }
}

/// A field's JSON name and its proto name in one object are one field given twice: refused, as
/// protojson refuses them, rather than the later one counting.
#[test]
fn the_json_endpoint_refuses_both_names_of_one_field_in_one_object() {
    let (service, _clock) = json_service();
    for (body, field) in [
        (
            r#"{"domain": "d", "hitsAddend": 1, "hits_addend": 2, "descriptors": [{}]}"#.to_owned(),
            "hits_addend",
        ),
        (
            big_request(r#", "hits_addend": 2, "hitsAddend": 3"#),
            "descriptors[0].hitsAddend",
        ),
        (
            big_request(
                r#", "limit": {"requestsPerUnit": 5, "requests_per_unit": 6, "unit": "HOUR"}"#,
            ),
            "descriptors[0].limit.requests_per_unit",
        ),
    ] {
        let (status, _, answer) = http_ask(&service, "POST", "/json", body.clone());
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(field), "{body}: {answer}");
        assert!(answer.contains("twice"), "{body}: {answer}");
    }
}

/// The review's probes of the number reader and the names, pinned: an exponent past `i32` or
/// `i64`, one far below zero, a whole number written with most of a megabyte of digits (its
/// value found by the exponent, or refused as too large, without building the number), a name
/// spelled with escapes (`"domai\u006e"` is `domain`, so given twice), and a body nested
/// half a million lists deep: a 200 or a 400 naming the field, never a panic.
#[test]
fn the_json_endpoint_reads_extreme_numbers_and_escaped_names() {
    let (service, _clock) = json_service();
    let zeros = "0".repeat(900_000);
    for (n, ok) in [
        ("1e999999999".to_owned(), false),
        ("1e99999999999999999999".to_owned(), false),
        ("1e-999999999".to_owned(), false),
        ("0e99999999999999999999".to_owned(), true),
        (r#""1e+0000000000000000000000001""#.to_owned(), true),
        (format!("1{zeros}"), false),
        (format!("1{zeros}e-900000"), true),
        (format!(r#""0.{zeros}1e999999999""#), false),
    ] {
        let body = big_request(&format!(r#", "hitsAddend": {n}"#));
        let (status, _, answer) = http_ask(&service, "POST", "/json", body);
        let shown: String = n.chars().take(40).collect();
        if ok {
            assert_eq!(status, 200, "{shown}: {answer}");
        } else {
            assert_eq!(status, 400, "{shown}: {answer}");
            assert!(
                answer.contains("descriptors[0].hitsAddend"),
                "{shown}: {answer}"
            );
        }
    }
    for (body, field) in [
        (
            r#"{"domain": "d", "domai\u006e": "d", "descriptors": [{}]}"#,
            "domain: given twice",
        ),
        (
            r#"{"domain": "d", "hits_addend": 1, "hits\u005faddend": 1, "descriptors": [{}]}"#,
            "hits_addend: given twice",
        ),
        (r#"{"domain": "\ud800", "descriptors": [{}]}"#, "domain"),
    ] {
        let (status, _, answer) = http_ask(&service, "POST", "/json", body);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(field), "{body}: {answer}");
    }
    let deep = format!("{}{}", "[".repeat(500_000), "]".repeat(500_000));
    let (status, _, answer) = http_ask(&service, "POST", "/json", deep);
    assert_eq!(status, 400, "{answer}");
    let deep = format!(r#"{{"domain": {}1{}}}"#, "[".repeat(1000), "]".repeat(1000));
    let (status, _, answer) = http_ask(&service, "POST", "/json", deep);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("domain"), "{answer}");
}

fn json_scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_owned()),
        Just("\"rl\"".to_owned()),
        Just("\"d\"".to_owned()),
        Just("\"MINUTE\"".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u32>().prop_map(|n| format!("\"{n}\"")),
        any::<f64>().prop_map(|n| n.to_string()),
        // Numbers as protojson reads them, and near misses: signs, exponents, whitespace.
        "-?[0-9]{1,3}(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?",
        "\"[ +-]?[0-9]{1,3}(\\.[0-9]{0,3})?([eE][+-]?[0-9]{0,12})? ?\"",
        "\\PC{0,8}".prop_map(|s| serde_json::to_string(&s).unwrap()),
    ]
}

/// JSON built of the request's own field names, nested at random.
fn json_node(depth: u32) -> BoxedStrategy<String> {
    let leaf = json_scalar().boxed();
    leaf.prop_recursive(depth, 32, 4, |inner| {
        let names = prop_oneof![
            Just("domain"),
            Just("descriptors"),
            Just("entries"),
            Just("key"),
            Just("value"),
            Just("hitsAddend"),
            Just("hits_addend"),
            Just("limit"),
            Just("requestsPerUnit"),
            Just("unit"),
            Just("other"),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((names, inner), 0..5).prop_map(|fields| {
                let fields: Vec<String> =
                    fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}", fields.join(","))
            }),
        ]
    })
    .boxed()
}

proptest! {
    /// Any body, JSON or not: an answer (200, 429 or 400 with a message), never a panic.
    #[test]
    fn the_json_endpoint_answers_any_body_without_panicking(
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            json_node(4).prop_map(String::into_bytes),
        ]
    ) {
        let (service, _clock) = json_service();
        let (status, _, answer) = http_ask(&service, "POST", "/json", body);
        prop_assert!(matches!(status, 200 | 429 | 400), "{status}: {answer}");
        if status == 400 {
            prop_assert!(!answer.is_empty());
        } else {
            prop_assert!(json(&answer).get("overallCode").is_some(), "{answer}");
        }
    }
}

/// Served by hyper over TCP, as a deployment mounts it: the JSON endpoint and the health check
/// answer a real HTTP client, and share the counts of the gRPC service.
#[tokio::test]
async fn the_json_endpoint_serves_over_hyper_and_shares_the_grpc_counts() {
    let mut rls = start(&[PER_MINUTE_1]).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let json_service = rls.service.json_service();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper_util::service::TowerToHyperService::new(json_service.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let health = client
        .get(format!("{base}/healthcheck"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let body =
        r#"{"domain":"rl","descriptors":[{"entries":[{"key":"category","value":"account"}]}]}"#;
    let post = || client.post(format!("{base}/json")).body(body).send();
    assert_eq!(post().await.unwrap().status(), 200);
    let over = post().await.unwrap();
    assert_eq!(over.status(), 429);
    let text = over.text().await.unwrap();
    assert_eq!(json(&text)["overallCode"], "OVER_LIMIT");
    // The gRPC service counted the same hit.
    let r = rls.call("rl", &[&[("category", "account")]]).await;
    assert_eq!(codes(&r), (OVER, vec![OVER]));
}

/// `examples/envoy_rls.yaml` does what its comments say: 10 a second per client IP, each
/// counted apart; one IP blocked outright; the slow path 2 a minute per client; `/search` in
/// shadow mode, reported over but never enforced.
#[test]
fn the_example_configuration_limits_as_its_comments_say() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/envoy_rls.yaml");
    let clock = ManualClock::new();
    let service =
        RlsService::with_clock(RlsConfig::from_file(path).expect("loads"), clock.clone()).unwrap();
    let ip = |v: &'static str| [("remote_address", v)];
    for _ in 0..10 {
        assert_eq!(codes(&decide(&service, "edge", &ip("10.0.0.1"))).0, OK);
    }
    assert_eq!(codes(&decide(&service, "edge", &ip("10.0.0.1"))).0, OVER);
    assert_eq!(codes(&decide(&service, "edge", &ip("10.0.0.2"))).0, OK);
    assert_eq!(codes(&decide(&service, "edge", &ip("192.0.2.66"))).0, OVER);
    let slow = |who: &'static str| [("generic_key", "slowpath"), ("client_id", who)];
    for expected in [OK, OK, OVER] {
        assert_eq!(codes(&decide(&service, "edge", &slow("alice"))).0, expected);
    }
    assert_eq!(codes(&decide(&service, "edge", &slow("bob"))).0, OK);
    let search = [("path", "/search")];
    let _ = decide(&service, "edge", &search);
    let r = decide(&service, "edge", &search);
    assert_eq!((codes(&r), remaining(&r)), ((OK, vec![OK]), vec![0]));
    // A second later the per-second limits start again; the per-minute one does not.
    clock.advance(Duration::from_secs(1));
    assert_eq!(codes(&decide(&service, "edge", &ip("10.0.0.1"))).0, OK);
    assert_eq!(codes(&decide(&service, "edge", &ip("192.0.2.66"))).0, OVER);
    assert_eq!(codes(&decide(&service, "edge", &slow("alice"))).0, OVER);
}

/// A shadow descriptor counts its hits as an enforced one does, past its limit too, as
/// Envoy's service counts them (shadow mode changes only the answer), so that it measures what
/// enforcing would do: after a cost past what was left, a check sees the limit reached, and
/// the limit, once enforced by a reload (which keeps the count), is over for one more hit.
/// Before, such a cost counted nothing: the check answered 1 left, and the next hit was
/// admitted once enforced.
#[test]
fn a_shadow_descriptor_counts_its_hits_past_the_limit_as_an_enforced_one_does() {
    let yaml = |shadow: bool| {
        format!(
            "domain: d\ndescriptors:\n  - key: budget\n    shadow_mode: {shadow}\n    rate_limit: {{ unit: hour, requests_per_unit: 10 }}\n"
        )
    };
    let service = RlsService::with_clock(
        RlsConfig::from_yaml_str(&yaml(true)).unwrap(),
        ManualClock::new(),
    )
    .unwrap();
    let costing = |hits: u64| {
        let mut request = check_of("d", &[("budget", "x")]);
        request.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
        service.should_rate_limit(&request).unwrap()
    };
    let r = costing(9);
    assert_eq!((codes(&r), remaining(&r)), ((OK, vec![OK]), vec![1]));
    // Past what is left: OK in shadow mode, and counted (12).
    let r = costing(3);
    assert_eq!((codes(&r), remaining(&r)), ((OK, vec![OK]), vec![0]));
    let r = costing(0);
    assert_eq!((codes(&r), remaining(&r)), ((OK, vec![OK]), vec![0]));
    service
        .reload(RlsConfig::from_yaml_str(&yaml(false)).unwrap())
        .unwrap();
    assert_eq!(codes(&costing(1)), (OVER, vec![OVER]));
}
