//! What the HTTP tests share: the 2-per-second per-IP rule of issue 6's scenarios, and a
//! limiter built from TOML on a `ManualClock` the test advances.

use std::sync::Arc;
use turnstile::ManualClock;
use turnstile::http::{HttpConfig, HttpLimiter};

/// One general rule: 2 requests per second per client IP, on every endpoint.
pub const PER_IP: &str = r#"
[[rules]]
name = "per-ip"
endpoint = "*"
period = "1s"
limit = 2
"#;

/// An `HttpLimiter` configured from `toml`, shared (as a layer's is), and its clock.
#[allow(dead_code)] // not every test file serves the limiter
pub fn limiter(toml: &str) -> (Arc<HttpLimiter<ManualClock>>, ManualClock) {
    let clock = ManualClock::new();
    let config = HttpConfig::from_toml_str(toml).expect("valid config");
    let limiter = HttpLimiter::with_clock(config, clock.clone()).expect("config compiles");
    (Arc::new(limiter), clock)
}
