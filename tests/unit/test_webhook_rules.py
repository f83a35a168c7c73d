"""Which webhook URLs and secrets the sink accepts (the end-to-end cases are in
tests/events/test_delivery.py; these are the address forms a receiver here cannot stand for)."""

import base64

import pytest

from sandboxer.core.observe.delivery import check_url, signing_key
from sandboxer.core.rules.errors import BadInput

LOOPBACK = ["http://127.0.0.1/h", "http://127.8.9.10:8080/h", "http://[::1]:9/h",
            "http://localhost/h", "http://LOCALHOST:1/h", "http://[::ffff:127.0.0.1]/h"]
NOT_LOOPBACK = ["http://0.0.0.0/h", "http://[::]/h", "http://10.0.0.1/h",
                "http://hub.example/h", "http://localhost.hub.example/h",
                "http://127.0.0.1.hub.example/h", "http://[::ffff:10.0.0.1]/h"]


@pytest.mark.parametrize("url", LOOPBACK)
def test_plain_http_to_loopback_is_accepted(url):
    check_url(url, "SBX_WEBHOOK_URL", allow_plain_http=False)


@pytest.mark.parametrize("url", NOT_LOOPBACK)
def test_plain_http_elsewhere_is_refused_unless_opted_in(url):
    with pytest.raises(BadInput, match="not loopback"):
        check_url(url, "SBX_WEBHOOK_URL", allow_plain_http=False)
    check_url(url, "SBX_WEBHOOK_URL", allow_plain_http=True)
    check_url(url.replace("http://", "https://"), "SBX_WEBHOOK_URL", allow_plain_http=False)


def test_whsec_secret_is_its_base64_and_a_plain_one_its_bytes():
    key = bytes(range(32))
    encoded = base64.b64encode(key).decode()
    assert signing_key("whsec_" + encoded) == key
    assert signing_key("whsec_" + encoded.rstrip("=")) == key  # unpadded, as libraries allow
    assert signing_key("a-plain-secret-of-enough-bytes") == b"a-plain-secret-of-enough-bytes"


@pytest.mark.parametrize("secret", ["whsec_", "whsec_" + base64.b64encode(b"x" * 23).decode(),
                                    "x" * 23, "whsec_***not-base64***-but-long-enough"])
def test_short_or_malformed_secret_is_refused_without_showing_it(secret):
    with pytest.raises(BadInput) as caught:
        signing_key(secret)
    shown, body = str(caught.value), secret.removeprefix("whsec_")
    assert shown.startswith("SBX_WEBHOOK_SECRET: ")
    assert not body or body not in shown
