"""Retrying remote calls: a bounded number of attempts with exponential backoff.

Only transient failures are retried: connection resets and drops, time-outs, truncated bodies,
HTTP 408, 429 and 5xx. A missing object, a refused permission or any other 4xx fails at once.
Each retry is logged at WARNING on the ``shardfmt._storage`` logger, its text passed through the
store's `Redactor` first, so no credential reaches a log.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .urls import Redactor

__all__ = ["RetryPolicy", "ShortReadError", "call_with_retries", "is_transient"]

T = TypeVar("T")
logger = logging.getLogger("shardfmt._storage")

_PERMANENT_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
_RETRY_STATUSES = frozenset({408, 425, 429})
_UNANSWERED = frozenset({"ServiceRequestError", "ServiceResponseError", "TransportError"})
"""azure-core's and google-auth's errors for a request that failed before any answer came."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a remote call is tried.

    Attributes:
        attempts: tries in all, the first included (default 5).
        first_delay: seconds before the second try (default 0.25); each further wait is
            `multiplier` times longer, capped at `max_delay`, and jittered by up to +-25%.
            The defaults wait 0.25 + 0.5 + 1 + 2 = 3.75 s (4.7 s with jitter) at most before giving up.
    """

    attempts: int = 5
    first_delay: float = 0.25
    multiplier: float = 2.0
    max_delay: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if self.first_delay < 0 or self.max_delay < 0 or self.multiplier < 1:
            raise ValueError("delays must be >= 0 and the multiplier >= 1")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1 for the second try)."""
        base = min(self.max_delay, self.first_delay * self.multiplier ** (retry - 1))
        return base * random.uniform(0.75, 1.25)


class ShortReadError(OSError):
    """A response held fewer (or other) bytes than asked for: the connection dropped mid-body."""


def is_transient(err: BaseException) -> bool:
    """True if trying `err`'s call again may succeed."""
    if isinstance(err, _PERMANENT_OS_ERRORS):
        return False
    status = _http_status(err)
    if status is not None:
        return status >= 500 or status in _RETRY_STATUSES
    if isinstance(err, (OSError, TimeoutError, ConnectionError, EOFError)):
        return True
    module = type(err).__module__ or ""
    if module.startswith(("azure.core", "google.auth")):  # a request that never got an answer
        return type(err).__name__ in _UNANSWERED
    return module.startswith(("aiohttp", "botocore", "urllib3", "requests", "fsspec.exceptions"))


def _http_status(err: BaseException) -> int | None:
    """The HTTP status an error carries: ``status`` (aiohttp), ``status_code`` (azure-core) or
    ``code`` (gcsfs's HttpError); None when it holds none in the 400s or 500s."""
    for name in ("status", "status_code", "code"):
        value = getattr(err, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value < 600:
            return value
    return None


def call_with_retries(
    call: Callable[[], T], *, policy: RetryPolicy, what: str, redact: Redactor, sleep: Callable[[float], None] = time.sleep
) -> T:
    """Run `call`, retrying transient failures as `policy` says.

    Args:
        call: the remote operation.
        policy: attempts and backoff.
        what: the operation and object, for the log (already free of credentials).
        redact: scrubs credentials from the failure's text before it is logged.

    Raises:
        Whatever `call` raised last: at once if it is not transient, else after the last attempt.
    """
    for attempt in range(1, policy.attempts + 1):
        try:
            return call()
        except Exception as err:
            if attempt == policy.attempts or not is_transient(err):
                raise
            wait = policy.delay(attempt)
            logger.warning(
                "%s failed (attempt %d of %d: %s); retrying in %.2f s",
                what, attempt, policy.attempts, redact(f"{type(err).__name__}: {err}"), wait,
            )
            sleep(wait)
    raise AssertionError("unreachable")  # the loop returns or raises
