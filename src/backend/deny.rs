//! The local deny cache: subjects Redis rejected, and until when, so that further calls for them
//! are rejected in-process with no round trip.
//!
//! Bounded: at most `capacity` entries across up to 16 shards (each shard holds at most its share,
//! and the shares add up to `capacity`).
//! A full shard first drops its expired entries; if none has expired, the new entry is not cached
//! (the call still got Redis's answer; only the shortcut is lost). A shard knows when its first
//! entry expires at the earliest, so a full shard whose entries all hold is not scanned again for
//! every rejection that finds it full (under a flood of new subjects, each scan of a large
//! cache's shard would cost its whole share under the shard's lock).
//!
//! **Never stricter than Redis.** An entry ends at `sent + retry_after`, where `sent` is when the
//! rejected request left this process: Redis decided after that, so its "not before" time is no
//! earlier than ours. An entry also records the permits asked for, and answers only calls asking
//! for as many: a call for fewer might fit sooner, and a call for more would get a retry-after
//! shorter than Redis's, so both go to Redis. (Calls for one permit are the common case.) It
//! also records the limit Redis's rejection named, which its own rejections name again.

use crate::sync::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::time::Instant;

const SHARDS: usize = 16;

struct Entry {
    until: Instant,
    permits: u32,
    /// The limit Redis's rejection named (a chain's member that rejected), so that the cached
    /// rejection names it too.
    limit: u32,
}

/// One shard's entries: subject → entry.
#[derive(Default)]
struct Entries {
    map: HashMap<Box<[u8]>, Entry>,
    /// No entry expires before this (a lower bound: entries dropped since may have ended
    /// later); `None` when nothing was held since the last scan.
    earliest: Option<Instant>,
}

/// One shard.
type Shard = Mutex<Entries>;

pub(crate) struct DenyCache {
    shards: Box<[Shard]>,
    capacity: usize,
    hasher: RandomState,
}

impl DenyCache {
    /// A cache of at most `capacity` subjects; 0 disables it.
    pub(crate) fn new(capacity: usize) -> Self {
        // Never more shards than entries, so that every shard's share is at least one.
        let shards = capacity.min(SHARDS);
        DenyCache {
            shards: (0..shards)
                .map(|_| Mutex::new(Entries::default()))
                .collect(),
            capacity,
            hasher: RandomState::new(),
        }
    }

    /// `subject`'s shard and that shard's share of the capacity (the shares add up to it).
    fn shard(&self, subject: &[u8]) -> Option<(&Shard, usize)> {
        let shards = self.shards.len();
        if shards == 0 {
            return None;
        }
        let i = self.hasher.hash_one(subject) as usize % shards;
        let share = self.capacity / shards + usize::from(i < self.capacity % shards);
        Some((&self.shards[i], share))
    }

    /// If `subject` is denied for `permits` at `now`, the time left and the limit that denied it.
    pub(crate) fn check(&self, subject: &[u8], permits: u32, now: Instant) -> Option<(u64, u32)> {
        let (shard, _) = self.shard(subject)?;
        let mut entries = crate::sync::lock(shard);
        let entry = entries.map.get(subject)?;
        if entry.until <= now {
            entries.map.remove(subject);
            return None;
        }
        if permits.max(1) != entry.permits {
            return None;
        }
        let left = u64::try_from((entry.until - now).as_nanos()).unwrap_or(u64::MAX);
        Some((left, entry.limit))
    }

    /// Records that `subject` cannot get `permits` before `until`, by the rule of `limit`.
    pub(crate) fn deny(
        &self,
        subject: &[u8],
        permits: u32,
        limit: u32,
        until: Instant,
        now: Instant,
    ) {
        let Some((shard, share)) = self.shard(subject) else {
            return;
        };
        if until <= now {
            return;
        }
        let permits = permits.max(1);
        let mut entries = crate::sync::lock(shard);
        let Entries { map, earliest } = &mut *entries;
        if let Some(entry) = map.get_mut(subject) {
            // The latest rejection wins; for the same permits, the later deadline (both hold),
            // with the limit that gave it.
            if permits != entry.permits || until > entry.until {
                *entry = Entry {
                    until,
                    permits,
                    limit,
                };
                *earliest = Some(earliest.map_or(until, |e| e.min(until)));
            }
            return;
        }
        if map.len() >= share {
            if earliest.is_some_and(|e| e > now) {
                // Every entry holds still: nothing to drop, and no room.
                return;
            }
            map.retain(|_, e| e.until > now);
            *earliest = map.values().map(|e| e.until).min();
            if map.len() >= share {
                return;
            }
        }
        *earliest = Some(earliest.map_or(until, |e| e.min(until)));
        map.insert(
            subject.into(),
            Entry {
                until,
                permits,
                limit,
            },
        );
    }

