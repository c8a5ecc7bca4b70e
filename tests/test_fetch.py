"""The URL fetcher against a real HTTP/1.1 server on loopback (raw asyncio, no mocks).

The server is on 127.0.0.1, which the SSRF guard refuses, so most tests allow that address
explicitly; `test_loopback_server_is_refused_without_allow` proves the same URL is refused
without it. DNS is faked in one place only, to simulate a rebinding resolver.
"""

from __future__ import annotations

import asyncio
import email.utils
import re
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.errors import BadInput, PermanentError, TransientError
from pipeline.stages import fetch
from pipeline.stages.fetch import FetchPolicy, RetryLater, check_url, fetch_url

LIMIT = 100_000
PAGE = b"<!doctype html><html><head><title>Hi</title></head><body><p>caf\xc3\xa9</p></body></html>"
ALLOW = FetchPolicy(allow=("127.0.0.1",), timeout_s=5.0, max_bytes=LIMIT)

Send = Callable[[asyncio.StreamWriter], Awaitable[None]]


def _head(status: str, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status}", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _answer(status: str, body: bytes = b"", **headers: str) -> Send:
    async def send(writer: asyncio.StreamWriter) -> None:
        all_headers = {**{k.replace("_", "-"): v for k, v in headers.items()},
                       "Content-Length": str(len(body))}
        writer.write(_head(status, all_headers) + body)
        await writer.drain()

    return send


async def _big(writer: asyncio.StreamWriter) -> None:
    """Declares ten times the limit; the client must refuse before reading it."""
    writer.write(_head("200 OK", {"Content-Type": "application/octet-stream",
                                  "Content-Length": str(10 * LIMIT)}) + b"x" * 1000)
    await writer.drain()


async def _chunked_big(writer: asyncio.StreamWriter) -> None:
    """No Content-Length, and ten times the limit in 10 kB chunks."""
    writer.write(_head("200 OK", {"Content-Type": "text/plain", "Transfer-Encoding": "chunked"}))
    chunk = b"y" * 10_000
    for _ in range(100):
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _slow(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)
    await _answer("200 OK", b"late")(writer)


def _http_date(seconds_from_now: float) -> str:
    return email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


ROUTES: dict[str, Callable[[], Send]] = {
    "/page": lambda: _answer("200 OK", PAGE, Content_Type="text/html; charset=UTF-8"),
    "/empty-type": lambda: _answer("200 OK", b"raw"),
    "/big": lambda: _big,
    "/chunked-big": lambda: _chunked_big,
    "/redirect-ok": lambda: _answer("302 Found", Location="/page"),
    "/redirect-loop": lambda: _answer("302 Found", Location="/redirect-loop"),
    "/redirect-private": lambda: _answer(
        "302 Found", Location="http://169.254.169.254/latest/meta-data/"),
    "/missing": lambda: _answer("404 Not Found", b"no such page"),
    "/busy": lambda: _answer("429 Too Many Requests", Retry_After="7"),
    "/down": lambda: _answer("503 Service Unavailable"),
    "/later": lambda: _answer("503 Service Unavailable", Retry_After=_http_date(60)),
    "/timeout": lambda: _answer("408 Request Timeout"),
    "/slow": lambda: _slow,
}


@dataclass
class Server:
    port: int
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (path, headers)
    sni: list[str | None] = field(default_factory=list)

    def url(self, path: str, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"


@pytest.fixture(scope="module")
async def start_server() -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    servers: list[asyncio.Server] = []
    handlers: set[asyncio.Task[None]] = set()

    async def start(tls: ssl.SSLContext | None = None) -> Server:
        state = Server(port=0)
        if tls is not None:
            tls.sni_callback = lambda _obj, name, _ctx: state.sni.append(name)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                request_line, *lines = head.split("\r\n")
                path = request_line.split(" ")[1]
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (line.partition(":") for line in lines if line)}
                state.seen.append((path, headers))
                route = ROUTES.get(path, lambda: _answer("404 Not Found"))
                await route()(writer)
            except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
                pass  # the client hung up, as it should on /big, /chunked-big and /slow
            finally:
                handlers.discard(task)
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
        servers.append(server)
        state.port = server.sockets[0].getsockname()[1]
        return state

    yield start
    for server in servers:
        server.close()
    for task in list(handlers):
        task.cancel()
    for server in servers:
        await server.wait_closed()


