"""Packed outputs in object storage: read ``http(s)://``, ``s3://`` (anything fsspec resolves)
through a node-local cache, and write outputs to URLs through a local staging folder.

``open_remote`` is what ``packer.formats.open_reader`` calls for a URL; ``RemoteOptions`` says
how (cache folder and limit, storage options, prefetch, retries). See docs/remote.md.
"""
from packer.remote.cache import NodeCache, cache_events, default_cache_dir
from packer.remote.fetch import RemoteError, RemoteMissing, RetryPolicy
from packer.remote.source import RemoteOptions, RemoteSource, open_remote
from packer.remote.url import is_url, redact

__all__ = ["NodeCache", "cache_events", "default_cache_dir", "RemoteError", "RemoteMissing", "RetryPolicy",
           "RemoteOptions", "RemoteSource", "open_remote", "is_url", "redact"]
