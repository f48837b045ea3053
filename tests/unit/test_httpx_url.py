"""The httpx integration without a server: its routed URL equals httpx's own copy_with(), which
it replaces, and its settings are checked."""

import dataclasses

import httpx
import pytest

from sentinel.errors import ValidationError
from sentinel.integrations import httpx as sentinel_httpx
from sentinel.integrations.httpx import SentinelTransport, routed_url
from sentinel.registry.endpoint import format_uri
from tests.unit.endpoints import endpoint


@pytest.mark.parametrize(
    "url",
    [
        "http://api.sentinel/",
        "http://api.sentinel:8080/items/7?sort=desc&q=a%20b#top",
        "http://user:secret@api.sentinel/p%C3%A9/?x=%2F",
        "https://API.Sentinel/caf%C3%A9?",
    ],
)
@pytest.mark.parametrize(
    ("scheme", "host", "port"),
    [("http", "127.0.0.1", 8080), ("https", "::1", 443), ("http", "Web-1.example.com", 80)],
)
@pytest.mark.parametrize("parsed_forms", [True, False], ids=["parsed-forms", "public-api"])
def test_routed_url_is_what_copy_with_gives(url, scheme, host, port, parsed_forms, monkeypatch):
    # the parsed forms are httpx 0.28's internals; without them, httpx's public copy_with
    monkeypatch.setattr(sentinel_httpx, "_PARSED_FORMS", parsed_forms)
    target = dataclasses.replace(
        endpoint("a"), scheme=scheme, host=host, port=port, uri=format_uri(scheme, host, port)
    )
    expected = httpx.URL(url).copy_with(scheme=scheme, host=host, port=port)
    routed = routed_url(httpx.URL(url), target)
    assert routed == expected
    assert (routed.raw_scheme, routed.raw_host, routed.port, routed.raw_path, routed.netloc) == (
        expected.raw_scheme,
        expected.raw_host,
        expected.port,
        expected.raw_path,
        expected.netloc,
    )


@pytest.mark.parametrize("settings", [{"suffix": "sentinel"}, {"retries": -1}])
def test_a_transport_refuses_a_suffix_without_a_dot_or_negative_retries(settings):
    with pytest.raises(ValidationError):
        SentinelTransport(None, **settings)  # checked before the client is used


def test_this_httpx_keeps_the_parsed_forms_routing_reads():
    assert sentinel_httpx._has_parsed_forms()
