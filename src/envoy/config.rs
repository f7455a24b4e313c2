//! envoyproxy/ratelimit's YAML configuration: loading, validation with errors that name the
//! field, and the descriptor tree a request is matched against.

use super::proto::{Entry, Unit};
use serde::de::DeserializeSeed;
use serde_norway::{Mapping, Value};
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// The rate limit configuration of an [`RlsService`](super::RlsService): one or more domains,
/// each loaded from one of envoyproxy/ratelimit's YAML files, as they are.
///
/// A file holds a `domain` and its `descriptors`: each has a `key`, an optional `value` (a
/// trailing `*` makes it a prefix; on a key with no value, a prefix of the request's joined
/// `key_value`, as Envoy's service matches joined strings), an optional `rate_limit` (`unit`: `second`, `minute`,
/// `hour`, `day`, `month` or `year`, any case; `requests_per_unit`; optional `name`,
/// `unlimited`, `replaces: [{ name }]`), optional `shadow_mode`, `share_threshold` (on a
/// wildcard: every value it matches shares one counter) and nested `descriptors`.
/// `detailed_metric` labels the limit's counters (feature `metrics`) by the request's entries;
/// `value_to_metric` is accepted and ignored. Scalars are read as envoyproxy/ratelimit's YAML
/// reader (go-yaml v2, YAML 1.1) reads them into its fields: a `domain`, `key` or `value` is
/// the text as written (`value: 0x1F` is "0x1F", not "31"; `value: True` is "True"); flags
/// take `true` and `false` and also YAML 1.1's `yes`, `no`, `on`, `off`, `y` and `n`; and
/// `requests_per_unit` takes YAML 1.1's integers (`1_000`; `010` is octal, 8; `0x10`, `0b101`).
/// `<<` merge keys apply as there: in the order they stand (a merge overrides the keys before
/// it, the keys after it override the merge).
/// A field left empty (YAML null) is absent, as there: `rate_limit:` sets no limit,
/// `requests_per_unit:` is 0, `replaces:` replaces nothing.
///
/// Refused, with an [`RlsConfigError`] naming the file and the field path (for example
/// `descriptors[1].descriptors[0].rate_limit.unit`), as Envoy's service refuses them: unknown
/// fields anywhere (a field Envoy's service knows at another level, such as `shadow_mode`
/// inside `rate_limit`, loads with no effect, as there: it checks names against one list for
/// the whole file, and checks what such a field holds all the same), a list of anything but
/// mappings anywhere, a float anywhere (`value: 1.10`: quote it for the string "1.10") or an
/// integer past 2^63 − 1, an empty or missing `domain`
/// or `key`, an unknown `unit` (but on an `unlimited` limit, where Envoy ignores it), a valid
/// `unit` on an `unlimited` limit (and a missing one on any other), a `requests_per_unit` that is
/// not a whole number up to 4,294,967,295, two descriptors with the same key and value at one level
/// (compared as Envoy's service compares them, joined as `key_value`: key `a` value `b_c` is key
/// `a_b` value `c`), `share_threshold` on a descriptor that is not a wildcard, a limit that
/// `replaces` its own name, and a domain loaded twice (unless the files are loaded with
/// [`from_files_merged`](Self::from_files_merged), envoyproxy/ratelimit's
/// `MERGE_DOMAIN_CONFIG`). As in Envoy's service, `requests_per_unit: 0` is accepted: every hit
/// is then over the limit.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::RlsConfig;
///
/// let config = RlsConfig::from_yaml_str(r#"
/// domain: mongo_cps
/// descriptors:
///   - key: database
///     value: users
///     rate_limit:
///       unit: second
///       requests_per_unit: 500
/// "#)?;
/// assert_eq!(config.domains().collect::<Vec<_>>(), ["mongo_cps"]);
/// # Ok::<(), turnstile::envoy::RlsConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct RlsConfig {
    domains: HashMap<String, Level>,
    limits: Vec<LimitSpec>,
}

/// A configured limit, as the service applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LimitSpec {
    /// The domain and the composite keys of the descriptors down to this one
    /// (`domain.key_value.key`): with the limit itself, what identifies its counters across
    /// reloads.
    pub(crate) path: String,
    pub(crate) requests_per_unit: u32,
    /// `Unknown` for an unlimited limit.
    pub(crate) unit: Unit,
    pub(crate) name: String,
    pub(crate) unlimited: bool,
    pub(crate) shadow_mode: bool,
    pub(crate) replaces: Vec<String>,
    /// `detailed_metric: true` on the descriptor: its counters are labelled by the request's
    /// entries rather than by `path`.
    pub(crate) detailed_metric: bool,
    /// Its counters, labelled by domain and `path`, built as the configuration loads.
    pub(crate) counters: std::sync::Arc<super::metrics::Counters>,
}

