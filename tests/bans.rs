//! `BanList`: a ban starts at exactly the `after`-th failure of a window and ends exactly its
//! duration later; every `after`-th failure bans again; manual bans extend and never shorten;
//! unban, forgive, the key cap, idle eviction; a proptest against a reference model; and real
//! threads failing one key start exactly one ban per `after` failures.

use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Barrier;
use std::time::Duration;
use turnstile::{BanList, BanListFull, BanStats, Banned, ConfigError, FailOutcome, ManualClock};

const SEC: Duration = Duration::from_secs(1);
const NS: Duration = Duration::from_nanos(1);

fn list(after: u32, within: Duration, ban: Duration) -> (BanList<u64, ManualClock>, ManualClock) {
    let clock = ManualClock::new();
    let bans = BanList::builder(after, within, ban)
        .clock(clock.clone())
        .build()
        .unwrap();
    (bans, clock)
}

fn retry(bans: &BanList<u64, ManualClock>, key: u64) -> Option<Duration> {
    bans.check(&key).err().map(|b: Banned| b.retry_after())
}

#[test]
fn a_ban_starts_at_exactly_the_after_th_failure_within_the_window() {
    let (bans, _clock) = list(3, 60 * SEC, 600 * SEC);
    for n in 1..3 {
        let outcome = bans.fail(&1).unwrap();
        assert_eq!(outcome.failures, n);
        assert!(!outcome.ban_started, "failure {n} of 3");
        assert_eq!(outcome.banned_for, None);
        assert_eq!(retry(&bans, 1), None, "not banned after {n} of 3");
    }
    let third = bans.fail(&1).unwrap();
    assert_eq!(third.failures, 3);
    assert!(third.ban_started);
    assert_eq!(third.banned_for, Some(600 * SEC));
    assert_eq!(retry(&bans, 1), Some(600 * SEC));
    assert_eq!(retry(&bans, 2), None, "keys are independent");
}

#[test]
fn failures_spread_over_two_windows_do_not_add_up() {
    let (bans, clock) = list(3, 60 * SEC, 600 * SEC);
    clock.advance(30 * SEC);
    bans.fail(&1).unwrap();
    clock.advance(29 * SEC);
    bans.fail(&1).unwrap();
    clock.advance(SEC); // t = 60 s: a new window
    let third = bans.fail(&1).unwrap();
    assert_eq!(
        third.failures, 1,
        "three failures within 30 s, but in two windows"
    );
    assert!(!third.ban_started);
    assert_eq!(retry(&bans, 1), None);
    assert_eq!(bans.failures(&1), 1);
    bans.fail(&1).unwrap();
    assert!(
        bans.fail(&1).unwrap().ban_started,
        "the third of the second window"
    );
    assert_eq!(retry(&bans, 1), Some(600 * SEC));
}

#[test]
fn a_ban_ends_exactly_at_its_duration() {
    let (bans, clock) = list(1, 60 * SEC, 90 * SEC);
    clock.advance(Duration::from_nanos(123_456_789)); // not on a millisecond
    assert!(bans.fail(&1).unwrap().ban_started);
    clock.advance(90 * SEC - NS);
    assert_eq!(
        retry(&bans, 1),
        Some(NS),
        "1 ns before the end: still banned"
    );
    clock.advance(NS);
    assert_eq!(retry(&bans, 1), None, "the ban ends at exactly 90 s");
}

#[test]
fn every_after_th_failure_bans_again_after_a_ban_ends() {
    let (bans, clock) = list(2, 3600 * SEC, 60 * SEC);
    bans.fail(&1).unwrap();
    assert!(bans.fail(&1).unwrap().ban_started);
    clock.advance(60 * SEC);
    assert_eq!(retry(&bans, 1), None);
    let third = bans.fail(&1).unwrap();
    assert!(!third.ban_started, "one failure of two since the ban");
    assert_eq!(third.banned_for, None);
    let fourth = bans.fail(&1).unwrap();
    assert_eq!(fourth.failures, 4);
    assert!(
        fourth.ban_started,
        "two more failures in the same window ban again"
    );
    assert_eq!(retry(&bans, 1), Some(60 * SEC));
    // Failing while banned counts too; an after-th one re-bans from now (a later end).
    clock.advance(10 * SEC);
    bans.fail(&1).unwrap();
    let sixth = bans.fail(&1).unwrap();
    assert!(sixth.ban_started);
    assert_eq!(sixth.banned_for, Some(60 * SEC));
}

