//! Counting in Redis (features `envoy` and `redis`): a `RedisLimiter` per configured limit, on a
//! standalone server or a Redis Cluster.

use super::config::{RlsConfig, RlsConfigError};
use super::metrics::Decision;
use super::proto::{Code, Entry, RateLimitOverride, RateLimitRequest, RateLimitResponse, Unit};
use super::service::{
    Applied, Overrides, counter_entries, hits_of, override_applied, resolve, status, window_left,
};
pub(crate) use crate::backend::Connection;
use crate::backend::{Held, Over, settled, try_acquire_all_held};
use crate::redis::cluster_routing::Slot;
use crate::{Admission, Algorithm, ConfigError, FailurePolicy, TryAcquireError};
use futures_util::future::{join, join_all};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// The service's limiters in Redis, whichever the connection.
pub(crate) type RedisLimiter = crate::RedisLimiter<Connection>;

pub(crate) struct Remote {
    connection: Connection,
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
    /// Admitted in its slot, then given back (another slot rejected the request): the
    /// admission, and what it is left with now.
    GivenBack(Admission, u32),
    /// Would have admitted, in a script another member of rejected: nothing was taken, and the
    /// admission reports the count as it was before the request.
    Untouched(Admission),
}

/// A call's answers as the descriptors get them: when the script rejected, its admitting
/// members took nothing (`Untouched`).
fn answers_of(
    got: Vec<Option<Result<Admission, TryAcquireError>>>,
) -> impl Iterator<Item = Option<Answer>> {
    let all = got.iter().all(|a| matches!(a, Some(Ok(_))));
    got.into_iter().map(move |result| {
        result.map(|result| match result {
            Ok(a) if !all => Answer::Untouched(a),
            result => Answer::Got(result),
        })
    })
}

