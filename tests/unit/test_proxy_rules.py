"""The service proxy's plain rules (sandboxer_tui/service/proxy.py): a preview link is
signed, scoped to one sandbox and port, expires, and any change to it is refused; its key
file is made 0600 once and a planted link is refused; the headers that reach a sandbox
never hold the sbx key or the link; the throttle marks activity once a second, not per
request."""

from __future__ import annotations

import asyncio
import stat
import time
from pathlib import Path

import pytest

from sandboxer.core.rules.errors import BadInput
from sandboxer_tui.service.proxy import (
    Activity,
    LinkRefused,
    Links,
    request_headers,
    response_headers,
)


def test_a_link_names_its_sandbox_and_port_until_it_expires(tmp_path: Path) -> None:
    links = Links(tmp_path / "preview-links.key")
    token = links.make("sbx-01abc", 8080, int(time.time()) + 60)
    link = links.check(token)
    assert (link.sandbox_id, link.port) == ("sbx-01abc", 8080)
    with pytest.raises(LinkRefused, match="expired"):
        links.check(token, now=time.time() + 61)


@pytest.mark.parametrize("alter", [
    lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),  # the MAC
    lambda t: "x" + t,  # the payload
    lambda t: t.split(".")[0],  # no MAC
    lambda t: t.replace(".", "!"),
    lambda t: "",
    lambda t: "%%%." + t.split(".")[1],
])
def test_an_altered_link_is_refused(tmp_path: Path, alter) -> None:
    links = Links(tmp_path / "preview-links.key")
    token = links.make("sbx-01abc", 8080, int(time.time()) + 60)
    with pytest.raises(LinkRefused, match="not valid"):
        links.check(alter(token))


def test_another_spelling_of_the_same_mac_is_refused(tmp_path: Path) -> None:
    """A 32-byte MAC in 43 base64 characters leaves 2 bits of the last one unused: the
    characters that differ only there decode alike, and must not pass."""
    import base64

    links = Links(tmp_path / "preview-links.key")
    token = links.make("sbx-01abc", 8080, int(time.time()) + 60)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    same = [token[:-1] + c for c in alphabet if c != token[-1] and base64.urlsafe_b64decode(
        token.split(".")[1][:-1] + c + "=") == base64.urlsafe_b64decode(
        token.split(".")[1] + "=")]
    assert len(same) == 3
    for spelling in same:
        with pytest.raises(LinkRefused, match="not valid"):
            links.check(spelling)


def test_another_port_or_expiry_in_the_payload_breaks_the_mac(tmp_path: Path) -> None:
    import base64

    links = Links(tmp_path / "preview-links.key")
    token = links.make("sbx-01abc", 8080, int(time.time()) + 60)
    mac = token.split(".")[1]
    for payload in (b"sbx-01abc:8081:" + str(int(time.time()) + 60).encode(),
                    b"sbx-01abc:8080:99999999999", b"sbx-other:8080:99999999999"):
        forged = base64.urlsafe_b64encode(payload).rstrip(b"=").decode() + "." + mac
        with pytest.raises(LinkRefused):
            links.check(forged)


def test_the_key_is_made_once_0600_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "preview-links.key"
    token = Links(path).make("sbx-01abc", 80, int(time.time()) + 60)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Links(path).check(token).port == 80  # another service over the same state
    path.unlink()  # deleting the key kills every link
    with pytest.raises(LinkRefused):
        Links(path).check(token)


def test_a_link_planted_at_the_key_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("00" * 32)
    (tmp_path / "preview-links.key").symlink_to(target)
    with pytest.raises(BadInput, match="symbolic link"):
        Links(tmp_path / "preview-links.key").key()
    (tmp_path / "other.key").write_text("short\n")
    with pytest.raises(BadInput, match="not a preview-link key"):
        Links(tmp_path / "other.key").key()


