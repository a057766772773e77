"""Real servers for the remote tests and the benchmark: Debian's nginx (HTTP, byte ranges, a
slow and a failing location) and moto's standalone S3 server (what s3fs's own suite uses).

Both bind 127.0.0.1 on a free port. ``start_*`` raise ``ServerUnavailable`` with the reason
when the server cannot start (not installed, cannot bind); callers skip loudly on it.

A port found free can be taken by another process before the server binds it (another xdist
worker's server, another session on a busy machine): the server then exits at start while the
port answers, and a test would talk to someone else's server until that one goes away
("connection refused" in the middle of a test, issue 40). So a server counts as started only
when its own process holds the listening socket (``/proc``), else it is started again on
another port; and ``ensure()`` (called before each use by the fixtures) checks it again and
restarts it if it has died.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.timing import scaled

__all__ = ["ServerUnavailable", "Nginx", "start_nginx", "MotoS3", "start_moto", "free_port"]



def stop_process(proc: subprocess.Popen) -> None:
    """Terminate a server process, killing it if it has not exited within 10 s (scaled); reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(scaled(10))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

class ServerUnavailable(RuntimeError):
    """The server could not start here (the reason is the message)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _PortLost(ServerUnavailable):
    """The server exited at start (its port taken by another process, most likely)."""


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on 127.0.0.1/0.0.0.0:``port`` (TCP, IPv4)."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return set()
    out = set()
    for line in lines:
        f = line.split()
        if f[3] == "0A" and int(f[1].split(":")[1], 16) == port:  # LISTEN
            out.add(f[9])
    return out


def holds_port(pid: int, port: int) -> bool:
    """``pid`` holds the socket listening on ``port`` (True where /proc cannot tell)."""
    if not Path("/proc/net/tcp").exists():
        return True
    inodes = _listening_inodes(port)
    try:
        fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    return any(fd.startswith("socket:[") and fd[8:-1] in inodes for fd in fds)


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 20.0) -> None:
    """Until ``proc`` itself listens on ``port`` (``timeout`` scaled to the machine's load)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _PortLost(f"{what} exited with status {proc.returncode} at start")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                if holds_port(proc.pid, port):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    stop_process(proc)
    raise ServerUnavailable(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f}s")


def _started(start, what: str, tries: int = 5):
    """``start()`` again on a fresh port while the server loses its port at start."""
    for attempt in range(tries):
        try:
            return start()
        except _PortLost:
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


_CONF = """
{user}
worker_processes 2;
daemon off;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format packer '$request_method $uri $status $body_bytes_sent "$http_range"';
    access_log {run}/access.log packer;
    client_body_temp_path {run}/body; proxy_temp_path {run}/proxy; fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi; scgi_temp_path {run}/scgi;
    sendfile on;
    default_type application/octet-stream;
    split_clients "${{request_id}}" $fail10 {{ 10% fail; * ok; }}
    split_clients "${{request_id}}x" $fail50 {{ 50% fail; * ok; }}
    server {{
        listen 127.0.0.1:{port};
        location /d/ {{ alias {root}/; }}
        location /slow/ {{ alias {root}/; limit_rate {slow_rate}; }}
        location /flaky/ {{ alias {root}/; if ($fail10 = fail) {{ return 503; }} }}
        location /faulty/ {{ alias {root}/; if ($fail50 = fail) {{ return 503; }} }}
        location /dav/ {{ alias {root}/; dav_methods PUT DELETE MKCOL; create_full_put_path on; client_max_body_size 0; }}
    }}
}}
"""


@dataclass
class Nginx:
    """A running nginx: ``url(location, name)``, the access log, ``stop()``."""

    port: int
    root: Path
    run: Path
    proc: subprocess.Popen

    def url(self, name: str = "", location: str = "d") -> str:
        return f"http://127.0.0.1:{self.port}/{location}/{name}".rstrip("/")

    @property
    def access_log(self) -> Path:
        return self.run / "access.log"

    def requests(self) -> list[tuple[str, str, int, int, str]]:
        """(method, uri, status, bytes, range) of every request logged so far."""
        out = []
        if not self.access_log.exists():
            return out
        for line in self.access_log.read_text().splitlines():
            m = re.match(r'(\S+) (\S+) (\d+) (\d+) "(.*)"$', line)
            if m:
                out.append((m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), m.group(5)))
        return out

    def downloads(self, suffix: str = ".tfrecord") -> collections.Counter:
        """Successful whole-file GETs per URI ending with ``suffix``."""
        return collections.Counter(uri for method, uri, status, _, rng in self.requests()
                                   if method == "GET" and status == 200 and uri.endswith(suffix) and rng == "-")

    slow_rate: str = "1k"

    def stop(self) -> None:
        stop_process(self.proc)

    def ensure(self) -> "Nginx":
        """The server is up (its process holds its port), else started again (another port)."""
        if self.proc.poll() is None and holds_port(self.proc.pid, self.port):
            return self
        stop_process(self.proc)
        fresh = start_nginx(self.root, self.run, slow_rate=self.slow_rate)
        self.port, self.proc = fresh.port, fresh.proc
        return self


