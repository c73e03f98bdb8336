"""The notebooks run from top to bottom, and what is stored in them shows their outputs."""

import importlib.util
import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))


def load_executor():
    import importlib.util

    spec = importlib.util.spec_from_file_location("notebooks_execute", NOTEBOOKS / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_the_three_walkthroughs():
    names = [p.name for p in PATHS]
    assert any("sklearn" in n for n in names) and any("torch" in n for n in names) and any("errors" in n for n in names)


OPTIONAL = {"matplotlib", "ray", "sklearn", "torch", "tqdm", "zmq"}  # what lazyseq's extras install


def missing_imports(path):
    """The optional packages that the notebook's code imports and that are not installed here (a misspelt or
    unlisted one is left for the run to report)."""
    notebook = nbformat.read(path, as_version=4)
    names = {
        match.group(1)
        for cell in notebook.cells
        if cell.cell_type == "code"
        for match in re.finditer(r"^\s*(?:import|from)\s+(\w+)", cell.source, re.MULTILINE)
    }
    return sorted(name for name in names & OPTIONAL if importlib.util.find_spec(name) is None)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_notebook_runs(path):
    missing = missing_imports(path)
    if missing:  # an extra not installed (torch, where PyPI has no CPU build of it for that Python)
        pytest.skip(f"the notebook imports {', '.join(missing)}, not installed here")
    notebook = load_executor().execute(path)
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code" and "raises-exception" not in cell.metadata.get("tags", [])
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert errors == []


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_stored_notebook_shows_its_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.execution_count is not None for cell in code), "run notebooks/execute.py"
    assert sum(bool(cell.outputs) for cell in code) >= len(code) // 2


def test_a_stored_notebook_has_a_plot():
    images = [
        output
        for path in PATHS
        for cell in nbformat.read(path, as_version=4).cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    assert images
