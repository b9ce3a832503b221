"""kafka-python is an independent oracle here; its first import emits DeprecationWarnings from
its own schema loading, which say nothing about tidelog, so it is imported once quietly."""

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.codec  # noqa: F401
    import kafka.record.default_records  # noqa: F401
