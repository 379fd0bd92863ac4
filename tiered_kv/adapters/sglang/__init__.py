"""tiered-kv inside SGLang."""
