"""Frame sets: many model inputs on disk, as safetensors shards plus an index.

    with FrameWriter("frames/", meta={"config": "test"}) as w:
        for scene in range(4):
            for t in range(50):
                w.add({"img": img, "lidar2img": l2i, "can_bus": cb, "prev_bev": prev},
                      scene=scene, t=t)
    frames = Frames("frames/")
    frames[17]                      # one frame: {input name: array}, read without Ray
    for frame in frames: ...        # all of them, in order
    frames.to_ray_dataset()         # a Ray Data dataset of frames (needs ray[data])

On disk: ``frames.json`` (the index: each input's shape and dtype, the shards, which
frames each holds and its sha256, per-frame tags such as scene and time step, and
free-form ``meta``) and ``shard-NNNNN.safetensors`` files holding ``frames_per_shard``
frames each, every input stacked along a leading frame axis. Every file is written whole
or not at all, the index last. A shard is read lazily, one frame at a time, so a worker
only reads the frames it works on; its sha256 is checked when it is first opened.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BevirError
from ..extras import require
from ..fsutil import loads_json, save_arrays, sha256_file, write_json
from ..ir.serialize import check_document

FORMAT, VERSION = "bevir-frames", 1
INDEX = "frames.json"


class FrameSetError(BevirError):
    """A frame set that cannot be written or read as asked."""


class FrameIndexError(FrameSetError, IndexError):
    """A frame index that is not an integer, or not one of the frame set's."""


