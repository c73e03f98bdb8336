"""lazyseq.torch: datasets both ways, tensors without copies, batches fed to a device, predict, the MLP example."""

import gc
import os
import pickle
import re
import subprocess
import sys
import warnings
import weakref
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.nn.utils.rnn import pad_sequence  # noqa: E402
from torch.utils.data import (  # noqa: E402
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    Subset,
    TensorDataset,
)

import lazyseq  # noqa: E402
from lazyseq.torch import (  # noqa: E402
    DeviceFeeder,
    LazyBatch,
    as_dataset,
    collate,
    from_dataset,
    predict,
    to_device,
    to_tensors,
)
from lazyseq.torch.transfer import Transfer  # noqa: E402

Pair = namedtuple("Pair", "x y")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def npy_files(tmp_path_factory):
    """1,000 x 8 float64 samples in three memory-mapped chunks, and int64 labels."""
    folder = tmp_path_factory.mktemp("torch-data")
    rng = np.random.default_rng(0)
    samples = rng.standard_normal((1000, 8))
    labels = rng.integers(10, size=1000)
    paths = []
    for k, part in enumerate(np.array_split(np.arange(1000), 3)):
        paths.append(str(folder / f"data_{k}.npy"))
        np.save(paths[-1], samples[part])
    np.save(folder / "labels.npy", labels)
    return paths, str(folder / "labels.npy"), samples, labels


class PerSample(Dataset):
    """The plain torch way: one sample per call, from the memory maps."""

    def __init__(self, paths, labels_path):
        self.maps = [np.load(p, mmap_mode="r") for p in paths]
        self.ends = np.cumsum([len(m) for m in self.maps])
        self.labels = np.load(labels_path, mmap_mode="r")

    def __len__(self):
        return int(self.ends[-1])

    def __getitem__(self, i):
        part = int(np.searchsorted(self.ends, i, side="right"))
        start = 0 if part == 0 else int(self.ends[part - 1])
        return np.array(self.maps[part][i - start]), self.labels[i]


class Counting:
    """A sequence that counts how it is read: item by item, or many at once through ``__getitems__``."""

    def __init__(self, n, batched=True):
        self.data = np.arange(n * 2.0).reshape(n, 2)
        self.single = 0
        self.many: list[list[int]] = []
        if not batched:
            self.__getitems__ = None

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        self.single += 1
        return self.data[i]

    def __getitems__(self, indices):
        self.many.append(list(indices))
        return [self.data[i] for i in indices]


