"""AsyncWorker: picker order, the prefetch window, errors reach get(), stop/join never hang,
short pickers."""
import itertools
import threading
import time

import pytest

from data_worker import AsyncWorker, DataExhaustedError


def tagged(name):
    """An endless loader yielding (name, 0), (name, 1), ..."""
    return ((name, i) for i in itertools.count())


def drain(worker, n):
    out = []
    for _ in range(n):
        out.append(worker.get())
        worker.prefetch()
    return out


def test_batches_come_back_in_picker_order():
    picker = [0, 0, 1, 0, 1, 1, 1, 0, 0]
    worker = AsyncWorker({0: tagged("a"), 1: tagged("b")}, picker)
    assert worker.daemon
    worker.start()
    got = drain(worker, len(picker))
    counters = {0: 0, 1: 0}
    expected = []
    for d in picker:
        expected.append(("ab"[d], counters[d]))
        counters[d] += 1
    assert got == expected
    worker.stop()
    worker.join(timeout=1)
    assert not worker.is_alive()


def test_prefetch_window_is_three():
    fetched = []

    def loader():
        for i in itertools.count():
            fetched.append(i)
            yield i

    worker = AsyncWorker({0: loader()}, [0] * 10)
    worker.start()
    deadline = time.time() + 2
    while len(fetched) < 3 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(fetched) == 3  # nothing beyond the window until the consumer asks
    assert worker.get() == 0
    worker.prefetch()
    deadline = time.time() + 2
    while len(fetched) < 4 and time.time() < deadline:
        time.sleep(0.01)
    assert len(fetched) == 4
    worker.stop()
    worker.join(timeout=1)


def test_loader_error_is_raised_in_get_not_a_hang():
    def broken():
        yield "first"
        raise ValueError("corrupt shard xyz")

    worker = AsyncWorker({0: broken()}, [0, 0, 0, 0])
    worker.start()
    assert worker.get() == "first"
    worker.prefetch()
    with pytest.raises(ValueError, match="corrupt shard xyz"):
        worker.get()
    # The thread has ended; asking again is an error too, never a wait.
    started = time.time()
    with pytest.raises(RuntimeError):
        worker.get()
    assert time.time() - started < 1
    worker.join(timeout=1)
    assert not worker.is_alive()


def test_exhausted_loader_is_a_named_error():
    worker = AsyncWorker({0: iter([1, 2]), 1: tagged("b")}, [0, 1, 0, 0])
    worker.start()
    assert drain(worker, 3) == [1, ("b", 0), 2]
    with pytest.raises(DataExhaustedError, match="dataset 0 ran out"):
        worker.get()


def test_stop_with_queued_batches_joins_promptly():
    worker = AsyncWorker({0: tagged("a")}, [0] * 100)
    worker.start()
    for _ in range(10):  # more requests than ret_queue holds: the thread blocks on a full queue
        worker.prefetch()
    deadline = time.time() + 2
    while not worker.ret_queue.full() and time.time() < deadline:
        time.sleep(0.01)
    assert worker.ret_queue.full()
    started = time.time()
    worker.stop()
    worker.join(timeout=1)
    assert not worker.is_alive()
    assert time.time() - started < 1


def test_stop_while_loader_is_slow():
    release = threading.Event()

    def slow():
        release.wait(5)
        yield "late"

    worker = AsyncWorker({0: slow()}, [0, 0])
    worker.start()
    worker.stop()
    release.set()
    worker.join(timeout=1)
    assert not worker.is_alive()


@pytest.mark.parametrize("length", [0, 1, 2])
def test_short_pickers(length):
    worker = AsyncWorker({0: tagged("a")}, [0] * length)
    worker.start()
    assert drain(worker, length) == [("a", i) for i in range(length)]
    started = time.time()
    with pytest.raises(DataExhaustedError, match="no batch requested"):
        worker.get()
    assert time.time() - started < 0.5
    worker.stop()
    worker.join(timeout=1)
    assert not worker.is_alive()
