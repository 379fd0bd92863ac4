"""Adapters that plug tiered-kv into serving engines through the engines' own extension points."""
