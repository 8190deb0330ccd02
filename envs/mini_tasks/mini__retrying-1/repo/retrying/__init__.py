from .core import call_with_retry, retry

__all__ = ["call_with_retry", "retry"]
