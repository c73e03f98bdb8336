"""How fast a served pipeline is, next to the same pipeline read locally and to raw pyzmq.

    python benchmarks/bench_server.py          # about two and a half minutes
    python benchmarks/bench_server.py --quick  # a few seconds: a smoke test, numbers too rough to quote
    python benchmarks/bench_server.py --only 7 # one workload

Every server runs in a process of its own, on loopback, started once per
configuration (its start-up is not timed); a consumer's run is timed from
``connect`` to the last batch used. The contenders take turns, repeat after
repeat, and each comparison is a ratio of timings taken in the same run.

1. Loader-bound: batches of 256 x 248 float64 gathered at random from four
   memory-mapped ``.npy`` files, the server's 2 worker threads computing them,
   vs the same pipeline read locally through ``prefetch`` with 2 worker
   threads (with its defaults, which compute batches this cheap in the
   reader, and with ``inline_below=0``: every batch in a worker thread, as
   the server's workers compute them); vs a hand-written server (pyzmq and numpy, no lazyseq) that
   gathers the same batches in its one thread and sends them (what this
   machine gives a served pipeline through a socket); vs a hand-written
   shared-memory server (pyzmq, no lazyseq machinery) that computes each
   batch of the same view in its one thread straight into the slot of the
   consumer's shared memory that the request names, one small message each
   way, 4 asked for ahead (what this machine gives a served pipeline through
   shared memory: it asks for the next batch at every read, so 4 are always
   on their way; lazyseq asks in runs, once half of ``ahead`` are read, so
   with ``ahead=4`` 2 to 4 are, and with ``ahead=8``, also measured, 4 to 8);
   and the same bytes sent by a bare pyzmq ROUTER/DEALER pair (the
   transport's limit), in GB/s, for these batches and for 1 MiB ones. The
   served pipeline is read as a consumer on the server's
   machine reads it (the arrays through shared memory), and as one on another
   machine would (``shared_memory=False``: everything through the socket),
   over loopback TCP and over ``ipc://`` (a Unix socket).
2. Fuel's tutorial workload: 5 ms to produce a batch, 10 ms to train on it,
   5 epochs of 10 batches; served (a view read by index, and a stream of
   epoch after epoch, as Fuel's server iterates: drawn ahead before anyone
   asks) vs the ideal max(producer, consumer) (the consumer alone, measured:
   its sleeps overshoot on a busy machine), next to a Fuel-style PUSH/PULL
   server (hand-written pyzmq, the batches pushed as they are made, none
   acknowledged) and the same loop in one process.
3. CURVE encryption on: the loader-bound run again, through the socket.
4. Batched by the consumer: the rows of the same files served as they are,
   and the consumer making the batches of 1. (``remote.gather(picks).batch(256)``;
   each batch asks for its rows at once), vs the batches made by the server (1.)
   and vs the same pipeline read locally through ``prefetch``; and the rows'
   first batches read in order (each asks for the next one ahead).
5. Small items one at a time: rows of 8 float32, 20,000 a run, from a served
   view read in order (``ahead`` 4, 16 and 64, through shared memory) and from
   a served stream (an endless generator, ``ahead`` 4 and 16), vs a
   hand-written pyzmq PUSH/PULL pair sending the same rows as Fuel's server
   does (a JSON header and the buffer, no acknowledgement: an item queued for
   a consumer that leaves is lost), in items a second.
6. Threads sharing a served view: items that take 5 ms each to compute (the
   GIL free, as a file read), served by 4 worker threads, 200 read a run in
   a shuffled order, through ``prefetch`` with 4 worker threads and with 4
   worker processes, vs the same items read without a loader: the speedup
   (at most 4, the server's workers); and the batches of 1., read in order
   through ``prefetch`` with 2 worker threads (``ahead`` 4 and 16), vs read
   without a loader (the view reads ahead on its own).
7. A strided shard: the same 5 ms items, 200 a run, read by the shard of
   rank 0 of 4 with ``contiguous=False`` (every 4th item, as the shard of a
   view of unknown length reads), vs the contiguous shard of rank 0 (items in
   order); ``ahead=4`` both. The server computes ahead of both at their step.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import zmq
from common import Result, summary, table

import lazyseq

ROWS_PER_FILE, WIDTH = 20_000, 248
FUEL_PRODUCE, FUEL_TRAIN, FUEL_BATCHES = 0.005, 0.010, 50
SLOW_ITEM, SLOW_WORKERS = 0.005, 4
RAW_AHEAD = 4
SHARED_SLOTS = 2 * RAW_AHEAD  # slots of a consumer of the hand-written shared-memory server
SHARED_DIRECTORY = "/dev/shm" if os.path.isdir("/dev/shm") else None  # (memory, not disk, where there is one)
PUSH_HWM = 10  # Fuel's default


# -- what the servers serve (also run as `bench_server.py --serve KIND`) --------------------------------


def make_files(directory: str) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for k in range(4):
        path = os.path.join(directory, f"x{k}.npy")
        if not os.path.exists(path):
            np.save(path, rng.standard_normal((ROWS_PER_FILE, WIDTH)))
        paths.append(path)
    return paths


def gathered_batches(directory: str, batch: int, count: int, rows: lazyseq.View | None = None) -> lazyseq.View:
    """``count`` batches of ``batch`` random rows of the memory-mapped files (or of ``rows``, a view of theirs)."""
    data = lazyseq.open_npy(make_files(directory)) if rows is None else rows
    picks = np.random.default_rng(1).integers(0, len(data), size=batch * count)
    return data.gather(picks).batch(batch)


def slow_batch(i: int) -> np.ndarray:
    time.sleep(FUEL_PRODUCE)
    return np.zeros((100, 128))


def fuel_batches() -> lazyseq.View:
    return lazyseq.smap(slow_batch, range(FUEL_BATCHES))


def fuel_epochs() -> Iterator[np.ndarray]:
    """The batches of ``fuel_batches``, epoch after epoch, for ever: what Fuel's server iterates over."""
    while True:
        yield from (slow_batch(i) for i in range(FUEL_BATCHES))


