"""`regatta webhooks …`: a team's webhooks and their delivery log
(docs/notifications.md)."""

from __future__ import annotations

import click

from . import output
from .base import State, json_flag

EVENTS = ("job.succeeded", "job.failed", "job.preempted", "job.budget_spent", "node.replaced")


@click.group()
def webhooks():
    """A team's webhooks: what they are sent and how it went."""


@webhooks.command(name="list")
@click.option("--team", help="Only this team's webhooks.")
@json_flag
def list_webhooks(state: State, team: str | None):
    """The webhooks of your teams."""
    items = state.client.get_all("webhooks/", team=team)
    if state.as_json:
        output.emit_json(items)
        return
    rows = [[w["id"], w["team"], w["format"], "yes" if w["active"] else "no",
             ",".join(w["events"]), output.truncate(w["url"], 60)] for w in items]
    output.table(rows, ["ID", "TEAM", "FORMAT", "ACTIVE", "EVENTS", "URL"])


@webhooks.command(name="add")
@click.argument("team")
@click.argument("url")
@click.option("--event", "events", multiple=True, type=click.Choice(EVENTS),
              help="An event to send (repeat it); default: all of them.")
@click.option("--format", "fmt", type=click.Choice(["json", "slack"]), default="json",
              show_default=True)
@click.option("--description", default="")
@json_flag
def add(state: State, team: str, url: str, events: tuple[str, ...], fmt: str,
        description: str):
    """Add a webhook to TEAM that POSTs to URL; prints its secret once."""
    body = {"team": team, "url": url, "events": list(events or EVENTS), "format": fmt,
            "description": description}
    webhook = state.client.post("webhooks/", body)
    if state.as_json:
        output.emit_json(webhook)
        return
    output.echo(f"Webhook {webhook['id']} added for team {webhook['team']}: "
               f"{', '.join(webhook['events'])} → {webhook['url']}")
    output.echo(f"Signing secret (shown only now): {webhook['secret']}")


@webhooks.command()
@click.argument("webhook_id", type=int)
@json_flag
def ping(state: State, webhook_id: int):
    """Send a test delivery; see how it went with `deliveries`."""
    sent = state.client.post(f"webhooks/{webhook_id}/ping/")
    if state.as_json:
        output.emit_json(sent)
        return
    output.echo(f"Ping queued as delivery {sent['id']}: "
               f"`regatta webhooks deliveries {webhook_id}` shows how it went.")


@webhooks.command(name="rotate-secret")
@click.argument("webhook_id", type=int)
@json_flag
def rotate_secret(state: State, webhook_id: int):
    """A new signing secret, printed once; the old one signs beside it for 24 h."""
    webhook = state.client.post(f"webhooks/{webhook_id}/rotate-secret/")
    if state.as_json:
        output.emit_json(webhook)
        return
    output.echo(f"New signing secret (shown only now): {webhook['secret']}")
    output.echo("The old secret keeps signing beside it for 24 hours.")


@webhooks.command()
@click.argument("webhook_id", type=int)
@json_flag
def deliveries(state: State, webhook_id: int):
    """A webhook's delivery log, newest first."""
    items = state.client.get(f"webhooks/{webhook_id}/deliveries/")["results"]
    if state.as_json:
        output.emit_json(items)
        return
    rows = [[d["id"], d["event_type"], d["status"], d["attempts"], d["response_code"] or "",
             output.age(d["created_at"]), output.truncate(d["last_error"], 50)] for d in items]
    output.table(rows, ["ID", "EVENT", "STATUS", "TRIES", "CODE", "AGE", "LAST ERROR"])


@webhooks.command()
@click.argument("delivery_id", type=int)
@json_flag
def retry(state: State, delivery_id: int):
    """Try a delivery again now, even one given up on."""
    sent = state.client.post(f"deliveries/{delivery_id}/retry/")
    if state.as_json:
        output.emit_json(sent)
        return
    output.echo(f"Delivery {sent['id']} will be tried again now.")


@webhooks.command()
@click.argument("webhook_id", type=int)
@json_flag
def delete(state: State, webhook_id: int):
    """Delete a webhook and its delivery log."""
    state.client.request("DELETE", f"webhooks/{webhook_id}/")
    if state.as_json:
        output.emit_json({"deleted": webhook_id})
        return
    output.echo(f"Webhook {webhook_id} deleted.")
