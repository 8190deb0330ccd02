import pytest

from httpkit import USER_AGENT, build_request


def test_method_is_normalised():
    assert build_request("get", "https://example.com").method == "GET"


def test_unknown_method_rejected():
    with pytest.raises(ValueError):
        build_request("FETCH", "https://example.com")


def test_default_user_agent():
    assert build_request("GET", "https://example.com").headers["User-Agent"] == USER_AGENT


def test_custom_user_agent_kept():
    req = build_request("GET", "https://example.com", headers={"User-Agent": "bot/2"})
    assert req.headers["User-Agent"] == "bot/2"


def test_query_params_encoded():
    req = build_request("GET", "https://example.com/s?lang=en", params={"q": "a b", "page": 2})
    assert req.url == "https://example.com/s?lang=en&q=a+b&page=2"


def test_token_sets_bearer_header():
    req = build_request("GET", "https://example.com", token="abc")
    assert req.headers["Authorization"] == "Bearer abc"


def test_json_body():
    req = build_request("post", "https://example.com", json_body={"name": "\u00e9"})
    assert req.body == b'{"name":"\\u00e9"}'
    assert req.headers["Content-Type"] == "application/json"