def slow_item(i: int) -> np.ndarray:
    time.sleep(SLOW_ITEM)
    return np.full((1, 8), i)


def small_rows() -> Iterator[np.ndarray]:
    """Rows of 8 float32, for ever."""
    for i in itertools.count():
        yield np.full(8, i, np.float32)


def serve_main(kind: str, directory: str, batch: int, count: int, keys: str | None) -> None:
    if kind == "raw":
        return raw_server(batch)
    if kind == "push":
        return push_server(small_rows())
    if kind == "fuel-push":
        return push_server(fuel_epochs())
    if kind == "handwritten":
        return handwritten_server(directory, batch, count)
    if kind == "handwritten-shm":
        return shared_memory_server(directory, batch, count)
    source: Any
    if kind == "stream":
        source = small_rows()
    elif kind == "small-view":
        source = lazyseq.view(np.arange(count * 8, dtype=np.float32).reshape(count, 8))
    elif kind == "rows":
        source = lazyseq.open_npy(make_files(directory))
    elif kind == "fuel":
        source = fuel_batches()
    elif kind == "fuel-stream":
        source = fuel_epochs()
    elif kind == "slow-items":
        source = lazyseq.smap(slow_item, range(1_000_000))
    else:
        source = gathered_batches(directory, batch, count)
    keypair = tuple(k.encode() for k in keys.split(",")) if keys else None
    address = f"ipc://{directory}/served.sock" if kind == "batches-ipc" else "tcp://127.0.0.1:0"
    nworkers = {"fuel": 0, "fuel-stream": 0, "stream": 0, "small-view": 0, "slow-items": SLOW_WORKERS}.get(kind, 2)
    server = lazyseq.serve(source, address, nworkers=nworkers, curve_keypair=keypair)
    print(server.address, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


def raw_server(batch: int) -> None:
    """A bare ROUTER answering each request with the same buffer: what the transport can do."""
    payload = np.random.default_rng(0).standard_normal((batch, WIDTH))
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port}", flush=True)
    while True:
        client, request = socket.recv_multipart()
        if request == b"stop":
            break
        socket.send_multipart([client, b"item", payload], copy=False)
    socket.close(0)
    context.term()


