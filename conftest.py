"""pytest, for the whole checkout: the doctests of an integration are collected only where its extra is installed."""

import importlib.util

collect_ignore_glob = [
    f"lazyseq/{package}/*.py" for package in ("torch", "sklearn") if importlib.util.find_spec(package) is None
]
if importlib.util.find_spec("zmq") is None:
    collect_ignore_glob.append("lazyseq/serving/*.py")
if importlib.util.find_spec("ray") is None:
    collect_ignore_glob.append("lazyseq/loading/ray_workers.py")

# The command `python -m lazyseq.serve`: importing it as a module would replace the function lazyseq.serve
collect_ignore = ["lazyseq/serve.py"]
