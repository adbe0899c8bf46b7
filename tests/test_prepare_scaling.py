"""tools/prepare_data.py spread over processes: the main process only coordinates (the reader
process reads and deals the documents, the workers make the arrays and deflate the hdf5 chunks),
a multistream .bz2 is decompressed on threads, and the shards stay those of one worker; and over
machines: tools/prepare_parts.py runs the parts as datatrove tasks with completion markers, by its
local executor or by its Ray executor on a local Ray cluster."""
import bz2
import functools
import importlib.util
import os
import random
import re
import subprocess
import sys
import threading

import pytest

from tests.test_prepare_data import make_corpus, make_vocab
from testkit import corpora as files
from testkit.launcher import free_port
from tools import prepare_data, prepare_parts
from tools.prep import PrepareDataError, layouts, workers
from tools.prep.layouts import open_stream


def streams(count=60, seed=0):
    """(the text, a .bz2 of it in `count` streams, one of it in one stream)."""
    rng = random.Random(seed)
    words = [bytes(rng.choices(b"abcdefghijklmnop", k=rng.randint(2, 9))) for _ in range(500)]
    pieces = [b" ".join(rng.choices(words, k=rng.randint(200, 3000))) + b"\n" for _ in range(count)]
    return b"".join(pieces), b"".join(bz2.compress(p) for p in pieces), bz2.compress(b"".join(pieces))


def read_all(path):
    with open_stream(path) as (stream, raw):
        return stream.read(), raw.tell()


def test_a_multistream_bz2_is_decompressed_on_several_threads_to_the_same_bytes(tmp_path, monkeypatch):
    text, multi, single = streams()
    seen = set()
    real = layouts._try_bz2_streams

    def recorded(data):
        seen.add(threading.current_thread().name)
        return real(data)

    monkeypatch.setattr(layouts, "_try_bz2_streams", recorded)
    monkeypatch.setattr(layouts, "BZ2_THREADS", 3)
    for name, blob in (("multi.bz2", multi), ("single.bz2", single)):
        (tmp_path / name).write_bytes(blob)
        assert read_all(tmp_path / name) == (text, len(blob)), name
    assert len(seen) > 1 and all(name.startswith("bz2") for name in seen), seen


def test_a_false_stream_start_and_a_stream_too_long_read_the_same(tmp_path, monkeypatch):
    """A match of the stream start inside a stream cuts it in pieces that are no whole streams: they
    are joined again; a stream longer than BZ2_STREAM_LIMIT is read on by BZ2File from its start."""
    text, multi, single = streams(count=20, seed=1)
    (tmp_path / "multi.bz2").write_bytes(multi)
    (tmp_path / "single.bz2").write_bytes(single)
    monkeypatch.setattr(layouts, "BZ2_STREAM_START", re.compile(rb"BZh[1-9]1AY&SY|[A-F]{2}"))
    assert len(layouts.BZ2_STREAM_START.findall(multi)) > 3 * 20      # more false cuts than streams
    assert read_all(tmp_path / "multi.bz2") == (text, len(multi))
    monkeypatch.setattr(layouts, "BZ2_STREAM_START", re.compile(rb"BZh[1-9]1AY&SY"))
    monkeypatch.setattr(layouts, "BZ2_STREAM_LIMIT", 4096)
    assert read_all(tmp_path / "single.bz2") == (text, len(single))
    assert read_all(tmp_path / "multi.bz2") == (text, len(multi))
    (tmp_path / "cut.bz2").write_bytes(multi[:-50])
    with pytest.raises(EOFError):
        read_all(tmp_path / "cut.bz2")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaling")
    return make_corpus(root / "corpus.txt", documents=150, seed=3), make_vocab(root / "vocab.txt")


def argv(corpus, out, workers, fmt="nvidia"):
    data, vocab = corpus
    return ["--input", str(data), "--output_dir", str(out), "--vocab_file", str(vocab), "--format", fmt,
            "--max_seq_length", "32", "--max_predictions_per_seq", "5", "--dupe_factor", "2", "--num_shards", "3",
            "--validation_fraction", "0.1", "--chunk_size_mb", "0.002", "--workers", str(workers), "--prefix", "p"]


def tree(out):
    return {os.path.relpath(os.path.join(root, name), out): open(os.path.join(root, name), "rb").read()
            for root, _, names in os.walk(out) for name in names if name != "stats.json"}


