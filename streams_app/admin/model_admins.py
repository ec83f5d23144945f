"""The control room: streams, consumer groups (with their pending entries) and dead letters.

The models mirror Redis (streams_app/admin/mirror.py); every page syncs them when it opens and says how
old its numbers are. Mutating actions go to Redis, never to the rows alone; each has a permission
of its own, a confirmation page, and a LogEntry per object. Views too big for here live in
admin_views.py.
"""
import json
from itertools import groupby

import redis
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import mark_safe

from shoal_common.redis_errors import may_have_run
from streams_app.redis import keys
from streams_app.partitioning import partitions

from streams_app.admin import logical as logical_views
from streams_app.admin import pending
from streams_app.admin import views as admin_views

from streams_app.admin import mirror
from streams_app.admin.support import MirrorAdmin, confirmation, log_actions, pretty_json, redis_unreachable_is_a_message
from streams_app.admin.charts import group_chart
from streams_app.conf import setting
from streams_app.admin.consumers import group_consumers
from streams_app.admin.refresh import refresh_context
from streams_app.redis.connection import TRANSIENT_ERRORS, page_connection, web_connection
from streams_app.exceptions import ReplayError
from streams_app.redis.lag import from_shown
from streams_app.models import ConsumerGroup, DeadLetter, Stream
from streams_app.deadletters.replay import SKIP_REASONS, replay

# Dead letters per replay / delete call: one script run stays short however many are selected.
ACTION_BATCH = 200
CONFIRM_LISTED = 100
CHART_HOURS = (1, 6, 24, 168)


class StreamsMirrorAdmin(MirrorAdmin):
    def sync(self, request):
        return mirror.try_sync(page_connection(request))


def logical_link(name):
    """'orders (2 of 6)' linking to the logical stream's page, for a partition; '' otherwise."""
    stream, index = partitions.logical(name)
    if index is None:
        return ""
    return format_html('<a href="{}">{}</a> ({} of {})', logical_views.logical_url(stream), stream, index,
                       len(partitions.names(stream)))


class LogicalStreamFilter(admin.SimpleListFilter):
    """The partitions of one partitioned stream (derived from STREAMS['PARTITIONS'], never scanned)."""

    title = "logical stream"
    parameter_name = "logical"
    field = "name"

    def lookups(self, request, model_admin):
        declared = setting("PARTITIONS") or {}
        return [(name, name) for name in sorted(declared) if partitions.is_partitioned(name)]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        return queryset.filter(**{f"{self.field}__in": partitions.reading(self.value())})


class GroupLogicalStreamFilter(LogicalStreamFilter):
    field = "stream__name"


@admin.register(Stream)
class StreamAdmin(StreamsMirrorAdmin, admin.ModelAdmin):
    list_display = ("name", "logical_stream", "length", "scheduled", "groups", "dead_letters_link", "last_id", "exists",
                    "problem", "synced_at")
    list_filter = ("exists", LogicalStreamFilter)
    search_fields = ("name",)
    fields = ("name", "logical_stream", "length", "scheduled", "groups", "dead_letters", "last_id", "exists", "problem",
              "dlq_cursor", "synced_at")
    readonly_fields = fields

    @admin.display(description="consumers", ordering="live_consumers")
    def consumers_display(self, obj):
        # XINFO's count keeps a SIGKILLed worker; only a renewed liveness deadline says it runs.
        if obj.live_consumers is None:
            return obj.consumers
        return f"{obj.live_consumers} alive of {obj.consumers}"

    @admin.display(description="dead letters", ordering="dead_letters")
    def dead_letters_link(self, obj):
        url = reverse("admin:streams_app_deadletter_changelist") + "?" + urlencode({"stream": obj.name})
        return format_html('<a href="{}">{}</a>', url, obj.dead_letters)

    @admin.display(description="logical stream")
    def logical_stream(self, obj):
        return logical_link(obj.name)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [path("logical/", view(self.logical_view), name="streams_app_stream_logical"), *super().get_urls()]

    @redis_unreachable_is_a_message
    def logical_view(self, request):
        return logical_views.logical_stream(self, request)