def start_nginx(root: Path, run: Path, *, slow_rate: str = "1k") -> Nginx:
    """Start nginx serving ``root`` at /d/ (plain), /slow/ (limit_rate), /flaky/ (10% 503),
    /faulty/ (50% 503) and /dav/ (WebDAV: PUT and DELETE write there, for uploads); its config,
    pid and logs live in ``run``."""
    return _started(lambda: _start_nginx(root, run, slow_rate), "nginx")


def _start_nginx(root: Path, run: Path, slow_rate: str) -> Nginx:
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if exe is None:
        raise ServerUnavailable("nginx is not installed (apt-get install -y nginx)")
    run.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # As root, nginx's workers would switch to www-data and could not read pytest's 0700 tmp dirs.
    user = "user root;" if os.geteuid() == 0 else ""
    (run / "nginx.conf").write_text(_CONF.format(user=user, run=run, port=port, root=root, slow_rate=slow_rate))
    proc = subprocess.Popen([exe, "-p", str(run), "-c", str(run / "nginx.conf"), "-e", str(run / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_port(port, proc, "nginx")
    except ServerUnavailable as e:
        err = proc.stderr.read().decode(errors="replace")[-500:] if proc.stderr else ""
        raise type(e)(f"{e}: {err.strip()}") from None
    return Nginx(port, root, run, proc, slow_rate)


@dataclass
class MotoS3:
    """A running moto S3 server: ``endpoint``, ``storage_options``, ``stop()``."""

    port: int
    proc: subprocess.Popen

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict:
        return {"key": "packer-test-key", "secret": "packer-test-secret-value",
                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"}}

    def ensure(self) -> "MotoS3":
        """The server is up (its process holds its port), else started again (another port,
        an empty store: each test makes its own buckets)."""
        if self.proc.poll() is None and holds_port(self.proc.pid, self.port):
            return self
        stop_process(self.proc)
        fresh = start_moto()
        self.port, self.proc = fresh.port, fresh.proc
        return self

    def make_bucket(self, name: str) -> None:
        import boto3

        self.ensure()

        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                     aws_access_key_id=self.storage_options["key"],
                     aws_secret_access_key=self.storage_options["secret"]).create_bucket(Bucket=name)

    def stop(self) -> None:
        stop_process(self.proc)


def start_moto() -> MotoS3:
    """Start ``python -m moto.server`` on 127.0.0.1 (needs ``moto[server]``)."""
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError as e:
        raise ServerUnavailable(f"moto[server] or s3fs is not installed ({e})") from None

    def start() -> MotoS3:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(port, proc, "moto S3 server", timeout=60)
        return MotoS3(port, proc)

    return _started(start, "moto S3 server")