def as_arrays(batch):
    """A loader's batch as numpy arrays, tuples for tuples and lists alike."""
    if isinstance(batch, (tuple, list)):
        return tuple(as_arrays(b) for b in batch)
    return np.asarray(batch)


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for a, b in zip(as_arrays(g), as_arrays(w), strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


# -- to_tensors ----------------------------------------------------------------------------


def test_to_tensors_keeps_the_structure_and_shares_memory():
    x, y = np.arange(6.0).reshape(3, 2), np.arange(3, dtype=np.int32)
    existing = torch.ones(2)
    batch = to_tensors({"pair": Pair(x, [y, "label"]), "n": 3, "t": existing, "none": None})
    assert list(batch) == ["pair", "n", "t", "none"]
    pair = batch["pair"]
    assert type(pair) is Pair and type(pair.y) is list
    assert pair.x.dtype == torch.float64 and pair.y[0].dtype == torch.int32
    assert pair.y[1] == "label" and batch["n"] == 3 and batch["t"] is existing and batch["none"] is None
    assert np.shares_memory(pair.x.numpy(), x) and np.shares_memory(pair.y[0].numpy(), y)
    assert to_tensors((x,))[0].data_ptr() == x.ctypes.data
    assert type(to_tensors((x, y))) is tuple


def test_to_tensors_keeps_the_array_alive():
    array = np.ones(4)
    alive = weakref.ref(array)
    tensor = to_tensors(array)
    del array
    gc.collect()
    assert alive() is not None
    del tensor
    gc.collect()
    assert alive() is None


def test_to_tensors_copies_read_only_arrays_without_a_warning(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(5.0))
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns about non-writable arrays
        tensor = to_tensors(mapped)
    assert tensor.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    tensor[0] = 10.0  # its own memory: writing does not touch the read-only map
    assert mapped[0] == 0.0


def test_to_tensors_copies_what_torch_cannot_share_and_leaves_what_it_cannot_hold():
    backwards = np.arange(4.0)[::-1]
    assert to_tensors(backwards).tolist() == [3.0, 2.0, 1.0, 0.0]
    big_endian = np.arange(3, dtype=">i4")
    converted = to_tensors(big_endian)
    assert converted.dtype == torch.int32 and converted.tolist() == [0, 1, 2]
    strided = np.arange(12.0).reshape(3, 4)[:, ::2]  # positive strides: shared
    assert to_tensors(strided).tolist() == strided.tolist() and np.shares_memory(to_tensors(strided).numpy(), strided)
    for other in (np.array(["a", "b"]), np.array([object(), 1], dtype=object), np.array(["2024-01-01"], "M8[D]")):
        assert to_tensors(other) is other


# -- as_dataset and collate ------------------------------------------------------------------


def seed_view(npy_files):
    paths, labels_path, _, _ = npy_files
    return lazyseq.collate([lazyseq.open_npy(paths), lazyseq.open_npy(labels_path)])


def test_as_dataset_items_and_lazy_batches(npy_files):
    _, _, samples, labels = npy_files
    dataset = as_dataset(seed_view(npy_files))
    assert len(dataset) == 1000
    x, y = dataset[997]
    np.testing.assert_array_equal(x, samples[997])
    assert y == labels[997]
    lazy = dataset.__getitems__([5, 999, 5])
    assert isinstance(lazy, LazyBatch) and len(lazy) == 3
    np.testing.assert_array_equal(lazy[1][0], samples[999])
    np.testing.assert_array_equal(lazy[-1][0], samples[5])
    assert [int(s[1]) for s in lazy[::2]] == [labels[5], labels[5]]
    value = lazy.value
    assert lazy.value is value  # read once
    np.testing.assert_array_equal(value[0], samples[[5, 999, 5]])
    stacked = dataset[np.array([5, 999])]  # a list or array of indices: one stacked batch
    np.testing.assert_array_equal(stacked[1], labels[[5, 999]])
    np.testing.assert_array_equal(dataset[997:][0], samples[997:])
    np.testing.assert_array_equal(dataset[torch.tensor(3)][0], samples[3])  # a 0-d index: one item


def test_every_list_method_of_a_lazy_batch_sees_its_samples():
    # The list itself holds the samples once read: in, count, index, reversed, + and * answered as if it were empty.
    dataset = as_dataset(lazyseq.view([10, 20, 30, 40]))

    def fresh():
        return dataset.__getitems__([0, 1, 2])

    answers = [
        (lambda b: 20 in b, True),
        (lambda b: b.count(20), 1),
        (lambda b: b.index(30), 2),
        (lambda b: list(reversed(b)), [30, 20, 10]),
        (lambda b: b + [1], [10, 20, 30, 1]),
        (lambda b: [1] + b, [1, 10, 20, 30]),
        (lambda b: b * 2, [10, 20, 30] * 2),
        (lambda b: 2 * b, [10, 20, 30] * 2),
        (lambda b: b.copy(), [10, 20, 30]),
        (lambda b: b < [10, 21], True),
        (lambda b: b != [10, 20, 30], False),
        (lambda b: (b.append(5), len(b), list(b))[1:], (4, [10, 20, 30, 5])),
        (lambda b: (b.pop(0), len(b), list(b)), (10, 2, [20, 30])),
    ]
    for ask, expected in answers:
        assert ask(fresh()) == expected
    batch = fresh()
    batch += [7]
    assert type(batch) is LazyBatch and list(batch) == [10, 20, 30, 7] and len(batch) == 4


def full(i):
    return torch.full((2,), float(i))


def test_dataloader_over_items_that_are_tensors_or_strings():
    tensors = lazyseq.smap(full, range(5))
    expected = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    for collate_fn in (None, collate):  # torch's default collation, and lazyseq's: both stack them
        assert torch.equal(next(iter(DataLoader(as_dataset(tensors), batch_size=2, collate_fn=collate_fn))), expected)
    x, i = next(iter(DataLoader(as_dataset(lazyseq.collate([tensors, range(5)])), batch_size=2, collate_fn=collate)))
    assert torch.equal(x, expected) and i.tolist() == [0, 1]
    words = next(iter(DataLoader(as_dataset(["a", "b", "c"]), batch_size=2)))  # default_collate hands them back
    assert words == ["a", "b"] and repr(words) == "['a', 'b']"
    travelled = pickle.loads(pickle.dumps(words))  # as a plain list, without the view
    assert type(travelled) is list and travelled == ["a", "b"]


def test_dataloader_over_a_view_gives_the_per_sample_batches(npy_files):
    paths, labels_path, _, _ = npy_files
    plain = list(DataLoader(PerSample(paths, labels_path), batch_size=64))
    dataset = as_dataset(seed_view(npy_files))
    fast = list(DataLoader(dataset, batch_size=64, collate_fn=collate))
    default = list(DataLoader(dataset, batch_size=64))
    assert len(plain) == 16 and len(plain[-1][0]) == 1000 - 15 * 64
    assert_same_batches(fast, plain)
    assert_same_batches(default, plain)
    assert type(fast[0]) is tuple and type(default[0]) is list and type(plain[0]) is list  # default_collate: lists
    assert fast[0][0].dtype == torch.float64 and fast[0][1].dtype == torch.int64


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_shuffled_with_workers(npy_files, num_workers):
    paths, labels_path, _, _ = npy_files

    def batches(dataset, **options):
        loader = DataLoader(
            dataset,
            batch_size=64,
            shuffle=True,
            generator=torch.Generator().manual_seed(7),
            num_workers=num_workers,
            **options,
        )
        return list(loader)

    plain = batches(PerSample(paths, labels_path))
    fast = batches(as_dataset(seed_view(npy_files)), collate_fn=collate)
    assert_same_batches(fast, plain)
    assert not np.array_equal(as_arrays(plain[0])[1], np.load(labels_path)[:64])  # shuffled indeed


def test_dataloader_reads_each_batch_in_one_call():
    source = Counting(100)
    dataset = as_dataset(source)
    batches = list(DataLoader(dataset, batch_size=32, collate_fn=collate))
    assert source.single == 0
    assert source.many == [list(range(0, 32)), list(range(32, 64)), list(range(64, 96)), list(range(96, 100))]
    assert torch.equal(torch.cat(batches), torch.from_numpy(source.data))
    source.many.clear()
    default = list(DataLoader(dataset, batch_size=32))  # default_collate restacks the samples, read in one call
    assert source.single == 0 and len(source.many) == 4
    assert torch.equal(torch.cat(default), torch.from_numpy(source.data))


def test_dataset_with_a_batch_sampler_and_batch_size_none(npy_files):
    _, _, samples, labels = npy_files
    sampler = BatchSampler(SequentialSampler(range(1000)), batch_size=100, drop_last=False)
    loader = DataLoader(as_dataset(seed_view(npy_files)), sampler=sampler, batch_size=None)
    x, y = next(iter(loader))  # default_convert: tensors, the tuple as a list
    assert torch.equal(x, torch.from_numpy(samples[:100])) and torch.equal(y, torch.from_numpy(labels[:100]))


def test_collate_takes_a_batch_from_a_batch_sampler_as_it_is(npy_files):
    # default_collate took the batch (x, y) for two samples, and failed to stack them: [100, 248] and [100].
    _, _, samples, labels = npy_files
    sampler = BatchSampler(SequentialSampler(range(1000)), batch_size=100, drop_last=False)
    loader = DataLoader(as_dataset(seed_view(npy_files)), sampler=sampler, batch_size=None, collate_fn=collate)
    batches = list(loader)
    assert [type(batch) for batch in batches] == [tuple] * 10
    assert torch.equal(torch.cat([x for x, _ in batches]), torch.from_numpy(samples[:1000]))
    assert torch.equal(torch.cat([y for _, y in batches]), torch.from_numpy(labels[:1000]))
    x = as_dataset(np.arange(12.0).reshape(6, 2))[[4, 1]]
    assert np.shares_memory(collate(x).numpy(), x)  # converted, not stacked again


def test_dataset_pickles_as_its_view(npy_files):
    dataset = pickle.loads(pickle.dumps(as_dataset(seed_view(npy_files))))
    np.testing.assert_array_equal(dataset[3][0], npy_files[2][3])


def test_as_dataset_needs_a_length():
    with pytest.raises(TypeError, match="as_dataset\\(\\) needs a length, but cycle view is infinite"):
        as_dataset(lazyseq.cycle([1, 2]))


def test_collate_passes_other_batches_to_default_collate():
    assert collate([(1, np.float32(2.0))] * 2)[1].dtype == torch.float32
    assert collate(as_dataset(["a", "b", "c"]).__getitems__([2, 1])) == ["c", "b"]


def test_collate_of_samples_that_are_lists_is_default_collates():
    # A list of fields was taken for a list of tensor items and stacked: [x, label] failed, [noisy, clean] became
    # one (2, 2, 3) tensor, rows of 5 floats one transposed (5, 4) tensor.
    X, y = np.arange(12.0).reshape(4, 3), np.arange(4)
    samples = {
        "[x, label]": lazyseq.smap(lambda x, t: [x, t], X, y),
        "[noisy, clean]": lazyseq.smap(lambda x: [x + 100, x], X),
        "[tensor, tensor]": lazyseq.smap(lambda i: [torch.from_numpy(X[i]), torch.tensor(y[i])], range(4)),
        "rows of floats": lazyseq.view(X.tolist()),
    }
    for name, view in samples.items():
        ours = next(iter(DataLoader(as_dataset(view), batch_size=2, collate_fn=collate)))
        torchs = next(iter(DataLoader(as_dataset(view), batch_size=2)))
        assert type(ours) is list and len(ours) == len(torchs), name
        for mine, theirs in zip(ours, torchs):
            assert torch.equal(mine, theirs), name


# -- from_dataset and __getitems__ -------------------------------------------------------------


def test_from_dataset_keeps_tensors():
    pairs = from_dataset(TensorDataset(torch.arange(6.0), torch.arange(6) % 2))
    assert len(pairs) == 6
    x, y = pairs.batch(4)[1]  # tensor items (fields) are stacked into tensors, as torch's default_collate stacks them
    assert torch.equal(x, torch.tensor([4.0, 5.0])) and torch.equal(y, torch.tensor([0, 1]))
    xs, ys = pairs.gather([5, 0]).batch(2, collate_fn=collate)[0]
    assert xs.tolist() == [5.0, 0.0] and ys.tolist() == [1, 0]
    assert torch.equal(from_dataset(torch.arange(4) * 3).batch(2, collate_fn=torch.stack)[1], torch.tensor([6, 9]))


def test_a_batch_stacks_tensor_items_as_torch_does():
    # Tensor items batched into a list of tensors, which a model refused ("argument 'input' must be Tensor, not list").
    X, y = torch.randn(10, 3), torch.arange(10)
    xb, yb = lazyseq.collate([X, y]).shuffle(seed=0).batch(4)[0]
    order = lazyseq.shuffle(range(10), seed=0)[:4]
    assert torch.equal(xb, X[list(order)]) and torch.equal(yb, y[list(order)])
    with to_device(lazyseq.view(X).batch(4), "cpu") as feed:
        assert torch.equal(next(feed), X[:4])
    with pytest.raises(lazyseq.EvaluationError) as info:
        lazyseq.view([torch.zeros(2), torch.zeros(3)]).batch(2)[0]
    assert str(info.value) == (
        "failed to compute batch[0]: ValueError: cannot stack items of different shapes into one array: item 0 "
        "(sequence[0]) has shape (2,), item 1 (sequence[1]) has shape (3,); batch(..., collate_fn=list) gives such "
        "items as a list"
    )
    with pytest.raises(lazyseq.EvaluationError, match=r"TypeError: cannot collate item 1 \(ndarray\) with item 0 "):
        lazyseq.view([torch.zeros(2), np.zeros(2)]).batch(2)[0]
    assert [t.shape for t in lazyseq.view([torch.zeros(2), torch.zeros(3)]).batch(2, collate_fn=list)[0]] == [
        (2,),
        (3,),
    ]


def test_a_tensor_is_viewed_by_rows_read_in_one_call():
    # Row by row, then stacked: about ten times the time of a numpy source's batch.
    X, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    indexed = []

    class Counting(torch.Tensor):  # counts the reads of several rows at once
        def __getitem__(self, key):
            indexed.append(key)
            return super().__getitem__(key)

    rows = lazyseq.view(X.as_subclass(Counting))
    assert repr(rows) == "tensor float32 (10, 2)  [len 10]"
    order = list(lazyseq.shuffle(range(10), seed=1)[:4])
    assert torch.equal(rows.shuffle(seed=1).batch(4)[0], X[order]) and len(indexed) == 1
    assert torch.equal(rows[::-1].batch(3)[0], X.flip(0)[:3])
    assert torch.equal(lazyseq.view(y).batch(4, pad=-1)[2], torch.tensor([8, 9, -1, -1]))
    assert torch.equal(lazyseq.concatenate([y[:2], y[7:]]).batch(5)[0], torch.tensor([0, 1, 7, 8, 9]))
    batch = rows.batch(2)[0]
    batch += 100  # a copy: the data stays as it was
    assert X[0].tolist() == [0.0, 1.0]
    pairs = from_dataset(TensorDataset(X, y))  # the collation of its tensors' rows
    x, labels = pairs.shuffle(seed=1).batch(4)[0]
    assert torch.equal(x, X[order]) and torch.equal(labels, y[order]) and type(pairs[3]) is tuple
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(pairs[3], TensorDataset(X, y)[3]))
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        for sparse in (X.to_sparse(), X.to_sparse_csr()):  # no indexing by a tensor of positions: read row by row
            assert torch.equal(lazyseq.view(sparse).batch(4)[0].to_dense(), X[:4])
    with pytest.raises(TypeError, match="^view\\(\\) needs a tensor with at least one dimension, got a 0-d tensor$"):
        lazyseq.view(torch.tensor(3.0))