@admin.register(ConsumerGroup)
class ConsumerGroupAdmin(StreamsMirrorAdmin, admin.ModelAdmin):
    list_display = ("name", "stream", "logical_stream", "lag_display", "pending_link", "stale_pending",
                    "consumers_display", "dead_letters_link", "last_delivered_id", "entries_read", "handler",
                    "max_deliveries")
    list_filter = ("stream", GroupLogicalStreamFilter, ("handler", admin.EmptyFieldListFilter))
    search_fields = ("name", "stream__name", "handler")
    list_select_related = ("stream",)
    fields = ("stream", "name", "lag_display", "pending", "stale_pending", "consumers_display", "dead_letters", "last_delivered_id",
              "entries_read",
              "handler", "max_deliveries", "synced_at")
    readonly_fields = fields
    change_form_template = "admin/streams_app/consumergroup/change_form.html"

    def has_retry_permission(self, request):
        return request.user.has_perm("streams_app.retry_pending")

    def has_claim_permission(self, request):
        return request.user.has_perm("streams_app.claim_pending")

    def has_ack_permission(self, request):
        return request.user.has_perm("streams_app.ack_pending")

    def has_deadletter_permission(self, request):
        return request.user.has_perm("streams_app.deadletter_pending")

    @admin.display(description="lag", ordering="lag")
    def lag_display(self, obj):
        # Redis reports no lag after deletes or trims; the mirror then counts the entries past the
        # last delivered id. Never shown as zero or as nothing.
        if obj.lag is None:
            return "-"
        return f"~{obj.lag} (estimated)" if obj.lag_estimated else obj.lag

    @admin.display(description="consumers", ordering="live_consumers")
    def consumers_display(self, obj):
        # XINFO's count keeps a SIGKILLed worker; only a renewed liveness deadline says it runs.
        if obj.live_consumers is None:
            return obj.consumers
        return f"{obj.live_consumers} alive of {obj.consumers}"

    @admin.display(description="dead letters", ordering="dead_letters")
    def dead_letters_link(self, obj):
        url = reverse("admin:streams_app_deadletter_changelist") + "?" + urlencode({"stream": obj.stream.name,
                                                                                   "group": obj.name})
        return format_html('<a href="{}">{}</a>', url, obj.dead_letters)

    @admin.display(description="logical stream")
    def logical_stream(self, obj):
        stream, index = partitions.logical(obj.stream.name)
        if index is None:
            return ""
        return format_html('{} (<a href="{}">pending in all {} partitions</a>)', logical_link(obj.stream.name),
                           logical_views.logical_pending_url(stream, obj.name), len(partitions.names(stream)))

    @admin.display(description="pending", ordering="pending")
    def pending_link(self, obj):
        url = reverse("admin:streams_app_consumergroup_pending", args=[obj.pk])
        return format_html('<a href="{}">{}</a>', url, obj.pending)

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("logical-pending/", view(self.logical_pending_view), name="streams_app_consumergroup_logical_pending"),
            path("find/", view(self.find_view), name="streams_app_consumergroup_find"),
            path("<path:object_id>/pending/", view(self.pending_view), name="streams_app_consumergroup_pending"),
            path("<path:object_id>/replay-dead-letters/", view(self.replay_all_view),
                 name="streams_app_consumergroup_replay_all"),
            *super().get_urls(),
        ]

    def find_view(self, request):
        from streams_app.admin.lookup import find_message

        return find_message(self, request)

    def replay_all_view(self, request, object_id):
        from streams_app.admin.replay_jobs import replay_all

        return replay_all(self, request, self.get_object_or_404(request, object_id))

    @redis_unreachable_is_a_message
    def logical_pending_view(self, request):
        return logical_views.logical_pending(self, request)

    @redis_unreachable_is_a_message
    def pending_view(self, request, object_id):
        return pending.pending_entries(self, request, object_id)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        mirror = self.sync(request)
        group = self.get_object_or_404(request, object_id)
        try:
            hours = int(request.GET.get("hours", 6))
        except ValueError:
            hours = 6
        hours = hours if hours in CHART_HOURS else 6
        problems = []
        conn = page_connection(request)
        consumers = group_consumers(conn, group.stream.name, from_shown(group.name), problems)
        for problem in problems:
            self.message_user(request, problem, messages.WARNING)
        context = {
            "mirror": mirror,
            "consumers": consumers,
            "chart": mark_safe(group_chart(group.stream.name, group.name, hours=hours)),  # built from escaped parts
            "hours": hours,
            **refresh_context(request),
            "hour_choices": CHART_HOURS,
            "pending_url": reverse("admin:streams_app_consumergroup_pending", args=[group.pk]),
            "find_url": reverse("admin:streams_app_consumergroup_find") + "?" + urlencode({"stream": group.stream.name}),
            "replay_all_url": reverse("admin:streams_app_consumergroup_replay_all", args=[group.pk])
            if request.user.has_perm("streams_app.replay_deadletter") and group.dead_letters else "",
            "dead_letters_url": reverse("admin:streams_app_deadletter_changelist")
            + "?" + urlencode({"stream": group.stream.name, "group": group.name}),
        }
        return super().change_view(request, object_id, form_url, {**context, **(extra_context or {})})


