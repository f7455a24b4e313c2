//! Redis key names: `prefix:{subject}:suffix`.
//!
//! The subject sits in a hash tag, so every key of one subject lands in one Cluster slot and a
//! script may touch several of them. Subjects longer than [`MAX_SUBJECT_LEN`] bytes are replaced by
//! `sha256:` and the SHA-256 of the subject in hex (71 bytes): longer than any subject kept as is,
//! so a hashed name can never equal a literal one. So are the subjects that would leave the tag
//! empty (the empty subject, and those starting with `}`): Redis hashes the whole key when its
//! first `{…}` is empty, which would scatter the subject's keys over several slots.

use crate::error::ConfigError;
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::fmt::Write as _;

/// Subjects up to this many bytes are used in key names as they are; longer ones are hashed.
pub(crate) const MAX_SUBJECT_LEN: usize = 64;

/// The longest prefix accepted, in bytes.
const MAX_PREFIX_LEN: usize = 256;

/// Checks a key prefix: non-empty, at most 256 bytes, and without `{` or `}` (a brace in the
/// prefix would move the hash tag off the subject).
pub(crate) fn check_prefix(prefix: &str) -> Result<(), ConfigError> {
    if prefix.is_empty() {
        return Err(ConfigError::Invalid {
            what: "key prefix",
            requirement: "it must not be empty",
        });
    }
    if prefix.len() > MAX_PREFIX_LEN {
        return Err(ConfigError::TooLarge {
            what: "key prefix",
            max: "256 bytes",
        });
    }
    if prefix.contains(['{', '}']) {
        return Err(ConfigError::Invalid {
            what: "key prefix",
            requirement: "it must not contain '{' or '}' (the subject is the key's hash tag)",
        });
    }
    Ok(())
}

/// A subject as Redis key names and this process's local state (the deny cache, the fallback
/// limiter) hold it: the subject itself when it is at most [`MAX_SUBJECT_LEN`] bytes (and would
/// not leave the hash tag empty), otherwise `sha256:` and the subject's SHA-256 in hex (71
/// bytes). So the local state of a subject takes at most 71 bytes of key whatever the subject's
/// length (a deny cache of 10,000 subjects of 64 KB each would otherwise hold 640 MB of keys),
/// and the digest is computed once per call, not once per key name. Two subjects share a tag
/// only if their SHA-256 digests are equal, in which case Redis holds one state for both anyway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tag<'a>(Cow<'a, [u8]>);

impl<'a> Tag<'a> {
    /// `subject`'s tag: borrowed when kept as is, the digest otherwise.
    pub(crate) fn of(subject: &'a [u8]) -> Self {
        let empty_tag = subject.first().is_none_or(|&b| b == b'}');
        if subject.len() <= MAX_SUBJECT_LEN && !empty_tag {
            return Tag(Cow::Borrowed(subject));
        }
        let digest = Sha256::digest(subject);
        let mut hex = String::with_capacity(71);
        hex.push_str("sha256:");
        for byte in digest {
            // Writing to a String cannot fail.
            let _ = write!(hex, "{byte:02x}");
        }
        Tag(Cow::Owned(hex.into_bytes()))
    }