def test_a_batch_of_tensor_fields_is_written_back_item_by_item():
    # Its fields, now tensors, were taken for two items: item 0 became the whole x field, item 1 the y field.
    pairs = [(torch.tensor([float(i), 0.0]), torch.tensor(i)) for i in range(4)]
    records = [{"x": torch.tensor([float(i)]), "y": torch.tensor(i)} for i in range(4)]
    for items in (pairs, records):
        batches = lazyseq.view(items).batch(2)
        read = batches[1]
        batches[0] = read
        assert [str(item) for item in items] == [str(items[2]), str(items[3]), str(items[2]), str(items[3])]


def test_a_dataset_of_tensor_items_reads_each_item_once():
    # Read as samples, then again as the stacked batch that collate asked for: 12 reads of 8 items.
    reads = []

    def item(i):
        reads.append(i)
        if i == 9:
            raise OSError("unreadable")
        return torch.full((2,), float(i))

    dataset = as_dataset(lazyseq.smap(item, range(10)))
    batches = list(DataLoader(dataset, batch_size=4, collate_fn=collate, sampler=range(8)))
    assert sorted(reads) == list(range(8)) and [b[:, 0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    failing = LazyBatch(dataset.view, [8, 9])
    assert repr(failing) == "LazyBatch(2 samples)"  # an item that fails to read: what it is, not the error
    # Of several shapes (sequences a collate_fn pads), each batch read them again after failing to stack them.
    reads.clear()
    ragged = as_dataset(lazyseq.smap(lambda i: torch.arange(reads.append(i) or i % 5 + 1), range(40)))
    padded = list(DataLoader(ragged, batch_size=8, collate_fn=lambda b: pad_sequence(list(b), batch_first=True)))
    assert len(reads) == 48 and [tuple(b.shape) for b in padded] == [(8, 5)] * 5  # the first batch twice: it tells
    reads.clear()  # a first batch that stacks, then one that does not: each item read once
    mixed = as_dataset(lazyseq.smap(lambda i: torch.zeros(reads.append(i) or (2 if i < 4 else i)), range(8)))
    shapes = [[tuple(t.shape) for t in b] for b in DataLoader(mixed, batch_size=4, collate_fn=list)]
    assert sorted(reads) == list(range(8)) and shapes == [[(2,)] * 4, [(4,), (5,), (6,), (7,)]]


def test_a_batch_of_tensor_items_is_padded_with_tensors_like_them():
    # pad=0.0 could not be stacked with the tensors ("cannot collate item 1 (float) with item 0 (Tensor)"); a tensor
    # pad of another dtype changed the batch's dtype.
    rows = lazyseq.view([torch.arange(2) + k for k in range(3)])
    assert torch.equal(rows.batch(2, pad=-1)[1], torch.tensor([[2, 3], [-1, -1]]))
    pairs = from_dataset(TensorDataset(torch.ones(3, 2), torch.arange(3)))
    x, y = pairs.batch(2, pad=(0.0, -1))[1]
    assert torch.equal(x, torch.tensor([[1.0, 1.0], [0.0, 0.0]])) and torch.equal(y, torch.tensor([2, -1]))
    with pytest.raises(lazyseq.EvaluationError, match="pad .* cannot be held as the items' dtype int64 without a"):
        rows.batch(2, pad=torch.tensor([0.5, 0.5]))[1]
    halves = lazyseq.view([torch.ones(2, dtype=torch.bfloat16)] * 3)
    assert torch.equal(halves.batch(2, pad=-2)[1], torch.tensor([[1.0, 1.0], [-2.0, -2.0]], dtype=torch.bfloat16))
    for pad in (1e40, "x", 257):  # made inf; torch's "new(): invalid data type 'str'"; rounded to 256
        with pytest.raises(lazyseq.EvaluationError, match="the items' dtype torch.bfloat16 without a change"):
            halves.batch(2, pad=pad)[1]
    for pad in (float("inf"), torch.tensor([0.5, -1.0], dtype=torch.bfloat16)):  # as float32 items take them
        assert halves.batch(2, pad=pad)[1].dtype == torch.bfloat16


def test_tensors_index_views_as_arrays_do():
    # An index tensor was refused: "array indices must be integers, slices or integer arrays, not Tensor".
    v = lazyseq.view(np.arange(20.0).reshape(10, 2))
    assert v[torch.tensor([3, 1])].batch(2)[0].tolist() == [[6.0, 7.0], [2.0, 3.0]]
    assert v[torch.arange(10) % 4 == 0].batch(3)[0].tolist() == [[0.0, 1.0], [8.0, 9.0], [16.0, 17.0]]
    assert as_dataset(v)[torch.tensor([9, 0])].tolist() == [[18.0, 19.0], [0.0, 1.0]]
    with pytest.raises(TypeError, match=r"^array indices must be integers, slices or integer arrays, not an array of "):
        v[torch.tensor([1.5])]
    assert len(v[torch.tensor([3])]) == 1 and v[torch.tensor(3)].tolist() == [6.0, 7.0]  # one index in a tensor
    with pytest.raises(TypeError, match=r"^array indices must be integers, slices or integer arrays, not Tensor$"):
        v[torch.tensor(True)]  # refused, as a numpy boolean is
    assert v[torch.tensor([1, 2], dtype=torch.float64).requires_grad_().long()].batch(2)[0].tolist() == [
        [2.0, 3.0],
        [4.0, 5.0],
    ]
    with pytest.raises(TypeError, match=r"^a uint8 tensor as an index is positions to numpy and a mask to torch: "):
        v[torch.tensor([1, 0], dtype=torch.uint8)]
    assert v[torch.tensor(3, dtype=torch.uint8)].tolist() == [6.0, 7.0]  # one: a position, to torch too
    writable = lazyseq.view(np.zeros(4))
    writable[torch.tensor([1, 3])] = [5.0, 6.0]
    writable[torch.tensor([2])] = [7.0]
    assert writable.source.tolist() == [0.0, 5.0, 7.0, 6.0]


def test_from_dataset_reads_through_getitems():
    source = Counting(10)
    v = from_dataset(source)
    np.testing.assert_array_equal(v.batch(4)[1], source.data[4:8])
    np.testing.assert_array_equal(v.gather([9, 1]).batch(2)[0], source.data[[9, 1]])
    assert source.many == [[4, 5, 6, 7], [9, 1]] and source.single == 0
    np.testing.assert_array_equal(v[3], source.data[3])
    assert source.single == 1
    subset = from_dataset(Subset(source, [8, 2, 0]))  # torch's Subset passes batches on to __getitems__
    np.testing.assert_array_equal(subset.batch(3)[0], source.data[[8, 2, 0]])
    assert source.many[-1] == [8, 2, 0]


def test_getitems_set_to_none_is_not_used():
    source = Counting(10, batched=False)
    np.testing.assert_array_equal(lazyseq.view(source).batch(5)[1], source.data[5:])
    assert source.single == 5 and source.many == []


def test_getitems_returning_the_wrong_count_is_an_error():
    class Short(Counting):
        def __getitems__(self, indices):
            return super().__getitems__(indices)[:-1]

    with pytest.raises(lazyseq.EvaluationError, match="Short.__getitems__ returned 3 items for 4 indices") as info:
        lazyseq.view(Short(10)).batch(4)[1]
    assert type(info.value.__cause__) is ValueError


def test_from_dataset_round_trip_and_iterable_datasets():
    v = lazyseq.view(np.arange(5))
    assert from_dataset(as_dataset(v)) is v

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(TypeError, match="from_dataset: Stream is an IterableDataset, which has no random access"):
        from_dataset(Stream())


# -- to_device on the CPU --------------------------------------------------------------------


def counted(batches, pulled):
    """The batches, counting in ``pulled[0]`` how many were taken."""
    for b in batches:
        pulled[0] += 1
        yield b


def test_to_device_values_order_structure_dtypes():
    batches = [
        {"x": np.full((2, 3), k, dtype=np.float32), "pair": Pair(np.array([k, -k]), [np.uint8(k), "tag"])}
        for k in range(5)
    ]
    got = list(to_device(batches, "cpu"))
    assert len(got) == 5
    for k, batch in enumerate(got):
        assert list(batch) == ["x", "pair"] and type(batch["pair"]) is Pair and type(batch["pair"].y) is list
        assert batch["x"].dtype == torch.float32 and batch["x"].device.type == "cpu"
        assert batch["x"].tolist() == [[float(k)] * 3] * 2
        assert batch["pair"].x.dtype == torch.int64 and batch["pair"].x.tolist() == [k, -k]
        assert batch["pair"].y == [np.uint8(k), "tag"]  # not arrays: passed through
        assert np.shares_memory(batch["x"].numpy(), batches[k]["x"])  # no copy on the CPU


def test_to_device_refuses_one_mapping_for_its_batches():
    # Its keys were taken for the batches, and came back as they were.
    with pytest.raises(TypeError) as caught:
        to_device({"x": np.zeros(3), "y": np.ones(3)}, "cpu")
    assert str(caught.value) == (
        "to_device: batches must be an iterable of batches, got one dict (a batch?): give [batch] for one batch"
    )


def test_to_device_leaves_tensors_on_the_device_alone():
    t = torch.arange(3)
    (got,) = list(to_device([(t, "s")], "cpu"))
    assert got[0] is t and got[1] == "s"


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_to_device_pulls_ahead_batches_early(ahead):
    pulled = [0]
    n = 6
    seen = []
    with to_device(counted([np.array([k]) for k in range(n)], pulled), "cpu", ahead=ahead) as feeder:
        for k, batch in enumerate(feeder):
            assert batch.item() == k
            seen.append((pulled[0], feeder.pulled))
    assert seen == [(min(k + 1 + ahead, n),) * 2 for k in range(n)]


def test_to_device_batches_of_changing_shapes():
    shapes = [(4, 2), (4, 2), (1, 2), (5, 3), (2,)]
    batches = [np.arange(np.prod(s), dtype=np.int16).reshape(s) for s in shapes]
    got = list(to_device(batches, "cpu", ahead=1))
    assert [tuple(t.shape) for t in got] == shapes
    assert all(t.dtype == torch.int16 and t.tolist() == b.tolist() for t, b in zip(got, batches))


def test_to_device_close_releases_the_batches_sent_ahead():
    arrays = [np.full(3, k) for k in range(6)]
    alive = [weakref.ref(a) for a in arrays]
    finished = []

    class Batches:
        def __init__(self, arrays):
            self.arrays = arrays

        def __iter__(self):
            try:
                while self.arrays:
                    yield self.arrays.pop(0)  # the source keeps no reference to what it gave
            finally:
                finished.append(True)

    feeder = to_device(Batches(arrays), "cpu", ahead=2)
    del arrays
    first = next(feeder)
    assert feeder.pulled == 3
    feeder.close()
    feeder.close()  # idempotent
    del first
    gc.collect()
    assert [r() for r in alive] == [None] * 6
    assert finished == [True]  # the iterator it made over Batches() is closed
    with pytest.raises(StopIteration):
        next(feeder)
    assert repr(feeder) == "to_device(cpu, ahead=2)  [closed]"


def test_breaking_out_of_the_loop_releases_everything():
    arrays = [np.full(3, k) for k in range(6)]
    alive = [weakref.ref(a) for a in arrays]
    source = (arrays.pop(0) for _ in range(6))  # keeps no reference to what it gave
    for _batch in to_device(source, "cpu", ahead=2):
        break
    del _batch
    gc.collect()
    assert [r() is None for r in alive] == [True, True, True, False, False, False]  # 3 left in the source
    assert next(source)[0] == 3  # an iterator that was passed in is not closed: it is the caller's
    del arrays


def test_errors_from_the_source_come_in_their_turn_unchanged():
    error = ValueError("bad batch 2")

    def failing():
        yield np.zeros(1)
        yield np.ones(1)
        raise error

    feeder = to_device(failing(), "cpu", ahead=3)
    assert next(feeder).item() == 0.0 and next(feeder).item() == 1.0
    with pytest.raises(ValueError, match="^bad batch 2$") as info:
        next(feeder)
    assert info.value is error
    with pytest.raises(StopIteration):
        next(feeder)


def test_an_iterator_that_goes_on_after_an_error():
    class Flaky:
        def __init__(self):
            self.k = 0

        def __iter__(self):
            return self

        def __next__(self):
            self.k += 1
            if self.k > 4:
                raise StopIteration
            if self.k == 2:
                raise KeyError("item 1")
            return np.array([self.k])

    got = []
    feeder = to_device(Flaky(), "cpu", ahead=1)
    got.append(next(feeder).item())
    with pytest.raises(KeyError, match="item 1"):
        next(feeder)
    got += [b.item() for b in feeder]
    assert got == [1, 3, 4]


def test_an_interrupt_from_a_generator_leaves_the_batches_sent_ahead_to_read():
    def interrupted():
        yield np.zeros(1)
        raise KeyboardInterrupt

    feeder = to_device(interrupted(), "cpu", ahead=2)
    with pytest.raises(KeyboardInterrupt):
        next(feeder)
    assert not feeder.closed
    assert [batch.item() for batch in feeder] == [0.0]  # the generator ended with the interrupt
    assert feeder.closed


class _InterruptedOnce:
    """Batches 0 to 5; reading batch 3 is interrupted once (Ctrl-C as the loop waits), as a loader's iterator is:
    the next read gives batch 3."""

    def __init__(self):
        self.next, self.interrupted = 0, False

    def __iter__(self):
        return self

    def __next__(self):
        if self.next == 6:
            raise StopIteration
        if self.next == 3 and not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        self.next += 1
        return np.array([self.next - 1])


def test_a_loop_interrupted_as_it_waits_can_be_run_again_to_the_end():
    feeder = to_device(_InterruptedOnce(), "cpu", ahead=1)
    got = []
    with pytest.raises(KeyboardInterrupt):
        for batch in feeder:
            got.append(batch.item())
    assert got == [0, 1] and not feeder.closed  # batch 2 was sent ahead
    got += [batch.item() for batch in feeder]  # the notebook cell run again
    assert got == [0, 1, 2, 3, 4, 5]


def test_a_loop_over_a_view_interrupted_as_it_waits_can_be_run_again_to_the_end():
    # The view's iterator (a generator) ended with the interrupt: the loop run again gave what was sent ahead, then
    # stopped, batches 4 to 9 gone without a word.
    interrupted = []

    def slow(x):
        if x == 4 and not interrupted:
            interrupted.append(x)
            raise KeyboardInterrupt  # as a Ctrl-C while it computes
        if x == 7:
            raise ValueError("bad item 7")
        return x

    feeder = to_device(lazyseq.smap(slow, np.arange(10.0)).batch(2), "cpu", ahead=1)
    got = []
    with pytest.raises(KeyboardInterrupt):
        for batch in feeder:
            got.append(batch.tolist())
    with pytest.raises(lazyseq.EvaluationError, match="bad item 7"):
        for batch in feeder:
            got.append(batch.tolist())
    got += [batch.tolist() for batch in feeder]  # on past the batch that failed
    assert got == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [8.0, 9.0]]


def test_views_that_iterate_their_own_way_are_iterated_so():
    # Read by position: unbatch computed its batch once per row, and a prefetch view lost its state_dict.
    calls = []

    def made(b):
        calls.append(b)
        return np.full((4, 2), float(b))

    rows = lazyseq.view(range(3)).smap(made).unbatch(4)
    assert len(list(to_device(rows, "cpu", ahead=0))) == 12 and calls == [0, 1, 2]
    loaded = lazyseq.prefetch(lazyseq.view(np.arange(10.0)).batch(2), nworkers=0)
    with to_device(loaded, "cpu", ahead=1) as feeder:
        next(feeder)
        assert feeder.state_dict()["position"] == 1


def test_a_batch_taken_as_an_interrupt_came_is_sent_by_the_next_read():
    class InterruptedCopy(Transfer):
        copies = 0

        def copy(self, host):
            type(self).copies += 1
            if type(self).copies == 3:
                raise KeyboardInterrupt
            return super().copy(host)

    batches = iter([np.array([k]) for k in range(5)])
    feeder = DeviceFeeder(batches, "cpu", ahead=1, transfer=InterruptedCopy(torch.device("cpu"), non_blocking=True))
    got = [next(feeder).item()]
    with pytest.raises(KeyboardInterrupt):
        got.append(next(feeder).item())  # its read took batch 2 ahead, and the interrupt came as it was copied
    got += [batch.item() for batch in feeder]
    assert got == [0, 1, 2, 3, 4]
    assert feeder.pulled == 5


def test_to_device_arguments():
    with pytest.raises(ValueError, match=r"^to_device: ahead must be a non-negative integer, got -1$"):
        to_device([], "cpu", ahead=-1)
    with pytest.raises(TypeError, match=r"^to_device: ahead must be a non-negative integer, got 1.0$"):
        to_device([], "cpu", ahead=1.0)
    for dtype in (torch.int64, np.float32, "float32"):
        with pytest.raises(
            TypeError,
            match=rf"^to_device: dtype must be a floating-point torch dtype \(torch.float32, ...\) or None, got {dtype!r}$",
        ):
            to_device([], "cpu", dtype=dtype)
    with pytest.raises(ValueError, match="to_device: pin_memory=True needs a CUDA device, got cpu"):
        to_device([], "cpu", pin_memory=True)
    assert list(to_device([], "cpu")) == []
    # torch's own errors named neither the function nor the argument ('int' object is not iterable; device()
    # received an invalid combination of arguments, with its list of every constructor)
    with pytest.raises(TypeError) as caught:
        to_device(5, "cpu")
    assert str(caught.value) == "to_device: batches must be an iterable of batches (a view, a loader, a list), not int"
    for device in (None, 1.5, True):
        with pytest.raises(TypeError) as caught:
            to_device([], device)
        assert str(caught.value) == (
            f"to_device: device must be a torch.device, its name ('cpu', 'cuda:0') or an accelerator's index, "
            f"not {device!r}"
        )
    if not torch.accelerator.is_available():  # an index, numpy's too, is an accelerator's, as torch reads it
        for index in (0, np.int64(0)):
            with pytest.raises(RuntimeError, match=r"^to_device: device 0: Cannot access accelerator device"):
                to_device([], index)
    with pytest.raises(RuntimeError, match=r"^to_device: device 'gpu': Expected one of cpu, cuda"):
        to_device([], "gpu")
    with pytest.raises(TypeError, match=r"^predict: device must be a torch.device, its name .* not None$"):
        predict(torch.nn.Linear(2, 1), np.zeros((3, 2), np.float32), device=None)

    class Broken:  # an iterable whose own __iter__ fails: its error, not a message about what batches must be
        def __iter__(self):
            raise TypeError("a bug in the loader")

    with pytest.raises(TypeError, match="^a bug in the loader$"):
        to_device(Broken(), "cpu")


def test_predict_refuses_a_model_that_is_no_module():
    # It failed on the model's missing .training flag (AttributeError: 'function' object has no attribute...).
    with pytest.raises(TypeError) as caught:
        predict(lambda x: x * 2, np.arange(10.0), batch_size=4)
    assert str(caught.value) == (
        "predict: model must be a torch.nn.Module, not function: lazyseq.evaluate(fn, data) applies any function "
        "to batches"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_to_device_cuda_without_cuda():
    with pytest.raises(RuntimeError, match="to_device: device cuda asked for, but CUDA is not available to torch"):
        to_device([], "cuda")


def test_to_device_moves_to_another_device():
    (x, y) = next(to_device([(np.zeros((2, 3), np.float32), np.arange(2))], "meta"))
    assert x.device.type == "meta" and x.shape == (2, 3) and x.dtype == torch.float32 and y.dtype == torch.int64


def test_to_device_dtype_converts_floating_leaves_only():
    batch = {
        "x": np.arange(6.0).reshape(3, 2),
        "half": np.ones(3, np.float16),
        "y": np.arange(3),
        "mask": np.array([True, False, True]),
        "z": np.ones(2, np.complex128),
        "name": "train",
    }
    (got,) = list(to_device([batch], "cpu", dtype=torch.float32))
    assert {key: getattr(value, "dtype", None) for key, value in got.items()} == {
        "x": torch.float32,
        "half": torch.float32,
        "y": torch.int64,
        "mask": torch.bool,
        "z": torch.complex128,
        "name": None,
    }
    assert got["x"].tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]] and got["name"] == "train"
    (same,) = list(to_device([torch.ones(2, dtype=torch.bfloat16)], "cpu", dtype=torch.bfloat16))
    assert same.dtype == torch.bfloat16


