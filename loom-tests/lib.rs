//! Empty: this package exists for its test targets, the loom models (one file each).
