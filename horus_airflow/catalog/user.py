"""Users' own models: ``path/to/file.py:factory``, a function without arguments returning a module."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Callable

from torch import nn

from horus_airflow.errors import InvalidJobError
from horus_airflow.names import MODULE_SEPARATOR


def load_factory(model: str) -> Callable[[], nn.Module]:
    """Import the file and return its factory, or say what is wrong with the reference."""
    location, _, factory_name = model.rpartition(MODULE_SEPARATOR)
    path = Path(location).expanduser()
    if not path.is_file():
        raise InvalidJobError(f"user module file not found: {str(path)!r} (expected path/to/file.py:factory)")
    name = "horus_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InvalidJobError(f"cannot import {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise InvalidJobError(f"importing user module {str(path)!r} raised {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        callables = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise InvalidJobError(
            f"{str(path)!r} has no callable {factory_name!r}; its callables: {', '.join(callables) or 'none'}"
        )
    return factory


def build_user_module(factory: Callable[[], nn.Module], model: str) -> nn.Module:
    try:
        built = factory()
    except Exception as exc:
        raise InvalidJobError(f"user model factory {model!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(built, nn.Module):
        raise InvalidJobError(f"user model factory {model!r} returned {type(built).__name__}, not a torch.nn.Module")
    return built
