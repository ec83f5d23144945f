from django.conf import settings
from django.contrib import admin
from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.urls import path

from project.metrics_view import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),
]
if settings.DEBUG:
    # `make run` serves the admin's CSS from gunicorn; production runs collectstatic behind a web server.
    urlpatterns += staticfiles_urlpatterns()
