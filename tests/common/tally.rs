//! A `metrics` recorder for the HTTP tests (feature `metrics`): it counts every counter by
//! `name{rule}`, so that a test can assert what the layer reported, rule by rule.

use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Counter totals by `name{rule}`.
pub type Counts = Arc<Mutex<HashMap<String, u64>>>;

/// The recorder: every counter registered adds into the shared [`Counts`].
#[derive(Default)]
pub struct Tally(pub Counts);

struct One(Counts, String);

impl CounterFn for One {
    fn increment(&self, value: u64) {
        *self.0.lock().unwrap().entry(self.1.clone()).or_default() += value;
    }
    fn absolute(&self, _: u64) {}
}

impl Recorder for Tally {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let rule = key
            .labels()
            .find(|l| l.key() == "rule")
            .map(|l| l.value().to_owned());
        let name = format!("{}{{{}}}", key.name(), rule.unwrap_or_default());
        Counter::from_arc(Arc::new(One(self.0.clone(), name)))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
