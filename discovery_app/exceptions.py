"""Errors raised by discovery_app. Catch ``DiscoveryError`` to catch them all."""


class DiscoveryError(Exception):
    """Base class of every error discovery_app raises on purpose."""


class InvalidRegistration(DiscoveryError, ValueError):
    """A service name, address, port or metadata value cannot be registered as given."""


class UnknownInstance(DiscoveryError, LookupError):
    """An instance id this registry object cannot place: it did not register it and no service was given."""


class ServiceNotAvailable(DiscoveryError):
    """No instance of ``service`` can be used; ``reason`` says why."""

    NO_INSTANCES = "no instances are registered and no fallback is configured"
    ALL_UNHEALTHY = "every registered instance is unhealthy"
    NO_MATCH = "no instance matches the tags and version asked for"
    REGISTRY_UNREACHABLE = "the registry is unreachable and there is neither a cached instance nor a fallback"

    def __init__(self, service, reason, detail=""):
        self.service = service
        self.reason = reason
        message = f"service {service!r} is not available: {reason}"
        super().__init__(f"{message} ({detail})" if detail else message)


class ClientClosed(DiscoveryError, RuntimeError):
    """``resolve()`` or ``request()`` on a DiscoveryClient after its ``close()``: make a new client."""
