//! Per-limit counters through the `metrics` facade (features `envoy` and `metrics`), counted by
//! hits as envoyproxy/ratelimit counts its per-limit stats. Without the feature `metrics` the
//! counters are empty and count nothing.

// Without the feature the decision is made and dropped: its fields and the tally go unread.
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use super::proto::Entry;

/// One decision of one descriptor with a limit, as counted.
#[derive(Debug, Clone, Copy)]
pub(super) struct Decision {
    /// The limit's requests per unit.
    pub(super) limit: u32,
    /// The count before the hits (the limit when it is not known: all hits then count over).
    pub(super) before: u64,
    pub(super) hits: u64,
    /// Over the limit (whether or not the limit is in shadow mode).
    pub(super) over: bool,
    pub(super) shadow: bool,
    /// The share of the limit past which hits are near it (`NEAR_LIMIT_RATIO`), from 0 to 1.
    pub(super) near_ratio: f32,
}

/// What each counter gains, in hits: `[total_hits, over_limit, near_limit, within_limit,
/// shadow_mode]`.
pub(super) fn tally(d: Decision) -> [u64; 5] {
    let limit = u64::from(d.limit);
    // As envoyproxy/ratelimit: the ratio applied in single precision, rounded down. A limit
    // past 2^24 may round up past itself (16777219 × 1.0 is 16777220): no further than the
    // limit, so that the near range is empty rather than negative.
    let near = ((d.limit as f32 * d.near_ratio).floor() as u64).min(limit);
    let after = d.before.saturating_add(d.hits);
    let (mut over, mut near_hits, mut within, mut shadow) = (0, 0, 0, 0);
    if d.over {
        // Past the limit before these hits, or over without reaching it (a new counter
        // refused at the key cap, fail closed): every hit is over.
        if d.before >= limit || after <= limit {
            over = d.hits;
        } else {
            // Only the hits past the limit are over; those between the near threshold and the
            // limit were near it.
            over = after.saturating_sub(limit);
            near_hits = limit - near.max(d.before);
        }
        // As envoyproxy/ratelimit: a shadow limit's hits over it, as `over_limit` counts them.
        if d.shadow {
            shadow = over;
        }
    } else {
        within = d.hits;
        if after > near {
            near_hits = if d.before >= near {
                d.hits
            } else {
                after - near
            };
        }
    }
    [d.hits, over, near_hits, within, shadow]
}

/// The label of a limit with `detailed_metric: true`: the domain and the request's entries,
/// as envoyproxy/ratelimit names the stat: `domain.key_value.key_value`, the `_` kept when a
/// value is empty (`domain.key_`), except that when a `share_threshold` wildcard matched
/// (`shared`) an empty value leaves the key alone (`domain.key`), as its two ways of naming
/// it differ there.
pub(super) fn detailed_label(domain: &str, entries: &[Entry], shared: bool) -> String {
    let mut label = domain.to_owned();
    for e in entries {
        label.push('.');
        label.push_str(&e.key);
        if !shared || !e.value.is_empty() {
            label.push('_');
            label.push_str(&e.value);
        }
    }
    label
}

/// One limit's five counters: with the feature `metrics`, a key each, labelled `domain` and
/// `limit`, built once (when the configuration loads, or when an override's limiter is made).
/// Keys, not registered handles, as the HTTP layer's: the recorder installed at each decision
/// (a thread's local one too) gets the counts.
pub(crate) struct Counters {
    #[cfg(feature = "metrics")]
    keys: [::metrics::Key; 5],
}

#[cfg(feature = "metrics")]
const NAMES: [&str; 5] = [
    "turnstile_envoy_total_hits",
    "turnstile_envoy_over_limit",
    "turnstile_envoy_near_limit",
    "turnstile_envoy_within_limit",
    "turnstile_envoy_shadow_mode",
];

impl Counters {
    /// The counters of the limit labelled `limit` in `domain`.
    pub(crate) fn new(domain: &str, limit: &str) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = (domain, limit);
        Counters {
            #[cfg(feature = "metrics")]
            keys: {
                let domain: std::sync::Arc<str> = domain.into();
                let limit: std::sync::Arc<str> = limit.into();
                NAMES.map(|name| {
                    ::metrics::Key::from_parts(
                        name,
                        vec![
                            ::metrics::Label::new("domain", std::sync::Arc::clone(&domain)),
                            ::metrics::Label::new("limit", std::sync::Arc::clone(&limit)),
                        ],
                    )
                })
            },
        }
    }

    /// Adds `decision`'s hits to the counters, in the recorder installed now.
    #[inline]
    pub(super) fn count(&self, decision: Decision) {
        #[cfg(feature = "metrics")]
        {
            static METADATA: ::metrics::Metadata<'static> = ::metrics::Metadata::new(
                module_path!(),
                ::metrics::Level::INFO,
                Some(module_path!()),
            );
            for (key, n) in self.keys.iter().zip(tally(decision)) {
                if n > 0 {
                    ::metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
                        .increment(n);
                }
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = decision;
    }
}

/// Counts, in the recorder installed now, one request of `domain` whose answer the global
/// shadow mode turned into `OK` (`turnstile_envoy_global_shadow_mode`, labelled by domain).
pub(super) fn count_global_shadow_mode(domain: &str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!("turnstile_envoy_global_shadow_mode", "domain" => domain.to_owned())
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = domain;
}

impl std::fmt::Debug for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters").finish_non_exhaustive()
    }
}

/// Counters are named by the limit's domain and path, which the limit compares already.
impl PartialEq for Counters {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Counters {}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(limit: u32, before: u64, hits: u64, over: bool, shadow: bool) -> [u64; 5] {
        tally(Decision {
            limit,
            before,
            hits,
            over,
            shadow,
            near_ratio: 0.8,
        })
    }

    #[test]
    fn hits_split_at_the_near_threshold_and_the_limit_as_envoy_splits_them() {
        // Limit 10: near from the 9th hit (floor(10 × 0.8) = 8).
        assert_eq!(d(10, 0, 1, false, false), [1, 0, 0, 1, 0]);
        assert_eq!(d(10, 7, 3, false, false), [3, 0, 2, 3, 0]);
        assert_eq!(d(10, 8, 1, false, false), [1, 0, 1, 1, 0]);
        // 9 counted, 3 more: 2 over, the 10th near.
        assert_eq!(d(10, 9, 3, true, false), [3, 2, 1, 0, 0]);
        assert_eq!(d(10, 10, 2, true, true), [2, 2, 0, 0, 2]);
        // In shadow mode, crossing: only the hits past the limit count in shadow_mode.
        assert_eq!(d(10, 9, 3, true, true), [3, 2, 1, 0, 2]);
        // Limit 0: every hit over.
        assert_eq!(d(0, 0, 4, true, false), [4, 4, 0, 0, 0]);
        // Over without reaching the limit (a new counter refused at the key cap, its count
        // read as empty): every hit over, none near (not 2 near-limit hits for 1 hit).
        assert_eq!(d(10, 0, 1, true, false), [1, 1, 0, 0, 0]);
        assert_eq!(d(10, 9, 1, true, true), [1, 1, 0, 0, 1]);
    }
}
