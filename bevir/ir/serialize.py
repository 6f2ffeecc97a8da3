"""save/load: the IR text plus a safetensors file of the constants."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from ..errors import BevirError
from .graph import Graph
from .parser import parse
from .printer import print_graph


def constants_path(path: str | os.PathLike) -> Path:
    """Where the constants of the graph saved at ``path`` live: ``<stem>.safetensors``."""
    return Path(path).with_suffix(".safetensors")


def save(graph: Graph, path: str | os.PathLike) -> Path:
    """Write ``graph`` to ``path`` (text, constants as ``external``) and its constants to
    :func:`constants_path`. Returns the text file's path."""
    path = Path(path)
    sidecar = constants_path(path)
    header = f"// constants: {sidecar.name}\n" if graph.constants else ""
    path.write_text(header + print_graph(graph, constants="external"))
    if graph.constants:
        save_file({k: np.ascontiguousarray(v.const) for k, v in graph.constants.items()},
                  str(sidecar))
    return path


def load(path: str | os.PathLike) -> Graph:
    """Read a graph written by :func:`save` (or any IR text file with inline constants)."""
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
    return parse(text, external=external, source=str(path))
