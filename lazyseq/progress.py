"""Progress bars for long loops (training, chunked evaluation), with tqdm when it is installed.

``progress=None`` (the default everywhere) shows a bar only where someone
is watching: in a Jupyter notebook, or when stderr is a terminal, and only
if tqdm is installed. ``True`` always shows one (tqdm is then required);
``False`` never does.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from typing import Any

from .arguments import flag

__all__ = ["ProgressBar", "check_progress", "progress_bar"]


class ProgressBar:
    """Counts steps; shows them with tqdm (steps per second included) when ``bar`` is a tqdm bar."""

    def __init__(self, bar: Any = None) -> None:
        self.bar = bar

    def update(self, steps: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(steps)

    def show(self, **values: Any) -> None:
        """Extra values next to the bar, for instance the latest validation score."""
        if self.bar is not None:
            self.bar.set_postfix(values, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def progress_bar(total: int | None, description: str, progress: bool | None, unit: str = "batch") -> ProgressBar:
    """A bar over ``total`` steps (``None``: unknown), or one that shows nothing; see the module docstring.

    >>> with progress_bar(3, "demo", progress=False) as bar:
    ...     bar.update()
    >>> bar.bar is None
    True
    """
    check_progress(progress, description)
    if progress is None:
        progress = _someone_watches() and _tqdm_installed()
    if not progress:
        return ProgressBar()
    try:
        if "ipykernel" in sys.modules and importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.notebook import tqdm  # a widget; without ipywidgets, plain text that notebooks show too
        else:
            from tqdm import tqdm
    except ImportError:
        raise ImportError(
            "progress=True needs tqdm: pip install tqdm (or pass progress=False to turn the bar off)"
        ) from None
    return ProgressBar(_without_monitor(tqdm)(total=total, desc=description, unit=unit, dynamic_ncols=True))


@functools.cache
def _without_monitor(bar_class: type) -> type:
    """tqdm's ``bar_class`` that starts no monitor thread (our bars are updated at every step: they need none).

    tqdm keeps that thread to the end of the program: worker processes forked
    later would be forked from a process with a thread running (which Python
    3.12 on warns of, as a child may deadlock on a lock the thread held).
    """
    return type(bar_class.__name__, (bar_class,), {"monitor_interval": 0})


def check_progress(progress: Any, owner: str) -> None:
    """``TypeError`` naming ``owner`` unless ``progress`` is True, False or None."""
    flag(progress, f"{owner}: progress", or_none=True)


def _tqdm_installed() -> bool:
    return importlib.util.find_spec("tqdm") is not None


def _someone_watches() -> bool:
    if "ipykernel" in sys.modules:  # Jupyter: tqdm.auto draws a widget or text in the cell
        return True
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()
