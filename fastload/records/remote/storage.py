"""Read stage, remote: one client for object stores (S3 and S3-compatible servers, GCS, Azure, HTTP(S)).

Everything goes through `obstore <https://developmentseed.org/obstore>`_ (Python bindings of the
Rust ``object_store`` crate that Arrow, DataFusion and Polars use). It was chosen over fsspec/s3fs on
throughput measured against a real S3 server on loopback (SeaweedFS; ``bench/remote_clients.py``,
the two clients alternating on the same objects): a whole 32-256 MB object streamed into a file in
/dev/shm, which is how a shard reaches the cache, took 0.52-0.77x of s3fs's time (708-857 MB/s
against 399-579 MB/s); 16 MB ranged GETs were on par or slightly faster (0.94-1.00x with one stream,
0.83-0.99x with two). It also has no event-loop thread of its own (s3fs runs one asyncio loop per
process, which forked workers must not inherit), releases the GIL while it waits, and has timeouts
and request retries with exponential backoff built in.

Where settings come from, in order (the first that gives a value wins):

1. ``storage_options=`` (fsspec-style names are accepted: ``key``, ``secret``, ``token``,
   ``endpoint_url``, ``region``/``region_name``, ``anon``, ``profile``, ``client_kwargs``; any other
   key is handed to obstore's store config, e.g. ``virtual_hosted_style_request``; client options
   ``timeout``, ``connect_timeout``, ``read_timeout`` (seconds or "30s"), ``allow_http``);
2. the standard environment variables, read by obstore itself (``AWS_ACCESS_KEY_ID``,
   ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_DEFAULT_REGION``,
   ``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_S3``, ``GOOGLE_*``, ``AZURE_*``);
3. for S3, the ``~/.aws/credentials`` and ``~/.aws/config`` files (``AWS_PROFILE``,
   ``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_CONFIG_FILE``; credentials, region and ``endpoint_url``,
   including a profile's ``services`` section), resolved by botocore when it is installed (it is
   AWS's own resolver: SSO, assumed roles and ``credential_process`` work too).

A plain ``http://`` endpoint is allowed automatically when it was configured explicitly.
Every failure is raised as :class:`RemoteError` (or :class:`RemoteNotFound`) naming the full URL.
"""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from fastload.errors import FastloadError, UserError

__all__ = ["SCHEMES", "ObjectInfo", "RemoteError", "RemoteNotFound", "RemoteStore", "is_remote_url"]

# The process that built the first obstore store: obstore's runtime threads live there only, so a
# process forked from it runs its storage calls in a spawned helper (fastload.records.remote.spawned).
_client_pid: int | None = None

#: URL schemes this module opens (everything obstore covers).
SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "azure", "abfs", "abfss", "http", "https", "memory")

# Client defaults: a connection that cannot be made in 10 s, or a response that sends nothing for
# 60 s, fails (and is retried); the overall limit only catches a transfer crawling along forever
# (a 512 MB shard at 1 MB/s still fits).
_CLIENT_DEFAULTS = {"connect_timeout": "10s", "read_timeout": "60s", "timeout": "15min"}
_RETRY_DEFAULTS = {
    "max_retries": 3,
    "backoff": {"init_backoff": timedelta(milliseconds=200), "max_backoff": timedelta(seconds=5), "base": 2},
}
_CLIENT_KEYS = {
    "timeout",
    "connect_timeout",
    "read_timeout",
    "allow_http",
    "allow_invalid_certificates",
    "proxy_url",
    "user_agent",
    "pool_idle_timeout",
    "http1_only",
    "http2_only",
}
_S3_ALIASES = {
    "key": "access_key_id",
    "secret": "secret_access_key",
    "token": "session_token",
    "endpoint_url": "endpoint",
    "region_name": "region",
}


class RemoteError(FastloadError):
    """A remote operation failed (after the client's own retries); the message names the URL.

    Not an ``OSError`` on purpose (see :class:`fastload.records.remote.fetch.FetchError`).
    """

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url


