//! Counting in Redis (features `envoy` and `redis`): a `RedisLimiter` per configured limit.

use super::config::{RlsConfig, RlsConfigError};
use super::metrics::Decision;
use super::proto::{Code, Entry, RateLimitOverride, RateLimitRequest, RateLimitResponse, Unit};
use super::service::{
    counter_entries, hits_of, override_applied, resolve, status, window_left, Applied, Overrides,
};
use crate::redis::aio::ConnectionManager;
use crate::{Admission, Algorithm, ConfigError, FailurePolicy, RedisLimiter, TryAcquireError};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

pub(crate) struct Remote {
    connection: ConnectionManager,
    prefix: String,
    policy: FailurePolicy,
    overrides: Overrides<RedisLimiter>,
}

/// A descriptor's entries as one subject, unambiguously: each key and value preceded by its
/// length.
fn subject(entries: &[Entry]) -> Vec<u8> {
    let mut s = String::new();
    for e in entries {
        let _ = write!(s, "{}:{}{}:{}", e.key.len(), e.key, e.value.len(), e.value);
    }
    s.into_bytes()
}

/// What one descriptor got.
enum Answer {
    Nothing,
    Unlimited,
    /// Not sent to Redis: nothing counted.
    NotAsked,
    Within(u32, Duration),
    Over(Duration),
    Got(Result<Admission, TryAcquireError>),
}

impl Remote {
    pub(super) fn new(
        connection: ConnectionManager,
        prefix: String,
        policy: FailurePolicy,
    ) -> Result<Self, RlsConfigError> {
        RedisLimiter::builder(
            Algorithm::FixedWindow {
                limit: 1,
                window: Duration::from_secs(1),
            },
            policy,
        )
        .prefix(prefix.clone())
        .check()
        .map_err(|e| RlsConfigError::Invalid {
            source: "Redis".to_owned(),
            field: "prefix".to_owned(),
            message: e.to_string(),
        })?;
        Ok(Remote {
            connection,
            prefix,
            policy,
            overrides: Mutex::new(HashMap::new()),
        })
    }

    /// A limiter whose keys are named by `identity` (hashed: it may hold any character).
    fn limiter(&self, identity: &str, limit: u32, unit: Unit) -> Result<RedisLimiter, ConfigError> {
        let digest = Sha256::digest(identity.as_bytes());
        let mut prefix = self.prefix.clone();
        prefix.push(':');
        for b in &digest[..8] {
            let _ = write!(prefix, "{b:02x}");
        }
        let window = unit.duration().unwrap_or(Duration::from_secs(1));
        RedisLimiter::builder(Algorithm::FixedWindow { limit, window }, self.policy)
            .prefix(prefix)
            .build(self.connection.clone())
    }

    /// One limiter per configured limit (`None` for unlimited ones and `requests_per_unit: 0`),
    /// named by domain, descriptor path and unit, not by the limit.
    pub(super) fn limiters(
        &self,
        config: &RlsConfig,
    ) -> Result<Vec<Option<RedisLimiter>>, RlsConfigError> {
        config
            .limits()
            .iter()
            .map(|s| {
                if s.unlimited || s.requests_per_unit == 0 {
                    return Ok(None);
                }
                let identity = format!("limit|{}|{}", s.path, s.unit as i32);
                self.limiter(&identity, s.requests_per_unit, s.unit)
                    .map(Some)
                    .map_err(|e| RlsConfigError::Invalid {
                        source: "configuration".to_owned(),
                        field: s.path.clone(),
                        message: e.to_string(),
                    })
            })
            .collect()
    }

