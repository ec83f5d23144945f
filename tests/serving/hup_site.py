"""A settings module whose URLconf adds /version, answered by a view module the serving tests rewrite
(tests/serving/conftest.py's ``site`` fixture): new code on disk, then HUP or recycling."""
import textwrap

VIEW = 'from django.http import HttpResponse\n\n\ndef version(request):\n    return HttpResponse("{text}")\n'
GATED = '''import os
import time

from django.http import HttpResponse

# New code that loads only once the test opens the gate (the file exists): the test decides when the new
# workers become ready, instead of racing them. Bounded, so a failed test leaves no worker behind for long.
open({gate!r} + ".waiting", "w").close()  # the test may now change the code on disk: this one is imported
deadline = time.monotonic() + 120
while not os.path.exists({gate!r}) and time.monotonic() < deadline:
    time.sleep(0.05)


{body}
'''
BROKEN_VIEW = 'raise RuntimeError("broken deploy: cannot import")\n'
BROKEN_MIDDLEWARE = '''
class Broken:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        raise RuntimeError("broken middleware: every request fails")
'''


def make_site(directory):
    directory.mkdir()
    (directory / "hup_settings.py").write_text('from tests.settings import *  # noqa\nROOT_URLCONF = "hup_urls"\n')
    (directory / "hup_urls.py").write_text(textwrap.dedent("""\
        from django.urls import path

        from hup_view import version
        from project.urls import urlpatterns as project_urls

        urlpatterns = [path("version", version), *project_urls]
    """))
    (directory / "hup_view.py").write_text(VIEW.format(text="old code"))
    return directory


def site_env(directory, **extra):
    return {"PYTHONPATH": str(directory), "DJANGO_SETTINGS_MODULE": "hup_settings", **extra}


def gated_view(gate, text=None):
    """A view module whose import waits for ``gate`` to exist, then serves ``text`` (None: then raises)."""
    body = (f'def version(request):\n    return HttpResponse("{text}")\n' if text is not None
            else 'raise RuntimeError("broken deploy: cannot import")\n')
    return GATED.format(gate=str(gate), body=body)
