"""Write stage, shard files: records into one shard after another, ``writev`` in big gathers.

Every byte is checksummed as it is written, and its writeback to disk is started early.

The calling thread writes the records in a deterministic order (so the same command always produces
the same bytes), a few megabytes per ``writev``, checksums what it wrote and starts its writeback to
disk early, so the per-shard fsync finds little left to do. Each finished shard is fsynced, renamed
into place and marked complete by its sidecar (:mod:`fastload.pack.work_folder`).
"""

from __future__ import annotations

import collections
import errno
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fastload.checksum import Checksum, checksum_bytes, checksum_file
from fastload.errors import OnError, UserError
from fastload.pack.convert import Converted
from fastload.pack.framing import BufferPool, FramedBatch, Prepared
from fastload.pack.options import PackOptions, ShardFormat
from fastload.pack.progress import Progress
from fastload.pack.work_folder import PARTIAL, USER_WRITE_ERRNOS, ShardDone, fsync_file, remove, write_done, write_error
from fastload.records import recordio
from fastload.records.durable import fsync_dir
from fastload.records.folder_tree import SourceItem
from fastload.records.lmdb_shard import LmdbShardWriter

__all__ = ["GatherFile", "ShardSink", "write_shards"]

_WRITEBACK_STEP = 32 << 20  # start the disk writes of every this many bytes while packing goes on
_sync_file_range: Any = None


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``[offset, offset + length)`` to disk now, without waiting.

    The fsync that completes a shard then only waits for the last few megabytes instead of the
    whole shard. Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; elsewhere nothing happens.
    """
    global _sync_file_range
    if _sync_file_range is None:
        _sync_file_range = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                _sync_file_range = fn
            except (OSError, AttributeError):
                pass
    if _sync_file_range:
        _sync_file_range(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE; a failure only costs time


class GatherFile:
    """The shard file as ``RecordIOWriter`` sees it: gathers chunks, writes ~4 MB per ``writev``.

    Each written batch is added to the shard's checksum (XXH3-128: a few milliseconds per hundred
    megabytes, so on the writing thread) and its disk writes are started at once, so the fsync
    that completes the shard only waits for the last few megabytes.
    """

    _MAX_IOV = 512  # below IOV_MAX (1024 on Linux)
    _MAX_BYTES = 4 << 20

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
        self._chunks: list[Any] = []
        self._pending = 0
        self.written = 0
        self._kicked = 0
        self._hash = Checksum()
        self._after: list[Any] = []  # run once the chunks gathered so far are written and checksummed

    def fileno(self) -> int:
        return self._fd

    def write(self, chunk: Any) -> int:
        self._chunks.append(chunk)
        n = len(chunk)
        self._pending += n
        if self._pending >= self._MAX_BYTES or len(self._chunks) >= self._MAX_IOV:
            self.flush()
        return n

    def writelines(self, chunks: Sequence[Any]) -> None:
        """:meth:`write` of each chunk, gathered a batch at a time (a gathered batch: two chunks per record)."""
        start = 0
        while start < len(chunks):
            part = chunks[start : start + self._MAX_IOV - len(self._chunks)]
            self._chunks += part
            self._pending += sum(map(len, part))
            start += len(part)
            if self._pending >= self._MAX_BYTES or len(self._chunks) >= self._MAX_IOV:
                self.flush()

    def after_flush(self, fn: Callable[[], object]) -> None:
        """Call ``fn()`` once everything written so far has left the gathered chunks (buffer reuse)."""
        self._after.append(fn)

    def flush(self) -> None:
        """Write the gathered chunks (short writes resumed), checksum them, start their writeback."""
        chunks, self._chunks = self._chunks, []
        if not chunks:
            return
        n = os.writev(self._fd, chunks)
        if n != self._pending:  # a short write: resume where it stopped
            views = [memoryview(c).cast("B") for c in chunks]
            while views:
                while views and n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                if views and n:
                    views[0] = views[0][n:]
                if views:
                    n = os.writev(self._fd, views)
                    if n == 0:
                        raise OSError(errno.EIO, "writev wrote nothing")
        self.written += self._pending
        self._pending = 0
        for chunk in chunks:
            self._hash.update(chunk)
        if self.written - self._kicked >= _WRITEBACK_STEP:
            _start_writeback(self._fd, self._kicked, self.written - self._kicked)
            self._kicked = self.written
        del chunks
        after, self._after = self._after, []
        for fn in after:
            fn()

    def checksum(self) -> str:
        """Flush and return the checksum of everything written (``"<algo>:<hex>"``)."""
        self.flush()
        return self._hash.value()

    def sync_and_close(self) -> None:
        os.fsync(self._fd)
        self.close()

    def close(self) -> None:
        """Idempotent (used on abort too)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class ShardSink:
    """Writes one shard's records into the work folder under ``.partial`` names."""

    def __init__(self, work_dir: str, number: int, file: str, start: int, fmt: ShardFormat, label_width: int) -> None:
        self.work_dir, self.number, self.file_name, self.start = work_dir, number, file, start
        self.fmt, self.label_width = fmt, label_width
        self.final = os.path.join(work_dir, file)
        self.partial = self.final + PARTIAL
        self.rows: dict[str, list[Any]] = {
            k: [] for k in ("offset", "id", "length", "data_offset", "parts", "labels", "checksum")
        }
        self.skipped: list[tuple[str, str]] = []
        self.kinds: dict[str, int] = collections.Counter()
        self.bytes_in = 0
        self.nbytes = 0
        remove(self.partial)
        if fmt is ShardFormat.RECORDIO:
            self.file = GatherFile(self.partial)
            self.writer = recordio.RecordIOWriter(self.file)
        else:
            self.lmdb = LmdbShardWriter(self.partial)

    def add(self, item: SourceItem, prepared: Prepared) -> None:
        if self.fmt is ShardFormat.RECORDIO:
            offset, parts = self.writer.write_framed(prepared.record, item.id)
        else:
            offset, parts = self.lmdb.write(prepared.record), 0
        self.nbytes += recordio.framed_size(prepared.length)
        for key, value in (
            ("offset", offset),
            ("id", item.id),
            ("length", prepared.length),
            ("data_offset", prepared.data_offset),
            ("parts", parts),
            ("labels", list(item.labels)),
            ("checksum", prepared.checksum),
        ):
            self.rows[key].append(value)

    def add_framed(self, batch: list[tuple[SourceItem, int]], framed: FramedBatch, pool: BufferPool) -> None:
        """Append a batch the engine framed whole: one write, the index rows extended at once.

        The batch's buffer goes back to ``pool`` once written.
        """
        items = [item for item, _ in batch]
        ids = [item.id for item in items]
        offsets = self.writer.write_records(framed.chunks, ids, framed.framed)
        buffer = framed.buffer
        if buffer is not None:
            self.file.after_flush(lambda: pool.give(buffer))
        self.nbytes += framed.nbytes
        self.bytes_in += sum(framed.sizes)
        self.kinds["pass"] += len(items)
        rows = self.rows
        rows["offset"] += offsets
        rows["id"] += ids
        rows["length"] += framed.lengths
        rows["data_offset"] += framed.head_lens
        rows["parts"] += [0] * len(items)
        rows["labels"] += [list(item.labels) for item in items]
        rows["checksum"] += framed.checksums

    def finish(self, end: int, cursor: dict[str, Any] | None = None) -> ShardDone:
        """Flush, fsync, rename into place, then write the sidecar that marks the shard complete.

        ``cursor``: where a streamed input goes on after ``end`` (kept in the sidecar for a resume).
        """
        entry: dict[str, Any] = {"file": self.file_name, "records": len(self.rows["id"])}
        if self.fmt is ShardFormat.RECORDIO:
            digest = self.file.checksum()
            self.file.sync_and_close()
            idx_name = os.path.splitext(self.file_name)[0] + ".idx"
            idx_data = self.writer.idx_bytes()
            idx_partial = os.path.join(self.work_dir, idx_name + PARTIAL)
            with open(idx_partial, "wb") as f:
                f.write(idx_data)
                f.flush()
                os.fsync(f.fileno())
            entry.update(
                bytes=self.writer.offset,
                checksum=digest,
                index_file=idx_name,
                index_bytes=len(idx_data),
                index_checksum=checksum_bytes(idx_data),
            )
            os.replace(idx_partial, os.path.join(self.work_dir, idx_name))
            os.replace(self.partial, self.final)
        else:
            self.lmdb.finish()
            data = os.path.join(self.partial, "data.mdb")
            fsync_file(data)
            entry.update(bytes=os.path.getsize(data), checksum=checksum_file(data))
            remove(self.final)
            os.replace(self.partial, self.final)
        fsync_dir(self.work_dir)
        done = ShardDone(
            self.work_dir,
            self.number,
            self.start,
            end,
            entry,
            self.rows,
            self.skipped,
            dict(self.kinds),
            self.bytes_in,
            cursor,
        )
        write_done(done)
        return done

    def abort(self) -> None:
        try:
            if self.fmt is ShardFormat.RECORDIO:
                self.file.close()
            else:
                self.lmdb.abort()
        except Exception:
            pass
        remove(self.partial)


