"""Least privilege on the broker: a publisher that can only write trade data, and the workers' user.

A publisher with RabbitMQ's usual `.*` permissions could write `Aldebaran.Alert` and
forge alerts that reach every channel. The publisher user made here may only write the
`Aldebaran.Trade_Data` exchange (no configure, no read), so anything else is refused with
ACCESS_REFUSED (403). The workers' user has full rights in the deployment's vhost only,
and no management tag. Both are created (or updated) through the management API.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from aldebaran.errors import ConfigError
from aldebaran.ops.management import Management
from aldebaran.settings import Settings
from declare.topology import TRADE_DATA

# RabbitMQ permission regexes: configure, write, read.
PERMISSIONS = {
    "publisher": {"configure": "^$", "write": f"^{re.escape(TRADE_DATA)}$", "read": "^$"},
    "workers": {"configure": ".*", "write": ".*", "read": ".*"},
}


@dataclass(frozen=True, slots=True)
class User:
    role: str  # a key of PERMISSIONS
    name: str
    password: str = ""


def parse_user(role: str, spec: str) -> User:
    """`NAME=PASSWORD_FILE` from the command line: the password never appears in argv."""
    name, sep, path = spec.partition("=")
    if not name or not sep or not path:
        raise ConfigError(f"--{role}-user: expected NAME=PASSWORD_FILE, got {name or '(empty)'}=...")
    try:
        password = Path(path).read_text(encoding="utf-8").splitlines()[0].strip()
    except (OSError, IndexError) as exc:
        raise ConfigError(f"--{role}-user: cannot read a password from {path}: {type(exc).__name__}") from None
    if not password:
        raise ConfigError(f"--{role}-user: the password file {path} is empty")
    return User(role, name, password)


def apply_users(settings: Settings, users: list[User]) -> list[str]:
    """Create or update each user and set its permissions on the settings' vhost; lines to print."""
    lines = []
    with Management(settings) as mgmt:
        vhost = quote(mgmt.vhost, safe="")
        for user in users:
            name = quote(user.name, safe="")
            mgmt.put(f"/api/users/{name}", {"password": user.password, "tags": ""})
            mgmt.put(f"/api/permissions/{vhost}/{name}", PERMISSIONS[user.role])
            perms = PERMISSIONS[user.role]
            lines.append(f"user {user.name} ({user.role}) on vhost {mgmt.vhost}: configure {perms['configure']}, "
                         f"write {perms['write']}, read {perms['read']}")
    return lines
