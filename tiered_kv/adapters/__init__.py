"""Adapters that plug tiered-kv into serving engines."""
