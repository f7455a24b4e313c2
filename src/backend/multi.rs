//! Several [`RedisLimiter`]s, each with its own subject (and prefix, and algorithm), decided all
//! or nothing in one script, `scripts/multi.lua`: see [`try_acquire_all`]. For callers whose
//! members lie in several Cluster slots (one call per slot): [`settled`] and
//! [`try_acquire_all_held`], whose [`Held`] gives back what an admitted call took.

use super::keys::Tag;
use super::{
    ADMITTED, Config, Failure, Lua, MULTI, REJECTED, RedisLimiter, keys, parse, run, within,
};
use crate::chain::Taken;
use crate::decision::Admission;
use crate::error::TryAcquireError;
use crate::sync::Arc;
use ::redis::aio::ConnectionLike;
use std::ops::Deref;
use std::sync::LazyLock;
use std::time::Instant;

/// What a call of [`try_acquire_all_held`] does with a member that rejects, and with the
/// others: `multi.lua`'s last argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "envoy"), allow(dead_code))]
pub(crate) enum Over {
    /// A member that rejects takes nothing (the HTTP layer's rules: a rejection costs nothing).
    Free,
    /// A member that rejects counts its `n` all the same, past its limit, in the same script
    /// (as Envoy's rate limit service counts a descriptor's hits whether or not they fit); the
    /// members that would have admitted take nothing.
    Counted,
    /// As `Counted`, for a call whose decision the caller has rejected already (another
    /// descriptor is over): the call takes nothing from the members that admit, and is sent
    /// only so that those over their limit count.
    CountedOnly,
}

/// One member's answer from [`try_acquire_all`]: `None` if it was not decided.
pub(crate) type Answer = Option<Result<Admission, TryAcquireError>>;

/// `scripts/give_back.lua`: see [`Held::give_back`].
static GIVE_BACK: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("scripts/give_back.lua")));

/// What one member of a call took, for [`Held::give_back`].
enum Took {
    /// Nothing: the call was rejected or settled before the round trip, or the member's
    /// failure policy admitted it open.
    Nothing,
    /// `n` in Redis: in the fixed window ending at the first time (µs since the Unix epoch),
    /// admitted at the second (the script's `now`: a key created after it is not the one that
    /// counted the `n`), or `None` for another algorithm or a chain, which cannot be given back.
    Redis(Option<(u64, u64)>),
    /// `n` from the member's local fallback, while Redis failed.
    Fallback(Taken),
}

/// What a [`try_acquire_all_held`] call took from each member, to give back when the caller
/// rejects the decision after all (another call of the same decision, in another Cluster slot,
/// rejected).
#[cfg_attr(not(feature = "envoy"), allow(dead_code))]
pub(crate) struct Held {
    n: u32,
    /// The members' parameters the call decided under (empty if it was settled before).
    configs: Vec<Arc<Config>>,
    took: Vec<Took>,
}

#[cfg_attr(not(feature = "envoy"), allow(dead_code))]
impl Held {
    /// A call that took nothing.
    fn nothing() -> Self {
        Held {
            n: 0,
            configs: Vec::new(),
            took: Vec::new(),
        }
    }

    /// Gives back to each member what the call took from it (`members` as given to the call):
    /// to a local fallback at once, and in Redis in one `give_back.lua` round trip over every
    /// key (which must share a slot on a Cluster, as the call's did) through the first
    /// member's connection, within the smallest deadline of the members. Answers per member
    /// whether it now holds nothing of the call: `false` for a fixed window whose script
    /// failed or missed the deadline (the charge stays, unless a script that missed it runs
    /// late and gives it back after all), and for another algorithm or a
    /// chain (only fixed windows are given back). A window that has ended meanwhile is left
    /// alone and answers `false` as well: its count is gone with it. So is a key created again
    /// after the admission in the same window (reset, expired or evicted, then written): it
    /// counts only what came since, and given the `n` back it admitted `n` past its limit in
    /// that window; and a key an older version wrote, which does not say when it was created
    /// (`b` in `fixed_window.lua`). Counts nothing in
    /// [`stats`](RedisLimiter::stats): each member counted the admission its call made, and
    /// keeps it counted as admitted, as a refunded admission stays counted in memory
    /// ([`Refundable::refund`](crate::Refundable::refund), which the in-memory Envoy service
    /// gives a descriptor's hits back with). A member's stats count what its own call decided;
    /// the request's rejection is another call's (and the Envoy metrics count a descriptor
    /// given back within its limit too, as Envoy counts it).
    ///
    /// # Cancel safety
    ///
    /// Dropped after the script was sent, the keys may or may not have been given back.
    pub(crate) async fn give_back<C>(self, members: &[(&RedisLimiter<C>, &[u8])]) -> Vec<bool>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let n = self.n;
        let mut given = vec![true; members.len()];
        // The fixed windows to give back in Redis: their keys, (window end, admission time)
        // and members.
        let mut keys = Vec::new();
        let mut windows = Vec::new();
        let mut whose = Vec::new();
        for (i, (((limiter, subject), config), took)) in
            (members.iter().zip(&self.configs).zip(self.took)).enumerate()
        {
            match took {
                Took::Nothing => {}
                Took::Fallback(taken) => {
                    limiter
                        .inner
                        .give_back(config, &Tag::of(subject), n, &taken);
                }
                Took::Redis(None) => given[i] = false,
                Took::Redis(Some(window)) => {
                    let suffix = &config.members[0].suffix;
                    keys.push(keys::key(&limiter.inner.prefix, &Tag::of(subject), suffix));
                    windows.push(window);
                    whose.push(i);
                    given[i] = false;
                }
            }
        }
        let Some((first, _)) = members.first().filter(|_| !keys.is_empty()) else {
            return given;
        };
        let deadline =
            (members.iter().map(|(l, _)| l.inner.deadline).min()).unwrap_or(first.inner.deadline);
        let round_trip = run(&first.inner.connection, &GIVE_BACK, keys.len(), |cmd| {
            for key in &keys {
                cmd.arg(key);
            }
            cmd.arg(n);
            for (end, at) in &windows {
                cmd.arg(*end).arg(*at);
            }
        });
        if let Ok(reply) = within(deadline, round_trip).await
            && reply.len() == whose.len()
        {
            for (&i, &flag) in whose.iter().zip(&reply) {
                given[i] = flag == 1;
            }
        }
        given
    }
}

