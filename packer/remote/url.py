"""URLs of packed outputs in object storage: recognising them, naming them safely, and the
fsspec filesystem behind them.

Any protocol fsspec resolves works (``http(s)://`` through aiohttp, ``s3://`` through s3fs,
``gs://`` through gcsfs, ...). Credentials come from where each protocol package looks
(environment, config files) or from ``storage_options``; packer never stores them, and every
URL or error text it prints goes through ``redact``/``scrub`` first.
"""
from __future__ import annotations

import logging
import os
import re
import urllib.parse
from typing import Any, Iterable

from packer.errors import UsageError

__all__ = ["guard_logs", "is_url", "redact", "scrub", "join_url", "url_filesystem", "secrets_of", "cache_key"]

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "credential", "auth", "session")


def is_url(path: Any) -> bool:
    """True for ``scheme://...`` strings other than ``file://`` (those are local paths)."""
    if not isinstance(path, str):
        return False
    m = _SCHEME.match(path)
    return bool(m) and m.group(1).lower() != "file"


def redact(url: str) -> str:
    """The URL without user info and query string (where signed URLs and tokens live)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    netloc = ("***@" if parts.username or parts.password else "") + host
    query = "?***" if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")) + query


def secrets_of(url: str, storage_options: dict[str, Any] | None) -> list[str]:
    """Strings that must never be printed: URL user info, query values, and credential-like
    values of ``storage_options`` (nested dicts too)."""
    found: list[str] = []
    try:
        parts = urllib.parse.urlsplit(url)
        found += [v for v in (parts.username, parts.password) if v]
        found += [v for _, v in urllib.parse.parse_qsl(parts.query) if v]
        if parts.query:
            found.append(parts.query)
    except ValueError:
        pass

    def walk(d: Any) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                if isinstance(v, str) and any(w in str(k).lower() for w in _SECRET_WORDS) and v:
                    found.append(v)
                else:
                    walk(v)

    walk(storage_options or {})
    for var in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"):
        if os.environ.get(var):
            found.append(os.environ[var])
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced by ``***``, and URLs with user info redacted."""
    for s in secrets:
        text = text.replace(s, "***")
        quoted = urllib.parse.quote(s, safe="")
        if quoted != s:
            text = text.replace(quoted, "***")
    return re.sub(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]*@", r"\1***@", text)


def join_url(base: str, name: str) -> str:
    """``base/name`` for a URL (``name`` relative, '/'-separated)."""
    if name.startswith("/") or ".." in name.split("/"):
        raise UsageError(f"{name!r}: not a relative name inside the dataset")
    return base.rstrip("/") + "/" + name


_KNOWN_SECRETS: set[str] = set()
_LIBRARY_LOGGERS = ("fsspec", "fsspec.http", "fsspec.asyn", "s3fs", "gcsfs", "aiohttp.client", "botocore",
                    "botocore.endpoint", "botocore.auth", "botocore.hooks", "aiobotocore")


class _ScrubFilter(logging.Filter):
    """Rewrites log records of the storage libraries without URL user info or known secrets
    (fsspec's http module logs every URL it opens at DEBUG, credentials included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record: leave it to logging
            return True
        clean = scrub(text, sorted(_KNOWN_SECRETS, key=len, reverse=True))
        if clean != text:
            record.msg, record.args = clean, None
        return True


_FILTER = _ScrubFilter()


def guard_logs(secrets: Iterable[str]) -> None:
    """Never let the storage libraries' own log lines show ``secrets`` or URL user info.

    A logger filter sees only records made on that very logger, so the filter goes on each
    of the libraries' loggers that exists by now (they are made when their modules import).
    """
    _KNOWN_SECRETS.update(secrets)
    prefixes = tuple(name.split(".")[0] for name in _LIBRARY_LOGGERS) + ("urllib3",)
    # list() copies the names in one step under the GIL: iterating the live dict raced with a
    # prefetch thread whose import made a logger ("dictionary changed size during iteration")
    names = set(_LIBRARY_LOGGERS) | {n for n in list(logging.root.manager.loggerDict) if n.startswith(prefixes)}
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def url_filesystem(url: str, storage_options: dict[str, Any] | None = None, *,
                   timeout: float = 60.0) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) of ``url``; UsageError when no fsspec protocol fits.

    HTTP(S) gets a read timeout of ``timeout`` seconds (a stalled transfer fails and is retried)
    and whole-file streaming (no ranged block reads), S3 the same connect/read timeouts, unless
    ``storage_options`` say otherwise.
    """
    try:
        import fsspec
    except ImportError:  # pragma: no cover - the remote extra is missing
        raise UsageError("reading or writing URLs needs fsspec: pip install 'packer[remote]'") from None
    options = dict(storage_options or {})
    guard_logs(secrets_of(url, options))
    if url.split("://", 1)[0].lower() in ("http", "https"):
        import aiohttp

        kwargs = dict(options.get("client_kwargs") or {})
        kwargs.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout))
        options["client_kwargs"] = kwargs
        options.setdefault("block_size", 0)  # stream whole files: no ranged block reads
    elif url.split("://", 1)[0].lower() in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        options["config_kwargs"] = config
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as e:
        raise UsageError(f"{redact(url)}: no filesystem for this URL ({scrub(str(e), secrets_of(url, options))}); "
                         "pip install 'packer[remote]' (s3fs, aiohttp) or the protocol's fsspec package") from e
    return fs, path


def cache_key(url: str) -> str:
    """A short stable folder name for a dataset URL in the cache (its redacted form hashed)."""
    import hashlib

    base = redact(url).replace("://***@", "://").removesuffix("?***").rstrip("/")
    tail = re.sub(r"[^A-Za-z0-9_.-]+", "_", base.rsplit("/", 1)[-1])[:40] or "root"
    return f"{tail}-{hashlib.sha256(base.encode()).hexdigest()[:16]}"
