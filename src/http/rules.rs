//! Compiling an [`HttpConfig`] into matchers and limiters, with the semantic checks whose
//! errors name the field.

use crate::http::client_ip::{canonical_net, mask_to};
use crate::http::config::{
    BanConfig, HttpConfig, KeyOverflowPolicy, MissingKey, RuleAlgorithm, RuleConfig, RuleKey,
};
use crate::http::response::compact_period;
use crate::http::{ClientIpConfig, HttpConfigError};
use crate::sync::{AtomicU64, Mutex, Ordering};
use crate::{Algorithm, BanList, Clock, KeyOverflow, KeyedLimiter, Rate};
use compact_str::CompactString;
use ipnet::IpNet;
use regex::Regex;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// What one rule counts a request under: the parts its `key` and `per_endpoint` name. Built for
/// every request (the keyed limiter looks it up) and held once per client in the rule's map,
/// so it is small: 32 bytes on 64-bit targets, which with the counter's 8 is the same 48-byte
/// malloc chunk per client as 24 would be. The usual rule's lone IP address is kept as it is;
/// every other combination as text, inline up to 24 bytes (allocating nothing then), in the
/// form the Redis backend names its keys by: `i{ip};c{len}:{client};e{len}:{VERB:/path};`, the
/// parts the rule counts by, each tagged and the strings length-prefixed, so that two keys
/// never share a text whatever a client id holds. An IPv4 address beside other parts is kept
/// apart from their text, so that an address and a short path stay inline.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum CounterKey {
    /// `key = "ip"` without `per_endpoint`.
    Ip(IpAddr),
    /// An IPv4 address and the text of the other parts (`c…;`, `e…;`).
    V4Parts(Ipv4Addr, CompactString),
    /// Any other rule's parts, as the Redis subject (an IPv6 address's `i…;` included).
    Parts(CompactString),
}

impl CounterKey {
    /// The key of the rule parts `ip`, `client` and `endpoint` (`(method, path)`; the path is
    /// lower-cased, the method kept), those present. For the lone IP address, use
    /// [`CounterKey::Ip`].
    pub(crate) fn parts(
        ip: Option<IpAddr>,
        client: Option<&str>,
        endpoint: Option<(&str, &str)>,
    ) -> Self {
        // Pieces pushed rather than `write!`: this runs on every request of such a rule.
        let mut digits = itoa::Buffer::new();
        let mut text = CompactString::default();
        if let Some(IpAddr::V6(v6)) = ip {
            use std::fmt::Write as _;
            // Writing into a CompactString cannot fail.
            let _ = write!(text, "i{v6};");
        }
        if let Some(client) = client {
            text.push('c');
            text.push_str(digits.format(client.len()));
            text.push(':');
            text.push_str(client);
            text.push(';');
        }
        if let Some((method, path)) = endpoint {
            text.push('e');
            text.push_str(digits.format(method.len() + 1 + path.len()));
            text.push(':');
            text.push_str(method);
            text.push(':');
            let start = text.len();
            text.push_str(path);
            text[start..].make_ascii_lowercase();
            text.push(';');
        }
        match ip {
            Some(IpAddr::V4(v4)) => CounterKey::V4Parts(v4, text),
            _ => CounterKey::Parts(text),
        }
    }

    /// The key as the Redis backend names it (its subject).
    #[cfg(feature = "redis")]
    pub(crate) fn subject(&self) -> String {
        format!("{self:?}")
    }
}

/// As the Redis subject, which is readable: `i10.0.0.1;`, `c7:partner;e10:GET:/api/x;`.
impl std::fmt::Debug for CounterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CounterKey::Ip(ip) => write!(f, "i{ip};"),
            CounterKey::V4Parts(ip, text) => write!(f, "i{ip};{text}"),
            CounterKey::Parts(text) => f.write_str(text),
        }
    }
}

/// Who a ban applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum BanKey {
    Ip(IpAddr),
    Client(CompactString),
}

/// An endpoint pattern: `*`, or `verb:path` with `*` wildcards, or a regex over the path.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    /// `None`: any method.
    method: Option<String>,
    path: PathMatch,
}

#[derive(Debug, Clone)]
enum PathMatch {
    Any,
    Glob(String),
    /// The compiled expression, and the path part as written.
    Regex(Regex, Box<str>),
}

/// `*` in `pattern` matches any run of characters and `?` any one character
/// (AspNetCoreRateLimit's wildcards; a path holds no `?`, which starts the query, so `?` never
/// had to match itself); ASCII letters match either case. Both are UTF-8: the bytes of a
/// character in a path (which may hold UTF-8) are one character to `?`.
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == b'?' && !is_continuation(text[t]) {
            // A star's retry can start inside a character: `?` matches only from its start.
            p += 1;
            t += 1;
            while t < text.len() && is_continuation(text[t]) {
                t += 1;
            }
        } else if p < pattern.len()
            && pattern[p] != b'?'
            && pattern[p].eq_ignore_ascii_case(&text[t])
        {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// A byte inside a UTF-8 character, after its first.
fn is_continuation(byte: u8) -> bool {
    byte & 0xC0 == 0x80
}

impl Endpoint {
    pub(crate) fn parse(pattern: &str, regex: bool, field: &str) -> Result<Self, HttpConfigError> {
        let (regex, rest) = match pattern.strip_prefix("re:") {
            Some(rest) => (true, rest),
            None => (regex, pattern),
        };
        let rest = rest.trim();
        if rest == "*" {
            return Ok(Endpoint {
                method: None,
                path: PathMatch::Any,
            });
        }
        let split = match rest.split_once(':') {
            // A regex's `verb:` is optional (`re:/api/(?:a|b)`, `/api/v\d+/.*` with `regex =
            // true`): without one, for any method. A verb holds no `/`, and a path regex that
            // can match one holds a `/`, so a `:` after the first `/` is the regex's own.
            Some((verb, _)) if regex && verb.contains('/') => Some(("*", rest)),
            None if regex => Some(("*", rest)),
            split => split,
        };
        let Some((verb, path)) = split else {
            return Err(HttpConfigError::invalid(
                field,
                format!(
                    "{pattern:?} is not an endpoint pattern: expected \"*\", \"*:/path\" or \"verb:/path\""
                ),
            ));
        };
        let method = match verb {
            "*" => None,
            v if !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphabetic()) => {
                Some(v.to_ascii_uppercase())
            }
            _ => {
                return Err(HttpConfigError::invalid(
                    field,
                    format!("{verb:?} is not an HTTP method or \"*\" (in {pattern:?})"),
                ));
            }
        };
        let path = if regex {
            let invalid =
                |e| HttpConfigError::invalid(field, format!("{path:?} is not a valid regex: {e}"));
            // The pattern alone first: one with an unbalanced `)` (`/a)|(/b`) would close the
            // group below and escape its anchors, matching any path that merely contains a
            // part of it.
            Regex::new(path).map_err(invalid)?;
            let re = Regex::new(&format!("(?i)^(?:{path})$")).map_err(invalid)?;
            PathMatch::Regex(re, path.into())
        } else if path == "*" {
            PathMatch::Any
        } else if path.starts_with(['/', '*', '?']) {
            // A path starts with `/`, which a wildcard matches too: `*:*/health` is every path
            // ending in `/health`, as AspNetCoreRateLimit matches it. Normalized as the paths
            // it is matched with are: a pattern written with an escaped letter (`/%7Euser`,
            // `/values/%31`) matched no path, whose escape was decoded (`/~user`).
            PathMatch::Glob(
                crate::http::engine::normalized_path(path).unwrap_or_else(|| path.to_owned()),
            )
        } else {
            return Err(HttpConfigError::invalid(
                field,
                format!(
                    "the path of {pattern:?} must start with '/' or a wildcard ('*', '?'), or be \"*\""
                ),
            ));
        };
        Ok(Endpoint { method, path })
    }

    pub(crate) fn is_any(&self) -> bool {
        self.method.is_none() && matches!(self.path, PathMatch::Any)
    }

    pub(crate) fn matches(&self, method: &http::Method, path: &str) -> bool {
        if let Some(m) = &self.method {
            // A `HEAD` is the `GET` it is served as: axum (and most servers) answer it with the
            // `GET` handler, so a `get:` pattern that `HEAD` did not match would let any client
            // run that handler unlimited.
            let same = m.eq_ignore_ascii_case(method.as_str())
                || (*method == http::Method::HEAD && m == "GET");
            if !same {
                return false;
            }
        }
        match &self.path {
            PathMatch::Any => true,
            PathMatch::Glob(g) => glob(g.as_bytes(), path.as_bytes()),
            PathMatch::Regex(re, _) => re.is_match(path),
        }
    }

    /// The pattern as a rule's identity names it: one text for every way of writing the same
    /// pattern (`*` and `*:*`; the verb and a glob in any case, as they match in any case;
    /// spaces around it; `re:` or `regex = true`), so that a reload that only rewrites a
    /// pattern keeps the rule's counters. Lower case, as AspNetCoreRateLimit's documents write
    /// patterns, so that those keep the text they always had. A regex is kept as written: its
    /// case can matter (`\D` is not `\d`).
    fn identity_text(&self) -> String {
        let verb = self
            .method
            .as_deref()
            .map_or_else(|| "*".to_owned(), str::to_ascii_lowercase);
        match &self.path {
            PathMatch::Any if self.method.is_none() => "*".to_owned(),
            PathMatch::Any => format!("{verb}:*"),
            PathMatch::Glob(glob) => format!("{verb}:{}", glob.to_ascii_lowercase()),
            PathMatch::Regex(_, path) => format!("{verb}:{path}"),
        }
    }

    fn is_regex(&self) -> bool {
        matches!(self.path, PathMatch::Regex(..))
    }
}

/// What identifies a rule across reloads: everything but its limit and monitor flag, each part
/// as it reads rather than as it was written (`GET:/API/*` is `get:/api/*`; an IP rule's range
/// is its canonical network), so that a reload that rewrites a rule without changing it keeps
/// its counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Identity {
    scope: String,
    name: String,
    endpoint: String,
    regex: bool,
    period: Duration,
    algorithm: RuleAlgorithm,
    key: RuleKey,
    per_endpoint: bool,
}