def test_the_key_and_hop_by_hop_headers_never_reach_the_sandbox() -> None:
    given = [("Host", "svc:8000"), ("Authorization", "Bearer sbxk_abc_def"),
             ("Connection", "keep-alive, X-Private"), ("X-Private", "1"),
             ("Keep-Alive", "timeout=5"), ("Transfer-Encoding", "chunked"),
             ("TE", "trailers"), ("Upgrade", "h2c"), ("Proxy-Authorization", "Basic x"),
             ("Accept", "text/html"), ("X-Forwarded-For", "1.2.3.4"),
             ("Referer", "http://svc/v1/sandboxes/a/ports/80/x"), ("Content-Length", "5")]
    sent = request_headers(given, via_link=False, client="127.0.0.1", host="svc:8000")
    names = [n.lower() for n, _ in sent]
    assert "authorization" not in names and "host" not in names
    assert not {"connection", "x-private", "keep-alive", "transfer-encoding", "te",
                "upgrade", "proxy-authorization"} & set(names)
    assert ("Accept", "text/html") in sent and ("Content-Length", "5") in sent
    assert ("x-forwarded-for", "127.0.0.1") in sent  # ours, not the caller's claim
    assert ("X-Forwarded-For", "1.2.3.4") not in sent
    assert ("x-forwarded-host", "svc:8000") in sent


def test_a_links_request_keeps_the_apps_own_authorization_never_a_key_or_referer() -> None:
    token_page = "http://svc/v1/previews/PAYLOAD.MAC/index.html"
    own = request_headers([("Authorization", "Basic dXNlcjpwdw=="), ("Referer", token_page)],
                          via_link=True)
    assert ("Authorization", "Basic dXNlcjpwdw==") in own
    assert all(n.lower() != "referer" for n, _ in own)
    keyed = request_headers([("Authorization", "Bearer sbxk_abc_def")], via_link=True)
    assert all(n.lower() != "authorization" for n, _ in keyed)


def test_a_websocket_handshake_is_the_proxys_own() -> None:
    sent = request_headers([("Sec-WebSocket-Key", "k"), ("Sec-WebSocket-Version", "13"),
                            ("Sec-WebSocket-Protocol", "chat"), ("Origin", "http://svc")],
                           via_link=False, websocket=True)
    assert [n for n, _ in sent if not n.startswith("x-forwarded")] == ["Origin"]


def test_the_answer_loses_hop_by_hop_headers_and_moves_a_rooted_location() -> None:
    got = response_headers([("Connection", "close"), ("Transfer-Encoding", "chunked"),
                            ("Location", "/login?next=/"), ("Set-Cookie", "a=1"),
                            ("Set-Cookie", "b=2"), ("Referrer-Policy", "unsafe-url")],
                           prefix="/v1/previews/T", via_link=True)
    assert (b"location", b"/v1/previews/T/login?next=/") in got
    assert [v for n, v in got if n == b"set-cookie"] == [b"a=1; Path=/v1/previews/T/",
                                                         b"b=2; Path=/v1/previews/T/"]
    assert not {b"connection", b"transfer-encoding"} & {n for n, _ in got}
    assert [v for n, v in got if n == b"referrer-policy"] == [b"no-referrer"]
    elsewhere = response_headers([("Location", "https://example.org/")], prefix="/p",
                                 via_link=False)
    assert elsewhere == [(b"location", b"https://example.org/")]


def test_traffic_marks_activity_once_a_second_per_sandbox() -> None:
    marked: list[str] = []

    async def mark(sandbox_id: str) -> None:
        marked.append(sandbox_id)

    async def run() -> None:
        activity = Activity(mark, every=1.0)
        for _ in range(50):
            activity.seen("sbx-a")
            activity.seen("sbx-b")
        await asyncio.gather(*activity.tasks)
        assert sorted(marked) == ["sbx-a", "sbx-b"]
        activity.last["sbx-a"] -= 1.5  # a second and a half later
        activity.seen("sbx-a")
        await asyncio.gather(*activity.tasks)
        assert sorted(marked) == ["sbx-a", "sbx-a", "sbx-b"]

    asyncio.run(run())


def test_a_failing_mark_never_reaches_the_request() -> None:
    async def mark(sandbox_id: str) -> None:
        raise RuntimeError("destroyed meanwhile")

    async def run() -> None:
        activity = Activity(mark)
        activity.seen("sbx-a")
        await asyncio.gather(*activity.tasks)

    asyncio.run(run())  # no error: the request it came with goes on