def as_stored(value):
    """A filter value as the mirror stores text: NUL as the four characters \\x00 (PostgreSQL text
    cannot hold NUL; the query would fail with DataError), so ?group=a%00b finds group "a\\x00b"."""
    return value.replace("\x00", "\\x00")


class ErrorTypeFilter(admin.SimpleListFilter):
    title = "error type"
    parameter_name = "error_type"

    def lookups(self, request, model_admin):
        types = DeadLetter.objects.order_by("error_type").values_list("error_type", flat=True).distinct()
        return [(t, t) for t in types[:50]]

    def queryset(self, request, queryset):
        return queryset.filter(error_type=as_stored(self.value())) if self.value() else queryset


class ValueFilter(admin.SimpleListFilter):
    """Filter on the distinct values of one column (few streams and groups, many rows)."""

    field = None

    def lookups(self, request, model_admin):
        values = DeadLetter.objects.order_by(self.field).values_list(self.field, flat=True).distinct()
        return [(v, v) for v in values[:100]]

    def queryset(self, request, queryset):
        return queryset.filter(**{self.field: as_stored(self.value())}) if self.value() else queryset


class StreamFilter(ValueFilter):
    title = parameter_name = field = "stream"


class GroupFilter(ValueFilter):
    title = parameter_name = field = "group"


