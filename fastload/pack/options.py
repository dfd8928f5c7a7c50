"""Write stage, what to do: :class:`PackOptions`, the validated options of a pack (``fastload pack``'s flags)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from fastload.errors import OnError
from fastload.pack.convert import DEFAULT_MAX_PIXELS
from fastload.pack.input_format import InputFormat
from fastload.pack.restart import RestartIndexConfig, VerifyPolicy

__all__ = ["DEFAULT_SHARD_SIZE", "PackOptions", "ShardFormat"]

DEFAULT_SHARD_SIZE = 512 << 20


class ShardFormat(str, enum.Enum):
    """Shard container."""

    RECORDIO = "recordio"
    LMDB = "lmdb"


@dataclass(frozen=True, kw_only=True)
class PackOptions:
    """Options of :func:`pack_folder` (the CLI flags of ``fastload pack``).

    Attributes:
        format: Shard container.
        shards: Number of shards (overrides ``shard_size``).
        shard_size: Target shard size in bytes (estimated from the source file sizes).
        workers: Reader/converter threads (default: all cores).
        resize: Shorter side to resize to (re-encoded at ``quality``); None: pass-through.
        quality: JPEG quality of re-encoded images.
        shuffle: Shuffle the record order with ``seed``.
        seed: Shuffle seed.
        name: Shard name prefix (default: the source's name).
        on_error: Skip bad files (listed in the manifest) or raise on the first (``"fail"`` is
            accepted for ``"raise"``, the spelling of ``--on-error fail``).
        overwrite: Replace a dataset already in OUT.
        restart_index: Add JPEG restart markers with the C++ engine's transcoder.
        verify: With ``restart_index``, check every transcoded image decodes identically.
        root: Image root for ``.lst`` paths.
        progress: Show a progress bar (only on a terminal).
        max_pixels: Largest ``width * height`` an image's header may declare; larger images
            (decompression bombs) are refused at pack time, from the header, in every mode (the
            decoder's default limit, so nothing packed is refused later at load).
        input_format: What SRC is (:class:`InputFormat` or its value: ``folder``, ``lst``, ``wds``,
            ``parquet``, ``hf-disk``, ``csv``, ``jsonl``); None: detected from SRC.
        image_key: WebDataset: the member holding the image (default: the first of ``jpg``,
            ``jpeg``, ``png``, ``webp`` in each sample).
        label_key: WebDataset: the label's member (``cls``) or a field of the ``json`` member
            (``json.label``, ``json.class_name``); ``"none"``: no labels (every record gets 0).
            Default: ``cls`` if the first sample has it, else ``json.label``.
        image_column: Parquet / ``hf-disk``: the image column (default ``image``): ``{bytes, path}``
            structs as ``datasets`` writes them, or plain binary.
        label_column: Parquet / ``hf-disk``: the label column (default ``label``); ``"none"``: no
            labels.
        split: The split of a ``DatasetDict`` folder or of a parquet folder laid out by split
            (default ``train``).
    """

    format: ShardFormat = ShardFormat.RECORDIO
    shards: int | None = None
    shard_size: int = DEFAULT_SHARD_SIZE
    workers: int | None = None
    resize: int | None = None
    quality: int = 95
    shuffle: bool = False
    seed: int = 0
    name: str | None = None
    on_error: OnError = OnError.SKIP
    overwrite: bool = False
    restart_index: bool = False
    verify: bool = False
    root: str | None = None
    progress: bool = True
    max_pixels: int = DEFAULT_MAX_PIXELS
    input_format: InputFormat | None = None
    image_key: str | None = None
    label_key: str | None = None
    image_column: str | None = None
    label_column: str | None = None
    split: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "format", ShardFormat(self.format))
        object.__setattr__(self, "on_error", OnError(self.on_error))
        if self.input_format is not None:
            try:
                object.__setattr__(self, "input_format", InputFormat(self.input_format))
            except ValueError:
                choices = ", ".join(f.value for f in InputFormat)
                raise ValueError(f"input_format={self.input_format!r} must be one of {choices}") from None
        for key in ("image_key", "label_key", "image_column", "label_column", "split"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{key}={value!r} must be a non-empty string")
        if self.shards is not None and self.shards < 1:
            raise ValueError(f"shards={self.shards} must be >= 1")
        if self.shard_size < 1:
            raise ValueError(f"shard_size={self.shard_size} must be >= 1 byte")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers={self.workers} must be >= 1")
        if self.resize is not None and self.resize < 1:
            raise ValueError(f"resize={self.resize} must be >= 1")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality={self.quality} must be in 1..100")
        if self.name is not None and (
            not self.name or not re.fullmatch(r"[A-Za-z0-9._-]+", self.name) or self.name.startswith(".")
        ):
            raise ValueError(f"name={self.name!r} must be letters, digits, '.', '_' or '-' (not starting with '.')")
        if not isinstance(self.max_pixels, int) or isinstance(self.max_pixels, bool) or self.max_pixels < 1:
            raise ValueError(f"max_pixels={self.max_pixels!r} must be a positive int")
        if self.verify and not self.restart_index:
            raise ValueError("verify=True only applies with restart_index=True")

    def restart_config(self) -> RestartIndexConfig:
        """The restart-marker transcoder's settings (a sample verified; every image with ``verify``)."""
        return RestartIndexConfig(verify=VerifyPolicy.ALL if self.verify else VerifyPolicy.SAMPLE)
