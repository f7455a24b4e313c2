//! Counting the HTTP rules in Redis (features `http` and `redis`): `[backend] kind = "redis"`.
//!
//! Everything but the counting stays as in memory: whitelists, the blocklist, bans (kept in each
//! process's memory), rule matching and selection, limit 0 and missing keys. Each enforced rule
//! that matches counts in its own [`RedisLimiter`] (the rule's algorithm, on Redis's clock), so
//! that every process using the same server and prefix shares the limits.
//!
//! # Keys
//!
//! A rule's keys are `{prefix}:r{id}:{subject}:{fw|sw|sc|tb}` (see [`RedisLimiter`]), where `id` is
//! 16 hex digits of the SHA-256 of the rule's identity (scope, name, endpoint, regex flag,
//! period, algorithm, key and per-endpoint flag) and `subject` encodes the request's counter key
//! (client IP, client id, `VERB:path`). The limit is not part of the name: a reload that only
//! changes a rule's limit keeps its counters in Redis, and so does a reload that leaves the rule
//! alone. Changing anything in the identity starts the rule from fresh keys (the old ones expire
//! by their TTL).
//!
//! # All or nothing, and what is not atomic
//!
//! One matching rule (the common case) is one script: atomic. With several matching rules, each
//! counting a different subject, the request is decided in two passes: first every rule is
//! **probed** (a decision for zero permits, which writes nothing); if one would reject, the request
//! is rejected by it and no rule is charged. Otherwise every rule is charged in order. Between the
//! probe and the charge another process may take the last permit of a later rule: the request is
//! then rejected by that rule, and the rules charged before it **stay charged** (Redis keeps no
//! refund). That race needs concurrent requests of one client at the very edge of a limit; it is
//! not otherwise possible for a rejected request to be charged. Cost: one round trip per rule per
//! pass.
//!
//! On a rejection the verdict's quotas are those of the rules decided so far (the rejecting
//! rule's with remaining 0 and reset after its retry-after); rules not reached are not reported.
//!
//! # Failures
//!
//! The `[backend] failure` policy applies to each rule's decision: `open` admits,
//! `closed` rejects with [`RejectReason::Unavailable`], `fallback` counts in a local in-memory
//! limiter ([`FailurePolicy::Fallback`]). Every decision the policy made instead of Redis is
//! logged (`tracing` warn) and counted in `turnstile_http_backend_fallbacks` (label `rule`) with
//! the feature `metrics`. A request matching several rules makes two decisions per rule (the
//! probe and the charge), so while Redis is away it counts up to two fallbacks per rule.

use crate::http::config::BackendConfig;
use crate::http::rules::{parse_period, BanKey, Bans, CounterKey, Rule, RuleSet};
use crate::http::{Check, HttpConfigError, Outcome, QuotaState, RejectReason, Verdict};
use crate::{Clock, FailurePolicy, RedisLimiter, TryAcquireError};
use ::redis::aio::ConnectionManager;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The `[backend]` section of a Redis configuration, validated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RedisSettings {
    pub(crate) url: String,
    prefix: String,
    policy: FailurePolicy,
    deadline: Duration,
}