    fn override_limit(
        &self,
        domain: &str,
        o: RateLimitOverride,
    ) -> Option<Applied<'static, RedisLimiter>> {
        override_applied(&self.overrides, domain, o, |limit, unit, _| {
            let identity = format!("override|{domain}|{limit}|{}", unit as i32);
            self.limiter(&identity, limit, unit).ok()
        })
    }

    /// Decides `request` (already validated) against `counters`; `now` (Unix nanoseconds)
    /// only for the windows of descriptors decided without Redis.
    pub(super) async fn decide(
        &self,
        config: &RlsConfig,
        counters: &[Option<RedisLimiter>],
        request: &RateLimitRequest,
        now: u64,
    ) -> RateLimitResponse {
        let applied = resolve(config, counters, request, |domain, o| {
            self.override_limit(domain, o)
        });
        let hits: Vec<u64> = (request.descriptors.iter())
            .map(|d| hits_of(request, d))
            .collect();
        let subjects: Vec<Vec<u8>> = (request.descriptors.iter().zip(&applied))
            .map(|(d, a)| match a {
                Applied::Limit { shared, .. } => subject(&counter_entries(&d.entries, shared)),
                _ => Vec::new(),
            })
            .collect();
        let shadow =
            |i: usize| matches!(&applied[i], Applied::Limit { spec, .. } if spec.shadow_mode());
        let enforced_over = |answers: &[Answer]| {
            answers
                .iter()
                .enumerate()
                .any(|(i, a)| !shadow(i) && matches!(a, Answer::Over(_) | Answer::Got(Err(_))))
        };

        // Decided here: no limit, unlimited, limit 0, more hits than the limit.
        let mut answers: Vec<Answer> = (applied.iter().zip(&hits))
            .map(|(a, &n)| match a {
                Applied::Nothing => Answer::Nothing,
                Applied::Unlimited(_) => Answer::Unlimited,
                Applied::Limit { spec, limiter, .. } => {
                    let reset = window_left(spec.unit(), now);
                    match limiter {
                        None if n == 0 => Answer::Within(0, reset),
                        None => Answer::Over(reset),
                        Some(l) if n > u64::from(l.capacity()) => Answer::Over(reset),
                        Some(_) => Answer::NotAsked,
                    }
                }
            })
            .collect();
        let limiter = |i: usize| match &applied[i] {
            Applied::Limit {
                limiter: Some(l), ..
            } => Some(l),
            _ => None,
        };

        // The enforced descriptors: one script when they cost alike, else one by one.
        if !enforced_over(&answers) {
            let group: Vec<usize> = (0..answers.len())
                .filter(|&i| matches!(answers[i], Answer::NotAsked) && !shadow(i) && hits[i] > 0)
                .collect();
            if let Some(&first) = group.first() {
                // At most the limit's capacity, a u32 (checked above).
                let n = u32::try_from(hits[first]).unwrap_or(u32::MAX);
                if group.iter().all(|&i| hits[i] == hits[first]) {
                    let members: Vec<(&RedisLimiter, &[u8])> = (group.iter())
                        .filter_map(|&i| limiter(i).map(|l| (l, subjects[i].as_slice())))
                        .collect();
                    let got = crate::backend::try_acquire_all(&members, n).await;
                    for (&i, answer) in group.iter().zip(got) {
                        if let Some(result) = answer {
                            answers[i] = Answer::Got(result);
                        }
                    }
                } else {
                    for &i in &group {
                        let Some(l) = limiter(i) else { continue };
                        let n = u32::try_from(hits[i]).unwrap_or(u32::MAX);
                        let result = l.try_acquire_n(subjects[i].as_slice(), n).await;
                        let over = result.is_err();
                        answers[i] = Answer::Got(result);
                        if over {
                            break;
                        }
                    }
                }
            }
        }
        let rejected = enforced_over(&answers);

        // Checks (0 hits), and shadow descriptors of an admitted request.
        for i in 0..answers.len() {
            if !matches!(answers[i], Answer::NotAsked) {
                continue;
            }
            let Some(l) = limiter(i) else { continue };
            let subject = subjects[i].as_slice();
            if hits[i] == 0 {
                let unit = match &applied[i] {
                    Applied::Limit { spec, .. } => spec.unit(),
                    _ => Unit::Second,
                };
                answers[i] = match l.try_acquire_n(subject, 0).await {
                    Ok(a) => Answer::Within(a.remaining(), a.reset_after()),
                    Err(TryAcquireError::Rejected(r)) => Answer::Within(0, r.retry_after()),
                    Err(_) => Answer::Within(0, window_left(unit, now)),
                };
            } else if shadow(i) && !rejected {
                let n = u32::try_from(hits[i]).unwrap_or(u32::MAX);
                answers[i] = Answer::Got(l.try_acquire_n(subject, n).await);
            }
        }

        let statuses = (answers.into_iter().enumerate())
            .map(|(i, answer)| {
                let (current, unit) = match &applied[i] {
                    Applied::Limit { spec, .. } => (Some(spec.proto()), spec.unit()),
                    _ => (None, Unit::Second),
                };
                let over = if shadow(i) { Code::Ok } else { Code::OverLimit };
                if let Applied::Limit { spec, shared, .. } = &applied[i] {
                    // A rejection's count before the hits is not known here: all its hits
                    // count over the limit. Descriptors left unasked are not counted.
                    let limit = spec.requests_per_unit();
                    let before = match &answer {
                        Answer::Got(Ok(a)) => Some(
                            u64::from(limit.saturating_sub(a.remaining())).saturating_sub(hits[i]),
                        ),
                        Answer::Over(_) | Answer::Got(Err(_)) => Some(u64::from(limit)),
                        _ => None,
                    };
                    if let Some(before) = before {
                        let entries = counter_entries(&request.descriptors[i].entries, shared);
                        let decision = Decision {
                            limit,
                            before,
                            hits: hits[i],
                            over: !matches!(answer, Answer::Got(Ok(_))),
                            shadow: shadow(i),
                        };
                        spec.count(&request.domain, &entries, decision);
                    }
                }
                match answer {
                    Answer::Nothing => status(Code::Ok, None, 0, None),
                    Answer::Unlimited => status(Code::Ok, None, u32::MAX, None),
                    Answer::NotAsked => status(Code::Ok, current, 0, None),
                    Answer::Within(left, reset) => status(Code::Ok, current, left, Some(reset)),
                    Answer::Over(reset) => status(over, current, 0, Some(reset)),
                    Answer::Got(Ok(a)) => {
                        status(Code::Ok, current, a.remaining(), Some(a.reset_after()))
                    }
                    Answer::Got(Err(TryAcquireError::Rejected(r))) => {
                        status(over, current, 0, Some(r.retry_after()))
                    }
                    // Redis failed and the failure policy refused: over (fail closed).
                    Answer::Got(Err(_)) => status(over, current, 0, Some(window_left(unit, now))),
                }
            })
            .collect();
        RateLimitResponse {
            overall_code: if rejected { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..Default::default()
        }
    }
}
