"""``DISCOVERY["FALLBACKS"]``: base URLs used when the registry has no instance of a service.

One parser serves the system check and the client, so a URL that passes ``manage.py check`` is a
URL the client can use: a bad port fails the check, not the first call that needs the fallback.
A base path is kept (``http://gateway/orders-api`` + ``/orders/1``); credentials are refused,
because requests would send them to whatever the URL's host is and they belong in ``auth=``.
"""
from urllib.parse import urlsplit

from discovery_app.instance import Instance


class InvalidFallback(ValueError):
    pass


def parse_fallback(url):
    """(scheme, host, port, base path) of a fallback URL, or InvalidFallback saying what is wrong."""
    if not isinstance(url, str):
        raise InvalidFallback(f"{url!r} is not a URL string")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. "http://[::1:80": an unclosed IPv6 bracket
        raise InvalidFallback(f"{url!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidFallback(f"{url!r} is not an http(s)://host[:port][/path] URL")
    if parts.username is not None or parts.password is not None:
        raise InvalidFallback(f"{url!r} carries credentials; pass them per call (request(..., auth=...))")
    if parts.query or parts.fragment:
        raise InvalidFallback(f"{url!r} has a query or fragment; a fallback is a base URL")
    try:
        port = parts.port
    except ValueError:
        raise InvalidFallback(f"{url!r} has a port that is not a number from 1 to 65535") from None
    if port == 0:
        raise InvalidFallback(f"{url!r} has port 0")
    port = port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname, port, parts.path.rstrip("/")


def fallback_instances(service, urls):
    found = []
    for url in urls:
        scheme, host, port, base_path = parse_fallback(url)
        found.append(Instance(service=service, instance_id=f"fallback:{url}", address=host, port=port,
                              scheme=scheme, base_path=base_path, ttl=0.0))
    return found
