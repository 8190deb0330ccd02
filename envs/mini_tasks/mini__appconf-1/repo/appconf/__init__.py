from .env import apply_env
from .loader import DEFAULTS, ConfigError, load_settings, validate

__all__ = ["DEFAULTS", "ConfigError", "load_settings", "validate", "apply_env"]
