"""URL syntax: telling a URL from a local path, joining keys, and keeping secrets out of every
message. What a location names (a dataset, its manifest, tars) is decided above the storage
layer, by `dataset.locate.classify_location`.

A location is a URL when it starts with a scheme of two or more letters and ``://`` (``s3://``,
``gs://``, ``https://``, ``memory://``); ``file://`` URLs are local paths. Credentials may sit in a
URL (``https://user:password@host/``, a presigned query string) or in fsspec storage options; a
`Redactor` built from both replaces them with ``***`` in any text before it reaches an error
message or a log line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["Redactor", "expand_user", "is_url", "join_url", "local_path", "url_scheme"]

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+://)(?P<userinfo>[^/@\s]*@)")
_QUERY = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+://[^\s?#'\"]*)\?[^\s#'\"]*")
_SECRET_KEY = re.compile(r"key|secret|token|password|passwd|credential|auth|signature|sas", re.IGNORECASE)
_MIN_SECRET = 4


def is_url(location: object) -> bool:
    """True for a remote URL (``scheme://...`` other than ``file://``); False for local paths."""
    if not isinstance(location, str):
        return False
    match = _SCHEME.match(location)
    return match is not None and match.group(1).lower() != "file"


def url_scheme(location: str) -> str:
    """The scheme of a URL in lower case (``"gs"`` for ``gs://b/k``); "" for anything else."""
    match = _SCHEME.match(location)
    return "" if match is None else match.group(1).lower()


def local_path(location: str) -> str:
    """Return `location` without a ``file://`` prefix."""
    return location[len("file://") :] if location.lower().startswith("file://") else location


def expand_user(location: Any) -> Any:
    """`location` with a leading ``~`` (or ``~user``) of a local path expanded to the home
    folder, as a shell does: each item of a list or tuple alike. URLs, ``pipe:`` commands and
    anything that is not a path are returned as they are."""
    if isinstance(location, (list, tuple)):
        return type(location)(expand_user(item) for item in location)
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if isinstance(location, str) and location.startswith("~"):
        return os.path.expanduser(location)
    return location


def join_url(root: str, key: str) -> str:
    """Join a '/'-separated key onto a URL, keeping any query string at the end."""
    base, question, query = root.partition("?")
    return f"{base.rstrip('/')}/{key}" + (question + query if question else "")


class Redactor:
    """Replaces credentials with ``***`` in text.

    Args:
        secrets: literal strings to hide wherever they appear (shorter than 4 characters are
            ignored, since hiding them would mangle ordinary words).

    Always hidden, with or without secrets: the user-info part of URLs (``scheme://user:pw@``)
    and URL query strings (presigned URLs carry their signature there).
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if len(s) >= _MIN_SECRET}, key=len, reverse=True)

    @classmethod
    def for_location(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> Redactor:
        """A redactor for `url`'s credentials and the secret-looking values of `storage_options`."""
        secrets = list(_secret_values(storage_options or {}))
        match = _USERINFO.match(url)
        if match:
            userinfo = match.group("userinfo")[:-1]
            secrets.extend(part for part in userinfo.split(":") if part)
        _, _, query = url.partition("?")
        secrets.extend(value for pair in query.split("&") for value in pair.partition("=")[2:] if value)
        return cls(secrets)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        text = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)
        return _QUERY.sub(lambda m: f"{m.group('scheme')}?***", text)


def _secret_values(options: Mapping[str, Any], *, inherited: bool = False) -> Iterable[str]:
    """Yield the string values stored under secret-looking keys, at any depth."""
    for name, value in options.items():
        secret = inherited or bool(_SECRET_KEY.search(str(name)))
        if isinstance(value, Mapping):
            yield from _secret_values(value, inherited=secret)
        elif isinstance(value, (list, tuple)):
            yield from (str(v) for v in value if secret and isinstance(v, (str, bytes)))
        elif secret and isinstance(value, (str, bytes)):
            yield value.decode("utf-8", "replace") if isinstance(value, bytes) else value
