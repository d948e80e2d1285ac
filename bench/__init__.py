"""Benchmarks of turnplug's own cost, each against a floor measured in the same run."""
