"""tools/prepare_data.py on input a hostile user gives it: text without blank lines, text that
is not UTF-8, binary files, foreign files where training reads, a worker killed mid-run and
a SIGTERM. Each ends in a warning with counts or one error line, and never in shards that
training would read wrongly or a temporary folder left behind (the finished chunks stay, for the
same command to continue from)."""
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import psutil
import pytest

from tests.test_prepare_data import make_corpus, make_vocab
from tools import prepare_data
from tools.prep import vocab as prep_vocab
from tools.prep.documents import DocumentReader
from tools.prep.journal import WORK_DIR, Journal
from tools.prep.layouts import ReadOptions, find_sources
from tools.prep.reader import PROCESS_NAME
from tools.prep.workers import end_with_parent
from turing import heldout
from turing.signals import StopRequested, StopSignals

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return make_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


def error_of(capsys, argv):
    assert prepare_data.main([str(a) for a in argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("WARNING")]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def no_blank_lines(path, documents=40):
    """A corpus with its blank lines removed: one document, as a user's plain text would be."""
    make_corpus(path, documents=documents)
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    path.write_text("\n".join(lines) + "\n")
    return path, len(lines)


def test_text_without_blank_lines_is_cut_into_pieces_and_warned_about(vocab, tmp_path, caplog):
    corpus, lines = no_blank_lines(tmp_path / "one.txt")
    cap = 4096
    reader = DocumentReader([str(corpus)], max_document_bytes=cap)
    pieces = [doc for doc, _ in reader if doc]
    # Memory is bounded by the cap: no piece holds much more than cap bytes of text (a line more).
    longest_line = max(len(line) for doc in pieces for line in doc)
    assert all(sum(map(len, doc)) < cap + longest_line for doc in pieces)
    assert sum(len(doc) for doc in pieces) == lines and len(pieces) > 3
    assert (reader.documents, reader.cut, reader.pieces) == (1, 1, len(pieces))
    # The tool says so, with the counts, and still makes shards from all of the text.
    out = tmp_path / "o"
    assert prepare_data.main(["--input", str(corpus), "--output_dir", str(out), "--vocab_file", str(vocab),
                              "--max_seq_length", "64", "--chunk_size_mb", str(cap / 2**20)]) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"1 document(s) longer than --chunk_size_mb were cut into {len(pieces)} pieces" in w
               and f"{lines} lines" in w for w in warnings), warnings
    assert any("the input is a single document" in w for w in warnings), warnings
    assert os.listdir(out / "train") == ["o_training_shard0.hdf5"]


def test_documents_separated_by_blank_lines_are_not_warned_about(vocab, tmp_path, caplog):
    corpus = make_corpus(tmp_path / "c.txt", documents=20)
    reader = DocumentReader([str(corpus)], max_document_bytes=2**20)
    assert sum(1 for doc, _ in reader if doc) == 20 and reader.cut == 0 and reader.warnings() == []


def test_latin1_text_is_refused_by_file_and_line(vocab, tmp_path, capsys):
    latin1 = tmp_path / "french.txt"
    latin1.write_bytes("Le café est bon.\nUne phrase.\n\nDeuxième document ici.\n".encode("latin-1"))
    for i, source in enumerate((["--vocab_file", vocab], ["--build_vocab", 50])):
        out = tmp_path / f"o{i}"
        line = error_of(capsys, ["--input", latin1, "--output_dir", out, "--max_seq_length", 16,
                                 "--max_predictions_per_seq", 2, *source])
        assert f"{latin1}: line 1 is not UTF-8 (byte 0xe9 at column 7)" in line and "iconv" in line, source
        assert not (out / "train").exists() and not (out / "vocab.txt").exists()


def test_binary_files_are_refused(vocab, tmp_path, capsys):
    blob = tmp_path / "model.bin"
    blob.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    line = error_of(capsys, ["--input", blob, "--output_dir", tmp_path / "o", "--vocab_file", vocab])
    assert f"{blob}: binary data (a NUL byte at offset 4)" in line
    folder = tmp_path / "texts"
    folder.mkdir()
    make_corpus(folder / "a.txt", documents=5)
    (folder / "b.txt").write_bytes(b"text\x00\x00\x00")
    line = error_of(capsys, ["--input", folder, "--output_dir", tmp_path / "o", "--vocab_file", vocab])
    assert "b.txt: binary data" in line and not (tmp_path / "o" / "train").exists()