def test_predict_with_dtype_feeds_a_float32_model():
    layer = torch.nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.fill_(1.0), layer.bias.fill_(0.5)
    data = np.arange(10.0).reshape(5, 2)
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        predict(layer, data, batch_size=2)
    scores = predict(layer, data, batch_size=2, dtype=torch.float32)
    assert scores.dtype == np.float32 and scores.ravel().tolist() == [1.5, 5.5, 9.5, 13.5, 17.5]


# -- the staging loop, run on the CPU with a transfer that stages like CUDA's --------------------------------


class Recording(Transfer):
    """The CUDA loop without CUDA: staging buffers, events that log, device copies that clone."""

    staging = True
    holds_host = True

    def __init__(self):
        super().__init__(torch.device("cpu"), non_blocking=True)
        self.log: list = []
        self.buffers: list = []

    def new_event(self):
        log, number = self.log, len([e for e in self.log if e[0] == "event"])
        self.log.append(("event", number))

        class Event:
            def record(self, stream=None):
                log.append(("record", number))

            def synchronize(self):
                log.append(("synchronize", number))

        return Event()

    def allocate(self, shape, dtype):
        buffer = super().allocate(shape, dtype)
        self.buffers.append(buffer)
        return buffer

    def needs_staging(self, tensor):
        return isinstance(tensor, torch.Tensor)

    def copy(self, host):
        self.log.append(("copy", [t.data_ptr() for t in host]))
        return [t.clone() for t in host]

    def hand_over(self, leaves, event):
        self.log.append(("hand_over",))


