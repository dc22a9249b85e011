"""Agent tokens: random, shown once, stored as a SHA-256 hash, recognisable by their prefix.

A token carries 32 random bytes (256 bits), so a fast hash is the right one: a slow password
hash (PBKDF2, Argon2) protects guessable secrets against brute force, and nobody can enumerate
2**256 candidates however fast each one is. A fast hash lets every request be checked with one
indexed lookup. The `sbt_` prefix lets secret scanners (and people) spot a leaked token.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import NamedTuple

PREFIX = "sbt_"
#: What a revoked token's stored hash is prefixed with: no token hashes to it any more, and the
#: holder of the revoked token can still be told that it was revoked (agents/accounts.py).
REVOKED = "revoked:"
#: Random bytes per token; token_urlsafe encodes 32 bytes in 43 characters.
RANDOM_BYTES = 32
_SHAPE = re.compile(r"sbt_[A-Za-z0-9_-]{43}")
#: How much of a token is kept in clear to tell tokens apart (prefix plus 6 random characters).
SHOWN_LENGTH = len(PREFIX) + 6


class IssuedToken(NamedTuple):
    """A new token: `token` is shown once; only `hash` and `prefix` are stored."""

    token: str
    hash: str
    prefix: str


def issue_token() -> IssuedToken:
    """Make a new random token."""
    token = PREFIX + secrets.token_urlsafe(RANDOM_BYTES)
    return IssuedToken(token=token, hash=token_hash(token), prefix=token[:SHOWN_LENGTH])


def token_hash(token: str) -> str:
    """The SHA-256 hex digest a token is stored and looked up as."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def well_formed(token: str) -> bool:
    """Whether `token` has the shape of one `issue_token` makes (no database needed to refuse)."""
    return _SHAPE.fullmatch(token) is not None
