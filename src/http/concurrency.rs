//! [`ConcurrencyLayer`]. PLACEHOLDER: the http-edge branch replaces this file.

/// An in-flight cap for the routes it wraps.
///
/// # Examples
///
/// ```
/// let _ = turnstile::http::LayerSettings::default();
/// ```
#[derive(Debug, Clone)]
pub struct ConcurrencyLayer {}