#[test]
fn a_manual_ban_extends_and_never_shortens() {
    let (bans, clock) = list(1, 60 * SEC, 600 * SEC);
    assert_eq!(bans.ban(&1, 3600 * SEC).unwrap(), 3600 * SEC);
    assert_eq!(retry(&bans, 1), Some(3600 * SEC));
    clock.advance(100 * SEC);
    // Shorter than what is left: nothing changes.
    assert_eq!(bans.ban(&1, 60 * SEC).unwrap(), 3500 * SEC);
    assert_eq!(retry(&bans, 1), Some(3500 * SEC));
    // An automatic ban shorter than the manual one in force leaves it as it is.
    let outcome = bans.fail(&1).unwrap();
    assert!(outcome.ban_started);
    assert_eq!(outcome.banned_for, Some(3500 * SEC));
    // Longer: extended, to at least the new length and by less than the resolution more.
    clock.advance(Duration::from_nanos(1_500)); // the ban left is not whole milliseconds
    let left = bans.ban(&1, 7200 * SEC).unwrap();
    assert!(
        left >= 7200 * SEC && left < 7200 * SEC + turnstile::BAN_RESOLUTION,
        "{left:?}"
    );
    assert_eq!(retry(&bans, 1), Some(left));
    // A ban of zero changes nothing; a key not banned gets exactly its (whole-ms) length.
    assert_eq!(bans.ban(&2, Duration::ZERO).unwrap(), Duration::ZERO);
    assert_eq!(retry(&bans, 2), None);
    assert_eq!(
        bans.ban(&2, Duration::from_millis(1500)).unwrap(),
        Duration::from_millis(1500)
    );
    // Rounded up to whole milliseconds.
    assert_eq!(
        bans.ban(&3, Duration::from_nanos(1)).unwrap(),
        Duration::from_millis(1)
    );
}

#[test]
fn the_longest_ban_saturates() {
    let (bans, _clock) = list(1, 60 * SEC, Duration::MAX);
    let outcome = bans.fail(&1).unwrap();
    let left = outcome.banned_for.unwrap();
    // 2^63 - 2 ns after the clock's epoch, at most one token's rounding away.
    assert!(
        left >= Duration::from_nanos((1 << 63) - 2 - 1_000_000),
        "{left:?}"
    );
    assert!(left <= Duration::from_nanos((1 << 63) - 2), "{left:?}");
    assert_eq!(
        bans.ban(&1, Duration::MAX).unwrap(),
        left,
        "saturated: nothing more"
    );
}

#[test]
fn unban_lifts_the_ban_and_forgets_the_failures() {
    let (bans, _clock) = list(2, 60 * SEC, 600 * SEC);
    assert!(!bans.unban(&1), "never banned");
    bans.fail(&1).unwrap();
    bans.fail(&1).unwrap();
    assert!(retry(&bans, 1).is_some());
    assert!(bans.unban(&1));
    assert_eq!(retry(&bans, 1), None);
    assert_eq!(bans.failures(&1), 0);
    assert!(
        !bans.fail(&1).unwrap().ban_started,
        "after more failures again"
    );
    assert!(bans.fail(&1).unwrap().ban_started);
    assert!(bans.unban(&1));
    assert!(!bans.unban(&1));
    // A manual ban is lifted too.
    bans.ban(&2, 60 * SEC).unwrap();
    assert!(bans.unban(&2));
    assert_eq!(retry(&bans, 2), None);
}

#[test]
fn forgive_forgets_the_failures_and_keeps_a_ban() {
    let (bans, _clock) = list(3, 60 * SEC, 600 * SEC);
    bans.fail(&1).unwrap();
    bans.fail(&1).unwrap();
    assert!(bans.forgive(&1));
    assert_eq!(bans.failures(&1), 0);
    bans.fail(&1).unwrap();
    bans.fail(&1).unwrap();
    assert_eq!(retry(&bans, 1), None, "two since the forgiveness");
    assert!(bans.fail(&1).unwrap().ban_started);
    assert!(bans.forgive(&1));
    assert_eq!(retry(&bans, 1), Some(600 * SEC), "forgiving leaves the ban");
    assert!(!bans.forgive(&2));
}

