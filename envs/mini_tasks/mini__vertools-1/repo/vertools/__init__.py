from .version import Version, latest

__all__ = ["Version", "latest"]