/// The descriptors of one level of the tree, as Envoy's service keeps them: by its map key
/// (`key`, or `key_value`: `a: b_c` and `a_b: c` are one key to it, which it refuses to see
/// twice), and the map keys ending in `*` in the file's order.
#[derive(Debug, Clone, Default)]
struct Level {
    nodes: HashMap<String, Node>,
    /// The wildcards' map keys (`key_prefix*`, or a key alone ending in `*`), in file order.
    wildcards: Vec<String>,
}

#[derive(Debug, Clone, Default)]
struct Node {
    /// An index into `RlsConfig::limits`.
    limit: Option<usize>,
    /// `share_threshold`: the values this wildcard matches count as one.
    share: bool,
    children: Level,
}

/// The limit a request descriptor matched.
pub(crate) struct Found {
    /// An index into `RlsConfig::limits`.
    pub(crate) limit: usize,
    /// The entries (by index) whose value counts as the wildcard they matched (`share_threshold`).
    pub(crate) shared: Vec<(usize, String)>,
}

/// A configuration that could not be loaded: which file (or document), which field, and why;
/// or a setting of the service that is not allowed.
///
/// # Examples
///
/// ```
/// use turnstile::envoy::{RlsConfig, RlsConfigError};
///
/// let err = RlsConfig::from_yaml_str(r#"
/// domain: d
/// descriptors:
///   - key: a
///     rate_limit: { unit: fortnight, requests_per_unit: 1 }
/// "#).unwrap_err();
/// assert!(matches!(&err, RlsConfigError::Invalid { field, .. } if field == "descriptors[0].rate_limit.unit"));
/// assert!(err.to_string().contains("fortnight"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RlsConfigError {
    /// A file could not be read.
    Io {
        /// The file.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// The text is not YAML.
    Yaml {
        /// The file, or `document N` for the N-th string given (from 1).
        source: String,
        /// The YAML parser's message.
        message: String,
    },
    /// A field is missing, unknown or has a value that is not allowed.
    Invalid {
        /// The file, or `document N` for the N-th string given (from 1).
        source: String,
        /// The field's path, such as `descriptors[1].rate_limit.unit` (`domain` for the root's).
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A setting of the service (not of a file) has a value that is not allowed, such as a
    /// near-limit ratio over 1.
    InvalidSetting {
        /// The setting, such as `near_limit_ratio`.
        setting: String,
        /// What is wrong.
        message: String,
    },
    /// Two files configure the same domain.
    DuplicateDomain {
        /// The second file (or document) naming it.
        source: String,
        /// The domain.
        domain: String,
    },
}

impl fmt::Display for RlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RlsConfigError::Io { path, message } => write!(f, "{path}: {message}"),
            RlsConfigError::Yaml { source, message } => write!(f, "{source}: not YAML: {message}"),
            RlsConfigError::Invalid {
                source,
                field,
                message,
            } => write!(f, "{source}: {field}: {message}"),
            RlsConfigError::InvalidSetting { setting, message } => {
                write!(f, "{setting}: {message}")
            }
            RlsConfigError::DuplicateDomain { source, domain } => {
                write!(f, "{source}: domain '{domain}' is configured twice")
            }
        }
    }
}

impl std::error::Error for RlsConfigError {}

impl RlsConfig {
    /// One domain, from the text of one of envoyproxy/ratelimit's YAML files.
    ///
    /// # Errors
    ///
    /// [`RlsConfigError`], naming `document 1` and the field.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::RlsConfig;
    ///
    /// let config = RlsConfig::from_yaml_str("domain: edge\ndescriptors:\n  - key: generic_key\n    value: default\n    rate_limit: { unit: minute, requests_per_unit: 10 }\n")?;
    /// assert!(config.domains().any(|d| d == "edge"));
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn from_yaml_str(yaml: &str) -> Result<Self, RlsConfigError> {
        Self::from_yaml_strs([yaml])
    }

    /// Several domains, one per YAML text (the N-th is `document N` in errors).
    ///
    /// # Errors
    ///
    /// [`RlsConfigError`]; [`RlsConfigError::DuplicateDomain`] if two texts configure one domain.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::RlsConfig;
    ///
    /// let config = RlsConfig::from_yaml_strs(["domain: a\n", "domain: b\n"])?;
    /// assert_eq!(config.domains().count(), 2);
    /// assert!(RlsConfig::from_yaml_strs(["domain: a\n", "domain: a\n"]).is_err());
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn from_yaml_strs<'a>(
        yamls: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, RlsConfigError> {
        let mut config = RlsConfig::default();
        for (i, yaml) in yamls.into_iter().enumerate() {
            config.load(&format!("document {}", i + 1), yaml, None)?;
        }
        Ok(config)
    }

