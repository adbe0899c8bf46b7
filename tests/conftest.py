"""Suite-wide settings: the tests train 2-layer, 64-wide models, for which one intra-op
thread is as fast as two and avoids oversubscribing a 2-core machine when launcher ranks
or DataLoader work run beside the test process."""
import logging
import os

import pytest
import torch

from testkit.synthetic import make_data_root

torch.set_num_threads(1)

# Every process the tests start runs testkit/site/sitecustomize.py: DeepSpeed's autotuner does not
# see mlflow (installed for the mlflow sink's tests, not by a user's install), which would cost
# 1.6 s in every process that imports DeepSpeed.
SITE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "testkit", "site")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (SITE, os.environ.get("PYTHONPATH"))))

# The test files that take longest (launcher runs, several ranks, kills and resumes), longest
# first. scripts/test.sh hands whole files to two workers in the order collected
# (--no-loadscope-reorder), so these start first and the many short files fill in beside them;
# xdist's own order (most tests first) left the few long ones running alone at the end. Only the
# order changes, never what runs.
LONG_FIRST = ("test_zero", "test_partial_accumulation", "test_benches", "test_train_e2e", "test_multinode",
              "test_lost_work", "test_run_features", "test_world_size_resume", "test_distributed_errors",
              "test_finetune_glue", "test_stock_models", "test_untrusted_files", "test_bing_provider")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1], len(LONG_FIRST)))


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """Tiny shards in both formats (read-only): 2 shards x 64 samples at seq 128, so micro batch
    16 gives 4 optimizer steps per epoch with the NVIDIA provider; 16 validation samples."""
    root = tmp_path_factory.mktemp("tiny_data")
    make_data_root(str(root), seq_lengths=(128,), n_train=128, shards=2, n_valid=16)
    return root


@pytest.fixture(autouse=True)
def root_logging_restored():
    """The programs a test runs in this process set up logging for themselves (basicConfig on the
    root logger, writing to the sys.stderr of that moment: the test's captured stream). Put the
    root logger back after each test, so that no later test logs into a stream that is closed."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
