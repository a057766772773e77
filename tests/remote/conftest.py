"""Server fixtures for the remote tests: nginx (HTTP) and moto's S3 server, started once per
session. Where one cannot start, its tests skip with a warning that says why."""
from __future__ import annotations

import itertools
import os
import warnings

import pytest

from scripts.servers import ServerUnavailable, start_moto, start_nginx



@pytest.fixture(scope="session")
def nginx(tmp_path_factory):
    base = tmp_path_factory.mktemp("nginx")
    try:
        server = start_nginx(base / "www", base / "run")
    except ServerUnavailable as e:
        warnings.warn(f"REMOTE TESTS SKIPPED: nginx cannot start here: {e}")
        pytest.skip(f"nginx cannot start: {e}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    try:
        server = start_moto()
    except ServerUnavailable as e:
        warnings.warn(f"S3 TESTS SKIPPED: the moto S3 server cannot start here: {e}")
        pytest.skip(f"moto S3 server cannot start: {e}")
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _servers_up(request):
    """Before each test, the servers it uses are up: a server that died (or whose port another
    process took) is started again (tests/support/servers.py)."""
    for name in ("nginx", "s3"):
        if name in request.fixturenames:
            request.getfixturevalue(name).ensure()


_buckets = itertools.count()


@pytest.fixture
def bucket(s3, monkeypatch, tmp_path):
    """A fresh bucket on the moto server; credentials and endpoint in the environment (how the
    CLI and packer.api get them), the node cache and staging under ``tmp_path``."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.storage_options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.storage_options["secret"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKER_STAGING_DIR", str(tmp_path / "staging"))
    name = f"packer-test-{os.getpid()}-{next(_buckets)}"
    s3.make_bucket(name)
    return f"s3://{name}"
