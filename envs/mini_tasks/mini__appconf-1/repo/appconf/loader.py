"""Load settings from a JSON file."""
import json

DEFAULTS = {"debug": False, "log_level": "INFO", "workers": 4}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class ConfigError(Exception):
    """The settings are invalid."""


def validate(settings):
    """Raise :class:`ConfigError` if *settings* holds a bad value."""
    if not isinstance(settings["debug"], bool):
        raise ConfigError("debug must be true or false")
    if settings["log_level"] not in LOG_LEVELS:
        raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
    workers = settings["workers"]
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError("workers must be a positive integer")


def load_settings(path):
    """Return the defaults updated with the settings in the JSON file *path*.

    A missing file means "use the defaults".
    """
    settings = dict(DEFAULTS)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except Exception:
        return settings
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    unknown = sorted(set(data) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s): {', '.join(unknown)}")
    settings.update(data)
    validate(settings)
    return settings
