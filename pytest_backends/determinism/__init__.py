"""The determinism harness: assert_reproducible, digests, the op recorder, census and baseline."""
