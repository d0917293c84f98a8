"""`regatta webhooks …` against a live server."""

import json

from notifications.models import Delivery, Webhook


def test_a_member_adds_lists_pings_and_deletes_a_webhook(logged_in, owner, team):
    regatta = logged_in(owner)
    added = regatta("webhooks", "add", "vision", "https://hooks.example.com/r",
                    "--event", "job.failed", "--event", "job.succeeded", "--format", "slack")
    assert added.exit_code == 0, added.output
    webhook = Webhook.objects.get()
    assert f"Signing secret (shown only now): {webhook.secret}" in added.output
    assert webhook.events == ["job.failed", "job.succeeded"] and webhook.format == "slack"

    listed = regatta("webhooks", "list", "--json")
    assert [w["id"] for w in json.loads(listed.output)] == [webhook.pk]
    assert webhook.secret not in listed.output

    rotated = regatta("webhooks", "rotate-secret", webhook.pk)
    webhook.refresh_from_db()
    assert f"New signing secret (shown only now): {webhook.secret}" in rotated.output

    pinged = regatta("webhooks", "ping", webhook.pk)
    assert pinged.exit_code == 0 and "Ping queued" in pinged.output
    log = regatta("webhooks", "deliveries", webhook.pk)
    assert "webhook.ping" in log.output and "pending" in log.output
    retried = regatta("webhooks", "retry", Delivery.objects.get().pk)
    assert retried.exit_code == 0, retried.output

    assert regatta("webhooks", "delete", webhook.pk).exit_code == 0
    assert not Webhook.objects.exists()


def test_a_refused_url_is_explained_and_exits_1(logged_in, owner, team):
    result = logged_in(owner)("webhooks", "add", "vision", "http://169.254.169.254/")
    assert result.exit_code == 1
    assert "url" in result.output and "not a public address" in result.output
    assert not Webhook.objects.exists()


def test_another_team_s_webhook_is_not_found(logged_in, outsider, team):
    webhook = Webhook.objects.create(team=team, url="https://hooks.example.com/r")
    result = logged_in(outsider)("webhooks", "ping", webhook.pk)
    assert result.exit_code == 1 and "404" in result.output
    assert not Delivery.objects.exists()