/// What is settled of a call for `n` before any round trip, as [`try_acquire_all`] settles it:
/// `Some` (the answers it would give: the denying or too small member its error, the others
/// `None`) if a member's deny cache denies its subject (counted as denied locally) or `n`
/// exceeds a member's capacity; `None` if the call must ask Redis. For a caller making several
/// calls of one decision, so that it sends none when one is settled.
#[cfg_attr(not(any(feature = "envoy", feature = "http")), allow(dead_code))]
pub(crate) fn settled<C>(members: &[(&RedisLimiter<C>, &[u8])], n: u32) -> Option<Vec<Answer>> {
    let loaded: Vec<_> = members.iter().map(|(l, _)| l.inner.config.load()).collect();
    settle(&tagged(members), &loaded, n, Instant::now())
}

/// `members` with their subjects' tags, each computed once for the whole call.
fn tagged<'a, C>(
    members: &[(&'a RedisLimiter<C>, &'a [u8])],
) -> Vec<(&'a RedisLimiter<C>, Tag<'a>)> {
    members.iter().map(|&(l, s)| (l, Tag::of(s))).collect()
}

/// [`settled`], under the parameters `loaded` (one per member) at `sent`.
fn settle<C, G>(
    members: &[(&RedisLimiter<C>, Tag<'_>)],
    loaded: &[G],
    n: u32,
    sent: Instant,
) -> Option<Vec<Answer>>
where
    G: Deref<Target = Arc<Config>>,
{
    for (i, ((limiter, subject), config)) in members.iter().zip(loaded).enumerate() {
        if let Err(error) = limiter.inner.before(config, subject, n, sent, true) {
            let mut answers: Vec<Answer> = members.iter().map(|_| None).collect();
            answers[i] = Some(Err(error));
            return Some(answers);
        }
    }
    None
}

/// Takes `n` permits from every `(limiter, subject)` of `members` if every one admits them, and
/// otherwise from none: one `EVALSHA` for all (plus an `EVAL` after Redis lost its script
/// cache), in which every member decides on the state before any write (a key listed more than
/// once, by one limiter and subject listed twice or two limiters sharing a prefix, is decided in
/// order, each occurrence seeing what the one before it took). The limiters must count
/// on one standalone server (their keys may lie in any slot), or on a Cluster with every key
/// in one slot (the HTTP layer checks that its rules' keys share one: `check_cluster`): the
/// first member's connection sends the script, within the smallest deadline of the members. Answers one entry per member,
/// in order; the call admitted if and only if every entry is `Some(Ok(_))`.
///
/// - **Admitted**: each member's admission (its `remaining` after taking `n`, its
///   `reset_after`); each limiter counts an admission.
/// - **Rejected by Redis**: nothing was taken. A member that rejected answers its rejection
///   (exact retry-after, remembered by its deny cache as in
///   [`RedisLimiter::try_acquire_n`], unless one of its keys is listed more than once: that
///   retry-after may count what an earlier occurrence took); a member that would have admitted
///   answers its state as it stands, untouched (an admission whose `remaining` includes the `n`
///   not taken). Every limiter counts a rejection.
/// - **Settled before the round trip**: `n` above a member's capacity, or a member whose deny
///   cache denies its subject: that member answers the error, the others `None`, and nothing is
///   sent (only the denying limiter counts, as denied locally). The deny cache is never stricter
///   than Redis, so this rejects only calls that Redis would reject.
/// - **Redis failed or missed the deadline**: every limiter counts the error (or timeout) and
///   one decision of its own [`FailurePolicy`](crate::FailurePolicy) (so `stats()` shows one
///   fallback, fail-open or fail-closed decision per member). All or nothing still: unless a
///   member fails closed, the members take `n` one after the other (a fallback limiter from its
///   local state), and when one rejects, the fallback limiters of the members before it give
///   back what they took; the rejecting member answers its rejection and the others their
///   policy's answer to a probe. A concurrent call in this process that finds a permit taken
///   in between is rejected (and may succeed on its retry), never charged for it.
///
/// # Cancel safety
///
/// As [`RedisLimiter::try_acquire_n`]: once sent, the script may run and admit even if the
/// future is dropped.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) async fn try_acquire_all<C>(members: &[(&RedisLimiter<C>, &[u8])], n: u32) -> Vec<Answer>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    try_acquire_all_held(members, n, &[], Over::Free).await.0
}

/// [`try_acquire_all`], and what the call took from each member, so that the caller can give
/// it back ([`Held::give_back`]) if it rejects the decision after all. `elsewhere` are the keys
/// of the decision's other calls, which may take from a key of this call before it decides and
/// give it back after: a member with such a key keeps its rejection out of the deny cache, as
/// one with a key this call lists twice does (that retry-after may count hits given back).
/// `over`: what the call does with a member that rejects, and with the others ([`Over`]); a
/// call the deny caches settle is not sent, so counts nothing. When Redis fails, `over` asks
/// nothing more of the failure policies (no fallback counts past its limit), but a
/// `CountedOnly` call takes nothing from the fallbacks either: each member answers its own
/// verdict, and what a fallback took to decide it is given back before the call returns.
///
/// # Cancel safety
///
/// As [`try_acquire_all`].
pub(crate) async fn try_acquire_all_held<C>(
    members: &[(&RedisLimiter<C>, &[u8])],
    n: u32,
    elsewhere: &[Vec<u8>],
    over: Over,
) -> (Vec<Answer>, Held)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let Some(&(first, _)) = members.first() else {
        return (Vec::new(), Held::nothing());
    };
    let members = &tagged(members)[..];
    // Each limiter's parameters in force now: the whole call decides under these snapshots,
    // borrowed (as `RedisLimiter::decide` borrows its one) until the deny caches have had
    // their say, so that a call they reject writes no reference count other threads read.
    let loaded: Vec<_> = members.iter().map(|(l, _)| l.inner.config.load()).collect();
    let sent = Instant::now();
    if let Some(answers) = settle(members, &loaded, n, sent) {
        return (answers, Held::nothing());
    }
    let configs: Vec<Arc<Config>> = loaded
        .into_iter()
        .map(arc_swap::Guard::into_inner)
        .collect();
    let deadline = members
        .iter()
        .map(|(l, _)| l.inner.deadline)
        .min()
        .unwrap_or(first.inner.deadline);
    // Every member's keys, in the script's order.
    let each: Vec<Vec<Vec<u8>>> = members
        .iter()
        .zip(&configs)
        .map(|((limiter, subject), config)| {
            let prefix = &limiter.inner.prefix;
            (config.members.iter())
                .map(|member| keys::key(prefix, subject, &member.suffix))
                .collect()
        })
        .collect();
    let keys: usize = each.iter().map(Vec::len).sum();
    let round_trip = run(&first.inner.connection, &MULTI, keys, |cmd| {
        for key in each.iter().flatten() {
            cmd.arg(key);
        }
        cmd.arg(n);
        for config in &configs {
            for member in &config.members {
                let plan = &member.plan;
                cmd.arg(plan.kind).arg(plan.params[0]).arg(plan.params[1]);
            }
        }
        match over {
            Over::Free => {}
            Over::Counted => {
                cmd.arg(1);
            }
            Over::CountedOnly => {
                cmd.arg(2);
            }
        }
    });
    let reply = within(deadline, round_trip)
        .await
        .and_then(|reply| split(repaired(members, &reply, keys), keys));
    let (all, decisions) = match reply {
        Ok(reply) => reply,
        Err(failure) => {
            let (answers, took) = fail_all(members, &configs, failure, n, over);
            let held = Held { n, configs, took };
            return (answers, held);
        }
    };
    let mut decisions = decisions.into_iter();
    let mut took = Vec::with_capacity(members.len());
    let answers = members
        .iter()
        .zip(&each)
        .zip(&configs)
        .map(|(((limiter, subject), own), config)| {
            let inner = &limiter.inner;
            let mut admitted: Option<(u64, u64, u32)> = None;
            let mut worst: Option<(u64, usize)> = None;
            // A chain's keys answer together: the largest retry-after (and the member, 1-based,
            // that gave it), or the smallest remaining and the largest reset.
            for (k, decision) in decisions.by_ref().take(config.members.len()).enumerate() {
                match decision {
                    Ok((at, reset, remaining)) => {
                        admitted = Some(match admitted {
                            None => (at, reset, remaining),
                            Some((at, r, m)) => (at, r.max(reset), m.min(remaining)),
                        });
                    }
                    Err((retry_after, _)) => {
                        if worst.is_none_or(|(w, _)| retry_after > w) {
                            worst = Some((retry_after, k + 1));
                        }
                    }
                }
            }
            // Taken only when every member admitted; a lone fixed window's admission ends
            // with its window, whose end (in µs, as the key keeps it) names what to give back,
            // and the admission's time (µs) the key that counted it.
            took.push(match admitted {
                Some((at, reset, _)) if all && worst.is_none() => {
                    let fixed = matches!(&config.members[..], [m] if m.plan.kind == 1);
                    Took::Redis(fixed.then(|| (at.saturating_add(reset) / 1000, at / 1000)))
                }
                _ => Took::Nothing,
            });
            Some(match (worst, admitted) {
                (Some((retry_after, member)), _) => {
                    // A key that the call lists more than once may have been decided on what
                    // an earlier occurrence took (then put back), and one that another call of
                    // the decision lists on what that call took (then given back): that
                    // retry-after is not one for `n` on the subject as it stands, and the deny
                    // cache keeps none of it.
                    let remember = !own.iter().any(|key| {
                        elsewhere.contains(key)
                            || each.iter().flatten().filter(|other| *other == key).count() > 1
                    });
                    Err(inner.rejected(config, subject, n, sent, retry_after, member, remember))
                }
                (None, Some((at, reset, remaining))) => {
                    inner.count(if all { ADMITTED } else { REJECTED });
                    Ok(Admission::new(at, reset, remaining))
                }
                (None, None) => Err(TryAcquireError::Unavailable), // a limiter has members
            })
        })
        .collect();
    let held = Held { n, configs, took };
    (answers, held)
}

