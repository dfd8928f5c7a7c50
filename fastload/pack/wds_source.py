"""Write stage, input side: WebDataset tar shards streamed as samples, each tar read once, front to back.

SRC is a ``.tar`` file (also ``.tar.gz`` / ``.tgz`` / ``.tar.bz2`` / ``.tar.xz``), a folder of them
(the tars at its top, in sorted order), a brace pattern (``train-{000000..000146}.tar``, expanded
in order by ``braceexpand``, the package ``webdataset`` uses) or a remote URL of any of these
(``s3://bucket/train-{000000..000146}.tar``, a prefix holding tars), read in place through the
storage client (:mod:`fastload.pack.remote_read`).

Samples follow WebDataset's rules: consecutive members with the same key (the path up to the
first dot of the file name) form one sample, keyed by the lower-cased rest (``jpg``, ``cls``,
``json``, ``seg.png``); names starting and ending with ``__`` and members that are not regular files
are left out; a sample never spans two tars. The image is the first of the ``jpg``, ``jpeg``,
``png``, ``webp`` members (``--image-key`` picks another); the label comes from ``--label-key``:
a member (``cls``: text holding an integer or a class name) or a field of the ``json`` member
(``json.label``, ``json.class_name``; ``json.a.b`` for nested objects). Without ``--label-key``,
``cls`` when the first sample has it, else ``json.label``.

Bad entries are named by tar and member (``train-000003.tar:000123.jpg``): a sample without an
image member, a duplicated member, a label that is missing or unusable, a truncated or damaged tar
(from the damaged header on, the rest of that tar is skipped and reported at its byte offset).
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import re
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fastload.errors import UserError
from fastload.pack.input_format import TAR_SUFFIXES, has_braces, is_tar_name
from fastload.pack.sample_labels import LabelError, Labels
from fastload.pack.stream_sample import Sample
from fastload.pack.tar_stream import BLOCK, CHUNK, ChunkPool, TarError, TarMember, TarReader
from fastload.records import recordio

__all__ = ["IMAGE_KEYS", "WdsSource", "group_samples"]

#: The members that hold the image, in order of preference, when ``--image-key`` is not given.
IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
_KEY_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_META = re.compile(r"__[^/]*__($|/)")
_READ = 4 << 20
_TEXT_LABELS_KEPT = 1 << 16  # distinct cls texts cached (classes; per-sample values stop filling it)


def _expand(pattern: str) -> list[str]:
    try:
        import braceexpand
    except ImportError:
        raise UserError("brace patterns need braceexpand: pip install 'fastload[ingest]'") from None
    return list(braceexpand.braceexpand(pattern))


def group_samples(members: Iterator[TarMember]) -> Iterator[tuple[str, dict[str, TarMember], list[str], int]]:
    """WebDataset's grouping: ``(key, members by suffix, duplicated names, offset of its first member)``.

    When reading the members fails (a damaged tar), the sample being gathered is handed out first
    (with the members read so far), then the error is raised.
    """
    key: str | None = None
    group: dict[str, TarMember] = {}
    duplicates: list[str] = []
    start = 0
    try:
        for member in members:
            # _META is anchored at the start: the cheap prefix test spares most names the regex.
            if not member.regular or (member.name.startswith("__") and _META.match(member.name)):
                continue
            m = _KEY_SPLIT.match(member.name)
            if m is None:
                continue
            prefix, suffix = m.group(1), m.group(2).lower()
            if prefix != key:
                if key is not None:
                    yield key, group, duplicates, start
                key, group, duplicates, start = prefix, {}, [], member.offset
            if suffix in group:
                duplicates.append(member.name)
            else:
                group[suffix] = member
    except Exception:
        if key is not None:
            yield key, group, duplicates, start
        raise
    if key is not None:
        yield key, group, duplicates, start


class _Tar:
    """One tar of the input: where it is, how big, and how to read it from an offset."""

    def __init__(self, shown: str, size: int, stamp: str, opener: Callable[[int], io.RawIOBase]) -> None:
        self.shown, self.size, self.stamp, self.opener = shown, size, stamp, opener
        low = shown.lower()
        self.compression = (
            "gz"
            if low.endswith((".gz", ".tgz"))
            else "bz2"
            if low.endswith((".bz2", ".tbz2"))
            else "xz"
            if low.endswith((".xz", ".txz"))
            else None
        )

    def reader(self, offset: int) -> tuple[io.RawIOBase, io.BufferedIOBase | io.RawIOBase]:
        """``(file to close, stream to read)`` for the archive's bytes from ``offset`` on."""
        if self.compression is None:
            raw = self.opener(offset)
            return raw, raw
        raw = self.opener(0)
        opened = {"gz": gzip.GzipFile, "bz2": bz2.BZ2File, "xz": lzma.LZMAFile}[self.compression]
        unpacked: io.BufferedIOBase = opened(fileobj=raw)
        left = offset
        while left:  # a compressed stream has no random access: decompress up to the offset
            piece = unpacked.read(min(left, _READ))
            if not piece:
                break
            left -= len(piece)
        return raw, unpacked


