"""The admin shows webhooks and their delivery log; the log is read-only
and "retry now" asks for one more try."""

import pytest
from django.urls import reverse
from django.utils import timezone

from notifications import delivery
from notifications.models import Delivery, Webhook

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client_(client, admin_user_):
    client.force_login(admin_user_)
    return client


@pytest.fixture
def given_up(team):
    webhook = Webhook.objects.create(team=team, url="https://hooks.example.com/x",
                                     events=["job.failed"])
    row = delivery.ping(webhook, timezone.now())
    Delivery.objects.filter(pk=row.pk).update(status="failed", attempts=8, next_attempt_at=None,
                                              last_error="HTTP 500: down")
    return row


def test_the_webhooks_and_the_delivery_log_render(admin_client_, given_up):
    for url in ("/admin/notifications/webhook/", "/admin/notifications/delivery/",
                reverse("admin:notifications_webhook_change", args=[given_up.webhook_id]),
                reverse("admin:notifications_delivery_change", args=[given_up.pk])):
        resp = admin_client_.get(url)
        assert resp.status_code == 200, url
    body = admin_client_.get("/admin/notifications/delivery/").content.decode()
    assert "webhook.ping" in body and "failed" in body


def test_the_delivery_log_is_read_only(admin_client_, given_up):
    assert admin_client_.get("/admin/notifications/delivery/add/").status_code == 403
    page = admin_client_.get(
        reverse("admin:notifications_delivery_change", args=[given_up.pk])).content.decode()
    assert 'name="payload"' not in page and 'name="status"' not in page
    # The webhook's page never shows its secret, only the hint.
    hook = admin_client_.get(
        reverse("admin:notifications_webhook_change", args=[given_up.webhook_id]))
    assert given_up.webhook.secret not in hook.content.decode()


def test_retry_now_puts_a_given_up_delivery_back_in_line(admin_client_, given_up):
    resp = admin_client_.post("/admin/notifications/delivery/", {
        "action": "retry_now", "_selected_action": [given_up.pk]}, follow=True)
    assert resp.status_code == 200 and "Retrying 1 delivery" in resp.content.decode()
    given_up.refresh_from_db()
    assert given_up.status == Delivery.Status.PENDING and given_up.next_attempt_at is not None
    assert delivery.due_ids(timezone.now()) == [given_up.pk]


def test_the_admin_refuses_a_webhook_that_is_not_http_or_has_unknown_events(admin_client_,
                                                                            team):
    resp = admin_client_.post("/admin/notifications/webhook/add/", {
        "team": team.pk, "url": "file:///etc/passwd", "events": '["job.exploded"]',
        "format": "json", "active": "on"})
    assert resp.status_code == 200  # the form again, with its errors
    body = resp.content.decode()
    assert "Only http:// and https:// URLs" in body and "A list of: job.succeeded" in body
    assert not Webhook.objects.exists()
