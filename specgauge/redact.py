"""One redaction rule for everything specgauge writes or prints: artifacts, warehouse rows, log lines, errors.

What counts as secret:
- the userinfo of a URL (`https://user:password@host/` -> `https://REDACTED@host/`);
- the value of an option or environment variable whose name has a secret word (`--api-key X`, `HF_TOKEN=X`);
  whole words only, so `--tokenizer` and `--max-num-batched-tokens` are not secrets;
- a value shaped like a well-known access token (`hf_...`, `sk-...`, `ghp_...`), wherever it appears;
- any pydantic SecretStr (its value is never read here).

Redaction keeps the shape (which option, which host) so that a reader can still tell what was configured.

Where it is applied: configuration documents as they are dumped (artifacts.documents.Configuration: deployment,
campaign, run, decision and promotion documents, the variant and engine blocks of cell metadata), the
warehouse's rows read from older files (warehouse/kinds/deployments.py), every log handler (RedactingFilter,
profiles/logging.yml), Prefect's stored flow parameters (specgauge.prefect_env.redact_stored_parameters),
the CLI's `error:` line, files of commands the launchers keep (command.txt, job.sbatch, sml-command.txt), and
webhook URLs shown (redact_webhook). Measurement data (prompts, outputs, request records) is never redacted.
The values used at run time are not changed: only what is written or printed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

REDACTED = "REDACTED"

# Name words (split at '-' and '_') that mark an option or variable as secret.
_SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials", "auth", "webhook"}
)
_TOKEN_SHAPE = r"(?:sk-|hf_|ghp_|gho_|github_pat_|glpat-|xox[bpas]-)[A-Za-z0-9_-]{16,}"
_SECRET_VALUE = re.compile(_TOKEN_SHAPE)
_TOKEN_IN_TEXT = re.compile(rf"(?<![A-Za-z0-9_-]){_TOKEN_SHAPE}")
# scheme://userinfo@host: the userinfo is everything between // and the last @ before the host's end.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s@'\"]+)@")
# NAME=value, --name value / --name=value, 'name': 'value' inside free text (log lines, error messages, commands,
# reprs of dicts). Only names holding a secret word match (whole words between '-'/'_', any case), so that a
# match never swallows the next option: "cmd --api-key X" is the option and its value, not "cmd" and "--api-key".
# A name right after '/' is a file in a path ("/etc/passwd: not a spec"), not an assignment.
_SECRET_NAME = (
    r"(?<![A-Za-z0-9_/\\-])(?P<name>-{0,2}(?:[A-Za-z0-9]+[-_]+)*(?:"
    + "|".join(sorted(_SECRET_WORDS, key=len, reverse=True))
    + r")(?:[-_]+[A-Za-z0-9]+)*)(?![A-Za-z0-9])"
)
_ASSIGNMENT_IN_TEXT = re.compile(
    _SECRET_NAME + r"(?P<quote>['\"]?)(?P<sep>\s*[=:]\s*|\s+)(?P<value>\"[^\"]*\"|'[^']*'|[^\s,;&'\"}\])]+)",
    re.IGNORECASE,
)
# An HTTP credential written out: "Authorization: Bearer X", "Basic X".
_SCHEME_CREDENTIAL = re.compile(r"\b(?P<scheme>Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{6,}")


def looks_secret(name: str) -> bool:
    """Whether an option (--api-key) or environment variable name (HF_TOKEN) names a secret."""
    return any(word in _SECRET_WORDS for word in re.split(r"[-_]+", name.lstrip("-").lower()))


def redact_url(url: str) -> str:
    """The URL with its userinfo (user:password@) replaced; everything else kept."""
    return _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", url)


def redact_args(args: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """The arguments with the values of secret-looking options (--api-key X, --hf-token=X) and values that look
    like access tokens replaced by REDACTED, and the names of what was replaced."""
    out: list[str] = []
    replaced: list[str] = []
    pending: str | None = None  # a secret option whose value is the next argument
    for arg in args:
        arg = str(arg)
        if pending is not None:
            secret, pending = pending, None
            if not arg.startswith("--"):
                out.append(REDACTED)
                replaced.append(secret)
                continue
        name, equals, value = arg.partition("=")
        option = arg.startswith("--")
        if option and looks_secret(name):
            out.append(f"{name}={REDACTED}" if equals else arg)
            if equals:
                replaced.append(name)
            else:
                pending = name
        elif option and equals and _SECRET_VALUE.fullmatch(value):
            out.append(f"{name}={REDACTED}")
            replaced.append(name)
        elif not option and _SECRET_VALUE.fullmatch(arg):
            out.append(REDACTED)
            replaced.append("a token-like value")
        else:
            out.append(redact_text(arg))
    return tuple(out), replaced


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """An environment mapping with the values of secret-looking names (and token-like values) replaced."""
    return {name: REDACTED if looks_secret(str(name)) else redact_data(value) for name, value in env.items()}


def redact_text(text: str) -> str:
    """Free text (a log line, an error message, a shell command) with URL userinfo, NAME=value / --name value
    of secret-looking names, and token-shaped values replaced."""
    if not text:
        return text
    text = redact_url(text)

    def assignment(match: re.Match[str]) -> str:
        value = match["value"].strip("'\"")
        if value == REDACTED or value.startswith("-"):
            return match[0]  # already redacted, or the option has no value here ("--api-key --port 1")
        if match["sep"].strip() == "" and not (match["name"].startswith("-") and not match["quote"]):
            return match[0]  # "api key expired", "the token is": words, not an assignment
        quoted = match["value"][0] if match["value"][0] in "'\"" else ""
        return f"{match['name']}{match['quote']}{match['sep']}{quoted}{REDACTED}{quoted}"

    text = _ASSIGNMENT_IN_TEXT.sub(assignment, text)
    text = _SCHEME_CREDENTIAL.sub(lambda m: f"{m['scheme']} {REDACTED}", text)
    return _TOKEN_IN_TEXT.sub(REDACTED, text)


def redact_data(data: Any) -> Any:
    """A JSON-like value (dicts, lists, strings) with every secret replaced: values under secret-looking keys,
    URL userinfo and token-shaped values inside strings, lists that look like command lines, any SecretStr."""
    if isinstance(data, SecretStr):
        return REDACTED
    if isinstance(data, str):
        return redact_text(data)
    if isinstance(data, Mapping):
        return {
            key: (
                REDACTED
                if looks_secret(str(key)) and isinstance(value, str | SecretStr) and value
                else redact_data(value)
            )
            for key, value in data.items()
        }
    if isinstance(data, list | tuple):
        if (
            data
            and all(isinstance(item, str) for item in data)
            and any(str(i).startswith("--") for i in data)
        ):
            return type(data)(redact_args(data)[0]) if isinstance(data, tuple) else list(redact_args(data)[0])
        return (
            type(data)(redact_data(item) for item in data)
            if isinstance(data, tuple)
            else [redact_data(item) for item in data]
        )
    return data


def redact_webhook(url: str) -> str:
    """A webhook URL as it may be shown: its scheme and host only. The rest is the secret (Slack's and Teams'
    hooks carry their key in the path, others in the query or the userinfo)."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # not a URL at all: show nothing of it
        return REDACTED
    if not parts.scheme or not host:
        return REDACTED
    hidden = (
        "/" + REDACTED
        if (parts.path.strip("/") or parts.query or parts.fragment or "@" in parts.netloc)
        else ""
    )
    return urlunsplit((parts.scheme, f"{host}{port}", hidden, "", ""))


class RedactingFilter(logging.Filter):
    """A logging filter that passes every record, its message (arguments merged in) redacted. Put on handlers
    (profiles/logging.yml does, for all of Prefect's): a filter on a logger misses its children's records."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad format string: leave it to the handler to report
            return True
        redacted = redact_text(message)
        if redacted != message or record.args:
            record.msg, record.args = redacted, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            # the traceback's last line repeats the exception's message: format it now, redacted
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True
