"""Request construction."""
import json
from dataclasses import dataclass, field
from urllib.parse import urlencode

USER_AGENT = "httpkit/1.0"
METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"}


@dataclass
class Request:
    method: str
    url: str
    headers: dict = field(default_factory=dict)
    body: bytes = b""


def build_request(method, url, params=None, headers={}, token=None, json_body=None):
    """Build a :class:`Request`.

    *params* are encoded into the query string, *token* becomes a bearer
    ``Authorization`` header and *json_body* is serialised as UTF-8 JSON.
    """
    method = method.upper()
    if method not in METHODS:
        raise ValueError(f"unsupported method: {method}")
    if params:
        url += ("&" if "?" in url else "?") + urlencode(params)
    headers.setdefault("User-Agent", USER_AGENT)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = b""
    if json_body is not None:
        body = json.dumps(json_body, separators=(",", ":")).encode("utf-8")
        headers["Content-Type"] = "application/json"
    return Request(method, url, headers, body)
