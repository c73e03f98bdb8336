"""pytest, for the whole checkout: the doctests of an integration are collected only where its extra is installed."""

import importlib.util

collect_ignore_glob = [
    f"lazyseq/{package}/*.py" for package in ("torch", "sklearn") if importlib.util.find_spec(package) is None
]