def write_shards(
    work_dir: str,
    items: list[SourceItem],
    pos: int,
    number: int,
    shard_file: Callable[[int], str],
    stream: Iterable[tuple[list[tuple[SourceItem, int]], FramedBatch | list[tuple[Converted, int, Prepared | None]]]],
    options: PackOptions,
    edges: list[int] | None,
    label_width: int,
    progress: Progress,
    pool: BufferPool,
    cursor_at: Callable[[int], dict[str, Any] | None] | None = None,
) -> list[ShardDone]:
    """Consume converted items from ``pos`` on, cutting shards at ``edges`` or by size.

    ``cursor_at(end)``, for a streamed input: where reading goes on after item ``end`` (stored in
    the sidecar of the shard that ends there).
    """
    done: list[ShardDone] = []
    sink: ShardSink | None = None
    target = os.path.join(work_dir, shard_file(number))

    def finish(sink: ShardSink, end: int) -> ShardDone:
        return sink.finish(end, cursor_at(end) if cursor_at is not None else None)

    def open_sink() -> ShardSink:
        nonlocal target
        target = os.path.join(work_dir, shard_file(number))
        return ShardSink(work_dir, number, shard_file(number), pos, options.format, label_width)

    try:
        for batch, out in stream:
            if isinstance(out, FramedBatch):
                if sink is None:
                    sink = open_sink()
                fits = (
                    (sink.nbytes + out.nbytes <= options.shard_size)
                    if edges is None
                    else (pos + len(batch) <= edges[number + 1])
                )
                if fits:  # the usual pass-through case: the whole batch in one piece
                    sink.add_framed(batch, out, pool)
                    progress.step(sum(out.sizes), len(batch))
                    pos += len(batch)
                    if edges is not None and pos == edges[number + 1]:
                        done.append(finish(sink, pos))
                        sink, number = None, number + 1
                    continue
                out = out.whole_entries()  # a shard boundary falls inside the batch: record by record
            for (item, _), (result, nread, prepared) in zip(batch, out, strict=True):
                if (
                    prepared is not None
                    and sink is not None
                    and edges is None
                    and sink.rows["id"]
                    and sink.nbytes + recordio.framed_size(prepared.length) > options.shard_size
                ):
                    done.append(finish(sink, pos))
                    sink, number = None, number + 1
                if sink is None:
                    sink = open_sink()
                sink.bytes_in += nread
                if result.data is None:
                    if options.on_error is OnError.RAISE:
                        raise UserError(f"{item.shown}: {result.reason} (on_error='raise', --on-error fail)")
                    sink.skipped.append((item.shown, result.reason or "not stored"))
                else:
                    sink.kinds[result.kind or "pass"] += 1
                    if result.note:
                        sink.kinds[result.note] += 1
                    assert prepared is not None  # every stored image was framed
                    sink.add(item, prepared)
                progress.step(nread)
                pos += 1
                if edges is not None and pos == edges[number + 1]:
                    done.append(finish(sink, pos))
                    sink, number = None, number + 1
        if sink is not None:
            done.append(finish(sink, pos))
            sink = None
    except OSError as exc:
        if sink is not None:
            sink.abort()
        if exc.errno in USER_WRITE_ERRNOS:
            raise write_error(exc, target) from None
        raise
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    return done
