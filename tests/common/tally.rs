//! A `metrics` recorder for the tests of feature `metrics`: it counts every counter by
//! `name{label values, comma-separated}` (`name{rule}` for the HTTP layer's, `name{domain,limit}`
//! for the Envoy service's), so that a test can assert what was reported, limit by limit.

use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Counter totals by `name{label values}`.
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
        let labels: Vec<&str> = key.labels().map(|l| l.value()).collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Counter::from_arc(Arc::new(One(self.0.clone(), name)))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
