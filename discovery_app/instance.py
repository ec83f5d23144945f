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
    scheme: str = "http"

    @property
    def url(self):
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def is_fallback(self):
        return self.ttl == 0

    def heartbeat_age(self, now=None):
        """Seconds since the last heartbeat; ``now`` on the Redis server's clock (epoch seconds)."""
        return max(0.0, (time.time() if now is None else now) - self.last_heartbeat)

    def is_healthy(self, factor, now=None):
        return self.is_fallback or self.heartbeat_age(now) < factor * self.ttl

    def to_json(self):
        data = asdict(self)
        data["tags"] = list(self.tags)
        data.pop("scheme")
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text):
        data = json.loads(text)
        extra = data.get("extra")
        return cls(
            service=data["service"],
            instance_id=data["instance_id"],
            address=data["address"],
            port=int(data["port"]),
            version=data.get("version") or "",
            zone=data.get("zone") or None,
            weight=float(data.get("weight", 1.0)),
            # cjson turns an empty list into {}; either way it is "no tags".
            tags=tuple(data.get("tags") or ()),
            registered_at=float(data.get("registered_at") or 0.0),
            last_heartbeat=float(data.get("last_heartbeat") or 0.0),
            ttl=float(data.get("ttl") or 0.0),
            extra=extra if isinstance(extra, dict) else {},
        )
