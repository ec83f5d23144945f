"""What streams_app and discovery_app both need, so that neither imports the other.

An installed Django app of its own (``"shoal_common"`` in INSTALLED_APPS) only for its templates:
the admin's confirmation page and the mirror's "copied from Redis" note. It imports no Shoal app;
each app registers what it contributes (broadcast handlers, mirror hooks, logger names) from its
``AppConfig.ready()``.
"""
