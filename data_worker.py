"""AsyncWorker: a background thread that fetches batches ahead of the step loop.

Owns: the request/return queues between the step loop and the thread, the prefetch window,
the order of returned batches, and the hand-over of the thread's failures to the caller.

The step loop asks for batches in the order of `dataset_picker` (a list of dataset ids);
the thread takes an id from `req_queue`, reads `next(dataloaders[id])` and puts it on
`ret_queue`. `__init__` requests the first `prefetch_window` (3) entries, each `prefetch()`
requests one more, so at most that many batches are ever in flight. A `None` request ends
the thread.

Unlike the original: an exception raised while fetching (including an exhausted loader) is
handed to `get()` and raised there, instead of leaving the caller waiting forever; `stop()`
ends the thread promptly even if batches are still queued or the thread is blocked on a full
`ret_queue`; the thread is a daemon, so it never keeps the process alive.
"""
import logging
import queue
import threading

logger = logging.getLogger(__name__)

PREFETCH_WINDOW = 3
# Queue waits are bounded so that stop() and a dead thread are noticed within this time (s).
_POLL_SECONDS = 0.05


class DataExhaustedError(RuntimeError):
    """A data loader ran out of batches before the epoch's dataset picker did."""


class AsyncWorker(threading.Thread):
    """Prefetch batches from `dataloaders` in `dataset_picker` order. `dataloaders` maps dataset
    ids to loaders or iterators: a dict, or a list indexed by id (as the original's callers pass)."""

    def __init__(self, dataloaders, dataset_picker, prefetch_window=PREFETCH_WINDOW):
        super().__init__(name="AsyncWorker", daemon=True)
        if not isinstance(dataloaders, dict):
            dataloaders = dict(enumerate(dataloaders))
        self.dataloaders = {key: iter(loader) for key, loader in dataloaders.items()}
        self.dataset_picker = list(dataset_picker)
        self.req_queue = queue.Queue()
        # Bounded: the thread never holds more than the window in memory.
        self.ret_queue = queue.Queue(maxsize=max(1, prefetch_window))
        self._stopping = threading.Event()
        self._next_request = 0   # index into dataset_picker of the next entry to request
        self._outstanding = 0    # requested but not yet returned by get()
        for _ in range(min(prefetch_window, len(self.dataset_picker))):
            self.prefetch()

    def run(self):
        while not self._stopping.is_set():
            try:
                dataset_id = self.req_queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            if dataset_id is None:
                break
            try:
                item = (next(self.dataloaders[dataset_id]), None)
            except StopIteration:
                item = (None, DataExhaustedError(f"data loader for dataset {dataset_id} ran out of batches "
                                                 f"before the dataset picker did"))
            except Exception as e:  # handed to the consumer; the thread has no one else to tell
                item = (None, e)
            if not self._put(item) or item[1] is not None:
                break

    def _put(self, item):
        """Put on ret_queue, giving up if stop() is called while the queue is full."""
        while not self._stopping.is_set():
            try:
                self.ret_queue.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def get(self, dataset_id=None):
        """The next batch in picker order; re-raises an exception the thread met while fetching it.
        `dataset_id`: the picker entry the caller expects next (a caller out of step with the
        picker is an error, not a batch of the wrong dataset)."""
        if self._outstanding == 0:
            raise DataExhaustedError(f"AsyncWorker.get(): no batch requested; all {len(self.dataset_picker)} "
                                     f"entries of the dataset picker have been returned")
        if self.ident is None:
            raise RuntimeError("AsyncWorker.get() before start()")
        while True:
            try:
                batch, error = self.ret_queue.get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
                if not self.is_alive():
                    try:  # the thread may have put its last item just before it ended
                        batch, error = self.ret_queue.get_nowait()
                        break
                    except queue.Empty:
                        state = "was stopped" if self._stopping.is_set() else "has ended"
                        raise RuntimeError(f"AsyncWorker {state} with a batch still requested") from None
        self._outstanding -= 1
        if error is not None:
            raise error
        served = self.dataset_picker[self._next_request - self._outstanding - 1]
        if dataset_id is not None and dataset_id != served:
            raise RuntimeError(f"AsyncWorker.get({dataset_id}): the next batch in picker order is of dataset {served}")
        return batch

    def prefetch(self):
        """Request the next picker entry, if any is left."""
        if self._next_request < len(self.dataset_picker):
            self.req_queue.put(self.dataset_picker[self._next_request])
            self._next_request += 1
            self._outstanding += 1

    def stop(self):
        """End the thread soon, whatever is queued; follow with join()."""
        self._stopping.set()
        self.req_queue.put(None)