def test_the_main_process_reads_nothing_and_deflates_nothing(corpus, tmp_path, monkeypatch):
    """Reading (documents, filters, chunks) runs in the reader process, deflating the hdf5 chunks in
    the workers: the main process only hands out chunks and writes, in order. The processes record
    their pid in a file each time they do either."""
    log = tmp_path / "pids"
    real_compress, real_chunks = workers.zlib.compress, prepare_data.iter_chunks

    def note(what):
        with open(log, "a") as f:
            f.write(f"{what} {os.getpid()}\n")

    def compress(*args, **kwargs):
        note("deflate")
        return real_compress(*args, **kwargs)

    def chunks(*args, **kwargs):
        note("read")
        yield from real_chunks(*args, **kwargs)

    monkeypatch.setattr(workers.zlib, "compress", compress)
    monkeypatch.setattr(prepare_data, "iter_chunks", chunks)
    assert prepare_data.main(argv(corpus, tmp_path / "o", 2)) == 0
    done = [line.split() for line in log.read_text().splitlines()]
    deflating = {int(pid) for what, pid in done if what == "deflate"}
    reading = {int(pid) for what, pid in done if what == "read"}
    assert deflating and reading and os.getpid() not in deflating | reading, done
    assert not deflating & reading


@pytest.mark.parametrize("fmt", ["nvidia", "bing"])
def test_the_shards_do_not_depend_on_the_number_of_workers(corpus, tmp_path, fmt):
    """1, 2 and 3 workers (chunks and deflate tasks dealt to whichever worker is free) write the same
    bytes: shards of both sets, the split's record."""
    outs = []
    for n in (1, 2, 3):
        outs.append(tmp_path / f"w{n}")
        assert prepare_data.main(argv(corpus, outs[-1], n, fmt)) == 0
    first = tree(outs[0])
    assert any(name.startswith("validation") for name in first) and len(first) > 5
    for out in outs[1:]:
        assert tree(out) == first


def test_a_multistream_dump_makes_the_shards_bz2file_made(tmp_path, monkeypatch):
    """prepare_data on a multistream MediaWiki dump read on threads, and with every stream read by
    BZ2File (one stream too long for the threads, from the start): the same shards."""
    vocab = make_vocab(tmp_path / "vocab.txt")
    dump = files.write_mediawiki(str(tmp_path / "x-pages-articles-multistream.xml.bz2"),
                                 list(files.synthetic_documents(120, seed=5)), multistream=True, pages_per_stream=10)
    outs = {}
    for name, limit in (("threads", layouts.BZ2_STREAM_LIMIT), ("bz2file", 16)):
        monkeypatch.setattr(layouts, "BZ2_STREAM_LIMIT", limit)
        outs[name] = tmp_path / name
        assert prepare_data.main(["--input", dump, "--output_dir", str(outs[name]), "--vocab_file", str(vocab),
                                  "--max_seq_length", "32", "--max_predictions_per_seq", "5", "--dupe_factor", "1",
                                  "--workers", "2", "--prefix", "p"]) == 0
    assert tree(outs["threads"]) == tree(outs["bz2file"])


# ----------------------------------------------------------------------------- parts by datatrove's executor

def parts_argv(corpus, out, *extra):
    data, vocab = corpus
    return ["--num_parts", "2", "--input", str(data), "--output_dir", str(out), "--vocab_file", str(vocab),
            "--max_seq_length", "32", "--max_predictions_per_seq", "5", "--dupe_factor", "1",
            "--validation_fraction", "0.1", "--workers", "1", "--prefix", "p", *extra]


def dataset(out):
    """What training and every later stage read of a parts folder: all but the logs and timings."""
    return {name: data for name, data in tree(out).items()
            if not name.startswith(prepare_parts.MARKERS) and not name.startswith("stats.")}


@pytest.fixture(scope="module")
def parts_reference(corpus, tmp_path_factory):
    """The two parts made one after the other by prepare_data itself."""
    out = tmp_path_factory.mktemp("reference")
    argv = parts_argv(corpus, out)[2:]
    for part in (0, 1):
        assert prepare_data.main(argv + ["--num_parts", "2", "--part", str(part)]) == 0
    return dataset(out)


needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="runs the parts on a local Ray cluster (pip install ray)")


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of this process, small (2 CPUs, 8 GB to reserve, a 128 MB object store, no
    dashboard), its workers at the usual priority as prepare_parts starts one (at Ray's niceness 15 a
    busy machine starved a part of a second for 30 s): prepare_parts uses the driver it finds
    connected. Shut down after the module's tests."""
    import ray

    ray.init(address="local", num_cpus=2, _memory=8 * 2 ** 30, object_store_memory=128 * 2 ** 20,
             include_dashboard=False, log_to_driver=False, _system_config={"worker_niceness": 0},
             runtime_env={"env_vars": {"PYTHONPATH": prepare_parts.ROOT}})   # the workers import tests/ too
    yield ray
    ray.shutdown()


class LostOnce(prepare_parts.PreparePart):
    """prepare_parts' step whose part 1 is lost the first time (its prepare_data raises); each start
    of a part is a line of the file `ran`, since a part may run in another process (Ray's)."""

    def __init__(self, argv, errors=None, ran=None):
        super().__init__(argv, errors)
        self.ran = ran

    def __call__(self, data, rank, world_size):
        with open(self.ran, "a", encoding="utf-8") as f:
            f.write(f"{rank}\n")
        if rank != 1 or starts(self.ran).count(1) > 1:
            return super().__call__(data, rank, world_size)
        real = prepare_data.prepare

        def lost(args, signals=None):
            raise PrepareDataError("lost machine")

        prepare_data.prepare = lost            # in the part's process only, and only for this run
        try:
            return super().__call__(data, rank, world_size)
        finally:
            prepare_data.prepare = real


def starts(ran):
    """The parts started so far, in order of their part numbers (parts side by side start in any order)."""
    return sorted(int(line) for line in ran.read_text(encoding="utf-8").split()) if ran.exists() else []


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=needs_ray)])
def test_a_relaunch_runs_only_the_parts_without_a_completion_marker(executor, corpus, parts_reference, tmp_path,
                                                                    monkeypatch, capsys, request):
    """local: the parts in-process, one after the other; ray: side by side on the local Ray cluster."""
    flags = ("--executor", "ray", "--parallel_parts", "2") if executor == "ray" else ()
    if executor == "ray":
        request.getfixturevalue("ray_cluster")
    out, ran = tmp_path / "o", tmp_path / "ran"
    monkeypatch.setattr(prepare_parts, "PreparePart", functools.partial(LostOnce, ran=ran))
    assert prepare_parts.main(parts_argv(corpus, out, *flags)) == 1
    assert "error: parts 1 of 2 did not finish: part 1: PrepareDataError: lost machine; " in capsys.readouterr().err
    assert os.listdir(out / prepare_parts.MARKERS / "completions") == ["00000"]
    assert prepare_parts.main(parts_argv(corpus, out, *flags)) == 0
    assert starts(ran) == [0, 1, 1]            # part 0 not again
    assert dataset(out) == parts_reference
    assert prepare_parts.main(parts_argv(corpus, out, *flags)) == 0 and starts(ran) == [0, 1, 1]   # all done
    if executor == "ray":                      # the local executor skips the parts Ray's finished
        assert prepare_parts.main(parts_argv(corpus, out)) == 0 and starts(ran) == [0, 1, 1]
    capsys.readouterr()
    assert prepare_parts.main(parts_argv(corpus, out, *flags, "--seed", "7")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "another prepare_parts command" in err and "--overwrite_markers" in err
    assert starts(ran) == [0, 1, 1]


def test_parts_run_side_by_side_in_the_executors_processes(corpus, parts_reference, tmp_path):
    out = tmp_path / "o"
    assert prepare_parts.main(parts_argv(corpus, out, "--parallel_parts", "2")) == 0
    assert sorted(os.listdir(out / prepare_parts.MARKERS / "completions")) == ["00000", "00001"]
    assert dataset(out) == parts_reference


@needs_ray
def test_parts_run_on_the_ray_cluster_at_an_address_from_outside_the_repository(corpus, parts_reference, ray_cluster,
                                                                                 tmp_path):
    """The command of a machine of a Ray cluster (--ray_address HEAD:PORT), a second driver of the
    cluster, run from another directory: the workers import the repository from the PYTHONPATH the
    tool gives them; it disconnects and ends."""
    out = tmp_path / "o"
    argv = parts_argv(corpus, out, "--executor", "ray", "--parallel_parts", "2",
                      "--ray_address", ray_cluster.get_runtime_context().gcs_address)
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "RAY_ADDRESS")}
    env["RAY_AUTH_MODE"] = "token"     # Ray sends the cluster's token (~/.ray/auth_token) to an address given so only
    run = subprocess.run([sys.executable, os.path.join(prepare_parts.ROOT, "tools", "prepare_parts.py"), *argv],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(os.listdir(out / prepare_parts.MARKERS / "completions")) == ["00000", "00001"]
    assert dataset(out) == parts_reference


@needs_ray
def test_a_part_that_fits_on_no_node_of_the_ray_cluster_is_refused(corpus, ray_cluster, tmp_path, capsys):
    """Ray would wait for a node of 3 CPUs for ever: refused with one line before any part runs."""
    out = tmp_path / "o"
    assert prepare_parts.main(parts_argv(corpus, out, "--executor", "ray", "--workers", "3")) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]  # beside Ray's logs
    assert errors == ["error: --workers 3 --ray_mem_per_cpu_gb 2: a part needs 3 CPUs and 6.0 GB on one node; the "
                      "Ray cluster's nodes have 2 CPUs and 8.0 GB"]
    assert not os.path.exists(out / prepare_parts.MARKERS / "completions")