def push_server(items: Iterator[np.ndarray]) -> None:
    """Fuel's transport: a PUSH socket sending each item with a JSON header (dtype, shape), as long as it can."""
    context = zmq.Context()
    socket = context.socket(zmq.PUSH)
    socket.set_hwm(PUSH_HWM)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port}", flush=True)
    for item in items:
        header = json.dumps([{"dtype": item.dtype.str, "shape": item.shape}]).encode()
        socket.send_multipart([header, item], copy=False)


def handwritten_server(directory: str, batch: int, count: int) -> None:
    """A ROUTER that gathers the batches of ``gathered_batches`` with numpy alone and sends each as it is made."""
    files = [np.load(path, mmap_mode="r") for path in make_files(directory)]
    picks = np.random.default_rng(1).integers(0, len(files) * ROWS_PER_FILE, size=batch * count)
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port}", flush=True)
    sent = 0
    while True:
        client, request = socket.recv_multipart()
        if request == b"stop":
            break
        rows = picks[sent % count * batch : (sent % count + 1) * batch]
        sent += 1
        which, row = np.divmod(rows, ROWS_PER_FILE)
        out = np.empty((batch, WIDTH))
        for k, file in enumerate(files):
            here = which == k
            out[here] = file[row[here]]
        socket.send_multipart([client, b"item", out], copy=False)
    socket.close(0)
    context.term()


def shared_memory_server(directory: str, batch: int, count: int) -> None:
    """The least a served pipeline needs through shared memory: a ROUTER computing each batch of
    ``gathered_batches`` (the same view) in its one thread, straight into the slot of the consumer's shared memory
    that the request names, and answering with the request itself."""
    view = gathered_batches(directory, batch, count)
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    print(f"tcp://127.0.0.1:{port}", flush=True)
    slots: dict[bytes, np.ndarray] = {}
    while True:
        client, request = socket.recv_multipart()
        if request == b"stop":
            break
        if request.startswith(b"/"):  # a consumer's shared memory: a file of slots (the last consumer's gone)
            slots = {client: np.memmap(request.decode(), np.uint8, "r+").reshape(SHARED_SLOTS, -1)}
            continue
        i, slot = map(int, request.split())
        view._get_into(i, slots[client][slot])  # the hook the server's worker threads compute a batch into a slot by
        socket.send_multipart([client, request])
    slots.clear()
    socket.close(0)
    context.term()


class ServerProcess:
    def __init__(self, kind: str, directory: str, batch: int, count: int, keys: str | None = None) -> None:
        command = [sys.executable, __file__, "--serve", kind, "--data", directory]
        command += ["--batch", str(batch), "--count", str(count)] + (
            [f"--keys={keys}"] if keys else []
        )  # a key may start with "-"
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        self.address = self.process.stdout.readline().strip()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()
        self.process.stdout.close()


# -- consumers ------------------------------------------------------------------------------------


def consume(batches, train_seconds: float = 0.0, count: int | None = None) -> None:
    for b in batches if count is None else itertools.islice(batches, count):
        b[0, 0]  # touch the data
        if train_seconds:
            time.sleep(train_seconds)


def served_run(address: str, train_seconds: float = 0.0, count: int | None = None, **options) -> Callable[[], None]:
    def run() -> None:
        with lazyseq.connect(address, **options) as remote:
            consume(remote, train_seconds, count)

    return run


def served_rows_run(address: str, directory: str, batch: int, count: int, shuffled: bool) -> Callable[[], None]:
    """The consumer batches the served rows: those of ``gathered_batches``, or the first ones in order."""

    def run() -> None:
        with lazyseq.connect(address, shared_memory=False) as remote:
            if shuffled:
                consume(gathered_batches(directory, batch, count, rows=remote))
            else:
                consume(remote[: batch * count].batch(batch))

    return run


