"""Friction a user met once and should not meet again (issue 44, item 7): a tool killed while it
writes an output file leaves no `*.tmp<PID>` beside it once the same command has run again, and a
bad DeepSpeed config ends the trainer with its one error line and exit code 2, every time."""
import json
import os
import subprocess
import sys

from tests.launch import TINY_DS, tiny_argv, wait_for_line
from tests.test_eval_mlm import some_pairs, tiny, write_pairs  # noqa: F401  (tiny: the fixture)
from tests.test_finetune_glue import FAST, write_glue_dir
from tests.test_make_minimal_pairs import corpus  # noqa: F401  (the fixture)
from testkit.launcher import REPO, launch_env
from tools import eval_mlm, finetune_glue, make_demo_corpus
from tools import make_minimal_pairs as mmp

HELD_WRITE = os.path.join(REPO, "tests", "held_write.py")


def killed_while_writing(held, module, argv, tmp_path):
    """Run `python -m MODULE ARGV` held at the rename of `held`'s temporary file, SIGKILL it there;
    returns the temporary file it left."""
    log = tmp_path / f"{module}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, HELD_WRITE, str(held), module, *argv], cwd=REPO, stdout=out,
                                stderr=subprocess.STDOUT)
        try:
            wait_for_line(proc, log, "PAUSED", timeout=120)
            left = f"{held}.tmp{proc.pid}"
            assert os.path.isfile(left)          # the temporary file, written whole, not renamed
        finally:
            proc.kill()
            proc.wait()
    return left


def temporaries(folder):
    return sorted(os.path.relpath(os.path.join(root, name), folder) for root, _, names in os.walk(folder)
                  for name in names if ".tmp" in name)


def test_eval_mlm_killed_while_writing_its_results_leaves_nothing_once_run_again(tiny, tmp_path):  # noqa: F811
    out = tmp_path / "out"
    argv = ["--model", tiny["job"], "--pairs", write_pairs(tmp_path / "pairs.jsonl", some_pairs(4)),
            "--output_dir", str(out)]
    left = killed_while_writing(out / "results.json", "tools.eval_mlm", argv, tmp_path)
    assert temporaries(out) == [os.path.basename(left)] and not (out / "results.json").exists()
    assert eval_mlm.main(argv) == 0                  # the same command again
    assert temporaries(out) == []
    results = json.loads((out / "results.json").read_text())
    assert results["minimal_pairs"]["pairs"] == 4 and len((out / "pair_scores.jsonl").read_text().splitlines()) == 4


def test_finetune_glue_killed_while_writing_its_summary_leaves_nothing_once_run_again(tiny, tmp_path):  # noqa: F811
    words = [w for w in open(tiny["vocab"]).read().split() if w.isalpha() and w.islower()][:24]
    data = write_glue_dir(str(tmp_path / "glue"), words, n_train=16, n_dev=8)
    out = tmp_path / "all"
    argv = ["--model", tiny["job"], "--task", "all", "--data_dir", data, "--output_dir", str(out), *FAST]
    killed_while_writing(out / "results.json", "tools.finetune_glue", argv, tmp_path)   # after the first task
    assert len(temporaries(out)) == 1 and not (out / "results.json").exists()
    assert finetune_glue.main(argv) == 0
    assert temporaries(out) == []
    summary = json.loads((out / "results.json").read_text())
    assert set(summary) == {"sst2", "rte", "cola", "average"}


def test_make_minimal_pairs_and_the_demo_corpus_killed_while_writing_leave_nothing_once_run_again(
        corpus, tmp_path):  # noqa: F811
    output = tmp_path / "pairs" / "pairs.jsonl"
    argv = ["--heldout", str(corpus.out), "--output", str(output), "--pairs_per_kind", "30"]
    killed_while_writing(output, "tools.make_minimal_pairs", argv, tmp_path)
    assert len(temporaries(output.parent)) == 1 and not output.exists()
    assert mmp.main(argv) == 0
    assert temporaries(output.parent) == [] and all(json.loads(line) for line in open(output))
    demo = tmp_path / "demo" / "corpus.txt"
    argv = ["--output", str(demo), "--max_bytes", "20000"]
    killed_while_writing(demo, "tools.make_demo_corpus", argv, tmp_path)
    assert make_demo_corpus.main(argv) == 0
    assert temporaries(demo.parent) == [] and 0 < demo.stat().st_size <= 20000


# What runs last in a process: every thread's name (/proc/self/task), written where THREADS_AT_EXIT
# says, as the interpreter begins its teardown; then the trainer, as `python deepspeed_train.py` runs it.
THREADS_AT_EXIT = """
import atexit, os, runpy, sys
def names():
    with open(os.environ["THREADS_AT_EXIT"], "w") as f:
        tasks = os.listdir("/proc/self/task")
        f.write(" ".join(sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks)))
atexit.register(names)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_bad_deepspeed_config_ends_with_its_error_line_and_exit_code_2_every_time(data_root, tmp_path):
    """About 1 run in 20 printed "terminate called without an active exception" after the error
    line and ended with exit code 134: DeepSpeed's broadcast of the weights, the last thing before
    the refusal, left gloo worker threads releasing its tensors, and one still doing so when the
    interpreter tore itself down took the GIL and aborted the process. The cause, shown every
    time: no process group's thread (pt_gloo_runloop, gloo_tcp_loop) may be alive at the teardown."""
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({**json.load(open(TINY_DS)),
                              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "bogus_param": 1}}}))
    argv = tiny_argv(data_root, tmp_path / "out", "--log_level", "warning", ds=ds)
    script = os.path.join(REPO, "deepspeed_train.py")
    threads = tmp_path / "threads.txt"
    for run in range(3):
        command = [sys.executable, *(["-c", THREADS_AT_EXIT] if run == 0 else []), script, *argv]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**launch_env(), "THREADS_AT_EXIT": str(threads)})   # one rank of its own
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and lines[-1].startswith(f"error: {ds}: DeepSpeed could not build the engine"), \
            done.stderr[-2000:]
        if run == 0:
            alive = threads.read_text().split()
            assert not [name for name in alive if "gloo" in name], alive
