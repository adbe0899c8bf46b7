"""Quick training-step throughput of turing.modeling against the original's model (CPU, fp32).

Owns nothing used in training. Builds both models with the same weights (ours and
tests/reference_model.py), one fixed padded batch with ~15% masked positions (at most
--max_pred per row), and times fwd + bwd + AdamW steps, alternating the two models step by
step so both see the same machine load. The fastest step of each is the one least disturbed
by other processes; the process CPU time (user + sys) per step is printed too, since wall
time on a shared machine mostly measures the neighbours.

    python bench/bench_model_quick.py --steps 16
"""
import argparse
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests import reference_model  # noqa: E402
from turing.modeling import BertConfig, BertForPreTrainingPreLN  # noqa: E402


def make_batch(batch_size, seq_len, max_pred, vocab_size, seed=1):
    """Rows of random length in [seq_len/2, seq_len], padded; labels on ~15% of real tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seq_len // 2, seq_len + 1, (batch_size,), generator=g)
    input_mask = (torch.arange(seq_len)[None] < lengths[:, None]).long()
    input_ids = torch.randint(1000, vocab_size, (batch_size, seq_len), generator=g) * input_mask
    segment_ids = (torch.arange(seq_len)[None] >= (lengths // 2)[:, None]).long() * input_mask
    labels = torch.full((batch_size, seq_len), -1)
    for row, length in enumerate(lengths.tolist()):
        n = min(max_pred, max(1, round(length * 0.15)))
        positions = torch.randperm(length - 2, generator=g)[:n] + 1
        labels[row, positions] = input_ids[row, positions]
    nsp = torch.randint(0, 2, (batch_size,), generator=g)
    return (torch.full((batch_size,), 2), input_ids, input_mask, segment_ids, nsp, labels)


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--layers", type=int, default=4)
    add("--hidden", type=int, default=256)
    add("--heads", type=int, default=4)
    add("--intermediate", type=int, default=1024)
    add("--vocab", type=int, default=30528)
    add("--seq", type=int, default=128)
    add("--batch", type=int, default=32)
    add("--max_pred", type=int, default=20)
    add("--dropout", type=float, default=0.1)
    add("--steps", type=int, default=12, help="timed steps per model")
    add("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    config = BertConfig(args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                        num_attention_heads=args.heads, intermediate_size=args.intermediate,
                        hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout,
                        max_position_embeddings=max(512, args.seq))
    batch = make_batch(args.batch, args.seq, args.max_pred, args.vocab)
    torch.manual_seed(0)
    ours = BertForPreTrainingPreLN(config, argparse.Namespace())
    ref = reference_model.BertForPreTrainingPreLN(config)
    ref.load_state_dict(ours.state_dict(), strict=True)
    models = {}
    for name, model in (("ours", ours), ("reference", ref)):
        model.train()
        models[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01))

    def step(name):
        model, optimizer = models[name]
        model(batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for name in models:  # warm-up: allocator, optimizer state
        step(name)
    wall = {name: [] for name in models}
    cpu = {name: 0.0 for name in models}
    for i in range(args.steps):
        for name in (("ours", "reference") if i % 2 == 0 else ("reference", "ours")):
            t0, c0 = time.perf_counter(), cpu_seconds()
            step(name)
            wall[name].append(time.perf_counter() - t0)
            cpu[name] += cpu_seconds() - c0

    print(f"L={args.layers} H={args.hidden} A={args.heads} I={args.intermediate} V={args.vocab} "
          f"seq={args.seq} batch={args.batch} masked rows={int((batch[5] != -1).sum())} "
          f"threads={torch.get_num_threads()} steps={args.steps}")
    for name in models:
        times = sorted(wall[name])
        print(f"{name:>9}: best {args.batch / times[0]:6.1f} samples/s, lower quartile "
              f"{args.batch / times[len(times) // 4]:6.1f} samples/s, CPU {cpu[name] / args.steps:.3f} s/step")
    best = min(wall["reference"]) / min(wall["ours"])
    quartile = sorted(wall["reference"])[args.steps // 4] / sorted(wall["ours"])[args.steps // 4]
    print(f"speed-up ours/reference: best {best:.2f}x, lower quartile {quartile:.2f}x, "
          f"CPU time {cpu['reference'] / cpu['ours']:.2f}x")


if __name__ == "__main__":
    main()
