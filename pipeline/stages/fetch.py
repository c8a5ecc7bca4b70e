"""Fetch a URL for ingestion without letting the URL reach what it should not (SSRF).

Why each guard exists:
- Only http and https, and no user:password@: other schemes read local files or speak other
  protocols, and credentials in a URL end up in logs and job records.
- Every address the host resolves to is checked, and the request goes to the checked address
  itself (the Host header and TLS name stay the original host's): otherwise a name could point
  at the database, the cloud metadata service (169.254.169.254) or an admin port on loopback,
  or answer "public" to the check and "private" to the connect (DNS rebinding).
- Redirects are followed by hand, each hop checked like the first: a public page must not be
  able to bounce the fetch to an internal address.
- One time budget for the whole fetch, a byte limit counted while streaming, and a cap on
  redirects: a slow, endless or looping server must not hold a worker or fill its memory.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus

import httpx

from pipeline.errors import BadInput, PermanentError, RetryLater, TransientError
from pipeline.providers.http import parse_retry_after
from pipeline.settings import Settings

MAX_URL_CHARS = 2048
_ALLOW_HINT = "(allow it with MEMMILL_FETCH_ALLOW)"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Names of cloud metadata services that do not go through the 169.254.169.254 address check
# (a resolver may map them anywhere).
_METADATA_NAMES = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA_IP = ipaddress.ip_address("169.254.169.254")
# getaddrinfo's "no such name" answers; any other resolver failure may pass.
_NO_SUCH_HOST = frozenset(
    code for code in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None)) if code is not None
)
# Inet_aton's forms that ipaddress does not read: 2130706433, 0x7f.1, 127.1 are all 127.0.0.1.
_NUMERIC_HOST = re.compile(r"[0-9a-fA-FxX.]+")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class FetchPolicy:
    timeout_s: float = 20.0  # whole request budget (connect + read + redirects)
    max_bytes: int = 20_000_000  # a larger body is refused
    max_redirects: int = 5
    # Host names, addresses or CIDR blocks fetched even though private, loopback or link-local.
    allow: tuple[str, ...] = ()
    user_agent: str = "memmill/0.1 (+https://github.com/memmill)"


@dataclass(frozen=True)
class Fetched:
    url: str  # final URL after redirects
    media_type: str  # Content-Type without parameters, lower case ("" if none)
    charset: str | None
    data: bytes


def fetch_policy(settings: Settings) -> FetchPolicy:
    return FetchPolicy(
        timeout_s=settings.fetch_timeout_s,
        max_bytes=settings.fetch_max_bytes,
        max_redirects=settings.fetch_max_redirects,
        allow=tuple(settings.fetch_allow),
    )


class _Refused(Exception):
    """A URL that must not be fetched; becomes BadInput at submit time, PermanentError later."""

    def __init__(self, url: httpx.URL | None, reason: str) -> None:
        self.url, self.reason = url, reason
        super().__init__(reason if url is None else f"refused to fetch {_shown(url)}: {reason}")

    def via(self, origin: str) -> str:
        """The message for a hop that a redirect from `origin` led to."""
        if self.url is None:
            return f"{self} (redirected from {origin})"
        return f"refused to fetch {_shown(self.url)} (redirected from {origin}): {self.reason}"


# --- URL and address checks ---------------------------------------------------------------


def _shown(url: httpx.URL | str) -> str:
    """The URL for messages: never its credentials, nor its query (a signed URL's key)."""
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
        shown = str(parsed.copy_with(userinfo=b"", query=None, fragment=None))
    except (httpx.InvalidURL, TypeError, ValueError):
        return repr(str(url)[:200])
    if parsed.query:
        shown += "?…"
    return shown if len(shown) <= 200 else shown[:200] + "…"


def _parse(url: str) -> httpx.URL:
    if len(url) > MAX_URL_CHARS:
        raise _Refused(None, f"the URL is {len(url)} characters long; the limit is "
                             f"{MAX_URL_CHARS}")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise _Refused(None, f"{url[:200]!r} is not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        scheme = parsed.scheme or "none"
        raise _Refused(parsed, f"only http and https URLs can be fetched, not {scheme}")
    if not parsed.host or not _host(parsed):
        raise _Refused(parsed, "the URL has no host")
    if parsed.userinfo:
        raise _Refused(parsed, "the URL carries credentials (user:password@), which are not "
                               "accepted")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise _Refused(parsed, f"port {parsed.port} is out of range (1-65535)")
    return parsed


def _host(url: httpx.URL) -> str:
    """The host as sent to DNS and in the Host header: IDNA-encoded, no brackets."""
    return url.raw_host.decode("ascii").lower().rstrip(".")


@functools.lru_cache(maxsize=64)
def _allow_rules(allow: tuple[str, ...]) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    names: set[str] = set()
    networks: list[IPNetwork] = []
    for entry in allow:
        entry = entry.strip()
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            names.add(entry.lower().rstrip("."))
    return frozenset(names), tuple(networks)


def _embedded_ipv4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped, 6to4 or NAT64 IPv6 address."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _kind(ip: IPAddress) -> str | None:
    """What makes an address off limits, or None for a public address."""
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        if ip == _METADATA_IP:
            return "a link-local address (the cloud metadata service)"
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip in _CGNAT:
        return "a carrier-grade NAT address (100.64.0.0/10)"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved:
        return "a reserved address"
    if not ip.is_global:
        return "not a public address"
    return None


def _address_problem(ip: IPAddress, networks: Iterable[IPNetwork]) -> str | None:
    """Why `ip` may not be fetched ("a loopback address"), None if it may."""
    embedded = _embedded_ipv4(ip)
    if any(ip in net or (embedded is not None and embedded in net) for net in networks):
        return None
    if embedded is not None:
        kind = _kind(embedded)
        return f"{kind} ({embedded} in IPv6 form)" if kind else None
    return _kind(ip)


def _literal_ip(host: str) -> IPAddress | None:
    """The address a host names without DNS: 127.0.0.1, ::1, or inet_aton's 2130706433."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _NUMERIC_HOST.fullmatch(host) and any(c.isdigit() for c in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _check_name(url: httpx.URL, policy: FetchPolicy) -> tuple[str, IPAddress | None, bool]:
    """The checks that need no DNS: (host, its literal address if any, allowed by name)."""
    host = _host(url)
    names, networks = _allow_rules(policy.allow)
    if host in names:
        return host, _literal_ip(host), True
    if host in _METADATA_NAMES:
        raise _Refused(url, f"{host} is a cloud metadata service {_ALLOW_HINT}")
    ip = _literal_ip(host)
    if ip is not None and (problem := _address_problem(ip, networks)):
        named = host if ":" in host else str(ip)  # ::ffff:127.0.0.1 as written, 2130706433 read
        raise _Refused(url, f"{named} is {problem} {_ALLOW_HINT}")
    return host, ip, False


def check_url(url: str, policy: FetchPolicy) -> None:
    """Synchronous syntactic check used at submit time by the API (scheme http/https only, a
    host, no userinfo credentials, port in range, URL length <= 2048). Raises BadInput with
    the reason. Does NOT resolve DNS, nor judge addresses: those are checked when the job
    fetches, under the allow list in force then (a dead letter replayed after MEMMILL_FETCH_ALLOW
    changed may succeed). `policy` is taken for symmetry with fetch_url."""
    try:
        _parse(url)
    except _Refused as exc:
        raise BadInput(str(exc)) from None


# --- Resolution and one request -----------------------------------------------------------


@dataclass(frozen=True)
class _Hop:
    url: httpx.URL  # as given, with the host name
    host: str
    addresses: tuple[IPAddress, ...]  # all checked; the request goes to one of these

    def pinned(self, ip: IPAddress) -> httpx.URL:
        return self.url.copy_with(host=str(ip))


async def _resolve(url: httpx.URL, host: str) -> tuple[IPAddress, ...]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, url.port or (443 if url.scheme == "https" else 80),
                                       type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NO_SUCH_HOST:
            raise PermanentError(f"cannot fetch {_shown(url)}: the host {host} does not exist "
                                 f"(DNS: {exc.strerror})") from None
        raise TransientError(f"cannot fetch {_shown(url)}: resolving {host} failed: "
                             f"{exc.strerror}") from None
    except UnicodeError:
        raise PermanentError(f"cannot fetch {_shown(url)}: {host!r} is not a valid host "
                             "name") from None
    addresses: dict[IPAddress, None] = {}
    for family, *_, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            addresses[ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])] = None
    if not addresses:
        raise PermanentError(f"cannot fetch {_shown(url)}: {host} has no IP address")
    return tuple(addresses)


async def _vet(url: httpx.URL, policy: FetchPolicy) -> _Hop:
    """Check one hop and resolve its host once; every address must pass."""
    host, literal, allowed_by_name = _check_name(url, policy)
    if literal is not None:
        return _Hop(url, host, (literal,))
    addresses = await _resolve(url, host)
    if not allowed_by_name:
        _, networks = _allow_rules(policy.allow)
        for ip in addresses:
            if problem := _address_problem(ip, networks):
                raise _Refused(url, f"{host} resolves to {ip}, {problem} {_ALLOW_HINT}")
    return _Hop(url, host, addresses)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Certificate checks as httpx does them (certifi, or SSL_CERT_FILE / SSL_CERT_DIR)."""
    return httpx.create_ssl_context()


def _status_text(response: httpx.Response) -> str:
    try:
        phrase = HTTPStatus(response.status_code).phrase
    except ValueError:
        phrase = response.reason_phrase
    return f"{response.status_code} {phrase}".rstrip()


def _content_type(response: httpx.Response) -> tuple[str, str | None]:
    media_type, *params = response.headers.get("content-type", "").split(";")
    charset = None
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"'):
            charset = value.strip().strip('"').lower()
    return media_type.strip().lower(), charset


def _check_status(response: httpx.Response, shown: str) -> None:
    status = response.status_code
    if 200 <= status < 300:
        return
    answered = f"GET {shown} answered {_status_text(response)}"
    if status in (429, 503):
        wait = parse_retry_after(response.headers.get("retry-after"))
        later = f"; retry after {wait:g} s" if wait is not None else ""
        raise RetryLater(answered + later, retry_after_s=wait)
    if status == 408 or status >= 500:
        raise TransientError(answered)
    if status in _REDIRECTS:
        raise PermanentError(f"{answered} without a Location to follow")
    raise PermanentError(answered)


def _too_big(shown: str, size: str, policy: FetchPolicy) -> PermanentError:
    return PermanentError(f"{shown} is {size}, over the limit of {policy.max_bytes} bytes "
                          "(MEMMILL_FETCH_MAX_BYTES)")


async def _read(response: httpx.Response, shown: str, policy: FetchPolicy) -> bytes:
    declared = response.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > policy.max_bytes:
        raise _too_big(shown, f"{int(declared)} bytes (Content-Length)", policy)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > policy.max_bytes:
            raise _too_big(shown, f"more than {policy.max_bytes} bytes", policy)
    return bytes(body)


def _cert_problem(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def _get(hop: _Hop, policy: FetchPolicy) -> Fetched | str:
    """One GET to the hop's checked addresses, tried in order until one connects: the body,
    or the Location of a redirect."""
    shown = _shown(hop.url)
    headers = {
        "Host": hop.url.netloc.decode("ascii"),
        "User-Agent": policy.user_agent,
        "Accept": "*/*",
        # A compressed body is inflated a whole network chunk at a time, past any byte limit.
        "Accept-Encoding": "identity",
    }
    extensions = {}
    if hop.url.scheme == "https" and _literal_ip(hop.host) is None:
        # TLS sends this name (SNI) and checks the certificate against it, not the address.
        extensions["sni_hostname"] = hop.host
    failure: httpx.TransportError | None = None
    for ip in hop.addresses:
        # A client per hop: its connection pool is keyed by address, and a connection whose
        # certificate was checked for one name must not serve another name at the same address.
        async with httpx.AsyncClient(verify=_tls_context(), trust_env=False,
                                     follow_redirects=False, timeout=policy.timeout_s) as client:
            try:
                async with client.stream("GET", hop.pinned(ip), headers=headers,
                                         extensions=extensions) as response:
                    if response.status_code in _REDIRECTS and "location" in response.headers:
                        return response.headers["location"]
                    _check_status(response, shown)
                    media_type, charset = _content_type(response)
                    data = await _read(response, shown, policy)
                    return Fetched(str(hop.url), media_type, charset, data)
            except httpx.ConnectError as exc:
                if cert := _cert_problem(exc):
                    raise PermanentError(f"cannot fetch {shown}: the TLS certificate of "
                                         f"{hop.host} does not check out: "
                                         f"{cert.verify_message or cert}") from None
                failure = exc
            except httpx.TimeoutException as exc:
                raise TransientError(f"GET {shown} timed out ({type(exc).__name__})") from None
            except httpx.TransportError as exc:
                raise TransientError(f"GET {shown} failed: {exc or type(exc).__name__}") from None
    addresses = ", ".join(map(str, hop.addresses))
    raise TransientError(f"cannot connect to {shown} ({addresses}): {failure}")


async def _fetch(url: str, policy: FetchPolicy) -> Fetched:
    current = url
    for redirects in range(policy.max_redirects + 1):
        try:
            parsed = _parse(current)
            hop = await _vet(parsed, policy)
        except _Refused as exc:
            raise PermanentError(exc.via(_shown(url)) if redirects else str(exc)) from None
        result = await _get(hop, policy)
        if isinstance(result, Fetched):
            return result
        try:
            current = str(parsed.join(result))
        except httpx.InvalidURL:
            raise PermanentError(f"{_shown(parsed)} redirects to an invalid URL "
                                 f"{result[:200]!r}") from None
    raise PermanentError(f"too many redirects: {_shown(url)} was redirected more than "
                         f"{policy.max_redirects} times (the last time to {_shown(current)})")


async def fetch_url(url: str, policy: FetchPolicy) -> Fetched:
    """GET `url` under `policy`: PermanentError when retrying cannot help (refused address,
    4xx, too big, too many redirects, no such host), TransientError (RetryLater for 429 and
    503) when it may."""
    try:
        async with asyncio.timeout(policy.timeout_s):
            return await _fetch(url, policy)
    except TimeoutError:
        raise TransientError(f"fetching {_shown(url)} took longer than {policy.timeout_s:g} s "
                             "(MEMMILL_FETCH_TIMEOUT_S)") from None


__all__ = ["FetchPolicy", "Fetched", "RetryLater", "check_url", "fetch_policy", "fetch_url"]
