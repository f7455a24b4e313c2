//! [`RateLimitLayer`]. PLACEHOLDER: the http-edge branch replaces this file.

use crate::http::{LayerSettings, Policy};
use arc_swap::ArcSwap;
use std::sync::Arc;

/// A tower layer that decides every request with a [`Policy`].
///
/// # Examples
///
/// ```
/// let _ = turnstile::http::LayerSettings::default();
/// ```
#[derive(Debug)]
pub struct RateLimitLayer<P> {
    #[allow(dead_code)]
    policy: Arc<P>,
    #[allow(dead_code)]
    settings: Arc<ArcSwap<LayerSettings>>,
}

impl<P: Policy> RateLimitLayer<P> {
    /// A layer deciding with `policy`, reading its settings from `settings` on every request
    /// (so that a reload that swaps them takes effect at once).
    ///
    /// # Examples
    ///
    /// ```
    /// let _ = turnstile::http::LayerSettings::default();
    /// ```
    pub fn with_settings(policy: Arc<P>, settings: Arc<ArcSwap<LayerSettings>>) -> Self {
        RateLimitLayer { policy, settings }
    }
}
