"""The documentation site builds in strict mode, documents every public name, and fails on a broken reference."""

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import lazyseq

ROOT = pathlib.Path(__file__).resolve().parent.parent
API_PAGES = ROOT / "docs" / "api"


def public_names(package: str) -> list[str]:
    """``__all__`` of a subpackage, read from its source (importing lazyseq.torch would import torch)."""
    tree = ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{package} has no __all__")


def documented() -> set[str]:
    return {
        line.removeprefix(":::").strip()
        for page in API_PAGES.glob("*.md")
        for line in page.read_text().splitlines()
        if line.startswith(":::")
    }


@pytest.mark.parametrize(
    "name",
    [f"lazyseq.{n}" for n in lazyseq.__all__]
    + [f"{p}.{n}" for p in ("lazyseq.sklearn", "lazyseq.torch") for n in public_names(p)],
)
def test_every_public_name_has_a_reference_entry(name):
    entry = DOCUMENTED_AS.get(name, name)
    assert entry in documented(), f"add '::: {entry}' to a page in docs/api/"


# Names whose entry gives where they are defined: the command module lazyseq/serve.py would be documented instead.
DOCUMENTED_AS = {"lazyseq.serve": "lazyseq.serving.server.serve"}


def test_the_docstring_extension_fences_examples():
    pytest.importorskip("griffe")
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        from griffe_docstrings import fence_doctests
    finally:
        sys.path.remove(str(ROOT / "docs"))
    text = "Stacks items.\n\n>>> batch([1, 2], 2)[0]\narray([1, 2])\n\nMore text."
    assert fence_doctests(text) == (
        "Stacks items.\n\n```pycon\n>>> batch([1, 2], 2)[0]\narray([1, 2])\n```\n\nMore text."
    )


def mkdocs_build(config: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocs_jupyter"):
        pytest.importorskip(module)
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's notice about MkDocs 2.0
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)


def test_the_site_builds_in_strict_mode(tmp_path):
    build = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert build.returncode == 0, build.stderr[-4000:]
    reference = (tmp_path / "site" / "api" / "views" / "index.html").read_text()
    assert 'id="lazyseq.batch"' in reference
    assert '<span class="gp">&gt;&gt;&gt; </span>' in reference  # examples highlighted as console sessions
    assert (tmp_path / "site" / "notebooks" / "02_pytorch_training" / "index.html").exists()


def test_a_broken_reference_fails_the_build(tmp_path):
    package = tmp_path / "src" / "brokenref"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        '"""A package."""\n\n\ndef f():\n    """Returns what :func:`missing_function` gives."""\n'
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Index\n\n::: brokenref.f\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        textwrap.dedent(
            f"""\
            site_name: broken
            docs_dir: docs
            plugins:
              - autorefs
              - mkdocstrings:
                  handlers:
                    python:
                      paths: [src]
                      options:
                        docstring_style: null
                        extensions:
                          - {ROOT / "docs" / "griffe_docstrings.py"}
            """
        )
    )
    build = mkdocs_build(config, tmp_path / "site")
    assert build.returncode == 1
    assert "Could not find cross-reference target 'missing_function'" in build.stderr
