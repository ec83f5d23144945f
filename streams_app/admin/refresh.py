"""Live refresh of the group and pending pages: opt-in, no JavaScript, no build step.

``?refresh=N`` (5 to 300 seconds) makes the page reload itself every N seconds (an HTML meta
refresh, which the admin's Content-Security-Policy allows); the page shows when it was rendered.
Off unless asked for: a pending page of 100,000 entries reloading by itself costs Redis for nothing.
"""
from django.utils import timezone
from django.utils.http import urlencode

CHOICES = (5, 15, 60)


def refresh_context(request):
    try:
        every = int(request.GET.get("refresh", 0))
    except ValueError:
        every = 0
    every = every if 5 <= every <= 300 else 0
    others = {k: v for k, v in request.GET.items() if k != "refresh"}

    def url(seconds):
        query = {**others, **({"refresh": seconds} if seconds else {})}
        return request.path + ("?" + urlencode(query) if query else "")

    return {
        "refresh": every,
        "refreshed_at": timezone.now(),
        "refresh_links": [(seconds, url(seconds)) for seconds in CHOICES if seconds != every],
        "refresh_off_url": url(0) if every else "",
    }
