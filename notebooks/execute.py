"""Run every notebook here from top to bottom and save it with its outputs: ``python notebooks/execute.py``.

The test suite runs them too (tests/test_notebooks.py), so a notebook that no
longer runs fails CI; this script refreshes the outputs readers see on GitHub.
Needs the ``dev`` extra (nbclient, ipykernel, matplotlib).
"""

from __future__ import annotations

import pathlib
import sys

import nbclient
import nbformat

HERE = pathlib.Path(__file__).resolve().parent


def execute(path: pathlib.Path, timeout: int = 300) -> nbformat.NotebookNode:
    """The notebook at ``path``, run in a fresh kernel in the notebooks folder; a cell that raises stops it.

    Cells tagged ``raises-exception`` show their error and the run goes on.
    """
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    return notebook


def main(names: list[str]) -> None:
    paths = [HERE / name for name in names] if names else sorted(HERE.glob("*.ipynb"))
    for path in paths:
        print(f"running {path.name}")
        nbformat.write(execute(path), path)


if __name__ == "__main__":
    main(sys.argv[1:])
