"""Service registry with TTL heartbeats and a load-balancing discovery client (see issue 6)."""
