"""The README demo runs end to end (on a small dataset)."""

import pytest

pytest.importorskip("sklearn")

from lazyseq import demo  # noqa: E402


def test_demo_trains_and_evaluates(capsys):
    result = demo.main(["--samples", "1200", "--steps", "30"])
    out = capsys.readouterr().out
    assert "accuracy:" in out and "training: 30 minibatches of 64" in out
    assert result["accuracy"] > 0.9
