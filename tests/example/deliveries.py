"""Signed deliveries to the example's webhook, sent through Django's test client."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from django.test import Client

from example_project.webhooks import sign

if TYPE_CHECKING:
    from django.test.client import _MonkeyPatchedWSGIResponse as Response

SECRET = "github-test-secret"
PUSH = {
    "ref": "refs/heads/main",
    "repository": {"full_name": "octo/hello"},
    "pusher": {"name": "octocat"},
    "commits": [{"message": "Fix the thing\n\nLong story.", "author": {"name": "Octo Cat"}}],
}


def deliver(
    client: Client,
    body: bytes | None = None,
    *,
    source: str = "github",
    delivery: str | None = "d-1",
    event: str | None = "push",
    signature: str | None = None,
    secret: str = SECRET,
    content_type: str = "application/json",
    **headers: str,
) -> Response:
    """POST a delivery signed with `secret` unless `signature` is given ("" sends none)."""
    body = json.dumps(PUSH).encode() if body is None else body
    sent = dict(headers)
    signature = sign(secret, body) if signature is None else signature
    if signature:
        sent["X-Hub-Signature-256"] = signature
    if delivery is not None:
        sent["X-GitHub-Delivery"] = delivery
    if event is not None:
        sent["X-GitHub-Event"] = event
    response: Response = client.post(
        f"/hooks/{source}/", data=body, content_type=content_type, headers=sent
    )
    return response