def test_foreign_files_where_training_reads_are_refused_even_with_overwrite(vocab, tmp_path, capsys):
    corpus = make_corpus(tmp_path / "c.txt", documents=30)
    out = tmp_path / "o"
    argv = ["--input", corpus, "--output_dir", out, "--vocab_file", vocab, "--max_seq_length", 64]
    assert prepare_data.main([str(a) for a in argv]) == 0
    foreign = out / "train" / "old_wiki_training_part.hdf5"   # the NVIDIA provider reads *training*
    foreign.write_bytes(b"someone else's shard")
    for extra in ([], ["--overwrite"]):
        line = error_of(capsys, argv + extra)
        assert "train/old_wiki_training_part.hdf5 was not written by prepare_data" in line, extra
    assert foreign.read_bytes() == b"someone else's shard"
    assert sorted(os.listdir(out / "train")) == ["o_training_shard0.hdf5", "old_wiki_training_part.hdf5"]
    foreign.unlink()
    assert prepare_data.main([str(a) for a in argv + ["--overwrite"]]) == 0


# ----------------------------------------------------------------------------- dying workers, signals

@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """About 1 MB of text: some seconds of work for two workers, in small chunks."""
    folder = tmp_path_factory.mktemp("big")
    parts = [make_corpus(folder / f"part{i}.txt", documents=400, seed=i) for i in range(4)]
    return folder, parts


READER_NAME = PROCESS_NAME.decode()


def workers_argv(vocab, corpus_folder, out):
    return ["--input", str(corpus_folder), "--output_dir", str(out), "--vocab_file", str(vocab),
            "--max_seq_length", "64", "--workers", "2", "--chunk_size_mb", "0.01"]


