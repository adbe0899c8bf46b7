"""The shard files, in the main process: NVIDIA hdf5 (gzip chunks deflated in the worker processes, stored as
h5py's own filter would) and Bing shard folders of .npy files appended chunk by chunk; a set's
sequences dealt round-robin over its shards (ShardSet), in a temporary folder until installed, and
their digests for the split's record (`listing`); the names that tell a shard (and its part) from
anything else in a folder."""
import collections
import os
import re
import shutil

import h5py
import numpy as np

from tools.prep import TRAIN
from turing.formats import HDF5_DTYPES, HDF5_KEYS
from turing.heldout import shard_digest

SHARD_NAME = re.compile(r"^(part\d+_)?shard_\d+$|_(training|test)_shard\d+\.hdf5$")
# A shard's part tag where it stands: first in a Bing shard's name, right before "training"/"test"
# in an NVIDIA one (never inside the prefix, which may hold "_part001_" itself: OUT's name).
SHARD_PART = re.compile(r"^(part\d+_)shard_\d+$|_(part\d+_)(?:training|test)_shard\d+\.hdf5$")
HDF5_CHUNK_BYTES = 1 << 18            # ~256 KB per hdf5 chunk: good gzip ratio, small reads
HDF5_GZIP_LEVEL = 4                   # h5py's (and so NVIDIA's) compression="gzip" level


class NpyAppender:
    """A 1-D .npy file written by appending; the header's length is fixed when closed.

    numpy pads .npy headers so that the shape can grow in place; this relies on that.
    """

    def __init__(self, path, dtype):
        self.path, self.dtype, self.count = path, np.dtype(dtype), 0
        self.file = open(path, "wb")
        self._header(0)
        self.header_size = self.file.tell()

    def _header(self, n):
        np.lib.format.write_array_header_1_0(
            self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                        "shape": (n,)})

    def append(self, array):
        array = np.ascontiguousarray(array, dtype=self.dtype)
        self.file.write(array.tobytes())
        self.count += len(array)

    def close(self):
        if self.file.closed:
            return
        self.file.seek(0)
        self._header(self.count)
        if self.file.tell() != self.header_size:
            raise RuntimeError(f"{self.path}: .npy header changed size")
        self.file.close()


