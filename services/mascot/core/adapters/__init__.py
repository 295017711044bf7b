"""Adapter store, registry and state transitions (DESIGN.md section 5)."""