#[test]
fn at_the_cap_a_new_key_is_neither_banned_nor_a_ban_lost() {
    let clock = ManualClock::new();
    let bans = BanList::builder(1, 60 * SEC, 600 * SEC)
        .clock(clock.clone())
        .max_keys(1)
        .build()
        .unwrap();
    assert!(bans.fail(&"a").unwrap().ban_started);
    // Both tables are full of "a", busy.
    assert_eq!(bans.fail(&"b"), Err(BanListFull { max_keys: 1 }));
    assert_eq!(bans.ban(&"b", SEC), Err(BanListFull { max_keys: 1 }));
    assert!(bans.check(&"b").is_ok(), "not banned by accident");
    assert_eq!(
        bans.check(&"a").unwrap_err().retry_after(),
        600 * SEC,
        "not lost"
    );
    assert_eq!(bans.len(), 2);
    // Once the window has passed and the ban ended, "a" is idle and makes room.
    clock.advance(600 * SEC);
    assert!(bans.fail(&"b").unwrap().ban_started);
    assert!(bans.check(&"b").is_err());
    assert!(bans.check(&"a").is_ok());
    // While "b"'s ban is in force, "a"'s failure (its window passed) is due to ban it, but the
    // ban is refused: the caller learns that neither was recorded.
    clock.advance(60 * SEC);
    assert_eq!(bans.fail(&"a"), Err(BanListFull { max_keys: 1 }));
    assert!(bans.check(&"b").is_err(), "b's ban is kept");
}

#[test]
fn idle_keys_are_evicted() {
    let (bans, clock) = list(2, 60 * SEC, 120 * SEC);
    for key in 0..500u64 {
        bans.fail(&key).unwrap();
        if key % 2 == 0 {
            bans.fail(&key).unwrap(); // banned for two minutes
        }
    }
    assert_eq!(bans.len(), 750);
    assert_eq!(bans.sweep(), 0, "all busy");
    clock.advance(60 * SEC);
    assert_eq!(
        bans.sweep(),
        500,
        "the failures' window passed; the bans go on"
    );
    assert_eq!(bans.len(), 250);
    assert!(bans.check(&0).is_err());
    clock.advance(60 * SEC);
    assert_eq!(bans.sweep(), 250);
    assert_eq!(bans.len(), 0);
    assert!(bans.is_empty());
}

#[test]
fn check_and_failures_never_create_a_key() {
    let (bans, _clock) = list(2, 60 * SEC, 120 * SEC);
    for key in 0..1000u64 {
        assert!(bans.check(&key).is_ok());
        assert_eq!(bans.failures(&key), 0);
    }
    assert!(bans.is_empty());
    assert!(!bans.unban(&7) && !bans.forgive(&7));
    assert!(bans.is_empty());
}

#[test]
fn zero_parameters_are_config_errors() {
    let build = |after, within, ban, max_keys| {
        BanList::<u64>::builder(after, within, ban)
            .max_keys(max_keys)
            .build()
            .map(|_| ())
    };
    assert_eq!(
        build(0, SEC, SEC, 10),
        Err(ConfigError::Zero { what: "after" })
    );
    assert_eq!(
        build(1, Duration::ZERO, SEC, 10),
        Err(ConfigError::Zero { what: "within" })
    );
    assert_eq!(
        build(1, SEC, Duration::ZERO, 10),
        Err(ConfigError::Zero {
            what: "ban duration"
        })
    );
    assert_eq!(
        build(1, SEC, SEC, 0),
        Err(ConfigError::Zero { what: "max_keys" })
    );
    assert!(matches!(
        build(1, Duration::MAX, SEC, 10),
        Err(ConfigError::TooLarge { what: "within", .. })
    ));
    assert_eq!(build(u32::MAX, SEC, Duration::MAX, 1), Ok(()));
}

#[test]
fn clones_share_state_and_the_list_is_send_sync_debug() {
    fn shareable<T: Send + Sync + Clone + std::fmt::Debug + 'static>(_: &T) {}
    let (bans, _clock) = list(1, 60 * SEC, 60 * SEC);
    shareable(&bans);
    let other = bans.clone();
    other.fail(&9).unwrap();
    assert!(bans.check(&9).is_err());
    let debug = format!("{bans:?}");
    assert!(
        debug.contains("BanList") && debug.contains("after: 1"),
        "{debug}"
    );
}

