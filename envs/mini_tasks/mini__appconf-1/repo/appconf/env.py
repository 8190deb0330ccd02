"""Overrides from environment variables such as ``APP_WORKERS=8``."""
from .loader import DEFAULTS, ConfigError, validate

PREFIX = "APP_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(key, raw):
    default = DEFAULTS[key]
    if isinstance(default, bool):
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(f"{PREFIX}{key.upper()}: not a boolean: {raw!r}")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{PREFIX}{key.upper()}: not an integer: {raw!r}") from None
    return raw.strip()


def apply_env(settings, environ):
    """Return a copy of *settings* with ``APP_<KEY>`` variables applied."""
    result = dict(settings)
    for key in DEFAULTS:
        name = PREFIX + key.upper()
        if name in environ:
            result[key] = _convert(key, environ[name])
    validate(result)
    return result