    /// As [`from_yaml_strs`](Self::from_yaml_strs), merging the texts that configure one
    /// domain: see [`from_files_merged`](Self::from_files_merged).
    ///
    /// # Errors
    ///
    /// As [`from_files_merged`](Self::from_files_merged), naming `document N`.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::RlsConfig;
    ///
    /// let config = RlsConfig::from_yaml_strs_merged([
    ///     "domain: a\ndescriptors:\n  - key: x\n",
    ///     "domain: a\ndescriptors:\n  - key: y\n",
    /// ])?;
    /// assert_eq!(config.domains().collect::<Vec<_>>(), ["a"]);
    /// let err = RlsConfig::from_yaml_strs_merged([
    ///     "domain: a\ndescriptors:\n  - key: x\n",
    ///     "domain: a\ndescriptors:\n  - key: x\n",
    /// ])
    /// .unwrap_err();
    /// assert!(err.to_string().contains("document 1"));
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn from_yaml_strs_merged<'a>(
        yamls: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, RlsConfigError> {
        let mut config = RlsConfig::default();
        let mut origins = Origins::new();
        for (i, yaml) in yamls.into_iter().enumerate() {
            config.load(&format!("document {}", i + 1), yaml, Some(&mut origins))?;
        }
        Ok(config)
    }

    /// One domain, from a YAML file.
    ///
    /// # Errors
    ///
    /// [`RlsConfigError::Io`] if the file cannot be read, otherwise as
    /// [`from_yaml_str`](Self::from_yaml_str), naming the file.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::RlsConfig;
    ///
    /// let err = RlsConfig::from_file("/nonexistent/config.yaml").unwrap_err();
    /// assert!(err.to_string().contains("/nonexistent/config.yaml"));
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, RlsConfigError> {
        Self::from_files([path])
    }

    /// Several domains, one per YAML file (envoyproxy/ratelimit loads every file of its
    /// configuration directory this way).
    ///
    /// # Errors
    ///
    /// As [`from_file`](Self::from_file), and [`RlsConfigError::DuplicateDomain`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use turnstile::envoy::RlsConfig;
    ///
    /// let config = RlsConfig::from_files(["config/edge.yaml", "config/mongo.yaml"])?;
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn from_files<P: AsRef<Path>>(
        paths: impl IntoIterator<Item = P>,
    ) -> Result<Self, RlsConfigError> {
        Self::files(paths, None)
    }

    /// As [`from_files`](Self::from_files), with envoyproxy/ratelimit's
    /// `MERGE_DOMAIN_CONFIG=true`: files that configure one domain make one domain of their
    /// descriptors, in the order given, rather than an error.
    ///
    /// Descriptors are added, not merged: a top-level descriptor of one file with the same key
    /// and value as one of another file (compared as within a file, joined as `key_value`) is
    /// refused, with an [`RlsConfigError::Invalid`] naming the later file and the descriptor's
    /// field path, and, in its message, the earlier file, as envoyproxy/ratelimit refuses the
    /// same descriptor twice in one file. A limit counts as if the domain had been one file
    /// (its counters are named by the domain and its descriptor path, not by the file).
    ///
    /// # Errors
    ///
    /// As [`from_files`](Self::from_files), but for
    /// [`DuplicateDomain`](RlsConfigError::DuplicateDomain); and a descriptor in two files.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use turnstile::envoy::RlsConfig;
    ///
    /// // Both files say `domain: edge`.
    /// let config = RlsConfig::from_files_merged(["config/edge-api.yaml", "config/edge-web.yaml"])?;
    /// # Ok::<(), turnstile::envoy::RlsConfigError>(())
    /// ```
    pub fn from_files_merged<P: AsRef<Path>>(
        paths: impl IntoIterator<Item = P>,
    ) -> Result<Self, RlsConfigError> {
        Self::files(paths, Some(&mut Origins::new()))
    }

