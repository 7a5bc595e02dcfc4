"""Decode worker: GPU KV tiers (hierarchy), model, speculation and the Decode service."""
