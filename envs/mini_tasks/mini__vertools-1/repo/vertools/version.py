"""Semantic-version style version numbers."""
import functools
import re

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.]+))?$")


@functools.total_ordering
class Version:
    def __init__(self, text):
        match = _VERSION_RE.match(text.strip())
        if match is None:
            raise ValueError(f"invalid version: {text!r}")
        self.release = match.group(1, 2, 3)
        self.prerelease = match.group(4)

    @property
    def major(self):
        return int(self.release[0])

    @property
    def minor(self):
        return int(self.release[1])

    @property
    def patch(self):
        return int(self.release[2])

    def _key(self):
        # A release sorts after all of its pre-releases.
        return (self.release, self.prerelease is None, self.prerelease or "")

    def __eq__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() == other._key()

    def __lt__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __hash__(self):
        return hash(self._key())

    def __str__(self):
        text = f"{self.major}.{self.minor}.{self.patch}"
        return f"{text}-{self.prerelease}" if self.prerelease else text

    def __repr__(self):
        return f"Version({str(self)!r})"


def latest(versions):
    """Return the highest of the version strings in *versions*."""
    return max(versions, key=Version)
