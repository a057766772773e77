"""URL helpers: recognising URLs, redacting them, scrubbing secrets out of text."""
from __future__ import annotations

import string

from hypothesis import given, strategies as st

from packer.remote.url import cache_key, is_url, redact, scrub, secrets_of


def test_is_url():
    assert is_url("s3://b/k") and is_url("https://h/x") and is_url("gs://b")
    assert not is_url("file:///tmp/x") and not is_url("/tmp/x") and not is_url("rel/path")
    assert not is_url(None) and not is_url(b"s3://b")


def test_redact_drops_user_info_and_query():
    assert redact("https://alice:pw@host:8443/a/b?X-Amz-Signature=abc") == "https://***@host:8443/a/b?***"
    assert redact("s3://bucket/key") == "s3://bucket/key"


def test_secrets_of_finds_nested_credentials():
    found = secrets_of("https://u:pw123@h/x?token=tok456", {"key": "AKIAXXXX", "secret": "s3cr3t!",
                                                            "client_kwargs": {"endpoint_url": "http://e",
                                                                              "aws_session_token": "sess"}})
    for s in ("pw123", "tok456", "AKIAXXXX", "s3cr3t!", "sess"):
        assert s in found
    assert "http://e" not in found


def test_cache_key_is_stable_and_ignores_credentials():
    assert cache_key("https://u:p@h/data/train/") == cache_key("https://h/data/train")
    assert cache_key("s3://a/train") != cache_key("s3://b/train")


@given(st.text(alphabet=string.ascii_letters + string.digits + "+/=_-", min_size=6, max_size=40),
       st.text(max_size=60), st.text(max_size=60))
def test_scrub_never_leaves_a_secret(secret, before, after):
    text = scrub(before + secret + after + " url=https://user:" + secret + "@host/x", [secret])
    assert secret not in text


def test_guard_logs_while_another_thread_makes_loggers():
    """A prefetch thread's import can make a logger while a reader opens a URL: guarding the
    loggers must not iterate logging's live dict (it raised "dictionary changed size during
    iteration" in a rank of the remote benchmark)."""
    import logging
    import sys
    import threading

    from packer.remote.url import _FILTER, guard_logs

    made = threading.Event()

    def make() -> None:
        for i in range(3000):
            logging.getLogger(f"fsspec.test-race-{i}")
        made.set()

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        t = threading.Thread(target=make)
        t.start()
        while not made.is_set():
            guard_logs(["s3cr3t-race"])
        t.join()
    finally:
        sys.setswitchinterval(switch)
    guard_logs(["s3cr3t-race"])  # and every logger made by now carries the filter
    assert all(_FILTER in logging.getLogger(f"fsspec.test-race-{i}").filters for i in (0, 1500, 2999))