class RemoteNotFound(RemoteError):
    """The object does not exist."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing or HEAD says about an object.

    Attributes:
        key: Path relative to the store's root URL.
        size: Bytes.
        etag: The server's entity tag (changes when the object is rewritten), or None.
    """

    key: str
    size: int
    etag: str | None = None


def forked_from_client() -> bool:
    """Whether this process was forked from one that had started the storage client.

    obstore is not fork-safe (its runtime's threads stay in the parent): such a process runs its
    storage calls in a spawned helper process (:mod:`fastload.records.remote.spawned`).
    """
    return _client_pid is not None and _client_pid != os.getpid()


def is_remote_url(path: Any) -> bool:
    """Whether ``path`` is a URL this module opens (``s3://``, ``gs://``, ``https://``, ...)."""
    if not isinstance(path, str) or "://" not in path:
        return False
    return path.split("://", 1)[0].lower() in SCHEMES


def _duration(value: Any, name: str) -> str | timedelta:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise UserError(f"storage option {name}={value!r} must be > 0 seconds")
        return timedelta(seconds=float(value))
    if isinstance(value, (str, timedelta)):
        return value
    raise UserError(f"storage option {name}={value!r} must be seconds or a duration like '30s'")


def _botocore_settings(profile: str | None) -> dict[str, Any]:
    """Credentials, region and endpoint from the ``~/.aws`` files (botocore's resolver), when present."""
    try:
        import botocore.exceptions
        import botocore.session
    except ImportError:
        return {}
    try:
        session = botocore.session.Session(profile=profile)
        scoped = session.get_scoped_config()
        out: dict[str, Any] = {}
        region = session.get_config_variable("region")
        if region:
            out["region"] = region
        services = scoped.get("services")
        endpoint = None
        if services:
            endpoint = session.full_config.get("services", {}).get(services, {}).get("s3", {}).get("endpoint_url")
        endpoint = endpoint or scoped.get("endpoint_url")
        if endpoint:
            out["endpoint"] = endpoint
        creds = session.get_credentials()
    except botocore.exceptions.ProfileNotFound as exc:
        raise UserError(f"AWS profile: {exc}") from None
    except botocore.exceptions.BotoCoreError:
        return {}
    if creds is not None:
        frozen = creds.get_frozen_credentials()
        out["access_key_id"], out["secret_access_key"] = frozen.access_key, frozen.secret_key
        if frozen.token:
            out["session_token"] = frozen.token
    return out


def _split_options(scheme: str, options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str | None, bool]:
    """``(store config, client options, profile, explicit endpoint)`` from ``storage_options``."""
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    profile = None
    options = dict(options)
    for k, v in dict(options.pop("client_kwargs", None) or {}).items():  # s3fs style
        options.setdefault("region" if k == "region_name" else k, v)
    for key, value in options.items():
        if key in _CLIENT_KEYS:
            client[key] = _duration(value, key) if key.endswith("timeout") else value
        elif key == "profile":
            profile = value
        elif key == "anon":
            if value:
                config["skip_signature"] = True
        elif scheme in ("s3", "s3a"):
            config[_S3_ALIASES.get(key, key)] = value
        else:
            config[key] = value
    return config, client, profile, "endpoint" in config