impl Remote {
    pub(super) fn new(
        connection: Connection,
        prefix: String,
        policy: FailurePolicy,
    ) -> Result<Self, RlsConfigError> {
        crate::RedisLimiter::builder(
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
        crate::RedisLimiter::builder(Algorithm::FixedWindow { limit, window }, self.policy)
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

    /// Decides the enforced descriptors `group` (index, limiter), each costing `hits[i]` on
    /// `subjects[i]`, into `answers`: one multi-limiter script per Cluster slot and cost (on a
    /// standalone server, per cost), and one per occurrence of a counter named at two costs
    /// or more, the scripts in parallel. When one rejects, the others give
    /// back what they took, so that the request costs nothing (see `RlsService::with_redis`).
    /// `rejected`: another descriptor has rejected the request already (a check, or one decided
    /// without Redis): the calls are sent all the same, so that the descriptors over their
    /// limit count their hits (as in memory, where every descriptor is decided), each asking
    /// its script to take nothing from the members that admit ([`Over::CountedOnly`]): one
    /// round trip, nothing to give back. But when a counter is named in two calls, they take
    /// and give back as for an admission, so that the later call meets the earlier's hits.
    async fn enforce(
        &self,
        group: &[(usize, &RedisLimiter)],
        subjects: &[Vec<u8>],
        hits: &[u64],
        answers: &mut [Answer],
        rejected: bool,
    ) {
        let cluster = matches!(self.connection, Connection::Cluster(_));
        // A counter named at two costs or more: each of its occurrences is a call of its own,
        // the calls sent in the request's order (one connection to the counter's node keeps
        // them in that order), so that each occurrence meets the hits of those named before
        // it, as in memory and in Envoy's service, which decide and count them in order.
        // Grouped by cost, an occurrence named later at an earlier call's cost was decided
        // before the ones between (`[1, 10, 1]`: the last admitted; `[5, 1]` after a cost of
        // 1: 4 left, then 9), and one in a call another member rejected took nothing, so
        // that a later cost did not meet it. Alone, no other member decides its call.
        let key = |k: usize| group[k].1.key(subjects[group[k].0].as_slice());
        let mut costs: HashMap<Vec<u8>, u64> = HashMap::new();
        let mut alone: Vec<Vec<u8>> = Vec::new();
        for (k, &(i, _)) in group.iter().enumerate() {
            let key = key(k);
            match costs.get(&key) {
                Some(&h) if h != hits[i] => alone.push(key),
                Some(_) => {}
                None => {
                    costs.insert(key, hits[i]);
                }
            }
        }
        // The calls, in the order first met: slot (on a Cluster), cost, members (in `group`),
        // and whether the call is one occurrence's alone (closed to any other member).
        let mut calls: Vec<(Option<Slot>, u64, Vec<usize>)> = Vec::new();
        let mut closed: Vec<bool> = Vec::new();
        for (k, &(i, _)) in group.iter().enumerate() {
            let key = key(k);
            let slot = cluster.then(|| Slot::for_key(&key));
            let own = alone.contains(&key);
            let open = (calls.iter_mut().zip(&closed))
                .find(|((s, h, _), closed)| !own && !**closed && *s == slot && *h == hits[i]);
            match open {
                Some(((_, _, ks), _)) => ks.push(k),
                None => {
                    calls.push((slot, hits[i], vec![k]));
                    closed.push(own);
                }
            }
        }
        // At most the limit's capacity, a u32 (checked before).
        let cost = |h: u64| u32::try_from(h).unwrap_or(u32::MAX);
        let members: Vec<Vec<(&RedisLimiter, &[u8])>> = (calls.iter())
            .map(|(_, _, ks)| {
                (ks.iter())
                    .map(|&k| (group[k].1, subjects[group[k].0].as_slice()))
                    .collect()
            })
            .collect();
        let mut set = |ks: &[usize], got: Vec<Option<Result<Admission, TryAcquireError>>>| {
            for (&k, answer) in ks.iter().zip(answers_of(got)) {
                if let Some(answer) = answer {
                    answers[group[k].0] = answer;
                }
            }
        };
        if let [(_, h, ks)] = &calls[..] {
            // One script decides a counter named more than once in turn (see members.lua).
            let over = if rejected {
                Over::CountedOnly
            } else {
                Over::Counted
            };
            set(
                ks,
                try_acquire_all_held(&members[0], cost(*h), &[], over)
                    .await
                    .0,
            );
            return;
        }
        // A deny cache that settles one call settles the request: no call is sent.
        for ((_, h, ks), m) in calls.iter().zip(&members) {
            if let Some(got) = settled(m, cost(*h)) {
                set(ks, got);
                return;
            }
        }
        // Each call's keys, so that a call whose key another call also counts (one counter
        // named at two costs) does not cache a rejection that may count the other's hits,
        // given back after.
        let keys: Vec<Vec<Vec<u8>>> = (members.iter())
            .map(|m| (m.iter()).flat_map(|(l, s)| l.keys(*s)).collect())
            .collect();
        let elsewhere: Vec<Vec<Vec<u8>>> = (0..keys.len())
            .map(|c| {
                (keys.iter().enumerate())
                    .filter(|&(other, _)| other != c)
                    .flat_map(|(_, k)| k.iter().cloned())
                    .collect()
            })
            .collect();
        // A request rejected already takes nothing from the members that admit
        // (`CountedOnly`), unless a counter is named in two calls (at two costs): there the
        // later call must meet the earlier one's hits, as in memory, where every descriptor is
        // decided in turn (4 then 8 hits at 0 of 10: the 8 are over and count), so the calls
        // take as for an admission and give back below.
        let shared_counter = (keys.iter().zip(&elsewhere))
            .any(|(own, others)| own.iter().any(|k| others.contains(k)));
        let over = if rejected && !shared_counter {
            Over::CountedOnly
        } else {
            Over::Counted
        };
        let calls_held: Vec<_> = (calls.iter().zip(&members).zip(&elsewhere))
            .map(|(((_, h, _), m), elsewhere)| try_acquire_all_held(m, cost(*h), elsewhere, over))
            .collect();
        let held = join_all(calls_held).await;
        let admitted = |got: &[Option<Result<Admission, TryAcquireError>>]| {
            got.iter().all(|a| matches!(a, Some(Ok(_))))
        };
        // Every call admitted (the request not rejected already), or none took anything
        // (`CountedOnly`): nothing to give back.
        if over == Over::CountedOnly || (!rejected && held.iter().all(|(got, _)| admitted(got))) {
            for ((_, _, ks), (got, _)) in calls.iter().zip(held) {
                set(ks, got);
            }
            return;
        }
        let giving: Vec<_> = (held.into_iter().zip(&members))
            .map(|((got, held), m): ((_, Held), _)| async move {
                let back = if admitted(&got) {
                    held.give_back(m).await
                } else {
                    // Rejected: it took nothing, and its admitting members answered their
                    // state untouched.
                    vec![false; got.len()]
                };
                (got, back)
            })
            .collect();
        // A counter named more than once (in one call, or in calls of different costs) took
        // its hits one occurrence after another: the one that ran first saw the count as
        // before the request, the others less by what the ones before them took. All of it is
        // given back, so each occurrence answers the most any of them saw before its own hits.
        let mut before: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut given = Vec::new();
        for ((_, h, ks), (got, back)) in calls.iter().zip(join_all(giving).await) {
            for ((&k, answer), back) in ks.iter().zip(answers_of(got)).zip(back) {
                let (i, l) = group[k];
                answers[i] = match answer {
                    Some(Answer::Got(Ok(a))) if back => {
                        let left = a.remaining().saturating_add(cost(*h)).min(l.capacity());
                        let key = l.key(subjects[i].as_slice());
                        let most = before.entry(key.clone()).or_insert(left);
                        *most = (*most).max(left);
                        given.push((i, key));
                        Answer::GivenBack(a, left)
                    }
                    Some(answer) => answer,
                    None => continue,
                };
            }
        }
        for (i, key) in given {
            if let (Answer::GivenBack(_, left), Some(&most)) = (&mut answers[i], before.get(&key)) {
                *left = most;
            }
        }
    }

    /// Decides `request` (already validated) against `counters`; `now` (Unix nanoseconds)
    /// only for the windows of descriptors decided without Redis.
    pub(super) async fn decide(
        &self,
        config: &RlsConfig,
        counters: &[Option<RedisLimiter>],
        request: &RateLimitRequest,
        now: u64,
        near_ratio: f32,
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

        // Decided here: no limit, unlimited, limit 0 (a check too, as one hit would be), more
        // hits than the limit (counted past it below, when enforced).
        let mut answers: Vec<Answer> = (applied.iter().zip(&hits))
            .map(|(a, &n)| match a {
                Applied::Nothing => Answer::Nothing,
                Applied::Unlimited(_) => Answer::Unlimited,
                Applied::Limit { spec, limiter, .. } => {
                    let reset = window_left(spec.unit(), now);
                    match limiter {
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
        // Hits on a counter named after a cost above its whole limit meet that cost, which
        // counts past the limit (below): over, as in memory, where the descriptors with hits
        // are decided in turn, and as in Envoy's service (11 then 3 hits of 10: both over).
        // Asked of Redis, the later one was decided beside the charge, at the count before it.
        // Shadow descriptors too (their charges are sent beside their scripts, on an admitted
        // request): the later one answered what the count left before the charge (`[11, 1]` of
        // a limit of 3: 2 left, where memory and Envoy's service answer 0 left).
        // (A check reads the count as it was before the request, wherever it is named.)
        let mut charged_above: Vec<Vec<u8>> = Vec::new();
        for i in 0..answers.len() {
            let (Some(l), Applied::Limit { spec, .. }) = (limiter(i), &applied[i]) else {
                continue;
            };
            let key = l.key(subjects[i].as_slice());
            if matches!(answers[i], Answer::NotAsked) && hits[i] > 0 && charged_above.contains(&key)
            {
                answers[i] = Answer::Over(window_left(spec.unit(), now));
            } else if hits[i] > u64::from(l.capacity()) {
                charged_above.push(key);
            }
        }

        // One round trip per descriptor `which` picks among those not yet asked, all in flight
        // at once: a check (0 hits) answers as one hit would, over once the count has reached
        // the limit (or the failure policy refuses); hits answer as decided.
        let ask = |answers: &[Answer], which: &dyn Fn(usize) -> bool| {
            (0..answers.len())
                .filter(|&i| matches!(answers[i], Answer::NotAsked) && which(i))
                .filter_map(|i| limiter(i).map(|l| (i, l)))
                .map(|(i, l)| {
                    let subject = subjects[i].as_slice();
                    let unit = match &applied[i] {
                        Applied::Limit { spec, .. } => spec.unit(),
                        _ => Unit::Second,
                    };
                    let n = u32::try_from(hits[i]).unwrap_or(u32::MAX);
                    async move {
                        let got = l.try_acquire_n(subject, n).await;
                        let answer = match got {
                            _ if n > 0 => Answer::Got(got),
                            Ok(a) => Answer::Within(a.remaining(), a.reset_after()),
                            Err(TryAcquireError::Rejected(r)) => Answer::Over(r.retry_after()),
                            Err(_) => Answer::Over(window_left(unit, now)),
                        };
                        (i, answer)
                    }
                })
                .collect::<Vec<_>>()
        };

        // Checks first: an enforced one that is over rejects the request before any hit is
        // taken, as any descriptor over its limit does.
        for (i, answer) in join_all(ask(&answers, &|i| hits[i] == 0)).await {
            answers[i] = answer;
        }

        // The enforced descriptors: one script per Cluster slot (one in all on a standalone
        // server) and per cost, in parallel; all or nothing across them by giving back. Sent
        // even when the request is rejected already, so that those over their limit count
        // (taking nothing from the others: `Over::CountedOnly`).
        let group: Vec<(usize, &RedisLimiter)> = (0..answers.len())
            .filter(|&i| matches!(answers[i], Answer::NotAsked) && !shadow(i) && hits[i] > 0)
            .filter_map(|i| limiter(i).map(|l| (i, l)))
            .collect();
        let over = enforced_over(&answers);
        // Enforced descriptors of more hits than their limit, decided without Redis, count them
        // all the same, past the limit (the scripts count the other rejecting ones): as Envoy's
        // service counts them, so that the checks and hits after them are over until the
        // window ends. A failed charge leaves the request rejected all the same. Sent in the
        // same round as the scripts, whose answers they do not change: a silent Redis then
        // holds the request one deadline, not two. But a charge on a counter a script counts
        // too (named before it: hits named after it are over, above) goes after the scripts,
        // which decide at the count before it, as in memory (1 then 11 hits of 10: OK, then
        // over); in the same round, the two raced, and the 1 could meet the 11.
        let in_scripts: Vec<Vec<u8>> = (group.iter())
            .map(|&(i, l)| l.key(subjects[i].as_slice()))
            .collect();
        let (after, beside): (Vec<_>, Vec<_>) = (0..answers.len())
            .filter(|&i| matches!(answers[i], Answer::Over(_)) && !shadow(i) && hits[i] > 0)
            .filter_map(|i| limiter(i).map(|l| (i, l)))
            .map(|(i, l)| {
                let subject = subjects[i].as_slice();
                let late = in_scripts.contains(&l.key(subject));
                (
                    late,
                    l.charge(subject, u32::try_from(hits[i]).unwrap_or(u32::MAX)),
                )
            })
            .partition(|(late, _)| *late);
        join(
            self.enforce(&group, &subjects, &hits, &mut answers, over),
            join_all(beside.into_iter().map(|(_, charge)| charge)),
        )
        .await;
        join_all(after.into_iter().map(|(_, charge)| charge)).await;
        let rejected = enforced_over(&answers);

        // Shadow descriptors of an admitted request (their checks were asked with the others),
        // each in a script of its own that counts its hits past the limit when it is over
        // (`Over::Counted`), and those of more hits than their limit by a charge: as enforced
        // ones count (and as Envoy's service counts them: shadow mode changes only the
        // answer), so that they measure what enforcing would do.
        if !rejected {
            let subjects = &subjects;
            let scripts = (0..answers.len())
                .filter(|&i| matches!(answers[i], Answer::NotAsked) && shadow(i) && hits[i] > 0)
                .filter_map(|i| limiter(i).map(|l| (i, l)))
                .map(|(i, l)| {
                    let n = u32::try_from(hits[i]).unwrap_or(u32::MAX);
                    async move {
                        let member = [(l, subjects[i].as_slice())];
                        let (got, _) = try_acquire_all_held(&member, n, &[], Over::Counted).await;
                        (i, got.into_iter().next().flatten())
                    }
                });
            let charges = (0..answers.len())
                .filter(|&i| matches!(answers[i], Answer::Over(_)) && shadow(i) && hits[i] > 0)
                .filter_map(|i| limiter(i).map(|l| (i, l)))
                .map(|(i, l)| {
                    l.charge(
                        subjects[i].as_slice(),
                        u32::try_from(hits[i]).unwrap_or(u32::MAX),
                    )
                });
            let (got, _) = join(join_all(scripts), join_all(charges)).await;
            for (i, got) in got {
                if let Some(got) = got {
                    answers[i] = Answer::Got(got);
                }
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
                        Answer::Got(Ok(a)) | Answer::GivenBack(a, _) => Some(
                            u64::from(limit.saturating_sub(a.remaining())).saturating_sub(hits[i]),
                        ),
                        Answer::Untouched(a) => {
                            Some(u64::from(limit.saturating_sub(a.remaining())))
                        }
                        Answer::Over(_) | Answer::Got(Err(_)) => Some(u64::from(limit)),
                        _ => None,
                    };
                    if let Some(before) = before {
                        let entries = counter_entries(&request.descriptors[i].entries, shared);
                        let decision = Decision {
                            limit,
                            before,
                            hits: hits[i],
                            over: !matches!(
                                answer,
                                Answer::Got(Ok(_)) | Answer::GivenBack(..) | Answer::Untouched(_)
                            ),
                            shadow: shadow(i),
                            near_ratio,
                        };
                        spec.count(&request.domain, &entries, !shared.is_empty(), decision);
                    }
                }
                match answer {
                    Answer::Nothing => status(Code::Ok, None, 0, None),
                    Answer::Unlimited => status(Code::Ok, None, u32::MAX, None),
                    Answer::NotAsked => status(Code::Ok, current, 0, None),
                    Answer::Within(left, reset) => status(Code::Ok, current, left, Some(reset)),
                    Answer::Over(reset) => status(over, current, 0, Some(reset)),
                    Answer::Got(Ok(a)) | Answer::Untouched(a) => {
                        status(Code::Ok, current, a.remaining(), Some(a.reset_after()))
                    }
                    Answer::GivenBack(a, left) => {
                        status(Code::Ok, current, left, Some(a.reset_after()))
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
