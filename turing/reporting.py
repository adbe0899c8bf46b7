"""Metrics: the sinks (rank 0: TensorBoard, and W&B or MLflow where --report_to asks, turing.sinks)
and the progress lines.

Every metric goes through `Reporter.log(step, {tag: value})`, to every sink. Per optimizer step the reporter keeps the loss on the device; every
--print_steps steps (`due`) it writes the pending steps in one host sync, with the loss averaged
over the ranks, and a progress line with the throughput since the last one: samples/s,
tokens/s and model FLOPs utilisation (turing.flops) over training time (turing.clock: time spent
validating or checkpointing is not in it), the share of that time spent waiting for data, and
an estimate of the time the run has left.
"""
import logging
import math

import torch

from turing.distributed import all_reduce, multi_rank
from turing.flops import is_measured
from turing.sinks import TensorBoardSink, open_sinks, write_metrics  # noqa: F401 (write_metrics: importable here)

logger = logging.getLogger("bing_bert")

LOW_PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16"}

# Said once, with the first progress line, where the peak is a measured matmul (the CPU, an unknown GPU).
MEASURED_PEAK_NOTE = ("MFU: the peak is measured on this machine as loaded now, so the MFU moves with the load (other "
                      "work slows the model and the measurement by turns); where the model runs faster than the peak, "
                      "it is measured again and raised, silently: the MFU stays at most 100% "
                      "(Train/peak_TFLOPs_per_device follows it)")


def significant_digits(dtype):
    """The decimal digits a floating-point type holds: 3 for bf16 (8 significant bits), 4 for fp16."""
    return math.ceil(-math.log10(torch.finfo(dtype).eps))


def value_spacing(value, dtype):
    """The distance between neighbouring values of `dtype` near `value` (bf16 at 9: 0.0625)."""
    if not math.isfinite(value) or value == 0:
        return torch.finfo(dtype).tiny
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(abs(value)))