def _spec(arrays: Mapping[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    return {k: {"shape": list(a.shape), "dtype": a.dtype.name} for k, a in arrays.items()}


class FrameWriter:
    """Writes a frame set: :meth:`add` frames (each a dict of input name to array, all
    alike), :meth:`close` (or leave the ``with`` block) to write the index. The index is
    written last, so a frame set whose writing failed is not mistaken for a whole one."""

    def __init__(self, path: str | os.PathLike, frames_per_shard: int = 16,
                 meta: Mapping[str, Any] | None = None):
        if frames_per_shard < 1:
            raise FrameSetError(f"frames_per_shard must be >= 1, got {frames_per_shard}")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        if (self.path / INDEX).exists():
            raise FrameSetError(f"{self.path} already holds a frame set ({INDEX}); write to "
                                "an empty folder")
        self.frames_per_shard, self.meta = frames_per_shard, dict(meta or {})
        self.inputs: dict[str, dict[str, Any]] | None = None
        self.shards: list[dict[str, Any]] = []
        self.tags: list[dict[str, Any]] = []
        self._pending: list[dict[str, np.ndarray]] = []

    def add(self, frame: Mapping[str, Any], **tags: Any) -> int:
        """Append one frame (arrays or tensors); ``tags``: JSON values kept in the index
        (e.g. ``scene=3, t=12``). Returns the frame's index."""
        arrays = {k: _array(v) for k, v in frame.items()}
        spec = _spec(arrays)
        if self.inputs is None:
            self.inputs = spec
        elif spec != self.inputs:
            raise FrameSetError(f"frame {len(self.tags)} has inputs {spec}; the frame set "
                                f"holds {self.inputs}")
        try:
            json.dumps(tags)                # tags must be JSON: fail here, not at close
        except (TypeError, ValueError) as e:
            raise FrameSetError(f"frame {len(self.tags)}: tags must be JSON values ({e})") from None
        self._pending.append(arrays)
        self.tags.append(dict(tags))
        if len(self._pending) == self.frames_per_shard:
            self._flush()
        return len(self.tags) - 1

    def _flush(self) -> None:
        if not self._pending:
            return
        name = f"shard-{len(self.shards):05d}.safetensors"
        stacked = {k: np.stack([f[k] for f in self._pending]) for k in self._pending[0]}
        digest = save_arrays(stacked, self.path / name)
        first = sum(s["frames"] for s in self.shards)
        self.shards.append({"file": name, "first": first, "frames": len(self._pending),
                            "sha256": digest})
        self._pending = []

    def close(self) -> Frames:
        """Write the last shard and the index; returns the frame set."""
        self._flush()
        if self.inputs is None:
            raise FrameSetError(f"{self.path}: no frames were added")
        doc = {"format": FORMAT, "version": VERSION, "frames": len(self.tags),
               "inputs": self.inputs, "shards": self.shards, "tags": self.tags,
               "meta": self.meta}
        write_json(self.path / INDEX, doc)
        return Frames(self.path)

    def __enter__(self) -> FrameWriter:
        return self

    def __exit__(self, typ, exc, tb) -> None:
        if typ is None:
            self.close()


def _count(v: Any) -> int:
    """A count or index read from the index: a non-negative int (not a bool, a float, a
    string)."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ValueError(f"{v!r} is not a count")
    return v


def _array(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):                    # a torch tensor
        v = v.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(v))


class Frames(Sequence):
    """A frame set on disk (see the module docstring): a sequence of frames, each a dict
    of input name to array, read on demand. ``meta`` and ``tags[i]`` are the index's."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        index = self.path / INDEX
        if not index.is_file():
            raise FrameSetError(f"{self.path} is not a frame set (no {INDEX})")
        try:
            self._index = index.read_bytes()
        except OSError as e:
            raise FrameSetError(f"cannot read {index}: {e.strerror or e}") from None
        doc = loads_json(self._index, str(index), FrameSetError)
        check_document(doc, index, FORMAT, VERSION, FrameSetError)
        try:
            self.inputs = {k: (tuple(_count(d) for d in v["shape"]), np.dtype(v["dtype"]))
                           for k, v in doc["inputs"].items()}
            self.shards = [(str(s["file"]), _count(s["first"]), _count(s["frames"]),
                            s.get("sha256")) for s in doc["shards"]]
            self.count, self.tags = _count(doc["frames"]), list(doc["tags"])
            self.meta = dict(doc.get("meta") or {})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise FrameSetError(f"{index}: malformed index ({type(e).__name__}: {e})") from None
        self._check_shards(index)
        if len(self.tags) != self.count:
            raise FrameSetError(f"{index}: its tags do not hold {self.count} frames")
        self._open: tuple[int, Any] | None = None
        self._checked: set[int] = set()

    def _check_shards(self, index: Path) -> None:
        """Shards that hold frames 0, 1, ... in order, each at least one, all of them."""
        first = 0
        for name, start, n, digest in self.shards:
            if Path(name).name != name:
                raise FrameSetError(f"{index}: shard file {name!r} is not a plain file name")
            if start != first or n < 1:
                raise FrameSetError(f"{index}: shard {name} holds frames {start} to "
                                    f"{start + n - 1}; the shards before it end at {first - 1}")
            if digest is not None and not (isinstance(digest, str) and len(digest) == 64):
                raise FrameSetError(f"{index}: shard {name} has a malformed sha256")
            first += n
        if first != self.count:
            raise FrameSetError(f"{index}: its shards hold {first} frames, not {self.count}")

    @property
    def digest(self) -> str:
        """sha256 of the frame set's content: its index, which names each shard by sha256
        (a shard it does not name is hashed itself)."""
        h = hashlib.sha256(self._index)
        for name, _, _, digest in self.shards:
            h.update((digest or sha256_file(self.path / name)).encode())
        return h.hexdigest()

    def __len__(self) -> int:
        return self.count

    def index_of(self, i: Any) -> int:
        """Frame index ``i`` (negative: from the end) as 0..len-1; FrameIndexError when
        it is not an integer or out of range."""
        if not isinstance(i, (int, np.integer)) or isinstance(i, (bool, np.bool_)):
            raise FrameIndexError(f"frame indices are integers, got {type(i).__name__}")
        if not -self.count <= i < self.count:
            raise FrameIndexError(f"frame {i} out of range: {self.path} holds {self.count} "
                                  "frames")
        return int(i) % self.count

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:  # type: ignore[override]
        i = self.index_of(i)
        k = next(k for k, (_, first, n, _) in enumerate(self.shards) if first <= i < first + n)
        shard = self._shard(k)
        j = i - self.shards[k][1]
        return {name: self._read(shard, name, j, k) for name in self.inputs}

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(self.count):
            yield self[i]

    def _shard(self, k: int):
        if self._open is None or self._open[0] != k:
            from safetensors import safe_open
            name, _, frames, digest = self.shards[k]
            path = self.path / name
            try:
                if digest is not None and k not in self._checked:
                    if sha256_file(path) != digest:
                        raise FrameSetError(f"{path}: not the shard the index names (its "
                                            "sha256 differs: replaced or damaged)")
                    self._checked.add(k)
                shard = safe_open(str(path), framework="numpy")
                held = {key: shard.get_slice(key).get_shape()[0] for key in shard.keys()}
            except FrameSetError:
                raise
            except Exception as e:          # missing or damaged file: say which
                raise FrameSetError(f"{path}: cannot read shard ({type(e).__name__}: "
                                    f"{e})") from None
            if sorted(held) != sorted(self.inputs):
                raise FrameSetError(f"{path}: holds inputs {sorted(held)}; the index says "
                                    f"{sorted(self.inputs)}")
            if set(held.values()) != {frames}:
                raise FrameSetError(f"{path}: holds {held} frames per input; the index "
                                    f"says {frames}")
            self._open = (k, shard)
        return self._open[1]

    def _read(self, shard, name: str, j: int, k: int) -> np.ndarray:
        shape, dtype = self.inputs[name]
        try:
            a = shard.get_slice(name)[j]
        except Exception as e:
            raise FrameSetError(f"{self.path / self.shards[k][0]}: no frame {j} of "
                                f"'{name}' ({type(e).__name__}: {e})") from None
        if a.shape != shape or a.dtype != dtype:
            raise FrameSetError(f"{self.path / self.shards[k][0]}: '{name}' is "
                                f"{a.dtype}{list(a.shape)}, the index says {dtype}{list(shape)}")
        return a

    def __reduce__(self):                       # workers reopen the files themselves
        return (Frames, (str(self.path),))

    def __repr__(self) -> str:
        return f"Frames({str(self.path)!r}, {self.count} frames, inputs {list(self.inputs)})"

    def to_ray_dataset(self):
        """A Ray Data dataset with one row per frame: ``frame`` (its index) and every
        input. The frames are read in Ray's workers."""
        ray_data = require("ray.data")
        path = str(self.path)

        def read(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            frames = Frames(path)
            rows = [frames[int(i)] for i in batch["frame"]]
            return {"frame": batch["frame"],
                    **{k: np.stack([r[k] for r in rows]) for k in frames.inputs}}

        items = [{"frame": i} for i in range(self.count)]
        return ray_data.from_items(items).map_batches(read, batch_format="numpy")
