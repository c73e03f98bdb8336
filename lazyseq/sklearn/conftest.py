"""pytest: the doctests of this package need scikit-learn; where it is not installed they are not collected."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("sklearn") else ["*.py"]