/// Real threads failing one key at once: every failure gets its own count, and exactly one in
/// `after` starts a ban.
#[test]
fn concurrent_failures_start_exactly_one_ban_per_after_failures() {
    const THREADS: usize = 8;
    const EACH: usize = 500;
    const AFTER: u32 = 7;
    for _ in 0..5 {
        let (bans, _clock) = list(AFTER, 3600 * SEC, 60 * SEC);
        let barrier = Barrier::new(THREADS);
        let outcomes: Vec<Vec<FailOutcome>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        (0..EACH)
                            .map(|_| bans.fail(&1).unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let all: Vec<FailOutcome> = outcomes.into_iter().flatten().collect();
        let started = all.iter().filter(|o| o.ban_started).count();
        assert_eq!(started, THREADS * EACH / AFTER as usize);
        let mut counts: Vec<u32> = all.iter().map(|o| o.failures).collect();
        counts.sort_unstable();
        assert_eq!(counts, (1..=(THREADS * EACH) as u32).collect::<Vec<_>>());
        assert!(
            all.iter()
                .all(|o| o.ban_started == (o.failures % AFTER == 0))
        );
        assert_eq!(retry(&bans, 1), Some(60 * SEC));
    }
}

/// Real threads banning one key at once (by hand and by failures): the ban is the longest
/// asked for, never the sum of several.
#[test]
fn concurrent_bans_do_not_add_up() {
    const THREADS: usize = 4;
    let (bans, _clock) = list(1, 3600 * SEC, 60 * SEC);
    let barrier = Barrier::new(THREADS);
    for round in 0..300u64 {
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (bans, barrier) = (&bans, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    if t % 2 == 0 {
                        bans.ban(&round, 60 * SEC).unwrap();
                    } else {
                        bans.fail(&round).unwrap();
                    }
                });
            }
        });
        assert_eq!(retry(&bans, round), Some(60 * SEC), "round {round}");
    }
}

/// The reference: every failure's time per key, and when each key's ban ends.
#[derive(Default)]
struct Model {
    now: u64,
    failures: HashMap<u64, Vec<u64>>,
    ban_end: HashMap<u64, u64>,
}

const MS: u64 = 1_000_000;

impl Model {
    fn count(&self, key: u64, within: u64) -> u32 {
        let window = self.now / within;
        self.failures.get(&key).map_or(0, |times| {
            times.iter().filter(|t| *t / within == window).count() as u32
        })
    }

    fn left(&self, key: u64) -> Option<u64> {
        let end = *self.ban_end.get(&key).unwrap_or(&0);
        (end > self.now).then(|| end - self.now)
    }

