"""The webhooks API: a team's members manage its webhooks, see the secret
once, read the delivery log; bad input is named and writes nothing."""

import pytest
from django.utils import timezone

from notifications import delivery
from notifications.models import Delivery, Webhook

pytestmark = pytest.mark.django_db

URL = "/api/v1/webhooks/"
GOOD = {"team": "vision", "url": "https://hooks.example.com/regatta",
        "events": ["job.failed", "job.succeeded", "job.failed"]}


def test_a_member_creates_a_webhook_and_sees_its_secret_once(api, owner, teammate):
    resp = api(owner).post(URL, GOOD, format="json")
    assert resp.status_code == 201, resp.data
    secret = resp.data["secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    webhook = Webhook.objects.get()
    assert webhook.secret == secret and webhook.created_by == owner
    assert webhook.events == ["job.failed", "job.succeeded"]  # each once
    assert webhook.format == "json" and webhook.active
    listed = api(teammate).get(URL).data["results"]
    assert [w["id"] for w in listed] == [webhook.pk]
    assert "secret" not in listed[0] and listed[0]["secret_hint"] == secret[:10] + "…"
    assert "secret" not in api(owner).get(f"{URL}{webhook.pk}/").data


def test_bad_input_is_named_field_by_field_and_writes_nothing(api, owner):
    resp = api(owner).post(URL, {"team": "speech", "url": "ftp://example.com/x",
                                 "events": ["job.exploded"], "format": "xml",
                                 "active": "yes", "colour": "red"}, format="json")
    assert resp.status_code == 400
    assert set(resp.data) == {"team", "url", "events", "format", "active", "colour"}
    assert "not a member" in str(resp.data["team"])
    assert "http://" in str(resp.data["url"])
    assert "job.exploded" in str(resp.data["events"])
    assert resp.data["colour"] == ["Unknown field."]
    assert not Webhook.objects.exists()


@pytest.mark.parametrize(("url", "says"), [
    ("http://127.0.0.1:8000/api/v1/", "127.0.0.1"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
    ("http://[::1]/", "::1"),
    ("http://10.0.0.7/", "10.0.0.7"),
    ("http://[64:ff9b::a9fe:a9fe]/", "64:ff9b::a9fe:a9fe"),
    ("http://127.0.0.1\\x.attacker.example/", "RFC 3986"),
    ("https://user:pw@hooks.example.com/", "credentials"),
    ("hooks.example.com/x", "http://"),
    ("", "blank"),
])
def test_it_refuses_urls_that_reach_private_networks_or_are_not_http(api, owner, url, says):
    resp = api(owner).post(URL, {**GOOD, "url": url}, format="json")
    assert resp.status_code == 400 and says in str(resp.data["url"]), resp.data
    assert not Webhook.objects.exists()


def test_an_allowed_network_lets_a_loopback_receiver_in(api, owner, loopback_allowed):
    resp = api(owner).post(URL, {**GOOD, "url": "http://127.0.0.1:9/hook"}, format="json")
    assert resp.status_code == 201, resp.data


def test_events_must_be_a_nonempty_list(api, owner):
    for events in ([], "job.failed", [1]):
        resp = api(owner).post(URL, {**GOOD, "events": events}, format="json")
        assert resp.status_code == 400 and "events" in resp.data, (events, resp.data)


def test_a_member_changes_and_deletes_a_webhook(api, owner, teammate):
    webhook = Webhook.objects.create(team=owner.teams.get(), url=GOOD["url"],
                                     events=["job.failed"])
    resp = api(teammate).patch(f"{URL}{webhook.pk}/", {"active": False, "format": "slack"},
                               format="json")
    assert resp.status_code == 200 and resp.data["active"] is False
    assert resp.data["format"] == "slack" and resp.data["events"] == ["job.failed"]
    resp = api(teammate).patch(f"{URL}{webhook.pk}/", {"team": "speech", "events": []},
                               format="json")
    assert resp.status_code == 400 and set(resp.data) == {"team", "events"}
    assert api(owner).delete(f"{URL}{webhook.pk}/").status_code == 204
    assert not Webhook.objects.exists()


def test_another_team_s_webhook_is_not_found(api, owner, outsider):
    webhook = Webhook.objects.create(team=owner.teams.get(), url=GOOD["url"])
    client = api(outsider)
    assert client.get(URL).data["results"] == []
    for method, path in [("get", ""), ("patch", ""), ("delete", ""), ("get", "deliveries/"),
                         ("post", "ping/"), ("post", "rotate-secret/")]:
        resp = getattr(client, method)(f"{URL}{webhook.pk}/{path}", {}, format="json")
        assert resp.status_code == 404, (method, path)
    assert Webhook.objects.get().active and not Delivery.objects.exists()
    assert Webhook.objects.get().secret == webhook.secret


def test_a_ping_is_queued_and_shows_in_the_delivery_log(api, owner):
    webhook = Webhook.objects.create(team=owner.teams.get(), url=GOOD["url"],
                                     events=["job.failed"])
    resp = api(owner).post(f"{URL}{webhook.pk}/ping/", format="json")
    assert resp.status_code == 202
    assert resp.data["event_type"] == "webhook.ping" and resp.data["status"] == "pending"
    log = api(owner).get(f"{URL}{webhook.pk}/deliveries/").data["results"]
    assert [d["id"] for d in log] == [resp.data["id"]]
    assert log[0]["payload"]["data"] == {"team": "vision", "webhook": webhook.pk}


def test_a_ping_to_an_inactive_webhook_is_a_conflict(api, owner):
    webhook = Webhook.objects.create(team=owner.teams.get(), url=GOOD["url"], active=False)
    assert api(owner).post(f"{URL}{webhook.pk}/ping/", format="json").status_code == 409
    assert not Delivery.objects.exists()


def test_a_member_retries_a_delivery_and_a_delivered_one_is_a_conflict(api, owner, outsider):
    webhook = Webhook.objects.create(team=owner.teams.get(), url=GOOD["url"])
    row = delivery.ping(webhook, timezone.now())
    Delivery.objects.filter(pk=row.pk).update(status="failed", next_attempt_at=None,
                                              attempts=8)
    assert api(outsider).post(f"/api/v1/deliveries/{row.pk}/retry/").status_code == 404
    resp = api(owner).post(f"/api/v1/deliveries/{row.pk}/retry/")
    assert resp.status_code == 202 and resp.data["status"] == "pending"
    assert resp.data["next_attempt_at"] is not None
    Delivery.objects.filter(pk=row.pk).update(status="succeeded")
    assert api(owner).post(f"/api/v1/deliveries/{row.pk}/retry/").status_code == 409


def sends_allowed() -> int:
    from django.conf import settings

    return int(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["webhook_send"].split("/")[0])


def test_pings_past_the_rate_are_a_429_and_send_nothing(api, owner, teammate):
    webhook = Webhook.objects.create(team=owner.teams.get(), url=GOOD["url"])
    client = api(owner)
    for _ in range(sends_allowed()):
        assert client.post(f"{URL}{webhook.pk}/ping/").status_code == 202
    resp = client.post(f"{URL}{webhook.pk}/ping/")
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0
    assert Delivery.objects.count() == sends_allowed()
    # Retries count with pings: each one sends a signed request too.
    row = Delivery.objects.first()
    assert client.post(f"/api/v1/deliveries/{row.pk}/retry/").status_code == 429
    # The count is one person's: a teammate still pings.
    assert api(teammate).post(f"{URL}{webhook.pk}/ping/").status_code == 202


def test_retries_past_the_rate_are_a_429_and_refusals_cost_nothing(api, owner):
    webhook = Webhook.objects.create(team=owner.teams.get(), url=GOOD["url"])
    row = delivery.ping(webhook, timezone.now())
    Delivery.objects.filter(pk=row.pk).update(status="succeeded")
    client = api(owner)
    for _ in range(sends_allowed() + 3):  # delivered already: 409, nothing sent
        assert client.post(f"/api/v1/deliveries/{row.pk}/retry/").status_code == 409
    Delivery.objects.filter(pk=row.pk).update(status="failed")
    for _ in range(sends_allowed()):
        assert client.post(f"/api/v1/deliveries/{row.pk}/retry/").status_code == 202
    resp = client.post(f"/api/v1/deliveries/{row.pk}/retry/")
    assert resp.status_code == 429 and int(resp["Retry-After"]) > 0


def test_a_member_rotates_the_secret_and_sees_the_new_one_once(api, owner, teammate):
    webhook = Webhook.objects.create(team=owner.teams.get(), url=GOOD["url"])
    old = webhook.secret
    resp = api(teammate).post(f"{URL}{webhook.pk}/rotate-secret/")
    assert resp.status_code == 200
    webhook.refresh_from_db()
    assert resp.data["secret"] == webhook.secret != old
    assert webhook.previous_secret == old and webhook.previous_secret_until > timezone.now()
    assert "secret" not in api(owner).get(f"{URL}{webhook.pk}/").data
