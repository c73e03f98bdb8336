"""method="ray": the loaders' items computed as Ray tasks on a local cluster of two nodes (one CPU each).

One cluster serves the whole test session (Ray takes seconds to start); it
is started by the first test that needs it and shut down at the end.
"""

import asyncio
import functools
import importlib.util
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from loader_helpers import fail_on_seven, read_another_view, running_lazyseq_threads, square
from shard_helpers import contents, pipeline

import lazyseq

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402  # only where Ray is installed
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from lazyseq.loading import ray_workers  # noqa: E402
from lazyseq.loading.backends import Done  # noqa: E402
from lazyseq.loading.options import LoaderOptions  # noqa: E402
from lazyseq.loading.ray_workers import RayWorkers  # noqa: E402
from lazyseq.loading.result_signal import ResultSignal  # noqa: E402

TESTS = Path(__file__).resolve().parent
EXAMPLES = TESTS.parent / "examples"


@pytest.fixture(scope="session")
def cluster():
    """A head and a second node with one CPU each, as two machines would be; the tests' modules importable there."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(
            address=cluster.address,
            runtime_env={"env_vars": {"PYTHONPATH": str(TESTS)}},
            log_to_driver=False,
        )
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def lazyseq_threads():
    return [t.name for t in running_lazyseq_threads()]


def record(i):
    """An item with arrays of several dtypes, a scalar and a string: what Ray sends back must equal a local read."""
    return {"x": np.arange(6.0).reshape(2, 3) * i, "y": (np.int64(i), f"item {i}"), "mask": np.arange(4) < i % 5}


def assert_items_equal(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_equal(a, b)
        assert a["x"].flags.writeable  # arrays of their own, as with threads and processes


def test_prefetch_gives_the_items_of_a_synchronous_read(cluster):
    items = lazyseq.smap(record, range(40))
    with lazyseq.prefetch(items, nworkers=2, method="ray", max_buffered=8) as ahead:
        assert repr(ahead).startswith("prefetch(2 Ray tasks, max_buffered=8)  [len 40]")
        assert_items_equal(list(ahead), list(items))
        assert_items_equal(ahead[[5, 30, 2]], [items[5], items[30], items[2]])  # out of order: the right items
        assert_items_equal([ahead[-1]], [items[-1]])


def test_load_buffers_and_evaluate_give_what_a_synchronous_read_gives(cluster):
    data = lazyseq.smap(square, np.arange(50.0))
    with lazyseq.load_buffers(lambda: data.batch(10)[3], nworkers=2, method="ray") as batches:
        for _ in range(6):
            np.testing.assert_array_equal(next(batches), data.batch(10)[3])
    got = lazyseq.evaluate(lambda b: np.sqrt(b), data, batch_size=8, nworkers=2, method="ray")
    np.testing.assert_array_equal(got, lazyseq.evaluate(lambda b: np.sqrt(b), data, batch_size=8))


def draw():
    return np.random.randint(2**62, size=2)


def test_the_default_max_buffered_sends_runs_of_items_sized_from_their_timings(cluster):
    items = lazyseq.smap(square, range(300))  # microseconds each: runs of 256 at most
    with lazyseq.prefetch(items, nworkers=2, method="ray") as ahead:
        assert list(ahead) == [i * i for i in range(300)]
        engine = ahead._engine
        assert engine.capacity == 3 * 2 * 256
        sent_by_default = engine.workers.workers._sent
    with lazyseq.prefetch(items, nworkers=2, method="ray", max_buffered=10) as ahead:
        assert list(ahead) == [i * i for i in range(300)]
        assert ahead._engine.capacity == 10  # obeyed: Ray tasks of 5 items at most
        assert ahead._engine.workers.workers._sent >= 300 // 5
    assert sent_by_default <= 10  # one item in each of the first two (not timed yet), then long runs
    with lazyseq.load_buffers(draw, nworkers=2, method="ray") as batches:
        assert len({tuple(next(batches)) for _ in range(20)}) == 20
        assert batches._engine.capacity == 3 * 2 * 256


def test_every_ray_task_draws_different_random_numbers(cluster):
    with lazyseq.load_buffers(draw, max_cached=4, nworkers=2, method="ray", seed=0) as batches:
        drawn = [tuple(next(batches)) for _ in range(30)]
    assert len(set(drawn)) == 30


def test_memory_maps_are_opened_by_path_on_the_nodes(cluster, tmp_path):
    path = tmp_path / "rows.npy"
    np.save(path, np.zeros((20, 3)))
    rows = lazyseq.view(np.load(path, mmap_mode="r"))
    with lazyseq.prefetch(rows, nworkers=2, method="ray", max_buffered=2) as ahead:
        assert ahead[0].tolist() == [0.0, 0.0, 0.0]  # the pipeline is in Ray's object store now
        np.lib.format.open_memmap(path, mode="r+")[10:] = 7.0  # seen by the nodes only if they map the file
        assert [row[0] for row in ahead[10:13]] == [7.0, 7.0, 7.0]


def test_an_error_in_a_task_names_the_item_and_where_it_was_raised(cluster):
    with lazyseq.prefetch(lazyseq.smap(fail_on_seven, range(12)), nworkers=2, method="ray") as ahead:
        assert list(ahead[:7]) == list(range(7))
        with pytest.raises(lazyseq.EvaluationError) as caught:
            ahead[7]
        message = "failed to compute prefetch[7] -> smap(fail_on_seven)[7]: ValueError: bad value 7"
        assert str(caught.value) == message
        note = caught.value.__cause__.__notes__[0]
        assert note.startswith("raised in a Ray worker on node ")
        assert 'in fail_on_seven\n    raise ValueError(f"bad value {x}")' in note
        assert list(ahead[8:]) == [8, 9, 10, 11]  # the loader goes on
    with lazyseq.load_buffers(lambda: 1 / 0, nworkers=1, method="ray") as batches:
        with pytest.raises(
            lazyseq.EvaluationError, match=r"^failed to compute load_buffers batch 0: ZeroDivisionError"
        ):
            next(batches)


def test_ray_tasks_follow_the_consumers_seterr(cluster):
    previous = lazyseq.seterr("passthrough")
    try:
        with lazyseq.prefetch(lazyseq.smap(read_another_view, range(5)), nworkers=1, method="ray") as ahead:
            with pytest.raises(KeyError):  # a read inside the pipeline passes its error through, as locally
                ahead[2]
    finally:
        lazyseq.seterr(previous)


def test_a_pipeline_the_nodes_cannot_import_is_reported(cluster, tmp_path, monkeypatch):
    (tmp_path / "only_here.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from only_here import double

    with lazyseq.prefetch(lazyseq.smap(double, range(4)), nworkers=1, method="ray") as ahead:
        with pytest.raises(
            lazyseq.LoaderError,
            match=r"^prefetch: a Ray worker on node .* could not load the pipeline \(ModuleNotFoundError: No module "
            r"named 'only_here'\); every node needs the modules the pipeline uses",
        ):
            ahead[0]
        assert not ahead.workers_running
    sys.modules.pop("only_here")


def test_a_file_the_nodes_cannot_see_is_reported_as_such(cluster, tmp_path):
    path = tmp_path / "here_only.npy"
    np.save(path, np.arange(6.0))
    data = lazyseq.open_npy(str(path))  # mapped here; a node opens it again by name
    path.unlink()
    with lazyseq.prefetch(data, nworkers=1, method="ray") as ahead:
        with pytest.raises(
            lazyseq.LoaderError,
            match=r"could not load the pipeline \(FileNotFoundError: .*here_only\.npy.*\); every node must see the "
            r"files the pipeline memory-maps, at the same paths",
        ):
            ahead[0]


@ray.remote(num_cpus=0)
class Gate:
    """Counts the tasks that passed it, for a test to wait on."""

    def __init__(self):
        self.count = 0
        self.changed = asyncio.Condition()

    async def arrive(self):
        async with self.changed:
            self.count += 1
            self.changed.notify_all()

    async def arrived(self, count=1):
        async with self.changed:
            await self.changed.wait_for(lambda: self.count >= count)


@pytest.fixture
def gate(cluster):
    """A gate on the head node (which no test removes)."""
    head = ray.get_runtime_context().get_node_id()
    gate = Gate.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
    yield gate
    ray.kill(gate)


class SpinAfterFirst:
    """Item 0 is 0; the others pass ``gate``, then run Python for minutes (a cancel interrupts that, not a sleep)."""

    def __init__(self, gate):
        self.gate = gate

    def __call__(self, i):
        if i:
            ray.get(self.gate.arrive.remote())
        end = time.monotonic() + 300 * (i > 0)
        while time.monotonic() < end:
            pass
        return i


def test_close_cancels_the_tasks_in_flight_and_leaves_no_thread(gate, monkeypatch):
    monkeypatch.setattr(ray_workers, "CANCEL_AFTER_SECONDS", 0.5)  # a task that runs on is cancelled at that age
    ahead = lazyseq.prefetch(lazyseq.smap(SpinAfterFirst(gate), range(10)), nworkers=2, method="ray")
    assert ahead[0] == 0
    in_flight = [entry.ref for entry in ahead._engine.workers.workers.running.values()]
    assert len(in_flight) == 2
    ray.get(gate.arrived.remote(2), timeout=60)  # both are running
    ahead.close()
    for ref in in_flight:
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref, timeout=60)
    assert not ahead.workers_running
    assert lazyseq_threads() == []


def test_close_lets_young_tasks_complete_rather_than_cancel_them(cluster, monkeypatch):
    # Ray 2.60 aborted the process now and then when close() cancelled a task as its results arrived.
    monkeypatch.setattr(ray_workers, "CANCEL_AFTER_SECONDS", 3600.0)  # however slow the machine
    # items after the first take a while: in flight when the first is read (instant ones could all be done by then)
    items = lazyseq.smap(lambda i: time.sleep(0.2 if i else 0.0) or i * i, range(10))
    ahead = lazyseq.prefetch(items, nworkers=2, method="ray")
    assert ahead[0] == 0
    in_flight = [entry.ref for entry in ahead._engine.workers.workers.running.values()]
    ahead.close()
    assert in_flight and ray.wait(in_flight, num_returns=len(in_flight), timeout=0)[1] == []  # completed by now
    assert [ray.get(ref)[0][0] for ref in in_flight] == ["ok"] * len(in_flight)
    assert not ahead.workers_running


def test_a_descriptor_becomes_readable_when_a_result_arrives(cluster):
    workers = RayWorkers(square, LoaderOptions.check("serve", 1, "ray"), 0, "item", None)
    try:
        fds = workers.fds()
        workers.submit_many([("three", 3)])
        assert select.select(fds, [], [], 60)[0] == fds  # what a data server waits on, with its socket
        assert workers.poll(0) == [Done("three", "ok", 9)]
        assert select.select(fds, [], [], 0)[0] == []  # emptied by poll
    finally:
        workers.close()


def test_ray_threads_run_no_code_of_lazyseq(cluster, monkeypatch):
    # Ray ran lazyseq's completion callbacks in the thread that handles a task's reply, which then waited for the
    # GIL halfway through; a loader closed meanwhile cancelled that task, and Ray 2.60 aborted the process.
    signalled_from = []
    notify = ResultSignal.notify

    def record(signal):
        signalled_from.append(threading.current_thread().name)
        notify(signal)

    monkeypatch.setattr(ResultSignal, "notify", record)
    workers = RayWorkers(square, LoaderOptions.check("serve", 2, "ray"), 0, "item", None)
    try:
        fds = workers.fds()
        workers.submit_many([(i, i) for i in range(6)])
        got: list = []
        while len(got) < 6:
            select.select(fds, [], [], 60)
            got += workers.poll(0)
        assert sorted(done.value for done in got) == [0, 1, 4, 9, 16, 25]
    finally:
        workers.close()
    assert signalled_from and set(signalled_from) == {"lazyseq-serve-ray-watch"}
    assert lazyseq_threads() == []


def test_the_watch_of_a_descriptor_ends_with_the_ray_session(gate, monkeypatch):
    # After ray.shutdown(), its thread's next ray.wait started a Ray of its own, and the user's ray.init() then hung.
    workers = RayWorkers(SpinAfterFirst(gate), LoaderOptions.check("serve", 1, "ray"), 0, "item", None)
    try:
        fds = workers.fds()
        workers.submit_many([("slow", 1)])
        (slow,) = workers.running
        session = ray_workers._session()
        with monkeypatch.context() as patch:
            patch.setattr(ray_workers, "_session", lambda: (session[0], session[1], "another job"))
            assert select.select(fds, [], [], 30)[0] == fds  # the reader is woken, and learns it
            with pytest.raises(lazyseq.LoaderError, match="the Ray session its tasks ran in has ended"):
                workers.poll(0)
        assert "lazyseq-serve-ray-watch" not in lazyseq_threads()
    finally:
        workers.close()
        ray.get(gate.arrived.remote(1), timeout=60)  # running: Ray drops a cancel that comes before
        ray.cancel(slow)  # left running by the close, in what it took for another session


def test_a_close_cut_short_by_the_programs_own_interrupt_handler_still_releases_everything(gate, monkeypatch):
    # The handler's KeyboardInterrupt, raised in close()'s wait for young tasks, left them running, and the watch's
    # thread and pipe open for good (the loader counted as closed).
    def own_handler(signum, frame):
        raise KeyboardInterrupt("the program's own handler")

    wait = ray_workers._all_completed

    def interrupted_wait(refs, timeout):
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        return wait(refs, timeout)

    monkeypatch.setattr(ray_workers, "_all_completed", interrupted_wait)
    previous = signal.signal(signal.SIGINT, own_handler)
    try:
        workers = RayWorkers(SpinAfterFirst(gate), LoaderOptions.check("serve", 2, "ray"), 0, "item", None)
        (fd,) = workers.fds()
        workers.submit_many([("a", 1), ("b", 2)])
        in_flight = list(workers.running)
        ray.get(gate.arrived.remote(2), timeout=60)  # both running (Ray drops a cancel that comes before)
        with pytest.raises(KeyboardInterrupt, match="own handler"):
            workers.close()
    finally:
        signal.signal(signal.SIGINT, previous)
    for ref in in_flight:
        with pytest.raises(ray.exceptions.TaskCancelledError):
            ray.get(ref, timeout=60)
    assert lazyseq_threads() == []
    with pytest.raises(OSError):
        os.fstat(fd)


def test_a_view_served_from_ray_tasks(cluster):
    pytest.importorskip("zmq")
    local = lazyseq.smap(square, np.arange(60.0))
    with lazyseq.serve(local, "tcp://127.0.0.1:0", nworkers=2, method="ray") as server:
        with lazyseq.connect(server.address, ahead=4) as remote:
            assert list(remote) == list(local)
            assert list(remote[[7, 3]]) == [49.0, 9.0]
    assert lazyseq_threads() == []


def test_options_that_do_not_apply_to_ray_are_refused():
    with pytest.raises(ValueError, match=r"^prefetch: start_hook does not apply to method='ray'"):
        lazyseq.prefetch(range(3), nworkers=1, method="ray", start_hook=print)
    with pytest.raises(ValueError, match=r"^load_buffers: start_method only applies to method='process'"):
        lazyseq.load_buffers(draw, nworkers=1, method="ray", start_method="spawn")


# -- a node that dies mid-run ------------------------------------------------------------------------------


class StallOn:
    """Item ``i`` is ``i * i``; on node ``node_id`` it passes ``gate`` and never finishes.

    Elsewhere, items wait until that happened, polling so that their CPU stays taken (a task blocked in
    ``ray.get`` would lend it to the next): the only CPU left for the next task is on that node.
    """

    def __init__(self, node_id, gate):
        self.node_id, self.gate = node_id, gate

    def __call__(self, i):
        if ray.get_runtime_context().get_node_id() == self.node_id:
            ray.get(self.gate.arrive.remote())
            time.sleep(600)
        arrived, deadline = self.gate.arrived.remote(), time.monotonic() + 120
        while not ray.wait([arrived], timeout=0)[0]:
            if time.monotonic() > deadline:
                raise TimeoutError("no task ran on the node to be removed")
            time.sleep(0.01)
        return i * i


@ray.remote(num_cpus=1)
def node_id():
    return ray.get_runtime_context().get_node_id()


@pytest.fixture
def doomed(cluster):
    """A third node, with a worker process up there."""
    node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    on_node = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    assert ray.get(node_id.options(scheduling_strategy=on_node).remote()) == node.node_id
    yield node
    if node in cluster.worker_nodes:
        cluster.remove_node(node)


def test_a_node_removed_mid_run_costs_only_time(cluster, doomed, gate):
    node = doomed
    workers = RayWorkers(StallOn(node.node_id, gate), LoaderOptions.check("prefetch", 3, "ray"), 0, "item", None)
    try:
        workers.submit_many([(i, i) for i in range(60)])
        arrived, delivered = gate.arrived.remote(), []
        while len(delivered) < 60:
            if arrived is not None and ray.wait([arrived], timeout=0)[0]:
                cluster.remove_node(node)  # a task is running there: it must run again elsewhere
                arrived = None
            delivered += workers.poll(0.5)
        assert arrived is None, "no task ran on the node that was to be removed"
        assert sorted(done.task for done in delivered) == list(range(60))  # each exactly once
        assert all(done.status == "ok" and done.value == done.task**2 for done in delivered)
    finally:
        workers.close()


# -- write_npy and the per-file example ---------------------------------------------------------------------


class PassOn(StallOn):
    """Items as they are; in Ray workers, as :class:`StallOn` (write_npy reads item 0 here first: it passes)."""

    def __init__(self, node_id, gate):
        super().__init__(node_id, gate)
        self.here = os.getpid()

    def __call__(self, item):
        if os.getpid() != self.here:
            super().__call__(0)
        return item


def test_a_loader_whose_ray_session_ended_says_so_and_starts_anew(cluster, monkeypatch):
    # After ray.shutdown() and another ray.init(), its tasks (of the old session) never finished: the next read
    # waited for ever, or failed every item with Ray's "owner is unknown" as the item's error.
    with lazyseq.prefetch(lazyseq.smap(double, range(20)), nworkers=2, method="ray") as ahead:
        assert ahead[0] == 0
        session = ray_workers._session()
        monkeypatch.setattr(ray_workers, "_session", lambda: (session[0], session[1], "another job"))
        with pytest.raises(lazyseq.LoaderError) as info:
            ahead[10]
        assert str(info.value) == (
            "prefetch: the Ray session its tasks ran in has ended (ray.shutdown(), then perhaps another ray.init()); "
            "read again to start them in the current one"
        )
        assert not ahead.workers_running
        assert list(ahead) == [2 * x for x in range(20)]  # new workers, in the session there is now


def test_load_buffers_whose_ray_session_ended_says_so_and_starts_anew(cluster, monkeypatch):
    # Its iteration ended after the message that said to read again.
    with lazyseq.load_buffers(functools.partial(np.ones, 2), nworkers=2, method="ray") as batches:
        assert next(batches).tolist() == [1.0, 1.0]
        session = ray_workers._session()
        monkeypatch.setattr(ray_workers, "_session", lambda: (session[0], session[1], "another job"))
        with pytest.raises(lazyseq.LoaderError) as info:
            next(batches)
        assert str(info.value) == (
            "load_buffers: the Ray session its tasks ran in has ended (ray.shutdown(), then perhaps another "
            "ray.init()); read again to start them in the current one"
        )
        assert [next(batches).tolist() for _ in range(3)] == [[1.0, 1.0]] * 3  # new workers, in the current session


def test_write_npy_on_ray_writes_the_same_bytes(cluster, tmp_path):
    lazyseq.write_npy(pipeline(57), tmp_path / "reference", rows_per_shard=10)
    lazyseq.write_npy(pipeline(57), tmp_path / "ray", rows_per_shard=10, nworkers=2, method="ray")
    assert contents(tmp_path / "ray") == contents(tmp_path / "reference")


def test_write_npy_on_ray_with_fewer_shards_than_workers_says_so(cluster, tmp_path):
    # Each Ray worker writes whole shards: one shard kept one worker busy and the other idle, without a word.
    with pytest.warns(UserWarning) as caught:
        lazyseq.write_npy(pipeline(57), tmp_path, nworkers=2, method="ray")
    assert [str(w.message) for w in caught] == [
        "write_npy: 1 shard to write for 2 Ray workers, each of which writes whole shards: 1 will have nothing to do; "
        "a smaller rows_per_shard (or bytes_per_shard) gives each one a shard"
    ]
    assert caught[0].filename == __file__


def test_write_npy_on_ray_writes_a_relative_directory_where_the_caller_is(cluster, tmp_path, monkeypatch):
    # The Ray workers resolved it from their own directory (where the cluster started): the shards went there,
    # and the caller's directory got a manifest listing files it did not have.
    monkeypatch.chdir(tmp_path)
    lazyseq.write_npy(pipeline(57), "features", rows_per_shard=10, nworkers=2, method="ray")
    lazyseq.write_npy(pipeline(57), "reference", rows_per_shard=10)
    assert contents(tmp_path / "features") == contents(tmp_path / "reference")


def test_write_npy_on_ray_names_a_failing_item_and_its_shard(cluster, tmp_path):
    with pytest.raises(lazyseq.EvaluationError) as info:
        lazyseq.write_npy(pipeline(57, fail_at=43), tmp_path, rows_per_shard=10, nworkers=2, method="ray")
    assert str(info.value) == (
        f"write_npy: shard 4 of {tmp_path} failed at item 43 (smap(Transform)[43]): ValueError: row 43 is bad"
    )
    assert "manifest.json" not in os.listdir(tmp_path)


def test_write_npy_on_ray_survives_a_node_removed_mid_write(cluster, doomed, gate, tmp_path):
    node = doomed

    def remove_once_a_shard_runs_there():
        ray.get(gate.arrived.remote(), timeout=120)
        cluster.remove_node(node)

    lazyseq.write_npy(pipeline(57), tmp_path / "reference", rows_per_shard=10)
    remover = threading.Thread(target=remove_once_a_shard_runs_there)
    remover.start()
    items = pipeline(57).smap(PassOn(node.node_id, gate))
    lazyseq.write_npy(items, tmp_path / "ray", rows_per_shard=10, nworkers=3, method="ray")
    remover.join()
    assert node not in cluster.worker_nodes
    assert contents(tmp_path / "ray") == contents(tmp_path / "reference")  # no temporary file either


def test_the_per_file_example_runs_on_ray(cluster, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("per_file_workflow", EXAMPLES / "per_file_workflow.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # 16 files: a shard of 8 spectra for each of the 2 Ray workers (fewer shards than workers: a warning)
    metadata = example.main(["--method", "ray", "--files", "16", "--folder", str(tmp_path)])
    assert [row["file"] for row in metadata] == [f"recording_{k:03d}" for k in range(16)]
    for k, row in enumerate(metadata):
        signal = np.load(tmp_path / "inputs" / f"recording_{k:03d}.npy")
        np.testing.assert_array_equal(np.load(row["output"]), example.spectrum(signal))
    assert f"16 spectra of {example.BINS * 3} values in {tmp_path / 'spectra'}" in capsys.readouterr().out


def interrupt_on_five(x):
    if x == 5:
        raise KeyboardInterrupt("raised by the pipeline")
    return x


def test_an_interrupt_raised_by_the_pipeline_fails_its_item_alone(cluster):
    # Ray took it for a cancellation of the whole run: the item was sent again, for ever.
    with lazyseq.prefetch(lazyseq.smap(interrupt_on_five, range(10)), nworkers=2, method="ray") as ahead:
        assert list(ahead[:5]) == [0, 1, 2, 3, 4]
        with pytest.raises(KeyboardInterrupt, match="raised by the pipeline"):
            ahead[5]
        assert list(ahead[6:]) == [6, 7, 8, 9]
        reads, got = iter(ahead), []  # an iteration goes on past it: it was read again, for ever
        for _ in range(12):
            try:
                got.append(next(reads))
            except KeyboardInterrupt:
                got.append("interrupt")
            except StopIteration:
                break
        assert got == [0, 1, 2, 3, 4, "interrupt", 6, 7, 8, 9]


class Unsendable:
    def __reduce__(self):
        raise TypeError("not to be pickled")


def unsendable_on_three(x):
    return Unsendable() if x == 3 else x


def test_a_result_that_cannot_be_sent_back_fails_its_item_alone(cluster):
    # Ray failed the whole run: a LoaderError about other items, raised at a read of a good one.
    values = []
    with lazyseq.prefetch(lazyseq.smap(unsendable_on_three, range(6)), nworkers=2, method="ray") as ahead:
        for i in range(6):
            try:
                values.append(ahead[i])
            except lazyseq.EvaluationError as error:
                values.append(str(error))
    failure = "failed to compute prefetch[3]: TypeError: the result cannot be sent from the Ray worker: TypeError: "
    assert values == [0, 1, 2, failure + "not to be pickled", 4, 5]


def exit_on_twenty(x):
    if x == 20:
        os._exit(1)
    return x


def test_an_item_that_ends_every_ray_worker_is_the_only_one_lost(cluster):
    # The whole run of items it was sent with died with it: every read of one of them raised WorkerDied.
    values, suspects = [], set()
    with lazyseq.prefetch(lazyseq.smap(exit_on_twenty, range(30)), nworkers=2, method="ray") as ahead:
        for i in range(30):
            try:
                values.append(ahead[i])
            except lazyseq.WorkerDied as died:  # raised at the read under way when it was found
                suspects.add(died.suspects)
                values.append(None if i == 20 else ahead[i])
    assert suspects == {(20,)} and values == [None if i == 20 else i for i in range(30)]


def test_a_pipeline_that_cannot_be_pickled_is_named_with_its_caller_and_ray(cluster):
    # The message said "prefetch: ... to worker processes" for evaluate on Ray.
    lock = threading.Lock()
    pipeline = lazyseq.smap(lambda x: x if lock else None, range(4))
    with pytest.raises(TypeError, match=r"^evaluate: cannot send the smap\(.*<lambda>\) view to Ray's workers: "):
        lazyseq.evaluate(lambda b: b, pipeline, batch_size=2, nworkers=2, method="ray")


def double(x):
    return 2 * x


@ray.remote(num_cpus=1)
def sum_through_a_ray_loader(k):
    with lazyseq.prefetch(lazyseq.smap(functools.partial(times, k), range(20)), nworkers=1, method="ray") as items:
        return sum(items)


def times(k, x):
    return k * x


def test_ray_loaders_inside_ray_tasks_that_hold_every_cpu(cluster):
    # The loader waited through futures, which Ray does not count as a task blocked: the outer tasks kept both CPUs
    # and the loaders' tasks never started.
    assert ray.get([sum_through_a_ray_loader.remote(k) for k in (1, 2)], timeout=120) == [190, 380]


def test_an_interrupt_as_a_local_ray_starts_shuts_down_what_it_started(monkeypatch):
    # Its agents (ray::DashboardAgent, ray::RuntimeEnvAgent) outlived the program, under init, ignoring SIGTERM.
    calls = []

    def init(*args, **kwargs):
        calls.append("init")
        raise KeyboardInterrupt

    monkeypatch.setattr(ray_workers.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_workers.ray, "init", init)
    monkeypatch.setattr(ray_workers.ray, "shutdown", lambda: calls.append("shutdown"))
    with pytest.raises(KeyboardInterrupt):
        ray_workers.connect_to_ray("prefetch")
    assert calls == ["init", "shutdown"]