impl Identity {
    /// A stable text naming the rule's identity (the same in every process and build), from
    /// which the Redis backend derives the rule's key prefix.
    #[cfg(feature = "redis")]
    pub(crate) fn canonical(&self) -> String {
        format!(
            "{}\u{0}{}\u{0}{}\u{0}{}\u{0}{}\u{0}{:?}\u{0}{:?}\u{0}{}",
            self.scope,
            self.name,
            self.endpoint,
            self.regex,
            self.period.as_nanos(),
            self.algorithm,
            self.key,
            self.per_endpoint
        )
    }
}

/// One compiled rule.
pub(crate) struct Rule<C: Clock> {
    pub(crate) name: Arc<str>,
    /// `name` for verdicts, a copy per thread.
    local_name: LocalName,
    pub(crate) endpoint: Endpoint,
    pub(crate) period: Duration,
    pub(crate) limit: u32,
    pub(crate) key: RuleKey,
    pub(crate) monitor: bool,
    pub(crate) per_endpoint: bool,
    pub(crate) identity: Identity,
    /// The rule's counters in the `metrics` facade (nothing without the feature).
    pub(crate) counters: Counters,
    /// `None` when the limit is 0 (the rule blocks).
    pub(crate) limiter: Option<KeyedLimiter<CounterKey, C>>,
    /// The rule's limiter in Redis, when the backend is Redis (set after compilation).
    #[cfg(feature = "redis")]
    pub(crate) remote: Option<Arc<crate::http::redis_rules::Remote>>,
    /// Requests may wait for the rule (`queue_limit` > 0).
    pub(crate) queue: Option<Queue>,
}

/// A rule's waiting room: how many requests may wait for it at once, for how long, and how
/// many wait now.
pub(crate) struct Queue {
    /// `queue_limit`.
    pub(crate) limit: u32,
    /// `max_wait`, counted from a request's arrival.
    pub(crate) max_wait: Duration,
    /// Requests waiting now (each holds a [`WaitSlot`]). Shared with the rule of the same
    /// identity in the configurations before and after a reload: requests still waiting hold
    /// places counted here, so a reload does not let `limit` more in.
    waiting: Arc<AtomicU64>,
}

/// One request's place among a rule's waiting requests; dropping it (the request decided, or
/// its future dropped) leaves.
pub(crate) struct WaitSlot<C: Clock> {
    rule: Arc<Rule<C>>,
}

impl<C: Clock> WaitSlot<C> {
    /// A place among `rule`'s waiting requests, if it has a queue with room.
    pub(crate) fn enter(rule: &Arc<Rule<C>>) -> Option<Self> {
        let queue = rule.queue.as_ref()?;
        // Relaxed: a count that guards no other memory; the bound is kept by the RMW alone.
        queue
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < u64::from(queue.limit)).then_some(n + 1)
            })
            .ok()?;
        Some(WaitSlot {
            rule: Arc::clone(rule),
        })
    }

    /// Whether this place is one among `rule`'s waiting requests: `rule` is the rule it was
    /// taken for, or that rule as a reload kept it (same identity), which counts its waiting
    /// requests on the same counter.
    pub(crate) fn is_for(&self, rule: &Rule<C>) -> bool {
        match (&self.rule.queue, &rule.queue) {
            (Some(mine), Some(theirs)) => Arc::ptr_eq(&mine.waiting, &theirs.waiting),
            _ => false,
        }
    }
}