def local_run(view: lazyseq.View, nworkers: int, train_seconds: float = 0.0, **options) -> Callable[[], None]:
    def run() -> None:
        with lazyseq.prefetch(view, nworkers=nworkers, **options) as ahead:
            consume(ahead, train_seconds)

    return run


def raw_run(address: str, count: int) -> Callable[[], None]:
    def run() -> None:
        context = zmq.Context()
        socket = context.socket(zmq.DEALER)
        socket.connect(address)
        sent = 0
        for _ in range(RAW_AHEAD):
            socket.send(b"get")
            sent += 1
        for _ in range(count):
            frames = socket.recv_multipart(copy=False)
            np.frombuffer(frames[1].buffer, np.float64)[0]
            if sent < count:
                socket.send(b"get")
                sent += 1
        socket.close(0)
        context.term()

    return run


def shared_memory_run(address: str, batch: int, count: int) -> Callable[[], None]:
    """``count`` batches from :func:`shared_memory_server`, ``RAW_AHEAD`` asked for ahead, each read where the server
    computed it (a slot of a file in ``/dev/shm``, made for the run), then its slot asked for again."""

    def run() -> None:
        with tempfile.NamedTemporaryFile(dir=SHARED_DIRECTORY, prefix="bench-slots-") as file:
            file.truncate(SHARED_SLOTS * batch * WIDTH * 8)
            slots = np.memmap(file.name, np.float64, "r+").reshape(SHARED_SLOTS, batch, WIDTH)
            context = zmq.Context()
            socket = context.socket(zmq.DEALER)
            socket.connect(address)
            socket.send(file.name.encode())
            free, sent = list(range(SHARED_SLOTS)), 0
            for _ in range(RAW_AHEAD):
                socket.send(b"%d %d" % (sent, free.pop()))
                sent += 1
            for _ in range(count):
                slot = int(socket.recv().split()[1])
                slots[slot][0, 0]  # touch the data
                free.append(slot)
                if sent < count:
                    socket.send(b"%d %d" % (sent, free.pop()))
                    sent += 1
            socket.close(0)
            context.term()
            del slots

    return run


def one_at_a_time_run(address: str, count: int, ahead: int) -> Callable[[], None]:
    """The first ``count`` rows, one at a time, of what the server serves (a view read in order, or a stream)."""

    def run() -> None:
        with lazyseq.connect(address, ahead=ahead) as served:
            for row in itertools.islice(served, count):
                row[0]

    return run


def pull_run(address: str, count: int, train_seconds: float = 0.0) -> Callable[[], None]:
    def run() -> None:
        context = zmq.Context()
        socket = context.socket(zmq.PULL)
        socket.set_hwm(PUSH_HWM)
        socket.connect(address)
        for _ in range(count):
            header, buffer = socket.recv_multipart(copy=False)
            [field] = json.loads(header.bytes)
            np.frombuffer(buffer.buffer, field["dtype"]).reshape(field["shape"]).flat[0]  # touch the data
            if train_seconds:
                time.sleep(train_seconds)
        socket.close(0)
        context.term()

    return run


def stop_raw(address: str) -> None:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.connect(address)
    socket.send(b"stop")
    socket.close(linger=1000)
    context.term()


