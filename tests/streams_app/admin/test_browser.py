"""An operator in a real browser: find a failed message by its payload, see why it failed, fix and
replay it, and see the group recover on its chart.

Playwright drives Debian's chromium (/usr/bin/chromium, from the Makefile's system-deps) against
pytest-django's live server, which talks to the test's private Redis. A GroupLoop in this process
is the running consumer that handles the replayed message; Reclaimer passes with an injected clock
record the snapshots the chart draws. Screenshots go to the test's tmp dir; with
SHOAL_DOCS_SCREENSHOTS=1 they are also copied to docs/ for the README.
"""
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User

from discovery_app.registry import ServiceRegistry
from streams_app import publish_many
from streams_app.redis import keys
from streams_app.conf import get_settings
from streams_app.redis.connection import get_connection
from streams_app.operations.reclaim import Reclaimer
from streams_app.registry import select
from tests.streams_app.consuming.loops import make_loop, run_until  # noqa: F401
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
DOCS = Path(__file__).resolve().parents[3] / "docs"  # the repository's docs/


@pytest.fixture
def browser(monkeypatch):
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: `make system-deps` installs Debian's chromium")
    # Playwright's sync API runs an event loop in this thread; the ORM calls the test makes
    # between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Snapshots:
    """Reclaimer passes at chosen (past) times: each pass stores one GroupSnapshot row per group."""

    def __init__(self, redis, start):
        self.redis = redis
        self.at = start
        self.reclaimer = Reclaimer(select(["jobs:a"]), conn=get_connection(),
                                   config={**get_settings(), "SNAPSHOT_INTERVAL": 0.001})

    def take(self, minutes_later=5):
        # The 1 ms "one daemon writes this row" key of the previous pass must have expired.
        wait_for(lambda: not self.redis.exists("{jobs}:snapshot:a"), timeout=5, what="the snapshot key to expire")
        self.at += minutes_later * 60
        assert self.reclaimer.tick(now=self.at).snapshots == 1


