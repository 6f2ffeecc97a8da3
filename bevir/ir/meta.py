"""Metadata: typed annotations on graphs, nodes and values (``.meta``).

``graph.meta``, ``node.meta`` and ``value.meta`` are :class:`Meta` dicts. Analyses and
backend passes write their results there (``graph.meta["ranges"]`` holds the calibrated
ranges; partitioning writes ``node.meta["core"]``, memory planning ``value.meta["ocm"]``).
Meta is carried through :meth:`Graph.clone` (copied, so a clone's meta is independent),
:func:`compose`, rewrites and save/load; it never changes the default printed text.

A key is registered once, by the module that owns it (the IR imports no pass)::

    register_meta_key("core", int, doc="the core a node runs on (set by the partition pass)")

fixes its Python type (checked on assignment), how it is written (``to_json`` /
``from_json``; by default the value itself must be JSON: None, bool, int, float, str,
lists, str-keyed dicts, numpy arrays), how it is copied (``copy``, default
:func:`copy.deepcopy`), whether rewrites carry it (``survives_rewrite``) and how two
graphs' entries combine in :func:`compose` (``merge``). Unregistered keys are kept in
memory, copied, carried and saved when their value is JSON as above; a save refuses any
other value, naming the key and where it sits, instead of dropping it.
"""
from __future__ import annotations

import copy as _copy
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BevirError

#: marks a numpy array inside encoded meta (its payload lives beside the JSON)
ARRAY_TAG = "$array"


class MetaError(BevirError):
    """A meta entry has the wrong type, cannot be saved, or a saved one cannot be read."""


@dataclass(frozen=True)
class MetaKey:
    """What bevir knows about one meta key (see :func:`register_meta_key`)."""

    name: str
    type: type | tuple[type, ...]
    to_json: Callable[[Any], Any] | None = None
    from_json: Callable[[Any], Any] | None = None
    copy: Callable[[Any], Any] = _copy.deepcopy
    survives_rewrite: bool = False
    merge: Callable[[Any, Any, Mapping[str, str]], Any] | None = None
    doc: str = ""

    def check(self, value: Any) -> None:
        if not isinstance(value, self.type):
            want = (self.type.__name__ if isinstance(self.type, type)
                    else " or ".join(t.__name__ for t in self.type))
            raise MetaError(f"meta key '{self.name}' holds {want}, not {type(value).__name__}")


_KEYS: dict[str, MetaKey] = {}


def register_meta_key(name: str, type: type | tuple[type, ...],
                      to_json: Callable[[Any], Any] | None = None,
                      from_json: Callable[[Any], Any] | None = None, *,
                      copy: Callable[[Any], Any] | None = None, survives_rewrite: bool = False,
                      merge: Callable[[Any, Any, Mapping[str, str]], Any] | None = None,
                      doc: str = "") -> MetaKey:
    """Declare meta key ``name``: its type and how it is saved, copied, carried and merged.

    ``to_json(value)`` returns JSON (numpy arrays allowed at the leaves) and ``from_json``
    reads it back; ``merge(first, second, names)`` combines graph-level entries in
    :func:`compose` (``first`` may be None; ``names`` maps the second graph's value names
    to the composed graph's). Registering the same name again replaces the declaration
    (a module reloaded); keys are global, so choose names that say who owns them.
    """
    if (to_json is None) != (from_json is None):
        raise MetaError(f"meta key '{name}': give both to_json and from_json, or neither")
    key = MetaKey(name, type, to_json, from_json, copy or _copy.deepcopy, survives_rewrite,
                  merge, doc)
    _KEYS[name] = key
    return key


def meta_key(name: str) -> MetaKey | None:
    """The registered declaration of ``name``, or None."""
    return _KEYS.get(name)


def copy_entry(name: str, value: Any) -> Any:
    """An independent copy of one entry, by its key's ``copy`` (deepcopy if unregistered)."""
    key = _KEYS.get(name)
    return (key.copy if key is not None else _copy.deepcopy)(value)