def test_staging_slots_are_reused_only_after_their_copy():
    transfer = Recording()
    batches = [(np.full((4, 2), k, np.float32), np.arange(4) + k) for k in range(7)]
    feeder = DeviceFeeder(batches, "cpu", ahead=2, transfer=transfer)
    got = [(x.tolist(), y.tolist()) for x, y in feeder]
    assert got == [(b[0].tolist(), b[1].tolist()) for b in batches]
    assert transfer.allocations == 6  # 3 slots x 2 arrays, allocated once
    steps = [e for e in transfer.log if e[0] in ("synchronize", "record")]
    # batch k goes through slot k % 3: its event is waited for before the slot is filled, recorded after the copy
    assert steps[:14] == [(kind, k % 3) for k in range(7) for kind in ("synchronize", "record")]
    copies = [e[1] for e in transfer.log if e[0] == "copy"]
    slot_addresses = [copies[k] for k in range(3)]
    assert all(copies[k] == slot_addresses[k % 3] for k in range(7))  # the same pinned buffers, in turn


def test_staging_a_shorter_last_batch_and_other_shapes():
    transfer = Recording()
    shapes = [(4, 2), (4, 2), (3, 2), (6, 2), (4, 2), (2, 5)]
    batches = [np.arange(np.prod(s), dtype=np.float64).reshape(s) + k for k, s in enumerate(shapes)]
    got = list(DeviceFeeder(batches, "cpu", ahead=1, transfer=transfer))
    assert [t.tolist() for t in got] == [b.tolist() for b in batches]
    # slots from the first batch (2); the short batch uses the first rows of its slot; (6, 2) and (2, 5)
    # get buffers of their own in their slots, and (4, 2) then fits in the first rows of (6, 2)
    assert [tuple(b.shape) for b in transfer.buffers] == [(4, 2), (4, 2), (6, 2), (2, 5)]


