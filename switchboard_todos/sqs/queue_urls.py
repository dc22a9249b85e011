"""A queue's URL: the endpoint's URL as the client reached it, followed by the queue's name.

`<endpoint>/jobs`. JSON clients post every action to their endpoint with the queue URL in the
body, and read only the URL's last segment as the queue's name (kombu, dramatiq-sqs); the
endpoint reads a QueueUrl the same way. The endpoint is wherever the client posted: the path the
URLconf mounts it at, or any path behind `SQSAnywhere` (mount.py).
"""

from __future__ import annotations

from django.http import HttpRequest
from django.utils.encoding import escape_uri_path


def endpoint_url(request: HttpRequest) -> str:
    """The endpoint's URL as the client reached it, ending in a slash: the path it posted to,
    less the queue's name when that was a queue URL of the URLconf (`<endpoint><queue>`)."""
    path = request.path
    match = request.resolver_match
    queue = match.kwargs.get("queue") if match is not None else None
    if isinstance(queue, str):
        path = path.removesuffix(queue)
    return request.build_absolute_uri(escape_uri_path(path.rstrip("/") + "/"))


def queue_url(request: HttpRequest, queue: str) -> str:
    """The URL of `queue` for the client of `request`."""
    return f"{endpoint_url(request)}{queue}"


def name_in(url: str) -> str:
    """The queue's name a queue URL gives: its last segment."""
    return url.rstrip("/").rsplit("/", 1)[-1]
