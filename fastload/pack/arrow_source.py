"""Write stage, input side: Hugging Face parquet files and ``save_to_disk`` folders streamed as samples.

- **parquet**: a ``.parquet`` file or a folder of them (found at any depth, in sorted order), local
  or in object storage (read by ranges: footer, then each row group's columns). A folder laid out
  by split as the Hub lays them out (``data/train-00000-of-00002.parquet``, ``train/0000.parquet``)
  takes ``--split`` (default ``train`` when it holds several splits).
- **hf-disk**: a folder written by ``datasets.Dataset.save_to_disk`` (``state.json`` and Arrow
  stream files), or by ``DatasetDict.save_to_disk`` (``dataset_dict.json``, one such folder per
  split: ``--split``, default ``train``). The Arrow files are read, not memory-mapped (a file
  truncated under a mapping kills the process with SIGBUS; a short read is an error to report);
  an Arrow stream tells its row count only at its end, so ``--shards N`` is refused for it.

The image column (``--image-column``, default ``image``) holds ``{bytes, path}`` structs as
``datasets`` writes its ``Image`` feature, or plain binary. The label column (``--label-column``,
default ``label``; ``none`` for unlabeled data) holds integers (a ``ClassLabel``: its names, from
the ``huggingface`` schema metadata or ``dataset_info.json``, become the manifest's classes), other
numbers, lists of numbers, or class-name strings (numbered in sorted order: a first pass reads the
label column alone). Rows are read a row group (an Arrow record batch) at a time, so memory stays
bounded whatever the size of the input; image bytes are handed on as zero-copy views of the
decoded column. A null image cell, null image bytes or a bad label is a bad entry named by file
and row (``train-00000-of-00002.parquet: row 17``, rows counted from 0 in each file).
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fastload.errors import UserError
from fastload.pack.parquet_pages import NotPlain, PlainPages, plain_column
from fastload.pack.sample_labels import LabelError, Labels
from fastload.pack.stream_sample import Sample
from fastload.pack.tar_stream import ChunkPool

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ArrowSource"]

_SPLITS = ("train", "validation", "valid", "val", "test", "dev", "eval")
_BATCH_ROWS = 64  # rows decoded at a time (the memory a sample's view keeps alive)
# Parquet image bytes decoded at a time, about one data page: Arrow's binary builder grows by
# reallocation page by page, so a batch of several pages is copied again as it grows, into fresh
# memory (2,000 ImageNet-like images: 64-row batches cost a fifth more CPU than 12-row ones).
_BATCH_BYTES = 1 << 20
# Parquet read size of a remote file (one ranged GET each). Few, big reads: each gives up the GIL
# and must win it back from the converter threads.
_READ_BUFFER = 8 << 20
# Of a local file: page headers are read through a buffer this small, so each page (larger) is read
# straight into its own buffer; through a bigger buffer, Arrow copies every page out of it once more
# (a tenth of a parquet pack's CPU time).
_LOCAL_READ_BUFFER = 64 << 10


def _pyarrow() -> Any:
    # The parquet reader alone: ``pyarrow.parquet``'s wrapper also imports ``pyarrow.fs`` with its
    # cloud filesystems and ``ssl`` (~10 ms of CPU and 400 page faults more per command).
    try:
        import pyarrow as pa
        import pyarrow._parquet
    except ImportError:
        raise UserError("parquet and hf-disk input need pyarrow: pip install 'fastload[ingest]'") from None
    return pa


def _memory_pool(pa: Any) -> Any:
    """The memory pool the image columns are decoded into: jemalloc's where pyarrow has it, else the C library's.

    A streamed read frees every batch soon after decoding it, so the pool must hand the same memory
    out again instead of fresh pages. Arrow's default pool (mimalloc) maps its arena for
    transparent huge pages and returns freed segments to the system after a few milliseconds: each
    new batch faulted fresh 2 MB pages, zeroed whole (2,000 ImageNet-like images: 0.48 s of system
    CPU time for the whole pack, against 0.25 s with the C library's pool). The C library's pool
    has no aligned ``realloc``: every time a column's data buffer grows or is trimmed to its size
    it is copied whole, twice per batch; jemalloc grows and trims in place and keeps freed memory
    for a second before returning it (decoding those images once: a third less ``memcpy``, 6,400
    page faults instead of 9,900). Linux wheels of pyarrow have jemalloc; others may not.
    """
    try:
        return pa.jemalloc_memory_pool()
    except (NotImplementedError, pa.ArrowException):
        return pa.system_memory_pool()


def _split_of(relative: str, candidates: tuple[str, ...]) -> str | None:
    """The split a file belongs to by the Hub's layouts: a folder named after it, or a name starting with it."""
    parts = relative.replace("\\", "/").split("/")
    for part in parts[:-1]:
        if part in candidates:
            return part
    for name in candidates:
        if re.match(rf"{re.escape(name)}(?:$|[-._ 0-9])", parts[-1]):
            return name
    return None


def _null_rows(column: Any) -> set[int]:
    """Rows of ``column`` that are null.

    Through ``to_pylist``, not ``to_numpy``: pyarrow converts a boolean array to numpy through
    pandas, whose import costs more CPU than the whole pack of a few thousand images.
    """
    if column.null_count == 0:
        return set()
    return {i for i, null in enumerate(column.is_null().to_pylist()) if null}


def _image_cells(column: Any) -> list[memoryview | None]:
    """The cells of an Arrow image column (structs ``{bytes, path}`` or binary): zero-copy views, None where null."""
    pa = _pyarrow()
    nulls = _null_rows(column)
    if pa.types.is_struct(column.type):
        column = column.field("bytes")  # (the struct's offset applied)
        nulls |= _null_rows(column)
    _, offsets_buf, data_buf = column.buffers()
    wide = pa.types.is_large_binary(column.type)
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if wide else np.int32)
    offsets = offsets[column.offset : column.offset + len(column) + 1].tolist()
    # Arrow exports its buffers as signed chars: unsigned, so a byte indexes as 0..255.
    data = memoryview(data_buf).cast("B") if data_buf is not None else memoryview(b"")
    return [None if i in nulls else data[offsets[i] : offsets[i + 1]] for i in range(len(column))]


