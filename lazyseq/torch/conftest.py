"""pytest: the doctests of this package need torch; where it is not installed they are not collected."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["*.py"]
