"""SQS credentials and the SigV4 check of every request.

The access key id is the agent's name. SigV4 is an HMAC over the request keyed by the secret,
so the server must be able to compute the secret, not only recognise it: it is derived,
HMAC-SHA256 of the agent's name, token generation and credential salt under a server key
(SWITCHBOARD_TODOS_SQS_KEY, or one derived from SECRET_KEY). The salt is random per agent and
new at every rotation and revocation (agents/accounts.py), so an agent deleted and created
again under the same name, or revoked and made active again, never gets an old secret back.
Derivation rather than a stored, encrypted secret: there is no second secret store to keep,
back up or rotate, and the token stays the one credential an operator manages.

The signature is recomputed with botocore's own SigV4 signer over the headers the client says
it signed, and compared in constant time; the request time must be within MAX_SKEW of ours.
The signed headers must include `host`, `x-amz-date` and `x-amz-target` (the action): a
request signed without the action could be replayed, within MAX_SKEW, as another action.
"""

from __future__ import annotations

import hmac
import re
from datetime import UTC, datetime, timedelta
from hashlib import sha256
from typing import Any

from django.conf import settings
from django.utils.crypto import salted_hmac

from switchboard_todos.agents.service import identity
from switchboard_todos.models import Agent

#: As AWS: a request signed further from the server's time is refused.
MAX_SKEW = timedelta(minutes=5)
SERVICE = "sqs"
#: The headers every request must have signed: where it goes, when, and which action it is.
REQUIRED_SIGNED = frozenset({"host", "x-amz-date", "x-amz-target"})
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=(?P<key>[^/,\s]+)/(?P<date>\d{8})/(?P<region>[^/,\s]+)/"
    r"(?P<service>[^/,\s]+)/aws4_request,\s*SignedHeaders=(?P<headers>[a-z0-9;\-]+),\s*"
    r"Signature=(?P<signature>[0-9a-f]{64})\s*$"
)
_TIMESTAMP = "%Y%m%dT%H%M%SZ"


class SigningError(Exception):
    """A request whose credentials or signature do not hold; `code` is SQS's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def server_key() -> str:
    """The key every agent's secret is derived from: SWITCHBOARD_TODOS_SQS_KEY, else SECRET_KEY.

    Only this key is tried, never SECRET_KEY_FALLBACKS: a server whose key changed refuses
    every secret derived from the old one."""
    return getattr(settings, "SWITCHBOARD_TODOS_SQS_KEY", None) or settings.SECRET_KEY


def secret_for(agent: Agent) -> str:
    """The agent's SQS secret access key (40 characters, as AWS's)."""
    digest = salted_hmac(
        "switchboard_todos.sqs",
        f"{agent.name}:{agent.token_generation}:{agent.credential_salt}",
        secret=server_key(),
        algorithm="sha256",
    ).hexdigest()
    return digest[:40]


def verify(
    *,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    now: datetime | None = None,
    recognised: bool = False,
) -> Agent:
    """The agent that signed this request; SigningError when the signature does not hold.

    `recognised`: the agent as this process read it lately (identity.recognise_named), for
    an action whose statement checks its credential itself; a signature that does not hold
    against it is checked again against the agent as it is now (its key may have been
    rotated since).
    """
    from botocore.awsrequest import AWSRequest

    lowered = {name.lower(): value for name, value in headers.items()}
    match = _AUTHORIZATION.match(lowered.get("authorization", ""))
    if match is None:
        raise SigningError(
            "MissingAuthenticationToken"
            if "authorization" not in lowered
            else "IncompleteSignature",
            "The request must be signed with AWS Signature Version 4 (AWS4-HMAC-SHA256).",
        )
    stamp = lowered.get("x-amz-date", "")
    try:
        signed_at = datetime.strptime(stamp, _TIMESTAMP).replace(tzinfo=UTC)
    except ValueError:
        raise SigningError("IncompleteSignature", "X-Amz-Date is missing or malformed.") from None
    if abs((now or datetime.now(UTC)) - signed_at) > MAX_SKEW:
        raise SigningError(
            "SignatureDoesNotMatch",
            f"Signature expired: {stamp} is more than 5 minutes from the server's time.",
        )
    if match["service"] != SERVICE or match["date"] != stamp[:8]:
        raise SigningError("SignatureDoesNotMatch", "The credential scope does not match.")
    content_hash = lowered.get("x-amz-content-sha256")
    if content_hash is not None and content_hash != sha256(body).hexdigest():
        raise SigningError("SignatureDoesNotMatch", "The body does not match its signed hash.")
    if recognised:
        agent = identity.recognise_named(match["key"])
    else:
        agent = Agent.objects.filter(name=match["key"], is_active=True).first()
    if agent is None:
        raise SigningError(
            "InvalidClientTokenId", "The security token included in the request is invalid."
        )
    signed = match["headers"].split(";")
    if not REQUIRED_SIGNED.issubset(signed):
        raise SigningError(
            "SignatureDoesNotMatch", "Host, X-Amz-Date and X-Amz-Target must be signed."
        )
    missing = [name for name in signed if name not in lowered]
    if missing:
        raise SigningError("SignatureDoesNotMatch", f"Signed headers missing: {missing}.")
    request = AWSRequest(
        method=method, url=url, headers={name: lowered[name] for name in signed}, data=body
    )
    request.context["timestamp"] = stamp
    holds = _signed_by(agent, request, match)
    if not holds and recognised:
        identity.forget_named(agent.name)
        agent = identity.recognise_named(agent.name)
        if agent is None:
            raise SigningError(
                "InvalidClientTokenId", "The security token included in the request is invalid."
            )
        holds = _signed_by(agent, request, match)
    if not holds:
        raise SigningError(
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method.",
        )
    return agent


def _signed_by(agent: Agent, request: Any, match: re.Match[str]) -> bool:
    """Whether the request's signature is the one `agent`'s secret makes."""
    from botocore.auth import SigV4Auth
    from botocore.credentials import Credentials

    signer: Any = SigV4Auth(Credentials(agent.name, secret_for(agent)), SERVICE, match["region"])
    expected = signer.signature(
        signer.string_to_sign(request, signer.canonical_request(request)), request
    )
    return hmac.compare_digest(expected, match["signature"])
