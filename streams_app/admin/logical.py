"""A partitioned stream as one logical stream in the admin: its partitions, and its groups summed.

Each partition is a stream of its own (streams_app/partitioning/partitions.py), mirrored and listed like any
other; these pages put them back together: the logical stream with its partitions (length, dead
letters, and each group's lag and pending summed over the partitions), and a group's pending
entries across partitions (the oldest of every partition, merged by id). Acting on pending entries
stays on each partition's own pending page, where ids mean something: an id is unique only within
its partition.
"""
import json

from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

import redis

from shoal_common.redis_errors import is_missing
from streams_app.partitioning import layout, partitions
from streams_app.admin.mirror import entry_sort_key
from streams_app.admin.pending import PENDING_PAGE_SIZE, read_pending_page
from streams_app.admin.support import page_context
from streams_app.conf import get_settings
from streams_app.redis.connection import TRANSIENT_ERRORS, page_connection
from streams_app.redis.lag import from_shown


def logical_url(name):
    return reverse("admin:streams_app_stream_logical") + "?" + urlencode({"name": name})


def logical_pending_url(stream, group):
    return reverse("admin:streams_app_consumergroup_logical_pending") + "?" + urlencode({"stream": stream, "group": group})


def _declared(request, parameter="name"):
    """(logical stream, its partitions): the live layout (a repartition's draining partitions first), else
    as recorded in Redis ({S}:partitions), else as declared."""
    name = request.GET.get(parameter, "")
    try:
        live = layout.read(page_connection(request), name) if name else None
        raw = page_connection(request).get(partitions.record_key(name)) if name and live is None else None
    except (*TRANSIENT_ERRORS, redis.ResponseError):
        live = raw = None  # Redis away: the declared layout (the mirror's age says how old the rest is)
    if live is not None:
        return name, live.reading()
    if raw:
        return name, json.loads(raw)
    if not partitions.is_partitioned(name):
        raise Http404(f"{name!r} is not a partitioned stream (STREAMS['PARTITIONS'])")
    return name, partitions.names(name)


def logical_stream(model_admin, request):
    """The page of a logical stream: partitions, and per group the lag and pending of each and their sums."""
    from streams_app.models import ConsumerGroup, Stream

    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    name, names = _declared(request)
    mirror = model_admin.sync(request)
    rows = {row.name: row for row in Stream.objects.filter(name__in=names)}
    parts = [{"index": i, "name": p, "row": rows.get(p),
              "dead_letters_url": reverse("admin:streams_app_deadletter_changelist") + "?" + urlencode({"stream": p})}
             for i, p in enumerate(names)]
    groups = {}
    for group in ConsumerGroup.objects.filter(stream__name__in=names).select_related("stream"):
        groups.setdefault(group.name, {})[group.stream.name] = group
    summed = []
    for group_name in sorted(groups):
        by_partition = groups[group_name]
        members = [by_partition.get(p) for p in names]
        present = [g for g in members if g is not None]
        summed.append({
            "name": group_name,
            "lag": sum(g.lag or 0 for g in present),
            "lag_estimated": any(g.lag_estimated for g in present),
            "pending": sum(g.pending for g in present),
            "stale_pending": sum(g.stale_pending for g in present),
            "consumers": max((g.consumers for g in present), default=0),
            "missing": len(names) - len(present),
            "partitions": [{"index": i, "name": p, "group": g} for i, (p, g) in enumerate(zip(names, members))],
            "pending_url": logical_pending_url(name, group_name),
        })
    context = {
        **page_context(model_admin, request, f"Logical stream {name}"),
        "mirror": mirror,
        "name": name,
        "partitions": parts,
        "length": sum(row.length for row in rows.values()),
        "dead_letters": sum(row.dead_letters for row in rows.values()),
        "scheduled": sum(row.scheduled for row in rows.values()),
        "groups": summed,
    }
    return TemplateResponse(request, "admin/streams_app/stream/logical.html", context)


def logical_pending(model_admin, request):
    """A group's pending entries across the partitions of a logical stream, live from Redis."""
    from streams_app.models import ConsumerGroup

    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    name, names = _declared(request, "stream")
    group = request.GET.get("group", "")
    if not group:
        raise Http404(f"give the consumer group: ?stream={name}&group=GROUP (the groups are on the logical "
                      f"stream's page)")
    mirror = model_admin.sync(request)  # the partitions' group rows, for the links to their own pages
    conn = page_connection(request)
    rows = {g.stream.name: g for g in ConsumerGroup.objects.filter(stream__name__in=names, name=group)
            .select_related("stream")}
    per_partition, merged, unreachable = [], [], ""
    for index, stream in enumerate(names):
        row = rows.get(stream)
        try:
            total = conn.xpending(stream, from_shown(group)).get("pending", 0)
            page, _ = read_pending_page(conn, stream, from_shown(group), count=PENDING_PAGE_SIZE)
        except redis.ResponseError as exc:
            if not is_missing(exc):
                raise
            total, page = None, []  # no such group (or stream) on this partition yet
        except TRANSIENT_ERRORS as exc:
            # As every other page: the mirror's last copy (the counts, with their age), and why.
            unreachable = unreachable or (f"Redis is unreachable ({type(exc).__name__}: {exc}): the entries cannot "
                                          "be listed now. The counts are the mirror's last copy.")
            total, page = (row.pending if row else None), []
        url = reverse("admin:streams_app_consumergroup_pending", args=[row.pk]) if row else ""
        per_partition.append({"index": index, "name": stream, "pending": total, "url": url})
        merged.extend({**entry, "partition": stream, "index": index, "url": url} for entry in page)
    merged.sort(key=lambda entry: (entry_sort_key(entry["id"]), entry["index"]))
    total = sum(p["pending"] or 0 for p in per_partition)
    context = {
        **page_context(model_admin, request, f"Pending entries of {group} on {name}"),
        "mirror": mirror,
        "unreachable": unreachable,
        "name": name,
        "group": group,
        "logical_url": logical_url(name),
        "total": total,
        "partitions": per_partition,
        "entries": merged[:PENDING_PAGE_SIZE],
        "pending_timeout": get_settings()["PENDING_TIMEOUT_MS"] / 1000,
    }
    return TemplateResponse(request, "admin/streams_app/consumergroup/logical_pending.html", context)