    /// At least `d` from now, in whole milliseconds added to what is left.
    fn extend(&mut self, key: u64, d: u64) -> u64 {
        let left = self.left(key).unwrap_or(0);
        if d > left {
            let tokens = (d - left).div_ceil(MS);
            self.ban_end.insert(key, self.now + left + tokens * MS);
        }
        self.left(key).unwrap_or(0)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Fail(u64),
    Check(u64),
    Ban(u64, u64),
    Unban(u64),
    Forgive(u64),
    Advance(u64),
    Sweep,
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..3u64;
    prop_oneof![
        6 => key.clone().prop_map(Op::Fail),
        3 => key.clone().prop_map(Op::Check),
        2 => (key.clone(), 1..5_000_000_000u64).prop_map(|(k, d)| Op::Ban(k, d)),
        1 => key.clone().prop_map(Op::Unban),
        1 => key.prop_map(Op::Forgive),
        3 => prop_oneof![0..2_000_000_000u64, 0..3u64, Just(MS), Just(MS - 1)].prop_map(Op::Advance),
        1 => Just(Op::Sweep),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn matches_the_reference_model(
        after in 1..5u32,
        within_ms in 1..3_000u64,
        ban_ns in 1..4_000_000_000u64,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let within = within_ms * MS;
        let (bans, clock) = list(after, Duration::from_nanos(within), Duration::from_nanos(ban_ns));
        let mut model = Model::default();
        // Every check the test makes that answers Banned is a refusal in the stats.
        let refused = std::cell::Cell::new(0u64);
        let (mut failed, mut banned) = (0u64, 0u64);
        let key_left = |bans: &BanList<u64, ManualClock>, k| {
            let left = bans.check(&k).err().map(|b| b.retry_after().as_nanos() as u64);
            refused.set(refused.get() + u64::from(left.is_some()));
            left
        };
        for op in ops {
            match op {
                Op::Fail(k) => {
                    let got = bans.fail(&k).unwrap();
                    model.failures.entry(k).or_default().push(model.now);
                    let count = model.count(k, within);
                    let due = count % after == 0;
                    if due {
                        model.extend(k, ban_ns);
                    }
                    failed += 1;
                    banned += u64::from(due);
                    prop_assert_eq!(got.failures, count);
                    prop_assert_eq!(got.ban_started, due);
                    prop_assert_eq!(got.banned_for.map(|d| d.as_nanos() as u64), model.left(k));
                }
                Op::Check(k) => {
                    prop_assert_eq!(key_left(&bans, k), model.left(k));
                    prop_assert_eq!(bans.failures(&k), model.count(k, within));
                }
                Op::Ban(k, d) => {
                    let got = bans.ban(&k, Duration::from_nanos(d)).unwrap();
                    let before = model.left(k).unwrap_or(0);
                    prop_assert_eq!(got.as_nanos() as u64, model.extend(k, d));
                    banned += u64::from(d > before);
                }
                Op::Unban(k) => {
                    let was = model.left(k).is_some();
                    model.ban_end.remove(&k);
                    model.failures.remove(&k);
                    prop_assert_eq!(bans.unban(&k), was);
                }
                Op::Forgive(k) => {
                    let had = model.count(k, within) > 0;
                    model.failures.remove(&k);
                    let forgave = bans.forgive(&k);
                    // True also for a passed window not yet evicted; never false for failures
                    // of this window.
                    prop_assert!(forgave || !had);
                }
                Op::Advance(ns) => {
                    clock.advance(Duration::from_nanos(ns));
                    model.now += ns;
                }
                Op::Sweep => {
                    bans.sweep();
                }
            }
            for k in 0..3 {
                prop_assert_eq!(key_left(&bans, k), model.left(k));
            }
            let stats = bans.stats();
            prop_assert_eq!((stats.failures, stats.bans, stats.full), (failed, banned, 0));
            prop_assert_eq!(stats.refused, refused.get());
        }
    }
}

/// Real threads: an `unban` that lands between a failure's count and the ban that count
/// starts. The failure was counted before the unban forgot it, so either the failure comes
/// first (the unban lifts its ban: not banned, no failures) or the unban does (the failure is
/// counted again after it: banned, one failure). Banned with no failure counted is neither.
#[test]
fn an_unban_racing_a_ban_starting_failure_leaves_no_ban_without_failures() {
    const KEYS: u64 = 20_000;
    let (bans, _clock) = list(1, 3600 * SEC, 60 * SEC);
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            barrier.wait();
            for k in 0..KEYS {
                bans.fail(&k).unwrap();
            }
        });
        s.spawn(|| {
            barrier.wait();
            for k in 0..KEYS {
                // Once the failure is counted, its ban is about to start: unban now.
                while bans.failures(&k) == 0 {
                    std::hint::spin_loop();
                }
                bans.unban(&k);
            }
        });
    });
    let orphans: Vec<u64> = (0..KEYS)
        .filter(|k| bans.check(k).is_err() && bans.failures(k) == 0)
        .collect();
    assert!(
        orphans.is_empty(),
        "{} keys banned with no failure counted, first {:?}",
        orphans.len(),
        orphans.first()
    );
}

/// Each counter counts its events and nothing else: failures beyond a full table, bans that
/// changed nothing, and the list's own internal checks are not counted.
#[test]
fn stats_count_failures_bans_refusals_and_full_exactly() {
    let (bans, clock) = {
        let clock = ManualClock::new();
        let bans = BanList::builder(2, 60 * SEC, 600 * SEC)
            .clock(clock.clone())
            .max_keys(2)
            .build()
            .unwrap();
        (bans, clock)
    };
    assert_eq!(bans.stats(), BanStats::default());
    bans.fail(&1).unwrap();
    assert!(bans.check(&1).is_ok());
    let second = bans.fail(&1).unwrap(); // bans key 1
    assert!(second.ban_started);
    assert!(bans.check(&1).is_err());
    assert!(bans.check(&1).is_err());
    // A shorter manual ban changes nothing; a longer one lengthens it.
    bans.ban(&1, SEC).unwrap();
    bans.ban(&1, 700 * SEC).unwrap();
    bans.fail(&2).unwrap();
    // Both tables hold two busy keys (failures: 1, 2; bans: 1 and then 2).
    bans.ban(&2, SEC).unwrap();
    assert_eq!(bans.fail(&3), Err(BanListFull { max_keys: 2 }));
    assert_eq!(bans.ban(&3, SEC), Err(BanListFull { max_keys: 2 }));
    let stats = bans.stats();
    assert_eq!(stats.failures, 3, "the refused failure is not counted");
    assert_eq!(stats.bans, 3, "key 1's ban, its lengthening, key 2's ban");
    assert_eq!(stats.refused, 2, "only checks answered Banned");
    assert_eq!(stats.full, 2);
    assert_eq!((stats.failing_keys, stats.banned_keys), (2, 2));
    // Unban, forgive and sweep count nothing but change the key counts.
    assert!(bans.unban(&1));
    bans.forgive(&2);
    clock.advance(SEC);
    bans.sweep();
    let after = bans.stats();
    assert_eq!(
        (after.failures, after.bans, after.refused, after.full),
        (3, 3, 2, 2)
    );
    assert_eq!((after.failing_keys, after.banned_keys), (0, 0));
}