    /// Drops `subject`'s entry, if any (its state was reset).
    pub(crate) fn forget(&self, subject: &[u8]) {
        if let Some((shard, _)) = self.shard(subject) {
            crate::sync::lock(shard).map.remove(subject);
        }
    }

    /// Entries held now, expired or not.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| crate::sync::lock(s).map.len())
            .sum()
    }

    /// The bytes of the subjects held as keys now.
    #[cfg(test)]
    pub(crate) fn key_bytes(&self) -> usize {
        let bytes = |s: &Shard| {
            let entries = crate::sync::lock(s);
            entries.map.keys().map(|k| k.len()).sum::<usize>()
        };
        self.shards.iter().map(bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn denies_until_the_deadline_and_only_as_many_permits() {
        let cache = DenyCache::new(64);
        let now = Instant::now();
        cache.deny(b"a", 3, 7, now + Duration::from_millis(100), now);
        assert_eq!(cache.check(b"a", 3, now), Some((100_000_000, 7)));
        assert_eq!(
            cache.check(b"a", 5, now),
            None,
            "more permits: Redis knows when"
        );
        assert_eq!(
            cache.check(b"a", 2, now),
            None,
            "fewer permits: they may fit sooner"
        );
        assert_eq!(cache.check(b"b", 3, now), None);
        assert_eq!(cache.check(b"a", 3, now + Duration::from_millis(100)), None);
        assert_eq!(cache.len(), 0, "an expired entry is dropped when found");
    }

    #[test]
    fn is_bounded_and_can_be_disabled() {
        let cache = DenyCache::new(32);
        let now = Instant::now();
        for i in 0..10_000u32 {
            cache.deny(&i.to_le_bytes(), 1, 1, now + Duration::from_secs(1), now);
        }
        assert!(cache.len() <= 32, "{} entries", cache.len());
        let off = DenyCache::new(0);
        off.deny(b"a", 1, 1, now + Duration::from_secs(1), now);
        assert_eq!(off.check(b"a", 1, now), None);
    }

    /// A full shard skips its scan while its earliest entry holds, and drops what expired once
    /// one may have: by the earliest deadline it has held, including one an update shortened.
    #[test]
    fn a_full_shard_makes_room_once_its_earliest_entry_expires() {
        let cache = DenyCache::new(1);
        let t = Instant::now();
        let at = |ms| t + Duration::from_millis(ms);
        cache.deny(b"a", 1, 1, at(10), t);
        cache.deny(b"b", 1, 1, at(20), at(5));
        assert_eq!(cache.check(b"b", 1, at(5)), None, "full: b not cached");
        cache.deny(b"b", 1, 1, at(20), at(10));
        assert!(
            cache.check(b"b", 1, at(10)).is_some(),
            "a expired: b cached"
        );
        // An update for other permits shortens b's entry: the shard's earliest follows it.
        cache.deny(b"b", 2, 1, at(12), at(11));
        cache.deny(b"c", 1, 1, at(30), at(12));
        assert!(
            cache.check(b"c", 1, at(12)).is_some(),
            "b expired: c cached"
        );
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn holds_at_most_its_capacity_when_it_is_not_a_multiple_of_the_shards() {
        let now = Instant::now();
        for capacity in [1, 5, 17, 100] {
            let cache = DenyCache::new(capacity);
            for i in 0..10_000u32 {
                cache.deny(&i.to_le_bytes(), 1, 1, now + Duration::from_secs(1), now);
            }
            assert_eq!(cache.len(), capacity, "capacity {capacity}");
        }
    }
}
