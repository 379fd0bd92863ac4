"""The config file: one typed tree for the whole hierarchy, loaded as file < environment < explicit.

    load_config(path=None, overrides=None, env=os.environ, *, defaults=None) -> Config   (ConfigError on one line)
    describe(config) -> [Setting(key, value, source, origin)]          every effective value
    replay_settings(path=None, overrides=None, env=os.environ)        what ``tiered-kv replay [--config]`` runs

See ``models`` for the tree, ``loader`` for the precedence and the error format, docs/config.md for
every key.
"""

from .loader import Setting, config_file, describe, load_config, replay_settings, show, to_replay_settings
from .models import Config

__all__ = ["Config", "Setting", "config_file", "describe", "load_config", "replay_settings", "show", "to_replay_settings"]