/// Real threads: the per-thread counts add up to every event once the threads are done.
#[test]
fn stats_are_exact_after_concurrent_calls() {
    const THREADS: u64 = 4;
    const EACH: u64 = 1_000;
    let (bans, _clock) = list(10, 3600 * SEC, 60 * SEC);
    let barrier = Barrier::new(THREADS as usize);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (bans, barrier) = (&bans, &barrier);
            s.spawn(move || {
                barrier.wait();
                for i in 0..EACH {
                    let key = (t * EACH + i) % 50;
                    let _ = bans.check(&key);
                    bans.fail(&key).unwrap();
                }
            });
        }
    });
    let stats = bans.stats();
    assert_eq!(stats.failures, THREADS * EACH);
    // 80 failures per key: 8 bans each, the first of them refusing later checks.
    assert_eq!(stats.bans, 50 * 8);
    assert_eq!((stats.failing_keys, stats.banned_keys), (50, 50));
    assert!(stats.refused > 0 && stats.refused < THREADS * EACH);
}

/// The sweeper empties both tables once windows pass and bans end, without new keys, and ends
/// when the list is dropped.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_sweeper_evicts_idle_keys_and_ends_with_the_list() {
    let bans = BanList::builder(1, 10 * SEC, 30 * SEC)
        .clock(turnstile::TokioClock::new())
        .build()
        .unwrap();
    let sweeper = tokio::spawn(bans.run_sweeper(5 * SEC));
    for k in 0..10u64 {
        bans.fail(&k).unwrap();
    }
    assert_eq!(bans.len(), 20);
    // At 12 s the failure windows have passed and the bans are in force: only bans remain.
    tokio::time::sleep(12 * SEC).await;
    assert_eq!(bans.stats().failing_keys, 0);
    assert_eq!(bans.stats().banned_keys, 10);
    assert!(bans.check(&3).is_err());
    // At 32 s the bans have ended, and the sweep at 35 s evicts them.
    tokio::time::sleep(23 * SEC).await;
    assert!(bans.is_empty());
    drop(bans);
    tokio::time::timeout(10 * SEC, sweeper)
        .await
        .expect("the sweeper ends once the list is gone")
        .unwrap();
}

/// `failures` of a key the list holds no failures of is 0, also when the failures table is at
/// its cap with every key busy (the key's failure was refused as `BanListFull`, or it never
/// failed): it reports what the list holds, not what a new key could be admitted.
#[test]
fn failures_of_a_key_a_full_table_holds_nothing_of_are_zero() {
    let clock = ManualClock::new();
    let bans = BanList::builder(3, 60 * SEC, 600 * SEC)
        .clock(clock.clone())
        .max_keys(1)
        .build()
        .unwrap();
    bans.fail(&"a").unwrap();
    assert_eq!(bans.fail(&"b"), Err(BanListFull { max_keys: 1 }));
    assert_eq!(bans.failures(&"a"), 1);
    assert_eq!(bans.failures(&"b"), 0, "b's failure was not recorded");
    assert_eq!(bans.failures(&"c"), 0, "c never failed");
    assert!(bans.check(&"b").is_ok());
    // Once "a"'s window has passed, "b" gets room and its count starts from 1.
    clock.advance(60 * SEC);
    assert_eq!(bans.failures(&"b"), 0);
    assert_eq!(bans.fail(&"b").unwrap().failures, 1);
    assert_eq!(bans.failures(&"b"), 1);
}

