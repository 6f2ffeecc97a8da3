"""save/load: the IR text, a safetensors file of the constants and, when the graph has
meta, a JSON file of it (plus a safetensors file of the arrays the meta holds). The text's
header names the other files by sha256, so load never mixes files of two saves."""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as load_arrays

from ..errors import BevirError
from ..fsutil import loads_json, save_arrays, write_atomic
from .graph import Graph
from .meta import MetaError, decode, encode, encoded_keys
from .parser import parse
from .printer import print_graph

META_FORMAT, META_VERSION = "bevir-meta", 1


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
    written.

    Each file is written whole or not at all, the text last: its header names the sha256
    of the constants and meta files it goes with, so a save that was stopped midway loads
    as the old graph, or is refused by :func:`load`, never mixed."""
    path = Path(path)
    meta_doc, meta_arrays = meta_document(graph)
    header = []
    if graph.constants:
        sidecar = constants_path(path)
        digest = save_arrays({k: v.const for k, v in graph.constants.items()}, sidecar)
        header.append(f"// constants: {sidecar.name} sha256:{digest}")
    header.append(f"// meta: {_save_meta(path, meta_doc, meta_arrays)}")
    write_atomic(path, "\n".join(header) + "\n" + print_graph(graph, constants="external"))
    return path


def _save_meta(path: Path, doc: dict[str, Any] | None, arrays: dict[str, np.ndarray]) -> str:
    """Write (or, without meta, remove) the meta files of the graph saved at ``path``;
    what the text's header says of them."""
    doc_path, arrays_path = meta_paths(path)
    if not arrays:                      # never leave another graph's meta beside this one
        arrays_path.unlink(missing_ok=True)
    if doc is None:
        doc_path.unlink(missing_ok=True)
        return "none"
    text = json.dumps(doc, indent=1) + "\n"
    files = [f"{doc_path.name} sha256:{hashlib.sha256(text.encode()).hexdigest()}"]
    if arrays:
        files.append(f"{arrays_path.name} sha256:{save_arrays(arrays, arrays_path)}")
    write_atomic(doc_path, text)
    return ", ".join(files)


#: the header lines of a saved text: "// constants: FILE sha256:HEX", "// meta: none" or
#: "// meta: FILE sha256:HEX[, FILE sha256:HEX]"
_HEADER = re.compile(r"// (constants|meta): (.*)")
_FILE = re.compile(r"(\S+) sha256:([0-9a-f]{64})")


def _header(text: str) -> dict[str, list[str] | None]:
    """The digests the header of a saved text names: {"constants": [hex], "meta": [hex of
    the document, of its arrays] or None (no meta)}; a key is absent where the text does
    not say (a text of an older bevir, or written by hand)."""
    found: dict[str, list[str] | None] = {}
    for line in text.splitlines():
        if not line.startswith("//"):
            break
        m = _HEADER.fullmatch(line.strip())
        if m:
            found[m[1]] = None if m[2].strip() == "none" else \
                [d for _, d in _FILE.findall(m[2])]
    return found


def _read_named(path: Path, digest: str | None, text_path: Path, what: str,
                error: type[BevirError] = BevirError) -> bytes:
    """The bytes of ``path``, which the text at ``text_path`` names by ``digest`` (None:
    not named; any content)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}"
                         + (f" ({text_path} names it)" if digest else "")) from None
    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        raise error(f"cannot read {what} {path}: it is not the file {text_path} was "
                         "saved with (its sha256 differs; a save was interrupted, or a file "
                         "was replaced)")
    return data


def load(path: str | os.PathLike) -> Graph:
    """Read a graph written by :func:`save` (or any IR text file with inline constants),
    with its meta. The constants and meta files must be the ones the text's header names
    (by sha256): a mismatch is an error, never a graph of mixed saves."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BevirError(f"cannot read {path}: {e}") from None
    named = _header(text)
    sidecar = constants_path(path)
    external = None
    if "constants" in named or sidecar.exists():
        digest = (named.get("constants") or [None])[0]
        data = _read_named(sidecar, digest, path, "constants")
        try:
            external = load_arrays(data)
        except (SafetensorError, ValueError) as e:
            raise BevirError(f"cannot read constants {sidecar}: {e}") from None
    graph = parse(text, external=external, source=str(path))
    doc_path, arrays_path = meta_paths(path)
    meta = named.get("meta", [] if doc_path.exists() else None)
    if meta is not None:
        try:
            apply_meta_document(graph, _read_meta(doc_path, arrays_path, path, meta))
        except (KeyError, TypeError, ValueError, OverflowError) as e:
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


def _read_meta(doc_path: Path, arrays_path: Path, text_path: Path, digests: list[str]
               ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The meta document and arrays saved with the text at ``text_path``, which names them
    by ``digests`` (empty: a text that does not say; whatever files are there)."""
    named = len(digests) > 0
    doc_bytes = _read_named(doc_path, digests[0] if named else None, text_path, "meta", MetaError)
    doc = loads_json(doc_bytes, f"meta {doc_path}", MetaError)
    arrays = {}
    if len(digests) > 1 or (not named and arrays_path.exists()):
        data = _read_named(arrays_path, digests[1] if named else None, text_path, "meta",
                           MetaError)
        try:
            arrays = load_arrays(data)
        except (SafetensorError, ValueError) as e:
            raise MetaError(f"cannot read meta {arrays_path}: {e}") from None
    check_document(doc, doc_path, META_FORMAT, META_VERSION, MetaError)
    if not all(isinstance(doc.get(k), t) for k, t in (("graph", dict), ("values", dict),
                                                      ("nodes", list))):
        raise MetaError(f"{doc_path}: malformed: needs 'graph', 'values' and 'nodes'")
    return doc, arrays