def test_staging_converts_floating_leaves_into_buffers_of_the_dtype_asked_for():
    transfer = Recording()
    transfer.dtype = torch.float32
    batches = [(np.full((4, 2), k, np.float64), np.arange(4) + k) for k in range(3)]
    got = list(DeviceFeeder(batches, "cpu", ahead=1, transfer=transfer))
    assert [(x.dtype, y.dtype) for x, y in got] == [(torch.float32, torch.int64)] * 3
    assert [x.tolist() for x, _ in got] == [[[float(k)] * 2] * 4 for k in range(3)]
    # the pinned slots hold float32: the conversion is the copy into them, not a step of its own
    assert [(tuple(b.shape), b.dtype) for b in transfer.buffers] == [((4, 2), torch.float32), ((4,), torch.int64)] * 2


def test_staging_a_change_of_structure_or_dtype():
    transfer = Recording()
    batches = [np.zeros(3, np.float32), (np.ones(3, np.float32), np.ones(2, np.int64)), np.zeros(3, np.float64)]
    got = list(DeviceFeeder(batches, "cpu", ahead=0, transfer=transfer))
    assert got[0].tolist() == [0.0] * 3 and got[1][1].tolist() == [1, 1] and got[2].dtype == torch.float64
    assert [(tuple(b.shape), b.dtype) for b in transfer.buffers] == [
        ((3,), torch.float32),
        ((3,), torch.float32),
        ((2,), torch.int64),
        ((3,), torch.float64),
    ]


# -- with lazyseq's loaders ---------------------------------------------------------------------------


def test_to_device_over_a_process_loader(npy_files):
    view = seed_view(npy_files).shuffle(seed=3).batch(100)
    with lazyseq.prefetch(view, nworkers=2, method="process", max_buffered=4) as ahead:
        got = [(x.clone(), y.clone()) for x, y in to_device(ahead, "cpu", ahead=2)]
    want = list(view)
    assert len(got) == 10
    for (x, y), (wx, wy) in zip(got, want):
        assert torch.equal(x, torch.from_numpy(wx)) and torch.equal(y, torch.from_numpy(wy))


# -- predict and evaluate ---------------------------------------------------------------------


