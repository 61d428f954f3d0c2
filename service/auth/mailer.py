"""Send the sign-in code by SMTP, built with EmailMessage, under one deadline."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from email.message import EmailMessage
from email.utils import formataddr, formatdate, make_msgid
from html import escape
from typing import Any, Final, Literal, Protocol

import aiosmtplib
from aiohttp import web

from ..keys import SETTINGS
from ..settings import SmtpSettings
from .codes import CODE_TTL_SECONDS, readable

_LOGGER: Final = logging.getLogger(__name__)
# aiosmtplib logs the SMTP conversation, message bodies included, at DEBUG: a code
# must never reach a log, so its logger stays at INFO whatever the root level is.
logging.getLogger("aiosmtplib").setLevel(logging.INFO)

Lang = Literal["zh", "en"]

_TEXTS: Final = {
    "zh": {
        "subject": "你的{site}登录验证码",
        "intro": "你的{site}登录验证码是：",
        "ttl": "验证码 {minutes} 分钟内有效，只能使用一次。",
        "ignore": "如果不是你本人在登录，请忽略这封邮件，你的账号不会有任何变化。",
    },
    "en": {
        "subject": "Your {site} sign-in code",
        "intro": "Your {site} sign-in code is:",
        "ttl": "The code works once, within {minutes} minutes.",
        "ignore": "If you did not try to sign in, ignore this e-mail; nothing changes.",
    },
}


class MailUnavailable(Exception):
    """The relay refused the message, failed or ran past the deadline."""


class Mailer(Protocol):
    """Hands a message to a relay."""

    async def send(self, message: EmailMessage) -> None:
        """Deliver the message or raise MailUnavailable."""


class SmtpMailer:
    """Send through the configured relay, one connection per message."""

    def __init__(self, smtp: SmtpSettings) -> None:
        self._smtp = smtp

    async def send(self, message: EmailMessage) -> None:
        """Deliver within smtp.timeout seconds in all, or raise MailUnavailable."""
        smtp = self._smtp
        try:
            async with asyncio.timeout(smtp.timeout):
                await aiosmtplib.send(
                    message,
                    hostname=smtp.host,
                    port=smtp.port,
                    username=smtp.username or None,
                    password=smtp.password or None,
                    use_tls=smtp.tls == "tls",
                    start_tls=smtp.tls == "starttls",
                    timeout=smtp.timeout,
                )
        except (aiosmtplib.SMTPException, TimeoutError, OSError) as err:
            _LOGGER.error(
                "mail relay %s:%d failed: %s", smtp.host, smtp.port, type(err).__name__
            )
            raise MailUnavailable from err


MAILER: Final = web.AppKey("mailer", Mailer)


def code_message(
    *, to: str, code: str, lang: Lang, site_name: str, sender: str
) -> EmailMessage:
    """Build the sign-in mail: plain text and HTML, the code shown as 1234 5678."""
    texts = {
        k: v.format(site=site_name, minutes=CODE_TTL_SECONDS // 60)
        for k, v in _TEXTS[lang].items()
    }
    shown = readable(code)
    message = EmailMessage()
    message["From"] = formataddr((site_name, sender))
    message["To"] = to
    message["Subject"] = texts["subject"]
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2])
    message["Auto-Submitted"] = "auto-generated"
    message.set_content(
        f"{texts['intro']}\n\n    {shown}\n\n{texts['ttl']}\n{texts['ignore']}\n"
    )
    message.add_alternative(
        f'<!doctype html><html lang="{"zh-Hans" if lang == "zh" else "en"}"><body>'
        f"<p>{escape(texts['intro'])}</p>"
        f'<p style="font-size:28px;font-weight:700;letter-spacing:4px;'
        f'font-family:monospace">{escape(shown)}</p>'
        f"<p>{escape(texts['ttl'])}</p><p>{escape(texts['ignore'])}</p></body></html>",
        subtype="html",
    )
    return message


async def mailer_ctx(app: web.Application) -> AsyncIterator[None]:
    """Provide the SMTP mailer for the life of the app."""
    app[MAILER] = SmtpMailer(app[SETTINGS].smtp)
    yield


def site_name(site: Mapping[str, Any], lang: Lang) -> str:
    """Name the site in the mail's language."""
    return str(site["name_zh"] if lang == "zh" else site["name_en"])
