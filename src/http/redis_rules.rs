//! Counting the HTTP rules in Redis (features `http` and `redis`): `[backend] kind = "redis"`.
//!
//! The semantics are documented on [`crate::http::BackendConfig`], where users of
//! the crate read them.

pub(crate) use crate::backend::Connection;
use crate::backend::{settled, try_acquire_all};
use crate::http::config::{BackendConfig, HttpConfig, RuleConfig, RuleKey};
use crate::http::rules::{
    BanKey, Bans, CounterKey, Failure, Identity, Metric, Rule, RuleSet,
    algorithm as rule_algorithm, parse_failure, parse_period,
};
use crate::http::{Check, HttpConfigError, Outcome, QuotaState, Quotas, RejectReason, Verdict};
use crate::sync::{AtomicU64, Ordering};
use crate::{Admission, Algorithm, Clock, FailurePolicy, RedisLimiter, TryAcquireError};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// The `[backend]` section of a Redis configuration, validated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RedisSettings {
    pub(crate) url: String,
    /// Whether `url` names the seed nodes of a Redis Cluster.
    pub(crate) cluster: bool,
    prefix: String,
    policy: FailurePolicy,
    deadline: Duration,
}

impl RedisSettings {
    /// Validates the `[backend]` of `config` (its kind being `"redis"`), naming the field at
    /// fault; that every rule can count in Redis ([`check_rules`](Self::check_rules)); on a
    /// Cluster, also that a request's keys share a slot ([`check_cluster`]). Before any
    /// limiter is built or reconfigured, so that a reload refused here changes nothing.
    pub(crate) fn of(config: &HttpConfig) -> Result<Self, HttpConfigError> {
        let settings = Self::parse(&config.backend)?;
        settings.check_rules(config)?;
        if settings.cluster {
            check_cluster(config)?;
        }
        Ok(settings)
    }

    /// Checks that every rule that counts can have its limiter in Redis: the scripts take
    /// narrower parameters than the limiters in memory (an exact sliding window of more than
    /// 100,000 in Redis, for one), and a rule refused only when its Redis limiter was built
    /// came after compilation had reconfigured the limiters a reload keeps, and was named by
    /// no field of the document. Rules whose own fields are wrong are left to the compiler,
    /// which names them.
    fn check_rules(&self, config: &HttpConfig) -> Result<(), HttpConfigError> {
        for (field, rule) in all_rules(config) {
            let (Ok(period), Ok(limit)) = (
                parse_period(&rule.period, &field),
                u32::try_from(rule.limit),
            ) else {
                continue;
            };
            if limit == 0 {
                continue; // blocks, counts nothing
            }
            let algorithm = rule_algorithm(rule.algorithm, limit, period);
            if algorithm.check_params().is_err() {
                continue; // the compiler says what is wrong, naming the field
            }
            RedisLimiter::builder(algorithm, self.policy)
                .prefix(format!("{}:r0000000000000000", self.prefix))
                .deadline(self.deadline)
                .check()
                .map_err(|e| {
                    HttpConfigError::invalid(
                        field,
                        format!("cannot count in Redis (backend.kind = \"redis\"): {e}"),
                    )
                })?;
        }
        Ok(())
    }

    /// The seed nodes of a Cluster: the URLs in `url`, separated by commas.
    pub(crate) fn seeds(&self) -> Vec<&str> {
        seeds(&self.url).collect()
    }