class Meta(dict):
    """A dict of annotations whose registered keys are type-checked on every assignment."""

    __slots__ = ()

    def __init__(self, *args: Any, **kw: Any):
        super().__init__()
        self.update(*args, **kw)

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise MetaError(f"meta keys are strings, not {type(key).__name__} ({key!r})")
        k = _KEYS.get(key)
        if k is not None:
            k.check(value)
        super().__setitem__(key, value)

    def update(self, *args: Any, **kw: Any) -> None:
        for k, v in dict(*args, **kw).items():
            self[k] = v

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def __ior__(self, other: Any) -> Meta:
        self.update(other)
        return self

    def copy(self) -> Meta:
        """An independent copy: every entry copied by its key's ``copy``."""
        out = Meta()
        for k, v in self.items():
            dict.__setitem__(out, k, copy_entry(k, v))
        return out

    def carry_to(self, other: Meta, *, rewrite: bool = False) -> None:
        """Copy into ``other`` the entries it lacks (with ``rewrite``: only those whose key
        survives rewrites; unregistered keys do not)."""
        for k, v in self.items():
            key = _KEYS.get(k)
            if k not in other and (not rewrite or (key is not None and key.survives_rewrite)):
                dict.__setitem__(other, k, copy_entry(k, v))

    def __repr__(self) -> str:
        return f"Meta({dict.__repr__(self)})"


# ---- encoding ---------------------------------------------------------------------------
def encode(meta: Mapping[str, Any], arrays: dict[str, np.ndarray], where: str) -> dict[str, Any]:
    """``meta`` as JSON: registered keys through ``to_json``, numpy arrays moved into
    ``arrays`` (replaced by ``{"$array": id, "shape": [...]}``), non-finite floats as
    ``{"$float": "inf"}``. MetaError naming the key and ``where``
    for anything else that is not JSON."""
    out = {}
    for k, v in meta.items():
        key = _KEYS.get(k)
        doc = key.to_json(v) if key is not None and key.to_json is not None else v
        out[k] = _plain(doc, arrays, f"meta key '{k}' of {where}")
    return out


def decode(doc: Mapping[str, Any], arrays: Mapping[str, np.ndarray], where: str,
           encoded: Iterable[str] = ()) -> Meta:
    """The inverse of :func:`encode`. ``encoded``: keys that were written by a registered
    ``to_json``; one not registered now cannot be read back and is refused."""
    out = Meta()
    encoded = set(encoded)
    for k, d in doc.items():
        value = _arrays_back(d, arrays, f"meta key '{k}' of {where}")
        key = _KEYS.get(k)
        if key is not None and key.from_json is not None:
            try:
                value = key.from_json(value)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise MetaError(f"meta key '{k}' of {where}: cannot read it back: "
                                f"{type(e).__name__}: {e}") from None
        elif k in encoded:
            raise MetaError(f"meta key '{k}' of {where} was saved by a registered encoder; "
                            "import the module that registers it before loading")
        out[k] = value
    return out


def encoded_keys(metas: Iterable[Mapping[str, Any]]) -> list[str]:
    """The keys among ``metas`` that a registered ``to_json`` writes."""
    return sorted({k for m in metas for k in m
                   if (key := _KEYS.get(k)) is not None and key.to_json is not None})


def _plain(v: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    """``v`` checked to read back from JSON exactly (tuples, numpy scalars, non-str dict
    keys would not), with arrays moved out."""
    if v is None or type(v) in (bool, int, str):
        return v
    if isinstance(v, float):            # numpy's float64 is a float: the same double
        return float(v) if math.isfinite(v) else {"$float": repr(float(v))}
    if isinstance(v, np.ndarray):
        if v.dtype.kind not in "biuf":
            raise MetaError(f"{where}: cannot save a {v.dtype} array")
        ref = str(len(arrays))
        arrays[ref] = np.ascontiguousarray(v)
        return {ARRAY_TAG: ref, "shape": list(v.shape)}    # safetensors keeps no 0-d shape
    if type(v) is list:
        return [_plain(x, arrays, where) for x in v]
    if type(v) is dict:
        if not all(type(k) is str for k in v):
            raise MetaError(f"{where}: cannot save a dict with non-string keys")
        if ARRAY_TAG in v or "$float" in v:
            raise MetaError(f"{where}: dict keys '{ARRAY_TAG}' and '$float' are reserved")
        return {k: _plain(x, arrays, where) for k, x in v.items()}
    raise MetaError(f"{where}: cannot save a {type(v).__name__} ({v!r:.60}); store JSON "
                    "values (lists, not tuples) or register the key with to_json/from_json")


def _arrays_back(d: Any, arrays: Mapping[str, np.ndarray], where: str) -> Any:
    if isinstance(d, list):
        return [_arrays_back(x, arrays, where) for x in d]
    if isinstance(d, dict):
        if ARRAY_TAG in d:
            if d[ARRAY_TAG] not in arrays:
                raise MetaError(f"{where}: array {d[ARRAY_TAG]} is missing")
            return np.array(arrays[d[ARRAY_TAG]]).reshape(d["shape"])
        if set(d) == {"$float"}:
            return float(d["$float"])
        return {k: _arrays_back(x, arrays, where) for k, x in d.items()}
    return d
