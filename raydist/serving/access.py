"""Who may call ``raydist serve``: a bearer key (``--api-key-env VAR``; compared in constant time, and only its
SHA-256 travels to the replicas) and a per-client request rate (``--max-requests-per-s``); ``/health`` is open."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

OPEN_PATHS = frozenset({"/health"})  # answered without a key and never rate-limited
PRUNE_CLIENTS = 10_000  # clients remembered before the idle ones are forgotten


def key_digest(key: str) -> str:
    """The SHA-256 of a key (hex): what the replicas keep and compare."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class AccessRules:
    """``key_digest``: the SHA-256 of the key every request except ``/health`` must bear (None: no key);
    ``max_requests_per_s``: each client's (by address) most requests in any second, per replica (None: no limit)."""

    key_digest: str | None = None
    max_requests_per_s: int | None = None

    @classmethod
    def from_env(cls, api_key_env: str | None, max_requests_per_s: int | None = None) -> AccessRules:
        """The rules of ``--api-key-env VAR`` (the key is the variable's value, so it never shows in a command
        line) and ``--max-requests-per-s``; an unset or empty variable is a ValueError naming it."""
        if max_requests_per_s is not None and max_requests_per_s < 1:
            raise ValueError(f"--max-requests-per-s {max_requests_per_s}: expected at least 1")
        if api_key_env is None:
            return cls(None, max_requests_per_s)
        key = os.environ.get(api_key_env, "")
        if not key:
            raise ValueError(
                f"--api-key-env {api_key_env}: the environment variable {api_key_env} is unset or empty"
            )
        return cls(key_digest(key), max_requests_per_s)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, rules: AccessRules) -> str | None:
    """The warning for a server every machine that reaches ``host`` may query without a key; None otherwise."""
    if rules.key_digest is not None or is_loopback(host):
        return None
    return (
        f"serving on {host} without --api-key-env: anyone who can reach this port can use the model; "
        "give --api-key-env VAR (the key in that environment variable) or --host 127.0.0.1"
    )


class Gate:
    """The check every request passes first in a replica: :meth:`refusal` is None, or the (status, field,
    message) to answer with (429 beyond the rate, then 401 without the key)."""

    def __init__(self, rules: AccessRules, clock: Callable[[], float] = time.monotonic) -> None:
        self.rules = rules
        self.clock = clock
        self._recent: dict[str, deque[float]] = {}

    def refusal(self, path: str, authorization: str | None, client: str) -> tuple[int, str, str] | None:
        """Why the request to ``path`` with this ``Authorization`` header from ``client`` is refused, if it is."""
        if path in OPEN_PATHS:
            return None
        limit = self.rules.max_requests_per_s
        if limit is not None and not self._admit(client, limit):
            return 429, "rate", f"more than {limit} requests in one second from {client}; retry in a second"
        if self.rules.key_digest is None:
            return None
        scheme, _, key = (authorization or "").partition(" ")
        presented = key_digest(key.strip()) if scheme.lower() == "bearer" else ""
        if not hmac.compare_digest(presented.encode(), self.rules.key_digest.encode()):
            return (
                401,
                "Authorization",
                "expected the header 'Authorization: Bearer <key>' with this server's key",
            )
        return None

    def _admit(self, client: str, limit: int) -> bool:
        now = self.clock()
        if len(self._recent) > PRUNE_CLIENTS:
            self._recent = {c: q for c, q in self._recent.items() if q and now - q[-1] < 1.0}
        times = self._recent.setdefault(client, deque())
        while times and now - times[0] >= 1.0:
            times.popleft()
        if len(times) >= limit:
            return False
        times.append(now)
        return True
