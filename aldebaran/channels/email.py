"""`email`: SMTP (optional STARTTLS or implicit TLS, optional login) via aiosmtplib.

The Message-ID is `<alert_id@aldebaran>` (the id quoted when it holds a colon), so a mail
system or reader that dedups on it sees a repeat as the same message.
"""

from __future__ import annotations

import json
import re
from email.message import EmailMessage
from email.policy import SMTP

import aiosmtplib

from aldebaran.channels.base import Alert, NotDelivered
from aldebaran.channels.text import one_line
from aldebaran.settings import EmailChannel, Settings

_REFUSED = (aiosmtplib.SMTPConnectError, aiosmtplib.SMTPResponseException, aiosmtplib.SMTPRecipientsRefused,
            aiosmtplib.SMTPNotSupported)
_DOT_ATOM = re.compile(r"^[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~]+(\.[A-Za-z0-9!#$%&'*+\-/=?^_`{|}~]+)*$")
_NOT_PRINTABLE_ASCII = re.compile(r"[^\x20-\x7e]")


def message_id(alert_id: str) -> str:
    """`<alert_id@aldebaran>`; an id that is not a dot-atom (`over_purchase:1` has a colon)
    is quoted, `<"over_purchase:1"@aldebaran>`, as RFC 5322 allows, so parsers keep it whole."""
    if _DOT_ATOM.match(alert_id):
        return f"<{alert_id}@aldebaran>"
    printable = _NOT_PRINTABLE_ASCII.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), alert_id)
    quoted = printable.replace("\\", "\\\\").replace('"', '\\"')
    return f'<"{quoted}"@aldebaran>'


class EmailSink:
    targets = ("",)

    def __init__(self, config: EmailChannel) -> None:
        self._config = config

    async def start(self) -> None:
        return None

    def compose(self, alert: Alert) -> EmailMessage:
        # SMTP's own 998-character line limit: a long quoted Message-ID folded at 78 would lose
        # its quotes and parse back cut short.
        message = EmailMessage(policy=SMTP.clone(max_line_length=998))
        message["From"] = self._config.sender
        message["To"] = ", ".join(self._config.recipients)
        message["Subject"] = f"[Aldebaran] {one_line(alert.summary())}"
        message["Message-ID"] = message_id(alert.alert_id)
        message.set_content(json.dumps(alert.fields, indent=2, sort_keys=True))
        return message

    async def send(self, alert: Alert, target: str) -> None:
        c = self._config
        try:
            await aiosmtplib.send(
                self.compose(alert), hostname=c.host, port=c.port, username=c.username, password=c.password,
                use_tls=c.use_tls, start_tls=c.starttls and not c.use_tls, timeout=c.timeout_seconds)
        except _REFUSED as exc:
            # No connection, or the server answered no: the mail was not accepted. A drop or a
            # silence mid-conversation is left to propagate: the mail may have been accepted.
            code = getattr(exc, "code", 0)
            raise NotDelivered(f"{type(exc).__name__}: {exc}", permanent=500 <= code < 600) from None

    async def close(self) -> None:
        return None


def build(config: EmailChannel, settings: Settings) -> EmailSink:
    return EmailSink(config)
