"""--deepspeed_transformer_kernel is probed in a child process before any rank builds the model:
DeepSpeed's fused layer segfaulted at creation on torch 2.11 / CUDA 13, which no rank can catch.
On a CPU machine the flag is refused before the probe (it needs CUDA); the probe's verdicts are
checked here with stand-in children that crash, hang or fail as the layer did."""
import sys

import pytest

from turing.errors import InputValueError
from turing.kernel_probe import check_transformer_kernel

CHILD = [sys.executable, "-c"]


def test_a_child_that_passes_lets_the_run_go_on():
    check_transformer_kernel({}, command=CHILD + ["print('ok')"])


@pytest.mark.parametrize("code, expected", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "killed by SIGSEGV"),
    ("raise SystemExit('CUDA error: no kernel image is available')", "exit code 1: CUDA error: no kernel image"),
    ("import time; time.sleep(30)", "did not finish within 1 s"),
])
def test_a_crash_is_one_line_naming_the_versions_and_the_way_round(code, expected):
    with pytest.raises(InputValueError) as refused:
        check_transformer_kernel({}, command=CHILD + [code], timeout=1)
    message = str(refused.value)
    assert expected in message and "\n" not in message
    assert "torch " in message and "DeepSpeed " in message and "TRANSFORMER_KERNEL=0" in message
