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
