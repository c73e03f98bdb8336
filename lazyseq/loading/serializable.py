"""Functions that pickle by name, also from a script: ``SerializableFunc``.

Plain pickle sends a function as its module and qualified name, which fails
for a function defined in the script being run: another process has another
``__main__``. A :class:`SerializableFunc` remembers the script's path as
well, and the process that unpickles it loads that script as a module (its
``if __name__ == "__main__":`` block does not run, as with multiprocessing's
``spawn``) and finds the function there.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["SerializableFunc"]

_SCRIPT_MODULE = "__lazyseq_script_"  # prefix of the names under which scripts are loaded here


def _is_script(module_name: str) -> bool:
    return module_name in ("__main__", "__mp_main__") or module_name.startswith(_SCRIPT_MODULE)


class SerializableFunc:
    """``func``, made picklable by reference to its module and qualified name, also if defined in ``__main__``.

    Call it as you would call ``func``; use it as a decorator or wrap a
    function. The function must be reachable by its name at the top level of
    its module (not a lambda, nor defined inside another function). Its code
    is not pickled: the process that unpickles it imports the module, or
    loads the script (by its path) if the function was defined in the script
    being run, so that the function must be found there under the same name.

    lazyseq's process workers do not need it (they pickle with cloudpickle
    where installed); it is for code that sends functions to other processes
    with plain pickle.

    >>> import json, pickle
    >>> import lazyseq
    >>> f = lazyseq.SerializableFunc(json.dumps)
    >>> g = pickle.loads(pickle.dumps(f))
    >>> g({"epoch": 3}), g
    ('{"epoch": 3}', SerializableFunc(json.dumps))
    """

    def __init__(self, func: Callable) -> None:
        if isinstance(func, SerializableFunc):
            func = func.func  # type: ignore[has-type]  # set below, in the wrapped one
        if not callable(func):
            raise TypeError(f"SerializableFunc needs a function, got {type(func).__name__}")
        module = getattr(func, "__module__", None)
        qualname = getattr(func, "__qualname__", None)
        if module is None or qualname is None or "<" in qualname:
            raise ValueError(
                f"SerializableFunc: {module}.{qualname} cannot be found again by its name in another process: "
                "define the function at the top level of a module or script"
            )
        self.func = func
        self.script = _script_of(module) if _is_script(module) else None
        self.module = "__main__" if _is_script(module) else module  # a script, wherever it was loaded
        self.qualname = qualname
        functools.update_wrapper(self, func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        if _is_script(self.module) and self.script is None:
            raise pickle.PicklingError(
                f"SerializableFunc: {self.qualname} is defined in __main__, which has no file (an interactive "
                "session, a notebook, python -c or a script read from standard input), so no other process can "
                "find it by name: define it in a module or a script file"
            )
        return (_find, (self.module, self.qualname, self.script))

    def __repr__(self) -> str:
        return f"SerializableFunc({self.module}.{self.qualname})"


SerializableFunc.__module__ = "lazyseq"  # where users import it from


def _script_of(module_name: str) -> str | None:
    """The absolute path of the script that module ``module_name`` runs, or None if it has no file."""
    path = getattr(sys.modules.get(module_name), "__file__", None)
    return os.path.abspath(path) if path else None


def _find(module_name: str, qualname: str, script: str | None) -> SerializableFunc:
    """The function that a pickled :class:`SerializableFunc` refers to, imported or loaded here."""
    module = _script_module(script) if script is not None else importlib.import_module(module_name)
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part)
    if isinstance(found, SerializableFunc):  # a decorated function: its wrapper is what the module holds
        return found
    wrapped = SerializableFunc.__new__(SerializableFunc)
    wrapped.func, wrapped.module, wrapped.qualname, wrapped.script = found, module_name, qualname, script
    functools.update_wrapper(wrapped, found)
    return wrapped


def _script_module(path: str) -> Any:
    """The module of the script at ``path``: ``__main__`` if this process runs it, else the script loaded once here."""
    if _script_of("__main__") == path:
        return sys.modules["__main__"]
    name = _SCRIPT_MODULE + hashlib.sha1(path.encode()).hexdigest()[:12] + "__"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"SerializableFunc: cannot load the script {path}")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(path)
    if folder not in sys.path:  # the script's own imports, as when it runs
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