def operator(live_server):
    user = User.objects.create_user("operator", password="correct horse battery", is_staff=True)
    codenames = ["view_stream", "view_consumergroup", "view_deadletter", "replay_deadletter", "view_serviceinstance",
                 "claim_pending", "ack_pending"]
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def test_an_operator_finds_fixes_and_replays_a_dead_letter_and_sees_the_group_recover(
        browser, live_server, redis, make_loop, tmp_path):
    shots = tmp_path / "screenshots"
    shots.mkdir()
    loop = make_loop("jobs:a", RETRY_BACKOFF=0.01, RETRY_BACKOFF_MAX=0.05)
    handled = lambda: redis.lrange("handled:jobs:a", 0, -1)  # noqa: E731

    # An hour of history: a burst of 300 orders, one of which fails on every delivery.
    history = Snapshots(redis, start=time.time() - 7 * 300 - 60)  # seven passes, 5 minutes apart
    redis.xgroup_create("jobs", "a", id="$", mkstream=True)
    orders = [{"order": 1000 + n, "sku": f"S-{n}"} for n in range(300)]
    orders[42] = {"order": 1042, "sku": None, "fail": "order 1042 has no sku"}
    publish_many("jobs", orders)
    history.take()
    for done in (100, 200):
        run_until(loop, lambda done=done: len(handled()) >= done)
        history.take()
    run_until(loop, lambda: len(handled()) == 299 and redis.xlen(keys.dead_letter_key("jobs")) == 1)
    history.take()
    history.take()

    # Some entries held by a stuck worker, for the pending page.
    publish_many("jobs", [{"order": 2000 + n, "sku": f"T-{n}"} for n in range(3)])
    redis.xreadgroup("a", "stuck-worker", {"jobs": ">"})

    user = operator(live_server)
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "correct horse battery")
    page.click("input[type=submit]")
    page.wait_for_selector("#shoal-summary")
    assert "Dead letters jobs (1)" in " ".join(page.inner_text("#shoal-summary").split())
    page.screenshot(path=shots / "admin-index.png", full_page=True)

    # Find the failed message by its payload, and see why it failed.
    page.goto(f"{live_server.url}/admin/streams_app/deadletter/")
    page.fill("#searchbar", "1042")
    page.press("#searchbar", "Enter")
    page.wait_for_selector("#result_list")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1 and "RuntimeError" in rows.first.inner_text()
    page.screenshot(path=shots / "admin-deadletters.png", full_page=True)
    rows.first.locator("th a, td a").first.click()
    page.wait_for_selector("pre.shoal-traceback")
    assert "asked to fail: order 1042 has no sku" in page.inner_text("pre.shoal-traceback")
    assert '"sku": null' in page.inner_text("pre.shoal-json")
    page.screenshot(path=shots / "admin-deadletter.png", full_page=True)

    # Fix the payload, review, replay.
    page.click("a.shoal-replay-edited")
    page.fill("#id_payload", json.dumps({"order": 1042, "sku": "S-42"}, indent=2))
    page.click("input[type=submit]")
    page.wait_for_selector("text=Are you sure?")
    page.screenshot(path=shots / "admin-replay-confirm.png", full_page=True)
    page.click("input[value='Yes, I’m sure']")
    page.wait_for_selector("ul.messagelist li.success")
    assert "with the edited payload to group a" in page.inner_text("ul.messagelist")
    page.screenshot(path=shots / "admin-replayed.png", full_page=True)
    assert redis.xlen(keys.dead_letter_key("jobs")) == 0

    # The running consumer handles the replayed entry (and only group a was sent it).
    replayed = [i for i, f in redis.xrange("jobs") if f.get("shoal:target_group") == "a"]
    assert len(replayed) == 1
    run_until(loop, lambda: replayed[0] in handled() and redis.xpending("jobs", "a")["pending"] == 3)  # acked too
    history.take()
    history.take()

    page.goto(f"{live_server.url}/admin/streams_app/consumergroup/")
    page.locator("#result_list tbody tr").first.locator("a").first.click()
    page.wait_for_selector("svg.shoal-chart")
    assert page.locator("svg.shoal-chart polyline[data-series='lag']").count() == 1
    assert "dead letters 0" in page.locator("svg.shoal-chart").text_content()
    assert "stuck-worker" in page.inner_text("table.shoal-consumers")
    page.screenshot(path=shots / "admin-group.png", full_page=True)

    page.click("text=Pending entries")
    page.wait_for_selector("table.shoal-pending")
    assert page.locator("table.shoal-pending tbody tr").count() == 3
    page.screenshot(path=shots / "admin-pending.png", full_page=True)

    # Two registered web instances, registered just before: under load the steps above outlast their TTL.
    registry = ServiceRegistry()
    registry.register("shoal-web", "10.0.0.11", 8000, {"version": "1.4.0", "zone": "eu-west-1a"})
    registry.register("shoal-web", "10.0.0.12", 8000, {"version": "1.4.0", "zone": "eu-west-1b", "weight": 2})
    page.goto(f"{live_server.url}/admin/discovery_app/serviceinstance/")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == 2
    page.screenshot(path=shots / "admin-instances.png", full_page=True)

    if os.environ.get("SHOAL_DOCS_SCREENSHOTS"):
        DOCS.mkdir(exist_ok=True)
        for shot in shots.glob("admin-*.png"):
            shutil.copy(shot, DOCS / shot.name)


OVERLAP = """([a, b]) => {
  const r = document.querySelector(a).getBoundingClientRect(), s = document.querySelector(b).getBoundingClientRect();
  return r.left < s.right && s.left < r.right && r.top < s.bottom && s.top < r.bottom;
}"""


def test_with_redis_frozen_the_outage_banner_leaves_the_buttons_uncovered(browser, live_server, redis_factory, use_redis):
    import signal

    from streams_app.admin import mirror
    from streams_app.models import ConsumerGroup
    from tests.streams_app.admin.fixtures import dead_letter

    server = redis_factory()
    use_redis(server)
    dead_letter(server.client(), [{"n": 1}])
    mirror.sync_all()
    group = ConsumerGroup.objects.get(name="a")
    user = operator(live_server)
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "correct horse battery")
    page.click("input[type=submit]")
    page.wait_for_selector("#shoal-summary")
    server.process.send_signal(signal.SIGSTOP)
    try:
        for url, button in [(f"/admin/streams_app/consumergroup/{group.pk}/change/", "ul.object-tools a"),
                            ("/admin/streams_app/consumergroup/", "#changelist-search input[type=submit]"),
                            ("/admin/streams_app/deadletter/", "#changelist-search input[type=submit]")]:
            started = time.monotonic()
            page.goto(live_server.url + url)
            page.wait_for_selector("p.shoal-mirror.errornote")
            assert time.monotonic() - started < 10, url
            assert not page.evaluate(OVERLAP, ["p.shoal-mirror", button]), f"{url}: the banner covers {button}"
            box = page.locator(button).first.bounding_box()
            hit = page.evaluate("([x, y]) => document.elementFromPoint(x, y).outerHTML",
                                [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2])
            assert hit == page.locator(button).first.evaluate("e => e.outerHTML"), f"{url}: {hit[:200]}"
    finally:
        server.process.send_signal(signal.SIGCONT)


