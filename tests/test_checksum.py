import random

import numpy as np
import pytest

from lazyseq.io.checksum import Sum64, file_sum64, joined

MASK = 2**64 - 1


def by_hand(data: bytes) -> str:
    """The definition, word by word."""
    data += bytes(-len(data) % 8)
    words = [int.from_bytes(data[k : k + 8], "little") for k in range(0, len(data), 8)]
    n = len(words)
    total = sum(words) & MASK
    weighted = sum((n - k) * word for k, word in enumerate(words)) & MASK
    return f"{total:016x}{weighted:016x}"


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 8191, 8192, 8200, 70_001])
def test_the_sums_match_their_definition_however_the_bytes_are_cut(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert Sum64(data).hexdigest() == by_hand(data)
    cuts = random.Random(size)
    for _ in range(5):
        summed, start = Sum64(), 0
        while start < size:
            step = cuts.choice([1, 3, 8, 13, 4096, 9000])
            summed.add(memoryview(data)[start : start + step])
            start += step
        assert summed.hexdigest() == by_hand(data)


def test_the_sums_wrap_around_and_take_any_buffer():
    words = np.full(3000, 2**64 - 1, np.uint64)
    assert Sum64(words.data).hexdigest() == by_hand(words.tobytes())
    assert Sum64(bytearray(b"abc")).hexdigest() == f"{0x636261:016x}{0x636261:016x}"
    rows = np.arange(60.0).reshape(3, 20)[:, 1:]  # not contiguous: summed as the bytes of its C-order copy
    assert Sum64(np.ascontiguousarray(rows).data).hexdigest() == by_hand(rows.tobytes())


def test_what_the_sums_tell_apart():
    words = np.arange(1, 5000, dtype=np.uint64)
    original = Sum64(words.data).hexdigest()
    swapped = words.copy()
    swapped[[10, 3000]] = swapped[[3000, 10]]
    changed = words.copy()
    changed[4000] ^= 1 << 63
    padded = np.append(words, np.uint64(0))
    assert len({original, Sum64(swapped.data).hexdigest(), Sum64(changed.data).hexdigest()}) == 3
    assert Sum64(padded.data).hexdigest() != original  # the weights of every word change (and the size does)


def test_a_file_is_summed_in_pieces(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 9 * 2**20 + 5, dtype=np.uint8).tobytes()  # more than a read
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    assert file_sum64(path) == (len(data), Sum64(data).hexdigest())
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert file_sum64(empty) == (0, "0" * 32)


@pytest.mark.parametrize("size", [0, 8, 1000, 8 * 3000 + 5])
def test_sums_of_pieces_cut_at_words_join_into_the_sum_of_the_whole(size):
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    generator = random.Random(size)
    for _ in range(20):
        cuts = sorted(generator.randrange(0, size // 8 + 1) * 8 for _ in range(generator.randrange(0, 5)))
        bounds = [0, *cuts, size]
        pieces = [Sum64(data[start:stop]) for start, stop in zip(bounds, bounds[1:])]
        assert joined(piece.state() for piece in pieces) == Sum64(data).hexdigest() == by_hand(data), bounds
