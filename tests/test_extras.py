"""A feature whose optional dependency is missing says which extra installs it, when it is asked for."""

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import lazyseq

MISSING = ("ray", "zmq")


@pytest.fixture
def without_extras(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in MISSING else find_spec(name, *a))


@pytest.mark.parametrize(
    "make",
    [
        lambda: lazyseq.prefetch(np.arange(10), nworkers=1, method="ray"),
        lambda: lazyseq.load_buffers(lambda: np.zeros(2), nworkers=1, method="ray"),
        lambda: lazyseq.evaluate(lambda b: b, np.arange(10), nworkers=1, method="ray"),
    ],
)
def test_a_loader_on_ray_without_ray_says_which_extra_installs_it_when_made(without_extras, make):
    # It failed at its first item, as that item's EvaluationError: "ModuleNotFoundError: No module named 'ray'".
    with pytest.raises(ModuleNotFoundError) as caught:
        make()
    assert str(caught.value).endswith("method='ray' needs ray, which is not installed: pip install \"lazyseq[ray]\"")
    assert caught.value.name == "ray"


def test_no_workers_on_ray_need_no_ray(without_extras):
    assert list(lazyseq.prefetch(np.arange(3), nworkers=0, method="ray")) == [0, 1, 2]


@pytest.mark.parametrize("call", ["serve", "connect"])
def test_serving_without_pyzmq_says_which_extra_installs_it(without_extras, call):
    # "No module named 'zmq'", which named neither the package (pip install zmq is another one) nor the extra.
    with pytest.raises(ModuleNotFoundError) as caught:
        getattr(lazyseq, call)(range(3) if call == "serve" else "tcp://127.0.0.1:5557")
    assert str(caught.value) == f'{call} needs pyzmq, which is not installed: pip install "lazyseq[server]"'


def test_the_command_without_pyzmq_says_which_extra_installs_it_in_one_line():
    code = (
        "import importlib.util, runpy, sys, types\n"
        "find_spec = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'zmq' else find_spec(name, *a)\n"
        "sys.modules['pipeline'] = types.SimpleNamespace(view=range(3))\n"
        "sys.argv = ['lazyseq.serve', 'pipeline:view']\n"
        "runpy.run_module('lazyseq.serve', run_name='__main__')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stderr) == (
        1,
        'lazyseq.serve: serve needs pyzmq, which is not installed: pip install "lazyseq[server]"\n',
    )
