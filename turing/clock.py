"""The run's training clock: the wall time of the step loop, summed over the run's sessions.

Time spent validating or writing checkpoints is not training time (`paused()`), so that
--max_train_hours, the `budget` LR schedule, throughput and every accuracy-against-minutes
figure mean the same whatever is validated or saved, and however often. Earlier sessions'
training time comes from the run state (RunState.train_seconds, saved in every checkpoint).
"""
import contextlib
import time


class TrainClock:
    def __init__(self):
        self.started = time.time()
        self.paused_seconds = 0.0
        self._pause_started = None

    def start(self):
        """The step loop begins: this session's training time counts from now."""
        self.started, self.paused_seconds, self._pause_started = time.time(), 0.0, None

    @contextlib.contextmanager
    def paused(self):
        """Inside, the clock stands still (nested pauses count once)."""
        if self._pause_started is not None:
            yield
            return
        self._pause_started = time.time()
        try:
            yield
        finally:
            self.paused_seconds += time.time() - self._pause_started
            self._pause_started = None

    def session_seconds(self):
        """Training seconds of this session so far."""
        now = self._pause_started if self._pause_started is not None else time.time()
        return now - self.started - self.paused_seconds

    def train_seconds(self, state):
        """Training seconds of the whole run: earlier sessions' (`state.train_seconds`) and this one's."""
        return state.train_seconds + self.session_seconds()