class Reporter:
    """The metrics sinks (rank 0: TensorBoard and whatever else --report_to names, turing.sinks)
    and the progress lines for one session. `flops_per_sequence` and
    `peak_tflops(again=False)` (of one device: (TFLOP/s, where the figure comes from), asked on
    rank 0 at the first progress line) give the MFU; `clock` the training time. A measured peak
    that the run's own FLOP rate exceeds is measured again and raised to the larger of the two
    (the first measurement ran under other load), so the MFU of a measured peak is never above
    100%."""

    def __init__(self, cfg, clock, flops_per_sequence, peak_tflops):
        self.config = cfg
        self.clock = clock
        self.ranks = cfg.ranks
        self.is_master = cfg.ranks.is_main
        self.flops_per_sequence = flops_per_sequence
        self._peak_tflops = peak_tflops
        self.peak = None           # (TFLOP/s, source), once asked
        self._sinks = None         # opened at the first metric (rank 0): a run that fails to start writes none
        self._said = set()         # first_time's keys
        self._fp16_skipped = 0     # the engine's count of overflow-skipped fp16 steps, last seen
        self.pending = []          # (step, samples, lr, loss tensor) not yet written
        self.loss_dtype = None     # a bf16/fp16 loss's dtype: printed to the digits it holds (None: fp32's %.6f)
        self.window = (clock.session_seconds(), 0, 0.0)  # training seconds at its start, steps, data wait

    @property
    def sinks(self):
        """The run's metrics sinks on rank 0 ([] elsewhere)."""
        if self._sinks is None:
            names = getattr(self.config, "report_to", ("tensorboard",))  # (a hand-built config: the default)
            self._sinks = open_sinks(self.config, names) if self.is_master else []
        return self._sinks

    @property
    def writer(self):
        """The TensorBoard writer on rank 0 (None elsewhere, or without the TensorBoard sink)."""
        board = next((s for s in self.sinks if isinstance(s, TensorBoardSink)), None)
        return board.writer if board is not None else None

    def first_time(self, key):
        """True the first time `key` is asked in this session: for what is said once."""
        if key in self._said:
            return False
        self._said.add(key)
        return True

    def fp16_skipped(self, step, skipped):
        """The engine's count of fp16 steps its loss scaler skipped, after optimizer step `step`:
        each new one is said and logged."""
        if skipped != self._fp16_skipped:
            self._fp16_skipped = skipped
            logger.warning("fp16 overflow: step %d skipped by the loss scaler (%d in all)", step, skipped)
            self.log(step, {"Train/fp16_skipped_steps": skipped})

    def log(self, step, values):
        """Write {tag: value} at x = `step` to every sink (rank 0; a no-op elsewhere)."""
        for sink in self.sinks:
            sink.log(step, values)

    def due(self, step):
        """A progress line (and the pending steps written) after optimizer step `step`."""
        return step % self.config.print_steps == 0

    def step(self, state, lr, loss, data_wait, steps_left=None):
        """One optimizer step's results: `loss` (this rank's, on the device), the LR it ran at,
        the seconds it waited for data; `steps_left`, the run's remaining optimizer steps where
        known (for the time estimate)."""
        if loss.dtype in LOW_PRECISION:
            self.loss_dtype = loss.dtype
        self.pending.append((state.global_step, state.global_data_samples, lr, loss))
        start, steps, waited = self.window
        self.window = (start, steps + 1, waited + data_wait)
        if self.due(state.global_step):
            self.progress(state, steps_left)

    def progress(self, state, steps_left=None):
        """Write the pending steps, then the progress line and the throughput since the last one."""
        written = self._write_pending()
        start, steps, waited = self.window
        now = self.clock.session_seconds()
        elapsed = max(now - start, 1e-9)
        cfg = self.config
        rate = steps * cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * self.ranks.world / elapsed
        self.window = (now, 0, 0.0)
        if not self.is_master:
            return
        if self.peak is None:
            self.peak = self._peak_tflops()
            logger.info("MFU against a peak of %.3g TFLOP/s per device (%s); %.3g FLOPs per training sequence",
                        self.peak[0], self.peak[1], self.flops_per_sequence)
            if is_measured(self.peak[1]):
                logger.info("%s", MEASURED_PEAK_NOTE)
            self.log(state.global_step, {"Train/peak_TFLOPs_per_device": self.peak[0],
                                         "Train/FLOPs_per_sequence": self.flops_per_sequence})
        achieved = rate * self.flops_per_sequence / (self.ranks.world * 1e12)   # model TFLOP/s per device
        if achieved > self.peak[0] and is_measured(self.peak[1]):
            self._raise_peak(state.global_step, achieved)
        mfu = achieved / self.peak[0]
        self.log(state.global_step, {"Train/samples_per_s": rate, "Train/tokens_per_s": rate * cfg.max_seq_length,
                                     "Train/MFU": mfu, "Train/data_wait_fraction": waited / elapsed})
        memory = ""
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # the GPU's peak so far, this rank
            peak_gib = torch.cuda.max_memory_allocated() / 2**30
            self.log(state.global_step, {"Train/peak_memory_GiB": peak_gib})
            memory = f", peak_memory={peak_gib:.1f}GiB"
        if written is not None:
            loss, lr = written
            eta = "" if steps_left is None or not steps else f", eta {steps_left * elapsed / steps / 60:.1f} min"
            logger.info("bing_bert_progress: step=%d, loss=%s, lr=%.6g, sample_count=%d, samples_per_s=%.1f, "
                        "tokens_per_s=%.0f, mfu=%.2f%%, data_wait=%.1f%%%s%s", state.global_step,
                        self._loss_text(loss), lr, state.global_data_samples, rate, rate * cfg.max_seq_length,
                        100 * mfu, 100 * waited / elapsed, memory, eta)

    def _raise_peak(self, step, achieved):
        """The measured peak is below the model's own rate: measure again, take the larger. Said at
        debug level (MEASURED_PEAK_NOTE said at the start why it happens) and in TensorBoard
        (Train/peak_TFLOPs_per_device): on a loaded machine it happens again and again."""
        again, source = self._peak_tflops(again=True)
        before = self.peak[0]
        self.peak = (max(again, achieved), f"{source}, raised at step {step}")
        logger.debug("MFU: the model ran at %.3g TFLOP/s per device at step %d, above the measured peak of %.3g; "
                     "measured again: %.3g; MFU is now against %.3g TFLOP/s%s", achieved, step, before, again,
                     self.peak[0], "" if again >= achieved else " (the model's own rate)")
        self.log(step, {"Train/peak_TFLOPs_per_device": self.peak[0]})

    def flush(self, to_disk=False):
        """Write pending step metrics (every rank takes part: the loss is averaged over them);
        `to_disk`: also the TensorBoard file, closed and reopened (tensorboardX's flush leaves
        queued events in memory), before a checkpoint, so that a kill right after it, or a disk
        the checkpoint fills up, keeps this session's curves up to it."""
        self._write_pending(line=True)
        if to_disk:
            for sink in self._sinks or ():
                sink.flush()

    def _write_pending(self, line=False):
        """The pending steps' metrics (one host sync), and with `line` the progress line of the
        last of them; returns its (loss, lr), or None."""
        if not self.pending:
            return None
        losses = torch.stack([p[3] for p in self.pending]).float()
        if multi_rank():
            losses = all_reduce(losses) / self.ranks.world
        losses = losses.cpu().tolist()
        for (step, samples, lr, _), loss in zip(self.pending, losses):
            self.log(step, {"Train/lr": lr, "Train/loss": loss})
            self.log(samples, {"Train/Samples/train_loss": loss, "Train/Samples/lr": lr})
        step, samples, last_lr, _ = self.pending[-1]
        self.pending = []
        if line and self.is_master:
            logger.info("bing_bert_progress: step=%d, loss=%s, lr=%.6g, sample_count=%d", step,
                        self._loss_text(losses[-1]), last_lr, samples)
        return losses[-1], last_lr

    def _loss_text(self, loss):
        """The training loss as the progress lines print it: fp32's to 6 decimals; a bf16 or fp16
        loss to the significant digits its type holds (bf16 9.0 and 9.0625 are neighbours: 9.000000
        printed for steps in a row looked stuck), said once with the first."""
        if self.loss_dtype is None:
            return f"{loss:.6f}"
        name, digits = LOW_PRECISION[self.loss_dtype], significant_digits(self.loss_dtype)
        if self.first_time("loss_digits"):
            logger.info("The training loss is computed in %s: the progress lines print the %d significant digits "
                        "it holds (neighbouring %s values near %.3g are %.2g apart, so a value may repeat); "
                        "TensorBoard's Train/loss has it as computed", name, digits, name, loss,
                        value_spacing(loss, self.loss_dtype))
        return f"{loss:#.{digits}g}"

    def validation(self, state, epoch, epoch_end, loss, mlm_acc, nsp_acc):
        """A validation result: by epoch (`Validation/*`, x = epoch number) at an epoch's end, and
        always by global step with the training time it took to get there (`Validation/step/*`
        and `Validation/train_minutes`, x = global step), so accuracy can be plotted against
        steps or minutes whatever the epoch length. The NSP accuracy is left out when None."""
        minutes = self.clock.train_seconds(state) / 60
        if self.is_master:
            logger.info("Validation at step %d%s after %.2f min of training: loss=%.6f, mlm_accuracy=%.4f%s",
                        state.global_step, f" (end of epoch {epoch + 1})" if epoch_end else "", minutes, loss,
                        mlm_acc, "" if nsp_acc is None else f", nsp_accuracy={nsp_acc:.4f}")
        values = {"Loss": loss, "MLM_accuracy": mlm_acc, **({} if nsp_acc is None else {"NSP_accuracy": nsp_acc})}
        if epoch_end:
            self.log(epoch + 1, {f"Validation/{k}": v for k, v in values.items()})
        self.log(state.global_step, {"Validation/train_minutes": minutes,
                                     **{f"Validation/step/{k}": v for k, v in values.items()}})

    def close(self):
        self.flush()
        for sink in self._sinks or ():
            try:
                sink.close()
            except OSError as e:  # a full disk: what flush(to_disk=True) wrote before stays
                logger.warning("%s: the last metrics could not be written (%s)", type(sink).__name__, e)
