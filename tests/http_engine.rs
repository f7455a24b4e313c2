//! HTTP engine tests.