impl RedisSettings {
    /// Validates `backend` (its kind being `"redis"`), naming the field at fault.
    pub(crate) fn parse(backend: &BackendConfig) -> Result<Self, HttpConfigError> {
        let url = match backend.url.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => url.to_owned(),
            _ => {
                return Err(HttpConfigError::invalid(
                    "backend.url",
                    "required with kind = \"redis\" (such as \"redis://127.0.0.1:6379/\")",
                ))
            }
        };
        if let Err(e) = ::redis::Client::open(url.as_str()) {
            return Err(HttpConfigError::invalid(
                "backend.url",
                format!("{url:?} is not a Redis URL ({e})"),
            ));
        }
        let prefix = backend
            .prefix
            .clone()
            .unwrap_or_else(|| "turnstile".to_owned());
        if prefix.is_empty() || prefix.len() > 200 || prefix.contains(['{', '}']) {
            return Err(HttpConfigError::invalid(
                "backend.prefix",
                "must be 1 to 200 bytes without '{' or '}'",
            ));
        }
        let policy = match backend.failure.as_deref().map(str::trim) {
            None | Some("closed") => FailurePolicy::FailClosed,
            Some("open") => FailurePolicy::FailOpen,
            Some("fallback") => FailurePolicy::Fallback { share: 1.0 },
            Some(other) => {
                let share = other
                    .strip_prefix("fallback:")
                    .and_then(|s| s.trim().parse::<f64>().ok())
                    .filter(|s| *s > 0.0 && *s <= 1.0);
                match share {
                    Some(share) => FailurePolicy::Fallback { share },
                    None => {
                        return Err(HttpConfigError::invalid(
                            "backend.failure",
                            format!(
                                "{other:?} is not a failure policy: expected \"open\", \"closed\", \"fallback\" or \"fallback:<share in (0, 1]>\""
                            ),
                        ))
                    }
                }
            }
        };
        let deadline = match &backend.deadline {
            None => Duration::from_millis(50),
            Some(d) => parse_period(d, "backend.deadline")?,
        };
        Ok(RedisSettings {
            url,
            prefix,
            policy,
            deadline,
        })
    }
}

/// The connection of a limiter that counts in Redis.
pub(crate) struct RedisBackend {
    pub(crate) url: String,
    pub(crate) connection: ConnectionManager,
}

/// Gives every rule of a freshly compiled `set` its limiter in Redis.
pub(crate) fn attach<C: Clock>(
    set: &mut RuleSet<C>,
    settings: &RedisSettings,
    backend: &RedisBackend,
) -> Result<(), HttpConfigError> {
    let lists = std::iter::once(&mut set.general)
        .chain(set.ip.iter_mut().map(|(_, rules)| rules))
        .chain(set.client.values_mut());
    for rules in lists {
        for rule in rules.iter_mut() {
            let name = rule.name.clone();
            let Some(rule) = Arc::get_mut(rule) else {
                return Err(HttpConfigError::Backend {
                    message: format!(
                        "rule {name:?} is shared and cannot be given its Redis limiter"
                    ),
                });
            };
            let Some(local) = &rule.limiter else {
                continue; // limit 0: blocks, counts nothing
            };
            let digest = Sha256::digest(rule.identity.canonical().as_bytes());
            let mut prefix = format!("{}:r", settings.prefix);
            for byte in &digest[..8] {
                let _ = write!(prefix, "{byte:02x}");
            }
            let remote = RedisLimiter::builder(local.algorithm(), settings.policy)
                .prefix(prefix)
                .deadline(settings.deadline)
                .build(backend.connection.clone())
                .map_err(|e| {
                    HttpConfigError::invalid(
                        "backend",
                        format!("rule {name:?} cannot count in Redis: {e}"),
                    )
                })?;
            rule.remote = Some(Remote {
                limiter: remote,
                reported: AtomicU64::new(0),
            });
        }
    }
    Ok(())
}

/// The Redis subject of a counter key: each part tagged and length-prefixed, so that two keys
/// never share a subject.
fn subject(key: &CounterKey) -> String {
    let mut s = String::new();
    if let Some(ip) = key.ip {
        let _ = write!(s, "i{ip};");
    }
    if let Some(client) = &key.client {
        let _ = write!(s, "c{}:{client};", client.len());
    }
    if let Some(endpoint) = &key.endpoint {
        let _ = write!(s, "e{}:{endpoint};", endpoint.len());
    }
    s
}

fn count_metric(name: &'static str, rule: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(name, "rule" => rule.to_owned()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, rule);
}

impl Remote {
    /// Reports the failure-policy decisions made since the last report: the difference to the
    /// limiter's own count, so that each decision is reported exactly once even when requests
    /// race.
    fn report(&self, rule: &str) {
        let stats = self.limiter.stats();
        let now = stats.fallbacks + stats.failed_open + stats.failed_closed;
        let before = self.reported.fetch_max(now, Ordering::Relaxed);
        for _ in before..now {
            tracing::warn!(rule = %rule, "Redis failed or missed the deadline: the failure policy decided");
            count_metric("turnstile_http_backend_fallbacks", rule);
        }
    }
}

