import json

import pytest

from appconf import DEFAULTS, ConfigError, apply_env, load_settings


def write(tmp_path, text):
    path = tmp_path / "settings.json"
    path.write_text(text, encoding="utf-8")
    return path


def test_missing_file_gives_defaults(tmp_path):
    assert load_settings(tmp_path / "nope.json") == DEFAULTS


def test_file_overrides_defaults(tmp_path):
    path = write(tmp_path, json.dumps({"workers": 32, "log_level": "DEBUG"}))
    assert load_settings(path) == {"debug": False, "log_level": "DEBUG", "workers": 32}


def test_unknown_setting_rejected(tmp_path):
    path = write(tmp_path, json.dumps({"wrokers": 2}))
    with pytest.raises(ConfigError, match="wrokers"):
        load_settings(path)


def test_invalid_value_rejected(tmp_path):
    path = write(tmp_path, json.dumps({"workers": 0}))
    with pytest.raises(ConfigError, match="workers"):
        load_settings(path)


def test_top_level_must_be_object(tmp_path):
    path = write(tmp_path, "[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_settings(path)


def test_env_overrides():
    settings = apply_env(DEFAULTS, {"APP_DEBUG": "yes", "APP_WORKERS": "8", "HOME": "/root"})
    assert settings == {"debug": True, "log_level": "INFO", "workers": 8}


def test_env_bad_integer():
    with pytest.raises(ConfigError, match="APP_WORKERS"):
        apply_env(DEFAULTS, {"APP_WORKERS": "many"})
