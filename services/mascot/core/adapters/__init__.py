"""Adapter store, registry and state transitions."""
