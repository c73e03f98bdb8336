"""The README demo runs end to end (on a small dataset), with and without its background loader."""

import pytest

pytest.importorskip("sklearn")

from lazyseq import demo  # noqa: E402


@pytest.mark.parametrize("method", ["thread", "process"])
def test_demo_trains_with_and_without_a_loader_and_evaluates(capsys, method):
    result = demo.main(["--samples", "1200", "--steps", "30", "--method", method])
    out = capsys.readouterr().out
    assert "training, 30 minibatches of 64, each read when needed:" in out
    assert f"training, 30 minibatches of 64, load_buffers with 2 {method} workers:" in out
    assert "evaluation: 600 samples in chunks of 64" in out
    assert "batch(64)  [len 1, items (float64 (64, 248), int64 (64,))]" in out
    assert result["accuracy"] > 0.9


@pytest.mark.parametrize("arguments", [["--samples", "0"], ["--samples", "100", "--test", "200"], ["--steps", "0"]])
def test_the_demo_refuses_counts_it_cannot_run_with(arguments, capsys):
    from lazyseq.demo import main

    with pytest.raises(SystemExit) as stopped:  # numpy raised "high <= 0" from inside the demo
        main(arguments)
    assert stopped.value.code == 2 and "python -m lazyseq.demo: error: --" in capsys.readouterr().err


def test_the_demo_runs_with_fewer_training_samples_than_a_minibatch(capsys):
    # printing the pipeline took 64 training samples: IndexError with 50
    result = demo.main(["--samples", "100", "--steps", "5", "--method", "thread"])
    assert 0 <= result["accuracy"] <= 1 and "accuracy" in capsys.readouterr().out