@admin.register(DeadLetter)
class DeadLetterAdmin(StreamsMirrorAdmin, admin.ModelAdmin):
    list_display = ("entry", "stream", "group", "short_error", "deliveries", "failed_at", "payload_preview")
    list_filter = (StreamFilter, GroupFilter, ErrorTypeFilter, "failed_at")
    search_fields = ("payload", "error", "origin_id", "entry_id")
    date_hierarchy = "failed_at"
    actions = ("replay_selected", "delete_selected_dead_letters")
    fields = ("stream", "entry_id", "origin_id", "group", "consumer", "deliveries", "failed_at", "error",
              "pretty_payload", "pretty_traceback", "other_fields", "synced_at")
    readonly_fields = fields
    change_form_template = "admin/streams_app/deadletter/change_form.html"

    def has_replay_permission(self, request):
        return request.user.has_perm("streams_app.replay_deadletter")

    def has_delete_deadletter_permission(self, request):
        return request.user.has_perm("streams_app.delete_deadletter")

    def gone_message(self, count):
        return (f"{count} of the selected dead letters {'is' if count == 1 else 'are'} gone: replayed or deleted by "
                "someone else meanwhile. "
                "Nothing was done to them.")

    # -- columns ----------------------------------------------------------------------------

    @admin.display(description="entry id", ordering="entry_sort")
    def entry(self, obj):
        return obj.entry_id  # sorted as Redis orders ids (ms, then seq), not as text

    @admin.display(description="error")
    def short_error(self, obj):
        return obj.error[:60] + ("…" if len(obj.error) > 60 else "")

    @admin.display(description="payload")
    def payload_preview(self, obj):
        return format_html("<code>{}</code>", obj.payload[:60] + ("…" if len(obj.payload) > 60 else ""))

    @admin.display(description="payload")
    def pretty_payload(self, obj):
        return format_html('<pre class="shoal-json">{}</pre>', pretty_json(obj.payload))

    @admin.display(description="traceback")
    def pretty_traceback(self, obj):
        return format_html('<pre class="shoal-traceback">{}</pre>', obj.traceback or "(none recorded)")

    @admin.display(description="other fields")
    def other_fields(self, obj):
        extra = {k: v for k, v in obj.fields.items() if k not in ("payload", "data")}
        return format_html("<pre>{}</pre>", json.dumps(extra, indent=2, ensure_ascii=False)) if extra else "-"

    # -- pages ------------------------------------------------------------------------------

    def get_urls(self):
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/replay/", view(self.replay_edited_view), name="streams_app_deadletter_replay"),
            *super().get_urls(),
        ]

    @redis_unreachable_is_a_message
    def replay_edited_view(self, request, object_id):
        return admin_views.replay_edited(self, request, object_id)

    change_list_template = "admin/streams_app/deadletter/change_list.html"

    def changelist_view(self, request, extra_context=None):
        # Filtered to one group: offer to replay all of its letters from Redis, in the background
        # (the mirror holds what was copied so far; "select all" replays those within the request).
        stream, group = request.GET.get("stream"), request.GET.get("group")
        found = (ConsumerGroup.objects.filter(stream__name=stream, name=group).first()
                 if stream and group and self.has_replay_permission(request) else None)
        url = reverse("admin:streams_app_consumergroup_replay_all", args=[found.pk]) if found else ""
        return super().changelist_view(request, {"replay_all_url": url, **(extra_context or {})})

    def history_view(self, request, object_id, extra_context=None):
        # A replayed or deleted letter's row is gone, its audit is not: its history lives on in the
        # audit trail (project/audit.py), filtered to it.
        if str(object_id).isdigit() and not DeadLetter.objects.filter(pk=object_id).exists():
            from django.contrib.contenttypes.models import ContentType
            from django.http import Http404, HttpResponseRedirect

            from django.contrib.admin.models import LogEntry

            content_type = ContentType.objects.get_for_model(DeadLetter, for_concrete_model=False)
            if LogEntry.objects.filter(content_type=content_type, object_id=str(object_id)).exists():
                return HttpResponseRedirect(reverse("admin:admin_logentry_changelist") + "?" + urlencode(
                    {"object_id": object_id, "content_type": content_type.pk}))
            raise Http404(f"dead letter {object_id} does not exist and has no recorded history")
        return super().history_view(request, object_id, extra_context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        letter = self.get_object_or_404(request, object_id)
        context = {
            "can_replay": self.has_replay_permission(request),
            "can_delete": self.has_delete_deadletter_permission(request),
            "replay_url": reverse("admin:streams_app_deadletter_replay", args=[letter.pk]),
        }
        return super().change_view(request, object_id, form_url, {**context, **(extra_context or {})})

    # -- actions ----------------------------------------------------------------------------

    def _confirm(self, request, queryset, action, title, warning):
        select_across = request.POST.get("select_across") == "1"
        listed = list(queryset[:CONFIRM_LISTED])
        items = [f"{d.stream} {d.entry_id} — group {d.group}: {d.error[:100]}" for d in listed]
        ids = [listed[0].pk] if select_across and listed else [d.pk for d in queryset]
        return confirmation(request, self, title=title, action=action, items=items, warning=warning, ids=ids,
                            select_across=select_across, count=queryset.count())

    @admin.action(permissions=["replay"], description="Replay selected dead letters to their group")
    def replay_selected(self, request, queryset):
        if not request.POST.get("post"):
            return self._confirm(request, queryset, "replay_selected", "Replay dead letters",
                                 "Each goes back to its origin stream for the group that failed it only.")
        conn = web_connection()
        replayed, gone, kept = 0, 0, {}
        batches = list(_batches(queryset))
        for done, ((stream, group), batch) in enumerate(batches):
            by_entry = {d["entry_id"]: d for d in batch}
            try:
                result = replay(stream, group, ids=list(by_entry), conn=conn)
            except ReplayError as exc:
                self.message_user(request, f"Not replayed to {stream}:{group}: {exc}", messages.ERROR)
                continue
            except (*TRANSIENT_ERRORS, redis.ResponseError) as exc:
                # Each batch is one script: the ones before were replayed, this one and the rest were not.
                _interrupted(self, request, exc, "Replayed", "replayed", replayed, batches[done:])
                break
            log_actions(request, DeadLetter, [
                (by_entry[old]["pk"], f"{stream} {old}", f"Replayed to group {group} of {stream} as entry {new}")
                for old, new in result.replayed
            ], CHANGE)
            replayed += len(result.replayed)
            missing = [i for i, why in result.skipped.items() if why == "missing"]
            gone += len(missing)
            for entry_id, why in result.skipped.items():
                if why != "missing":
                    kept.setdefault(why, []).append(entry_id)
            # A letter still in Redis (too wide to replay) stays listed; replayed and vanished ones go.
            DeadLetter.objects.filter(pk__in=[by_entry[i]["pk"] for i in [*dict(result.replayed), *missing]]).delete()
        else:
            _report(self, request, replayed, gone, "Replayed")
            _not_replayed(self, request, kept)
            mirror.try_sync(conn)
            return None
        if gone:
            _report(self, request, 0, gone, "Replayed")
        _not_replayed(self, request, kept)
        return None

    @admin.action(permissions=["delete_deadletter"], description="Delete selected dead letters")
    def delete_selected_dead_letters(self, request, queryset):
        if not request.POST.get("post"):
            return self._confirm(request, queryset, "delete_selected_dead_letters", "Delete dead letters",
                                 "Deleted dead letters are gone from Redis for good: they cannot be replayed.")
        conn = web_connection()
        deleted, gone = 0, 0
        batches = list(_batches(queryset))
        for done, ((stream, _group), batch) in enumerate(batches):
            pipe = conn.pipeline(transaction=True)  # a batch is deleted whole or not at all
            for d in batch:
                pipe.xdel(keys.dead_letter_key(stream), d["entry_id"])
            try:
                outcomes = pipe.execute()
            except (*TRANSIENT_ERRORS, redis.ResponseError) as exc:
                _interrupted(self, request, exc, "Deleted", "deleted", deleted, batches[done:])
                return None
            log_actions(request, DeadLetter, [
                (d["pk"], f"{stream} {d['entry_id']}", f"Deleted dead letter {d['entry_id']} of {stream}")
                for d, n in zip(batch, outcomes) if n
            ], DELETION)
            deleted += sum(outcomes)
            gone += len(batch) - sum(outcomes)
            DeadLetter.objects.filter(pk__in=[d["pk"] for d in batch]).delete()
        _report(self, request, deleted, gone, "Deleted")
        mirror.try_sync(conn)


def _interrupted(model_admin, request, exc, verb, participle, done, remaining):
    """Redis failed part-way through a bulk action: say what was done and what was not, never "nothing".

    The batch in flight (``remaining[0]``) is in doubt when its command may have reached Redis: a
    client that gave up waiting cannot know whether it ran (a frozen Redis runs it when continued).
    """
    in_flight = len(remaining[0][1]) if remaining and may_have_run(exc) else 0
    left = sum(len(batch) for _, batch in remaining) - in_flight
    doubt = (f"; the next {in_flight} may or may not have been {participle} (they were sent and Redis did not "
             f"answer: the list shows which are still dead letters once it does)" if in_flight else "")
    rest = f"; the other {left} were not {participle}" if left else ""
    model_admin.message_user(
        request,
        f"{verb} {done} dead letter{'s' if done != 1 else ''} before Redis failed ({type(exc).__name__}: {exc})"
        f"{doubt}{rest}. They are still listed: select them again when Redis is back.",
        messages.ERROR,
    )


def _batches(queryset):
    """((stream, group), [row dicts]) in batches of ACTION_BATCH, streaming through thousands of rows."""
    rows = queryset.order_by("stream", "group", "pk").values("pk", "stream", "group", "entry_id")
    # Read up front: the batches delete their rows as they go.
    for key, same in groupby(list(rows), key=lambda d: (d["stream"], d["group"])):
        batch = []
        for row in same:
            batch.append(row)
            if len(batch) == ACTION_BATCH:
                yield key, batch
                batch = []
        if batch:
            yield key, batch


def _report(model_admin, request, done, gone, verb):
    if done:
        model_admin.message_user(request, f"{verb} {done} dead letter{'s' if done != 1 else ''}.", messages.SUCCESS)
    if gone:
        model_admin.message_user(
            request,
            f"{gone} dead letter{'s were' if gone != 1 else ' was'} no longer in Redis: replayed or deleted by "
            "someone else meanwhile. Nothing was done to them.",
            messages.WARNING,
        )


def _not_replayed(model_admin, request, kept):
    """Letters the replay left where they are (too wide for the script...): why, and which."""
    for why, ids in kept.items():
        shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        model_admin.message_user(
            request, f"{len(ids)} dead letter{'s were' if len(ids) != 1 else ' was'} not replayed: {shown}: "
                     f"{SKIP_REASONS[why]}. {'They stay' if len(ids) != 1 else 'It stays'} in the dead letters.",
            messages.WARNING)

