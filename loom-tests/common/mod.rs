//! What every loom model file shares (each file is its own test crate and includes this with
//! `mod common;`).

/// Runs `f` under loom. `loom::model` reads `LOOM_MAX_PREEMPTIONS` (and `LOOM_LOG`, …) from the
/// environment; without `LOOM_MAX_PREEMPTIONS` the models default to 2 preemptions rather than an
/// unbounded search.
pub fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_some() {
        loom::model(f);
    } else {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(2);
        builder.check(f);
    }
}
