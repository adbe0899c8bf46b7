"""Stop requests: SIGTERM/SIGINT, and the end of the deepspeed launcher, turned into a request the
program acts on where it can stop cleanly (the trainer at the end of an optimizer step, with a
checkpoint; tools.prepare_data between units of work).

A handler only records the request; the program polls it (`received`, or `check()`, which
raises StopRequested). A second signal ends the process at once (exit code 128 + signal), except
for copies arriving within REPEAT_WINDOW seconds of the first: a scheduler signalling the whole
process group reaches a rank twice, directly and through the deepspeed launcher, which forwards
SIGTERM. The data providers' helper processes ignore these signals
(bert_dataset_provider.ignore_stop_signals), so that the rank can finish its step with them.
"""
import logging
import os
import signal
import threading
import time

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequested(Exception):
    """Raised by StopSignals.check() once a stop was requested; carries the signal number."""

    def __init__(self, signum):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class StopSignals:
    """The stop requests of one program run: install() at the start, uninstall() at the end.
    `action` says, in the log line of the first request, what the program does about it."""

    REPEAT_WINDOW = 2.0
    LAUNCHER_GONE = int(signal.SIGHUP)  # the code a stop for a vanished launcher goes by

    def __init__(self, action="stopping after this optimizer step with a checkpoint"):
        self.action = action
        self.received = None
        self.received_at = None
        self.reason = None
        self._previous = {}
        self._watch = None

    def install(self, watch_launcher=False):
        """Handle SIGTERM/SIGINT; with `watch_launcher`, also stop when the deepspeed launcher that
        started this rank is gone (LauncherWatch)."""
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        if watch_launcher and LauncherWatch.applies():
            self._watch = LauncherWatch(self)
            self._watch.start()

    def uninstall(self):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if self._watch is not None:
            self._watch.stop()

    def _handle(self, signum, frame):
        if self.received is not None:
            if time.time() - self.received_at < self.REPEAT_WINDOW:
                return
            os._exit(128 + signum)
        self.request(signum, f"Received {signal.Signals(signum).name}")

    def request(self, code, reason):
        """Ask for a stop (from a signal handler or the launcher watch); the first request counts."""
        if self.received is not None:
            return
        self.received, self.received_at, self.reason = code, time.time(), reason
        logger.warning("%s: %s (a signal sent again exits at once)", reason, self.action)

    def check(self):
        """Raise StopRequested once a stop was requested."""
        if self.received is not None:
            raise StopRequested(self.received)

    def describe(self, code):
        """The stop reason of `code`, which may have come from another rank."""
        if code == self.LAUNCHER_GONE:
            seen = self.reason if self.received == code else "seen by another rank"
            return f"stopped: the deepspeed launcher is gone ({seen})"
        return f"stopped by {signal.Signals(code).name}"


def _proc_parent(pid):
    """The parent pid of process `pid`, read from /proc (Linux); None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _proc_cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


class LauncherWatch(threading.Thread):
    """Stops the rank (through StopSignals.request) once its launcher is gone.

    The deepspeed command runs launch.py, which runs the ranks. Killed alone, the command exits
    and leaves launch.py and the ranks training; launch.py killed with SIGKILL leaves the ranks.
    This thread polls /proc once a second: when launch.py is no longer this rank's parent, or the
    deepspeed command no longer launch.py's, it asks for a stop as SIGTERM does. It runs only
    under launch.py; the command above it is watched only when it is deepspeed's runner (a shell
    that ran launch.py itself may end without stopping the run).
    """

    POLL_SECONDS = 1.0

    def __init__(self, signals):
        super().__init__(name="LauncherWatch", daemon=True)
        self.signals = signals
        self.launch_pid = os.getppid()
        runner = _proc_parent(self.launch_pid)
        command = _proc_cmdline(runner) if runner else []
        is_runner = ("deepspeed.launcher.runner" in command
                     or any(os.path.basename(a) in ("deepspeed", "ds") for a in command[:2]))
        self.runner_pid = runner if is_runner else None
        self._done = threading.Event()

    @staticmethod
    def applies():
        return any("deepspeed.launcher.launch" in a for a in _proc_cmdline(os.getppid()))

    def run(self):
        while not self._done.wait(self.POLL_SECONDS):
            if os.getppid() != self.launch_pid:
                gone = f"launch.py (pid {self.launch_pid}) has ended"
            elif self.runner_pid is not None and _proc_parent(self.launch_pid) != self.runner_pid:
                gone = f"the deepspeed command (pid {self.runner_pid}) has ended"
            else:
                continue
            self.signals.request(StopSignals.LAUNCHER_GONE, gone)
            return

    def stop(self):
        self._done.set()
