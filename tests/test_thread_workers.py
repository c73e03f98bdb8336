"""Worker threads: closing skips the tasks still queued and waits for the running ones within one bound."""

import threading
import time

from lazyseq.loading.options import LoaderOptions
from lazyseq.loading.thread_workers import ThreadWorkers, worker_stopping


def test_close_skips_the_queued_tasks_and_waits_for_the_running_one():
    started, release, ran = threading.Event(), threading.Event(), []

    def job(arg):
        ran.append(arg)
        started.set()
        release.wait()
        return arg

    workers = ThreadWorkers(job, LoaderOptions.check("prefetch", nworkers=1))
    workers.submit_many([(k, k) for k in range(5)])
    started.wait()
    closer = threading.Thread(target=workers.close)
    closer.start()
    deadline = time.monotonic() + 60
    while workers._tickets[4].state == "queued" and time.monotonic() < deadline:  # close() got that far
        time.sleep(0.001)
    release.set()
    closer.join()
    assert ran == [0]
    assert [workers._tickets[k].state for k in range(1, 5)] == ["skipped"] * 4
    assert not any(t.name.startswith("lazyseq-prefetch") for t in threading.enumerate())


def test_a_job_can_tell_that_its_loader_is_closing():
    started, answers = threading.Event(), []

    def job(arg):
        answers.append(worker_stopping())
        started.set()
        workers._stopping.wait(timeout=60)  # until close() began
        answers.append(worker_stopping())
        return arg

    workers = ThreadWorkers(job, LoaderOptions.check("prefetch", nworkers=1))
    workers.submit_many([(0, 0)])
    started.wait()
    workers.close()
    assert answers == [False, True] and not worker_stopping()


def test_a_loader_collected_leaves_busy_threads_to_end_on_their_own(monkeypatch):
    # Rebinding a variable that held a thread loader froze the program (a notebook cell) for up to 10 s, while the
    # close the collector ran waited for threads busy in an item, whose results nobody would read.
    import gc

    import lazyseq
    import lazyseq.loading.thread_workers as thread_workers

    waits = []
    real_wait = thread_workers.wait_unless_hurried
    monkeypatch.setattr(thread_workers, "wait_unless_hurried", lambda wait, seconds: waits.append(seconds))
    release = threading.Event()

    def item(i):
        if i:
            release.wait()  # busy until the test lets it go
        return i

    before = set(threading.enumerate())
    loader = lazyseq.prefetch(lazyseq.smap(item, range(10)), nworkers=1, method="thread", inline_below=0)
    assert loader[0] == 0
    threads = set(threading.enumerate()) - before
    del loader
    gc.collect()
    assert waits == [] and threads <= set(thread_workers._busy_at_exit)  # collected: waited for at exit only
    release.set()
    for thread in threads:
        thread.join()
    monkeypatch.setattr(thread_workers, "wait_unless_hurried", real_wait)
    explicit = lazyseq.prefetch(lazyseq.smap(item, range(10)), nworkers=1, method="thread", inline_below=0)
    assert explicit[0] == 0
    threads = set(threading.enumerate()) - before
    explicit.close()  # closed by the program: waits for its threads
    assert threads and not any(thread.is_alive() for thread in threads)


def test_threads_a_collected_loader_left_busy_finish_their_item_before_the_program_ends(tmp_path):
    # Not waited for by the collector's close, they were cut off by the interpreter's exit: the item never ended.
    import subprocess
    import sys

    script = """
import sys, threading, time, lazyseq
go = threading.Event()
def item(i):
    if i == 1:
        go.wait()
        time.sleep(0.5)  # the rest of the item's work, after the program's last line
        open(sys.argv[1], "w").write("done")
    return i
loader = lazyseq.prefetch(lazyseq.smap(item, range(4)), nworkers=1, method="thread", inline_below=0)
assert loader[0] == 0
loader = None  # dropped: the collector closes it, not waiting for the busy thread
go.set()
"""
    done = tmp_path / "done.txt"
    subprocess.run([sys.executable, "-c", script, str(done)], check=True, timeout=60)
    assert done.read_text() == "done"


def test_a_ctrl_c_while_the_program_ends_cuts_the_wait_for_busy_threads_short_quietly():
    # The wait at exit for threads a collected loader left busy printed "Exception ignored in atexit callback".
    import signal
    import subprocess
    import sys

    script = """
import threading, lazyseq
import lazyseq.loading.thread_workers as thread_workers
def item(i):
    if i:
        threading.Event().wait()  # never ends
    return i
def announced(*args):  # the wait says it began (an interrupt in a callback of the test's own would be printed)
    print("ending", flush=True)
    return wait(*args)
wait, thread_workers.wait_unless_hurried = thread_workers.wait_unless_hurried, announced
loader = lazyseq.prefetch(lazyseq.smap(item, range(4)), nworkers=1, method="thread", inline_below=0)
assert loader[0] == 0
loader = None  # dropped: the program's end waits for its busy thread
"""
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ending\n"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert (child.returncode, err) == (0, "")


def test_the_program_end_waits_once_for_the_busy_threads_of_every_loader(monkeypatch):
    # Each loader left open waited JOIN_SECONDS at exit for its busy threads: 30 s for three.
    import types

    import lazyseq.loading.thread_workers as thread_workers

    now = [100.0]
    monkeypatch.setattr(thread_workers.time, "monotonic", lambda: now[0])
    assert thread_workers._join_seconds() == thread_workers.JOIN_SECONDS  # while the program runs: each close
    monkeypatch.setattr(threading, "main_thread", lambda: types.SimpleNamespace(is_alive=lambda: False))
    monkeypatch.setattr(thread_workers, "_exit_deadline", [])
    waits = []
    for spent in (4.0, 5.0, 3.0):  # three loaders closed at exit, one after the other
        waits.append(thread_workers._join_seconds())
        now[0] += spent
    assert waits == [10.0, 6.0, 1.0] and thread_workers._join_seconds() == 0.0