@needs_ray
@pytest.mark.parametrize("given", ["flag", "env"])
def test_a_ray_address_where_nothing_answers_is_one_error_line(given, corpus, tmp_path, monkeypatch, capsys):
    """ray.init retried such an address for about 15 minutes; refused at once, no marker written."""
    address = f"127.0.0.1:{free_port()}"          # closed again: nothing listens there
    flag = ["--ray_address", address] if given == "flag" else []
    if given == "env":
        monkeypatch.setenv("RAY_ADDRESS", address)
    assert prepare_parts.main(parts_argv(corpus, tmp_path / "o", "--executor", "ray", *flag)) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]  # beside datatrove's
    assert line.startswith(f"error: {'--ray_address' if given == 'flag' else 'RAY_ADDRESS'} {address}: nothing "
                           "answers there (Connection refused); start the cluster"), line
    assert not os.path.exists(tmp_path / "o" / prepare_parts.MARKERS / "completions")


def test_the_ray_executor_without_ray_is_one_error_line(corpus, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)      # `import ray` raises ImportError, installed or not
    assert prepare_parts.main(parts_argv(corpus, tmp_path / "o", "--executor", "ray")) == 2
    assert capsys.readouterr().err == \
        "error: prepare_parts --executor ray needs the Python package ray: pip install ray\n"


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_a_ray_memory_that_is_no_positive_finite_number_is_one_error_line(value, corpus, tmp_path, capsys):
    assert prepare_parts.main(parts_argv(corpus, tmp_path / "o", "--executor", "ray", "--ray_mem_per_cpu_gb",
                                         value)) == 2
    assert capsys.readouterr().err == \
        f"error: --ray_mem_per_cpu_gb {float(value)}: need a finite number of GB above 0\n"
    assert not os.path.exists(tmp_path / "o" / prepare_parts.MARKERS)


def test_bad_stage_settings_are_one_error_line_before_any_marker_moves(corpus, tmp_path, capsys):
    """prepare_data's stage settings (languages, evaluation sets, thresholds) are checked before the
    parts start: one line, and a finished run's markers stay, --overwrite_markers or not."""
    out = tmp_path / "o"
    assert prepare_parts.main(parts_argv(corpus, out)) == 0
    markers = out / prepare_parts.MARKERS
    before = {p: p.read_bytes() for p in markers.rglob("*") if p.is_file() and "logs" not in p.parts}
    capsys.readouterr()
    for flags, expected in ((["--languages", "xx"], "--languages xx: not a language the model knows"),
                            (["--decontaminate", str(tmp_path / "missing.tsv")], "missing.tsv: no such file or folder"),
                            (["--quality_filter", "--quality_threshold", "min_words=inf"], "min_words must be a whole")):
        assert prepare_parts.main(parts_argv(corpus, out, *flags, "--overwrite_markers")) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
        assert {p: p.read_bytes() for p in markers.rglob("*") if p.is_file() and "logs" not in p.parts} == before


@pytest.mark.parametrize("flags, expected", [
    (["--executor", "slurm"], "argument --executor: invalid choice: 'slurm'"),
    (["--parallel_parts", "two"], "argument --parallel_parts: invalid int value: 'two'"),
])
def test_a_bad_flag_of_prepare_parts_is_one_error_line(corpus, tmp_path, capsys, flags, expected):
    with pytest.raises(SystemExit) as end:
        prepare_parts.main(parts_argv(corpus, tmp_path / "o", *flags))
    assert end.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
