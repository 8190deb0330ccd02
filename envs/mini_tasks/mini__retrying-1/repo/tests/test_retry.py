import time

import pytest

from retrying import call_with_retry, retry


class Flaky:
    """Fails *failures* times with *exc_type*, then returns "ok"."""

    def __init__(self, failures, exc_type=ConnectionError):
        self.failures = failures
        self.exc_type = exc_type
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc_type(f"failure {self.calls}")
        return "ok"


def test_first_try_success_does_not_sleep():
    flaky = Flaky(0)
    start = time.monotonic()
    assert call_with_retry(flaky, delay=5) == "ok"
    assert time.monotonic() - start < 1
    assert flaky.calls == 1


def test_recovers_after_transient_failures_with_backoff():
    flaky = Flaky(2)
    start = time.monotonic()
    assert call_with_retry(flaky, attempts=3, delay=0.4, backoff=2.0) == "ok"
    elapsed = time.monotonic() - start
    assert flaky.calls == 3
    assert 1.15 <= elapsed < 3.0  # waits 0.4 s, then 0.8 s


def test_max_delay_caps_the_wait():
    flaky = Flaky(2)
    start = time.monotonic()
    assert call_with_retry(flaky, attempts=3, delay=0.5, backoff=10.0, max_delay=0.6) == "ok"
    elapsed = time.monotonic() - start
    assert 1.05 <= elapsed < 3.0  # waits 0.5 s, then 0.6 s instead of 5 s


def test_unlisted_exception_is_not_retried():
    flaky = Flaky(1, exc_type=KeyError)
    with pytest.raises(KeyError):
        call_with_retry(flaky, attempts=5, delay=5, retry_on=(ConnectionError,))
    assert flaky.calls == 1


def test_decorator_passes_arguments():
    calls = []

    @retry(attempts=2, delay=0.2)
    def add(a, b):
        calls.append((a, b))
        if len(calls) == 1:
            raise ConnectionError("once")
        return a + b

    assert add(2, b=3) == 5
    assert calls == [(2, 3), (2, 3)]
    assert add.__name__ == "add"


def test_rejects_zero_attempts():
    with pytest.raises(ValueError):
        call_with_retry(Flaky(0), attempts=0)
