"""The tokenizer the shards are made with: --build_vocab's WordPiece training (on the text files
themselves, or on a bounded, seeded sample of any layout, split in worker processes), and the
check of a given tokenizer (a vocab.txt, a tokenizer.json or a model folder) or a trained vocab.txt.

The same text gives the same vocab.txt in every run (train_vocab says how, around the trainer's
hash-order numbering), and the sample it trains on is the same for the same --seed.
"""
import heapq
import logging
import os
import random
import threading

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from tools.prep import InputNotFoundError, PrepareDataError
from tools.prep.documents import CorpusReader, document_size, first_non_utf8
from tools.prep.layouts import compression
from tools.prep.sentences import SPLITTER, SentenceSplitter, document_sentences
from tools.prep.workers import end_with_parent, worker_context
from turing.formats import token_storage_problem
from turing.tokenization import ROLES, SPECIAL_TOKENS, load_tokenizer

logger = logging.getLogger(__name__)
CONTINUING = "##"            # WordPiece's prefix of a piece inside a word


def build_vocab(args, sources, options, journal, signals):
    """Train the --build_vocab vocab (or reuse the one an unfinished run of this command trained):
    on the text files themselves when they are small one-sentence-per-line text, else on a seeded
    sample of --vocab_sample_mb of text from any layout (memory bounded by the sample). A stop
    signal is answered while the trainer runs (it runs on a thread; Python's handlers only run
    between the main thread's bytecodes, never inside the Rust trainer)."""
    if os.path.isfile(journal.vocab):
        logger.info("reusing the vocab the unfinished run trained (%s)", journal.vocab)
        return journal.vocab
    budget = int(args.vocab_sample_mb * 2**20)
    plain = all(s.layout == "text" and not compression(s.path) for s in sources)
    if plain and sum(s.size for s in sources) <= budget:
        files = [s.path for s in sources]
    else:
        sample = os.path.join(journal.tmp, "vocab_sample.txt")
        reader = CorpusReader(sources, options, max_document_bytes=int(args.chunk_size_mb * 2**20))
        n, size = write_vocab_sample(reader, sample, budget, args.seed, args.workers, journal.descriptors())
        logger.info("training the vocab on a sample of %d documents (%.1f MB of text)", n, size / 1e6)
        files = [sample]
    tmp = journal.vocab + ".tmp"
    result = {}

    def train():
        try:
            result["size"] = train_vocab(files, args.build_vocab, args.do_lower_case, tmp)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            result["error"] = e

    trainer = threading.Thread(target=train, name="vocab-trainer", daemon=True)  # ends with the process
    trainer.start()
    while trainer.is_alive():
        trainer.join(0.1)
        signals.check()
    if "error" in result:
        raise result["error"]
    size = result["size"]
    os.replace(tmp, journal.vocab)
    logger.info("trained a WordPiece vocab of %d entries", size)
    return journal.vocab


def train_vocab(files, vocab_size, do_lower_case, path):
    """Train a BERT WordPiece vocab of about `vocab_size` entries on `files`; write it to `path`.

    Special tokens come first ([PAD] = 0, [UNK] = 1, [CLS] = 2, [SEP] = 3, [MASK] = 4).

    The same files give the same vocab in every run. `tokenizers`' trainer numbers the continuing
    alphabet ("##a", "##b", ...) as it meets it in a hash map, whose order every process draws
    anew, and breaks ties between equally frequent merges by those numbers (huggingface/tokenizers
    issue 1794), so on its own it gives a few other entries in each run. A first pass that stops
    before any merge finds that alphabet; the training proper is handed it sorted, as entries it
    holds from the start, so nothing is numbered in hash order. It costs a second count of the
    words (about as long as the training: 15 s more for 100 MB of text here). Two things differ
    from the trainer alone, both only where it had to pick among equals or in text it rarely meets:
    those entries are numbered before the alphabet, so of equally frequent merges one inside a word
    is taken before one at a word's start (the trainer alone numbered them after it, in hash
    order); and, handed over as special tokens, "##" and a letter written literally in the text are
    taken as that entry rather than as "#", "#" and a word.
    """
    first = _trained(files, 0, do_lower_case, ())
    alphabet = sorted(token for token in first.get_vocab() if token.startswith(CONTINUING))
    tokenizer = _trained(files, vocab_size, do_lower_case, alphabet)
    tokens = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for token, _ in tokens:
            f.write(token + "\n")
    return len(tokens)


