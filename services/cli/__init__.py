"""The ``dhisparse`` command line."""