class Probe(torch.nn.Module):
    """A linear layer that notes, at each call, whether gradients were on and the training flag."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 2, dtype=torch.float64)
        self.calls = []

    def forward(self, x, scale=1.0):
        self.calls.append((torch.is_grad_enabled(), self.training, x.shape[0]))
        return self.layer(x) * scale


def test_predict_runs_in_eval_mode_without_gradients():
    torch.manual_seed(0)
    model = Probe()
    x = np.random.default_rng(0).standard_normal((10, 3))
    scores = predict(model, x, batch_size=4)
    with torch.no_grad():
        np.testing.assert_allclose(scores, model.layer(torch.from_numpy(x)).numpy())
    assert model.calls == [(False, False, 4), (False, False, 4), (False, False, 2)]
    assert model.training  # restored


def test_predict_passes_tuples_and_dicts_as_arguments():
    model = Probe()
    x = np.ones((5, 3))
    pairs = lazyseq.collate([x, np.full((5, 1), 2.0)])
    doubled = predict(model, pairs, batch_size=5)  # (x, scale) batches: two positional arguments
    by_name = predict(model, lazyseq.smap(lambda row: {"x": row, "scale": np.full(2, 2.0)}, x), batch_size=5)
    np.testing.assert_allclose(doubled, by_name)
    np.testing.assert_allclose(doubled, 2 * predict(model, x))


def test_predict_over_labelled_items_says_to_give_the_inputs_alone():
    # The model's own TypeError ("takes 2 positional arguments but 3 were given") said nothing of predict
    layer = torch.nn.Linear(2, 1, dtype=torch.float64)
    with pytest.raises(TypeError) as caught:
        predict(layer, lazyseq.collate([np.zeros((6, 2)), np.arange(6)]), batch_size=4)
    assert caught.value.__notes__[0] == (
        "predict gives the model the 2 fields of a batch of tuples as 2 arguments; for (inputs, labels) items, "
        "predict on the inputs alone"
    )


def test_evaluate_with_a_torch_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4, dtype=torch.float64), torch.nn.ReLU())
    x = np.random.default_rng(1).standard_normal((100, 8))
    test = lazyseq.collate([x, np.arange(100)])
    scores = lazyseq.evaluate(lambda b: model(torch.from_numpy(b[0])), test, batch_size=64)
    np.testing.assert_allclose(scores, model(torch.from_numpy(x)).detach().numpy())


# -- the example, and the import boundary ------------------------------------------------------------


def test_the_mlp_example_learns_deterministically(tmp_path):
    from lazyseq.demo import write_dataset
    from lazyseq.torch.example import main, train_and_test

    write_dataset(str(tmp_path), 6000)
    first = train_and_test(str(tmp_path), n_test=2000, epochs=2)
    again = train_and_test(str(tmp_path), n_test=2000, epochs=2)
    assert first["steps"] == 2 * 63
    assert first["accuracy"] >= 0.98  # 100% observed: the classes are far apart
    assert (first["loss"], first["accuracy"]) == (again["loss"], again["accuracy"])
    result = main(["--samples", "3000", "--test", "1000", "--epochs", "1"])
    assert result["accuracy"] >= 0.95 and result["steps"] == 32


def test_the_mlp_example_leaves_the_loader_a_core_and_restores_torch_threads(tmp_path, capsys):
    from lazyseq.demo import write_dataset
    from lazyseq.loading.options import available_cores
    from lazyseq.torch.example import main, train_and_test

    write_dataset(str(tmp_path), 600)
    before = torch.get_num_threads()
    result = train_and_test(str(tmp_path), n_test=200, epochs=1)
    assert result["torch_threads"] == max(1, available_cores() - 1)
    assert torch.get_num_threads() == before
    main(["--samples", "600", "--test", "200", "--epochs", "1"])
    assert f"(torch with {max(1, available_cores() - 1)} threads)" in capsys.readouterr().out


def test_lazyseq_alone_does_not_import_torch_but_lazyseq_torch_does():
    code = "import sys, lazyseq; a = 'torch' in sys.modules; import lazyseq.torch; print(a, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.split() == ["False", "True"]


# -- CUDA only (skipped where there is no GPU) ----------------------------------------------------------


@needs_cuda
def test_cuda_values_pinned_slots_and_streams():
    batches = [(np.full((8, 4), k, np.float32), np.arange(8) + k) for k in range(6)] + [
        (np.full((3, 4), 6, np.float32), np.arange(3) + 6)
    ]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), to_device(batches, "cuda", ahead=2) as feeder:  # a consumer on its own stream
        got = [(x * 2, y + 0) for x, y in feeder]
        transfer = feeder._transfer
        assert transfer.allocations == 6  # 3 pinned slots x 2 arrays
        assert all(b.is_pinned() for slot in feeder._slots for b in slot.buffers)
    torch.cuda.synchronize()
    for (x, y), (bx, by) in zip(got, batches):
        assert x.device.type == "cuda" and x.dtype == torch.float32 and y.dtype == torch.int64
        assert torch.equal(x.cpu(), torch.from_numpy(bx) * 2) and torch.equal(y.cpu(), torch.from_numpy(by))


@needs_cuda
def test_cuda_without_pinning_and_with_tensors_on_the_gpu():
    on_gpu = torch.arange(4, device="cuda")
    feeder = to_device([(np.ones(4), on_gpu)], "cuda", pin_memory=False)
    x, y = next(feeder)
    assert y is on_gpu and x.device.type == "cuda" and feeder._transfer.allocations == 0
    assert x.cpu().tolist() == [1.0] * 4


@needs_cuda
def test_cuda_predict():
    model = torch.nn.Linear(3, 2, dtype=torch.float64).cuda()
    x = np.random.default_rng(0).standard_normal((10, 3))
    scores = predict(model, x, batch_size=4, device="cuda")
    with torch.no_grad():
        np.testing.assert_allclose(scores, model(torch.from_numpy(x).cuda()).cpu().numpy())


# -- the README's PyTorch code, as written ---------------------------------------------------------------------


def readme_torch_code() -> str:
    """The README's code block that uses ``lazyseq.torch``."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    (code,) = [block for block in blocks if "from lazyseq.torch import" in block]
    return code


