"""Shared test configuration."""

import os

from hypothesis import settings

# Machines here are small and noisy: a per-example deadline would only add flaky failures.
# CI replays a fixed set of examples so that a red run can be reproduced.
settings.register_profile("dev", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
