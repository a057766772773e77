"""Server fixtures for the remote tests: nginx (HTTP) and moto's S3 server, started once per
session. Where one cannot start, its tests skip with a warning that says why."""
from __future__ import annotations

import warnings

import pytest

from tests.support.servers import ServerUnavailable, start_moto, start_nginx



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
