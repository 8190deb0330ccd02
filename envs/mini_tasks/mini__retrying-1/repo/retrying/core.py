"""Retries with exponential back-off."""
import functools
import logging
import time

logger = logging.getLogger(__name__)


def call_with_retry(func, *args, attempts=3, delay=0.5, backoff=2.0, max_delay=None,
                    retry_on=(Exception,), **kwargs):
    """Call ``func(*args, **kwargs)``, retrying when it raises *retry_on*.

    At most *attempts* calls are made.  The first wait is *delay* seconds and
    each following wait is multiplied by *backoff*, capped at *max_delay*.
    Exceptions that are not in *retry_on* propagate immediately.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    wait = delay
    for attempt in range(1, attempts + 1):
        try:
            return func(*args, **kwargs)
        except retry_on as exc:
            logger.warning("attempt %d/%d failed: %s", attempt, attempts, exc)
            if attempt < attempts:
                time.sleep(wait)
                wait *= backoff
                if max_delay is not None:
                    wait = min(wait, max_delay)


def retry(**options):
    """Decorator form of :func:`call_with_retry`."""
    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return call_with_retry(func, *args, **options, **kwargs)
        return wrapper
    return decorate
