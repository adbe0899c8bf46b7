"""Read TensorBoard event files written by tensorboardX back into Python (no TensorFlow needed).

Used by tests and by tools that plot runs. An event file is a sequence of TFRecords:
[length u64][masked crc32c of length u32][Event protobuf][masked crc32c of data u32].
"""
import glob
import os
import struct
from collections import defaultdict

from google.protobuf.message import DecodeError
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import masked_crc32c

from turing.errors import InputValueError


def iter_events(path):
    """The events of one file. A record whose length checksum is wrong, or whose data is not
    an Event, raises InputValueError naming the file: it is not (or no longer) an event file."""
    with open(path, "rb") as f:
        while True:
            offset = f.tell()
            header = f.read(12)
            if len(header) < 12:
                return
            length_bytes, (length_crc,) = header[:8], struct.unpack("<I", header[8:])
            if masked_crc32c(length_bytes) != length_crc:
                raise InputValueError(f"{path}: not a TensorBoard event file (bad record header at byte {offset})")
            (length,) = struct.unpack("<Q", length_bytes)
            data = f.read(length)
            f.read(4)
            if len(data) < length:
                return  # a file still being written ends mid-record
            event = Event()
            try:
                event.ParseFromString(data)
            except DecodeError:
                raise InputValueError(f"{path}: not a TensorBoard event file (the record at byte {offset} "
                                 f"is no event)") from None
            yield event


def read_run(run_dir):
    """{tag: [(step, value)]} for scalars, and {tag: [step]} for histograms and texts, of every
    event file in run_dir (sorted by file name, so a resumed run's later files come after)."""
    scalars, others = defaultdict(list), defaultdict(list)
    for path in sorted(glob.glob(os.path.join(run_dir, "**", "events.out.tfevents.*"), recursive=True)):
        for event in iter_events(path):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars[value.tag].append((event.step, value.simple_value))
                else:
                    others[value.tag].append(event.step)
    return dict(scalars), dict(others)
