"""Adapters that plug tiered-kv into serving engines without forking them.

Each engine gets its own subpackage; importing this package must never import an engine.
"""
