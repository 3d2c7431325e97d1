import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

try:
    from hypothesis import settings
except ImportError:  # the test extra is not installed: collection fails later with a clear error
    pass
else:
    # Every Hypothesis test draws the same examples on every run and keeps no example database,
    # so a CI failure reproduces and a passing suite stays passing.  `pytest
    # --hypothesis-profile=explore` draws fresh random examples (and keeps the failures it finds in
    # .hypothesis/) for a longer hunt.  A test's own @settings(...) overrides these defaults.
    settings.register_profile("repeatable", derandomize=True, database=None)
    settings.register_profile("explore", derandomize=False)
    settings.load_profile("repeatable")
