from django.conf import settings
from django.contrib import admin
from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.urls import include, path
from django.views.generic import RedirectView

from project import audit  # noqa: F401  (registers the audit trail's admin page)

admin.site.site_header = "Shoal control room"
admin.site.site_title = "Shoal control room"
admin.site.index_title = "Streams, consumer groups, dead letters and services"
admin.site.site_url = None  # Shoal has no site besides the admin: no "View site" link to a 404

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="admin:index"), name="home"),
    path("admin/", admin.site.urls),
    # /healthz, /readyz, /metrics, as any host project adds them (HealthCheckMiddleware answers the probes first).
    path("", include("streams_app.web.urls")),
]
if settings.DEBUG:
    # `make run` serves the admin's CSS from gunicorn; production runs collectstatic behind a web server.
    urlpatterns += staticfiles_urlpatterns()
