"""Suite-wide settings: the tests train 2-layer, 64-wide models, for which one intra-op
thread is as fast as two and avoids oversubscribing a 2-core machine when launcher ranks
or DataLoader work run beside the test process."""
import torch

torch.set_num_threads(1)