/// A ban that has reached its saturation (2^63 − 2 ns after the clock's epoch) cannot be made
/// longer: a `ban` that asks for more returns what is left, and counts no ban in the stats,
/// which count only `ban` calls that started a ban or lengthened one.
#[test]
fn a_ban_at_its_saturation_is_not_lengthened_nor_counted_again() {
    let (bans, clock) = list(1, 60 * SEC, 60 * SEC);
    let first = bans.ban(&1, Duration::MAX).unwrap();
    assert_eq!(bans.stats().bans, 1);
    assert_eq!(bans.ban(&1, Duration::MAX).unwrap(), first);
    assert_eq!(bans.ban(&1, Duration::MAX - SEC).unwrap(), first);
    assert_eq!(bans.stats().bans, 1, "nothing was lengthened");
    clock.advance(86_400 * SEC);
    assert_eq!(bans.ban(&1, Duration::MAX).unwrap(), first - 86_400 * SEC);
    assert_eq!(bans.stats().bans, 1, "a day later, still saturated");
    // A ban that reaches the saturation from below is a lengthening.
    bans.ban(&2, 60 * SEC).unwrap();
    assert_eq!(bans.stats().bans, 2);
    let saturated = bans.ban(&2, Duration::MAX).unwrap();
    assert_eq!(saturated, first - 86_400 * SEC);
    assert_eq!(bans.stats().bans, 3);
}

/// Probes that found nothing, pinned: a clock read past its last reading (`ManualClock`
/// advanced by `Duration::MAX`), the longest `within` a fixed window takes, a `within` of 1 ns,
/// a `max_keys` of `usize::MAX`, and a key at a full table whose ban has ended: no panic,
/// and the outcomes the docs promise.
#[test]
fn extreme_clocks_windows_and_caps_neither_panic_nor_misjudge() {
    // The clock at its end: bans still start, are checked, listed, lengthened and lifted.
    let (bans, clock) = list(2, 60 * SEC, Duration::MAX);
    clock.advance(Duration::MAX);
    assert!(!bans.fail(&1).unwrap().ban_started);
    let second = bans.fail(&1).unwrap();
    assert!(second.ban_started);
    let forever = second.banned_for.unwrap();
    assert!(
        forever > Duration::from_secs(86_400 * 365 * 100),
        "{forever:?}"
    );
    assert_eq!(retry(&bans, 1), Some(forever));
    // Time stands still for the bans there: a ban of a second never ends either, and says so
    // rather than "a second" for ever.
    let never = Duration::from_nanos(1 << 62);
    assert_eq!(bans.ban(&2, SEC).unwrap(), never);
    assert_eq!(retry(&bans, 2), Some(never));
    assert_eq!(bans.ban(&2, Duration::MAX).unwrap(), forever);
    let mut banned = bans.banned();
    banned.sort();
    assert_eq!(banned, [(1, forever), (2, forever)]);
    assert_eq!(bans.sweep(), 0);
    assert!(bans.unban(&1) && bans.unban(&2));
    assert!(bans.is_empty());

    // The longest window (u64::MAX ns): failures a century apart add up; the second window,
    // aligned to the epoch as every window is, starts at the clock's very last reading.
    let (bans, clock) = list(3, Duration::from_nanos(u64::MAX), SEC);
    bans.fail(&1).unwrap();
    clock.advance(Duration::from_secs(86_400 * 365 * 100));
    assert_eq!(bans.fail(&1).unwrap().failures, 2);
    clock.advance(Duration::MAX);
    assert_eq!(bans.failures(&1), 0);
    assert_eq!(bans.fail(&1).unwrap().failures, 1);

    // A window of 1 ns: failures of one instant add up; the next nanosecond starts over.
    let (bans, clock) = list(2, NS, SEC);
    bans.fail(&1).unwrap();
    assert!(bans.fail(&1).unwrap().ban_started);
    clock.advance(NS);
    assert_eq!(bans.failures(&1), 0);
    assert!(!bans.fail(&1).unwrap().ban_started);

    // No cap to speak of: built, and works.
    let huge = BanList::builder(1, SEC, SEC)
        .clock(ManualClock::new())
        .max_keys(usize::MAX)
        .build()
        .unwrap();
    assert!(huge.fail(&1u64).unwrap().ban_started);
    assert_eq!(huge.max_keys(), usize::MAX);

    // One key's room at each table: once its ban ends (its window going on), it is banned again
    // by its next failure and by hand, on the cells it holds.
    let clock = ManualClock::new();
    let bans = BanList::builder(1, 10 * SEC, 5 * SEC)
        .clock(clock.clone())
        .max_keys(1)
        .build()
        .unwrap();
    assert!(bans.fail(&1u64).unwrap().ban_started);
    clock.advance(5 * SEC);
    assert!(bans.check(&1).is_ok());
    let again = bans.fail(&1).unwrap();
    assert_eq!((again.failures, again.banned_for), (2, Some(5 * SEC)));
    assert_eq!(bans.ban(&1, 7 * SEC), Ok(7 * SEC));
}

