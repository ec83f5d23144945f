"""Other apps' admin mirrors, refreshed together with the streams mirror.

The control room copies Redis into models when a page opens and on every reclaim-daemon pass
(streams_app.admin.mirror.sync_all). An app with a mirror of its own registers a hook from its
``AppConfig.ready()`` (discovery_app: the service instances), so streams_app calls it without
knowing the app. A hook takes ``now`` and raises Redis errors for the caller to record.
"""
_hooks = []


def register_mirror(hook):
    """Run ``hook(now=...)`` with every sync of the admin mirrors."""
    if hook not in _hooks:
        _hooks.append(hook)
    return hook


def sync_registered(now):
    for hook in list(_hooks):
        hook(now=now)
