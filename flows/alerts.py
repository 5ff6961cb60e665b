"""Alerts that reach someone: the events specgauge emits when a campaign's result needs a person (a nightly
regression, a regression run that failed, a campaign whose validity checks failed), and the Prefect
automation that turns each into a message through a notification block the user configures (a webhook by
default; a Slack or e-mail block works the same way: it is any Prefect notification block).

`specgauge prefect alerts --webhook URL` (or `--block TYPE/NAME`, or the URL in SPECGAUGE_ALERT_WEBHOOK)
creates the automation on the server; `specgauge prefect deploy` does it with the deployments when given
the URL (it hands it on in the environment, never on a command line). The URL is shown as its host only
(specgauge.redact.redact_webhook): the rest of it is the secret."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from prefect.events import emit_event

ALERT_WEBHOOK_ENV = "SPECGAUGE_ALERT_WEBHOOK"
REGRESSION_DETECTED = "specgauge.regression.detected"
REGRESSION_FAILED = "specgauge.regression.failed"
CAMPAIGN_INVALID = "specgauge.campaign.invalid"
PROMOTED_REGRESSED = "specgauge.promoted.regressed"  # the promoted config stopped beating plain
ALERT_EVENTS = (REGRESSION_DETECTED, REGRESSION_FAILED, CAMPAIGN_INVALID, PROMOTED_REGRESSED)

AUTOMATION_NAME = "specgauge-alerts"
WEBHOOK_BLOCK_NAME = "specgauge-alerts"

# Each event's payload carries `title` (one line: what happened), `summary` (what moved and by how much, or
# why) and `report` (a link to the report); the message is made of them.
SUBJECT = "specgauge: {{ event.payload.title }}"
BODY = (
    "{{ event.payload.title }}\n"
    "{{ event.payload.summary }}\n"
    "Campaign: {{ event.payload.campaign_id }}\n"
    "Report: {{ event.payload.report }}"
)


def alert(event: str, campaign_id: str, title: str, summary: str, report: str | None, **extra: Any) -> None:
    """Emit one of ALERT_EVENTS for `campaign_id`; the automation (if created) sends it to a person."""
    emit_event(
        event=event,
        resource={
            "prefect.resource.id": f"specgauge.campaign.{campaign_id}",
            "prefect.resource.name": campaign_id,
        },
        payload={
            "campaign_id": campaign_id,
            "title": title,
            "summary": summary,
            "report": report or "(no report was written)",
            **extra,
        },
    )


def save_webhook_block(url: str) -> Any:
    """The default notification block: a JSON POST of {"subject", "text"} to `url` (Slack-compatible
    `text`). Private addresses are allowed: a team's receiver is often on its own network."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    # The URL is the secret (Slack's and Teams' hooks carry their key in it): a masked secret of the block,
    # put into the request by the block's template, so that the UI and the API show it masked.
    block = CustomWebhookNotificationBlock(
        name="specgauge",
        url="{{webhook_url}}",
        method="POST",
        json_data={"subject": "{{subject}}", "text": "{{body}}"},
        allow_private_urls=True,
        secrets={"webhook_url": url},
    )
    block.save(WEBHOOK_BLOCK_NAME, overwrite=True)
    return block


def notification_block_id(block: str) -> Any:
    """The id of a saved notification block named as `TYPE/NAME` (e.g. slack-webhook/team-alerts)."""
    from prefect.blocks.core import Block

    from specgauge.errors import InputError

    try:
        return Block.load(block)._block_document_id
    except (ValueError, RuntimeError) as exc:
        raise InputError(f"no notification block {block!r} could be loaded ({exc})") from None


def ensure_automation(block_document_id: Any) -> Any:
    """Create (or replace) the automation: any of ALERT_EVENTS sends a notification through the block."""
    from prefect.automations import Automation, EventTrigger, Posture, SendNotification

    try:
        Automation.read(name=AUTOMATION_NAME).delete()
    except ValueError:  # none yet
        pass
    return Automation(
        name=AUTOMATION_NAME,
        description="Tells someone when a nightly regression regressed or failed, or a campaign is invalid.",
        trigger=EventTrigger(
            expect=set(ALERT_EVENTS),
            match={"prefect.resource.id": "specgauge.campaign.*"},
            posture=Posture.Reactive,
            threshold=1,
            within=0,
        ),
        actions=[SendNotification(block_document_id=block_document_id, subject=SUBJECT, body=BODY)],
    ).create()


def alerts_command(webhook: str, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of `specgauge prefect alerts` for `webhook`: the URL travels in the
    environment (ALERT_WEBHOOK_ENV), since a command line is readable by every user of the machine (ps)."""
    return [sys.executable, "-m", "cli", "prefect", "alerts"], {**env, ALERT_WEBHOOK_ENV: webhook}


def webhook_from_environment() -> str | None:
    return os.environ.get(ALERT_WEBHOOK_ENV) or None