@pytest.fixture(scope="module")
async def server(start_server: Callable[..., Awaitable[Server]]) -> Server:
    return await start_server()


@pytest.fixture(autouse=True)
def _fresh_log(server: Server) -> None:
    server.seen.clear()


# --- refused before any connection ------------------------------------------------------------

# Refused by check_url at submit time already: the URL itself is wrong.
MALFORMED = [
    ("ftp://example.com/", "only http and https"),
    ("file:///etc/passwd", "only http and https"),
    ("http://user:pw@example.com/", "credentials"),
    ("http:///nohost", "no host"),
    ("http://example.com:70000/", "port 70000 is out of range"),
    ("http://example.com/" + "a" * 2048, "the limit is 2048"),
]
# Refused when the job fetches, under the allow list in force then.
REFUSED = [
    *MALFORMED,
    ("http://127.0.0.1/", "127.0.0.1 is a loopback address"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
    ("http://[::1]/", "::1 is a loopback address"),
    ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1 is a loopback address"),
    ("http://2130706433/", "127.0.0.1 is a loopback address"),
    ("http://10.1.2.3/", "10.1.2.3 is a private address"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://0.0.0.0/", "0.0.0.0 is an unspecified address"),
    ("http://metadata.google.internal/computeMetadata/v1/", "cloud metadata service"),
    ("http://[fe80::1]/", "fe80::1 is a link-local address"),
    ("http://224.0.0.1/", "224.0.0.1 is a multicast address"),
]


@pytest.mark.parametrize(("url", "reason"), REFUSED)
async def test_refused_urls(url: str, reason: str) -> None:
    with pytest.raises(PermanentError, match=re.escape(reason)) as caught:
        await fetch_url(url, FetchPolicy())
    assert "pw" not in str(caught.value)
    if "address" in reason or "metadata" in reason:
        assert "MEMMILL_FETCH_ALLOW" in str(caught.value)


@pytest.mark.parametrize(("url", "reason"), MALFORMED)
def test_check_url_refuses_malformed_urls(url: str, reason: str) -> None:
    with pytest.raises(BadInput, match=re.escape(reason)) as caught:
        check_url(url, FetchPolicy())
    assert "pw" not in str(caught.value)


def test_check_url_leaves_addresses_to_the_fetch() -> None:
    # Addresses are judged when fetching, so that a dead letter replayed after
    # MEMMILL_FETCH_ALLOW changed can succeed; check_url never resolves a name.
    for url in ("https://example.com/a?b=c", "http://localhost:8000/", "http://10.1.2.3/",
                "http://[::1]:8000/", "http://no-such-host.invalid/"):
        check_url(url, FetchPolicy())


async def test_a_name_for_loopback_is_refused() -> None:
    with pytest.raises(PermanentError, match="localhost resolves to") as caught:
        await fetch_url("http://localhost/", FetchPolicy())  # 127.0.0.1 or ::1, whichever first
    assert "a loopback address (allow it with MEMMILL_FETCH_ALLOW)" in str(caught.value)


async def test_unknown_host_is_permanent() -> None:
    host = "no-such-host.invalid"  # RFC 6761: never exists
    try:
        socket.getaddrinfo(host, 80)
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_AGAIN:
            pytest.skip("no DNS resolver answers here, so a missing name cannot be told apart")
    with pytest.raises(PermanentError, match=f"the host {host} does not exist"):
        await fetch_url(f"http://{host}/", FetchPolicy())


# --- the loopback server ----------------------------------------------------------------------


async def test_loopback_server_is_refused_without_allow(server: Server) -> None:
    with pytest.raises(PermanentError, match=r"127\.0\.0\.1 is a loopback address"):
        await fetch_url(server.url("/page"), FetchPolicy(timeout_s=5.0))
    assert server.seen == []


async def test_fetch_page(server: Server) -> None:
    got = await fetch_url(server.url("/page"), ALLOW)
    assert got.url == server.url("/page")
    assert got.media_type == "text/html"
    assert got.charset == "utf-8"
    assert got.data == PAGE
    [(path, headers)] = server.seen
    assert path == "/page"
    assert headers["host"] == f"127.0.0.1:{server.port}"
    assert headers["user-agent"] == ALLOW.user_agent


async def test_no_content_type(server: Server) -> None:
    got = await fetch_url(server.url("/empty-type"), ALLOW)
    assert (got.media_type, got.charset, got.data) == ("", None, b"raw")


async def test_allow_by_cidr(server: Server) -> None:
    got = await fetch_url(server.url("/page"), FetchPolicy(allow=("127.0.0.0/8",)))
    assert got.data == PAGE


async def test_allow_by_host_name(server: Server) -> None:
    got = await fetch_url(server.url("/page", host="LocalHost"), FetchPolicy(allow=("localhost",)))
    assert got.data == PAGE
    assert server.seen[0][1]["host"] == f"localhost:{server.port}"  # the name, not the address


async def test_redirect_is_followed(server: Server) -> None:
    got = await fetch_url(server.url("/redirect-ok"), ALLOW)
    assert got.url == server.url("/page")
    assert got.data == PAGE
    assert [path for path, _ in server.seen] == ["/redirect-ok", "/page"]


async def test_redirect_to_metadata_is_refused(server: Server) -> None:
    with pytest.raises(PermanentError, match=r"169\.254\.169\.254 is a link-local") as caught:
        await fetch_url(server.url("/redirect-private"), ALLOW)
    assert "redirected from" in str(caught.value)


async def test_redirect_loop(server: Server) -> None:
    with pytest.raises(PermanentError, match="too many redirects"):
        await fetch_url(server.url("/redirect-loop"), ALLOW)
    assert len(server.seen) == ALLOW.max_redirects + 1


@pytest.mark.parametrize("path", ["/big", "/chunked-big"])
async def test_size_limit(server: Server, path: str) -> None:
    with pytest.raises(PermanentError, match=f"limit of {LIMIT} bytes.*MEMMILL_FETCH_MAX_BYTES"):
        await fetch_url(server.url(path), ALLOW)


async def test_not_found_is_permanent(server: Server) -> None:
    with pytest.raises(PermanentError, match="answered 404 Not Found"):
        await fetch_url(server.url("/missing"), ALLOW)


async def test_busy_retries_later(server: Server) -> None:
    with pytest.raises(RetryLater, match="429 Too Many Requests; retry after 7 s") as caught:
        await fetch_url(server.url("/busy"), ALLOW)
    assert caught.value.retry_after_s == 7


async def test_retry_after_http_date(server: Server) -> None:
    with pytest.raises(RetryLater) as caught:
        await fetch_url(server.url("/later"), ALLOW)
    assert caught.value.retry_after_s is not None
    assert 55 <= caught.value.retry_after_s <= 61


@pytest.mark.parametrize(("path", "status"), [("/down", "503"), ("/timeout", "408")])
async def test_server_trouble_is_transient(server: Server, path: str, status: str) -> None:
    with pytest.raises(TransientError, match=status) as caught:
        await fetch_url(server.url(path), ALLOW)
    assert not isinstance(caught.value, PermanentError)


async def test_slow_server_times_out(server: Server) -> None:
    started = time.monotonic()
    with pytest.raises(TransientError, match=r"longer than 0\.5 s"):
        await fetch_url(server.url("/slow"), FetchPolicy(allow=("127.0.0.1",), timeout_s=0.5))
    assert time.monotonic() - started < 2


async def test_connection_refused_is_transient() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TransientError, match="cannot connect"):
        await fetch_url(f"http://127.0.0.1:{port}/", ALLOW)


# --- pinning: the request goes to the address that was checked --------------------------------


@pytest.fixture
async def rebinding_dns(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A resolver that answers 127.0.0.1 the first time and 10.0.0.1 after that.

    127.0.0.1 (allowed by the policy these tests use) plays the public address that a
    rebinding attacker shows to the check; 10.0.0.1 is the private one it then hands out.
    The event loop's own getaddrinfo is replaced, which is also what httpx would call if it
    resolved the name itself, so a second lookup would show in the returned list.
    """
    calls: list[str] = []

    async def getaddrinfo(host: str | bytes, port: int | str | None, *args: object,
                          **kwargs: object) -> list[tuple[object, ...]]:
        name = host.decode() if isinstance(host, bytes) else host
        calls.append(name)
        if name != "rebind.test":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        ip = "127.0.0.1" if len(calls) == 1 else "10.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (ip, port))]

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", getaddrinfo)
    return calls


async def test_connects_to_the_checked_address(server: Server, rebinding_dns: list[str]) -> None:
    got = await fetch_url(server.url("/page", host="rebind.test"), ALLOW)
    assert got.data == PAGE
    assert rebinding_dns == ["rebind.test"]  # resolved once; nobody asked again before connecting
    assert server.seen[0][1]["host"] == f"rebind.test:{server.port}"


async def test_each_redirect_hop_is_resolved_and_checked(server: Server,
                                                         rebinding_dns: list[str]) -> None:
    with pytest.raises(PermanentError, match=r"rebind\.test resolves to 10\.0\.0\.1, a private"):
        await fetch_url(server.url("/redirect-ok", host="rebind.test"), ALLOW)
    assert rebinding_dns == ["rebind.test", "rebind.test"]
    assert [path for path, _ in server.seen] == ["/redirect-ok"]


# --- https: pinned to the address, certificate checked for the name ----------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA and a certificate for the name localhost only (no IP address in it)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = tmp_path_factory.mktemp("certs")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=memmill test CA", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _openssl("req", "-new", *ec, "-keyout", "leaf.key", "-out", "leaf.csr",
             "-subj", "/CN=localhost", cwd=d)
    (d / "leaf.ext").write_text("subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n"
                                "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-set_serial", "1", "-days", "2", "-extfile", "leaf.ext", "-out", "leaf.pem", cwd=d)
    return d


@pytest.fixture(scope="module")
async def tls_server(start_server: Callable[..., Awaitable[Server]], certs: Path) -> Server:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs / "leaf.pem", certs / "leaf.key")
    return await start_server(context)


@pytest.fixture
def trust_test_ca(monkeypatch: pytest.MonkeyPatch, certs: Path) -> None:
    """Only the trust roots change; the fetcher's TLS code path is the production one."""
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    monkeypatch.setattr(fetch, "_tls_context", lambda: context)


@pytest.mark.usefixtures("trust_test_ca")
async def test_https_verifies_the_name_not_the_address(tls_server: Server) -> None:
    tls_server.seen.clear()
    tls_server.sni.clear()
    url = tls_server.url("/page", host="localhost", scheme="https")
    got = await fetch_url(url, FetchPolicy(allow=("localhost",), timeout_s=5.0))
    assert got.data == PAGE
    assert got.url == url
    assert tls_server.sni == ["localhost"]  # the connection went to 127.0.0.1, SNI says localhost
    assert tls_server.seen[0][1]["host"] == f"localhost:{tls_server.port}"


@pytest.mark.usefixtures("trust_test_ca")
async def test_https_certificate_for_another_name_is_refused(tls_server: Server) -> None:
    # The certificate names localhost only; asked for 127.0.0.1, it must not check out.
    with pytest.raises(PermanentError, match=r"TLS certificate of 127\.0\.0\.1 does not check out"):
        await fetch_url(tls_server.url("/page", scheme="https"), ALLOW)
