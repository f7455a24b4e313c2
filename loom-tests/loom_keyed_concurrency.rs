#![cfg(turnstile_loom)]
