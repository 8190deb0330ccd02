import pytest

from vertools import Version, latest


class TestParse:
    def test_components(self):
        v = Version("v2.4.1-beta.2")
        assert (v.major, v.minor, v.patch, v.prerelease) == (2, 4, 1, "beta.2")

    def test_str_roundtrip(self):
        assert str(Version(" 3.0.7-rc1 ")) == "3.0.7-rc1"

    def test_invalid(self):
        with pytest.raises(ValueError):
            Version("1.2")


class TestCompare:
    def test_patch_order(self):
        assert Version("1.2.3") < Version("1.2.4")

    def test_leading_v_is_ignored(self):
        assert Version("v1.0.0") == Version("1.0.0")

    def test_prerelease_before_release(self):
        assert Version("1.0.0-rc1") < Version("1.0.0")
        assert Version("1.0.0-alpha") < Version("1.0.0-beta")

    def test_usable_in_sets(self):
        assert len({Version("1.0.0"), Version("v1.0.0"), Version("1.0.1")}) == 2


def test_latest_single_digit():
    assert latest(["0.3.1", "0.4.0", "0.3.9"]) == "0.4.0"