class Hdf5ShardWriter:
    """One NVIDIA shard: resizable gzip datasets, appended chunk by chunk.

    gzip is most of the cost of the NVIDIA format, so it does not run inside h5py in the
    main process: rows are gathered into whole hdf5 chunks, deflated by `compress` (which
    returns a future: prepare_data's worker processes do it) and stored with write_direct_chunk,
    in order, so the file is the same as h5py's own gzip filter would make (the deflate filter is
    zlib's format).
    """

    MAX_QUEUED = 64                # chunks in the compressor's queue (~16 MB)

    def __init__(self, path, max_seq_length, max_predictions, compress):
        self.path, self.compress = path, compress
        self.file = h5py.File(path, "w")
        self.count = 0
        widths = {"input_ids": max_seq_length, "input_mask": max_seq_length, "segment_ids": max_seq_length,
                  "masked_lm_positions": max_predictions, "masked_lm_ids": max_predictions, "next_sentence_labels": None}
        self.datasets = {}
        self.pending = {}          # key -> rows not yet making a whole chunk
        self.flushed = {}          # key -> rows already handed to the compressor
        self.writes = collections.deque()   # (dataset, chunk offset, future of deflated bytes)
        for key in HDF5_KEYS:
            width, dtype = widths[key], HDF5_DTYPES[key]
            shape = (0, width) if width else (0,)
            rows = max(1, HDF5_CHUNK_BYTES // (np.dtype(dtype).itemsize * (width or 1)))
            self.datasets[key] = self.file.create_dataset(
                key, shape=shape, maxshape=(None,) + shape[1:], dtype=dtype,
                chunks=(rows,) + shape[1:], compression="gzip")
            self.pending[key], self.flushed[key] = [], 0

    def append(self, arrays, first, stop):
        """Append rows first..stop-1 of a chunk's arrays."""
        n = stop - first
        if n <= 0:
            return
        self.count += n
        for key, ds in self.datasets.items():
            ds.resize(self.count, axis=0)
            self.pending[key].append(arrays[key][first:stop])
            self._flush(key, final=False)
        # Store what is compressed already; wait only if too much is queued (memory bound).
        while self.writes and (self.writes[0][2].done() or len(self.writes) > self.MAX_QUEUED):
            self._write_oldest()

    def _flush(self, key, final):
        """Hand the whole chunks of pending rows (and at the end the last part) to compress."""
        ds = self.datasets[key]
        rows = ds.chunks[0]
        pending = np.concatenate(self.pending[key]) if len(self.pending[key]) > 1 else self.pending[key][0]
        whole = len(pending) // rows * rows
        for start in range(0, whole, rows):
            self._submit(ds, self.flushed[key] + start, pending[start:start + rows])
        rest = pending[whole:]
        if final and len(rest):
            # The last chunk is stored whole; rows past the dataset's end are never read.
            padded = np.zeros((rows,) + rest.shape[1:], dtype=rest.dtype)
            padded[:len(rest)] = rest
            self._submit(ds, self.flushed[key] + whole, padded)
            rest = rest[:0]
        self.flushed[key] += whole
        self.pending[key] = [rest]

    def _submit(self, ds, row, block):
        offset = (row,) + (0,) * (block.ndim - 1)
        self.writes.append((ds, offset, self.compress(np.ascontiguousarray(block))))

    def _write_oldest(self):
        ds, offset, future = self.writes.popleft()
        ds.id.write_direct_chunk(offset, future.result())

    def finish(self):
        """Compress and store everything still pending (then close)."""
        for key in self.datasets:
            self._flush(key, final=True)
        while self.writes:
            self._write_oldest()
        self.close()

    def close(self):
        if self.file:
            self.file.close()
            self.file = None


class BingShardWriter:
    """One Bing shard folder, its .npy files appended chunk by chunk."""

    def __init__(self, folder, layout):
        os.makedirs(folder)
        self.folder, self.layout, self.count = folder, layout, 0
        self.bytes_written = self.tokens_written = 0
        j = lambda name: os.path.join(folder, name)  # noqa: E731
        self.data = NpyAppender(j("data.npy"), np.uint8)
        self.offsets = NpyAppender(j("instance_offsets.npy"), np.int64)
        self.split = NpyAppender(j("tokens_split.npy"), np.int32)
        self.is_next = NpyAppender(j("is_next.npy"), np.int8)
        self.files = [self.data, self.offsets, self.split, self.is_next]
        if layout == "offsets":
            self.token_offsets = NpyAppender(j("token_offsets.npy"), np.int32)
            self.instance_token_offsets = NpyAppender(j("instance_token_offsets.npy"), np.int64)
            self.files += [self.token_offsets, self.instance_token_offsets]

    def append(self, arrays, first, stop):
        """Append instances first..stop-1 of a chunk's arrays."""
        if stop <= first:
            return
        ends = np.concatenate([[0], np.cumsum(arrays["instance_lengths"])])
        self.data.append(arrays["data"][ends[first]:ends[stop]])
        self.offsets.append(self.bytes_written + ends[first:stop] - ends[first])
        self.bytes_written += int(ends[stop] - ends[first])
        self.split.append(arrays["tokens_split"][first:stop])
        self.is_next.append(arrays["is_next"][first:stop])
        if self.layout == "offsets":
            # An instance has an offset for each of its tokens but the first.
            t_ends = np.concatenate([[0], np.cumsum(arrays["tokens_per_instance"] - 1)])
            self.token_offsets.append(arrays["token_offsets"][t_ends[first]:t_ends[stop]])
            self.instance_token_offsets.append(self.tokens_written + t_ends[first:stop] - t_ends[first])
            self.tokens_written += int(t_ends[stop] - t_ends[first])
        self.count += stop - first

    def close(self):
        if self.offsets.file.closed:
            return
        # The N+1-th offsets close both offset arrays.
        self.offsets.append(np.array([self.bytes_written]))
        if self.layout == "offsets":
            self.instance_token_offsets.append(np.array([self.tokens_written]))
        for f in self.files:
            f.close()

    finish = close


class ShardSet:
    """The shards of one set, written in a temporary folder; sequences dealt round-robin.

    A shard's files are created when its first sequence arrives, so asking for more shards
    than there are sequences fails at the end without first creating thousands of files.
    """

    def __init__(self, name, tmp_folder, final_folder, num_shards, settings, prefix, compress=None, part_tag=""):
        self.name, self.tmp_folder, self.final_folder = name, tmp_folder, final_folder
        self.settings, self.prefix, self.compress = settings, prefix, compress
        self.part_tag = part_tag       # "part003_" for --part 3 of --num_parts N, else ""
        os.makedirs(tmp_folder)
        self.count = 0
        self.writers = [None] * num_shards

    def _final_name(self, i):
        if self.settings.fmt == "nvidia":
            return f"{self.prefix}_{self.part_tag}{'training' if self.name == TRAIN else 'test'}_shard{i}.hdf5"
        return f"{self.part_tag}shard_{i:03d}"

    def _writer(self, i):
        if self.writers[i] is None:
            tmp = os.path.join(self.tmp_folder, self._final_name(i))
            s = self.settings
            self.writers[i] = (Hdf5ShardWriter(tmp, s.max_seq_length, s.max_predictions_per_seq, self.compress)
                               if s.fmt == "nvidia" else BingShardWriter(tmp, s.bing_layout))
        return self.writers[i]

    def add(self, arrays, group_sizes):
        """Sequence j of this set (counting from the first chunk) goes to shard j % S.

        The worker ordered a chunk's sequences by their index modulo S (group r holds the
        chunk's sequences r, r + S, ...), so each shard gets one contiguous block.
        """
        shards = len(self.writers)
        first = 0
        for r, size in enumerate(group_sizes):
            if size:
                self._writer((self.count + r) % shards).append(arrays, first, first + size)
            first += size
        self.count += first

    @property
    def sizes(self):
        return [w.count if w else 0 for w in self.writers]

    def finish(self):
        """Write out everything (the NVIDIA writers' last compressed chunks) and close."""
        for w in self.writers:
            w.finish()

    def close(self):
        for w in self.writers:
            if w:
                w.close()

    def listing(self):
        """{final name: turing.heldout.shard_digest} of the finished shards (the split's record lists
        them; reading a few blocks of each, never the shard's bytes changed)."""
        return {self._final_name(i): shard_digest(os.path.join(self.tmp_folder, self._final_name(i)))
                for i in range(len(self.writers))}

    def install(self):
        """Move the finished shards to their final names, replacing older shards there."""
        os.makedirs(self.final_folder, exist_ok=True)
        remove_shards(self.final_folder, self.part_tag or None)
        for i in range(len(self.writers)):
            name = self._final_name(i)
            os.replace(os.path.join(self.tmp_folder, name), os.path.join(self.final_folder, name))


def existing_shards(folder, part_tag=None):
    """The shard names in `folder` (those of one part with `part_tag`, e.g. "part003_")."""
    if not os.path.isdir(folder):
        return []
    return sorted(name for name in os.listdir(folder) if SHARD_NAME.search(name)
                  and (part_tag is None or shard_part_tag(name) == part_tag))


def shard_part_tag(name):
    """The part tag of a shard name ("part003_"), "" for a shard of a run without parts."""
    match = SHARD_PART.search(name)
    return match.group(1) or match.group(2) if match else ""


def remove_shards(folder, part_tag=None):
    """Delete the shard files/folders (by their names) a previous run left in `folder`."""
    for name in existing_shards(folder, part_tag):
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)  # a file, or a link (to a shard elsewhere, which stays)
