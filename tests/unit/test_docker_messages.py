"""What the Docker backend stores and shows of an engine's errors: the engine's explanation
without network addresses, and why an engine did not answer in plain words (no repr)."""

from __future__ import annotations

import errno

import pytest
import requests
import urllib3
from docker import errors as docker_errors

from sandboxer.adapters.docker import _short, _why_unreachable


@pytest.mark.parametrize(("explanation", "expected"), [
    ('Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on '
     "10.0.2.3:53: server misbehaving",
     'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io: server '
     "misbehaving"),
    ("dial tcp 172.17.0.1:443: connect: connection refused",
     "dial tcp: connect: connection refused"),
    ("Get https://[fd00::1]:5000/v2/: connection refused", "Get https:///v2/: connection refused"),
    ("No such image: sandboxer/checkpoint:ckpt-1", "No such image: sandboxer/checkpoint:ckpt-1"),
])
def test_an_engine_error_is_its_explanation_without_addresses(explanation, expected):
    error = docker_errors.APIError("500 Server Error", explanation=explanation)
    assert _short(error) == expected


def _wrapped(cause: OSError) -> Exception:
    """As requests raises it when docker-py cannot reach the socket."""
    protocol = urllib3.exceptions.ProtocolError("Connection aborted.", cause)
    return requests.exceptions.ConnectionError(protocol)


@pytest.mark.parametrize(("cause", "words"), [
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), "no engine listens there"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
     "nothing accepts connections there"),
    (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
])
def test_why_an_engine_did_not_answer_is_said_in_plain_words(cause, words):
    why = _why_unreachable(_wrapped(cause))
    assert why.startswith(words)
    assert "Error(" not in why and "(<" not in why
    wrapped = docker_errors.DockerException(f"Error while fetching server API version: "
                                            f"{_wrapped(cause)}")
    wrapped.__context__ = _wrapped(cause)
    assert _why_unreachable(wrapped).startswith(words)
