"""The web tier: the packaged gunicorn config, the application check a worker passes before it is
ready, /healthz and /readyz (health), /metrics (metrics_view) and the URLconf that mounts them.
"""