def test_an_operator_retries_a_dead_consumers_stuck_entries_now_and_finds_a_message_in_two_groups(
        browser, live_server, redis, make_loop, settings, tmp_path):
    from streams_app.consuming.groups import ensure_group
    from streams_app.deadletters import store as deadletters

    shots = tmp_path / "screenshots"
    shots.mkdir()
    # Nothing is delivered again within this test but by the operator's hand: a 300 s back-off, a
    # 600 s pending timeout.
    slow = {"RETRY_BACKOFF": 300, "PENDING_TIMEOUT_MS": 600_000, "CLAIM_INTERVAL_MS": 100}
    settings.STREAMS = slow
    loop = make_loop("jobs:a", **slow)
    handled = lambda: redis.lrange("handled:jobs:a", 0, -1)  # noqa: E731
    for group in ("a", "b"):
        ensure_group(redis, "jobs", group, start="$")
    ids = publish_many("jobs", [{"order": 3000 + n} for n in range(60)])
    redis.xreadgroup("a", "ghost-worker", {"jobs": ">"})
    deadletters.record_errors(redis, "jobs", "a", "ghost-worker", [(ids[0], "RuntimeError: card declined", "")], ttl=600)
    # The worker was SIGKILLed: its liveness deadline lapsed a minute ago.
    redis.hset(keys.liveness_key("jobs"), "ghost-worker", int(redis.time()[0]) * 1000 - 60_000)

    user = User.objects.create_user("operator", password="correct horse battery", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=[
        "view_stream", "view_consumergroup", "view_deadletter", "retry_pending", "claim_pending"]))
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{live_server.url}/admin/login/?next=/admin/streams_app/consumergroup/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "correct horse battery")
    page.click("input[type=submit]")
    page.wait_for_selector("#result_list")
    page.locator("#result_list tbody tr", has_text="a").first.locator("a").first.click()
    page.wait_for_selector("table.shoal-consumers")
    assert "dead" in page.inner_text("table.shoal-consumers tr.shoal-dead")

    # The stuck entries of the dead consumer, why the first one is stuck, and when it would be retried.
    page.click("text=Pending entries")
    page.select_option("select[name=consumer]", "ghost-worker")
    page.click("text=Filter")
    page.wait_for_selector("table.shoal-pending")
    first = page.locator("table.shoal-pending tbody tr").first
    assert "ghost-worker (dead)" in first.inner_text() and "RuntimeError: card declined" in first.inner_text()
    assert page.locator("table.shoal-pending tbody tr").count() == 50  # one page of 60
    page.screenshot(path=shots / "admin-pending-stuck.png", full_page=True)

    # Retry it now: handled within a claim pass, not after its back-off.
    first.locator("input.action-select").check()
    page.select_option("select[name=action]", "retry")
    page.click("button:has-text('Go')")
    page.wait_for_selector("text=Are you sure?")
    page.click("input[value='Yes, I’m sure']")
    page.wait_for_selector("ul.messagelist li.success")
    run_until(loop, lambda: ids[0] in handled())

    # Then every other entry of the dead consumer, across both pages, in one action.
    page.select_option("select[name=action]", "retry")
    page.check("input[name=select_across]")
    page.click("button:has-text('Go')")
    page.wait_for_selector("text=Are you sure?")
    assert "59" in page.inner_text("#content")
    page.click("input[value='Yes, I’m sure']")
    page.wait_for_selector("ul.messagelist li.success")
    assert "Made due now 59 pending entries" in page.inner_text("ul.messagelist")
    run_until(loop, lambda: set(handled()) >= set(ids), timeout=60)

    # Where is the first order now? Handled in a, not yet delivered to b.
    page.goto(f"{live_server.url}/admin/streams_app/consumergroup/find/?stream=jobs&q={ids[0]}")
    page.wait_for_selector("table.shoal-find-result")
    rows = {r.locator("td").nth(0).inner_text(): r.locator("td").nth(1).inner_text()
            for r in page.locator("table.shoal-find-result tbody tr").all()}
    assert rows == {"a": "handled", "b": "not yet delivered"}
    page.screenshot(path=shots / "admin-find.png", full_page=True)

    if os.environ.get("SHOAL_DOCS_SCREENSHOTS"):
        for shot in shots.glob("admin-*.png"):
            shutil.copy(shot, DOCS / shot.name)