impl<C: Clock> Drop for WaitSlot<C> {
    fn drop(&mut self) {
        if let Some(queue) = &self.rule.queue {
            // Relaxed: as in `enter`.
            queue.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl<C: Clock> Rule<C> {
    /// The rule's quota for the headers: `remaining` permits, reset after `reset_after`.
    pub(crate) fn quota(&self, remaining: u64, reset_after: Duration) -> crate::http::QuotaState {
        crate::http::QuotaState {
            policy: self.local_name(),
            limit: u64::from(self.limit),
            window: self.period,
            remaining,
            reset_after,
        }
    }

    /// The rule's name for a verdict: this thread's own copy (see [`LocalName`]).
    pub(crate) fn local_name(&self) -> Arc<str> {
        self.local_name.get()
    }
}

/// A name that every verdict carries (a rule's, or the blocklist's), handed out as each
/// thread's own `Arc` of it. A verdict is made and dropped for every request: with one shared
/// `Arc`, each request would write its reference count twice, a cache line that every core
/// serving requests under the rule writes in turn. Two threads deciding for different clients
/// took 2.2× as long per decision as one (`benches/http.rs`, `http-decide`). A thread's copy is
/// written only by that thread (and by another that drops a verdict it was handed, which is
/// rare and still right). The copies live as long as the rule: a thread of a pool that ends
/// leaves its copy to the next thread given its id.
pub(crate) struct LocalName {
    name: Arc<str>,
    copies: thread_local::ThreadLocal<Arc<str>>,
}

impl LocalName {
    pub(crate) fn new(name: Arc<str>) -> Self {
        LocalName {
            name,
            copies: thread_local::ThreadLocal::new(),
        }
    }

    /// This thread's copy, made the first time the thread asks.
    pub(crate) fn get(&self) -> Arc<str> {
        Arc::clone(self.copies.get_or(|| Arc::from(&*self.name)))
    }
}

/// Temporary bans: a [`BanList`] of clients, whose failures are the rule rejections the
/// engine counts, with the configuration it was built from (a reload that keeps `[bans]` and
/// the grouping of addresses keeps the list; one that changes either builds a new list and
/// carries the bans in force over to it, see [`Bans::carry`]).
pub(crate) struct Bans<C: Clock> {
    pub(crate) config: BanConfig,
    /// The prefix lengths, IPv4 then IPv6, that grouped the addresses in `list`: the
    /// configuration's `client_ip` (`ipv6_prefix = 64` bans a /64 as one client).
    grouping: (u8, u8),
    pub(crate) list: BanList<BanKey, C>,
    /// Bans of groups coarser than this list's, carried over by a reload that made the grouping
    /// finer (`ipv6_prefix` 64, then 128): the members of a banned /64 cannot be named one by
    /// one, so the ban stays the group's, keyed by its network and prefix length, and covers
    /// every address in it until it ends. `None` unless such a reload built this list.
    inherited: Option<Inherited<C>>,
    /// 1 once a rejection found the list full and said so at `warn` (later ones log at `debug`:
    /// a flood at a full list would otherwise write a warning per request).
    warned_full: crate::sync::AtomicU64,
    /// The list a reload replaced this one with, once it has ([`Bans::hand_over`]): a ban that
    /// starts here after that is passed on to it ([`Bans::pass_on`]). A mutex, not an atomic:
    /// it orders the hand-over against the bans of this list (see `pass_on`), and it is taken
    /// only when a ban starts.
    successor: Mutex<Option<Arc<Bans<C>>>>,
    /// The list this one replaced, while it is in use ([`Bans::hand_over`]): an unban lifts
    /// the ban there too ([`Bans::lift`]), so that a ban started there and not yet passed on
    /// is not passed on after the unban. Weak: the old list points at this one.
    predecessor: Mutex<Option<Weak<Bans<C>>>>,
    /// One lock for a list and every list that replaced it in turn (each reload's new list
    /// shares its old one's): a ban passed on ([`Bans::pass_on`]) and an unban ([`Bans::lift`])
    /// each run whole under it, so that an unban is never followed by a pass-on of the ban it
    /// lifted. Taken only when a ban starts in a replaced list and when an operator unbans.
    handing_over: Arc<Mutex<()>>,
}

/// A ban as any list can place it: a client's, or an address group's (network, prefix length;
/// an address's own ban is its group under the list's grouping).
enum Placed {
    Client(BanKey),
    Group(IpAddr, u8),
}

/// Bans of groups of addresses coarser than the list's own (see [`Bans::inherited`]).
struct Inherited<C: Clock> {
    /// By network address and prefix length. Only a reload adds to it; checks and unbans read
    /// and lift.
    list: BanList<(IpAddr, u8), C>,
    /// The prefix lengths the list may hold, IPv4 then IPv6: each one coarser than the
    /// owner's grouping of its family (few: the grouping before the reload that built the
    /// list, and those of the bans in force it inherited in turn).
    v4: Box<[u8]>,
    v6: Box<[u8]>,
}

impl<C: Clock> Inherited<C> {
    fn prefixes(&self, ip: IpAddr) -> &[u8] {
        match ip {
            IpAddr::V4(_) => &self.v4,
            IpAddr::V6(_) => &self.v6,
        }
    }
}

impl<C: Clock> Bans<C> {
    /// The prefix length this list groups `ip`'s family by.
    fn prefix_of(&self, ip: IpAddr) -> u8 {
        match ip {
            IpAddr::V4(_) => self.grouping.0,
            IpAddr::V6(_) => self.grouping.1,
        }
    }

    /// The key a request's client is banned by: its address (`ip`) grouped as this list
    /// groups addresses, or else its client id.
    ///
    /// The layer hands the engine addresses grouped already, under the configuration the
    /// request arrived under; but a request that waited across a reload to a coarser grouping
    /// is decided again with its address grouped the old way, which named no key of this list:
    /// its new group's ban was missed and its rejections counted under a key no other request
    /// of the group meets. (A finer grouping cannot be undone: the old group is looked up as
    /// one this list inherited, see [`check`](Self::check).)
    pub(crate) fn key_of(&self, ip: Option<IpAddr>, client: Option<&str>) -> Option<BanKey> {
        match (ip, client) {
            (Some(ip), _) => Some(BanKey::Ip(mask_to(ip, self.prefix_of(ip)))),
            (None, Some(id)) => Some(BanKey::Client(CompactString::from(id))),
            (None, None) => None,
        }
    }

    /// How long `client` stays banned, if it is: the longest of its own ban and, for an
    /// address, the bans a reload carried over for the coarser groups it is in. Adds no key.
    pub(crate) fn check(&self, client: &BanKey) -> Option<Duration> {
        let own = self.list.check(client).err().map(|b| b.retry_after());
        let (Some(inherited), BanKey::Ip(ip)) = (&self.inherited, client) else {
            return own;
        };
        inherited
            .prefixes(*ip)
            .iter()
            .filter_map(|&p| {
                let group = (mask_to(*ip, p), p);
                inherited.list.check(&group).err().map(|b| b.retry_after())
            })
            .chain(own)
            .max()
    }

    /// Lifts `client`'s ban, and for an address those of the coarser groups it is in (a ban
    /// carried over from before a reload refined the grouping), and forgets its rejections;
    /// whether any was in force.
    pub(crate) fn unban(&self, client: &BanKey) -> bool {
        let mut banned = self.list.unban(client);
        if let (Some(inherited), BanKey::Ip(ip)) = (&self.inherited, client) {
            for &p in inherited.prefixes(*ip) {
                banned |= inherited.list.unban(&(mask_to(*ip, p), p));
            }
        }
        banned
    }

    /// Places a ban of `left` from another list in this one: a client's as it is, a group's (an
    /// address's own ban being its group under the other list's grouping) as its group under
    /// this list's grouping when that group holds it (the same grouping, or a coarser one: a
    /// /128 banned, then a /64 grouping, bans its /64), and otherwise (a finer grouping) in
    /// `inherited`, as the group it was. Where it landed, in this list's terms; `None` if it
    /// found no room (`bans.max_entries` lowered below the bans in force) or no place (a group
    /// of a prefix this list does not look up: see [`Bans::pass_on`]).
    fn place(&self, ban: Placed, left: Duration) -> Option<Placed> {
        match ban {
            Placed::Client(client) => self
                .list
                .ban(&client, left)
                .ok()
                .map(|_| Placed::Client(client)),
            Placed::Group(ip, p) => {
                let q = self.prefix_of(ip);
                if q <= p {
                    let own = mask_to(ip, q);
                    self.list.ban(&BanKey::Ip(own), left).ok()?;
                    Some(Placed::Group(own, q))
                } else {
                    // `Compiler::bans` gave `inherited` every prefix coarser than ours that the
                    // list it replaced held; a prefix it did not give would never be looked up.
                    let inherited = self.inherited.as_ref()?;
                    if !inherited.prefixes(ip).contains(&p) {
                        return None;
                    }
                    let group = (mask_to(ip, p), p);
                    inherited.list.ban(&group, left).ok()?;
                    Some(Placed::Group(group.0, p))
                }
            }
        }
    }

    /// `client`'s ban in this list as any list can place it.
    fn placed(&self, client: BanKey) -> Placed {
        match client {
            BanKey::Ip(ip) => Placed::Group(ip, self.prefix_of(ip)),
            BanKey::Client(_) => Placed::Client(client),
        }
    }

    /// Carries `old`'s bans in force over to this list, each for what is left of it (rounded
    /// up to a whole millisecond), each where [`place`](Self::place) puts it. A ban never
    /// shortens one in force, so carrying twice (before and after a reload's swap, for the bans
    /// started meanwhile) changes nothing. Returns how many bans this list had no room for
    /// (`bans.max_entries` lowered below the bans in force): those clients are no longer banned.
    /// The longest bans are placed first, so those are the ones kept when not all fit: the
    /// others were to end sooner anyway.
    pub(crate) fn carry(&self, old: &Bans<C>) -> usize {
        let mut bans: Vec<(Placed, Duration)> = old
            .list
            .banned()
            .into_iter()
            .map(|(client, left)| (old.placed(client), left))
            .collect();
        if let Some(inherited) = &old.inherited {
            let groups = inherited.list.banned().into_iter();
            bans.extend(groups.map(|((ip, p), left)| (Placed::Group(ip, p), left)));
        }
        bans.sort_by_key(|&(_, left)| std::cmp::Reverse(left));
        bans.into_iter()
            .map(|(ban, left)| usize::from(self.place(ban, left).is_none()))
            .sum()
    }

    /// Records that a reload replaced this list with `new`, before it carries this list's bans
    /// over to it for the last time: from here on a ban that starts in this list (a request
    /// that loaded the old configuration and is still deciding under it) is passed on to `new`
    /// by [`pass_on`](Self::pass_on).
    pub(crate) fn hand_over(self: &Arc<Self>, new: &Arc<Bans<C>>) {
        // Before the successor: a ban that sees the successor, passed on after an unban (both
        // under `handing_over`), finds that the unban lifted it here too.
        *crate::sync::lock(&new.predecessor) = Some(Arc::downgrade(self));
        *crate::sync::lock(&self.successor) = Some(Arc::clone(new));
    }

    /// The list that replaced this one, if a reload has.
    fn successor(&self) -> Option<Arc<Bans<C>>> {
        crate::sync::lock(&self.successor).clone()
    }

    /// The list this one replaced, if a reload built it and the old one is still in use.
    fn predecessor(&self) -> Option<Arc<Bans<C>>> {
        crate::sync::lock(&self.predecessor)
            .as_ref()
            .and_then(Weak::upgrade)
    }

    /// An operator's unban: [`unban`](Self::unban) here, and in the lists this one replaced
    /// that are still in use (`address`, the client's own address, grouped under each list's
    /// grouping; a client known by its id as it is), under `handing_over`. A ban that a
    /// request started in a replaced list just before a reload carried it over to this one
    /// would otherwise be passed on ([`pass_on`](Self::pass_on)) after this lifted it here,
    /// and the client banned again. Whether this list banned the client.
    ///
    /// A ban passed on from a replaced list lands, here, as its group under the coarsest
    /// grouping of the lists it passes through (each list places a group under its own
    /// grouping when that is coarser, and keeps it as it is otherwise, see
    /// [`place`](Self::place)). So in a replaced list that grouped addresses more finely than
    /// one on the way, the ban of any of its groups inside the client's group under that
    /// coarsest grouping lands on a group that covers the client: each is lifted there, not only
    /// the address's own. (Lifting only the address's own group, a ban another member of the
    /// group started before the unban was passed on after it, and the group banned again.)
    /// Such a list is walked whole, as it is only while in use after a reload.
    pub(crate) fn lift(&self, client: &BanKey, address: Option<IpAddr>) -> bool {
        let _one_at_a_time = crate::sync::lock(&self.handing_over);
        // The coarsest grouping from this list back to the one unbanned in.
        let mut coarsest = address.map(|ip| self.prefix_of(ip));
        let mut before = self.predecessor();
        while let Some(old) = before {
            let key = match address {
                Some(ip) => BanKey::Ip(mask_to(ip, old.prefix_of(ip))),
                None => client.clone(),
            };
            old.unban(&key);
            if let (Some(ip), Some(prefix)) = (address, coarsest.as_mut()) {
                let own = old.prefix_of(ip);
                if own > *prefix {
                    let group = mask_to(ip, *prefix);
                    for (member, _) in old.list.banned() {
                        if let BanKey::Ip(other) = member
                            && other.is_ipv4() == ip.is_ipv4()
                            && mask_to(other, *prefix) == group
                        {
                            old.list.unban(&member);
                        }
                    }
                }
                *prefix = (*prefix).min(own);
            }
            before = old.predecessor();
        }
        self.unban(client)
    }

    /// Passes `client`'s ban, just started in this list, on to the lists that replaced it,
    /// each in turn (a second reload may have replaced the first one's list too).
    ///
    /// A reload carries the old list's bans over after its swap, but a request that loaded the
    /// old configuration before the swap may start its ban after that carry: the ban landed in
    /// a list no request looks at any more, and the client went unbanned. The hand-over and
    /// this look are ordered by `successor`'s mutex: the reload sets it before its last carry
    /// reads this list's bans, and this reads it after the ban was written. If this lock comes
    /// first, the ban was written before the reload's lock, so the carry (after it) sees the
    /// ban; if the reload's lock comes first, this sees the successor and passes the ban on.
    /// Either way the ban reaches the new list; both is harmless, a ban never shortening one in
    /// force. The same holds at every further hop, a ban placed in the successor being written
    /// before its own successor is looked at. `loom-tests/loom_bans.rs` models it. Under
    /// `handing_over`, so that an operator's unban ([`lift`](Self::lift)) comes wholly before
    /// (and lifted the ban here, so nothing is passed on) or wholly after (and lifts what was).
    fn pass_on(&self, client: &BanKey) {
        let Some(mut next) = self.successor() else {
            return;
        };
        // An unban is either before this (and lifted the ban here: see `lift`) or after it.
        let _one_at_a_time = crate::sync::lock(&self.handing_over);
        let Some(left) = self.list.check(client).err().map(|b| b.retry_after()) else {
            // Already lifted (an unban raced this): nothing to pass on.
            return;
        };
        let mut ban = self.placed(client.clone());
        loop {
            ban = match next.place(ban, left) {
                Some(placed) => placed,
                None => {
                    tracing::warn!(
                        client = ?client,
                        "a ban that started as a reload replaced the ban list found no place in \
                         the new list (full, or a grouping changed twice meanwhile): the client \
                         is not banned"
                    );
                    return;
                }
            };
            match next.successor() {
                Some(after) => next = after,
                None => return,
            }
        }
    }

    /// Counts a rate-limit rejection of `client` by the rule `rule`: every `after`-th within
    /// `within` starts a ban (logged, and counted in `turnstile_http_banned` for the rule).
    /// Only rate-limit rejections count: the other reasons say nothing about the client.
    ///
    /// Every `after`-th, not only the first (the list's rule): a banned client is rejected
    /// before any rule, so the rejections counted after a ban are those since it ended, and a
    /// ban shorter than `within` must be able to start again within the same window. A
    /// rejection the list has no room for (a new client, the list full of busy ones) counts
    /// for nothing, as a new client at a rule's cap does; but the lost count is not silent: it
    /// is counted (`turnstile_http_ban_list_full` for the rule) and logged, at `warn` the first
    /// time for the list and at `debug` after that.
    pub(crate) fn count_rejection(&self, client: &BanKey, rule: &Counters) {
        match self.list.fail(client) {
            Ok(failure) if failure.ban_started => {
                tracing::info!(client = ?client, duration = %self.config.duration, "client banned");
                rule.increment(Metric::Banned);
                self.pass_on(client);
            }
            Ok(_) => {}
            Err(full) => {
                rule.increment(Metric::BanListFull);
                // Relaxed: a flag for one log line; it orders nothing else.
                if self.warned_full.swap(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        client = ?client,
                        max_entries = full.max_keys,
                        "ban list full of busy clients: rejections of new clients are not \
                         counted towards bans until entries go idle (raise bans.max_entries)"
                    );
                } else {
                    tracing::debug!(client = ?client, "ban list full: rejection not counted");
                }
            }
        }
    }
}

/// A counter the layer reports through the `metrics` facade (feature `metrics`), labelled
/// `rule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Metric {
    /// A request the rule admitted (enforced rules only).
    Admitted,
    /// A request the rule rejected, whatever the reason.
    Rejected,
    /// A request the monitor rule would have rejected.
    ShadowRejected,
    /// A request of a client the full rule had no room for (`key_overflow`).
    KeyOverflow,
    /// A decision the Redis failure policy made instead of Redis.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    BackendFallbacks,
    /// A ban the rule's rejection started.
    Banned,
    /// A rejection by the rule that the full ban list could not count.
    BanListFull,
    /// A request that waited for the rule (`queue_limit`), counted when it starts waiting.
    Waited,
}

#[cfg(feature = "metrics")]
impl Metric {
    const ALL: [Metric; 8] = [
        Metric::Admitted,
        Metric::Rejected,
        Metric::ShadowRejected,
        Metric::KeyOverflow,
        Metric::BackendFallbacks,
        Metric::Banned,
        Metric::BanListFull,
        Metric::Waited,
    ];