    fn files<P: AsRef<Path>>(
        paths: impl IntoIterator<Item = P>,
        mut origins: Option<&mut Origins>,
    ) -> Result<Self, RlsConfigError> {
        let mut config = RlsConfig::default();
        for path in paths {
            let path = path.as_ref();
            let name = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|e| RlsConfigError::Io {
                path: name.clone(),
                message: e.to_string(),
            })?;
            config.load(&name, &text, origins.as_deref_mut())?;
        }
        Ok(config)
    }

    /// The configured domains, in no particular order.
    ///
    /// # Examples
    ///
    /// ```
    /// use turnstile::envoy::RlsConfig;
    ///
    /// assert_eq!(RlsConfig::default().domains().count(), 0);
    /// ```
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    pub(crate) fn limits(&self) -> &[LimitSpec] {
        &self.limits
    }

    pub(crate) fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit for a request descriptor's entries, as Envoy's service finds it: level by
    /// level, by the entry's joined `key_value`, the descriptor with that map key, else the
    /// first wildcard (in file order) whose map key less its `*` is a prefix of it, else the
    /// descriptor whose map key is the entry's key; the limit applies only if it is on the
    /// descriptor matched by the last entry.
    ///
    /// Entries matched by a wildcard with `share_threshold` are listed in the answer with the
    /// wildcard (`report*`): their counter is the wildcard's, shared by every value it matches.
    pub(crate) fn find(&self, domain: &str, entries: &[Entry]) -> Option<Found> {
        let mut level = self.domains.get(domain)?;
        let last = entries.len().checked_sub(1)?;
        let mut shared = Vec::new();
        // One buffer for the joined strings: a request's look-up allocates once.
        let mut joined = String::new();
        for (i, entry) in entries.iter().enumerate() {
            joined.clear();
            joined.push_str(&entry.key);
            joined.push('_');
            joined.push_str(&entry.value);
            let node = match level.nodes.get(&joined) {
                Some(node) => node,
                None => match (level.wildcards.iter())
                    .find(|w| joined.starts_with(w.strip_suffix('*').unwrap_or(w)))
                {
                    Some(wildcard) => {
                        let node = &level.nodes[wildcard];
                        if node.share {
                            // As Envoy's service: the wildcard less the entry's `key_`.
                            let prefix = format!("{}_", entry.key);
                            let pattern = wildcard.strip_prefix(&prefix).unwrap_or(wildcard);
                            shared.push((i, pattern.to_owned()));
                        }
                        node
                    }
                    None => level.nodes.get(&entry.key)?,
                },
            };
            if i == last {
                return node.limit.map(|limit| Found { limit, shared });
            }
            level = &node.children;
        }
        None
    }

    /// Loads one file's domain; with `origins` (merging), into the domain's descriptors if
    /// another file configured it, else refusing it as a duplicate.
    fn load(
        &mut self,
        source: &str,
        yaml: &str,
        origins: Option<&mut Origins>,
    ) -> Result<(), RlsConfigError> {
        let yaml_error = |e: serde_norway::Error| RlsConfigError::Yaml {
            source: source.to_owned(),
            message: e.to_string(),
        };
        let mut root: Value = serde_norway::from_str(yaml).map_err(yaml_error)?;
        // Before merging, while the tree is still the document's shape.
        AsWritten(&mut root)
            .deserialize(serde_norway::Deserializer::from_str(yaml))
            .map_err(yaml_error)?;
        // `<<` merge keys, which envoyproxy/ratelimit's YAML reader applies.
        merge_in_order(&mut root).map_err(|message| RlsConfigError::Yaml {
            source: source.to_owned(),
            message,
        })?;
        let mut loader = Loader {
            source,
            domain: String::new(),
            limits: &mut self.limits,
            origins: None,
        };
        loader.envoy_shape(&root, "")?;
        let empty = Mapping::new();
        let map = match &root {
            Value::Null => &empty,
            Value::Mapping(m) => m,
            _ => return Err(loader.invalid(String::new(), "the document must be a mapping")),
        };
        let mut domain = None;
        let mut descriptors = None;
        for (k, v) in map {
            match loader.key(k, "")? {
                "domain" => domain = Some(v),
                "descriptors" => descriptors = Some(v),
                other => loader.elsewhere("", other)?,
            }
        }
        let domain = match domain {
            Some(v) => loader.string(v, "domain")?,
            None => None,
        }
        .filter(|d| !d.is_empty())
        .ok_or_else(|| loader.invalid("domain".into(), "must be a non-empty string"))?;
        let mut level = match self.domains.remove(&domain) {
            None => Level::default(),
            Some(level) if origins.is_some() => level,
            Some(_) => {
                return Err(RlsConfigError::DuplicateDomain {
                    source: source.to_owned(),
                    domain,
                });
            }
        };
        loader.origins = origins.map(|o| o.entry(domain.clone()).or_default());
        loader.domain.clone_from(&domain);
        if let Some(list) = descriptors {
            loader.level(list, "", &domain, &mut level)?;
        }
        self.domains.insert(domain, level);
        Ok(())
    }
}

/// Applies the `<<` merge keys in `v` as envoyproxy/ratelimit's YAML reader (go-yaml v2) does:
/// in the order the keys stand, each setting what it holds, so that a merge overrides the keys
/// before it and the keys after it override the merge; of a list of merged mappings, the
/// earlier ones win. (YAML's merge-key spec, which `serde_norway`'s `apply_merge` follows, has
/// every explicit key win wherever it stands: the same for the usual `<<` first, not for a
/// `<<` after the keys it shares.)
fn merge_in_order(v: &mut Value) -> Result<(), String> {
    match v {
        Value::Mapping(mapping) => {
            let mut merged = Mapping::with_capacity(mapping.len());
            for (k, mut value) in std::mem::take(mapping) {
                merge_in_order(&mut value)?;
                if k.as_str() != Some("<<") {
                    merged.insert(k, value);
                    continue;
                }
                let sources = match value {
                    Value::Mapping(m) => vec![m],
                    Value::Sequence(items) => items
                        .into_iter()
                        .rev()
                        .map(|item| match item {
                            Value::Mapping(m) => Ok(m),
                            _ => Err("a '<<' merge key's list must hold only mappings".to_owned()),
                        })
                        .collect::<Result<_, _>>()?,
                    _ => {
                        return Err(
                            "a '<<' merge key must hold a mapping or a list of mappings".to_owned()
                        );
                    }
                };
                for source in sources {
                    for (k, value) in source {
                        merged.insert(k, value);
                    }
                }
            }
            *mapping = merged;
        }
        Value::Sequence(items) => {
            for item in items {
                merge_in_order(item)?;
            }
        }
        Value::Tagged(tagged) => merge_in_order(&mut tagged.value)?,
        _ => {}
    }
    Ok(())
}

