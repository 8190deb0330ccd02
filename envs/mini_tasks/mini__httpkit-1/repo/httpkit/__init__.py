from .request import USER_AGENT, Request, build_request

__all__ = ["USER_AGENT", "Request", "build_request"]
