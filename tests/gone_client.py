"""A remote agent killed in the middle of a long poll (tests/test_gone_clients.py): it sends one
claim that waits up to 20 s, over SQS, HTTP or MCP, and waits for an answer that never comes,
as the test kills it first (SIGKILL, as a worker's restart may).

    python -m tests.gone_client sqs BASE QUEUE AGENT_NAME SECRET
    python -m tests.gone_client http BASE QUEUE TOKEN
    python -m tests.gone_client mcp BASE QUEUE TOKEN

BASE is the server's root URL. No Django here: only the clients an agent uses.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

#: The long poll's wait, in seconds: far longer than the test takes to kill the client.
WAIT = 20


def sqs(base: str, queue: str, name: str, secret: str) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "sqs",
        endpoint_url=f"{base}/sqs/",
        region_name="us-east-1",
        aws_access_key_id=name,
        aws_secret_access_key=secret,
        config=Config(retries={"total_max_attempts": 1}, read_timeout=60),
    )
    client.receive_message(QueueUrl=f"{base}/sqs/{queue}", WaitTimeSeconds=WAIT)


def http(base: str, queue: str, token: str) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        client.post("/api/claim/", json={"queues": [queue], "ttl": 30, "wait": WAIT})


def mcp(base: str, queue: str, token: str) -> None:
    from example_project.mcp_agent import connect

    async def main() -> None:
        async with connect(f"{base}/mcp", token) as session:
            await session.call_tool("claim", {"queues": [queue], "ttl": 30, "wait": WAIT})

    asyncio.run(main())


SURFACES: dict[str, Callable[..., None]] = {"sqs": sqs, "http": http, "mcp": mcp}

if __name__ == "__main__":
    surface, *arguments = sys.argv[1:]
    SURFACES[surface](*arguments)
