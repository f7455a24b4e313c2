//! The Envoy rate limit service (feature `envoy`): the wire format of the hand-written
//! messages.

use prost::Message;
use turnstile::envoy::proto::{
    Code, DescriptorStatus, Entry, ProtoDuration, RateLimit, RateLimitDescriptor,
    RateLimitOverride, RateLimitRequest, RateLimitResponse, UInt64Value, Unit,
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