class WdsSource:
    """WebDataset tars as a :class:`fastload.pack.stream_sample.StreamSource`.

    Args:
        src: See the module docstring.
        image_key: ``--image-key`` (None: the first of :data:`IMAGE_KEYS`).
        label_key: ``--label-key`` (None: ``cls`` or ``json.label`` from the first sample; ``"none"``).
        storage_options: Settings for a remote SRC.

    Raises:
        UserError: No tars, a tar that cannot be opened, or no label key to be found.
    """

    kind = "wds"
    total: int | None = None  # a tar tells its sample count only at its end

    def __init__(
        self,
        src: str,
        *,
        image_key: str | None = None,
        label_key: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        from fastload.records.remote.storage import is_remote_url

        self.remote = is_remote_url(src)
        self.path = src if self.remote else os.path.abspath(src)
        self.tars = self._remote_tars(src, storage_options) if self.remote else self._local_tars(src)
        if not self.tars:
            raise UserError(f"{src}: no tar files")
        base = src.split("{", 1)[0] if has_braces(src) else src
        stem = os.path.basename(base.rstrip("/"))
        for suffix in TAR_SUFFIXES:
            if stem.lower().endswith(suffix):
                stem = stem[: -len(suffix)]
        self.name = re.sub(r"[^A-Za-z0-9._-]", "_", stem.rstrip("-_.")).lstrip(".") or "data"
        self.image_key = image_key.lower() if image_key else None
        self.label_key = self._label_key(label_key)
        self.labels = Labels(kind="number", width=1) if self.label_key == "none" else Labels()
        # A cls member's text -> its labels. Labels only narrow as samples are read (the kind and
        # width are fixed by the first label; a class keeps its number), so a text that gave labels
        # once gives the same ones again: the cache spares the decode and parse per sample (8,000
        # samples of 10 classes: 34 ms of the reader thread's ~190 ms).
        self._text_labels: dict[bytes, tuple[float, ...]] = {}

    # --- the tars -----------------------------------------------------------------------------

    def _local_tars(self, src: str) -> list[_Tar]:
        if has_braces(src):
            paths = _expand(src)
        elif os.path.isdir(src):
            paths = sorted(os.path.join(src, n) for n in os.listdir(src) if is_tar_name(n))
        else:
            paths = [src]
        tars = []
        for path in paths:
            try:
                st = os.stat(path)
            except OSError as exc:
                raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
            if not os.path.isfile(path):
                raise UserError(f"{path}: not a regular file")

            def opener(offset: int, path: str = path) -> io.RawIOBase:
                f = open(path, "rb", buffering=0)  # noqa: SIM115 (closed by the reader's owner)
                if offset:
                    f.seek(offset)
                return f

            tars.append(_Tar(os.path.abspath(path), st.st_size, str(st.st_mtime_ns), opener))
        return tars

    def _remote_tars(self, src: str, storage_options: Mapping[str, Any] | None) -> list[_Tar]:
        from fastload.pack.remote_read import RemoteStream
        from fastload.records.remote.storage import RemoteStore

        if has_braces(src) or is_tar_name(src):
            urls = _expand(src) if has_braces(src) else [src]
            parent = urls[0].rsplit("/", 1)[0]
            if any(u.rsplit("/", 1)[0] != parent for u in urls):
                raise UserError(f"{src}: the tars of a remote brace pattern must share one prefix")
            store = RemoteStore(parent, storage_options)
            listed = {o.key: o for o in store.list() if "/" not in o.key}
            keys = [u.rsplit("/", 1)[1] for u in urls]
            missing = [k for k in keys if k not in listed]
            if missing:
                raise UserError(f"{store.url_of(missing[0])}: no such object ({len(missing)} of the tars are missing)")
            objects = [listed[k] for k in keys]
        else:
            store = RemoteStore(src, storage_options)
            objects = sorted((o for o in store.list() if "/" not in o.key and is_tar_name(o.key)), key=lambda o: o.key)
        tars = []
        for obj in objects:

            def opener(offset: int, key: str = obj.key) -> io.RawIOBase:
                return RemoteStream(store, key, offset)

            tars.append(_Tar(store.url_of(obj.key), obj.size, obj.etag or "", opener))
        return tars

    def identity(self) -> list[str]:
        return [f"{t.shown}\t{t.size}\t{t.stamp}" for t in self.tars]

    def describe(self) -> dict[str, Any]:
        return {
            "tars": len(self.tars),
            "first_tar": self.tars[0].shown,
            "image_key": self.image_key or list(IMAGE_KEYS),
            "label_key": self.label_key,
        }

    # --- labels -------------------------------------------------------------------------------

    def _label_key(self, given: str | None) -> str:
        if given is not None:
            return "none" if given.lower() == "none" else given
        raw, stream = self.tars[0].reader(0)
        try:
            first = next(group_samples(iter(TarReader(stream.read, chunk=1 << 16))), None)
        except TarError as exc:
            raise UserError(f"{self.tars[0].shown}: {exc}; pass --label-key (a member, json.FIELD or none)") from None
        finally:
            raw.close()
        if first is None:
            raise UserError(f"{self.tars[0].shown}: no samples in the first tar")
        key, group, _, _ = first
        if "cls" in group:
            return "cls"
        if "json" in group and group["json"].data is not None:
            try:
                if "label" in json.loads(bytes(group["json"].data)):
                    return "json.label"
            except (ValueError, TypeError, RecursionError):
                pass
        raise UserError(
            f"{self.tars[0].shown}: the first sample ({key}) has neither a cls member nor a json label; "
            "pass --label-key (a member such as cls, a json field such as json.class_name, or none)"
        )

    def _label(self, group: dict[str, TarMember]) -> tuple[float, ...]:
        key = self.label_key
        if key == "none":
            return (0.0,)
        member_key, _, fields = key.partition(".") if key.startswith("json.") else (key, "", "")
        member = group.get(member_key.lower())
        if member is None:
            raise LabelError(f"no {member_key} member for the label")
        if member.data is None:
            raise LabelError(f"label member: {member.problem}")
        if not fields:
            text = bytes(member.data)
            labels = self._text_labels.get(text)
            if labels is None:
                labels = self.labels.text(text)
                if len(self._text_labels) < _TEXT_LABELS_KEPT:
                    self._text_labels[text] = labels
            return labels
        try:
            value: Any = json.loads(bytes(member.data))
        except (ValueError, RecursionError):
            raise LabelError(f"{member_key} member is not valid JSON") from None
        for part in fields.split("."):
            if not isinstance(value, dict) or part not in value:
                raise LabelError(f"{member_key} member has no field {fields!r}")
            value = value[part]
        return self.labels.value(value)

    # --- samples ------------------------------------------------------------------------------

    def _sample(self, tar: _Tar, key: str, group: dict[str, TarMember], duplicates: list[str]) -> Sample:
        if duplicates:
            return Sample(f"{tar.shown}:{duplicates[0]}", reason="duplicate member name in the sample")
        if self.image_key is not None:
            image = group.get(self.image_key)
            wanted = self.image_key
        else:
            image = None
            for k in IMAGE_KEYS:
                image = group.get(k)
                if image is not None:
                    break
            wanted = ", ".join(IMAGE_KEYS)
        if image is None:
            members = ", ".join(sorted(group)) or "none"
            return Sample(f"{tar.shown}:{key}", reason=f"no image member ({wanted}; the sample has: {members})")
        name = f"{tar.shown}:{image.name}"
        if image.data is None:
            return Sample(name, reason=image.problem or "no data")
        try:
            labels = self._label(group)
        except LabelError as exc:
            return Sample(name, reason=str(exc))
        return Sample(name, image.data, labels)

    def samples(self, position: int, cursor: dict[str, Any] | None) -> Iterator[Sample]:
        """Samples from the cursor on (``{"tar": i, "offset": byte, "pax": {...}}``; None: the start)."""
        index, offset, pax = 0, 0, {}
        if cursor is not None:
            index, offset, pax = int(cursor["tar"]), int(cursor["offset"]), dict(cursor.get("pax") or {})
        chunks = ChunkPool()  # the tars' read buffers, reused from one tar to the next
        for i in range(index, len(self.tars)):
            tar = self.tars[i]
            start = offset if i == index else 0
            raw, stream = tar.reader(start)
            reader = TarReader(
                stream.read,
                # A small tar is read in one chunk of its size (a fresh chunk's pages cost CPU).
                chunk=CHUNK if tar.compression else max(BLOCK, min(CHUNK, tar.size - start)),
                readinto=stream.readinto,
                chunks=chunks,
                start=start,
                pax_global=pax if i == index else {},
                max_size=recordio.MAX_RECORD_LENGTH,
            )
            pending: Sample | None = None
            try:
                for key, group, duplicates, start in group_samples(iter(reader)):
                    if pending is not None:
                        pending.after = {"tar": i, "offset": start, "pax": dict(reader.pax_global)}
                        yield pending
                    pending = self._sample(tar, key, group, duplicates)
            except (TarError, EOFError, OSError, lzma.LZMAError, zlib.error) as exc:
                # The archive is damaged here: what was read stays, the rest of this tar is reported
                # (no resume point inside it: a rerun reads this tar again from the last one).
                if pending is not None:
                    yield pending
                pending = Sample(f"{tar.shown}", reason=f"{_reason(exc)}; the rest of this tar is skipped")
            finally:
                raw.close()
            if pending is not None:
                pending.after = {"tar": i + 1, "offset": 0, "pax": {}}
                yield pending


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TarError):
        return str(exc)
    if isinstance(exc, EOFError):
        return "truncated compressed tar"
    return f"cannot read the tar: {exc}"