    /// The counter's name.
    const fn name(self) -> &'static str {
        match self {
            Metric::Admitted => "turnstile_http_admitted",
            Metric::Rejected => "turnstile_http_rejected",
            Metric::ShadowRejected => "turnstile_http_shadow_rejected",
            Metric::KeyOverflow => "turnstile_http_key_overflow",
            Metric::BackendFallbacks => "turnstile_http_backend_fallbacks",
            Metric::Banned => "turnstile_http_banned",
            Metric::BanListFull => "turnstile_http_ban_list_full",
            Metric::Waited => "turnstile_http_waited",
        }
    }
}

/// One rule's counters in the `metrics` facade: with the feature, a key per [`Metric`], each
/// labelled `rule = <name>`, built once when the rule compiles. Built per increment instead,
/// a key copied the name into a `String` and the label into a `Vec` (two allocations) and
/// hashed both: +760 instructions per admitted request with no recorder installed at all
/// (`benches/http.rs`, `http-count`). The key shares the rule's `Arc<str>` and carries its
/// hash. Keys, not registered handles: the recorder is looked up at each increment, as
/// `metrics::counter!` does, so a recorder installed after the rules compiled, or a thread's
/// local one, still gets every count. Without the feature this is empty and counts nothing.
pub(crate) struct Counters {
    #[cfg(feature = "metrics")]
    keys: [metrics::Key; 8],
}

impl Counters {
    /// The counters of the rule (or list) `rule`.
    pub(crate) fn new(rule: &Arc<str>) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = rule;
        Counters {
            #[cfg(feature = "metrics")]
            keys: Metric::ALL.map(|metric| {
                metrics::Key::from_parts(
                    metric.name(),
                    vec![metrics::Label::new("rule", Arc::clone(rule))],
                )
            }),
        }
    }

    /// Adds one to `metric` in the recorder installed now (nothing without the feature).
    #[inline]
    pub(crate) fn increment(&self, metric: Metric) {
        #[cfg(feature = "metrics")]
        {
            static METADATA: metrics::Metadata<'static> =
                metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
            let key = &self.keys[metric as usize];
            metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA))
                .increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = metric;
    }
}

/// A set of IPs and ranges.
#[derive(Debug, Default)]
pub(crate) struct IpSet(Vec<IpNet>);

impl IpSet {
    /// Inline, so that an empty set (the usual whitelist and blocklist) costs a length check
    /// rather than a call.
    #[inline]
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        !self.0.is_empty() && self.0.iter().any(|n| n.contains(&ip))
    }
}

/// An address or CIDR range of a list or an IP rule, matched against the client as the layer
/// determines it: IPv4-mapped entries (`::ffff:192.0.2.1`) as the IPv4 ones they map, and no
/// entry narrower than the client groups of `client_ip` (`ipv4_prefix`, `ipv6_prefix`).
///
/// A client is its group's network address (`2001:db8::/64` for every address in it), so an
/// entry inside one group would match that whole group if it named the network address and
/// nothing at all otherwise: `2001:db8::5` on a blocklist would block no one. Refused, with
/// the group to write instead.
pub(crate) fn parse_net(
    text: &str,
    field: &str,
    client_ip: &ClientIpConfig,
) -> Result<IpNet, HttpConfigError> {
    let text = text.trim();
    let net = match text.parse::<IpNet>() {
        Ok(net) => net,
        Err(_) => text.parse::<IpAddr>().map(IpNet::from).map_err(|_| {
            HttpConfigError::invalid(
                field,
                format!("{text:?} is not an IP address or CIDR range"),
            )
        })?,
    };
    let net = canonical_net(net);
    let (group, setting) = match net {
        IpNet::V4(_) => (client_ip.ipv4_prefix.min(32), "ipv4_prefix"),
        IpNet::V6(_) => (client_ip.ipv6_prefix.min(128), "ipv6_prefix"),
    };
    if net.prefix_len() > group {
        // `group` is at most the family's width, so this range always exists.
        let whole = IpNet::new(net.addr(), group).map_or(net, |n| n.trunc());
        return Err(HttpConfigError::invalid(
            field,
            format!(
                "{text:?} names part of a client: clients are grouped by /{group} \
                 (client_ip.{setting}) and lists match whole clients; write {whole} (the \
                 client it is in) or a wider range"
            ),
        ));
    }
    Ok(net)
}

/// A compiled [`KeyWhitelistConfig`](crate::http::KeyWhitelistConfig): the requests it matches
/// are not counted by the rules that count by `key`.
pub(crate) struct KeyWhitelist {
    pub(crate) key: RuleKey,
    pub(crate) ips: IpSet,
    pub(crate) clients: HashSet<String>,
    pub(crate) endpoints: Vec<Endpoint>,
}

impl KeyWhitelist {
    pub(crate) fn matches(
        &self,
        ip: Option<IpAddr>,
        client: Option<&str>,
        method: &http::Method,
        path: &str,
    ) -> bool {
        ip.is_some_and(|ip| self.ips.contains(ip))
            || client.is_some_and(|c| self.clients.contains(c))
            || self.endpoints.iter().any(|e| e.matches(method, path))
    }
}

/// The compiled configuration.
pub(crate) struct RuleSet<C: Clock> {
    pub(crate) general: Vec<Arc<Rule<C>>>,
    pub(crate) ip: Vec<(IpNet, Vec<Arc<Rule<C>>>)>,
    pub(crate) client: HashMap<String, Vec<Arc<Rule<C>>>>,
    pub(crate) white_ips: IpSet,
    pub(crate) white_clients: HashSet<String>,
    pub(crate) white_endpoints: Vec<Endpoint>,
    /// The whitelists scoped to the rules of one key.
    pub(crate) key_whitelists: Vec<KeyWhitelist>,
    pub(crate) block_ips: IpSet,
    pub(crate) block_clients: HashSet<String>,
    pub(crate) bans: Option<Arc<Bans<C>>>,
    pub(crate) missing_key: MissingKey,
    /// What a new client gets from a rule whose limiter is full (`Allow` is the engine's to
    /// apply: the limiters themselves answer `TooManyKeys` for it, as for `Reject`).
    pub(crate) key_overflow: KeyOverflowPolicy,
    pub(crate) endpoint_rate_limiting: bool,
    /// Whether any rule is a monitor (shadow) rule: when none is, a request skips looking.
    pub(crate) has_monitors: bool,
    /// The enforced rules of every request, when they do not depend on the request: no IP or
    /// client rules, and no enforced general rule limited to some endpoints (a set of global
    /// limits, the common case). Selected once here instead of on every request.
    pub(crate) fixed_enforced: Option<Vec<Arc<Rule<C>>>>,
    /// Longer client ids count as none.
    pub(crate) client_id_max_len: usize,
    /// The client id of requests that have none (`anonymous_client_id`).
    pub(crate) anonymous_client: Option<String>,
    /// Whether a path's trailing `/` is removed before matching and counting.
    pub(crate) trim_trailing_slash: bool,
    /// Whether anything here looks at a request's path (an endpoint whitelist, a rule limited
    /// to some endpoints, a per-endpoint counter): when nothing does, the path is not
    /// normalized.
    pub(crate) reads_path: bool,
}

impl<C: Clock> RuleSet<C> {
    /// The value of `fixed_enforced` for these rules.
    pub(crate) fn fixed_selection(&self) -> Option<Vec<Arc<Rule<C>>>> {
        let fixed = self.ip.is_empty()
            && self.client.is_empty()
            && self
                .general
                .iter()
                .all(|r| r.monitor || r.endpoint.is_any());
        fixed.then(|| {
            crate::http::engine::select(std::iter::empty(), self.general.iter(), false)
                .into_iter()
                .cloned()
                .collect()
        })
    }

    /// The value of `reads_path` for these rules and lists.
    pub(crate) fn path_read(&self) -> bool {
        !self.white_endpoints.is_empty()
            || self.key_whitelists.iter().any(|w| !w.endpoints.is_empty())
            || self
                .all_rules()
                .any(|r| r.per_endpoint || (self.endpoint_rate_limiting && !r.endpoint.is_any()))
    }

    pub(crate) fn all_rules(&self) -> impl Iterator<Item = &Arc<Rule<C>>> {
        self.general
            .iter()
            .chain(self.ip.iter().flat_map(|(_, r)| r.iter()))
            .chain(self.client.values().flatten())
    }
}

