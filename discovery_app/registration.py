"""What a registration must be before ServiceRegistry writes it: a service name, an address, a port
and metadata checked and turned into an Instance.

Everything here is refused with InvalidRegistration before Redis is touched, with a message that says
what was wrong: a service name is part of its keys' cluster hash tag (no braces, no whitespace, valid
Unicode); an address is a host name or an IP literal that clients can connect to as given (no scheme,
port or path, no IPv6 zone, nothing a URL parser would read as another IPv4 address); the port, weight,
tags, scheme and instance id have their types and ranges. An instance id not given is made unique per
process start (service, pod or host name, pid, a random suffix).

It imports nothing that talks to Redis: registry.py (``register``, and every reader and writer that
takes a service name) and registrar.py (``build_instance``, through registry) call it.
"""
import ipaddress
import math
import os
import re
import socket
import uuid

from discovery_app.exceptions import InvalidRegistration
from discovery_app.instance import Instance

SCHEMES = ("http", "https")


def validate_service(service):
    if not isinstance(service, str) or not service.strip():
        raise InvalidRegistration(f"service name must be a non-empty string, not {service!r}")
    if any(c in service for c in "{}") or any(c.isspace() for c in service):
        raise InvalidRegistration(
            f"service name {service!r} may not contain braces or whitespace "
            "(braces are the cluster hash tag of its keys)"
        )
    try:
        service.encode("utf-8")
    except UnicodeEncodeError as exc:  # a shell's $'\xff' reaches argv as a lone surrogate (os.fsdecode)
        raise InvalidRegistration(
            f"service name {service!r} is not valid Unicode: it holds a lone surrogate {service[exc.start]!r} at "
            f"position {exc.start} (a byte that is not UTF-8), which cannot be stored; use a UTF-8 name"
        ) from None


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_NUMERIC_LABEL = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")


def validate_address(address):
    """A host name or an IP literal, as clients will connect to it; returns it normalised.

    IPv6 may come bracketed ("[::1]", as in a URL) or bare; it is stored bare and bracketed once
    when a URL is built. Anything with a scheme, a port, a path or spaces is refused: the port is
    its own argument, and a URL here would become "http://http://...".
    """
    problem = f"address must be a host name or an IP address (no scheme, port or path), not {address!r}"
    if not isinstance(address, str) or not address:
        raise InvalidRegistration(problem)
    bare = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        ip = None
    if ip is not None:
        if ip.version == 6 and ip.scope_id:
            # A zone names an interface of one host, and in a URL it must be written %25: clients elsewhere can't use it.
            raise InvalidRegistration(problem + "; an IPv6 zone (%interface) is only meaningful on one host: "
                                                "register a global or unique-local address")
        if bare is not address and ip.version != 6:
            raise InvalidRegistration(problem + "; only IPv6 addresses are written in brackets")
        return str(ip) if ip.version == 6 else bare
    labels = address[:-1].split(".") if address.endswith(".") else address.split(".")
    if len(address) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise InvalidRegistration(problem)
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        # URL parsers (WHATWG) read a host whose last label is a number as IPv4: 1.2.3, 0x7f.1 and
        # 999999999 would reach some other address, and 10.0.0.256 fails. Not an IP, so not a host name.
        raise InvalidRegistration(problem + "; it looks like an IPv4 address but is not one (four numbers 0-255)")
    return address


def new_instance_id(service):
    return f"{service}-{os.environ.get('POD_NAME') or socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def build_instance(service, address, port, metadata=None, instance_id=None):
    """Validate a registration and turn it into an Instance (timestamps are set by Redis)."""
    validate_service(service)
    metadata = dict(metadata or {})
    address = validate_address(address)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise InvalidRegistration(f"port must be an integer from 1 to 65535, not {port!r}")
    weight = metadata.pop("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
        raise InvalidRegistration(f"weight must be a finite number >= 0, not {weight!r}")
    tags = metadata.pop("tags", ()) or ()
    if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags):
        raise InvalidRegistration(f"tags must be a list of strings, not {tags!r}")
    scheme = metadata.pop("scheme", "http") or "http"
    if scheme not in SCHEMES:
        raise InvalidRegistration(f"scheme must be one of {', '.join(SCHEMES)}, not {scheme!r}")
    if instance_id is not None and (not isinstance(instance_id, str) or not instance_id):
        raise InvalidRegistration(f"instance_id must be a non-empty string, not {instance_id!r}")
    return Instance(
        service=service,
        instance_id=instance_id or new_instance_id(service),
        address=address,
        port=port,
        version=str(metadata.pop("version", "") or ""),
        zone=metadata.pop("zone", None) or None,
        weight=float(weight),
        tags=tuple(tags),
        extra=metadata,
        scheme=scheme,
    )
