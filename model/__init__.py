"""mocker-spec: the executable specification of the dynamo-mocker 1.3.0 scheduler.

Everything in this package is pure: states are frozen ``attrs`` classes holding
``pyrsistent`` collections, and every transition is a function
``(state, input) -> (new_state, effects)``.  Time is an input, never read.
A rejected input raises a :class:`model.errors.ModelError` subclass before
anything changes (states are values, so "before anything changes" holds by
construction: the caller keeps the old value).
"""

__version__ = "0.1.0"
