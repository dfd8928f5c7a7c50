"""Write stage to and from object storage: ``fastload pack`` with an ``s3://`` (``gs://``, ...) SRC or OUT.

The pack itself (local or ``--engine ray``) runs on local folders, so its atomic, resumable
work folder and its byte-identical output stay exactly as they are:

- a remote SRC that is a class-folder tree under a prefix is first downloaded into a build folder
  (files already there with the listed size are kept, so a rerun resumes), then packed from there;
  remote WebDataset tars and parquet files are read in place, streamed through the storage client
  (:mod:`fastload.pack.remote_read`), never downloaded;
- a remote OUT is packed into a build folder, then published: shards and their ``.idx`` files
  first (an object appears whole or not at all), then the index, then the manifest last, so
  readers see the dataset only once everything it lists is there. Files the remote manifest
  already lists with the same checksum and size are not uploaded again. An existing dataset at
  OUT from another pack is refused unless ``overwrite``; its manifest is deleted before the new
  shards go up, so it never mixes with them.

The build folder (default ``~/.cache/fastload/pack-build/<hash>``) is kept until the publish
succeeds, so a killed run resumes; with ``--engine ray`` on several nodes it must be on storage
every node sees.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastload.checksum import recorded_checksum
from fastload.errors import UserError
from fastload.pack.input_format import STREAMED, detect_format
from fastload.pack.options import PackOptions
from fastload.pack.result import PackResult
from fastload.records.manifest import INDEX_NAME, MANIFEST_NAME
from fastload.records.remote.fetch import fetch_to_file
from fastload.records.remote.storage import RemoteNotFound, RemoteStore, is_remote_url

__all__ = ["default_build_dir", "download_tree", "pack_remote", "publish"]


def default_build_dir(src: str, out: str) -> str:
    """``$XDG_CACHE_HOME/fastload/pack-build/<hash of SRC and OUT>``."""
    key = hashlib.sha256(f"{src}\n{out}".encode()).hexdigest()[:16]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "fastload", "pack-build", key)


def download_tree(store: RemoteStore, dest: str, *, threads: int = 8) -> int:
    """Download every object below ``store``'s root into ``dest`` (same relative paths).

    Returns:
        Objects downloaded (those already present with the listed size are kept).

    Raises:
        UserError: Nothing there, or a key that would leave ``dest``.
    """
    objects = store.list()
    if not objects:
        raise UserError(f"{store.url}: no objects (an empty or missing source)")
    todo = []
    for obj in objects:
        parts = obj.key.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise UserError(f"{store.url_of(obj.key)}: a key that would leave the download folder")
        path = os.path.join(dest, *parts)
        if not (os.path.isfile(path) and os.path.getsize(path) == obj.size):
            todo.append((obj, path))

    def one(job: tuple[Any, str]) -> None:
        obj, path = job
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fetch_to_file(store, obj.key, path, size=obj.size)

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fastload-download") as pool:
        list(pool.map(one, todo))
    return len(todo)


def _files(manifest: dict[str, Any]) -> list[tuple[str, str | None]]:
    """``(relative path, checksum)`` of a dataset's files other than the manifest, shards first."""
    out: list[tuple[str, str | None]] = []
    for entry in manifest.get("shards", []):
        name = str(entry["file"])
        key = f"{name}/data.mdb" if manifest.get("format") == "lmdb" else name
        out.append((key, recorded_checksum(entry)))
        if entry.get("index_file"):
            out.append((str(entry["index_file"]), recorded_checksum(entry, "index_")))
    index = manifest.get("index", {})
    out.append((str(index.get("file", INDEX_NAME)), recorded_checksum(index)))
    return out


def publish(folder: str, store: RemoteStore, *, overwrite: bool = False, threads: int = 4) -> int:
    """Upload a packed dataset folder to ``store``'s root, the manifest last.

    Returns:
        Files uploaded.

    Raises:
        UserError: Another dataset is at the destination and ``overwrite`` is False.
    """
    with open(os.path.join(folder, MANIFEST_NAME), "rb") as f:
        data = f.read()
    manifest = json.loads(data)
    try:
        remote = json.loads(store.get_bytes(MANIFEST_NAME))
    except RemoteNotFound:
        remote = None
    if remote is not None and remote.get("plan") != manifest.get("plan"):
        if not overwrite:
            raise UserError(
                f"{store.url}: holds another dataset ({remote.get('name')!r}); pass --overwrite to replace it"
            )
        store.delete(MANIFEST_NAME)  # from here on the old dataset is not readable, so never mixed
    already = {}
    if remote is not None:
        already = dict(_files(remote))
    todo = []
    for key, checksum in _files(manifest):
        path = os.path.join(folder, *key.split("/"))
        if checksum and already.get(key) == checksum:
            try:
                if store.head(key).size == os.path.getsize(path):
                    continue
            except RemoteNotFound:
                pass
        todo.append((key, path))
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fastload-upload") as pool:
        list(pool.map(lambda job: store.put_file(*job), todo))
    store.put_bytes(MANIFEST_NAME, data)
    return len(todo) + 1


def pack_remote(
    src: str,
    out: str,
    *,
    options: PackOptions,
    engine: str = "local",
    address: str | None = None,
    storage_options: dict[str, Any] | None = None,
    build_dir: str | None = None,
) -> PackResult:
    """Pack with a remote SRC and/or OUT through a local build folder (see the module docstring).

    Args:
        src: Local folder / ``.lst``, or URL of a class-folder tree.
        out: Local folder or URL.
        options: The pack's options (``overwrite`` applies to OUT).
        engine: ``"local"`` or ``"ray"``.
        address: The Ray cluster (``engine="ray"``).
        storage_options: Credentials and endpoint for the URLs.
        build_dir: Where to build (default :func:`default_build_dir`).

    Returns:
        The pack's result, with ``out`` the URL when OUT is remote.
    """
    fmt = options.input_format or detect_format(src, storage_options)
    streamed = fmt in STREAMED
    if streamed and engine == "ray":
        raise UserError(
            f"--engine ray packs folders and listings; {fmt.value} input is streamed by the local engine (threads)"
        )
    options = dataclasses.replace(options, input_format=fmt)
    build = build_dir or default_build_dir(src, out)
    os.makedirs(build, exist_ok=True)
    local_src = src
    if is_remote_url(src) and not streamed:  # tars and parquet are read in place, never downloaded
        local_src = os.path.join(build, "source", _tail(src))
        download_tree(RemoteStore(src, storage_options), local_src)
    local_out = out
    replace_remote = options.overwrite
    if is_remote_url(out):
        local_out = os.path.join(build, "packed")
        options = dataclasses.replace(options, overwrite=True)  # the build folder is this pack's own
    if engine == "ray":
        from fastload.pack.ray_engine import pack_with_ray

        result: PackResult = pack_with_ray(local_src, local_out, options=options, address=address)
    else:
        from fastload.pack.packer import pack_folder

        result = pack_folder(local_src, local_out, options=options, storage_options=storage_options)
    if is_remote_url(out):
        store = RemoteStore(out, storage_options)
        publish(local_out, store, overwrite=replace_remote)
        result = dataclasses.replace(result, out=store.url)
    shutil.rmtree(build, ignore_errors=True)
    return result


def _tail(url: str) -> str:
    """The last path component of a URL: the source's name, which names the shards."""
    return url.rstrip("/").rsplit("/", 1)[-1] or "data"
