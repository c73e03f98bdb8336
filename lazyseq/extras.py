"""Optional dependencies: a feature that needs one says which extra of lazyseq installs it, before it starts.

``import lazyseq`` imports none of them (numpy is the only one it needs).
A feature checks that what it needs is installed, without importing it,
when it is asked for: a loader with ``method="ray"`` when it is made, not
at its first item, where a missing module would read as that item's
failure.
"""

from __future__ import annotations

import importlib.util

__all__ = ["require"]


def require(module: str, feature: str, extra: str, package: str | None = None) -> None:
    """Raise ``ModuleNotFoundError`` naming the extra that installs ``module`` (``package`` on PyPI) if it is missing.

    >>> require("json", "an example", "none")  # installed: nothing happens
    >>> require("no_such_module", "method='example'", "example")
    Traceback (most recent call last):
    ...
    ModuleNotFoundError: method='example' needs no_such_module, which is not installed: pip install "lazyseq[example]"
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # an import hook that refuses it, a module half there
        found = False
    if not found:
        raise ModuleNotFoundError(
            f'{feature} needs {package or module}, which is not installed: pip install "lazyseq[{extra}]"',
            name=module,
        )
