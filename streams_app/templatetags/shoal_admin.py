"""``{% shoal_summary %}``: what needs attention, at the top of the admin index."""
from django import template

from streams_app.admin import mirror
from streams_app.conf import get_settings
from streams_app.redis.connection import page_connection

register = template.Library()


@register.inclusion_tag("admin/streams_app/summary.html", takes_context=True)
def shoal_summary(context):
    from streams_app.models import ConsumerGroup, Stream

    request = context.get("request")
    if request is None or not request.user.has_perm("streams_app.view_consumergroup"):
        return {"show": False}
    copied = mirror.try_sync(page_connection(request))
    config = get_settings()
    target = config["TARGET_LAG"]  # the supervisor's autoscaling target doubles as "lagging"
    groups = ConsumerGroup.objects.select_related("stream")
    from streams_app.outbox.cleanup import backlog
    return {
        "show": True,
        "mirror": copied,
        "target": target,
        "pending_timeout": config["PENDING_TIMEOUT_MS"] / 1000,
        "lagging": groups.filter(lag__gt=target).order_by("-lag")[:20],
        "stale": groups.filter(stale_pending__gt=0).order_by("-stale_pending")[:20],
        "dead": Stream.objects.filter(dead_letters__gt=0).order_by("-dead_letters")[:20],
        "stale_cap": mirror.STALE_PENDING_CAP,
        "groups": groups.count(),
        "outbox": backlog(),  # rows not yet relayed to Redis (publish(..., outbox=True))
    }
