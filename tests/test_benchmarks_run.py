"""The benchmark scripts keep working (a short run; no timing is asserted)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("seqtools")

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def quick_run(script: str) -> str:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick"], capture_output=True, text=True, check=True, timeout=300
    ).stdout


def test_view_benchmark_quick_run():
    out = quick_run("bench_views.py")
    assert "| create smap(f, data)" in out
    assert "collate + gather + batch -> (X, y), vs numpy" in out


def test_loading_benchmark_quick_run():
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    out = quick_run("bench_loading.py")
    assert "| 1. loader-bound, processes vs numpy loop" in out
    assert "| 5. first batch, threads" in out
    assert "leftover workers after closing every loader: none" in out


def test_sklearn_benchmark_quick_run():
    pytest.importorskip("sklearn")
    out = quick_run("bench_sklearn.py")
    assert "| (b) fit(), in-memory batches vs (a)" in out
    assert "| (c) fit(), prefetch 2 processes vs (a)" in out


def test_torch_benchmark_quick_run():
    pytest.importorskip("torch")
    out = quick_run("bench_torch.py")
    assert "| a. MLP training step, best lazyseq loader vs model alone" in out
    assert "| b. loader-bound, processes vs DataLoader per-sample" in out
    assert "leftover workers after closing every loader: none" in out


def test_machine_benchmark_quick_run():
    out = quick_run("bench_machine.py")
    assert "two processes did" in out


def test_server_benchmark_quick_run():
    pytest.importorskip("zmq")
    out = quick_run("bench_server.py")
    assert "| 1. 256 x 248 (0.5 MiB): served, shared memory vs local prefetch" in out
    assert "| 1. 256 x 248 (0.5 MiB): served, socket vs hand-written server" in out
    assert "| 2. Fuel's workload: served vs ideal (consumer alone)" in out
    assert "| 3. CURVE on vs off" in out


def test_shards_benchmark_quick_run():
    out = quick_run("bench_shards.py")
    assert "| 1. 1 ms/row transform, write_npy 2 processes vs two independent processes" in out
    assert "| 2. cheap pipeline, 34 MiB, write_npy sync=False, no workers vs np.save " in out
    assert "| 2. cheap pipeline, 34 MiB, write_npy sync=False, 2 threads vs np.save " in out
    assert "| 2. cheap pipeline, 34 MiB, write_npy (sync=True), 2 threads vs np.save + fsync" in out


def test_ray_benchmark_quick_run():
    pytest.importorskip("ray")
    out = quick_run("bench_ray.py")
    assert "| 2 Ray tasks vs 2 processes, default max_buffered " in out
    assert "| 2 Ray tasks vs 2 processes, max_buffered=256" in out
    assert "| start-up: two-node cluster + first run's extra" in out