def _label_values(table: Any, at: int) -> list[Any] | None:
    """Column ``at`` of a record batch or table as Python values (None: no such column, unlabeled data)."""
    return table.column(at).to_pylist() if table.num_columns > at else None


class _File:
    """One input file: how it is shown, its identity, and how to open it."""

    def __init__(self, shown: str, size: int, stamp: str, local: str | None, remote: tuple[Any, str] | None) -> None:
        self.shown, self.size, self.stamp, self.local, self.remote = shown, size, stamp, local, remote
        self.rows = 0
        self.groups: list[int] = []  # rows per row group (parquet)
        self.meta: Any = None  # its parquet footer, once read
        self.problem: str | None = None  # why the file cannot be read at all (its one bad entry)

    def open_random(self) -> Any:
        if self.local is not None:
            return self.local
        from fastload.pack.remote_read import RemoteFile

        store, key = self.remote  # type: ignore[misc]
        return RemoteFile(store, key, self.size)

    def open_stream(self) -> Any:
        pa = _pyarrow()
        if self.local is not None:
            return pa.OSFile(self.local, "r")
        from fastload.pack.remote_read import RemoteStream

        store, key = self.remote  # type: ignore[misc]
        return io.BufferedReader(RemoteStream(store, key), buffer_size=8 << 20)