    /// The tag's bytes: what sits between the braces of the subject's key names.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The key of a subject (by its [`Tag`]) for one algorithm: `prefix:{tag}:suffix`.
///
/// Injective for subjects of at most [`MAX_SUBJECT_LEN`] bytes, across prefixes and suffixes
/// too: a prefix holds no brace ([`check_prefix`]), so it is what precedes the key's first `{`
/// (less the `:`); a suffix holds no `}`, so it is what follows the key's last `}:`; the subject
/// is what lies between. Prefix `a` with subject `b:x` is `a:{b:x}:fw`, prefix `a:b` with subject
/// `x` is `a:b:{x}:fw`. (The HTTP rules' prefixes, `{prefix}:r<16 hex>`, are prefixes as any.) (A subject may itself contain `}`; the hash tag is then
/// cut short, but identically for every key of that subject, which is all the tag is for. Only an
/// empty tag would not be: Redis then hashes the whole key, suffix included, so such subjects
/// are hashed, and their tag is the digest.)
pub(crate) fn key(prefix: &str, tag: &Tag<'_>, suffix: &str) -> Vec<u8> {
    let tag = tag.bytes();
    let mut key = Vec::with_capacity(prefix.len() + tag.len() + suffix.len() + 4);
    key.extend_from_slice(prefix.as_bytes());
    key.extend_from_slice(b":{");
    key.extend_from_slice(tag);
    key.extend_from_slice(b"}:");
    key.extend_from_slice(suffix.as_bytes());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_subjects_are_kept_long_ones_hashed() {
        assert_eq!(
            key("rl", &Tag::of(b"alice"), "tb"),
            b"rl:{alice}:tb".to_vec()
        );
        let long = vec![b'x'; MAX_SUBJECT_LEN + 1];
        let hashed = String::from_utf8(key("rl", &Tag::of(&long), "tb")).unwrap();
        assert!(hashed.starts_with("rl:{sha256:"));
        assert_eq!(hashed.len(), "rl:{}:tb".len() + 71);
        let edge = vec![b'x'; MAX_SUBJECT_LEN];
        assert_eq!(
            key("rl", &Tag::of(&edge), "tb").len(),
            "rl:{}:tb".len() + MAX_SUBJECT_LEN
        );
    }

    /// Redis hashes a whole key when its first `{…}` is empty: an empty subject, or one starting
    /// with `}`, must still give every key of the subject one slot (a chain's script touches them
    /// all, and a Cluster refuses keys of different slots with CROSSSLOT).
    #[test]
    fn every_key_of_a_subject_shares_a_slot() {
        use ::redis::cluster_routing::Slot;
        for subject in [&b""[..], b"}", b"}x", b"a}b", b"{", b"alice"] {
            let slots: Vec<Slot> = ["c0.fw", "c1.tb", "c2.sw", "sc"]
                .iter()
                .map(|suffix| Slot::for_key(key("rl", &Tag::of(subject), suffix)))
                .collect();
            assert!(
                slots.iter().all(|s| *s == slots[0]),
                "{:?}: {slots:?}",
                String::from_utf8_lossy(subject)
            );
        }
        // Still injective: such a subject's hashed name is no literal subject's name.
        assert_ne!(
            key("rl", &Tag::of(b""), "fw"),
            key("rl", &Tag::of(b"}"), "fw")
        );
        assert!(key("rl", &Tag::of(b""), "fw").starts_with(b"rl:{sha256:"));
    }

    /// A prefix that extends another (`a`, `a:b`) never meets its keys: the brace marks where
    /// the prefix ends, and a prefix cannot hold one.
    #[test]
    fn keys_of_prefixes_that_extend_one_another_differ() {
        let subjects: [&[u8]; 6] = [b"x", b"b:x", b"b:{x", b"x}:fw", b"}:c0.fw", b"b:x}:fw"];
        let mut seen = std::collections::HashMap::new();
        for prefix in ["a", "a:b", "a:b:x", "a:"] {
            for subject in subjects {
                for suffix in ["fw", "sw", "sc", "tb", "c0.fw", "c1.tb", "c10.fw"] {
                    let key = key(prefix, &Tag::of(subject), suffix);
                    assert_eq!(
                        seen.insert(key.clone(), (prefix, subject, suffix)),
                        None,
                        "{}",
                        String::from_utf8_lossy(&key)
                    );
                }
            }
        }
        assert_eq!(key("a", &Tag::of(b"b:x"), "fw"), b"a:{b:x}:fw".to_vec());
        assert_eq!(key("a:b", &Tag::of(b"x"), "fw"), b"a:b:{x}:fw".to_vec());
    }

    #[test]
    fn prefixes_with_braces_are_refused() {
        assert!(check_prefix("rate").is_ok());
        assert!(matches!(
            check_prefix("a{b"),
            Err(ConfigError::Invalid { .. })
        ));
        assert!(matches!(check_prefix(""), Err(ConfigError::Invalid { .. })));
        assert!(matches!(
            check_prefix(&"p".repeat(300)),
            Err(ConfigError::TooLarge { .. })
        ));
    }
}