def measure(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, list[float]]:
    """Seconds of each run, ``repeats`` times, the runs taking turns."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


# -- the benchmarks -----------------------------------------------------------------------------------


def throughput_rows(times: dict[str, list[float]], gigabytes: float) -> list[list[str]]:
    """A table row per run: its best and median seconds, and the GB/s of its best, for ``gigabytes`` moved."""
    return [
        [name, f"{min(t):.3f} s", f"{statistics.median(t):.3f} s", f"{gigabytes / min(t):.2f}"]
        for name, t in times.items()
    ]


def bench_loader_bound(directory: str, count: int, repeats: int) -> tuple[list[list[str]], list[Result]]:
    batch_bytes = {"256 x 248 (0.5 MiB)": 256, "528 x 248 (1 MiB)": 528}
    rows, results = [], []
    for label, batch in batch_bytes.items():
        kinds = ("batches", "batches-ipc", "handwritten", "handwritten-shm", "raw")
        servers = {kind: ServerProcess(kind, directory, batch, count) for kind in kinds}
        try:
            view = gathered_batches(directory, batch, count)
            runs = {
                "local prefetch, 2 threads": local_run(view, 2),
                "local prefetch, 2 threads computing every batch": local_run(view, 2, inline_below=0),
                "served, shared memory": served_run(servers["batches"].address),
                "served, shared memory, ahead=8": served_run(servers["batches"].address, ahead=8),
                "hand-written server, shared memory": shared_memory_run(
                    servers["handwritten-shm"].address, batch, count
                ),
                "served, socket": served_run(servers["batches"].address, shared_memory=False),
                "served over ipc://, socket": served_run(servers["batches-ipc"].address, shared_memory=False),
                "hand-written server, numpy": raw_run(servers["handwritten"].address, count),
                "raw pyzmq, same bytes": raw_run(servers["raw"].address, count),
            }
            times = measure(runs, repeats)
        finally:
            for kind in ("raw", "handwritten", "handwritten-shm"):
                stop_raw(servers[kind].address)
            for server in servers.values():
                server.stop()
        gigabytes = batch * WIDTH * 8 * count / 1e9
        for name, seconds in times.items():
            best = min(seconds)
            rows.append(
                [label, name, f"{best:.3f} s", f"{statistics.median(seconds):.3f} s", f"{gigabytes / best:.2f}"]
            )
        local, in_workers, shared, shared_8, handwritten_shared, socket, ipc, handwritten, raw = (
            min(times[name]) for name in runs
        )
        for name, lazy, reference, seconds in [
            ("served, shared memory", shared, "local prefetch", local),
            ("served, shared memory", shared, "local prefetch, batches in its threads", in_workers),
            ("served, shared memory", shared, "hand-written server, shared memory", handwritten_shared),
            ("served, shared memory, ahead=8", shared_8, "hand-written server, shared memory", handwritten_shared),
            ("hand-written server, shared memory", handwritten_shared, "local prefetch", local),
            ("served, socket", socket, "local prefetch", local),
            ("served, socket", socket, "hand-written server", handwritten),
            ("served, socket", socket, "raw pyzmq", raw),
            ("served over ipc://, socket", ipc, "local prefetch", local),
        ]:
            results.append(
                Result(
                    f"1. {label}: {name} vs {reference}", f"{lazy:.3f} s", f"{seconds:.3f} s", f"{seconds / lazy:.2f}"
                )
            )
    return rows, results


def bench_fuel(repeats: int) -> tuple[list[list[str]], list[Result]]:
    servers = [ServerProcess(kind, "", 0, 0) for kind in ("fuel", "fuel-stream", "fuel-push")]
    view, stream, push = (server.address for server in servers)
    ready = [np.zeros((100, 128))] * FUEL_BATCHES
    try:
        runs = {
            "in one process": local_run(fuel_batches(), 0, FUEL_TRAIN),
            "served": served_run(view, FUEL_TRAIN),
            "served as a stream": served_run(stream, FUEL_TRAIN, FUEL_BATCHES),
            "Fuel-style PUSH/PULL": pull_run(push, FUEL_BATCHES, FUEL_TRAIN),
            "the consumer alone (batches ready)": lambda: consume(ready, FUEL_TRAIN),
        }
        times = measure(runs, repeats)
    finally:
        for server in servers:
            server.stop()
    nominal = FUEL_BATCHES * max(FUEL_PRODUCE, FUEL_TRAIN)
    ideal = max(min(times["the consumer alone (batches ready)"]), nominal)  # sleeps overshoot on a busy machine
    rows = [
        [name, f"{min(t):.3f} s", f"{statistics.median(t):.3f} s", f"{min(t) / ideal:.3f}"] for name, t in times.items()
    ]
    rows.append(["nominal max(producer, consumer)", f"{nominal:.3f} s", "", f"{nominal / ideal:.3f}"])
    served, alone = min(times["served"]), min(times["in one process"])
    streamed, pushed = min(times["served as a stream"]), min(times["Fuel-style PUSH/PULL"])
    return rows, [
        Result(
            "2. Fuel's workload: served vs ideal (consumer alone)",
            f"{served:.3f} s",
            f"{ideal:.3f} s",
            f"{served / ideal:.3f}",
        ),
        Result(
            "2. Fuel's workload: served as a stream vs ideal",
            f"{streamed:.3f} s",
            f"{ideal:.3f} s",
            f"{streamed / ideal:.3f}",
        ),
        Result(
            "2. Fuel's workload: Fuel-style PUSH/PULL vs ideal",
            f"{pushed:.3f} s",
            f"{ideal:.3f} s",
            f"{pushed / ideal:.3f}",
        ),
        Result(
            "2. Fuel's workload: in one process vs ideal", f"{alone:.3f} s", f"{ideal:.3f} s", f"{alone / ideal:.3f}"
        ),
    ]


def bench_curve(directory: str, count: int, repeats: int) -> tuple[list[list[str]], list[Result]]:
    public, secret = zmq.curve_keypair()
    plain = ServerProcess("batches", directory, 256, count)
    curve = ServerProcess("batches", directory, 256, count, keys=f"{public.decode()},{secret.decode()}")
    try:
        runs = {
            "served, plain": served_run(plain.address, shared_memory=False),
            "served, CURVE": served_run(curve.address, server_key=public, shared_memory=False),
        }
        times = measure(runs, repeats)
    finally:
        plain.stop()
        curve.stop()
    rows = throughput_rows(times, 256 * WIDTH * 8 * count / 1e9)
    plain_s, curve_s = min(times["served, plain"]), min(times["served, CURVE"])
    return rows, [Result("3. CURVE on vs off", f"{curve_s:.3f} s", f"{plain_s:.3f} s", f"{plain_s / curve_s:.2f}")]


def bench_consumer_batches(directory: str, count: int, repeats: int) -> tuple[list[list[str]], list[Result]]:
    rows_server, batches_server = (
        ServerProcess("rows", directory, 256, count),
        ServerProcess("batches", directory, 256, count),
    )
    try:
        runs = {
            "local prefetch, 2 threads": local_run(gathered_batches(directory, 256, count), 2),
            "served batches (made by the server)": served_run(batches_server.address, shared_memory=False),
            "served rows, batched by the consumer": served_rows_run(rows_server.address, directory, 256, count, True),
            "served rows, in order, batched by the consumer": served_rows_run(
                rows_server.address, directory, 256, count, False
            ),
        }
        times = measure(runs, repeats)
    finally:
        rows_server.stop()
        batches_server.stop()
    rows = throughput_rows(times, 256 * WIDTH * 8 * count / 1e9)
    local, by_server, by_consumer, _ = (min(t) for t in times.values())
    return rows, [
        Result(
            "4. batched by the consumer vs by the server",
            f"{by_consumer:.3f} s",
            f"{by_server:.3f} s",
            f"{by_server / by_consumer:.2f}",
        ),
        Result(
            "4. batched by the consumer vs local prefetch",
            f"{by_consumer:.3f} s",
            f"{local:.3f} s",
            f"{local / by_consumer:.2f}",
        ),
    ]


def bench_small_items(count: int, repeats: int) -> tuple[list[list[str]], list[Result]]:
    view = ServerProcess("small-view", "", 0, count)
    stream, push = ServerProcess("stream", "", 0, 0), ServerProcess("push", "", 0, 0)
    try:
        runs = {
            f"served view in order, ahead={ahead}": one_at_a_time_run(view.address, count, ahead)
            for ahead in (4, 16, 64)
        }
        runs.update(
            {
                "served stream, ahead=4": one_at_a_time_run(stream.address, count, 4),
                "served stream, ahead=16": one_at_a_time_run(stream.address, count, 16),
                "hand-written PUSH/PULL (no acknowledgement)": pull_run(push.address, count),
            }
        )
        times = measure(runs, repeats)
    finally:
        view.stop()
        stream.stop()
        push.stop()
    rows = [
        [name, f"{min(t):.3f} s", f"{statistics.median(t):.3f} s", f"{count / min(t):,.0f}"]
        for name, t in times.items()
    ]
    push_s = min(times["hand-written PUSH/PULL (no acknowledgement)"])
    return rows, [
        Result(f"5. small items, {name} vs PUSH/PULL", f"{min(t):.3f} s", f"{push_s:.3f} s", f"{push_s / min(t):.2f}")
        for name, t in times.items()
        if name.startswith("served")
    ]


def shuffled_run(address: str, count: int, method: str | None) -> Callable[[], None]:
    """``count`` items of the served view in a shuffled order: through ``prefetch`` with 4 workers of ``method``,
    or without a loader."""

    def run() -> None:
        with lazyseq.connect(address) as remote:
            items = remote.shuffle(seed=0)[:count]
            if method is None:
                consume(items)
            else:
                with lazyseq.prefetch(items, nworkers=4, method=method) as ahead:
                    consume(ahead)

    return run


def prefetched_run(address: str, ahead: int | None) -> Callable[[], None]:
    """The served batches through ``prefetch`` with 2 worker threads over ``connect(address, ahead=ahead)``, or
    read without a loader (``ahead=None``: the default)."""

    def run() -> None:
        with lazyseq.connect(address, ahead=ahead or 4) as remote:
            if ahead is None:
                consume(remote)
            else:
                with lazyseq.prefetch(remote, nworkers=2) as loaded:
                    consume(loaded)

    return run


def bench_threads_sharing(
    directory: str, count: int, batches: int, repeats: int
) -> tuple[list[list[str]], list[Result]]:
    slow, quick = ServerProcess("slow-items", "", 0, 0), ServerProcess("batches", directory, 256, batches)
    try:
        runs = {
            "slow items, no loader": shuffled_run(slow.address, count, None),
            "slow items, prefetch, 4 threads": shuffled_run(slow.address, count, "thread"),
            "slow items, prefetch, 4 processes": shuffled_run(slow.address, count, "process"),
            "batches, no loader": prefetched_run(quick.address, None),
            "batches, prefetch, 2 threads, ahead=4": prefetched_run(quick.address, 4),
            "batches, prefetch, 2 threads, ahead=16": prefetched_run(quick.address, 16),
        }
        times = measure(runs, repeats)
    finally:
        slow.stop()
        quick.stop()
    rows, results = [], []
    for name, t in times.items():
        kind = name.split(",")[0]
        alone = min(times[f"{kind}, no loader"])
        rows.append([name, f"{min(t):.3f} s", f"{statistics.median(t):.3f} s", f"{alone / min(t):.2f}"])
        if not name.endswith("no loader"):
            what = "5 ms items, shuffled" if kind == "slow items" else "256 x 248 batches"
            label = f"6. {what}, {name.split(', ', 1)[1]} vs no loader"
            results.append(Result(label, f"{min(t):.3f} s", f"{alone:.3f} s", f"{alone / min(t):.2f}"))
    return rows, results


def shard_run(address: str, count: int, contiguous: bool) -> Callable[[], None]:
    """The first ``count`` items of the shard of rank 0 of 4 of the served view."""

    def run() -> None:
        with lazyseq.connect(address, ahead=4) as remote:
            consume(lazyseq.shard(remote, 0, 4, contiguous=contiguous)[:count])

    return run


def bench_strided_shard(count: int, repeats: int) -> tuple[list[list[str]], list[Result]]:
    slow = ServerProcess("slow-items", "", 0, 0)
    try:
        times = measure(
            {"strided": shard_run(slow.address, count, False), "contiguous": shard_run(slow.address, count, True)},
            repeats,
        )
    finally:
        slow.stop()
    strided, contiguous = min(times["strided"]), min(times["contiguous"])
    rows = [[name, f"{min(t):.3f} s", f"{statistics.median(t):.3f} s"] for name, t in times.items()]
    label = "7. 5 ms items, strided shard (1 in 4) vs contiguous shard"
    return rows, [Result(label, f"{strided:.3f} s", f"{contiguous:.3f} s", f"{contiguous / strided:.2f}")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: few batches and repeats")
    parser.add_argument("--only", type=int, choices=range(1, 8), help="run one workload (1 to 7)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--keys", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve_main(args.serve, args.data, args.batch, args.count, args.keys)
    count, repeats = (40, 2) if args.quick else (400, 5)
    stream_count = 2_000 if args.quick else 20_000
    slow_count = 20 if args.quick else 200
    with tempfile.TemporaryDirectory() as directory:
        print(
            f"lazyseq {lazyseq.__version__}, pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}), {os.cpu_count()} cores"
        )
        results: list[Result] = []

        def wanted(number: int) -> bool:
            return args.only in (None, number)

        if wanted(1):
            loader_rows, loader_results = bench_loader_bound(directory, count, repeats)
            results += loader_results
            print(
                f"\n1. loader-bound, {count} batches per run (best and median of {repeats}; from connect to the last "
                "batch)"
            )
            print(table(["batches", "run", "best", "median", "GB/s"], loader_rows))
        if wanted(2):
            fuel_rows, fuel_results = bench_fuel(repeats)
            results += fuel_results
            print(
                f"\n2. Fuel's tutorial workload: {FUEL_BATCHES} batches, {FUEL_PRODUCE * 1e3:g} ms to make, "
                f"{FUEL_TRAIN * 1e3:g} ms to train on"
            )
            print(table(["run", "best", "median", "vs ideal"], fuel_rows))
        if wanted(3):
            curve_rows, curve_results = bench_curve(directory, count, repeats)
            results += curve_results
            print("\n3. CURVE encryption, loader-bound batches of 256 x 248")
            print(table(["run", "best", "median", "GB/s"], curve_rows))
        if wanted(4):
            consumer_rows, consumer_results = bench_consumer_batches(directory, count, repeats)
            results += consumer_results
            print("\n4. batches of 256 x 248 made by the consumer from served rows (through the socket)")
            print(table(["run", "best", "median", "GB/s"], consumer_rows))
        if wanted(5):
            stream_rows, stream_results = bench_small_items(stream_count, repeats)
            results += stream_results
            print(f"\n5. {stream_count:,} rows of 8 float32 per run, one at a time (from connect to the last row)")
            print(table(["run", "best", "median", "items/s"], stream_rows))
        if wanted(6):
            sharing_rows, sharing_results = bench_threads_sharing(directory, slow_count, count, repeats)
            results += sharing_results
            print(
                f"\n6. threads sharing a served view: {slow_count} items of {SLOW_ITEM * 1e3:g} ms ({SLOW_WORKERS} "
                f"server workers), shuffled; {count} batches of 256 x 248 (2 server workers), in order; from connect "
                "to the last"
            )
            print(table(["run", "best", "median", "speedup"], sharing_rows))
        if wanted(7):
            shard_rows, shard_results = bench_strided_shard(slow_count, repeats)
            results += shard_results
            print(
                f"\n7. the shard of rank 0 of 4: its first {slow_count} items of {SLOW_ITEM * 1e3:g} ms "
                f"({SLOW_WORKERS} server workers), strided and contiguous; from connect to the last"
            )
            print(table(["run", "best", "median"], shard_rows))
    print(
        "\nsummary (ratio: the reference's time / lazyseq's, above 1 when lazyseq is faster; in 2, served time / ideal)"
    )
    print(summary(results))


if __name__ == "__main__":
    main()
