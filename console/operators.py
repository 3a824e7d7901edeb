"""Who may act on jobs: the console's own login, its sessions, and their CSRF tokens.

Operators are configured as ``name:sha256:<hex>`` entries (the SHA-256 of the
password, as the servers' auth file stores tokens), comma-separated, from
``--operators`` / ``FENCING_CONSOLE_OPERATORS`` / the TOML key ``operators``. A login
starts a session: a random id in an HttpOnly, SameSite=Strict cookie, held in this
process's memory (a restart logs everyone out), at most :data:`MAX_SESSIONS` at once
and :data:`SESSION_TTL` long. Each session has its own random CSRF token; every form
that acts carries it and every action checks it (besides the cookie's SameSite).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from fencing.errors import InvalidArgumentError

COOKIE = "fencing_console_session"
#: How long a login lasts (seconds).
SESSION_TTL = 8 * 3600
#: Sessions kept at once; the oldest is logged out first beyond it.
MAX_SESSIONS = 1000


def parse_operators(text: str | None, field: str = "operators") -> dict[str, bytes]:
    """``name:sha256:<hex>[,...]`` -> {name: digest}; a clear error naming the entry."""
    found: dict[str, bytes] = {}
    for i, entry in enumerate(e.strip() for e in (text or "").split(",")):
        if not entry:
            continue
        name, _, secret = entry.partition(":")
        where = f"{field}[{i}]"
        if not name or not secret.startswith("sha256:"):
            raise InvalidArgumentError(
                f"{where} must be NAME:sha256:<64 hex digits of the password's SHA-256>",
                field=field,
            )
        try:
            digest = bytes.fromhex(secret.removeprefix("sha256:"))
        except ValueError:
            digest = b""
        if len(digest) != 32:
            raise InvalidArgumentError(f"{where}: 'sha256:' must be followed by 64 hex digits")
        found[name] = digest
    return found


def password_digest(password: str) -> bytes:
    return hashlib.sha256(password.encode()).digest()


@dataclass(frozen=True)
class Session:
    operator: str
    csrf: str
    expires: float


class Operators:
    """The configured operators and their live sessions."""

    def __init__(self, digests: dict[str, bytes], clock: Callable[[], float] = time.monotonic):
        self._digests = digests
        self._clock = clock
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    @property
    def configured(self) -> bool:
        return bool(self._digests)

    def login(self, name: str, password: str) -> str | None:
        """A new session id if ``name`` and ``password`` match, else None."""
        expected = self._digests.get(name)
        given = password_digest(password)
        # Compared even for an unknown name, so timing does not tell names apart.
        ok = hmac.compare_digest(expected or bytes(32), given) and expected is not None
        if not ok:
            return None
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.popitem(last=False)
        session_id = secrets.token_urlsafe(32)
        self._sessions[session_id] = Session(
            name, secrets.token_urlsafe(32), self._clock() + SESSION_TTL
        )
        return session_id

    def session(self, session_id: str | None) -> Session | None:
        """The live session of a cookie's id, or None."""
        if not session_id:
            return None
        found = self._sessions.get(session_id)
        if found is None:
            return None
        if found.expires <= self._clock():
            del self._sessions[session_id]
            return None
        return found

    def logout(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    @staticmethod
    def csrf_ok(session: Session, token: str) -> bool:
        return bool(token) and hmac.compare_digest(session.csrf, token)
