"""Checks and redaction the settings apply, kept apart so the settings module stays a list of keys.

Nothing here reads configuration: `aldebaran.settings` is still the one place that does,
and re-exports `mask_url` for everyone else.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from urllib.parse import unquote, urlsplit

from pydantic import ValidationError

_PASSWORD_IN_URL = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<pw>[^@/\s]+)@")
# A query parameter whose name says secret (`?password=`, `&token=`, `api_key=`, `sig=`).
_SECRET_IN_QUERY = re.compile(
    r"(?P<name>[?&;][^=&#\s]*(?:pass|pwd|token|secret|key|auth|sig|credential)[^=&#\s]*=)[^&#\s'\"]*",
    re.IGNORECASE)
# Settings whose values are never echoed in an error: the key is named, the value not.
SECRET_SETTING = re.compile(r"token|pass|secret|auth|credential|headers|sid", re.IGNORECASE)


def mask_url(text: str) -> str:
    """Replace the password and secret query values of every URL in `text` with `***`."""
    text = _PASSWORD_IN_URL.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _SECRET_IN_QUERY.sub(lambda m: f"{m['name']}***", text)


def http_url(value: str) -> str:
    """An http(s) URL with a host: never file://, gopher:// or a bare path."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value


def is_link_local(host: str) -> bool:
    """169.254.0.0/16 and fe80::/10, where cloud metadata services answer."""
    try:
        return ipaddress.ip_address(host).is_link_local
    except ValueError:
        return False


_PLAIN_VHOST = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


def default_key_prefix(amqp_url: str) -> str:
    """The Redis key prefix of a deployment that sets none: unique per AMQP vhost.

    Two deployments sharing one Redis must never read each other's books and alerts.
    The default vhost `/` keeps the historical `aldebaran`; a plain vhost name gives
    `aldebaran.<vhost>`; any other gives `aldebaran:<hash>` (`:` never appears in the
    plain form, so the two cannot meet).
    """
    path = urlsplit(amqp_url).path
    vhost = unquote(path[1:]) if len(path) > 1 else "/"
    if vhost == "/":
        return "aldebaran"
    if _PLAIN_VHOST.match(vhost):
        return f"aldebaran.{vhost}"
    return "aldebaran:" + hashlib.sha256(vhost.encode()).hexdigest()[:24]


def describe_errors(error: ValidationError) -> str:
    """Every problem of a settings validation on one line: unknown keys named, secrets never echoed."""
    lines = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "settings"
        if item["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown setting")
        elif item["loc"][:1] in (("channels",), ("redis_url",)) or SECRET_SETTING.search(key):
            # A malformed URL can defeat masking (an unencoded `/` in its password): not echoed.
            # A channel table holds tokens and auth headers: name the key, never the value.
            lines.append(f"{key}: {mask_url(item['msg'])}")
        else:
            lines.append(f"{key}: {item['msg']} (got {mask_url(repr(item.get('input')))})")
    return "; ".join(lines)