/// Logs (warn) the rules of one list that can never apply, which are valid configuration but
/// almost certainly not what was meant:
///
/// - of the rules of one period that match every endpoint and count alike (same `key` and
///   `per_endpoint`; all enforced, or all monitors), a request is decided by the lowest limit
///   only (the first on a tie): the others are never selected;
/// - with `endpoint_rate_limiting` off, a rule limited to some endpoints never matches.
///
/// Specific rules overriding general ones of the same period are meant, and not reported.
fn warn_dead_rules<C: Clock>(rules: &[Arc<Rule<C>>], field: &str, endpoint_rate_limiting: bool) {
    for (j, rule) in rules.iter().enumerate() {
        if !rule.endpoint.is_any() {
            if !endpoint_rate_limiting {
                tracing::warn!(
                    rule = %rule.name,
                    field = %format_args!("{field}[{j}]"),
                    "this rule never applies: endpoint_rate_limiting is off, so only rules for endpoint \"*\" apply"
                );
            }
            continue;
        }
        // The rule a request is decided by among this one's group: the lowest limit, the first
        // on a tie (as `select` keeps it).
        let winner = rules
            .iter()
            .enumerate()
            .filter(|(_, other)| {
                other.endpoint.is_any()
                    && other.monitor == rule.monitor
                    && crate::http::engine::same_group(other, rule)
            })
            .min_by_key(|&(i, other)| (other.limit, i));
        if let Some((i, other)) = winner.filter(|&(i, _)| i != j) {
            tracing::warn!(
                rule = %rule.name,
                field = %format_args!("{field}[{j}]"),
                applies_instead = %other.name,
                instead_field = %format_args!("{field}[{i}]"),
                period = ?rule.period,
                "this rule never applies: of rules for every endpoint with the same period and the same counter key (key and per_endpoint) only the lowest limit is enforced"
            );
        }
    }
}

/// `rules` with a name given to each unnamed rule whose default name (`"{endpoint}-{period}"`)
/// an earlier rule of the list has: the default name followed by what tells the rules apart,
/// its key (`-ip`, `-client`, `-ip_and_client`), `-monitor` and `-per_endpoint` where set
/// (`"*-1m-client"` beside a per-IP `"*-1m"`). A per-IP and a per-client limit on the same
/// endpoint and period, or a monitor rule shadowing an enforced one, are two rules a user
/// writes without naming them; their default names were refused as duplicates, at a `name`
/// field nobody wrote. The first rule keeps its default name; rules that still collide (the
/// same rule twice) are left for the duplicate check. The name given is not the rule's
/// identity, which depends on no other rule (see [`Compiler::rule`]).
fn distinct_default_names(rules: &[RuleConfig]) -> std::borrow::Cow<'_, [RuleConfig]> {
    let default_name = |r: &RuleConfig| format!("{}-{}", r.endpoint, r.period.trim());
    let mut taken: HashSet<String> = HashSet::new();
    let mut renamed: Option<Vec<RuleConfig>> = None;
    for (i, r) in rules.iter().enumerate() {
        let name = r.name.clone().unwrap_or_else(|| default_name(r));
        if r.name.is_none() && taken.contains(&name) {
            let key = match r.key {
                RuleKey::Ip => "ip",
                RuleKey::Client => "client",
                RuleKey::IpAndClient => "ip_and_client",
            };
            let mut distinct = format!("{name}-{key}");
            if r.monitor {
                distinct.push_str("-monitor");
            }
            if r.per_endpoint {
                distinct.push_str("-per_endpoint");
            }
            if !taken.contains(&distinct) {
                let list = renamed.get_or_insert_with(|| rules.to_vec());
                list[i].name = Some(distinct.clone());
                taken.insert(distinct);
                continue;
            }
        }
        taken.insert(name);
    }
    match renamed {
        Some(list) => std::borrow::Cow::Owned(list),
        None => std::borrow::Cow::Borrowed(rules),
    }
}

/// Why a client rule's or a list's client `id` is one no request's can be, if it is: empty, or
/// longer than `max_len` (`client_id_max_len`), which the engine takes for no client id.
pub(crate) fn unusable_client_id(id: &str, max_len: usize) -> Option<String> {
    (id.is_empty() || id.len() > max_len).then(|| {
        format!(
            "{id:?} must be 1 to client_id_max_len ({max_len}) bytes long: a request's id of any \
             other length is no client id, so no request would match it"
        )
    })
}

/// `backend.failure` as written, read: the Redis backend's failure policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Failure {
    /// `"closed"`, the default.
    Closed,
    /// `"open"`.
    Open,
    /// `"fallback"` (a share of 1) or `"fallback:<share in (0, 1]>"`.
    Fallback(f64),
}

/// Reads `backend.failure` (`None`: the default, `"closed"`), naming the field on error.
pub(crate) fn parse_failure(text: Option<&str>) -> Result<Failure, HttpConfigError> {
    match text.map(str::trim) {
        None | Some("closed") => Ok(Failure::Closed),
        Some("open") => Ok(Failure::Open),
        Some("fallback") => Ok(Failure::Fallback(1.0)),
        Some(other) => other
            .strip_prefix("fallback:")
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| *s > 0.0 && *s <= 1.0)
            .map(Failure::Fallback)
            .ok_or_else(|| {
                HttpConfigError::invalid(
                    "backend.failure",
                    format!(
                        "{other:?} is not a failure policy: expected \"open\", \"closed\", \"fallback\" or \"fallback:<share in (0, 1]>\""
                    ),
                )
            }),
    }
}

pub(crate) fn parse_period(text: &str, field: &str) -> Result<Duration, HttpConfigError> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        HttpConfigError::invalid(field, format!("{text:?} is not a duration ({e})"))
    })?;
    if d.is_zero() {
        return Err(HttpConfigError::invalid(field, "must be greater than zero"));
    }
    Ok(d)
}

pub(crate) fn algorithm(kind: RuleAlgorithm, limit: u32, period: Duration) -> Algorithm {
    match kind {
        RuleAlgorithm::FixedWindow => Algorithm::FixedWindow {
            limit,
            window: period,
        },
        RuleAlgorithm::SlidingWindow => Algorithm::SlidingWindow {
            limit,
            window: period,
        },
        RuleAlgorithm::SlidingCounter => Algorithm::SlidingCounter {
            limit,
            window: period,
        },
        RuleAlgorithm::TokenBucket => Algorithm::TokenBucket {
            rate: Rate::new(limit, period),
            burst: limit,
        },
    }
}

/// A kept limiter, its new parameters, and the rule's name.
type Pending<C> = (KeyedLimiter<CounterKey, C>, Algorithm, String);

/// The key cap every rule's limiter is built with: `max_keys_per_rule`, and the limiter's own
/// overflow policy for `key_overflow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeyCap {
    max: usize,
    overflow: KeyOverflow,
}

impl KeyCap {
    fn of(config: &HttpConfig) -> Result<Self, HttpConfigError> {
        if config.max_keys_per_rule == 0 {
            return Err(HttpConfigError::invalid(
                "max_keys_per_rule",
                "must be at least 1 (the most clients each rule counts in memory)",
            ));
        }
        Ok(KeyCap {
            max: config.max_keys_per_rule,
            overflow: match config.key_overflow {
                KeyOverflowPolicy::Shared => KeyOverflow::Shared,
                _ => KeyOverflow::Reject,
            },
        })
    }

    /// Whether `limiter` was built with this cap (else a reload builds the rule afresh).
    fn fits<C: Clock>(self, limiter: &KeyedLimiter<CounterKey, C>) -> bool {
        limiter.max_keys() == self.max && limiter.overflow() == self.overflow
    }
}

/// Compiles `config`, reusing (and reconfiguring) the limiters of `old` rules with the same
/// identity.
pub(crate) struct Compiler<'a, C: Clock + Clone> {
    clock: &'a C,
    /// The old limiters by identity, in the old rules' order, each taken by one new rule. One
    /// identity can name several rules (the same `ip` listed twice, each with a rule of the
    /// default name): looked up without taking, they all got the last one's limiter, counters
    /// and (reconfigured by each in turn) limit, so that the rule enforced counted by another
    /// rule's limit.
    ///
    /// With each, the old rule's count of waiting requests, if it had a queue.
    old: RefCell<HashMap<Identity, VecDeque<OldRule<C>>>>,
    old_bans: Option<Arc<Bans<C>>>,
    /// Reconfigurations of reused limiters, applied when compilation has succeeded.
    pending: RefCell<Vec<Pending<C>>>,
    /// The key cap of the configuration being compiled.
    cap: Cell<KeyCap>,
}

/// What a new rule may take over from an old rule of its identity.
type OldRule<C> = (KeyedLimiter<CounterKey, C>, Option<Arc<AtomicU64>>);

impl<'a, C: Clock + Clone> Compiler<'a, C> {
    pub(crate) fn new(clock: &'a C, old: Option<&RuleSet<C>>) -> Self {
        let mut map: HashMap<_, VecDeque<_>> = HashMap::new();
        let mut old_bans = None;
        if let Some(old) = old {
            for rule in old.all_rules() {
                if let Some(l) = &rule.limiter {
                    let waiting = rule.queue.as_ref().map(|q| Arc::clone(&q.waiting));
                    map.entry(rule.identity.clone())
                        .or_default()
                        .push_back((l.clone(), waiting));
                }
            }
            old_bans = old.bans.clone();
        }
        Compiler {
            clock,
            old: RefCell::new(map),
            old_bans,
            pending: RefCell::new(Vec::new()),
            cap: Cell::new(KeyCap {
                max: crate::DEFAULT_MAX_KEYS,
                overflow: KeyOverflow::Reject,
            }),
        }
    }