def test_readme_training_loop_runs_as_written_on_the_cpu():
    """The README's loop with a float32 model over float64 samples, on the CPU instead of "cuda"."""
    code = readme_torch_code()
    rng = np.random.default_rng(0)
    data = lazyseq.view(rng.normal(size=(300, 248)))  # float64, like the README's .npy chunks
    labels = lazyseq.view(rng.integers(0, 10, size=300))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(248, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))  # float32
    before = [p.detach().clone() for p in model.parameters()]
    namespace = {
        "data": data,
        "train": lazyseq.collate([data, labels])[:-100],
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.01),
        "loss_fn": torch.nn.CrossEntropyLoss(),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the README advises beside busy loader workers
    try:
        exec(compile(code.replace('"cuda"', '"cpu"'), "README.md", "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # it trained
    scores = namespace["scores"]
    assert scores.shape == (300, 10) and scores.dtype == np.float32
    assert isinstance(namespace["loader"], DataLoader)


def test_results_in_bfloat16_or_with_a_lazy_conjugate_are_collected():
    # "Got unsupported ScalarType BFloat16", "Can't call numpy() on Tensor that has conjugate bit set"
    model = torch.nn.Linear(2, 1).to(torch.bfloat16)
    predicted = predict(model, np.ones((4, 2)), dtype=torch.bfloat16)
    assert predicted.dtype == np.float32 and predicted.shape == (4, 1)
    conjugates = lazyseq.evaluate(lambda b: torch.from_numpy(b).to(torch.complex64).conj() * 1j, np.arange(3.0), 2)
    np.testing.assert_array_equal(conjugates, np.arange(3.0) * 1j)


def test_a_field_of_a_structured_array_and_a_masked_array_are_handled_as_documented():
    records = np.zeros(3, dtype=[("x", "f8"), ("y", "i4")])
    records["x"] = [1.0, 2.0, 3.0]
    # strides that are not whole elements: copied (torch refused them)
    assert to_tensors(records["x"]).tolist() == next(to_device([records["x"]], "cpu")).tolist() == [1.0, 2.0, 3.0]
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    assert type(next(to_device([masked], "cpu"))) is np.ma.MaskedArray  # as to_tensors: its mask was dropped


def test_predict_gives_back_each_modules_own_training_flag():
    # model.train(was_training) put a frozen BatchNorm back into training: its running statistics changed after.
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2), torch.nn.Dropout(0.5))
    model.train()
    model[0].eval()  # frozen while the rest is fine-tuned
    predict(model, np.random.default_rng(0).random((10, 3), dtype=np.float32), batch_size=4)
    assert [module.training for module in model.modules()] == [True, False, True, True]


class ModeDependent(torch.nn.Module):
    """A model whose own train() keeps some state in step with the mode."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)
        self.noise = 0.1

    def train(self, mode=True):
        super().train(mode)
        self.noise = 0.1 if mode else 0.0
        return self

    def forward(self, x):
        return self.linear(x)


def test_predict_gives_a_model_back_through_its_own_train():
    model = ModeDependent().train()
    predict(model, np.zeros((4, 2), np.float32), batch_size=2)
    assert model.training and model.noise == 0.1


def test_predict_of_float64_data_by_a_float32_model_says_dtype_converts():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(RuntimeError) as caught:
        predict(model, np.zeros((6, 4)), batch_size=3)
    assert caught.value.__notes__[0] == (
        "predict: the data are torch.float64 and the model's parameters torch.float32: dtype=torch.float32 converts "
        "the data on the way"
    )
    assert predict(model, np.zeros((6, 4)), batch_size=3, dtype=torch.float32).shape == (6, 2)
    for layer, data in [(torch.nn.Conv1d(2, 2, 1), np.zeros((2, 2, 3))), (torch.nn.LSTM(2, 2), np.zeros((2, 1, 2)))]:
        with pytest.raises((RuntimeError, ValueError)) as caught:
            predict(layer, data, batch_size=2)
        assert caught.value.__notes__[0].startswith("predict: the data are torch.float64 and the model's parameters")

    class Failing(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError) as caught:  # not about dtypes: no such note
        predict(torch.nn.Sequential(Failing(), torch.nn.Linear(4, 4)), np.zeros((6, 4)), batch_size=3)
    assert caught.value.__notes__ == ["raised on batch 0 (items 0 to 2) in predict"]
    with pytest.raises(RuntimeError) as caught:  # floats where indices go: dtype= would not help
        predict(torch.nn.Embedding(4, 2), np.zeros(6), batch_size=3)
    assert not any(note.startswith("predict: the data are") for note in caught.value.__notes__)


def test_predict_over_tensors_gives_the_model_one_stacked_input():
    # A batch of tensor items is a list of them, which predict spread into model(*rows): a TypeError, or one
    # argument per sample for a model that takes *args.
    torch.manual_seed(0)
    X = torch.randn(10, 4, dtype=torch.float64)
    model = torch.nn.Linear(4, 2, dtype=torch.float64)
    with torch.no_grad():
        expected = model(X).numpy()
    np.testing.assert_allclose(predict(model, X, batch_size=3), expected)
    np.testing.assert_allclose(predict(model, from_dataset(TensorDataset(X)), batch_size=3), expected)


def test_a_collate_fn_that_hands_tensor_items_to_torch_sees_them():
    # torch.stack(batch) read the list's storage, which held the samples only once Python had touched it: "stack
    # expects a non-empty TensorList"; torch.nested.nested_tensor(batch) held no sequence, silently.
    rows = [torch.full((2,), float(i)) for i in range(6)]
    for combine in (torch.stack, torch.cat, torch.vstack):
        ours = list(DataLoader(as_dataset(rows), batch_size=4, collate_fn=combine))
        theirs = list(DataLoader(rows, batch_size=4, collate_fn=combine))
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs)) and len(ours) == 2
    sequences = [torch.arange(n, dtype=torch.float32) for n in (3, 1, 4)]
    with warnings.catch_warnings():  # "the PyTorch API of nested tensors is in prototype stage"
        warnings.simplefilter("ignore", UserWarning)
        nested = next(iter(DataLoader(as_dataset(sequences), batch_size=3, collate_fn=torch.nested.nested_tensor)))
    assert [t.tolist() for t in nested.unbind()] == [t.tolist() for t in sequences]
    ragged = lazyseq.smap(lambda n: np.arange(n, dtype=np.float32), [3, 1, 4, 2])  # arrays that do not stack
    padded = DataLoader(as_dataset(ragged), batch_size=2, collate_fn=lambda b: [x.tolist() for x in b])
    assert list(padded) == [[[0.0, 1.0, 2.0], [0.0]], [[0.0, 1.0, 2.0, 3.0], [0.0, 1.0]]]


def test_a_first_batch_that_fails_to_read_decides_nothing_for_good():
    # Any error reading the first batch made the dataset take its items for arrays for good: later batches of
    # tensor items were empty to torch.stack, and an item's own error came out as "expects a non-empty TensorList".
    rows = torch.arange(30.0).reshape(10, 3)
    calls = [0]

    def flaky(i):
        calls[0] += 1
        if calls[0] == 1:
            raise OSError("transient read error")
        return rows[i]

    dataset = as_dataset(lazyseq.smap(flaky, range(10)))
    batches = list(DataLoader(dataset, batch_size=4, collate_fn=torch.stack))  # the first read fails, the rest not
    assert torch.equal(torch.cat(batches), rows)
    failing = as_dataset(lazyseq.smap(lambda i: rows[i] if i != 1 else 1 / 0, range(10)))
    with pytest.raises(lazyseq.EvaluationError, match="ZeroDivisionError: division by zero"):
        next(iter(DataLoader(failing, batch_size=4, collate_fn=torch.stack)))


def test_a_run_over_to_device_resumes_where_the_batches_received_stopped():
    # Only the loader's iterator had a state, ahead of the batches trained on: a resumed run skipped those held ahead.
    data = lazyseq.view(np.arange(20.0)).batch(2)
    with lazyseq.prefetch(data, nworkers=2) as loader:
        with to_device(iter(loader), "cpu", ahead=2) as feeder:
            trained = [next(feeder)[0].item() for _ in range(4)]
            state = feeder.state_dict()
        with to_device(iter(loader), "cpu", ahead=2) as resumed:
            resumed.load_state_dict(state)
            trained += [batch[0].item() for batch in resumed]
            with pytest.raises(ValueError, match="^to_device: load_state_dict must come before the first batch"):
                resumed.load_state_dict(state)
    assert trained == list(np.arange(0.0, 20.0, 2))
    with pytest.raises(TypeError, match=r"^to_device: the batches come from a list_iterator, which has no state"):
        to_device([np.zeros(2)], "cpu").state_dict()