    fn parse(backend: &BackendConfig) -> Result<Self, HttpConfigError> {
        let url = match backend.url.as_deref().map(str::trim) {
            Some(url) if !url.is_empty() => url.to_owned(),
            _ => {
                return Err(HttpConfigError::invalid(
                    "backend.url",
                    "required with kind = \"redis\" (such as \"redis://127.0.0.1:6379/\")",
                ));
            }
        };
        let urls: Vec<&str> = if backend.cluster {
            seeds(&url).collect()
        } else {
            vec![url.as_str()]
        };
        if urls.is_empty() {
            return Err(HttpConfigError::invalid(
                "backend.url",
                format!("{url:?} names no Cluster node"),
            ));
        }
        for one in urls {
            if let Err(e) = ::redis::Client::open(one) {
                return Err(HttpConfigError::invalid(
                    "backend.url",
                    format!("{one:?} is not a Redis URL ({e})"),
                ));
            }
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
        let policy = match parse_failure(backend.failure.as_deref())? {
            Failure::Closed => FailurePolicy::FailClosed,
            Failure::Open => FailurePolicy::FailOpen,
            Failure::Fallback(share) => FailurePolicy::Fallback { share },
        };
        let deadline = match &backend.deadline {
            None => Duration::from_millis(50),
            Some(d) => parse_period(d, "backend.deadline")?,
        };
        Ok(RedisSettings {
            url,
            cluster: backend.cluster,
            prefix,
            policy,
            deadline,
        })
    }
}

/// The URLs of a Cluster's seed nodes in `url`: comma-separated, blanks ignored.
fn seeds(url: &str) -> impl Iterator<Item = &str> {
    url.split(',').map(str::trim).filter(|u| !u.is_empty())
}

/// On a Redis Cluster, checks that every request's enforced rules have their keys in one slot,
/// as the one script deciding them needs. A rule's keys are `{prefix}:r{id}:{subject}:{alg}`,
/// hashed by the subject alone, and the subject is made of the request's IP, client id and
/// `VERB:path` as the rule's `key` and `per_endpoint` choose: rules that agree on both give a
/// request the same subject, whatever else differs. So every enforced rule that counts (limit
/// above 0) must agree with the first; monitor rules are counted one script each and may differ.
fn check_cluster(config: &HttpConfig) -> Result<(), HttpConfigError> {
    let mut first: Option<(String, RuleKey, bool)> = None;
    for (field, rule) in all_rules(config).filter(|(_, r)| !r.monitor && r.limit > 0) {
        match &first {
            None => first = Some((field, rule.key, rule.per_endpoint)),
            Some((first_field, key, per_endpoint)) => {
                if (rule.key, rule.per_endpoint) != (*key, *per_endpoint) {
                    return Err(HttpConfigError::invalid(
                        field,
                        format!(
                            "counts by key {:?} with per_endpoint = {}, but {first_field} by {key:?} with per_endpoint = {per_endpoint}: with backend.cluster every enforced rule must count alike, so that a request's keys share a Cluster slot",
                            rule.key, rule.per_endpoint
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Every rule of `config` with the name of its field (`ip_rules[0].rules[1]`).
fn all_rules(config: &HttpConfig) -> impl Iterator<Item = (String, &RuleConfig)> {
    let general = config
        .rules
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("rules[{i}]"), r));
    let ip = config.ip_rules.iter().enumerate().flat_map(|(i, entry)| {
        entry
            .rules
            .iter()
            .enumerate()
            .map(move |(j, r)| (format!("ip_rules[{i}].rules[{j}]"), r))
    });
    let client = config
        .client_rules
        .iter()
        .enumerate()
        .flat_map(|(i, entry)| {
            entry
                .rules
                .iter()
                .enumerate()
                .map(move |(j, r)| (format!("client_rules[{i}].rules[{j}]"), r))
        });
    general.chain(ip).chain(client)
}

/// The connection of a limiter that counts in Redis.
pub(crate) struct RedisBackend {
    /// The configured `backend.url` and `backend.cluster`: a reload must name the same.
    pub(crate) url: String,
    pub(crate) cluster: bool,
    pub(crate) connection: Connection,
}

/// Gives every rule of a freshly compiled `set` its limiter in Redis: the limiter of the rule of
/// `old` (the configuration a reload replaces) that counted on the same keys under the same
/// failure policy, deadline and `max_keys_per_rule` (its fallback's cap), reconfigured if its
/// limit changed, or else a new one.
///
/// Kept, a rule keeps what its limiter holds in this process besides the counts in Redis: its
/// deny cache, its [`stats`](RedisLimiter::stats) (and the reported share of them), and under
/// `fallback` the local counts that decide while Redis is away, which a new limiter would start
/// empty: every client would get its share afresh on each reload during an outage. A rule
/// whose prefix changed counts on other keys, so it starts afresh; one whose failure policy,
/// deadline or fallback cap changed too, since all three are fixed when a `RedisLimiter` is
/// built. Nothing is
/// reconfigured unless every rule got its limiter, so that a reload refused here changes no
/// kept limiter.
pub(crate) fn attach<C: Clock>(
    set: &mut RuleSet<C>,
    settings: &RedisSettings,
    backend: &RedisBackend,
    old: Option<&RuleSet<C>>,
) -> Result<(), HttpConfigError> {
    // The old limiters by their keys' prefix, which names the rule's identity, its occurrence
    // and `backend.prefix` together: each taken by at most one new rule.
    let mut kept: HashMap<&str, &Arc<Remote>> = old
        .into_iter()
        .flat_map(RuleSet::all_rules)
        .filter_map(|rule| rule.remote.as_ref())
        .map(|remote| (remote.prefix.as_str(), remote))
        .collect();
    // Limit changes of kept limiters, made once every rule has its limiter.
    let mut pending: Vec<(Arc<Remote>, Algorithm, Arc<str>)> = Vec::new();
    // The fixed selection holds the rules too: let go of it while they change, then make it
    // again from the changed rules.
    set.fixed_enforced = None;
    // How many rules of each identity have been given keys so far: the second and later rules
    // of one identity (the same `ip` listed twice, each with a rule of the default name) take
    // their occurrence into their prefix, so that each counts on its own keys, as each has its
    // own limiter in memory. The first keeps the plain prefix, so that the keys of a
    // configuration without duplicates stay as they were. The order (general rules, then IP
    // rules as listed) is the configuration's, the same in every process; client rules cannot
    // repeat an identity (their ids and, within one id, their names are unique).
    let mut seen: HashMap<Identity, u32> = HashMap::new();
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
            let algorithm = local.algorithm();
            // Under `failure = "fallback"` the rule counts in this process while Redis is
            // away: bounded as the rule is in memory.
            let fallback_keys = local.max_keys();
            let occurrence = seen.entry(rule.identity.clone()).or_insert(0);
            let mut canonical = rule.identity.canonical();
            if *occurrence > 0 {
                let _ = write!(canonical, "\u{0}#{occurrence}");
            }
            *occurrence += 1;
            let digest = Sha256::digest(canonical.as_bytes());
            let mut prefix = format!("{}:r", settings.prefix);
            for byte in &digest[..8] {
                let _ = write!(prefix, "{byte:02x}");
            }
            let same = kept.remove(prefix.as_str()).filter(|r| {
                r.policy == settings.policy
                    && r.deadline == settings.deadline
                    && r.fallback_keys == fallback_keys
            });
            if let Some(remote) = same {
                if remote.limiter.algorithm() != algorithm {
                    pending.push((Arc::clone(remote), algorithm, Arc::clone(&name)));
                }
                rule.remote = Some(Arc::clone(remote));
                continue;
            }
            let remote = RedisLimiter::builder(algorithm, settings.policy)
                .prefix(prefix.clone())
                .deadline(settings.deadline)
                .fallback_max_keys(fallback_keys)
                .build(backend.connection.clone())
                .map_err(|e| {
                    HttpConfigError::invalid(
                        "backend",
                        format!("rule {name:?} cannot count in Redis: {e}"),
                    )
                })?;
            rule.remote = Some(Arc::new(Remote {
                limiter: remote,
                reported: AtomicU64::new(0),
                prefix,
                policy: settings.policy,
                deadline: settings.deadline,
                fallback_keys,
            }));
        }
    }
    for (remote, algorithm, name) in pending {
        // The parameters passed `RedisSettings::check_rules`, and the algorithm's kind is part
        // of the rule's identity (hence of its prefix): not expected to fail.
        if let Err(e) = remote.limiter.reconfigure(algorithm) {
            tracing::warn!(rule = %name, error = %e, "rule kept its previous limit in Redis");
        }
    }
    set.fixed_enforced = set.fixed_selection();
    Ok(())
}

impl Remote {
    /// Reports the failure-policy decisions made since the last report: the difference to the
    /// limiter's own count, so that each decision is reported exactly once even when requests
    /// race.
    fn report<C: Clock>(&self, rule: &Rule<C>) {
        let stats = self.limiter.stats();
        let now = stats.fallbacks + stats.failed_open + stats.failed_closed;
        let before = self.reported.fetch_max(now, Ordering::Relaxed);
        for _ in before..now {
            tracing::warn!(rule = %rule.name, "Redis failed or missed the deadline: the failure policy decided");
            rule.counters.increment(Metric::BackendFallbacks);
        }
    }
}

/// A rule's limiter in Redis, and how many of its failure-policy decisions were reported.
/// Shared by the rule of the same keys in the configurations before and after a reload
/// ([`attach`]), as the limiter's counts are.
pub(crate) struct Remote {
    limiter: RedisLimiter<Connection>,
    reported: AtomicU64,
    /// The limiter's key prefix, policy, deadline and the most clients its fallback counts
    /// (the rule's `max_keys_per_rule`), which a reload compares.
    prefix: String,
    policy: FailurePolicy,
    deadline: Duration,
    fallback_keys: usize,
}

/// One rule to count for a request.
pub(crate) struct Step<C: Clock> {
    pub(crate) rule: Arc<Rule<C>>,
    pub(crate) key: CounterKey,
}

/// One monitor rule to count for a request after the enforced ones admitted it: with the
/// request's key, or none for a rule of limit 0 (it would block whatever the key).
pub(crate) type Monitor<C> = (Arc<Rule<C>>, Option<CounterKey>);

/// The ban bookkeeping of a request, when bans are configured and the client is known.
pub(crate) type BanEntry<C> = Option<(Arc<Bans<C>>, BanKey)>;

/// Counts `plan` (the enforced rules) and then `monitors` in Redis; see the module docs.
pub(crate) fn count<C: Clock>(
    plan: Vec<Step<C>>,
    monitors: Vec<Monitor<C>>,
    ban: BanEntry<C>,
) -> Check {
    Check::Pending(Box::pin(async move {
        let steps: Vec<(&Step<C>, &Remote, String)> = plan
            .iter()
            .filter_map(|s| Some((s, s.rule.remote.as_deref()?, s.key.subject())))
            .collect();
        let quotas = if steps.len() > 1 {
            match count_all(&steps, &ban).await {
                Ok(quotas) => quotas,
                Err(rejected) => return rejected,
            }
        } else {
            let mut quotas = Quotas::with_capacity(steps.len());
            for (step, limiter, subject) in &steps {
                let result = limiter.limiter.try_acquire(subject).await;
                limiter.report(&step.rule);
                quotas.push(quota(&step.rule, &result));
                if let Err(error) = result {
                    return reject(step, error, quotas, &ban);
                }
            }
            quotas
        };
        // The monitor rules' scripts at once, not one after the other: with Redis silent, each
        // waits out its deadline, and in turn they held an admitted request back for one
        // deadline per monitor rule.
        let monitored = monitors.iter().map(|(rule, key)| async move {
            let would_reject = match (rule.remote.as_deref(), key) {
                (Some(limiter), Some(key)) => {
                    let result = limiter.limiter.try_acquire(&key.subject()).await;
                    limiter.report(rule);
                    result.is_err()
                }
                // Limit 0 (no limiter here or in Redis): a block, whatever the key.
                (None, _) => rule.limiter.is_none(),
                (Some(_), None) => false,
            };
            if would_reject {
                tracing::debug!(rule = %rule.name, key = ?key, "monitor rule would reject");
                rule.counters.increment(Metric::ShadowRejected);
            }
        });
        futures_util::future::join_all(monitored).await;
        // Every enforced step admitted and reported a quota.
        for (step, _, _) in &steps {
            step.rule.counters.increment(Metric::Admitted);
        }
        Verdict {
            outcome: Outcome::Admitted,
            quotas,
        }
    }))
}

/// Several enforced rules: one permit from each, all or nothing, in one script (see the module
/// docs). The quotas of every rule, or the rejection by the rule that decided it.
async fn count_all<C: Clock>(
    steps: &[(&Step<C>, &Remote, String)],
    ban: &BanEntry<C>,
) -> Result<Quotas, Verdict> {
    let members: Vec<(&RedisLimiter<Connection>, &[u8])> = steps
        .iter()
        .map(|(_, remote, subject)| (&remote.limiter, subject.as_bytes()))
        .collect();
    // Every rule's deny cache first, not only until one denies (as the script's call would
    // settle it): of the rules known to refuse, the one that asks to wait longest is named,
    // as when Redis decides. The first denying rule listed named a short wait while another
    // rule's cache knew of a longer one, and a client that waited as told was refused again.
    let denied: Vec<_> = members
        .iter()
        .map(|member| {
            settled(std::slice::from_ref(member), 1).and_then(|answers| answers.into_iter().next())
        })
        .collect();
    let mut answers = if denied.iter().any(Option::is_some) {
        denied.into_iter().map(Option::flatten).collect()
    } else {
        try_acquire_all(&members, 1).await
    };
    let mut quotas = Quotas::with_capacity(steps.len());
    for ((step, remote, _), answer) in steps.iter().zip(&answers) {
        remote.report(&step.rule);
        if let Some(answer) = answer {
            quotas.push(quota(&step.rule, answer));
        }
    }
    // The rule named is the first whose policy failed it, or else the one that asks to wait
    // longest (its Retry-After covers every rule that rejected).
    let retry = |a: &Option<Result<_, TryAcquireError>>| match a {
        Some(Err(TryAcquireError::Rejected(r))) => Some(r.retry_after()),
        _ => None,
    };
    let failed = answers
        .iter()
        .position(|a| matches!(a, Some(Err(e)) if !matches!(e, TryAcquireError::Rejected(_))));
    let longest = answers
        .iter()
        .enumerate()
        .filter_map(|(i, a)| Some((retry(a)?, i)))
        .max_by_key(|&(retry_after, i)| (retry_after, std::cmp::Reverse(i)))
        .map(|(_, i)| i);
    match failed.or(longest) {
        None => Ok(quotas),
        Some(i) => match answers[i].take() {
            Some(Err(error)) => Err(reject(steps[i].0, error, quotas, ban)),
            _ => Ok(quotas), // not reached: `i` holds an error
        },
    }
}

/// A rule's quota after `answer`: what is left, or 0 until the retry-after (the period when
/// there is none).
fn quota<C: Clock>(rule: &Rule<C>, answer: &Result<Admission, TryAcquireError>) -> QuotaState {
    match answer {
        Ok(admission) => rule.quota(u64::from(admission.remaining()), admission.reset_after()),
        Err(TryAcquireError::Rejected(r)) => rule.quota(0, r.retry_after()),
        Err(_) => rule.quota(0, rule.period),
    }
}

/// The rejection of a request by `step`'s rule with `error`; `quotas` include that rule's.
fn reject<C: Clock>(
    step: &Step<C>,
    error: TryAcquireError,
    quotas: Quotas,
    ban: &BanEntry<C>,
) -> Verdict {
    let rule = &step.rule;
    let (reason, retry_after) = match error {
        TryAcquireError::Rejected(r) => (RejectReason::RateLimited, Some(r.retry_after())),
        // The fallback of `failure = "fallback"`, full of active clients.
        TryAcquireError::TooManyKeys { .. } => (RejectReason::TooManyKeys, None),
        _ => (RejectReason::Unavailable, None),
    };
    tracing::debug!(rule = %rule.name, key = ?step.key, error = %error, "request rejected (Redis)");
    rule.counters.increment(Metric::Rejected);
    if let (Some((bans, client)), RejectReason::RateLimited) = (ban, reason) {
        bans.count_rejection(client, &rule.counters);
    }
    Verdict {
        outcome: Outcome::Rejected {
            reason,
            rule: rule.local_name(),
            retry_after,
        },
        quotas,
    }
}