/// Gives every number and flag in a tree its text as written: a second pass over the document
/// the tree was read from, guided by the tree's shape. envoyproxy/ratelimit's YAML reader
/// (go-yaml v2) gives a string field a plain scalar's text as written (`value: 0x1F` is "0x1F"
/// there, not "31"), and resolves the other fields' scalars by YAML 1.1's rules, which are not
/// the YAML 1.2 rules this reader resolved them by (`010` is 8 there, `1_000` is 1000). With
/// the text, the walk reads each field as go-yaml reads it into its Go type
/// ([`Loader::string`], [`Loader::bool`], [`yaml_1_1_u32`]). A float, or an integer past
/// 2^63 − 1, becomes its text under the tag [`NOT_AN_ENVOY_LEAF`]: Envoy's service refuses a
/// file holding one ([`Loader::envoy_shape`]). Strings keep the value they were read with
/// (quoted ones have no other text); nulls and tagged nodes are left as they are.
struct AsWritten<'a>(&'a mut Value);

impl<'de> serde::de::DeserializeSeed<'de> for AsWritten<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.0 {
            Value::Number(_) | Value::Bool(_) => {
                // A scalar's text, whatever it resolves to: what serde_norway gives a string.
                let text = Value::String(<String as serde::Deserialize>::deserialize(d)?);
                // go-yaml v2 reads these as a float or a uint64, leaves that Envoy's service
                // refuses wherever they stand (`Loader::envoy_shape`, after merging).
                let refused = matches!(self.0, Value::Number(n)
                    if n.is_f64() || n.as_u64().is_some_and(|n| n > i64::MAX as u64));
                *self.0 = if refused {
                    Value::Tagged(Box::new(serde_norway::value::TaggedValue {
                        tag: serde_norway::value::Tag::new(NOT_AN_ENVOY_LEAF),
                        value: text,
                    }))
                } else {
                    text
                };
                Ok(())
            }
            Value::Sequence(items) => d.deserialize_seq(Guide(items.iter_mut())),
            Value::Mapping(map) => d.deserialize_map(Guide(map.values_mut())),
            _ => <serde::de::IgnoredAny as serde::Deserialize>::deserialize(d).map(drop),
        }
    }
}

/// The tag [`AsWritten`] gives a number that go-yaml v2 reads as a float or a uint64, holding
/// its text.
const NOT_AN_ENVOY_LEAF: &str = "!turnstile/not-an-envoy-leaf";

/// Walks a sequence's items, or a mapping's values, in the document's order beside the
/// parser's (a mapping's keys are skipped: they are only ever compared as strings).
struct Guide<I>(I);

impl<'de, 'v, I: Iterator<Item = &'v mut Value>> serde::de::Visitor<'de> for Guide<I> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the shape the document was read in")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        for item in self.0.by_ref() {
            if seq.next_element_seed(AsWritten(item))?.is_none() {
                break;
            }
        }
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while map.next_key::<serde::de::IgnoredAny>()?.is_some() {
            match self.0.next() {
                Some(value) => map.next_value_seed(AsWritten(value))?,
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
}

/// A scalar's text read as go-yaml v2 reads it into a `uint32` (YAML 1.1): `_` separators
/// dropped, then an integer in Go's notation (one sign, then `0x`, `0o` or a leading `0` for
/// octal, `0b`). `None` for anything else, a float included (Envoy's service refuses a file
/// holding one).
fn yaml_1_1_u32(text: &str) -> Option<u32> {
    let plain: String = text.chars().filter(|&c| c != '_').collect();
    let (negative, digits) = match plain.as_bytes().first()? {
        b'-' => (true, &plain[1..]),
        b'+' => (false, &plain[1..]),
        _ => (false, &plain[..]),
    };
    // Go takes one sign, before the prefix; `from_str_radix` would take another after it.
    if digits.contains(['+', '-']) {
        return None;
    }
    let lower = digits.to_ascii_lowercase();
    let n = if let Some(hex) = lower.strip_prefix("0x") {
        u64::from_str_radix(hex, 16).ok()
    } else if let Some(octal) = lower.strip_prefix("0o") {
        u64::from_str_radix(octal, 8).ok()
    } else if let Some(binary) = lower.strip_prefix("0b") {
        u64::from_str_radix(binary, 2).ok()
    } else if lower.len() > 1 && lower.starts_with('0') {
        u64::from_str_radix(&lower[1..], 8).ok()
    } else {
        lower.parse::<u64>().ok()
    }?;
    if negative && n != 0 {
        return None;
    }
    u32::try_from(n).ok()
}

/// When merging domains: per domain, the file (or document) of each top-level descriptor, by
/// Envoy's map key (`key` or `key_value`), to name it when another file repeats it.
type Origins = HashMap<String, HashMap<String, String>>;

struct Loader<'a> {
    source: &'a str,
    /// The domain being loaded, to label its limits' counters.
    domain: String,
    limits: &'a mut Vec<LimitSpec>,
    /// When merging: the files of the domain's top-level descriptors loaded so far.
    origins: Option<&'a mut HashMap<String, String>>,
}