def start_with_workers(vocab, corpus_folder, out):
    """prepare_data --workers 2 in a subprocess; returns (process, its child processes: the two
    workers, then the reader) once they all run."""
    proc = subprocess.Popen([sys.executable, "-m", "tools.prepare_data", *workers_argv(vocab, corpus_folder, out)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        try:
            children = {p: p.name() for p in psutil.Process(proc.pid).children()}
        except psutil.NoSuchProcess:
            children = {}
        workers = [p for p, name in children.items() if name != READER_NAME]
        readers = [p for p, name in children.items() if name == READER_NAME]
        if len(workers) == 2 and len(readers) == 1:
            return proc, workers + readers
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"no workers started: {proc.communicate()}")


def finish(proc, workers, timeout=30):
    """(exit code or None after `timeout` s, stderr, workers still running); whatever is left
    is killed afterwards."""
    try:
        _, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code, err = None, "still running"
    left = running(workers)
    for p in [proc] + workers:
        try:
            p.kill()
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    proc.wait()
    return code, err, left


def assert_only_finished_chunks_left(out):
    """What a stopped run leaves: at most its finished chunks and its near-duplicate signatures (for
    the same command to continue from), never a shard, a vocab or the temporary folder."""
    assert os.listdir(out) in ([], [WORK_DIR])
    if os.listdir(out):
        work = out / WORK_DIR
        assert sorted(os.listdir(work)) in (["chunks", "lock", "run.json"], ["chunks", "lock", "near_dedup", "run.json"])
        assert all(name.endswith(".npz") and ".tmp" not in name for name in os.listdir(work / "chunks"))
        signatures = os.listdir(work / "near_dedup") if (work / "near_dedup").exists() else []
        assert all(name.endswith(".npy") and ".tmp" not in name for name in signatures)


def test_a_killed_worker_ends_the_run_with_an_error_not_a_hang(vocab, big_corpus, tmp_path):
    folder, _ = big_corpus
    out = tmp_path / "o"
    proc, workers = start_with_workers(vocab, folder, out)
    workers[0].send_signal(signal.SIGKILL)            # as the out-of-memory killer would
    started = time.time()
    code, err, _ = finish(proc, workers)
    assert code == 2, err
    assert time.time() - started < 20
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"worker process {workers[0].pid} killed by SIGKILL" in lines[0] and "out-of-memory" in lines[0]
    assert_only_finished_chunks_left(out)            # no shard, no vocab, no temporary folder


def test_a_killed_reader_ends_the_run_with_an_error_naming_it(vocab, big_corpus, tmp_path):
    """The reader process (reading and dealing the documents) killed: one error line naming it, the
    workers stopped, nothing but finished chunks left."""
    folder, _ = big_corpus
    out = tmp_path / "o"
    proc, children = start_with_workers(vocab, folder, out)
    reader = children[-1]
    reader.send_signal(signal.SIGKILL)
    code, err, left = finish(proc, children)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"the reader process {reader.pid} ended (killed by SIGKILL)" in lines[0]
    assert left == []
    assert_only_finished_chunks_left(out)


def test_sigterm_stops_the_workers_and_removes_the_temporary_folder(vocab, big_corpus, tmp_path):
    folder, _ = big_corpus
    out = tmp_path / "o"
    proc, workers = start_with_workers(vocab, folder, out)
    proc.send_signal(signal.SIGTERM)
    code, err, running = finish(proc, workers)
    assert code == 128 + signal.SIGTERM, err
    assert "error: stopped by SIGTERM; nothing was written" in err and "Traceback" not in err, err
    assert_only_finished_chunks_left(out)
    assert running == []


def running(processes):
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_sigkilled_run_takes_its_workers_along_and_the_same_command_finishes_it(vocab, big_corpus, tmp_path):
    """SIGKILL of the main process (a lost job, the out-of-memory killer picking it): its workers
    end with it (they lived on, blocked writing to a pipe nobody read, holding the journal's lock
    through a descriptor they inherited, so every rerun was refused naming the dead pid), and the
    same command then finishes with the shards of an uninterrupted run."""
    folder, _ = big_corpus
    out = tmp_path / "o"
    proc, workers = start_with_workers(vocab, folder, out)
    chunks = out / WORK_DIR / "chunks"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and len(os.listdir(chunks) if chunks.exists() else []) < 4:
        time.sleep(0.01)
    proc.kill()
    proc.wait()                                   # not communicate(): a live worker holds its pipes open
    proc.stdout.close()
    proc.stderr.close()
    assert not (out / "train").exists(), "the run ended before it could be killed"
    deadline = time.time() + 60                   # generous: they end at once, however loaded the machine
    while running(workers) and time.time() < deadline:
        time.sleep(0.1)
    left = running(workers)
    for worker in left:
        worker.kill()
    assert left == [], "the workers outlived the SIGKILLed main process"
    assert prepare_data.main(workers_argv(vocab, folder, out)) == 0
    fresh = tmp_path / "fresh"
    assert prepare_data.main(workers_argv(vocab, folder, fresh) + ["--prefix", "o"]) == 0
    assert os.listdir(out / "train") == ["o_training_shard0.hdf5"]
    for name in ["train/o_training_shard0.hdf5", *heldout.manifest_names()]:   # and the record of the split
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name
    assert not (out / WORK_DIR).exists()


def test_a_lock_whose_holder_is_gone_is_taken_over_with_one_warning(vocab, tmp_path, capsys, caplog):
    """The lock of a run that is no longer running, still held by a process it left behind (a
    worker of an older version, or anything that inherited the descriptor), is taken over with a
    warning; a live holder's is refused as before."""
    corpus = make_corpus(tmp_path / "c.txt", documents=20)
    out = tmp_path / "o"
    argv = ["--input", corpus, "--output_dir", out, "--vocab_file", vocab, "--max_seq_length", 64]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    work = out / WORK_DIR
    work.mkdir(parents=True)
    (work / "lock").write_text(f"{os.getpid()} {socket.gethostname()}")
    with open(work / "lock") as holder:           # held on a descriptor of its own, as an orphan would
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        line = error_of(capsys, argv)
        assert f"another prepare_data run (pid {os.getpid()} on {socket.gethostname()}) is writing there" in line
        (work / "lock").write_text(f"{dead_pid} {socket.gethostname()}")
        assert prepare_data.main([str(a) for a in argv]) == 0
    taken = [r.getMessage() for r in caplog.records if "taking it over" in r.getMessage()]
    assert len(taken) == 1 and f"pid {dead_pid} on {socket.gethostname()}" in taken[0], taken
    assert os.listdir(out / "train") == ["o_training_shard0.hdf5"] and not work.exists()


def test_a_stop_during_vocab_training_is_answered_at_once(tmp_path, monkeypatch):
    """The WordPiece trainer is one call into Rust (6.6 s on 40 MB), during which Python runs no
    signal handler: it runs on a thread, and the stop is answered while it trains."""
    def slow_train_vocab(*args):
        time.sleep(8)
        return 0

    monkeypatch.setattr(prep_vocab, "train_vocab", slow_train_vocab)
    corpus = make_corpus(tmp_path / "corpus.txt", documents=20)
    sources = find_sources([str(corpus)])
    journal = SimpleNamespace(vocab=str(tmp_path / "vocab.txt"), tmp=str(tmp_path))
    args = SimpleNamespace(vocab_sample_mb=100, chunk_size_mb=1, seed=0, workers=1, build_vocab=100, do_lower_case=True)
    signals = StopSignals()
    threading.Timer(0.3, lambda: setattr(signals, "received", signal.SIGTERM)).start()
    started = time.time()
    with pytest.raises(StopRequested):
        prep_vocab.build_vocab(args, sources, ReadOptions(), journal, signals)
    assert time.time() - started < 3 and not os.path.exists(journal.vocab)


def _idle_worker(parent, ready):
    end_with_parent(parent)    # what every worker process runs first, pool or not
    ready.set()
    time.sleep(60)


def test_a_worker_ends_on_sigterm_though_the_main_process_handles_it():
    """--build_vocab's sample is split in a multiprocessing.Pool, forked after main() installed its stop
    handlers, whose terminate() (when the pool closes) sends SIGTERM. Its workers once kept the
    inherited handler, which only records a stop, so a worker that had not yet taken the pool's end
    marker never ended and the run waited for it forever (a race: seen on a loaded machine)."""
    import multiprocessing

    signals = StopSignals()
    signals.install()
    try:
        ctx = multiprocessing.get_context("fork")
        ready = ctx.Event()
        worker = ctx.Process(target=_idle_worker, args=(os.getpid(), ready), daemon=True)
        worker.start()
        assert ready.wait(30)
        worker.terminate()                  # SIGTERM, as Pool.terminate sends it
        worker.join(10)
        ended = worker.exitcode
        if ended is None:
            worker.kill()
            worker.join()
    finally:
        signals.uninstall()
    assert ended == -signal.SIGTERM and signals.received is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are a POSIX thing")
def test_a_fifo_is_not_read(vocab, tmp_path, capsys, caplog):
    """A FIFO would block open() for ever: one among the input files is skipped with a warning,
    one given as --input is one error line."""
    folder = tmp_path / "in"
    folder.mkdir()
    make_corpus(folder / "corpus.txt", documents=40)
    os.mkfifo(folder / "pipe.txt")
    out = tmp_path / "out"
    argv = ["--input", folder, "--output_dir", out, "--vocab_file", vocab, "--max_seq_length", 64]
    assert prepare_data.main([str(a) for a in argv]) == 0
    assert "skipping 1 entries that are not regular files" in caplog.text
    line = error_of(capsys, ["--input", folder / "pipe.txt", "--output_dir", tmp_path / "out2", "--vocab_file", vocab,
                             "--max_seq_length", 64])
    assert "pipe.txt: not a regular file or folder (a FIFO" in line


def test_one_huge_line_is_warned_about_as_a_line_not_cut_into_pieces(tmp_path, caplog):
    """A 200 KB line is one 'sentence' of one-sentence-per-line text: said so (a sequence keeps
    its first tokens only), and not announced as cut into pieces, which a single line cannot be."""
    corpus = make_corpus(tmp_path / "c.txt", documents=3)
    with open(corpus, "a", encoding="utf-8") as f:
        f.write("\n" + " ".join(["word"] * 40_000) + "\n")
    reader = DocumentReader([str(corpus)], max_document_bytes=4096)
    with caplog.at_level("WARNING"):
        documents = [doc for doc, _ in reader if doc]
    assert len(documents) == 4 and reader.cut == 0 and "cut into pieces" not in caplog.text
    (warning,) = [w for w in reader.warnings() if "longer than 64 KB" in w]
    assert warning.startswith("1 line(s) longer than 64 KB (the longest: 0.2 MB,") and "text_docs" in warning


def test_the_output_folder_as_input_is_one_line(vocab, tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    make_corpus(folder / "corpus.txt", documents=10)
    line = error_of(capsys, ["--input", folder, "--output_dir", folder, "--vocab_file", vocab])
    assert f"--input {folder} is the --output_dir" in line


def test_overwrite_removes_a_linked_shard_not_what_it_links_to(vocab, tmp_path):
    """--overwrite over a shard-named link (to another run's shard folder) removes the link and
    keeps its target; it used to stop with 'Cannot call rmtree on a symbolic link' after the new
    vocab was in place."""
    corpus = make_corpus(tmp_path / "c.txt", documents=40)
    argv = ["--input", corpus, "--output_dir", tmp_path / "o", "--format", "bing", "--vocab_file", vocab,
            "--max_seq_length", 64]
    assert prepare_data.main([str(a) for a in argv]) == 0
    elsewhere = tmp_path / "kept_shard"
    os.rename(tmp_path / "o" / "train" / "shard_000", elsewhere)
    os.symlink(elsewhere, tmp_path / "o" / "train" / "shard_000")
    assert prepare_data.main([str(a) for a in argv + ["--overwrite"]]) == 0
    assert os.path.isdir(elsewhere) and not os.path.islink(tmp_path / "o" / "train" / "shard_000")


def test_a_chunk_a_killed_worker_was_writing_is_removed(tmp_path):
    """A worker killed while writing a chunk (the main process's SIGKILL on an error, or the
    whole run killed) leaves its temporary file: the journal removes it, when the run ends and
    when the same command starts again, and never counts it as a finished chunk."""
    journal = Journal(str(tmp_path))
    assert journal.open({"run": 1}, overwrite=False) == 0
    chunks = tmp_path / WORK_DIR / "chunks"
    (chunks / "train_0000000.npz").write_bytes(b"finished")
    (chunks / "train_0000001.npz.tmp4242.npz").write_bytes(b"half written")
    assert journal.close(finished=False) == ["1 finished chunk"]
    assert sorted(os.listdir(chunks)) == ["train_0000000.npz"]
    (chunks / "train_0000001.npz.tmp4243.npz").write_bytes(b"half written")   # killed with the run
    assert journal.open({"run": 1}, overwrite=False) == 1
    assert sorted(os.listdir(chunks)) == ["train_0000000.npz"]
    journal.close(finished=True)


@pytest.mark.parametrize("stop", ["before", "after"])
def test_a_stop_before_the_first_chunk_keeps_the_trained_vocab_and_the_signature_pass(tmp_path, monkeypatch, stop):
    """A SIGTERM once the vocab is trained, in the signature pass or after it, before any chunk is
    finished: the journal keeps the vocab (and the finished signature pass), and the same command
    trains and signs nothing again and writes what an uninterrupted run writes."""
    corpus = make_corpus(tmp_path / "corpus.txt", documents=80, seed=3)

    def argv(out):
        return ["--input", str(corpus), "--output_dir", str(out), "--build_vocab", "200", "--format", "nvidia",
                "--max_seq_length", "32", "--max_predictions_per_seq", "5", "--prefix", "o"]

    out = tmp_path / "o"
    sign = prepare_data.SignaturePass.run

    def stopped_in_the_signature_pass(self, documents, check_stop, pool=None):
        if stop == "after":
            sign(self, documents, check_stop, pool)
        os.kill(os.getpid(), signal.SIGTERM)
        check_stop()

    monkeypatch.setattr(prepare_data.SignaturePass, "run", stopped_in_the_signature_pass)
    assert prepare_data.main(argv(out)) == 128 + signal.SIGTERM
    work = out / WORK_DIR
    assert (work / "vocab.txt").is_file()
    assert (work / "near_dedup" / "removed.npy").is_file() == (stop == "after")
    assert not list((work / "chunks").glob("*.npz"))
    monkeypatch.setattr(prepare_data.SignaturePass, "run", sign)

    def never(*args, **kwargs):
        raise AssertionError("done again")

    monkeypatch.setattr(prep_vocab, "train_vocab", never)
    if stop == "after":
        monkeypatch.setattr(prepare_data.SignaturePass, "_sign", never)
    assert prepare_data.main(argv(out)) == 0
    monkeypatch.undo()
    fresh = tmp_path / "fresh"
    assert prepare_data.main(argv(fresh)) == 0
    written = sorted(str(p.relative_to(fresh)) for p in fresh.rglob("*") if p.is_file() and p.name != "stats.json")
    assert "vocab.txt" in written and "train/o_training_shard0.hdf5" in written
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != "stats.json") == written
    for name in written:
        if name == "tokenizer_record.json":     # names the folder it was written to
            assert {**json.loads((out / name).read_text()), "name": ""} == \
                {**json.loads((fresh / name).read_text()), "name": ""}
        else:
            assert (out / name).read_bytes() == (fresh / name).read_bytes(), name
    assert not work.exists()
