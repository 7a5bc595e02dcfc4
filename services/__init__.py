"""dhisparse services: kvstore, residency, decode and what they share."""