fn join(parent: &str, field: &str) -> String {
    if parent.is_empty() {
        field.to_owned()
    } else {
        format!("{parent}.{field}")
    }
}

const UNITS: &str = "second, minute, hour, day, month or year";

impl Loader<'_> {
    fn invalid(&self, field: String, message: impl Into<String>) -> RlsConfigError {
        RlsConfigError::Invalid {
            source: self.source.to_owned(),
            field,
            message: message.into(),
        }
    }

    /// What envoyproxy/ratelimit checks of the whole tree (merged) before reading it, wherever
    /// a node stands, read or not: every field name is a string and one of its field names,
    /// every list holds mappings, and no leaf is a float or an integer past 2^63 − 1 (its
    /// checker takes strings, integers, flags and nulls only, and refuses the file otherwise).
    /// The walk checks the levels it reads; this covers the others too, such as what a field
    /// known elsewhere holds where it is ignored (`rate_limit: { descriptors: [...] }`).
    fn envoy_shape(&self, v: &Value, path: &str) -> Result<(), RlsConfigError> {
        match v {
            Value::Mapping(map) => {
                for (k, v) in map {
                    let key = self.key(k, path)?;
                    self.elsewhere(path, key)?;
                    self.envoy_shape(v, &join(path, key))?;
                }
            }
            Value::Sequence(items) => {
                for (i, item) in items.iter().enumerate() {
                    let at = format!("{path}[{i}]");
                    if !item.is_mapping() {
                        return Err(self.invalid(
                            at,
                            "must be a mapping (envoyproxy/ratelimit refuses a list of anything \
                             else, wherever it stands)",
                        ));
                    }
                    self.envoy_shape(item, &at)?;
                }
            }
            Value::Tagged(t) if t.tag == NOT_AN_ENVOY_LEAF => {
                let text = t.value.as_str().unwrap_or_default();
                return Err(self.invalid(
                    path.to_owned(),
                    format!(
                        "{text} is a number envoyproxy/ratelimit's YAML reader takes as a float or \
                         past 2^63 - 1, and it refuses the file over it; quote it for a string"
                    ),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// A field this level does not read: ignored if it is one of the names Envoy's service
    /// knows (it checks every name against one list for the whole file, and reads each level's
    /// own), refused otherwise.
    fn elsewhere(&self, parent: &str, key: &str) -> Result<(), RlsConfigError> {
        const ENVOY_FIELDS: [&str; 14] = [
            "domain",
            "key",
            "value",
            "descriptors",
            "rate_limit",
            "unit",
            "requests_per_unit",
            "unlimited",
            "shadow_mode",
            "name",
            "replaces",
            "detailed_metric",
            "value_to_metric",
            "share_threshold",
        ];
        if ENVOY_FIELDS.contains(&key) {
            Ok(())
        } else {
            Err(self.invalid(join(parent, key), "unknown field"))
        }
    }

    fn key<'v>(&self, k: &'v Value, parent: &str) -> Result<&'v str, RlsConfigError> {
        match k {
            Value::String(s) => Ok(s),
            _ => Err(self.invalid(
                join(parent, &format!("{k:?}")),
                "field names must be strings",
            )),
        }
    }

    /// A scalar as text, as written (see `AsWritten`: Envoy's YAML reader takes `value: 1.10`
    /// as "1.10"); `None` for null.
    fn string(&self, v: &Value, field: &str) -> Result<Option<String>, RlsConfigError> {
        match v {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            Value::Number(n) => Ok(Some(n.to_string())),
            Value::Bool(b) => Ok(Some(b.to_string())),
            _ => Err(self.invalid(field.to_owned(), "must be a string")),
        }
    }

    /// A flag. Envoy's YAML reader is YAML 1.1, where `yes`, `on`, `y` (and `no`, `off`, `n`,
    /// in the three cases YAML 1.1 lists) are booleans too; this reader, YAML 1.2, reads them
    /// as strings, taken here as the booleans they are there.
    fn bool(&self, v: &Value, field: &str) -> Result<bool, RlsConfigError> {
        match v {
            Value::Null => Ok(false),
            Value::Bool(b) => Ok(*b),
            // Flags come as text (see `AsWritten`): YAML 1.1's words for true and false.
            Value::String(s) => match s.as_str() {
                "true" | "True" | "TRUE" | "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On"
                | "ON" => Ok(true),
                "false" | "False" | "FALSE" | "n" | "N" | "no" | "No" | "NO" | "off" | "Off"
                | "OFF" => Ok(false),
                _ => Err(self.invalid(field.to_owned(), "must be true or false")),
            },
            _ => Err(self.invalid(field.to_owned(), "must be true or false")),
        }
    }

    fn level(
        &mut self,
        list: &Value,
        parent: &str,
        parent_key: &str,
        level: &mut Level,
    ) -> Result<(), RlsConfigError> {
        let field = join(parent, "descriptors");
        let items = match list {
            Value::Null => return Ok(()),
            Value::Sequence(items) => items,
            _ => return Err(self.invalid(field, "must be a list of descriptors")),
        };
        for (i, item) in items.iter().enumerate() {
            let path = format!("{field}[{i}]");
            self.descriptor(item, &path, parent_key, parent.is_empty(), level)?;
        }
        Ok(())
    }

    fn descriptor(
        &mut self,
        item: &Value,
        path: &str,
        parent_key: &str,
        top: bool,
        level: &mut Level,
    ) -> Result<(), RlsConfigError> {
        let Value::Mapping(map) = item else {
            return Err(self.invalid(path.to_owned(), "must be a mapping"));
        };
        let (mut key, mut value, mut rate_limit, mut children, mut shadow, mut share) =
            (None, None, None, None, false, false);
        let mut detailed = false;
        for (k, v) in map {
            let name = self.key(k, path)?;
            let field = join(path, name);
            match name {
                "key" => key = self.string(v, &field)?,
                "value" => value = self.string(v, &field)?,
                // Empty (null): no limit, as in Envoy's service.
                "rate_limit" => rate_limit = Some(v).filter(|v| !v.is_null()),
                "descriptors" => children = Some(v),
                "shadow_mode" => shadow = self.bool(v, &field)?,
                "share_threshold" => share = self.bool(v, &field)?,
                "detailed_metric" => detailed = self.bool(v, &field)?,
                "value_to_metric" => {
                    self.bool(v, &field)?;
                }
                other => self.elsewhere(path, other)?,
            }
        }
        let key = key
            .filter(|k| !k.is_empty())
            .ok_or_else(|| self.invalid(join(path, "key"), "must be a non-empty string"))?;
        let value = value.filter(|v| !v.is_empty());
        // As Envoy's service: a wildcard is a map key ending in `*`, a value's or a key's.
        if share && !value.as_deref().unwrap_or(&key).ends_with('*') {
            return Err(self.invalid(
                join(path, "share_threshold"),
                "needs a wildcard (a value, or a key without one, ending in '*')",
            ));
        }
        let composite = match &value {
            Some(v) => format!("{parent_key}.{key}_{v}"),
            None => format!("{parent_key}.{key}"),
        };
        let mut node = Node {
            share,
            ..Node::default()
        };
        if let Some(rl) = rate_limit {
            node.limit = Some(self.rate_limit(
                rl,
                &join(path, "rate_limit"),
                &composite,
                shadow,
                detailed,
            )?);
        }
        if let Some(list) = children {
            self.level(list, path, &composite, &mut node.children)?;
        }
        let final_key = match &value {
            Some(v) => format!("{key}_{v}"),
            None => key.clone(),
        };
        let taken = level.nodes.contains_key(&final_key);
        if !taken {
            if final_key.ends_with('*') {
                level.wildcards.push(final_key.clone());
            }
            level.nodes.insert(final_key.clone(), node);
        }
        let origins = self.origins.as_deref_mut().filter(|_| top);
        if taken {
            let mut message = format!("duplicate descriptor composite key '{composite}'");
            if let Some(first) = origins
                .and_then(|o| o.get(&final_key))
                .filter(|first| *first != self.source)
            {
                message.push_str(&format!(" (also configured in {first})"));
            }
            return Err(self.invalid(path.to_owned(), message));
        }
        if let Some(origins) = origins {
            origins.insert(final_key, self.source.to_owned());
        }
        Ok(())
    }

    fn rate_limit(
        &mut self,
        v: &Value,
        path: &str,
        composite: &str,
        shadow_mode: bool,
        detailed_metric: bool,
    ) -> Result<usize, RlsConfigError> {
        let Value::Mapping(map) = v else {
            return Err(self.invalid(path.to_owned(), "must be a mapping"));
        };
        let (mut unit, mut rpu, mut name, mut unlimited, mut replaces) =
            (None, 0u32, String::new(), false, Vec::new());
        for (k, v) in map {
            let key = self.key(k, path)?;
            let field = join(path, key);
            match key {
                "unit" => {
                    unit = self.string(v, &field)?;
                }
                "requests_per_unit" => {
                    rpu = match v {
                        // Empty: 0, as in Envoy's service.
                        Value::Null => Some(0),
                        // Numbers come as text (see `AsWritten`), read by YAML 1.1's rules.
                        Value::String(text) => yaml_1_1_u32(text),
                        Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
                        _ => None,
                    }
                    .ok_or_else(|| {
                        self.invalid(field, "must be a whole number from 0 to 4294967295")
                    })?;
                }
                "name" => name = self.string(v, &field)?.unwrap_or_default(),
                "unlimited" => unlimited = self.bool(v, &field)?,
                "replaces" => replaces = self.replaces(v, &field)?,
                other => self.elsewhere(path, other)?,
            }
        }
        if let Some(i) = (!name.is_empty())
            .then(|| replaces.iter().position(|r| *r == name))
            .flatten()
        {
            return Err(self.invalid(
                format!("{path}.replaces[{i}].name"),
                "a limit cannot replace itself",
            ));
        }
        let unit_field = join(path, "unit");
        let parsed = unit.as_deref().filter(|u| !u.is_empty()).map(|u| {
            match u.to_ascii_lowercase().as_str() {
                "second" => Some(Unit::Second),
                "minute" => Some(Unit::Minute),
                "hour" => Some(Unit::Hour),
                "day" => Some(Unit::Day),
                "month" => Some(Unit::Month),
                "year" => Some(Unit::Year),
                _ => None,
            }
        });
        let unit = match (unlimited, parsed) {
            // As Envoy's service: only a valid unit is refused on an unlimited limit.
            (true, None | Some(None)) => Unit::Unknown,
            (true, Some(Some(_))) => {
                return Err(self.invalid(unit_field, "must not be set on an unlimited limit"));
            }
            (false, None) => {
                return Err(self.invalid(unit_field, format!("is required: {UNITS}")));
            }
            (false, Some(None)) => {
                return Err(self.invalid(
                    unit_field,
                    format!(
                        "unknown unit '{}': expected {UNITS}",
                        unit.unwrap_or_default()
                    ),
                ));
            }
            (false, Some(Some(u))) => u,
        };
        self.limits.push(LimitSpec {
            path: composite.to_owned(),
            requests_per_unit: rpu,
            unit,
            name,
            unlimited,
            shadow_mode,
            replaces,
            detailed_metric,
            counters: std::sync::Arc::new(super::metrics::Counters::new(&self.domain, composite)),
        });
        Ok(self.limits.len() - 1)
    }

    fn replaces(&self, v: &Value, field: &str) -> Result<Vec<String>, RlsConfigError> {
        let items = match v {
            // Empty: nothing replaced, as in Envoy's service.
            Value::Null => return Ok(Vec::new()),
            Value::Sequence(items) => items,
            _ => return Err(self.invalid(field.to_owned(), "must be a list of { name: ... }")),
        };
        let mut names = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let path = format!("{field}[{i}]");
            let Value::Mapping(map) = item else {
                return Err(self.invalid(path, "must be a mapping { name: ... }"));
            };
            let mut name = None;
            for (k, v) in map {
                match self.key(k, &path)? {
                    "name" => name = self.string(v, &join(&path, "name"))?,
                    other => self.elsewhere(&path, other)?,
                }
            }
            names.push(
                name.filter(|n| !n.is_empty()).ok_or_else(|| {
                    self.invalid(join(&path, "name"), "must be a non-empty string")
                })?,
            );
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `requests_per_unit` as go-yaml v2 reads a plain scalar into a `uint32`, sign and prefix
    /// rules included; a float, a negative, a word or a second sign is no limit.
    #[test]
    fn a_limit_is_read_by_yaml_1_1_rules() {
        for (text, n) in [
            ("0", 0),
            ("-0", 0),
            ("00", 0),
            ("17", 17),
            ("017", 15),
            ("0X1f", 31),
            ("+0x10", 16),
            ("0O17", 15),
            ("0B1_1", 3),
            ("1_0_0", 100),
            ("4294967295", u32::MAX),
        ] {
            assert_eq!(yaml_1_1_u32(text), Some(n), "{text}");
        }
        for text in [
            "",
            "_",
            "+",
            "-",
            "-1",
            "++5",
            "+-5",
            "0x+5",
            "0x-5",
            "0x",
            "08",
            "09",
            "1.",
            "1e3",
            "1.5",
            ".5",
            "5e-1",
            "4294967296",
            "1e10",
            ".inf",
            "nan",
            "1e",
            "e3",
            "1.2.3",
            "é",
            "-é",
            "1é",
            "0xé",
        ] {
            assert_eq!(yaml_1_1_u32(text), None, "{text}");
        }
    }

    proptest::proptest! {
        /// Any text: a limit or none, never a panic; and every number's decimal spelling is
        /// itself.
        #[test]
        fn any_text_reads_as_a_limit_or_none(text in "\\PC{0,12}", n: u32) {
            let _ = yaml_1_1_u32(&text);
            proptest::prop_assert_eq!(yaml_1_1_u32(&n.to_string()), Some(n));
        }
    }
}
