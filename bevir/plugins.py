"""User plugins: Python files and importable modules whose Pass and OpDef subclasses
register themselves when defined (like mlir-opt's --load-pass-plugin). The CLI's ``--load``
/ ``--load-module``; bevir.scale loads the same plugins in every worker before it reads a
model, so custom ops and passes exist there too."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from .errors import BevirError, raised_at


class PluginError(BevirError):
    """A plugin that cannot be found or fails while it is imported."""


def load_plugins(files: Sequence[str] = (), modules: Sequence[str] = ()) -> None:
    """Import the plugin ``files`` and ``modules`` (each once per process)."""
    import importlib
    import importlib.util
    for path in files:
        if not Path(path).is_file():
            raise PluginError(f"--load: no such file '{path}'")
        resolved = Path(path).resolve()
        name = "bevir_plugin_" + "".join(c if c.isalnum() else "_" for c in resolved.stem)
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(loaded, "__file__", None) == str(resolved):
            continue                # loaded already in this process: its classes exist
        spec = importlib.util.spec_from_file_location(name, resolved)
        if spec is None or spec.loader is None:
            raise PluginError(f"--load: '{path}' is not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        _import_plugin(f"--load {path}", lambda: spec.loader.exec_module(module), str(resolved))
    for name in modules:
        _import_plugin(f"--load-module {name}", lambda: importlib.import_module(name),
                       _module_source(name))


def _module_source(name: str) -> str:
    """The file of module ``name``, or the folder of its package; "" when not found."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    origin = spec.origin if spec and spec.origin else ""
    return str(Path(origin).parent) if origin.endswith("__init__.py") else origin


def _import_plugin(what: str, do, source: str) -> None:
    try:
        do()
    except BevirError as e:
        raise PluginError(f"{what}: {e}") from None
    except Exception as e:      # the plugin's own code failed: say where, in one line
        raise PluginError(f"{what} failed: {type(e).__name__}: {e}{raised_at(e, source)}"
                          ) from None
