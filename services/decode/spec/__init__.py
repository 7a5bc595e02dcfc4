"""Speculative decoding: draft ring, drafter, acceptance rules, commit math, memory."""

from __future__ import annotations
