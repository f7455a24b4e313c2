//! The algorithms the refund tests (`tests/refund.rs`, `tests/chain_refund.rs`) run at a given
//! limit: windows of 10 s, a bucket refilling one token a second (far sooner than a window).

use std::time::Duration;
use turnstile::{Algorithm, Rate};

pub const SECOND: Duration = Duration::from_secs(1);

pub fn fixed(limit: u32) -> Algorithm {
    Algorithm::FixedWindow {
        limit,
        window: 10 * SECOND,
    }
}

pub fn counter(limit: u32) -> Algorithm {
    Algorithm::SlidingCounter {
        limit,
        window: 10 * SECOND,
    }
}

/// One token a second: a bucket refills within a second, far sooner than a window.
pub fn bucket(burst: u32) -> Algorithm {
    Algorithm::TokenBucket {
        rate: Rate::new(1, SECOND),
        burst,
    }
}

pub fn sliding(limit: u32) -> Algorithm {
    Algorithm::SlidingWindow {
        limit,
        window: 10 * SECOND,
    }
}

/// The proptests' algorithm number `kind` (0 to 3) with `limit` (the bucket refilling `limit`
/// tokens per 10 s, as the windows do).
pub fn of_kind(kind: u8, limit: u32) -> Algorithm {
    match kind {
        0 => fixed(limit),
        1 => counter(limit),
        2 => Algorithm::TokenBucket {
            rate: Rate::new(limit, 10 * SECOND),
            burst: limit,
        },
        _ => sliding(limit),
    }
}
