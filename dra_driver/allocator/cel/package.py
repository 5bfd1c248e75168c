"""The ``cel`` package (cel-rust bindings) without its command-line tool.

``cel/__init__.py`` imports ``cel.cli`` eagerly, and with it typer, rich, prompt_toolkit and
pygments: hundreds of modules and a large share of the memory of a process that never runs the
tool (docs/benchmarks.md#the-codes-figures). Before the package is
first imported, ``cel.cli`` is registered as a module that is loaded on first use: the same module
object, its code run when an attribute is first asked for. Everything else of the package (the Rust
extension, ``cel.stdlib``) is imported as usual.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from typing import Any


def defer_cli() -> None:
    """Register ``cel.cli`` as loaded on first use; nothing once ``cel`` is imported or not installed."""
    if "cel" in sys.modules or "cel.cli" in sys.modules:
        return
    package = importlib.util.find_spec("cel")
    if package is None or not package.submodule_search_locations:
        return
    spec = importlib.machinery.PathFinder.find_spec("cel.cli", list(package.submodule_search_locations))
    if spec is None or spec.loader is None:
        return
    loader = spec.loader
    module = importlib.util.module_from_spec(spec)

    def load_on_first_use(name: str) -> Any:
        # Module-level __getattr__ (PEP 562) runs only for names the module lacks: __spec__ and
        # the other import attributes are there, so importing does not trigger it.
        del module.__dict__["__getattr__"]
        loader.exec_module(module)
        return getattr(module, name)

    module.__dict__["__getattr__"] = load_on_first_use
    sys.modules["cel.cli"] = module


defer_cli()

import cel  # noqa: E402  (after defer_cli, which must run first)
from cel.stdlib import EXTENSIONS  # noqa: E402

__all__ = ["EXTENSIONS", "cel"]
