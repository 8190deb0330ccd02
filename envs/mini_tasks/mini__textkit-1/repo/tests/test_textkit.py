import pytest

from textkit import slugify, truncate_words


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_collapses_separators():
    assert slugify("  a -- b  __ c ") == "a-b-c"


def test_slugify_custom_separator():
    assert slugify("Release notes 2024", sep="_") == "release_notes_2024"


def test_slugify_max_length_has_no_trailing_separator():
    assert slugify("one two three", max_length=8) == "one-two"


def test_slugify_drops_symbols_without_ascii_form():
    assert slugify("tea \u2615 time") == "tea-time"


def test_truncate_words_short_text_unchanged():
    assert truncate_words("just two", 5) == "just two"


def test_truncate_words_adds_ellipsis():
    assert truncate_words("the quick brown fox jumps", 3) == "the quick brown..."


def test_truncate_words_rejects_zero_limit():
    with pytest.raises(ValueError):
        truncate_words("anything", 0)
