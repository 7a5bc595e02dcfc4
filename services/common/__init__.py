"""Shared pieces of every service: config, logging, errors, server builder, metrics."""