    /// `unnamed`: the rule was written without a name (it may have been given one by
    /// [`distinct_default_names`]).
    fn rule(
        &self,
        scope: &str,
        r: &RuleConfig,
        unnamed: bool,
        field: &str,
    ) -> Result<Rule<C>, HttpConfigError> {
        let period = parse_period(&r.period, &format!("{field}.period"))?;
        let limit = u32::try_from(r.limit).map_err(|_| {
            HttpConfigError::invalid(
                format!("{field}.limit"),
                format!("{} is too large (at most {})", r.limit, u32::MAX),
            )
        })?;
        let endpoint = Endpoint::parse(&r.endpoint, r.regex, &format!("{field}.endpoint"))?;
        let name = match &r.name {
            Some(n) if n.trim().is_empty() => {
                return Err(HttpConfigError::invalid(
                    format!("{field}.name"),
                    "must not be empty",
                ));
            }
            Some(n) => n.clone(),
            None => format!("{}-{}", r.endpoint, r.period.trim()),
        };
        let identity = Identity {
            scope: scope.to_owned(),
            // An unnamed rule's name is its pattern as written; its identity takes the pattern
            // as it reads, like `endpoint` below (the same text when the pattern is written in
            // lower case, as usual: Redis keys named after it stay). Without the suffix that
            // tells it from an earlier unnamed rule (`*-1m-client`), which depends on the
            // rules before it: a reload that added such a rule before it, or swapped the two,
            // started it afresh. What the suffix tells apart is in the identity already
            // (`key`, `per_endpoint`), but for `monitor`: two rules that differ only there
            // are two rules of one identity, told apart by their order.
            // The period likewise as it reads (`60s` is `1m`), in its largest whole unit: the
            // usual spellings (`1s`, `15m`, `12h`, `7d`) are their own, as the names of the
            // Redis keys derived from the identity have always been.
            name: if unnamed {
                format!("{}-{}", endpoint.identity_text(), compact_period(period))
            } else {
                name.clone()
            },
            endpoint: endpoint.identity_text(),
            regex: endpoint.is_regex(),
            period,
            algorithm: r.algorithm,
            key: r.key,
            per_endpoint: r.per_endpoint,
        };
        let algo = algorithm(r.algorithm, limit, period);
        let field_err = |e: crate::ConfigError| {
            let about_time = matches!(
                e,
                crate::ConfigError::TooLarge { what, .. } | crate::ConfigError::Zero { what }
                    if what.contains("window") || what.contains("period")
            );
            let which = if about_time { "period" } else { "limit" };
            HttpConfigError::invalid(
                format!("{field}.{which}"),
                format!("{e} (limit {}, period {:?})", r.limit, r.period),
            )
        };
        let cap = self.cap.get();
        // Taken only for a rule that counts (as before queues: a block takes nothing over).
        let (old_limiter, old_waiting) = match limit {
            0 => (None, None),
            _ => self
                .old
                .borrow_mut()
                .get_mut(&identity)
                .and_then(VecDeque::pop_front)
                .map_or((None, None), |(l, w)| (Some(l), w)),
        };
        let limiter = if limit == 0 {
            None
        } else if let Some(old) = old_limiter.filter(|old| cap.fits(old)) {
            let grows_ring = matches!(
                (old.algorithm(), algo),
                (Algorithm::SlidingWindow { limit: from, .. }, Algorithm::SlidingWindow { limit: to, .. }) if to > from
            );
            if old.algorithm() == algo {
                Some(old)
            } else if grows_ring {
                // The exact sliding window's ring cannot grow in place: a fresh limiter.
                Some(build(algo, self.clock, cap).map_err(field_err)?)
            } else {
                // Validate the new parameters now; change the live limiter only once the whole
                // configuration has compiled, so that a failed reload changes nothing.
                build(algo, self.clock, cap).map_err(field_err)?;
                self.pending
                    .borrow_mut()
                    .push((old.clone(), algo, name.clone()));
                Some(old)
            }
        } else {
            Some(build(algo, self.clock, cap).map_err(field_err)?)
        };
        let queue = match r.queue_limit {
            0 => None,
            limit => Some(Queue {
                limit,
                max_wait: match &r.max_wait {
                    Some(text) => parse_period(text, &format!("{field}.max_wait"))?,
                    None => period,
                },
                waiting: old_waiting.unwrap_or_else(|| Arc::new(AtomicU64::new(0))),
            }),
        };
        let name: Arc<str> = name.into();
        Ok(Rule {
            local_name: LocalName::new(Arc::clone(&name)),
            counters: Counters::new(&name),
            name,
            endpoint,
            period,
            limit,
            key: r.key,
            monitor: r.monitor,
            per_endpoint: r.per_endpoint,
            identity,
            limiter,
            #[cfg(feature = "redis")]
            remote: None,
            queue,
        })
    }

    fn rules(
        &self,
        scope: &str,
        rules: &[RuleConfig],
        field: &str,
    ) -> Result<Vec<Arc<Rule<C>>>, HttpConfigError> {
        let named = distinct_default_names(rules);
        let mut names = HashSet::new();
        let mut out = Vec::with_capacity(named.len());
        for (i, (r, written)) in named.iter().zip(rules).enumerate() {
            let f = format!("{field}[{i}]");
            let rule = self.rule(scope, r, written.name.is_none(), &f)?;
            if !names.insert(rule.name.clone()) {
                let hint = match r.name {
                    Some(_) => "",
                    None => {
                        ": an earlier rule counts the same (endpoint, period, key, monitor, \
                         per_endpoint); give one of them a name, or drop one"
                    }
                };
                return Err(HttpConfigError::invalid(
                    format!("{f}.name"),
                    format!("duplicate rule name {:?}{hint}", &*rule.name),
                ));
            }
            out.push(Arc::new(rule));
        }
        Ok(out)
    }