/// A rule's limiter in Redis, and how many of its failure-policy decisions were reported.
pub(crate) struct Remote {
    limiter: RedisLimiter,
    reported: AtomicU64,
}

/// One rule to count for a request.
pub(crate) struct Step<C: Clock> {
    pub(crate) rule: Arc<Rule<C>>,
    pub(crate) key: CounterKey,
}

/// The ban bookkeeping of a request, when bans are configured and the client is known.
pub(crate) type BanEntry<C> = Option<(Arc<Bans<C>>, BanKey)>;

/// Counts `plan` (the enforced rules) and then `monitors` in Redis; see the module docs.
pub(crate) fn count<C: Clock>(
    plan: Vec<Step<C>>,
    monitors: Vec<Step<C>>,
    ban: BanEntry<C>,
) -> Check {
    Check::Pending(Box::pin(async move {
        let steps: Vec<(&Step<C>, &Remote, String)> = plan
            .iter()
            .filter_map(|s| Some((s, s.rule.remote.as_ref()?, subject(&s.key))))
            .collect();
        if steps.len() > 1 {
            for (step, limiter, subject) in &steps {
                let result = limiter.limiter.try_acquire_n(subject, 0).await;
                limiter.report(&step.rule.name);
                if let Err(error) = result {
                    return reject(step, error, Vec::new(), &ban);
                }
            }
        }
        let mut quotas = Vec::with_capacity(steps.len());
        for (step, limiter, subject) in &steps {
            let result = limiter.limiter.try_acquire(subject).await;
            limiter.report(&step.rule.name);
            match result {
                Ok(admission) => quotas.push(QuotaState {
                    policy: step.rule.name.clone(),
                    limit: u64::from(step.rule.limit),
                    window: step.rule.period,
                    remaining: u64::from(admission.remaining()),
                    reset_after: admission.reset_after(),
                }),
                Err(error) => return reject(step, error, quotas, &ban),
            }
        }
        for step in &monitors {
            let Some(limiter) = &step.rule.remote else {
                continue;
            };
            let result = limiter.limiter.try_acquire(&subject(&step.key)).await;
            limiter.report(&step.rule.name);
            if result.is_err() {
                tracing::debug!(rule = %step.rule.name, key = ?step.key, "monitor rule would reject");
                count_metric("turnstile_http_shadow_rejected", &step.rule.name);
            }
        }
        for q in &quotas {
            count_metric("turnstile_http_admitted", &q.policy);
        }
        Verdict {
            outcome: Outcome::Admitted,
            quotas,
        }
    }))
}

fn reject<C: Clock>(
    step: &Step<C>,
    error: TryAcquireError,
    mut quotas: Vec<QuotaState>,
    ban: &BanEntry<C>,
) -> Verdict {
    let rule = &step.rule;
    let (reason, retry_after) = match error {
        TryAcquireError::Rejected(r) => (RejectReason::RateLimited, Some(r.retry_after())),
        _ => (RejectReason::Unavailable, None),
    };
    tracing::debug!(rule = %rule.name, key = ?step.key, error = %error, "request rejected (Redis)");
    count_metric("turnstile_http_rejected", &rule.name);
    if reason == RejectReason::RateLimited {
        if let Some((bans, key)) = ban {
            if let Ok(a) = bans.rejections.try_acquire(key) {
                if a.remaining() == 0 && bans.banned.try_acquire(key).is_ok() {
                    tracing::info!(client = ?key, duration = %bans.config.duration, "client banned");
                    count_metric("turnstile_http_banned", &rule.name);
                }
            }
        }
    }
    quotas.push(QuotaState {
        policy: rule.name.clone(),
        limit: u64::from(rule.limit),
        window: rule.period,
        remaining: 0,
        reset_after: retry_after.unwrap_or(rule.period),
    });
    Verdict {
        outcome: Outcome::Rejected {
            reason,
            rule: rule.name.clone(),
            retry_after,
        },
        quotas,
    }
}
