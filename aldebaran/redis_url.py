"""`ALDEBARAN_REDIS_URL` read in one place: a plain Redis URL, or a Redis Sentinel one.

A Sentinel URL names the sentinels, not the master, so that every client finds the
current master through them and follows a failover:

    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db]
        [?sentinel_username=...&sentinel_password=...]

- `host:port` pairs are sentinels (port 26379 when left out; IPv6 as `[::1]:26379`);
- `service_name` is the name the sentinels monitor (`sentinel monitor <name> ...`);
- `db` is the database number on the master (0 when left out);
- the user and password authenticate to the master and its replicas (`requirepass`,
  ACLs); `sentinel_username` / `sentinel_password` to the sentinels, if they ask;
- `rediss+sentinel://` speaks TLS to the sentinels and to the master.

Percent-encode `@ , / : ? & #` inside a password. Nothing here imports redis: the
settings validate with it, `aldebaran.io.redis` builds clients with it. No message
raised here ever contains a password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}  # scheme -> TLS
PLAIN_SCHEMES = ("redis://", "rediss://", "unix://")
DEFAULT_SENTINEL_PORT = 26379
FORM = "redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db]"
_SERVICE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_QUERY_KEYS = ("sentinel_username", "sentinel_password")


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """Where the sentinels are and which master they watch; the credentials for both."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    tls: bool = False

    def describe(self) -> str:
        """For logs and `aldebaran health`: the sentinels and the service, never a password."""
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.sentinels)
        return f"sentinel {self.service_name} via {hosts} db {self.db}"


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES if "://" in url else False


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The parts of a Sentinel URL; `ValueError` saying what is wrong (never echoing a secret)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise ValueError(f"a Sentinel URL starts with redis+sentinel:// or rediss+sentinel:// ({FORM})")
    if "#" in rest:
        raise ValueError("a Sentinel URL has no #fragment")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username, password = _credentials(userinfo) if at else (None, None)
    service, db = _path(path)
    options = _query(query)
    return SentinelTarget(sentinels=_sentinels(hostlist), service_name=service, db=db, username=username,
                          password=password, sentinel_username=options.get("sentinel_username"),
                          sentinel_password=options.get("sentinel_password"),
                          tls=SENTINEL_SCHEMES[scheme.lower()])


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) if colon and password else None)


def _sentinels(hostlist: str) -> tuple[tuple[str, int], ...]:
    # Errors give the sentinel's position, not its text: with an unencoded `/` in a
    # password, what looks like a host may be a piece of the password.
    if not hostlist:
        raise ValueError(f"a Sentinel URL names at least one sentinel host ({FORM})")
    sentinels = []
    for number, part in enumerate(hostlist.split(","), start=1):
        try:
            parsed = urlsplit("//" + part)
            host, port = parsed.hostname, parsed.port
        except ValueError:
            raise ValueError(f"sentinel {number} of the URL: the port must be a number 1-65535") from None
        if not host or parsed.username is not None or parsed.path or parsed.query:
            raise ValueError(f"sentinel {number} of the URL is not host[:port]")
        if port == 0:
            raise ValueError(f"sentinel {number} of the URL: the port must be a number 1-65535")
        sentinels.append((host, port or DEFAULT_SENTINEL_PORT))
    return tuple(sentinels)


def _path(path: str) -> tuple[str, int]:
    path = path.rstrip("/")
    parts = path.split("/") if path else []
    if not parts or not parts[0]:
        raise ValueError(f"a Sentinel URL names the monitored service after the hosts ({FORM})")
    service = unquote(parts[0])
    if not _SERVICE.match(service):
        raise ValueError("the Sentinel service name may hold letters, digits, _ . - (1-128 of them)")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(f"after the service name only a database number may follow ({FORM})")
    return service, int(parts[1]) if len(parts) == 2 else 0


def _query(query: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError("the query of a Sentinel URL is not name=value pairs") from None
    unknown = sorted({name for name, _ in pairs if name not in _QUERY_KEYS})
    if unknown:
        raise ValueError(f"unknown Sentinel URL parameter {', '.join(unknown)} "
                         f"(known: {', '.join(_QUERY_KEYS)})")
    return {name: value for name, value in pairs if value}


def check_redis_url(url: str) -> str:
    """The settings' check of `redis_url`: a known scheme, and a Sentinel URL that parses."""
    if is_sentinel_url(url):
        parse_sentinel_url(url)
        return url
    if not url.startswith(PLAIN_SCHEMES):
        raise ValueError(f"must start with one of {', '.join(PLAIN_SCHEMES)}, "
                         "redis+sentinel://, rediss+sentinel://")
    return url
