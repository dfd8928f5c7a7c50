"""Read stage, remote: a checksum-verified, retried download of one object into a local file.

A download is written under a temporary name in the destination's folder, checksummed while it
streams (the manifest's ``"<algo>:<hex>"``, XXH3-128 for current datasets), size- and
checksum-checked, and only then renamed onto its final name: a reader never sees a partial or
corrupted file under the final name. A failed attempt (connection dropped, server gone, timeout,
short body, checksum mismatch) is logged with the URL, its file is deleted, and the download is
retried after an exponential backoff with full jitter, up to ``attempts`` times; the last failure
raises :class:`FetchError` naming the URL and every reason. Request-level retries (5xx answers,
refused connections) also happen inside the client (:mod:`fastload.records.remote.storage`); these are the
retries of a whole object, which also cover a body cut off half way and a bad checksum.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastload.checksum import Checksum
from fastload.errors import FastloadError
from fastload.records.remote.storage import RemoteError, RemoteNotFound, RemoteStore, forked_from_client

__all__ = ["DEFAULT_RETRY", "ChecksumMismatch", "FetchError", "RetryPolicy", "fetch_to_file"]

log = logging.getLogger("fastload.remote")


class FetchError(FastloadError):
    """An object could not be downloaded intact after every attempt.

    Deliberately not an ``OSError``: a loader's ``on_error="skip"`` treats unreadable records as bad
    data and substitutes others; storage that stays unreachable is not bad data, it must stop the
    run with this message.
    """

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class ChecksumMismatch(FetchError):
    """The downloaded bytes do not have the manifest's checksum (or size)."""


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How a whole-object download is retried.

    Attributes:
        attempts: Downloads tried before giving up (>= 1).
        initial_backoff: Seconds before the second attempt; doubles each time (full jitter).
        max_backoff: Cap of one wait.
    """

    attempts: int = 6
    initial_backoff: float = 0.5
    max_backoff: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"attempts={self.attempts!r} must be an int >= 1")
        if not self.initial_backoff >= 0 or not self.max_backoff >= self.initial_backoff:
            raise ValueError(
                f"backoff must satisfy 0 <= initial_backoff ({self.initial_backoff}) "
                f"<= max_backoff ({self.max_backoff})"
            )

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return rng.uniform(0, min(self.max_backoff, self.initial_backoff * 2 ** (attempt - 1)))


DEFAULT_RETRY = RetryPolicy()


def _download_once(
    store: RemoteStore,
    key: str,
    tmp_fd: int,
    size: int | None,
    checksum: str | None,
    stop: threading.Event | None,
) -> int:
    algo = checksum.split(":", 1)[0] if checksum else None
    digest = Checksum(algo) if algo else None
    written = 0
    with os.fdopen(os.dup(tmp_fd), "wb", buffering=0) as f:
        f.seek(0)
        f.truncate()
        for chunk in store.stream(key):
            if stop is not None and stop.is_set():
                raise InterruptedError("download cancelled")
            if size is not None and written + len(chunk) > size:
                raise ChecksumMismatch(
                    f"{store.url_of(key)}: more than the {size} bytes the manifest lists", url=store.url_of(key)
                )
            f.write(chunk)
            if digest is not None:
                digest.update(chunk)
            written += len(chunk)
    url = store.url_of(key)
    if size is not None and written != size:
        raise ChecksumMismatch(f"{url}: {written} bytes arrived, the manifest lists {size} (partial download)", url=url)
    if digest is not None and digest.value() != checksum:
        raise ChecksumMismatch(f"{url}: checksum mismatch: got {digest.value()}, the manifest says {checksum}", url=url)
    return written


def fetch_to_file(
    store: RemoteStore,
    key: str,
    dest: str,
    *,
    size: int | None = None,
    checksum: str | None = None,
    policy: RetryPolicy = DEFAULT_RETRY,
    stop: threading.Event | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Download ``key`` into ``dest`` atomically, verified against ``size`` and ``checksum``.

    Args:
        store: Where the object lives.
        key: Its key below the store's root.
        dest: The final local path (its folder must exist; same filesystem for the rename).
        size: Expected bytes (None: not checked).
        checksum: Expected ``"<algo>:<hex>"`` (None: not checked).
        policy: Attempts and backoff.
        stop: When set, the download stops at the next chunk (raises ``InterruptedError``).
        sleep: The backoff's sleep (tests pass a fake one).

    Returns:
        Bytes written.

    Raises:
        FetchError: Every attempt failed; the message names the URL and each reason.
        RemoteNotFound: The object does not exist (not retried).
        InterruptedError: ``stop`` was set.
    """
    if forked_from_client():
        # The whole download runs in the helper process, which writes ``dest`` itself: the
        # shard's bytes never cross the pipe. ``stop`` is checked before it starts.
        from fastload.records.remote import spawned

        if stop is not None and stop.is_set():
            raise InterruptedError("download cancelled")
        try:
            return spawned.call(fetch_to_file, store, key, dest, size=size, checksum=checksum, policy=policy)
        except spawned.HelperLost as exc:
            raise FetchError(f"{store.url_of(key)}: {exc}", url=store.url_of(key)) from None
    url = store.url_of(key)
    folder = os.path.dirname(os.path.abspath(dest))
    rng = random.Random()
    reasons: list[str] = []
    last: BaseException | None = None
    tmp: str | None
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(dest) + ".", suffix=".part", dir=folder)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600 files; cached shards are read by every rank
        for attempt in range(1, policy.attempts + 1):
            try:
                written = _download_once(store, key, fd, size, checksum, stop)
            except RemoteNotFound:
                raise
            except (RemoteError, ChecksumMismatch) as exc:
                last = exc
                reasons.append(f"attempt {attempt}: {exc}")
                if attempt == policy.attempts:
                    break
                wait = policy.delay(attempt, rng)
                log.warning(
                    "fetching %s failed (%s); retrying in %.1f s (attempt %d of %d)",
                    url,
                    exc,
                    wait,
                    attempt + 1,
                    policy.attempts,
                )
                if stop is not None:
                    if stop.wait(wait):
                        raise InterruptedError("download cancelled") from None
                else:
                    sleep(wait)
                continue
            os.replace(tmp, dest)
            tmp = None
            return written
    finally:
        os.close(fd)
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    kind = ChecksumMismatch if isinstance(last, ChecksumMismatch) else FetchError
    raise kind(f"{url}: could not be downloaded intact in {policy.attempts} attempts: " + "; ".join(reasons), url=url)
