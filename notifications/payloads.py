"""What a delivery says: the JSON document, or one line of text for Slack.

The JSON follows the Standard Webhooks shape, {type, timestamp, data}; the
Slack form is {"text": …}, which Slack's incoming webhooks (and Mattermost,
Rocket.Chat, Discord's /slack endpoint) post as a message. A delivery keeps
the exact document it sends, so the log shows what the receiver got.
"""

import json
from datetime import datetime

from django.conf import settings

from jobs.models import JobEvent, TrainingJob

from .events import EventType
from .models import Webhook

HEADLINES = {
    EventType.JOB_SUCCEEDED: "succeeded",
    EventType.JOB_FAILED: "failed",
    EventType.JOB_PREEMPTED: "was preempted",
    EventType.JOB_BUDGET_SPENT: "spent its restart budget",
    EventType.NODE_REPLACED: "lost a node, replaced",
}


def job_url(job: TrainingJob) -> str:
    # The job's page in the operator UI (frontend/urls.py, "jobs/<id>/").
    return f"{settings.PUBLIC_URL.rstrip('/')}/jobs/{job.pk}/"


def event_document(event_type: str, event: JobEvent) -> dict:
    job = event.job
    return {
        "type": event_type,
        "timestamp": event.created_at.isoformat(),
        "data": {
            "team": job.team.name,
            "job": {"id": job.pk, "name": job.name, "phase": event.to_phase,
                    "cluster": job.cluster.name, "url": job_url(job)},
            "event": {"id": event.pk, "kind": event.kind, "message": event.message,
                      "from_phase": event.from_phase, "to_phase": event.to_phase,
                      "attempt": event.attempt.number if event.attempt_id else None,
                      "actor": event.actor, "evidence": event.evidence},
        },
    }


def ping_document(webhook: Webhook, now: datetime) -> dict:
    return {"type": EventType.PING.value, "timestamp": now.isoformat(),
            "data": {"team": webhook.team.name, "webhook": webhook.pk}}


def _escape(text: str) -> str:
    # Slack reads <…> as links and mentions: a job's own words must not.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(document: dict) -> str:
    data = document["data"]
    team = _escape(data["team"])
    if document["type"] == EventType.PING:
        return f"[{team}] Regatta test ping: this webhook works."
    job, event = data["job"], data["event"]
    headline = HEADLINES.get(document["type"], document["type"])
    text = f"[{team}] Job <{job['url']}|{_escape(job['name'])} #{job['id']}> {headline}"
    return f"{text}: {_escape(event['message'])}" if event["message"] else text


def render(webhook: Webhook, document: dict) -> dict:
    """The document in the webhook's format."""
    if webhook.format == Webhook.Format.SLACK:
        return {"text": slack_text(document)}
    return document


def body(payload: dict) -> bytes:
    """The bytes sent and signed: the same for every try of a delivery."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
