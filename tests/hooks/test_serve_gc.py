"""The gateway process's garbage-collector settings (`hooks.cli._serve.tune_gc`)."""

import gc

from hooks.cli._serve import GC_THRESHOLDS, tune_gc


def test_tune_gc_freezes_what_lives_and_makes_collections_rare() -> None:
    """Catches: the collector left at Python's defaults in the gateway (a full collection
    every few seconds under load pauses every stream), or startup objects left in the
    generations every collection scans."""
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert GC_THRESHOLDS[0] > before[0]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
