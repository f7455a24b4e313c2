//! The Envoy rate limit service (feature `envoy`): the wire format of the hand-written
//! messages, and envoyproxy/ratelimit's configuration files.

use proptest::prelude::*;
use prost::Message;
use turnstile::envoy::proto::{
    Code, DescriptorStatus, Entry, ProtoDuration, RateLimit, RateLimitDescriptor,
    RateLimitOverride, RateLimitRequest, RateLimitResponse, UInt64Value, Unit,
};
use turnstile::envoy::{RlsConfig, RlsConfigError};

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
        ("domain: d\ndescriptors:\n  - value: v\n", "descriptors[0].key"),
        ("domain: d\ndescriptors:\n  - key: k\n    colour: red\n", "descriptors[0].colour"),
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
}
