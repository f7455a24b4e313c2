//! [`HttpLimiter`]: the compiled rules. PLACEHOLDER: the http-engine branch replaces this file.

use crate::http::{LayerSettings, Policy};
use arc_swap::ArcSwap;
use std::sync::Arc;

/// The configured rules, limiters and bans of the HTTP layer.
///
/// # Examples
///
/// ```
/// let _ = turnstile::http::HttpConfig::default();
/// ```
#[derive(Debug)]
pub struct HttpLimiter {
    settings: Arc<ArcSwap<LayerSettings>>,
}

impl HttpLimiter {
    /// The layer settings shared with every layer built from this limiter (swapped on reload).
    #[allow(dead_code)]
    pub(crate) fn layer_settings(&self) -> Arc<ArcSwap<LayerSettings>> {
        self.settings.clone()
    }
}

impl Policy for HttpLimiter {
    fn check(&self, _request: &crate::http::RequestInfo<'_>) -> crate::http::Check {
        unimplemented!("placeholder")
    }
}
