"""Reading back what W&B wrote in offline mode (WANDB_MODE=offline), for tests: the run's
transaction log OUT/wandb/offline-run-*/run-ID.wandb, a LevelDB-style log of protobuf Records
(wandb.proto.wandb_internal_pb2), which wandb itself no longer reads from Python (its core is a
Go binary). Blocks of 32 KB; each record: crc32c (4 bytes), length (2), type (1: full, 2-4:
first/middle/last fragment), then the bytes; the file starts with ':W&B', a magic and a version."""
import glob
import json
import os
import struct

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path):
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log (starts {data[:4]!r})")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:       # a block's trailer, too short for a record header
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history(folder):
    """[{key: value}] of every wandb.log of the offline runs under `folder` (OUT), in order."""
    rows = []
    for path in sorted(glob.glob(os.path.join(folder, "wandb", "offline-run-*", "run-*.wandb"))):
        for record in records(path):
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


def series(folder, tag):
    """[(x, value)] of one metric as the W&B sink logs it (its x under `_x/TAG`)."""
    return [(row[f"_x/{tag}"], row[tag]) for row in history(folder) if tag in row]
