"""save/load: the IR text, a safetensors file of the constants and, when the graph has
meta, a JSON file of it (plus a safetensors file of the arrays the meta holds)."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file
from safetensors.numpy import save as _safetensors_bytes

from ..errors import BevirError
from .graph import Graph
from .meta import MetaError, decode, encode, encoded_keys
from .parser import parse
from .printer import print_graph

META_FORMAT, META_VERSION = "bevir-meta", 1


def save_arrays(arrays: Mapping[str, np.ndarray], path: str | os.PathLike,
                metadata: Mapping[str, str] | None = None) -> Path:
    """Write ``arrays`` to the safetensors file ``path``, its mode following the umask as
    other files' do (safetensors' own ``save_file`` creates it readable by its owner only).
    Returns the path."""
    path = Path(path)
    path.write_bytes(_safetensors_bytes({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                                        metadata=dict(metadata) if metadata else None))
    return path


def constants_path(path: str | os.PathLike) -> Path:
    """Where the constants of the graph saved at ``path`` live: ``<stem>.safetensors``."""
    return Path(path).with_suffix(".safetensors")


def meta_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """Where the meta of the graph saved at ``path`` lives: ``<stem>.meta.json`` and, for
    the arrays it holds, ``<stem>.meta.safetensors``."""
    path = Path(path)
    return path.with_suffix(".meta.json"), path.with_suffix(".meta.safetensors")


def graph_digest(graph: Graph, inputs: Mapping[str, np.ndarray] | None = None) -> str:
    """sha256 (hex, 16 digits) of the graph's text, its constants' bytes and ``inputs``."""
    h = hashlib.sha256(print_graph(graph, constants="external").encode())
    arrays = sorted((("const", k, v.const) for k, v in graph.constants.items()))
    arrays += sorted(("input", k, np.asarray(v)) for k, v in (inputs or {}).items())
    for kind, name, a in arrays:
        a = np.asarray(a, order="C")
        h.update(f"{kind}:{name}:{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def save(graph: Graph, path: str | os.PathLike) -> Path:
    """Write ``graph`` to ``path`` (text, constants as ``external``), its constants to
    :func:`constants_path` and its meta, if any, to :func:`meta_paths`. Returns the text
    file's path. A meta entry that cannot be saved raises MetaError before anything is
    written."""
    path = Path(path)
    meta_doc, meta_arrays = meta_document(graph)
    sidecar = constants_path(path)
    header = f"// constants: {sidecar.name}\n" if graph.constants else ""
    path.write_text(header + print_graph(graph, constants="external"))
    if graph.constants:
        save_arrays({k: v.const for k, v in graph.constants.items()}, sidecar)
    doc_path, arrays_path = meta_paths(path)
    for p in (doc_path, arrays_path):       # never leave another graph's meta beside this one
        p.unlink(missing_ok=True)
    if meta_doc is not None:
        doc_path.write_text(json.dumps(meta_doc, indent=1) + "\n")
        if meta_arrays:
            save_arrays(meta_arrays, arrays_path)
    return path


def load(path: str | os.PathLike) -> Graph:
    """Read a graph written by :func:`save` (or any IR text file with inline constants),
    with its meta when the meta file is there."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BevirError(f"cannot read {path}: {e}") from None
    sidecar = constants_path(path)
    external = None
    if sidecar.exists():
        try:
            external = load_file(str(sidecar))
        except (SafetensorError, OSError, ValueError) as e:
            raise BevirError(f"cannot read constants {sidecar}: {e}") from None
    graph = parse(text, external=external, source=str(path))
    doc_path, arrays_path = meta_paths(path)
    if doc_path.exists():
        try:
            apply_meta_document(graph, _read_meta(doc_path, arrays_path))
        except (KeyError, TypeError, ValueError) as e:
            raise MetaError(f"{doc_path}: malformed meta: {type(e).__name__}: {e}") from None
    return graph


# ---- the meta document ----------------------------------------------------------------
# {"format": "bevir-meta", "version": 1, "encoded": [keys written by a registered to_json],
#  "graph": {key: entry}, "values": {value name: {key: entry}},
#  "nodes": [[node index, op, {key: entry}], ...]}
# Arrays inside entries are {"$array": id, "shape": [...]}: tensor `id` of the arrays file.

def meta_document(graph: Graph) -> tuple[dict[str, Any] | None, dict[str, np.ndarray]]:
    """The graph's meta as a JSON document and its arrays; (None, {}) without meta."""
    arrays: dict[str, np.ndarray] = {}
    values = {v.name: encode(v.meta, arrays, f"value %{v.name}")
              for v in graph.values() if v.meta}
    nodes = [[i, n.op, encode(n.meta, arrays, f"node {n.name} (op '{n.op}')")]
             for i, n in enumerate(graph.nodes) if n.meta]
    if not (graph.meta or values or nodes):
        return None, {}
    metas = [graph.meta, *(v.meta for v in graph.values()), *(n.meta for n in graph.nodes)]
    doc = {"format": META_FORMAT, "version": META_VERSION, "encoded": encoded_keys(metas),
           "graph": encode(graph.meta, arrays, f"graph @{graph.name}"),
           "values": values, "nodes": nodes}
    return doc, arrays


def apply_meta_document(graph: Graph, doc_and_arrays: tuple[dict[str, Any], dict[str, np.ndarray]]
                        ) -> None:
    """Set the meta of ``graph`` (just parsed from the same save) from its document."""
    doc, arrays = doc_and_arrays
    enc = doc.get("encoded", [])
    by_name = {v.name: v for v in graph.values()}
    for name, d in doc["values"].items():
        if name not in by_name:
            raise MetaError(f"saved meta names value %{name}, which graph @{graph.name} lacks")
        by_name[name].meta = decode(d, arrays, f"value %{name}", enc)
    for i, op, d in doc["nodes"]:
        if not (0 <= i < len(graph.nodes)) or graph.nodes[i].op != op:
            raise MetaError(f"saved meta of node #{i} (op '{op}') does not fit graph @{graph.name}")
        n = graph.nodes[i]
        n.meta = decode(d, arrays, f"node {n.name} (op '{op}')", enc)
    graph.meta = decode(doc["graph"], arrays, f"graph @{graph.name}", enc)


def check_document(doc: Any, path: str | os.PathLike, format: str, version: int,
                   error: type[BevirError]) -> dict[str, Any]:
    """``doc`` (read from ``path``) if it is a JSON object of ``format`` at ``version``;
    else ``error`` saying which it is not."""
    if not isinstance(doc, dict) or doc.get("format") != format:
        raise error(f"{path}: not a {format} file")
    if doc.get("version") != version:
        raise error(f"{path}: {format} version {doc.get('version')!r} is not supported "
                    f"(this bevir reads version {version})")
    return doc


def _read_meta(doc_path: Path, arrays_path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    try:
        doc = json.loads(doc_path.read_text())
        arrays = load_file(str(arrays_path)) if arrays_path.exists() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, SafetensorError, ValueError) as e:
        raise MetaError(f"cannot read meta {doc_path}: {e}") from None
    check_document(doc, doc_path, META_FORMAT, META_VERSION, MetaError)
    if not all(isinstance(doc.get(k), t) for k, t in (("graph", dict), ("values", dict),
                                                      ("nodes", list))):
        raise MetaError(f"{doc_path}: malformed: needs 'graph', 'values' and 'nodes'")
    return doc, arrays
