"""A durable PostgreSQL work queue for Django with SQS-exact lease semantics."""

from __future__ import annotations

__version__ = "0.1.0"
