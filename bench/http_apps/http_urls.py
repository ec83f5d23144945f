from django.http import HttpResponse
from django.urls import path

from project.urls import urlpatterns as project_urls


def hello(request):
    return HttpResponse("hello", content_type="text/plain")


urlpatterns = [path("hello", hello), *project_urls]