/// `reply` without the count of unreadable keys `multi.lua` appends when it found any, which is
/// counted by the first member's limiter, the one whose connection sent the script (the count
/// does not say whose keys they were).
fn repaired<'r, C>(
    members: &[(&RedisLimiter<C>, Tag<'_>)],
    reply: &'r [i64],
    keys: usize,
) -> &'r [i64] {
    match members.first() {
        Some((first, _)) => first.inner.repaired(reply, 2 + 3 * keys),
        None => reply,
    }
}

/// One decision of a script's key, as [`parse`] gives it.
type Decision = Result<(u64, u64, u32), (u64, usize)>;

/// `multi.lua`'s reply `{all, now, (admitted, t, remaining) per key}`: whether all admitted, and
/// each key's decision.
fn split(reply: &[i64], keys: usize) -> Result<(bool, Vec<Decision>), Failure> {
    let [all, now, each @ ..] = reply else {
        return Err(Failure::Error);
    };
    if each.len() != 3 * keys {
        return Err(Failure::Error);
    }
    let decisions = each
        .chunks_exact(3)
        .map(|d| parse(&[d[0], *now, d[1], d[2]]))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((*all == 1, decisions))
}

/// Redis gave no decision: each member's failure policy answers (see [`try_acquire_all`]);
/// and what each member took, from its fallback, when all admitted. Under
/// [`Over::CountedOnly`] nothing is taken (the caller's decision is rejected already, and it
/// gives nothing back): each member answers its own verdict for `n`, an admission as its
/// state stands.
fn fail_all<C>(
    members: &[(&RedisLimiter<C>, Tag<'_>)],
    configs: &[Arc<Config>],
    failure: Failure,
    n: u32,
    over: Over,
) -> (Vec<Answer>, Vec<Took>) {
    for (limiter, _) in members {
        limiter.inner.count_failure(failure);
    }
    if over == Over::CountedOnly && n > 0 {
        // Every member decided for `n` in turn (a subject listed twice meets what its earlier
        // occurrence took, as in the script), then every fallback's take given back; an
        // admission answers the state as it stands then (a probe), as the script answers a
        // member that would have admitted.
        let decided: Vec<_> = (members.iter().zip(configs))
            .map(|((limiter, subject), config)| limiter.inner.policy_taken(config, subject, n))
            .collect();
        for (((limiter, subject), config), (_, _, taken)) in
            members.iter().zip(configs).zip(&decided)
        {
            if let Some(taken) = taken {
                limiter.inner.give_back(config, subject, n, taken);
            }
        }
        return (members.iter().zip(configs).zip(decided))
            .map(|(((limiter, subject), config), (answer, counter, taken))| {
                let answer = match taken {
                    Some(_) => limiter.inner.policy(config, subject, 0).0,
                    None => answer,
                };
                limiter.inner.count(counter);
                (Some(answer), Took::Nothing)
            })
            .unzip();
    }
    // Charge the members one after the other, giving back what the earlier ones took if a
    // later one rejects: all or nothing however concurrent calls in this process race for the
    // fallbacks' permits. Not attempted when a member fails closed: it rejects whatever the
    // others say.
    let mut rejected = None;
    if n > 0 && !members.iter().any(|(l, _)| l.inner.fails_closed()) {
        let mut charged = Vec::with_capacity(members.len());
        for (i, ((limiter, subject), config)) in members.iter().zip(configs).enumerate() {
            let (answer, counter, taken) = limiter.inner.policy_taken(config, subject, n);
            match answer {
                Ok(admission) => charged.push((admission, counter, taken)),
                Err(error) => {
                    rejected = Some((i, error, counter));
                    break;
                }
            }
        }
        if rejected.is_none() {
            return members
                .iter()
                .zip(charged)
                .map(|((limiter, _), (admission, counter, taken))| {
                    limiter.inner.count(counter);
                    (
                        Some(Ok(admission)),
                        taken.map_or(Took::Nothing, Took::Fallback),
                    )
                })
                .unzip();
        }
        for (((limiter, subject), config), (_, _, taken)) in
            members.iter().zip(configs).zip(&charged)
        {
            if let Some(taken) = taken {
                limiter.inner.give_back(config, subject, n, taken);
            }
        }
    }
    // Rejected (or a probe, or a member failing closed): the member that rejected answers its
    // rejection, the others their policy's answer to a probe, which takes nothing.
    members
        .iter()
        .zip(configs)
        .enumerate()
        .map(|(i, ((limiter, subject), config))| {
            let (answer, counter) = match rejected {
                Some((at, error, counter)) if at == i => (Err(error), counter),
                _ => limiter.inner.policy(config, subject, 0),
            };
            limiter.inner.count(counter);
            (Some(answer), Took::Nothing)
        })
        .unzip()
}

#[cfg(test)]
#[allow(unreachable_pub)]
#[path = "../../tests/common/redis_server.rs"]
pub(super) mod redis_server;

#[cfg(test)]
mod tests {
    use super::redis_server::{RedisServer, room_in_window};
    use super::*;
    use crate::{Algorithm, FailurePolicy, Rate};
    use ::redis::aio::ConnectionManager;
    use std::time::Duration;

    async fn connect(server: &RedisServer) -> ConnectionManager {
        let client = ::redis::Client::open(server.url()).unwrap();
        ConnectionManager::new(client).await.unwrap()
    }

    /// A fixed window of 3 per hour under `prefix`, failing closed.
    fn limit_3_per_hour(connection: &ConnectionManager, prefix: &str) -> RedisLimiter {
        let window = Algorithm::FixedWindow {
            limit: 3,
            window: Duration::from_secs(3600),
        };
        RedisLimiter::builder(window, FailurePolicy::FailClosed)
            .prefix(prefix)
            .build(connection.clone())
            .unwrap()
    }

    /// Two limiters with their own prefixes, subjects and algorithms, one of them a chain of
    /// two: each call is all or nothing, answers per limiter, and counts in each limiter's stats.
    #[tokio::test]
    async fn one_script_decides_every_limiter_all_or_nothing() {
        let mut server = RedisServer::start();
        let client = ::redis::Client::open(server.url()).unwrap();
        let connection = ConnectionManager::new(client).await.unwrap();
        let hour = Duration::from_secs(3600);
        let a = RedisLimiter::builder(
            Algorithm::SlidingWindow {
                limit: 2,
                window: hour,
            },
            FailurePolicy::FailClosed,
        )
        .prefix("a")
        .build(connection.clone())
        .unwrap();
        let b = RedisLimiter::builder(
            Algorithm::TokenBucket {
                rate: Rate::new(3, hour),
                burst: 3,
            },
            FailurePolicy::FailOpen,
        )
        .and_limit(Algorithm::SlidingWindow {
            limit: 4,
            window: hour,
        })
        .prefix("b")
        .build(connection)
        .unwrap();
        let remaining = |answer: &Answer| match answer {
            Some(Ok(admission)) => Some(admission.remaining()),
            _ => None,
        };
        for left in [1, 0] {
            let answers = try_acquire_all(&[(&a, b"x"), (&b, b"y")], 1).await;
            // b answers its smallest remaining: the bucket's.
            assert_eq!(
                answers.iter().map(remaining).collect::<Vec<_>>(),
                [Some(left), Some(left + 1)]
            );
        }
        let answers = try_acquire_all(&[(&a, b"x"), (&b, b"y")], 1).await;
        match &answers[0] {
            Some(Err(TryAcquireError::Rejected(r))) => {
                assert!(r.retry_after() > Duration::from_secs(3590), "{r:?}");
                assert_eq!(r.limit(), 2);
            }
            other => panic!("a must reject: {other:?}"),
        }
        assert_eq!(remaining(&answers[1]), Some(1), "b as it stands, untouched");
        // b was charged twice, not three times: its last permit is still there.
        assert_eq!(b.try_acquire(b"y").await.map(|a| a.remaining()), Ok(0));
        let counts = |l: &RedisLimiter| {
            let s = l.stats();
            (s.admitted, s.rejected, s.denied_locally)
        };
        assert_eq!(counts(&a), (2, 1, 0));
        assert_eq!(counts(&b), (3, 1, 0));
        // a's deny cache now answers for "x" with no round trip; b is not asked.
        let answers = try_acquire_all(&[(&a, b"x"), (&b, b"y")], 1).await;
        assert!(matches!(
            answers[0],
            Some(Err(TryAcquireError::Rejected(_)))
        ));
        assert!(answers[1].is_none());
        assert_eq!(counts(&a), (2, 1, 1));
        assert_eq!(counts(&b), (3, 1, 0));
        // Redis gone: each limiter's own policy answers, and each counts one error and one
        // policy decision. a fails closed, so b (fail open) takes nothing.
        server.kill();
        let answers = try_acquire_all(&[(&a, b"x2"), (&b, b"y2")], 1).await;
        assert!(matches!(
            answers[0],
            Some(Err(TryAcquireError::Unavailable))
        ));
        assert!(matches!(answers[1], Some(Ok(_))));
        let failures = |l: &RedisLimiter| {
            let s = l.stats();
            (
                s.errors + s.timeouts,
                s.failed_closed,
                s.failed_open,
                s.fallbacks,
            )
        };
        assert_eq!(failures(&a), (1, 1, 0, 0));
        assert_eq!(failures(&b), (1, 0, 1, 0));
    }

    /// [`Over`]: a call rejected by one member counts that member's `n` past its limit in the
    /// same script under `Counted` and `CountedOnly` (Envoy's service counts a descriptor's
    /// hits whether or not they fit) and not under `Free`, while the member that would have
    /// admitted takes nothing; under `CountedOnly` a call whose members all admit takes nothing
    /// either (its caller's decision is rejected already) and answers as rejected.
    #[tokio::test]
    async fn over_counts_the_rejecting_members_past_their_limit_only() {
        let server = RedisServer::start();
        let connection = connect(&server).await;
        let mut raw = ::redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        // A key's count, read in Redis (the answers say 0 left past the limit, whatever it is).
        let mut count = |l: &RedisLimiter, subject: &[u8]| -> u32 {
            ::redis::cmd("HGET")
                .arg(l.key(subject))
                .arg("c")
                .query(&mut raw)
                .unwrap()
        };
        for (over, prefix, counted) in [
            (Over::Free, "free", 3),
            (Over::Counted, "counted", 5),
            (Over::CountedOnly, "only", 5),
        ] {
            let (big, small) = (
                limit_3_per_hour(&connection, &format!("{prefix}-big")),
                limit_3_per_hour(&connection, &format!("{prefix}-small")),
            );
            small.try_acquire_n(b"s", 3).await.unwrap();
            big.try_acquire(b"b").await.unwrap();
            let members = [(&big, &b"b"[..]), (&small, &b"s"[..])];
            let (answers, _) = try_acquire_all_held(&members, 2, &[], over).await;
            assert!(matches!(answers[0], Some(Ok(_))), "{answers:?}");
            assert!(matches!(
                answers[1],
                Some(Err(TryAcquireError::Rejected(_)))
            ));
            // The member that would have admitted took nothing either way.
            assert_eq!(count(&big, b"b"), 1, "{over:?}");
            assert_eq!(count(&small, b"s"), counted, "{over:?}");
        }
        // Under `CountedOnly`, members that all admit take nothing: the call answers their
        // state as it stands, as a rejected call does.
        let (a, b) = (
            limit_3_per_hour(&connection, "only-a"),
            limit_3_per_hour(&connection, "only-b"),
        );
        let members = [(&a, &b"x"[..]), (&b, &b"y"[..]), (&a, &b"x"[..])];
        let (answers, _) = try_acquire_all_held(&members, 1, &[], Over::CountedOnly).await;
        let remaining: Vec<_> = answers
            .iter()
            .map(|a| a.as_ref().map(|r| r.as_ref().map(|a| a.remaining()).ok()))
            .collect();
        assert_eq!(remaining, [Some(Some(3)), Some(Some(3)), Some(Some(3))]);
        assert_eq!(a.try_acquire_n(b"x", 3).await.map(|a| a.remaining()), Ok(0));
        assert_eq!(b.try_acquire_n(b"y", 3).await.map(|a| a.remaining()), Ok(0));
    }

    /// One key listed twice in a call (two rules sharing a counter) counts twice, each
    /// occurrence deciding on the state the one before it left: every algorithm, a chain
    /// included, and a call whose later member rejects takes nothing from the repeated key.
    #[tokio::test]
    async fn a_key_listed_twice_counts_twice() {
        let server = RedisServer::start();
        let client = ::redis::Client::open(server.url()).unwrap();
        let connection = ConnectionManager::new(client).await.unwrap();
        let hour = Duration::from_secs(3600);
        // The fixed window and the sliding counter are aligned to Redis's clock: no hour may
        // end among a case's calls.
        room_in_window(&mut server.connection(), hour, Duration::from_secs(30));
        let algorithms = [
            Algorithm::FixedWindow {
                limit: 5,
                window: hour,
            },
            Algorithm::SlidingWindow {
                limit: 5,
                window: hour,
            },
            Algorithm::SlidingCounter {
                limit: 5,
                window: hour,
            },
            Algorithm::TokenBucket {
                rate: Rate::new(5, hour),
                burst: 5,
            },
        ];
        for (i, algorithm) in algorithms.into_iter().enumerate() {
            let limiter = RedisLimiter::builder(algorithm, FailurePolicy::FailClosed)
                .prefix(format!("dup{i}"))
                .deny_cache(0)
                .build(connection.clone())
                .unwrap();
            let remaining = |answers: &[Answer]| {
                answers
                    .iter()
                    .map(|a| match a {
                        Some(Ok(admission)) => Some(admission.remaining()),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
            };
            let twice = [(&limiter, &b"k"[..]), (&limiter, &b"k"[..])];
            // 5 permits: two calls take 2 each, the second occurrence seeing the first's.
            let answers = try_acquire_all(&twice, 1).await;
            assert_eq!(remaining(&answers), [Some(4), Some(3)], "{algorithm:?}");
            let answers = try_acquire_all(&twice, 1).await;
            assert_eq!(remaining(&answers), [Some(2), Some(1)], "{algorithm:?}");
            // One permit left: the first occurrence would take it, the second cannot, so the
            // call takes nothing and the permit is still there: the key as it was, TTL too.
            let mut raw = server.connection();
            let key = limiter.key(b"k");
            let state = |raw: &mut ::redis::Connection| -> (Vec<u8>, i64) {
                let dump = ::redis::cmd("DUMP").arg(&key).query(raw).unwrap();
                let expiry = ::redis::cmd("PEXPIRETIME").arg(&key).query(raw).unwrap();
                (dump, expiry)
            };
            let before = state(&mut raw);
            let answers = try_acquire_all(&twice, 1).await;
            assert_eq!(state(&mut raw), before, "{algorithm:?}");
            assert!(
                matches!(answers[1], Some(Err(TryAcquireError::Rejected(_)))),
                "{algorithm:?}: {answers:?}"
            );
            assert_eq!(
                limiter.try_acquire(b"k").await.map(|a| a.remaining()),
                Ok(0),
                "{algorithm:?}"
            );
        }
        // A chain listed twice, and a repeated key beside a rejecting member: nothing taken.
        let chain = RedisLimiter::builder(
            Algorithm::FixedWindow {
                limit: 4,
                window: hour,
            },
            FailurePolicy::FailClosed,
        )
        .and_limit(Algorithm::SlidingWindow {
            limit: 3,
            window: hour,
        })
        .prefix("dupc")
        .deny_cache(0)
        .build(connection.clone())
        .unwrap();
        let full = RedisLimiter::builder(
            Algorithm::FixedWindow {
                limit: 1,
                window: hour,
            },
            FailurePolicy::FailClosed,
        )
        .prefix("dupf")
        .deny_cache(0)
        .build(connection)
        .unwrap();
        let answers = try_acquire_all(&[(&chain, b"c"), (&chain, b"c")], 1).await;
        assert!(
            answers.iter().all(|a| matches!(a, Some(Ok(_)))),
            "{answers:?}"
        );
        full.try_acquire(b"f").await.unwrap();
        let answers = try_acquire_all(&[(&chain, b"c"), (&chain, b"c"), (&full, b"f")], 1).await;
        assert!(matches!(
            answers[2],
            Some(Err(TryAcquireError::Rejected(_)))
        ));
        // The chain's sliding window (3) holds the 2 admitted, not 4: one left.
        assert_eq!(chain.try_acquire(b"c").await.map(|a| a.remaining()), Ok(0));
        assert!(chain.try_acquire(b"c").await.is_err());
    }

    /// A later occurrence of a repeated key is rejected on the state its earlier occurrence
    /// left, which the rejected call then restored: its retry-after is for the call's 2n, not
    /// for n on the key as it stands, so the deny cache must not remember it as a rejection of
    /// n for that subject (it would refuse, in-process, a call that Redis admits). The same for
    /// two limiters that share a prefix, and so a key.
    #[tokio::test]
    async fn a_rejection_of_a_repeated_key_is_not_cached_for_the_subject() {
        let server = RedisServer::start();
        let connection = connect(&server).await;
        let build = |prefix: &str| limit_3_per_hour(&connection, prefix);
        let (once, twin) = (build("same"), build("same"));
        // Fixed windows aligned to Redis's clock: none may end among the calls.
        let hour = Duration::from_secs(3600);
        room_in_window(&mut server.connection(), hour, Duration::from_secs(10));
        for (first, second) in [(&once, &once), (&once, &twin)] {
            let subject = if std::ptr::eq(first, second) {
                &b"k1"[..]
            } else {
                &b"k2"[..]
            };
            first.try_acquire_n(subject, 2).await.unwrap();
            let answers = try_acquire_all(&[(first, subject), (second, subject)], 1).await;
            assert!(
                matches!(answers[1], Some(Err(TryAcquireError::Rejected(_)))),
                "{answers:?}"
            );
            // One permit is left, and Redis gives it to a call for one.
            assert_eq!(
                second.try_acquire(subject).await.map(|a| a.remaining()),
                Ok(0)
            );
        }
        assert_eq!(
            (once.stats().denied_locally, twin.stats().denied_locally),
            (0, 0)
        );
    }

    /// A key no script writes, met by the multi-rule script: read as no state and rewritten,
    /// the reply's trailing count taken off before the per-key decisions and counted.
    #[tokio::test]
    async fn an_unreadable_key_is_rewritten_in_one_call_of_several() {
        let server = RedisServer::start();
        let connection = connect(&server).await;
        let build = |prefix: &str| limit_3_per_hour(&connection, prefix);
        let (a, b) = (build("ua"), build("ub"));
        let mut raw = server.connection();
        // Fixed windows aligned to Redis's clock: none may end among the calls.
        room_in_window(&mut raw, Duration::from_secs(3600), Duration::from_secs(10));
        let () = ::redis::cmd("HSET")
            .arg(b.key(b"y"))
            .arg(&["w", "1", "l", "0", "c", "1"])
            .query(&mut raw)
            .unwrap();
        for left in [2, 1] {
            let answers = try_acquire_all(&[(&a, b"x"), (&b, b"y")], 1).await;
            let remaining: Vec<_> = answers
                .iter()
                .map(|a| {
                    a.as_ref()
                        .and_then(|a| a.as_ref().ok())
                        .map(|a| a.remaining())
                })
                .collect();
            assert_eq!(remaining, [Some(left), Some(left)]);
        }
        assert_eq!(a.stats().repaired, 1);
        assert_eq!((a.stats().errors, b.stats().errors), (0, 0));
    }

    /// What an admitted call took is given back: a fixed window's key listed twice gives back
    /// twice, a key whose window is no longer the admission's is left alone, and an algorithm
    /// other than the fixed window is not given back (and says so).
    #[tokio::test]
    async fn an_admitted_call_gives_back_its_fixed_windows_only() {
        let server = RedisServer::start();
        let connection = connect(&server).await;
        let mut raw = server.connection();
        let hour = Duration::from_secs(3600);
        room_in_window(&mut raw, hour, Duration::from_secs(10));
        let (a, b) = (
            limit_3_per_hour(&connection, "ga"),
            limit_3_per_hour(&connection, "gb"),
        );
        let bucket = RedisLimiter::builder(
            Algorithm::TokenBucket {
                rate: Rate::new(3, hour),
                burst: 3,
            },
            FailurePolicy::FailClosed,
        )
        .prefix("gt")
        .build(connection)
        .unwrap();
        let members = [
            (&a, &b"x"[..]),
            (&a, &b"x"[..]),
            (&b, &b"y"[..]),
            (&bucket, &b"z"[..]),
        ];
        let (answers, held) = try_acquire_all_held(&members, 1, &[], Over::Free).await;
        assert!(
            answers.iter().all(|a| matches!(a, Some(Ok(_)))),
            "{answers:?}"
        );
        // Another window's state for b's key (as if its window had ended and a new one begun).
        let () = ::redis::cmd("HSET")
            .arg(b.key(b"y"))
            .arg(&["w", "0"])
            .query(&mut raw)
            .unwrap();
        let counts = |l: &RedisLimiter| (l.stats().admitted, l.stats().rejected);
        assert_eq!(counts(&a), (2, 0));
        assert_eq!(held.give_back(&members).await, [true, true, false, false]);
        // Counted as admitted still, as a refunded admission in memory is
        // (`Refundable::refund`): the give-back counts nothing.
        assert_eq!((counts(&a), counts(&b)), ((2, 0), (1, 0)));
        let remaining = |answer: Result<Admission, TryAcquireError>| answer.map(|a| a.remaining());
        assert_eq!(
            remaining(a.try_acquire(b"x").await),
            Ok(2),
            "both hits back"
        );
        assert_eq!(
            remaining(bucket.try_acquire(b"z").await),
            Ok(1),
            "still charged"
        );
        // A rejected call took nothing, and gives back nothing.
        let (_, held) =
            try_acquire_all_held(&[(&a, &b"x"[..]), (&a, &b"x"[..])], 2, &[], Over::Free).await;
        assert_eq!(
            held.give_back(&[(&a, &b"x"[..]), (&a, &b"x"[..])]).await,
            [true, true]
        );
        assert_eq!(remaining(a.try_acquire(b"x").await), Ok(1));
    }

    /// A give-back goes only to the key that counted the admission. A key reset (DEL) after the
    /// admission, or discarded as unreadable, and created again in the same window counts the
    /// new window's permits only: given the old call's `n` back, it admitted `n` more than its
    /// limit in that window. A key without the creation marker (written before there was one)
    /// is left alone; one written again since the admission keeps its marker and gives back.
    #[tokio::test]
    async fn a_key_created_again_after_the_admission_gets_no_give_back() {
        let server = RedisServer::start();
        let connection = connect(&server).await;
        let mut raw = server.connection();
        let hour = Duration::from_secs(3600);
        room_in_window(&mut raw, hour, Duration::from_secs(10));
        let (a, b) = (
            limit_3_per_hour(&connection, "ra"),
            limit_3_per_hour(&connection, "rb"),
        );
        let remaining = |answer: Result<Admission, TryAcquireError>| answer.map(|a| a.remaining());
        let mut count = |l: &RedisLimiter, subject: &[u8]| -> u32 {
            ::redis::cmd("HGET")
                .arg(l.key(subject))
                .arg("c")
                .query(&mut raw)
                .unwrap()
        };
        // Reset, and discarded as unreadable (then read as no state and written afresh).
        for (i, subject) in [&b"reset"[..], b"discarded"].into_iter().enumerate() {
            let members = [(&a, subject), (&b, subject)];
            let (answers, held) = try_acquire_all_held(&members, 1, &[], Over::Free).await;
            assert!(answers.iter().all(|a| matches!(a, Some(Ok(_)))));
            if i == 0 {
                assert!(a.reset(subject).await.unwrap());
            } else {
                let () = ::redis::cmd("HSET")
                    .arg(a.key(subject))
                    .arg(&["l", "0"])
                    .query(&mut server.connection())
                    .unwrap();
            }
            // The new key takes the whole limit in the same window.
            assert_eq!(remaining(a.try_acquire_n(subject, 3).await), Ok(0));
            assert_eq!(held.give_back(&members).await, [false, true]);
            assert_eq!(count(&a, subject), 3, "{subject:?}");
            assert!(a.try_acquire(subject).await.is_err(), "{subject:?}");
            assert_eq!(remaining(b.try_acquire_n(subject, 3).await), Ok(0));
        }
        // Written again after the admission: still the key that counted it.
        let members = [(&a, &b"again"[..])];
        let (_, held) = try_acquire_all_held(&members, 1, &[], Over::Free).await;
        assert_eq!(remaining(a.try_acquire(b"again").await), Ok(1));
        assert_eq!(held.give_back(&members).await, [true]);
        assert_eq!(count(&a, b"again"), 1);
        // Without the marker (a key an older version wrote): left alone, stricter.
        let members = [(&a, &b"old"[..])];
        let (_, held) = try_acquire_all_held(&members, 1, &[], Over::Free).await;
        let _: u32 = ::redis::cmd("HDEL")
            .arg(a.key(b"old"))
            .arg("b")
            .query(&mut server.connection())
            .unwrap();
        assert_eq!(held.give_back(&members).await, [false]);
        assert_eq!(count(&a, b"old"), 1);
    }

    /// Redis down, `Fallback`: a `CountedOnly` call (its caller's decision is rejected
    /// already, as the Envoy service sends one for a request another descriptor rejected)
    /// takes nothing from the members that admit, as in Redis, and gives nothing to give back;
    /// each member answers its own verdict. Before, the members' fallbacks were charged as for
    /// an admission and nobody gave it back: every rejected request spent the other
    /// descriptors' local share, so that requests within their limits were refused after.
    #[tokio::test]
    async fn redis_down_a_counted_only_call_takes_nothing_from_the_fallbacks() {
        let mut server = RedisServer::start();
        let connection = connect(&server).await;
        let build = |prefix: &str| {
            let window = Algorithm::FixedWindow {
                limit: 3,
                window: Duration::from_secs(3600),
            };
            RedisLimiter::builder(window, FailurePolicy::Fallback { share: 1.0 })
                .prefix(prefix)
                .deadline(Duration::from_millis(200))
                .build(connection.clone())
                .unwrap()
        };
        let (a, b) = (build("fa"), build("fb"));
        server.kill();
        // b's fallback holds 1 of its 3 after this.
        b.try_acquire_n(b"y", 2).await.unwrap();
        let members = [(&a, &b"x"[..]), (&b, &b"y"[..])];
        for _ in 0..3 {
            let (answers, held) = try_acquire_all_held(&members, 2, &[], Over::CountedOnly).await;
            assert!(matches!(answers[0], Some(Ok(_))), "{answers:?}");
            assert!(
                matches!(answers[1], Some(Err(TryAcquireError::Rejected(_)))),
                "{answers:?}"
            );
            assert!(held.took.iter().all(|t| matches!(t, Took::Nothing)));
        }
        // Both fallbacks as they were: a's 3, b's 1.
        assert_eq!(a.try_acquire_n(b"x", 3).await.map(|a| a.remaining()), Ok(0));
        assert_eq!(b.try_acquire(b"y").await.map(|a| a.remaining()), Ok(0));
        // Members that all admit take nothing either.
        let members = [(&a, &b"x2"[..]), (&b, &b"y2"[..])];
        for _ in 0..2 {
            let (answers, _) = try_acquire_all_held(&members, 3, &[], Over::CountedOnly).await;
            assert!(
                answers.iter().all(|a| matches!(a, Some(Ok(_)))),
                "{answers:?}"
            );
        }
        assert_eq!(
            a.try_acquire_n(b"x2", 3).await.map(|a| a.remaining()),
            Ok(0)
        );
        assert_eq!(
            b.try_acquire_n(b"y2", 3).await.map(|a| a.remaining()),
            Ok(0)
        );
        // One fallback decision per member and call, as for any call Redis failed.
        assert_eq!(a.stats().fallbacks, 7);
    }

    #[test]
    fn replies_of_the_wrong_shape_are_failures() {
        assert!(split(&[1], 0).is_err());
        assert!(split(&[1, 5, 1, 2], 1).is_err());
        assert!(split(&[1, 5, 1, 2, -3], 1).is_err());
        let (all, each) = split(&[0, 5, 1, 2, 3, 0, 4, 0], 2).ok().unwrap();
        assert!(!all);
        assert_eq!(each, [Ok((5_000, 2_000, 3)), Err((4_000, 0))]);
    }
}