class RemoteStore:
    """A dataset's remote root (``s3://bucket/prefix``, ``https://host/path``, ...) and its objects.

    It has the operations fastload needs on the objects below the root.

    Picklable (the URL and options travel, the connection is rebuilt), so Ray tasks and spawned
    processes can take one.

    Args:
        url: The root URL; keys are relative to it.
        storage_options: See the module docstring.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        if not is_remote_url(url):
            raise UserError(f"{url!r} is not a remote URL (schemes: {', '.join(SCHEMES)})")
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._store = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.url, self.storage_options = state["url"], state["storage_options"]
        self._store = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RemoteStore({self.url!r})"

    def url_of(self, key: str) -> str:
        """The full URL of ``key`` (for messages)."""
        return f"{self.url}/{key}" if key else self.url

    def child(self, key: str) -> RemoteStore:
        """A store rooted at ``key`` below this one, with the same options."""
        return RemoteStore(self.url_of(key.strip("/")), self.storage_options)

    @property
    def store(self) -> Any:
        """The obstore store, built on first use (imports obstore lazily).

        Raises:
            RemoteError: In a process forked after the client started, where obstore would hang
                (this class's methods work there: they run in a helper process).
        """
        global _client_pid
        if forked_from_client():
            raise RemoteError(
                "the storage client cannot run in a process forked after it started (obstore is not "
                "fork-safe); RemoteStore's methods run in a helper process there, .store cannot",
                url=self.url,
            )
        if self._store is None:
            with self._lock:
                if self._store is None:
                    self._store = self._build()
                    _client_pid = os.getpid()
        return self._store

    def _build(self) -> Any:
        try:
            import obstore.store
        except ImportError:
            raise UserError(f"{self.url}: remote datasets need obstore (pip install 'fastload[remote]')") from None
        scheme = urlsplit(self.url).scheme.lower()
        config, client, profile, explicit_endpoint = _split_options(scheme, self.storage_options)
        client = {**_CLIENT_DEFAULTS, **client}
        if scheme in ("s3", "s3a"):
            env = os.environ
            from_files = {}
            if not ({"access_key_id", "skip_signature"} & config.keys()) and "AWS_ACCESS_KEY_ID" not in env:
                from_files = _botocore_settings(profile or env.get("AWS_PROFILE"))
            elif profile:
                from_files = _botocore_settings(profile)
            for key in ("access_key_id", "secret_access_key", "session_token"):
                if key in from_files and key not in config:
                    config[key] = from_files[key]
            no_region = "region" not in config and not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"))
            if no_region and "region" in from_files:
                config["region"] = from_files["region"]
            endpoint = config.get("endpoint") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
            if not endpoint and "endpoint" in from_files:
                endpoint = config["endpoint"] = from_files["endpoint"]
            if endpoint and endpoint.startswith("http://") and "allow_http" not in client:
                client["allow_http"] = True  # the user named a plain-HTTP endpoint (a local server)
            if endpoint and not explicit_endpoint and "endpoint" not in config:
                config["endpoint"] = endpoint
        elif scheme == "http":
            client.setdefault("allow_http", True)
        # One call for every scheme, with settings built at run time: obstore's per-scheme overloads
        # cannot be matched statically.
        from_url: Callable[..., Any] = obstore.store.from_url
        try:
            return from_url(self.url, config=config or None, client_options=client, retry_config=_RETRY_DEFAULTS)
        except Exception as exc:  # obstore raises its own error types for bad settings
            raise UserError(f"{self.url}: cannot set up the storage client ({exc})") from None

    # --- operations ---------------------------------------------------------------------------

    def _in_helper(self, what: str, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(self, *args)`` run by this process's helper (see :func:`forked_from_client`)."""
        from fastload.records.remote import spawned

        try:
            return spawned.call(fn, self, *args)
        except spawned.HelperLost as exc:
            raise RemoteError(f"{what} failed: {exc}", url=self.url_of(key)) from None

    def _error(self, exc: BaseException, key: str, what: str) -> RemoteError:
        url = self.url_of(key)
        if isinstance(exc, FileNotFoundError):
            return RemoteNotFound(f"{what}: not found", url=url)
        text = str(exc).split("\n", 1)[0]
        return RemoteError(f"{what} failed: {type(exc).__name__}: {text}", url=url)

    def head(self, key: str) -> ObjectInfo:
        """Size and etag of ``key``."""
        if forked_from_client():
            return self._in_helper("HEAD", key, RemoteStore.head, key)
        import obstore

        try:
            meta = obstore.head(self.store, key)
        except Exception as exc:
            raise self._error(exc, key, "HEAD") from exc
        return ObjectInfo(key, int(meta["size"]), meta.get("e_tag"))

    def get_bytes(self, key: str) -> bytes:
        """The whole object (small ones: manifests, indexes)."""
        if forked_from_client():
            return self._in_helper("GET", key, RemoteStore.get_bytes, key)
        import obstore

        try:
            return bytes(obstore.get(self.store, key).bytes())
        except Exception as exc:
            raise self._error(exc, key, "GET") from exc

    def stream(
        self, key: str, start: int | None = None, end: int | None = None, chunk: int = 1 << 20
    ) -> Iterator[memoryview]:
        """The object (or bytes ``[start, end)``) as chunks of about ``chunk`` bytes.

        1 MB by default: a chunk that stays in the core's cache while it is gathered, written and
        hashed (8 x 27 MB from the loopback S3 server: 0.22-0.26 s of client CPU with 1 MB chunks,
        0.25-0.31 s with 8 MB ones).

        A failure in the middle of the body raises :class:`RemoteError`; what was yielded before
        must then be thrown away by the caller (:mod:`fastload.records.remote.fetch` does). In a forked
        process (:func:`forked_from_client`) the helper reads the range whole and it comes as one
        chunk (:func:`fastload.records.remote.fetch.fetch_to_file` downloads in the helper instead).
        """
        if forked_from_client():
            what = "GET" if end is None else f"GET bytes {start}-{end}"
            yield memoryview(self._in_helper(what, key, RemoteStore._read, key, start, end))
            return
        import obstore

        options: Any = {"range": (int(start or 0), int(end))} if end is not None else None
        try:
            result = obstore.get(self.store, key, options=options)
            for piece in result.stream(min_chunk_size=chunk):
                yield memoryview(piece)
        except GeneratorExit:
            raise
        except Exception as exc:
            raise self._error(exc, key, "GET" if end is None else f"GET bytes {start}-{end}") from exc

    def _read(self, key: str, start: int | None, end: int | None) -> bytes:
        """The object (or bytes ``[start, end)``) in one piece (what ``stream`` hands a helper)."""
        return b"".join(bytes(piece) for piece in self.stream(key, start, end))

    def put_file(self, key: str, path: str) -> None:
        """Upload a local file (multipart for big ones; the object appears whole or not at all)."""
        if forked_from_client():
            return self._in_helper("PUT", key, RemoteStore.put_file, key, path)
        import pathlib

        import obstore

        try:
            obstore.put(self.store, key, pathlib.Path(path), chunk_size=16 << 20, max_concurrency=4)
        except Exception as exc:
            raise self._error(exc, key, "PUT") from exc

    def put_bytes(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Upload bytes (one request; the object appears whole or not at all)."""
        if forked_from_client():
            return self._in_helper("PUT", key, RemoteStore.put_bytes, key, bytes(data))
        import obstore

        try:
            obstore.put(self.store, key, bytes(data), use_multipart=False)
        except Exception as exc:
            raise self._error(exc, key, "PUT") from exc

    def delete(self, key: str) -> None:
        """Delete ``key`` (no error when it is absent)."""
        if forked_from_client():
            return self._in_helper("DELETE", key, RemoteStore.delete, key)
        import obstore

        try:
            obstore.delete(self.store, key)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise self._error(exc, key, "DELETE") from exc

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        try:
            self.head(key)
        except RemoteNotFound:
            return False
        return True

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        """Every object below ``prefix`` (recursively), keys relative to the root."""
        if forked_from_client():
            return self._in_helper("LIST", prefix, RemoteStore.list, prefix)
        import obstore

        out: list[ObjectInfo] = []
        try:
            for page in obstore.list(self.store, prefix=prefix or None, chunk_size=1000):
                for meta in page:
                    out.append(ObjectInfo(str(meta["path"]), int(meta["size"]), meta.get("e_tag")))
        except Exception as exc:
            raise self._error(exc, prefix, "LIST") from exc
        return out
