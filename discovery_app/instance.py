"""``Instance``: one registered endpoint of a service, as the registry stores and returns it."""
import json
import time
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Instance:
    service: str
    instance_id: str
    address: str
    port: int
    version: str = ""
    zone: str | None = None
    weight: float = 1.0
    tags: tuple = ()
    registered_at: float = 0.0  # epoch seconds, Redis server clock
    last_heartbeat: float = 0.0  # epoch seconds, Redis server clock
    ttl: float = 0.0  # seconds; 0 for fallback endpoints, which have no heartbeat
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    scheme: str = "http"  # "https" for an instance that serves TLS
    base_path: str = ""  # a fallback URL's path ("/orders-api"); registered instances serve at "/"
    # Random per register() call: a process deregisters an id only while the record is its own, so
    # an old process stopping cannot remove a newer one that reuses the same instance_id.
    registration: str = field(default="", compare=False)
    draining: bool = field(default=False, compare=False)  # set by an operator; not part of the record
    failing: bool = field(default=False, compare=False)  # its registrar's active health check fails

    @property
    def url(self):
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.scheme}://{host}:{self.port}{self.base_path}"

    @property
    def is_fallback(self):
        return self.ttl == 0

    def heartbeat_age(self, now=None):
        """Seconds since the last heartbeat; ``now`` on the Redis server's clock (epoch seconds)."""
        return max(0.0, (time.time() if now is None else now) - self.last_heartbeat)

    def is_healthy(self, factor, now=None):
        return self.is_fallback or self.heartbeat_age(now) < factor * self.ttl

    def to_json(self):
        """The record as stored: what was registered. Times live beside it (see keys.beats_key)."""
        data = asdict(self)
        data["tags"] = list(self.tags)
        for name in ("base_path", "registered_at", "last_heartbeat", "ttl", "draining", "failing"):
            data.pop(name)
        return json.dumps(data, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text, beat=None):
        """An Instance from its stored record and its beat ("registered_at_ms last_heartbeat_ms ttl_ms";
        records written before beats existed carry the times themselves)."""
        data = json.loads(text)
        if beat:
            registered_ms, heartbeat_ms, ttl_ms = beat.split()
            registered_at, last_heartbeat, ttl = int(registered_ms) / 1000, int(heartbeat_ms) / 1000, int(ttl_ms) / 1000
        else:
            registered_at = float(data.get("registered_at") or 0.0)
            last_heartbeat = float(data.get("last_heartbeat") or 0.0)
            ttl = float(data.get("ttl") or 0.0)
        extra = data.get("extra")
        instance = object.__new__(cls)
        # Filled in directly rather than through the frozen __init__ (one object.__setattr__ per
        # field): a refresh builds every instance of the service, 10,000 of them at scale.
        vars(instance).update(
            service=data["service"],
            instance_id=data["instance_id"],
            address=data["address"],
            port=int(data["port"]),
            version=data.get("version") or "",
            zone=data.get("zone") or None,
            weight=float(data.get("weight", 1.0)),
            # Old records went through cjson, which turns an empty list into {}: "no tags" either way.
            tags=tuple(data.get("tags") or ()),
            registered_at=registered_at,
            last_heartbeat=last_heartbeat,
            ttl=ttl,
            extra=extra if isinstance(extra, dict) else {},
            scheme=data.get("scheme") or "http",  # records written before schemes existed are http
            base_path="",
            registration=data.get("registration") or "",
            draining=False,
            failing=False,
        )
        return instance