    /// Checks everything that can fail before building any limiter.
    pub(crate) fn precheck(config: &HttpConfig) -> Result<(), HttpConfigError> {
        let check = |rules: &[RuleConfig], field: &str| -> Result<(), HttpConfigError> {
            for (i, r) in rules.iter().enumerate() {
                let f = format!("{field}[{i}]");
                parse_period(&r.period, &format!("{f}.period"))?;
                Endpoint::parse(&r.endpoint, r.regex, &format!("{f}.endpoint"))?;
                if r.limit > u64::from(u32::MAX) {
                    return Err(HttpConfigError::invalid(
                        format!("{f}.limit"),
                        format!("{} is too large (at most {})", r.limit, u32::MAX),
                    ));
                }
                if let Some(text) = &r.max_wait {
                    if r.queue_limit == 0 {
                        return Err(HttpConfigError::invalid(
                            format!("{f}.max_wait"),
                            "needs queue_limit: without it no request waits",
                        ));
                    }
                    parse_period(text, &format!("{f}.max_wait"))?;
                }
                if r.queue_limit > 0 {
                    let refusal = if r.monitor {
                        Some("a monitor rule rejects nothing, so nothing waits for it")
                    } else if r.limit == 0 {
                        Some("a rule of limit 0 blocks: a request waiting for it would never pass")
                    } else if config.backend.kind == "redis" {
                        Some("waiting is available with the memory backend only")
                    } else {
                        None
                    };
                    if let Some(refusal) = refusal {
                        return Err(HttpConfigError::invalid(
                            format!("{f}.queue_limit"),
                            refusal,
                        ));
                    }
                }
                if r.algorithm == RuleAlgorithm::SlidingWindow && r.limit > 16_777_216 {
                    return Err(HttpConfigError::invalid(
                        format!("{f}.limit"),
                        format!(
                            "{} is too large for sliding_window (at most 16777216)",
                            r.limit
                        ),
                    ));
                }
            }
            Ok(())
        };
        check(&config.rules, "rules")?;
        for (i, ip) in config.ip_rules.iter().enumerate() {
            parse_net(&ip.ip, &format!("ip_rules[{i}].ip"), &config.client_ip)?;
            check(&ip.rules, &format!("ip_rules[{i}].rules"))?;
        }
        for (i, c) in config.client_rules.iter().enumerate() {
            if c.client_id.is_empty() {
                return Err(HttpConfigError::invalid(
                    format!("client_rules[{i}].client_id"),
                    "must not be empty",
                ));
            }
            check(&c.rules, &format!("client_rules[{i}].rules"))?;
        }
        if let Some(h) = &config.client_id_header {
            parse_header(h)?;
        }
        match config.backend.kind.as_str() {
            "memory" if config.backend.cluster => {
                return Err(HttpConfigError::invalid(
                    "backend.cluster",
                    "applies only to kind = \"redis\"",
                ));
            }
            "memory" => {
                // Not used in memory, but a typo there is one still (a configuration switched
                // to "redis" later would be refused only then): read as kind = "redis" reads
                // them. (`url` needs the `redis` feature to be read; `cluster` is refused.)
                parse_failure(config.backend.failure.as_deref())?;
                if let Some(d) = &config.backend.deadline {
                    parse_period(d, "backend.deadline")?;
                }
            }
            #[cfg(feature = "redis")]
            "redis" => {
                crate::http::redis_rules::RedisSettings::of(config)?;
            }
            #[cfg(not(feature = "redis"))]
            "redis" => {
                return Err(HttpConfigError::invalid(
                    "backend.kind",
                    "\"redis\" needs the crate feature `redis` (enable it in Cargo.toml)",
                ));
            }
            other => {
                return Err(HttpConfigError::invalid(
                    "backend.kind",
                    format!("{other:?} is not a backend: expected \"memory\" or \"redis\""),
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn compile(&self, config: &HttpConfig) -> Result<RuleSet<C>, HttpConfigError> {
        Self::precheck(config)?;
        self.cap.set(KeyCap::of(config)?);
        let ipset = |list: &[String], field: &str| -> Result<IpSet, HttpConfigError> {
            list.iter()
                .enumerate()
                .map(|(i, s)| parse_net(s, &format!("{field}[{i}]"), &config.client_ip))
                .collect::<Result<Vec<_>, _>>()
                .map(IpSet)
        };
        let white_ips = ipset(&config.whitelist.ips, "whitelist.ips")?;
        let block_ips = ipset(&config.blocklist.ips, "blocklist.ips")?;
        let endpoints = |list: &[String], field: &str| {
            list.iter()
                .enumerate()
                .map(|(i, e)| Endpoint::parse(e, false, &format!("{field}[{i}]")))
                .collect::<Result<Vec<_>, _>>()
        };
        let white_endpoints = endpoints(&config.whitelist.endpoints, "whitelist.endpoints")?;
        let key_whitelists = config
            .whitelist
            .by_key
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let field = format!("whitelist.by_key[{i}]");
                Ok(KeyWhitelist {
                    key: w.key,
                    ips: ipset(&w.ips, &format!("{field}.ips"))?,
                    clients: w.clients.iter().cloned().collect(),
                    endpoints: endpoints(&w.endpoints, &format!("{field}.endpoints"))?,
                })
            })
            .collect::<Result<Vec<_>, HttpConfigError>>()?;
        if !(1..=4096).contains(&config.client_id_max_len) {
            return Err(HttpConfigError::invalid(
                "client_id_max_len",
                format!("{} is not in 1..=4096 (bytes)", config.client_id_max_len),
            ));
        }
        let anonymous_client = match &config.anonymous_client_id {
            Some(id) if id.is_empty() || id.len() > config.client_id_max_len => {
                return Err(HttpConfigError::invalid(
                    "anonymous_client_id",
                    format!(
                        "{id:?} must be 1 to client_id_max_len ({}) bytes long",
                        config.client_id_max_len
                    ),
                ));
            }
            other => other.clone(),
        };
        // An id the rules never see (empty, or longer than `client_id_max_len`: no client id to
        // them) in a list or a client rule matches no request: a blocklist entry of one blocked
        // no one, a client rule of limit 0 let its client through. Refused, as a list's IP
        // entry inside one client group is.
        let lists = [
            ("whitelist.clients", &config.whitelist.clients),
            ("blocklist.clients", &config.blocklist.clients),
        ];
        let listed = lists.into_iter().flat_map(|(list, ids)| {
            ids.iter()
                .enumerate()
                .map(move |(i, id)| (format!("{list}[{i}]"), id))
        });
        let by_key = config
            .whitelist
            .by_key
            .iter()
            .enumerate()
            .flat_map(|(i, w)| {
                w.clients
                    .iter()
                    .enumerate()
                    .map(move |(j, id)| (format!("whitelist.by_key[{i}].clients[{j}]"), id))
            });
        let ruled = config
            .client_rules
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("client_rules[{i}].client_id"), &c.client_id));
        if let Some((field, message)) = listed.chain(by_key).chain(ruled).find_map(|(field, id)| {
            Some((field, unusable_client_id(id, config.client_id_max_len)?))
        }) {
            return Err(HttpConfigError::invalid(field, message));
        }
        let bans = match &config.bans {
            None => None,
            Some(b) => Some(self.bans(b, &config.client_ip)?),
        };
        let general = self.rules("general", &config.rules, "rules")?;
        let mut ip = Vec::new();
        for (i, entry) in config.ip_rules.iter().enumerate() {
            let net = parse_net(&entry.ip, &format!("ip_rules[{i}].ip"), &config.client_ip)?;
            // The range as it reads (`::ffff:10.0.0.0/104` and `10.0.0.1/8` are `10.0.0.0/8`).
            let scope = format!("ip:{}", net.trunc());
            ip.push((
                net,
                self.rules(&scope, &entry.rules, &format!("ip_rules[{i}].rules"))?,
            ));
        }
        let mut client = HashMap::new();
        for (i, entry) in config.client_rules.iter().enumerate() {
            let scope = format!("client:{}", entry.client_id);
            let rules = self.rules(&scope, &entry.rules, &format!("client_rules[{i}].rules"))?;
            if client.insert(entry.client_id.clone(), rules).is_some() {
                return Err(HttpConfigError::invalid(
                    format!("client_rules[{i}].client_id"),
                    format!("duplicate client id {:?}", entry.client_id),
                ));
            }
        }
        for (limiter, algo, name) in self.pending.borrow_mut().drain(..) {
            if let Err(e) = limiter.reconfigure(algo) {
                // Not expected: the parameters were validated and the algorithm is the same.
                tracing::warn!(rule = %name, error = %e, "rule kept its previous limit");
            }
        }
        warn_dead_rules(&general, "rules", config.endpoint_rate_limiting);
        for (i, (_, rules)) in ip.iter().enumerate() {
            warn_dead_rules(
                rules,
                &format!("ip_rules[{i}].rules"),
                config.endpoint_rate_limiting,
            );
        }
        for (i, entry) in config.client_rules.iter().enumerate() {
            if let Some(rules) = client.get(&entry.client_id) {
                warn_dead_rules(
                    rules,
                    &format!("client_rules[{i}].rules"),
                    config.endpoint_rate_limiting,
                );
            }
        }
        let has_monitors = general
            .iter()
            .chain(ip.iter().flat_map(|(_, r)| r.iter()))
            .chain(client.values().flatten())
            .any(|r| r.monitor);
        let mut set = RuleSet {
            fixed_enforced: None,
            general,
            ip,
            client,
            has_monitors,
            white_ips,
            white_clients: config.whitelist.clients.iter().cloned().collect(),
            white_endpoints,
            key_whitelists,
            block_ips,
            block_clients: config.blocklist.clients.iter().cloned().collect(),
            bans,
            missing_key: config.missing_key,
            key_overflow: config.key_overflow,
            endpoint_rate_limiting: config.endpoint_rate_limiting,
            client_id_max_len: config.client_id_max_len,
            anonymous_client,
            trim_trailing_slash: config.trim_trailing_slash,
            reads_path: true,
        };
        set.fixed_enforced = set.fixed_selection();
        set.reads_path = set.path_read();
        Ok(set)
    }

    fn bans(
        &self,
        b: &BanConfig,
        client_ip: &ClientIpConfig,
    ) -> Result<Arc<Bans<C>>, HttpConfigError> {
        let grouping = (
            client_ip.ipv4_prefix.min(32),
            client_ip.ipv6_prefix.min(128),
        );
        let within = parse_period(&b.within, "bans.within")?;
        let duration = parse_period(&b.duration, "bans.duration")?;
        // Compared as they read, not as they are written: `within = "1m"` and `"60s"` are one
        // window, and a reload that respells a period must not lift every ban.
        if let Some(old) = &self.old_bans {
            let same = |text: &str, period: Duration| {
                parse_period(text, "bans").is_ok_and(|old| old == period)
            };
            if old.config.after == b.after
                && old.config.max_entries == b.max_entries
                && same(&old.config.within, within)
                && same(&old.config.duration, duration)
                && old.grouping == grouping
            {
                return Ok(old.clone());
            }
        }
        // Checked here rather than by the list, for the message the layer has always given.
        let after = match u32::try_from(b.after) {
            Ok(after) if after > 0 => after,
            _ => {
                return Err(HttpConfigError::invalid(
                    "bans.after",
                    format!("{} is not between 1 and {}", b.after, u32::MAX),
                ));
            }
        };
        if b.max_entries == 0 {
            return Err(HttpConfigError::invalid(
                "bans.max_entries",
                "must be greater than zero",
            ));
        }
        let list = BanList::builder(after, within, duration)
            .clock(self.clock.clone())
            .max_keys(b.max_entries)
            .build()
            .map_err(|e| {
                let field = match e {
                    crate::ConfigError::Zero { what: "max_keys" } => "bans.max_entries",
                    crate::ConfigError::Zero {
                        what: "ban duration",
                    } => "bans.duration",
                    _ => "bans.within",
                };
                HttpConfigError::invalid(field, e.to_string())
            })?;
        // The coarser groups the old list's bans may be of, per family: its own grouping (bans
        // start under it until the reload's swap, and are carried after it) and those of its
        // inherited bans still in force, each only if coarser than ours. An inherited prefix
        // whose bans have all ended is dropped here, so checks stop looking it up once a reload
        // has seen the last of them end.
        let inherited = self.old_bans.as_ref().and_then(|old| {
            let (mut v4, mut v6) = (vec![old.grouping.0], vec![old.grouping.1]);
            if let Some(i) = &old.inherited {
                // While a list that `old` replaced is in use, a ban started there may yet be
                // passed on through `old`'s inherited groups to this list (`Bans::pass_on`),
                // after this reads the bans in force there: every prefix `old` may hold.
                if old.predecessor().is_some() {
                    v4.extend_from_slice(&i.v4);
                    v6.extend_from_slice(&i.v6);
                }
                for ((ip, p), _) in i.list.banned() {
                    match ip {
                        IpAddr::V4(_) => v4.push(p),
                        IpAddr::V6(_) => v6.push(p),
                    }
                }
            }
            let coarser = |mut all: Vec<u8>, ours: u8| -> Box<[u8]> {
                all.retain(|&p| p < ours);
                all.sort_unstable();
                all.dedup();
                all.into()
            };
            let (v4, v6) = (coarser(v4, grouping.0), coarser(v6, grouping.1));
            if v4.is_empty() && v6.is_empty() {
                return None;
            }
            // Only carried bans go in, and only checks and unbans follow: `after` and
            // `within` never apply.
            let list = BanList::builder(1, Duration::from_secs(1), duration)
                .clock(self.clock.clone())
                .max_keys(b.max_entries)
                .build()
                .ok()?;
            Some(Inherited { list, v4, v6 })
        });
        let bans = Arc::new(Bans {
            config: b.clone(),
            grouping,
            list,
            inherited,
            warned_full: crate::sync::AtomicU64::new(0),
            successor: Mutex::new(None),
            predecessor: Mutex::new(None),
            handing_over: self.old_bans.as_ref().map_or_else(
                || Arc::new(Mutex::new(())),
                |old| Arc::clone(&old.handing_over),
            ),
        });
        if let Some(old) = &self.old_bans {
            bans.carry(old);
        }
        Ok(bans)
    }
}

fn build<C: Clock + Clone>(
    algo: Algorithm,
    clock: &C,
    cap: KeyCap,
) -> Result<KeyedLimiter<CounterKey, C>, crate::ConfigError> {
    KeyedLimiter::builder(algo)
        .clock(clock.clone())
        .max_keys(cap.max)
        .overflow(cap.overflow)
        // Requests wait in a key's queue for a rule with `queue_limit` (see `wait_and_decide`),
        // as many as that rule-wide count lets wait: the key's own bound must not be lower.
        .queue_limit(u64::from(u32::MAX))
        .build()
}

pub(crate) fn parse_header(h: &str) -> Result<http::HeaderName, HttpConfigError> {
    http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
        HttpConfigError::invalid(
            "client_id_header",
            format!("{h:?} is not a valid header name"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread gets one copy of a name, the same on every call, with the name's text; another
    /// thread gets its own.
    #[test]
    fn each_thread_has_its_own_copy_of_a_name() {
        let name = Arc::new(LocalName::new("per-ip".into()));
        let copy = name.get();
        assert_eq!(&*copy, "per-ip");
        assert!(
            !Arc::ptr_eq(&copy, &name.name),
            "a copy, not the shared name"
        );
        assert!(Arc::ptr_eq(&copy, &name.get()), "the same copy again");
        let shared = Arc::clone(&name);
        let theirs = std::thread::spawn(move || shared.get()).join().unwrap();
        assert!(!Arc::ptr_eq(&copy, &theirs), "another thread's own copy");
        assert_eq!(&*theirs, "per-ip");
    }

    /// A counter key is 32 bytes (a rule holds one per client), its text is the Redis subject,
    /// and keys that differ in any part differ, whatever a client id holds.
    #[test]
    fn counter_keys_are_small_and_unambiguous() {
        #[cfg(target_pointer_width = "64")]
        assert_eq!(std::mem::size_of::<CounterKey>(), 32);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let key = CounterKey::parts(Some(ip), Some("partner"), Some(("GET", "/API/Values")));
        assert_eq!(
            format!("{key:?}"),
            "i10.0.0.1;c7:partner;e15:GET:/api/values;"
        );
        assert_eq!(format!("{:?}", CounterKey::Ip(ip)), "i10.0.0.1;");
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            format!(
                "{:?}",
                CounterKey::parts(Some(v6), None, Some(("POST", "/")))
            ),
            "i2001:db8::1;e6:POST:/;"
        );
        let v4: IpAddr = "192.168.100.255".parse().unwrap();
        assert_eq!(
            format!("{:?}", CounterKey::parts(Some(v4), Some("c"), None)),
            "i192.168.100.255;c1:c;"
        );
        let keys = [
            CounterKey::Ip(ip),
            CounterKey::parts(Some(ip), None, None),
            CounterKey::parts(None, Some("a;e1:b"), None),
            CounterKey::parts(None, Some("a"), Some(("b", ""))),
            CounterKey::parts(None, None, Some(("GET", "/x"))),
            CounterKey::parts(None, Some("GET:/x"), None),
            CounterKey::parts(None, Some(""), None),
            CounterKey::parts(None, None, None),
        ];
        let distinct: HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len(), "{keys:?}");
        // An IPv4 address and a short path stay inline (an AspNet rule with endpoint limiting).
        let CounterKey::V4Parts(_, text) =
            CounterKey::parts(Some(ip), None, Some(("GET", "/api/values/42")))
        else {
            panic!("an IPv4 address beside a path is kept apart");
        };
        assert!(!text.is_heap_allocated(), "{text}");
        // Inline up to 24 bytes, then on the heap: equal either way.
        let long = "a-client-id-well-over-twenty-four-bytes";
        assert_eq!(
            CounterKey::parts(None, Some(long), None),
            CounterKey::parts(None, Some(long), None)
        );
    }

    /// "Rejected `after` times within `within`: banned for `duration`" holds again once a ban
    /// has ended inside the same `within` window: a client that goes on being rejected is
    /// banned again after `after` more rejections, not let off until the window ends.
    #[test]
    fn a_ban_that_ended_can_start_again_within_the_same_window() {
        let clock = crate::ManualClock::new();
        let config =
            HttpConfig::from_toml_str("[bans]\nafter = 2\nwithin = \"1h\"\nduration = \"1m\"\n")
                .unwrap();
        let set = Compiler::new(&clock, None).compile(&config).unwrap();
        let bans = set.bans.as_ref().unwrap();
        let client = BanKey::Ip("192.0.2.1".parse().unwrap());
        let counters = Counters::new(&Arc::from("rule"));
        let banned = || bans.list.check(&client).is_err();
        bans.count_rejection(&client, &counters);
        assert!(!banned(), "one rejection of two");
        bans.count_rejection(&client, &counters);
        assert!(banned(), "the second rejection starts a ban");
        clock.advance(Duration::from_secs(60));
        assert!(!banned(), "the ban lasts a minute");
        bans.count_rejection(&client, &counters);
        assert!(!banned(), "one rejection of two since the ban");
        bans.count_rejection(&client, &counters);
        assert!(
            banned(),
            "two more rejections within the hour start another ban"
        );
    }

    /// Two rules of one identity (the same `ip` listed twice, each with a rule of the default
    /// name) are two rules, each with its own limiter and limit, after a reload as before it.
    #[test]
    fn rules_of_one_identity_keep_their_own_limits_across_a_reload() {
        let clock = crate::ManualClock::new();
        let config = HttpConfig::from_toml_str(
            "[[ip_rules]]\nip = \"10.0.0.0/8\"\n[[ip_rules.rules]]\nperiod = \"1m\"\nlimit = 10\n\
             [[ip_rules]]\nip = \"10.0.0.0/8\"\n[[ip_rules.rules]]\nperiod = \"1m\"\nlimit = 2\n",
        )
        .unwrap();
        let limits = |set: &RuleSet<crate::ManualClock>| -> Vec<(u32, Algorithm)> {
            set.ip
                .iter()
                .flat_map(|(_, rules)| rules.iter())
                .map(|r| (r.limit, r.limiter.as_ref().unwrap().algorithm()))
                .collect()
        };
        let window = Duration::from_secs(60);
        let expected = [10, 2].map(|limit| (limit, Algorithm::FixedWindow { limit, window }));
        let first = Compiler::new(&clock, None).compile(&config).unwrap();
        assert_eq!(limits(&first), expected);
        let reloaded = Compiler::new(&clock, Some(&first))
            .compile(&config)
            .unwrap();
        assert_eq!(limits(&reloaded), expected);
    }

    /// A list built by a reload that refined the grouping inherits the coarser groups' bans,
    /// and a later reload keeps an inherited prefix only while a ban of it is in force: before,
    /// every prefix once inherited was looked up on every request after every later reload.
    #[test]
    fn a_list_inherits_the_groups_bans_only_while_one_is_in_force() {
        let clock = crate::ManualClock::new();
        let config = |v6: u8, after: u32| {
            HttpConfig::from_toml_str(&format!(
                "[client_ip]\nipv6_prefix = {v6}\n\
                 [bans]\nafter = {after}\nwithin = \"1h\"\nduration = \"1h\"\n"
            ))
            .unwrap()
        };
        let bans = |set: &RuleSet<crate::ManualClock>| Arc::clone(set.bans.as_ref().unwrap());
        let v6 =
            |set: &RuleSet<crate::ManualClock>| bans(set).inherited.as_ref().map(|i| i.v6.to_vec());
        let group: IpAddr = "2001:db8:0:7::".parse().unwrap();
        let member = BanKey::Ip("2001:db8:0:7::1".parse().unwrap());
        let reload = |old: &RuleSet<crate::ManualClock>, v6: u8, after: u32| {
            Compiler::new(&clock, Some(old))
                .compile(&config(v6, after))
                .unwrap()
        };
        let first = Compiler::new(&clock, None).compile(&config(64, 1)).unwrap();
        bans(&first)
            .list
            .ban(&BanKey::Ip(group), Duration::from_secs(600))
            .unwrap();
        let finer = reload(&first, 128, 1);
        assert_eq!(v6(&finer), Some(vec![64]));
        assert_eq!(bans(&finer).check(&member), Some(Duration::from_secs(600)));
        // A later reload with the ban in force keeps the group's ban and its prefix.
        clock.advance(Duration::from_secs(300));
        let kept = reload(&finer, 128, 2);
        assert_eq!(v6(&kept), Some(vec![64]));
        assert_eq!(bans(&kept).check(&member), Some(Duration::from_secs(300)));
        // Once it has ended, the next reload drops the prefix, and with it the inherited list.
        clock.advance(Duration::from_secs(300));
        assert_eq!(bans(&kept).check(&member), None);
        let ended = reload(&kept, 128, 3);
        assert_eq!(v6(&ended), None);
        assert_eq!(bans(&ended).check(&member), None);
    }

    /// A regex is the whole path: one that would close the anchoring group (`/a)|(/b`) is
    /// refused rather than matching every path that starts with `/a` or ends with `/b`.
    #[test]
    fn a_regex_cannot_escape_its_anchors() {
        let error = Endpoint::parse("get:/a)|(/b", true, "rules[0].endpoint")
            .expect_err("an unbalanced regex is refused")
            .to_string();
        assert!(
            error.contains("rules[0].endpoint") && error.contains("not a valid regex"),
            "{error}"
        );
        let endpoint = Endpoint::parse("get:/a|/b", true, "rules[0].endpoint").unwrap();
        let get = http::Method::GET;
        assert!(endpoint.matches(&get, "/a") && endpoint.matches(&get, "/B"));
        assert!(!endpoint.matches(&get, "/a/x") && !endpoint.matches(&get, "/x/b"));
    }

    /// The usual spellings of a period are their own identity text (the names of Redis keys
    /// derived from an unnamed rule's identity stay), and every spelling of one period is one.
    #[test]
    fn a_period_reads_as_its_usual_spelling() {
        for usual in [
            "1s", "30s", "90s", "15m", "1h", "12h", "1d", "7d", "500ms", "10us",
        ] {
            let period = parse_period(usual, "period").unwrap();
            assert_eq!(compact_period(period), usual);
        }
        for (written, read) in [
            ("60s", "1m"),
            ("24h", "1d"),
            ("1w", "7d"),
            ("1h 30m", "90m"),
        ] {
            let period = parse_period(written, "period").unwrap();
            assert_eq!(compact_period(period), read, "{written}");
        }
        assert_eq!(compact_period(Duration::from_nanos(1_500)), "1us 500ns");
    }

    #[test]
    fn glob_matches_case_insensitively_with_wildcards() {
        assert!(glob(b"/api/*", b"/API/values"));
        assert!(glob(b"/api/*/items", b"/api/v1/items"));
        assert!(!glob(b"/api/*/items", b"/api/v1/item"));
        assert!(glob(b"*", b""));
        assert!(glob(b"/a*b*c", b"/aXXbYYc"));
        assert!(!glob(b"/a*b*c", b"/aXXbYY"));
        assert!(!glob(b"/api", b"/api/"));
        // `?`: one byte, as in AspNetCoreRateLimit's patterns.
        assert!(glob(b"/api/v?/items", b"/api/v2/items"));
        assert!(!glob(b"/api/v?/items", b"/api/v10/items"));
        assert!(!glob(b"/api/v?", b"/api/v"));
        assert!(glob(b"/a?*", b"/ab/c"));
    }

    #[test]
    fn endpoint_patterns() {
        let e = Endpoint::parse("get:/api/*", false, "f").unwrap();
        assert!(e.matches(&http::Method::GET, "/api/x"));
        assert!(!e.matches(&http::Method::POST, "/api/x"));
        assert!(Endpoint::parse("*", false, "f").unwrap().is_any());
        assert!(Endpoint::parse("*:*", false, "f").unwrap().is_any());
        assert!(Endpoint::parse("g3t:/x", false, "f").is_err());
        assert!(Endpoint::parse("get:x", false, "f").is_err());
        assert!(Endpoint::parse("re:get:[", false, "f").is_err());
    }
}