/// A ban is charged in chunks of at most `u32::MAX` milliseconds (about 49.7 days): lengths
/// at, just past and several times that boundary, and one with a part of a millisecond, end
/// exactly their whole milliseconds later, and an extension across chunks ends at least its
/// length and less than a millisecond later. A ban with 1 ns left is not lengthened by 1 ns,
/// and extended by 2 ns it gains one whole millisecond. (Probes that found nothing, pinned.)
#[test]
fn bans_of_more_than_u32_max_milliseconds_are_exact_across_charges() {
    let (bans, clock) = list(1, 60 * SEC, 60 * SEC);
    let ms = Duration::from_millis(1);
    for (k, d) in [
        (1u64, ms * u32::MAX),
        (2, ms * u32::MAX + ms),
        (3, ms * u32::MAX + Duration::from_nanos(500_000)),
        (4, ms * u32::MAX * 3 + ms * 7),
    ] {
        let left = bans.ban(&k, d).unwrap();
        let want = Duration::from_nanos(d.as_nanos().div_ceil(1_000_000) as u64 * 1_000_000);
        assert_eq!(left, want, "{k}");
        assert_eq!(retry(&bans, k), Some(want));
    }
    clock.advance(Duration::from_nanos(123));
    let left = bans.ban(&1, ms * u32::MAX * 2).unwrap();
    assert!(
        left >= ms * u32::MAX * 2 && left < ms * u32::MAX * 2 + ms,
        "{left:?}"
    );
    // Extension of a key whose ban has sub-ms left, by exactly the rest.
    let (bans, clock) = list(1, 60 * SEC, 60 * SEC);
    bans.ban(&9, SEC).unwrap();
    clock.advance(Duration::from_nanos(999_999_999));
    assert_eq!(retry(&bans, 9), Some(NS));
    assert_eq!(bans.ban(&9, NS).unwrap(), NS);
    assert_eq!(bans.stats().bans, 1);
    let l = bans.ban(&9, 2 * NS).unwrap();
    assert_eq!(l, NS + ms);
    clock.advance(NS + ms);
    assert_eq!(retry(&bans, 9), None);
}

/// A failure that should start a ban the full bans table could not record is not counted
/// either: the key's next failure, once the table has room, is that `after`-th failure again
/// and bans it. Counting it left the key one past the `after`-th failure, and with a
/// count not a multiple of `after` it went on failing unbanned (`after - 1` more times) with
/// `after` failures or more in the window.
#[test]
fn a_ban_the_full_table_refused_is_started_by_the_next_failure() {
    let clock = ManualClock::new();
    let bans = BanList::builder(2, 60 * SEC, 600 * SEC)
        .clock(clock.clone())
        .max_keys(2)
        .build()
        .unwrap();
    bans.ban(&"b", 600 * SEC).unwrap();
    bans.ban(&"c", 600 * SEC).unwrap();
    assert!(!bans.fail(&"a").unwrap().ban_started);
    // The second failure is due to ban "a", but the bans table is full of bans in force.
    assert_eq!(bans.fail(&"a"), Err(BanListFull { max_keys: 2 }));
    assert!(bans.check(&"a").is_ok());
    assert_eq!(bans.failures(&"a"), 1, "the refused failure is not counted");
    assert_eq!(bans.stats().failures, 1);
    // Room again: the next failure is the second of the window, and bans.
    assert!(bans.unban(&"b"));
    clock.advance(SEC);
    let next = bans.fail(&"a").unwrap();
    assert_eq!((next.failures, next.ban_started), (2, true));
    assert_eq!(bans.check(&"a").unwrap_err().retry_after(), 600 * SEC);
}