class ArrowSource:
    """Parquet files or a ``save_to_disk`` folder as a :class:`fastload.pack.stream_sample.StreamSource`.

    Args:
        src: See the module docstring.
        kind: ``"parquet"`` or ``"hf-disk"``.
        image_column: ``--image-column`` (None: ``image``).
        label_column: ``--label-column`` (None: ``label``; ``"none"``: no labels).
        split: ``--split`` (None: ``train`` where the input has several splits).
        storage_options: Settings for a remote SRC.

    Raises:
        UserError: No files, a column that is missing or of another type, a split that is not there.
    """

    def __init__(
        self,
        src: str,
        *,
        kind: str,
        image_column: str | None = None,
        label_column: str | None = None,
        split: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        from fastload.records.remote.storage import is_remote_url

        self.kind = kind
        self.remote = is_remote_url(src)
        self.path = src if self.remote else os.path.abspath(src)
        self.split = split
        self._storage_options = storage_options
        self._info_features: dict[str, Any] | None = None
        if kind == "hf-disk":
            self.files = self._disk_files(src)
        else:
            self.files = self._parquet_files(src)
        if not self.files:
            raise UserError(f"{src}: no {'parquet' if kind == 'parquet' else 'Arrow'} files")
        stem = os.path.basename(src.rstrip("/"))
        stem = stem[: -len(".parquet")] if stem.lower().endswith(".parquet") else stem
        if self.split and kind == "hf-disk":
            stem = f"{stem}-{self.split}"
        self.name = re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip(".") or "data"
        schema = self._count_rows()
        self.total = sum(f.rows for f in self.files) if all(f.rows >= 0 for f in self.files) else None
        self.image_column = image_column or "image"
        self._check_image_column(schema)
        self.label_column = self._label_column(schema, label_column)
        self.labels = self._labels(schema)
        # Parquet pages read for their images: reused once no sample views them (the pages in flight).
        self._page_buffers = ChunkPool(keep=64)

    # --- files ----------------------------------------------------------------------------------

    def _store(self, url: str) -> Any:
        from fastload.records.remote.storage import RemoteStore

        return RemoteStore(url, self._storage_options)

    def _parquet_files(self, src: str) -> list[_File]:
        found: list[tuple[str, _File]] = []
        if self.remote:
            if src.lower().endswith(".parquet"):
                parent, key = src.rsplit("/", 1)
                store = self._store(parent)
                info = store.head(key)
                return [_File(src, info.size, info.etag or "", None, (store, key))]
            store = self._store(src)
            for obj in store.list():
                if obj.key.lower().endswith(".parquet"):
                    found.append(
                        (obj.key, _File(store.url_of(obj.key), obj.size, obj.etag or "", None, (store, obj.key)))
                    )
        elif os.path.isfile(src):
            st = os.stat(src)
            return [_File(os.path.abspath(src), st.st_size, str(st.st_mtime_ns), os.path.abspath(src), None)]
        else:
            root = os.path.abspath(src)
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for name in filenames:
                    if name.lower().endswith(".parquet"):
                        path = os.path.join(dirpath, name)
                        st = os.stat(path)
                        found.append(
                            (os.path.relpath(path, root), _File(path, st.st_size, str(st.st_mtime_ns), path, None))
                        )
        found.sort(key=lambda x: x[0])
        splits = {s for rel, _ in found if (s := _split_of(rel, _SPLITS)) is not None}
        if self.split is not None:
            chosen = [f for rel, f in found if _split_of(rel, (self.split,)) == self.split]
            if not chosen:
                have = ", ".join(sorted(splits)) or "no split names in the file names"
                raise UserError(f"{src}: no parquet files of split {self.split!r} ({have})")
            return chosen
        if len(splits) > 1:
            if "train" not in splits:
                raise UserError(f"{src}: parquet files of several splits ({', '.join(sorted(splits))}): pass --split")
            self.split = "train"
            return [f for rel, f in found if _split_of(rel, _SPLITS) == "train"]
        return [f for _, f in found]

    def _read_json(self, folder: str, name: str) -> Any:
        try:
            if self.remote:
                from fastload.records.remote.storage import RemoteNotFound

                try:
                    return json.loads(self._store(folder).get_bytes(name))
                except RemoteNotFound:
                    return None
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                return None
            with open(path, "rb") as f:
                return json.load(f)
        except (ValueError, RecursionError):
            raise UserError(f"{folder}/{name}: not valid JSON") from None

    def _disk_files(self, src: str) -> list[_File]:
        folder = src.rstrip("/") if self.remote else os.path.abspath(src)
        splits = self._read_json(folder, "dataset_dict.json")
        if splits is not None:
            names = [str(s) for s in splits.get("splits", [])] if isinstance(splits, dict) else []
            split = self.split or "train"
            if split not in names:
                raise UserError(
                    f"{src}: a DatasetDict with splits {', '.join(names) or 'none'}; no split {split!r} (--split)"
                )
            self.split = split
            folder = f"{folder}/{split}" if self.remote else os.path.join(folder, split)
        elif self.split is not None:
            raise UserError(f"{src}: --split applies to a DatasetDict folder (one with dataset_dict.json)")
        state = self._read_json(folder, "state.json")
        if not isinstance(state, dict) or not isinstance(state.get("_data_files"), list):
            raise UserError(f"{folder}: no state.json listing the data files (not a save_to_disk folder)")
        info = self._read_json(folder, "dataset_info.json")
        if isinstance(info, dict) and isinstance(info.get("features"), dict):
            self._info_features = info["features"]
        files = []
        store = self._store(folder) if self.remote else None
        for entry in state["_data_files"]:
            name = entry.get("filename") if isinstance(entry, dict) else None
            if not isinstance(name, str) or "/" in name or name in ("", ".", ".."):
                raise UserError(f"{folder}/state.json: a data file entry is not a plain file name")
            if store is not None:
                obj = store.head(name)
                files.append(_File(store.url_of(name), obj.size, obj.etag or "", None, (store, name)))
            else:
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path)
                except OSError as exc:
                    raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
                files.append(_File(path, st.st_size, str(st.st_mtime_ns), path, None))
        return files

    def _count_rows(self) -> pa.Schema:
        """Rows per file and per row group from parquet footers (-1: unknown, an Arrow stream); the schema."""
        pa = _pyarrow()
        schema = None
        for f in self.files:
            try:
                if self.kind == "parquet":
                    reader = pa._parquet.ParquetReader()
                    reader.open(f.open_random(), pre_buffer=False)
                    meta = f.meta = reader.metadata
                    reader.close()
                    f.groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
                    f.rows = meta.num_rows
                    file_schema = meta.schema.to_arrow_schema()
                else:
                    with self._batches(f) as reader:
                        file_schema = reader.schema
                    f.rows = -1  # unknown until read (an Arrow stream has no footer)
            except (pa.ArrowException, OSError) as exc:
                # A file whose footer or schema cannot be read is one bad entry; the others are read.
                f.problem = f"cannot read ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
                f.rows, f.groups = 1, []
                continue
            if schema is None:
                schema = file_schema
            elif not file_schema.equals(schema, check_metadata=False):
                raise UserError(f"{f.shown}: its columns differ from {self.files[0].shown}'s")
        if schema is None:
            raise UserError(f"{self.files[0].shown}: {self.files[0].problem}")
        return schema

    def _batches(self, f: _File) -> Any:
        pa = _pyarrow()
        try:
            return pa.ipc.open_stream(f.open_stream(), memory_pool=_memory_pool(pa))
        except pa.ArrowInvalid:
            return pa.ipc.open_file(f.open_stream(), memory_pool=_memory_pool(pa))

    # --- columns --------------------------------------------------------------------------------

    def _check_image_column(self, schema: pa.Schema) -> None:
        pa = _pyarrow()
        if self.image_column not in schema.names:
            raise UserError(
                f"{self.files[0].shown}: no image column {self.image_column!r} (columns: {', '.join(schema.names)}); "
                "pass --image-column"
            )
        t = schema.field(self.image_column).type
        if pa.types.is_struct(t):
            t = t.field("bytes").type if t.get_field_index("bytes") >= 0 else None
        if t is None or not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
            raise UserError(
                f"{self.files[0].shown}: column {self.image_column!r} is {schema.field(self.image_column).type}; "
                "expected image structs {bytes, path} (datasets' Image feature) or binary"
            )

    def _label_column(self, schema: pa.Schema, given: str | None) -> str | None:
        if given is not None and given.lower() == "none":
            return None
        column = given or "label"
        if column not in schema.names:
            raise UserError(
                f"{self.files[0].shown}: no label column {column!r} (columns: {', '.join(schema.names)}); "
                "pass --label-column (or --label-column none for unlabeled data)"
            )
        return column

    def _features(self, schema: pa.Schema) -> dict[str, Any]:
        meta = schema.metadata or {}
        try:
            info = json.loads(meta.get(b"huggingface", b"{}"))
            features = info.get("info", {}).get("features")
        except (ValueError, AttributeError, RecursionError):
            features = None
        if isinstance(features, dict):
            return features
        return self._info_features or {}

    def _labels(self, schema: pa.Schema) -> Labels:
        pa = _pyarrow()
        if self.label_column is None:
            return Labels(kind="number", width=1)
        feature = self._features(schema).get(self.label_column)
        if (
            isinstance(feature, dict)
            and feature.get("_type") == "ClassLabel"
            and isinstance(feature.get("names"), list)
        ):
            return Labels([str(n) for n in feature["names"]])
        t = schema.field(self.label_column).type
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
            return Labels(sorted(self._all_names()))
        return Labels()

    def _all_names(self) -> set[str]:
        """Every class name of the label column (read alone: the first of the two passes)."""
        pa = _pyarrow()
        names: set[str] = set()
        for index, f in enumerate(self.files):
            if f.problem is not None:
                continue
            try:
                for batch, _ in self._file_batches(index, [self.label_column], 0):
                    names.update(v for v in batch.column(0).to_pylist() if isinstance(v, str))
            except (pa.ArrowException, OSError):
                pass  # reported as a bad entry when its rows are read
        return names

    # --- rows -----------------------------------------------------------------------------------

    def _parquet_reader(self, f: _File) -> Any:
        """Arrow's reader of parquet file ``f`` (its footer as read when the rows were counted)."""
        pa = _pyarrow()
        # Pages are read and decoded as the batches are taken, a few megabytes at a time, instead
        # of a whole row group at once (2,000 ImageNet-like images in two 100 MB row groups: peak
        # RSS 138 MB instead of 436 MB, a tenth of the system time for fresh pages).
        buffer = _LOCAL_READ_BUFFER if f.local is not None else _READ_BUFFER
        # The reader ParquetFile wraps, made here to take the memory pool (ParquetFile's
        # constructor does not).
        pf = pa._parquet.ParquetReader(memory_pool=_memory_pool(pa))
        # The footer read when the rows were counted: not read and parsed again.
        pf.open(f.open_random(), pre_buffer=False, buffer_size=buffer, metadata=f.meta)
        return pf

    @staticmethod
    def _leaves(pf: Any, columns: list[Any]) -> list[int]:
        """The leaf columns of each top-level column of ``columns``, in the order asked."""
        return [i for name in columns for i, path in enumerate(pf.column_paths) if path[0] == name]

    def _group_batches(self, pf: Any, group: int, leaves: list[int], skip: int) -> Iterator[tuple[Any, int]]:
        """``(record batch of leaves, its first row in the group)`` of row group ``group``, from row ``skip`` on."""
        # Arrow's own threads would only compete with the converter threads.
        batches = pf.iter_batches(
            self._batch_rows(pf.metadata.row_group(group)), row_groups=[group], column_indices=leaves, use_threads=False
        )
        row = 0
        for batch in batches:
            n = batch.num_rows
            if skip < row + n:
                first = max(skip, row)
                yield (batch.slice(first - row) if first > row else batch), first
            row += n

    def _file_batches(self, index: int, columns: list[Any], skip: int) -> Iterator[tuple[Any, int]]:
        """``(record batch of columns, row of its first row)`` of file ``index``, from row ``skip`` on."""
        f = self.files[index]
        if self.kind == "parquet":
            pf = self._parquet_reader(f)
            leaves = self._leaves(pf, columns)
            row = 0
            for group, rows in enumerate(f.groups):
                if skip < row + rows:
                    for batch, first in self._group_batches(pf, group, leaves, max(0, skip - row)):
                        yield batch, row + first
                row += rows
            return
        row = 0
        left = skip
        with self._batches(f) as reader:
            for batch in reader:
                n = batch.num_rows
                if left < n:
                    picked = batch.select(columns)
                    yield picked.slice(left) if left else picked, row + left
                row += n
                left = max(0, left - n)

    def _cells(self, index: int, skip: int) -> Iterator[tuple[int, list[Any], list[Any] | None]]:
        """``(row, image cells, label values)`` of file ``index`` from row ``skip`` on, a page or a batch at a time.

        A cell is a view of the image bytes, or None for a null cell. The image column of a local
        parquet file in the form :mod:`fastload.pack.parquet_pages` reads (what ``datasets`` writes)
        is read page by page there, its images left in the pages read; any other row group, or the
        rest of one that turns out otherwise, is read by Arrow.
        """
        f = self.files[index]
        columns = [self.image_column] + ([self.label_column] if self.label_column else [])
        if self.kind != "parquet":
            for batch, row in self._file_batches(index, columns, skip):
                yield row, _image_cells(batch.column(0)), _label_values(batch, 1)
            return
        pf = self._parquet_reader(f)
        leaves = self._leaves(pf, columns)
        labels = self._leaves(pf, [self.label_column]) if self.label_column else []
        image = self._image_leaf(pf)
        pages = PlainPages(f.local, self._page_buffers) if f.local is not None and image is not None else None
        try:
            row = 0
            for group, rows in enumerate(f.groups):
                left = skip - row
                if left >= rows:
                    row += rows
                    continue
                left = max(0, left)
                span = None
                if pages is not None:
                    meta = f.meta.row_group(group)
                    span = plain_column(meta.column(image), f.meta.schema.column(image), f.size)
                if span is not None and span.rows == rows:
                    values = (
                        _label_values(pf.read_row_group(group, column_indices=labels, use_threads=False), 0)
                        if labels
                        else None
                    )
                    try:
                        assert pages is not None
                        for first, cells in pages.pages(span, left):
                            yield row + first, cells, values[first : first + len(cells)] if values is not None else None
                            left = first + len(cells)
                    except NotPlain as exc:
                        left = max(left, exc.row)  # Arrow reads on from there (and reports damage)
                    else:
                        row += rows
                        continue
                for batch, first in self._group_batches(pf, group, leaves, left):
                    yield row + first, _image_cells(batch.column(0)), _label_values(batch, 1)
                row += rows
        finally:
            if pages is not None:
                pages.close()

    def _image_leaf(self, pf: Any) -> int | None:
        """The leaf column of the image bytes (``image.bytes`` of a struct, else the column itself)."""
        for i, path in enumerate(pf.column_paths):
            if tuple(path) in ((self.image_column, "bytes"), (self.image_column,)):
                return i
        return None

    def _batch_rows(self, group: Any) -> int:
        """Rows per batch of a parquet row group: about :data:`_BATCH_BYTES` of images, at most :data:`_BATCH_ROWS`."""
        nbytes = 0
        for i in range(group.num_columns):
            column = group.column(i)
            if column.path_in_schema.split(".", 1)[0] == self.image_column:
                nbytes += column.total_uncompressed_size
        per_row: int = nbytes // max(1, group.num_rows)
        return max(1, min(_BATCH_ROWS, _BATCH_BYTES // max(1, per_row)))

    def identity(self) -> list[str]:
        return [f"{f.shown}\t{f.size}\t{f.stamp}" for f in self.files]

    def describe(self) -> dict[str, Any]:
        return {
            "files": len(self.files),
            "first_file": self.files[0].shown,
            "split": self.split,
            "image_column": self.image_column,
            "label_column": self.label_column,
        }

    def samples(self, position: int, cursor: dict[str, Any] | None) -> Iterator[Sample]:
        """Samples from ``cursor`` (``{"file": i, "row": r}``) on, else from global row ``position``.

        A file that cannot be read on (damaged pages, a cut file) is a bad entry named by the file
        and the rows after its last good one; the other files are read as usual.
        """
        pa = _pyarrow()
        if cursor is not None:
            first, skip = int(cursor["file"]), int(cursor["row"])
        else:
            first, skip = 0, position
            while first < len(self.files) and 0 <= self.files[first].rows <= skip:
                skip -= self.files[first].rows
                first += 1
        for index in range(first, len(self.files)):
            done = skip if index == first else 0
            if self.files[index].problem is not None:
                yield Sample(
                    self.files[index].shown, reason=self.files[index].problem, after={"file": index + 1, "row": 0}
                )
                continue
            try:
                for row, cells, values in self._cells(index, done):
                    yield from self._rows(index, row, cells, values)
                    done = row + len(cells)
            except (pa.ArrowException, OSError) as exc:
                text = str(exc).split("\n", 1)[0]
                yield Sample(
                    f"{self.files[index].shown}: row {done} on",
                    reason=f"cannot read ({text}); the rest of this file is skipped",
                    after={"file": index + 1, "row": 0},
                )

    def _rows(self, index: int, row: int, cells: list[Any], values: list[Any] | None) -> Iterator[Sample]:
        """The samples of rows ``row, row + 1, ...`` of file ``index``: image views, labels, bad entries by row."""
        shown = self.files[index].shown
        labels = self.labels
        # A value's labels, once it gave good ones: they stay the same (the label state only settles
        # on the first good label and numbers new names). Keyed by type too: True, 1 and 1.0 differ.
        known: dict[tuple[type, Any], tuple[float, ...]] = {}
        for i, cell in enumerate(cells):
            name = f"{shown}: row {row + i}"
            after = {"file": index, "row": row + i + 1}
            if cell is None:
                yield Sample(name, reason="null image cell (no image bytes)", after=after)
                continue
            if values is None:
                yield Sample(name, cell, (0.0,), after=after)
                continue
            value = values[i]
            key = (type(value), value) if isinstance(value, (int, str)) else None
            label = known.get(key) if key is not None else None
            if label is None:
                try:
                    label = labels.value(value)
                except LabelError as exc:
                    yield Sample(name, reason=str(exc), after=after)
                    continue
                if key is not None:
                    known[key] = label
            yield Sample(name, cell, label, after=after)