def _trained(files, vocab_size, do_lower_case, known):
    """A WordPiece tokenizer trained on `files`, the entries `known` given after the special tokens."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix=CONTINUING))
    # BERT's normalisation: clean text, split CJK, lower-case and strip accents when asked.
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=[*SPECIAL_TOKENS.values(), *known],
                                        continuing_subword_prefix=CONTINUING, show_progress=False)
    try:
        tokenizer.train(files, trainer)
    except Exception:  # the Rust trainer raises a bare Exception; name the file and line if it is the text
        error = first_non_utf8(files)
        if error is not None:
            raise error from None
        raise
    return tokenizer


def sample_documents(documents, budget, seed):
    """A seeded sample of about `budget` characters of text from a stream of documents, in input
    order, uniform over documents, holding at most the budget (plus a document) at any time: the
    documents of the smallest random keys that fit (a bounded heap), whatever the corpus size."""
    rng = random.Random(seed)
    heap, total = [], 0                # (-key, index, document): the largest key on top
    for index, (doc, _) in enumerate(documents):
        if not doc:
            continue
        key = rng.random()
        if total >= budget and heap and key >= -heap[0][0]:
            continue
        heapq.heappush(heap, (-key, index, doc))
        total += document_size(doc)
        while total > budget and len(heap) > 1:
            total -= document_size(heapq.heappop(heap)[2])
    return [doc for _, _, doc in sorted(heap, key=lambda entry: entry[1])]


def _sentences_of(documents, splitter=SPLITTER):
    split = SentenceSplitter(splitter)
    return ["\n".join(document_sentences(doc, split)) for doc in documents]


def write_vocab_sample(reader, path, budget, seed, workers, inherited=()):
    """Write the sample `train_vocab` reads for a large or non-text corpus, one sentence per line:
    documents sampled by `sample_documents`, markup removed and split in `workers` processes
    (which close the descriptors `inherited` and end with this process: end_with_parent)."""
    sample = sample_documents(reader, budget, seed)
    batches = [sample[i:i + 64] for i in range(0, len(sample), 64)]
    with open(path, "w", encoding="utf-8") as f:
        if workers > 1 and len(batches) > 1:
            ctx, inherited = worker_context(inherited)
            with ctx.Pool(workers, end_with_parent, (os.getpid(), inherited)) as pool:
                for texts in pool.imap(_sentences_of, batches):
                    f.writelines(t + "\n\n" for t in texts if t)
        else:
            for batch in batches:
                f.writelines(t + "\n\n" for t in _sentences_of(batch) if t)
    return len(sample), sum(map(document_size, sample))


def check_tokenizer(path, fmt, bing_layout, do_lower_case=None):
    """Open and check the tokenizer the shards are made with (turing.tokenization.load_tokenizer: a
    vocab.txt, a tokenizer.json or a folder holding one): its special tokens, and that the format
    can store its tokens. One error line naming --tokenizer otherwise."""
    try:
        tokenizer = load_tokenizer(path, do_lower_case)
        _ = tokenizer.special   # a special token it lacks is an error here, not in a worker
    except UnicodeDecodeError as e:
        raise PrepareDataError(f"--tokenizer {path}: not utf-8 text ({e})") from None
    except FileNotFoundError as e:
        raise InputNotFoundError(f"--tokenizer {e}") from None
    except ValueError as e:
        raise PrepareDataError(f"--tokenizer {path}: {e}") from None
    problem = token_storage_problem(tokenizer.vocab, fmt, bing_layout)
    if problem:
        raise PrepareDataError(f"--tokenizer {path}: {problem}")
    if len(tokenizer.vocab) < len(ROLES) + 1:
        raise PrepareDataError(f"--tokenizer {path}: only {len(tokenizer.vocab)} entries")
    return tokenizer
