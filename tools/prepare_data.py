"""Raw text to pretraining shards: NVIDIA hdf5 or Bing numpy (docs/DESIGN.md, Data formats).

Owns the data preparation pipeline's command line, importable (`prepare(args)`), which runs the
stages of tools/prep/ (one module each, in the order data flows: its __init__.py lists them):

    python -m tools.prepare_data --input corpus.txt --output_dir OUT --format nvidia \
        --build_vocab 8000 --max_seq_length 128 --num_shards 2 --validation_fraction 0.05

Input: the layouts of tools/prep/layouts.py, told apart by name and content (--input_format to say):
text files (or folders of .txt files), one sentence per line, a blank line between documents,
the format Google's and NVIDIA's BERT tools read; one document per line (text_docs); MediaWiki
XML dumps; WikiExtractor output; JSON lines; parquet; Hugging Face datasets. All but the first
are split into sentences in the workers. The text must be UTF-8: a file with other bytes
(Latin-1, say) is refused naming its line, and a binary file (a NUL byte) is refused, rather
than decoded with losses. A document longer than --chunk_size_mb (text without blank lines is
one document) is cut into pieces of that size, with a warning and counts. Exact duplicates (the
same text up to case and whitespace) are read once; documents under --min_document_words are
dropped; both are counted in OUT/stats.json.

Document stages (tools/prep/stages.py), in the reader process (the ones that read the text decided
by --stage_workers processes beside it), in this order, each counted by rule in
stats.json's `filters` and the summary; --keep_filtered DIR writes what each removed (STAGE.jsonl):
near duplicates (on; --no_near_dedup turns it off: MinHash LSH over 5-word shingles, 14 bands of 8,
after a signature pass over the whole input, journalled like the chunks), --decontaminate FILE...
(training documents sharing a 13-word sequence with evaluation sets, dropped or cut), --languages
CODE... (py3langid), --quality_filter (Gopher's and C4's rules; --quality_threshold NAME=VALUE).
With every stage off the shards are those of a run without them, byte for byte.

Output folder:
    OUT/vocab.txt | OUT/tokenizer.json     the tokenizer the shards were made with (--tokenizer: a WordPiece
                                           vocab.txt, or a Hugging Face tokenizer.json with
                                           special_tokens_map.json naming its special tokens)
    OUT/tokenizer_record.json              which one it is (what decides its ids, and its name and sha256:
                                           turing/shard_tokenizer.py); the trainer refuses a run with another
                                           tokenizer, in whatever file it is held
    OUT/train/                             the training set
        {prefix}_training_shard{i}.hdf5    --format nvidia (prefix: OUT's name)
        shard_{i:03d}/                     --format bing
    OUT/validation/                        the same for --validation_fraction > 0
        {prefix}_test_shard{i}.hdf5 | shard_{i:03d}/
    OUT/documents.json, OUT/heldout.jsonl, OUT/train_document_keys.npy
                                           which documents were held out (as read), the training
                                           documents' keys and each set's shards (name, size, sampled
                                           digest: the trainer refuses any other file in train/ and
                                           validation/) (turing/heldout.py): the split's one record,
                                           which every later stage reads (with parts: one per part)

Pipeline. A reader process reads the documents in order (a multistream .bz2 dump's streams
decompressed on threads) and groups them into chunks of about --chunk_size_mb of text (the
training and validation documents separately). Each chunk is one unit of work for a pool
of --workers processes: tokenize (each distinct word once, through `tokenizers`' batch
encoder), cut documents into sequence pairs with BERT's `create_instances_from_document`
algorithm (--dupe_factor passes, random next sentences from another document of the same
chunk), shuffle, and for the NVIDIA format mask statically (vectorised over the chunk). The
main process only coordinates: it hands the chunks to the workers and writes the results in
chunk order, dealing sequences round-robin over the shards (the workers also deflate the hdf5
chunks), so --workers N is N cores of work (and --stage_workers more with a text stage on),
shard sizes differ by at most one, memory does not grow with the corpus, and the output depends
only on the input and --seed, never on --workers, --stage_workers or the process (the files are
byte-identical). Every file is written
under a temporary folder and renamed into place at the end, so a crash never leaves a
half-written shard under a final name. A worker or the reader that dies (the out-of-memory
killer) ends the run at once with an error; SIGTERM/SIGINT stop the workers and remove the temporary folder.
train/ and validation/ end up holding only this run's shards: anything else there is refused.

Resuming. Every finished chunk is kept in OUT/.prepare_data.work (with the settings and a
fingerprint of the input and vocab) until the run ends; the same command after a kill, a
crash or a signal reuses them and writes the shards an uninterrupted run would have written.
Other settings or a changed input are refused, or started afresh with --overwrite. The workers
end with the main process however it ends (SIGKILL too) and never hold the journal's lock; a
lock left held after its run ended is taken over with a warning.

Parts. --num_parts N --part K makes machine K's share: the documents whose hash is K mod N
(duplicates land in the same part), written as shards named by part, so the parts written into
one folder are one dataset for training.

--tokenizer names the model's own tokenizer: a vocab.txt, a tokenizer.json (byte-level BPE as
ModernBERT's: each sentence encoded as it stands in its document, a later one with the space before
it, since such tokens keep it) or a model folder holding one (its vocab.txt first). A tokenizer
whose tokens a format cannot store is one error line naming what to use instead.

The shards are a function of the input, the vocab and --seed, whatever the process (no decision
follows Python's per-process string hashes); --build_vocab gives the same vocab.txt in every run
of the same command (tools/prep/vocab.py's train_vocab says how, around the `tokenizers` trainer's
hash-ordered alphabet).

Bing shards hold unmasked token strings of segments A and B (the reader adds [CLS]/[SEP] and
masks at load time); is_next.npy is 1 when B is a random sentence (the Bing format's meaning, the same
as NVIDIA's next_sentence_labels), 0 when B really follows A.
"""
import argparse
import filecmp
import functools
import logging
import math
import os
import resource
import sys
import time

if not __package__:  # run as `python tools/NAME.py`: import from the repository root, as `python -m` does
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from tools.prep import TRAIN, VALIDATION, CorpusError, InputNotFoundError, PrepareDataError
from tools.prep.decontam import DEFAULT_MIN_WORDS, DEFAULT_NGRAM, Decontaminator, evaluation_files
from tools.prep.documents import CorpusReader
from tools.prep.filters import DocumentFilter, SplitRecord, install_split_record, iter_chunks
from tools.prep.journal import Journal, run_fingerprint
from tools.prep.language import LanguageFilter
from tools.prep.layouts import LAYOUTS, ReadOptions, compression, find_sources
from tools.prep.neardup import BANDS, MAX_MINHASH_VALUES, ROWS, NearDuplicateFilter, SignaturePass
from tools.prep.quality import QualityFilter, parse_thresholds
from tools.prep.reader import ChunkReader, StageWorkers
from tools.prep.shards import HDF5_GZIP_LEVEL, ShardSet, existing_shards, remove_shards
from tools.prep.stages import DocumentStages
from tools.prep.summary import SetStats, Summary, peak_rss_mb, write_stats
from tools.prep.vocab import build_vocab, check_tokenizer
from tools.prep.workers import Settings, WorkerPool, ordered_results
from turing.errors import OneLineParser
from turing.signals import StopRequested, StopSignals
from turing.shard_tokenizer import record_name, record_text
from turing.tokenization import (SPECIAL_TOKENS, TOKENIZER_FILES, TOKENIZER_JSON, VOCAB_TXT, folder_lower_case,
                                 is_tokenizer_json, tokenizer_file)

logger = logging.getLogger(__name__)


def build_parser():
    p = OneLineParser(description="Turn a corpus (text, a Wikipedia dump, WikiExtractor output, JSON lines, parquet, "
                            "a Hugging Face dataset) into BERT pretraining shards: NVIDIA hdf5 or Bing numpy.",
                formatter_class=argparse.ArgumentDefaultsHelpFormatter, epilog="guide: docs/data.md")
    p.add_argument("--input", nargs="+", required=True,
                   help="files or folders (a folder's .txt files, or its files of the other layouts); with "
                        "--input_format hf also a dataset name in the local Hugging Face cache")
    p.add_argument("--input_format", choices=LAYOUTS, default=None,
                   help="the input's layout (default: told apart by file name and first bytes); text: one "
                        "sentence per line, blank lines between documents; text_docs: one document per line")
    p.add_argument("--text_field", default="text",
                   help="jsonl/parquet/hf: the field or column holding a document's text (a.b: nested)")
    p.add_argument("--hf_split", default="train", help="hf: the split of a dataset dict or cached dataset")
    p.add_argument("--hf_config", default=None, help="hf: the configuration of a cached dataset")
    p.add_argument("--skip_bad_records", action="store_true",
                   help="skip (and count) records that hold no text instead of stopping: JSON lines that are not "
                        "JSON or lack --text_field, rows whose column is binary data or a list, ...")
    p.add_argument("--min_document_words", type=int, default=0,
                   help="drop documents of fewer words (counted in the summary and stats.json)")
    p.add_argument("--keep_duplicates", action="store_true",
                   help="keep exact duplicate documents (default: one copy; same text up to case and whitespace)")
    p.add_argument("--no_near_dedup", dest="near_dedup", action="store_false",
                   help="keep near-duplicate documents (default: MinHash LSH over 5-word shingles, 14 bands of 8, "
                        "drops a document sharing a band with an earlier one: found at Jaccard 0.8 with odds 0.92; "
                        "a signature pass reads the input first)")
    p.add_argument("--near_dedup_bands", type=int, default=BANDS,
                   help="near duplicates: LSH bands (more: found at lower similarity)")
    p.add_argument("--near_dedup_rows", type=int, default=ROWS,
                   help="near duplicates: MinHash values a band (more: fewer found below the threshold); "
                        "a pair of Jaccard s shares a band with odds 1 - (1 - s^rows)^bands")
    p.add_argument("--decontaminate", nargs="+", default=None, metavar="FILE",
                   help="evaluation sets (GLUE .tsv files or folders as finetune_glue reads, minimal-pair .jsonl "
                        "as eval_mlm reads, plain text one a line): training documents sharing a "
                        "--decontaminate_ngram-word sequence with them are dropped (or cut)")
    p.add_argument("--decontaminate_ngram", type=int, default=DEFAULT_NGRAM,
                   help="words in the sequences compared (GPT-3's 13; datatrove's default is 12)")
    p.add_argument("--decontaminate_min_words", type=int, default=DEFAULT_MIN_WORDS,
                   help="a shorter evaluation text of at least this many words matches where it occurs whole "
                        "(GPT-3's smallest N, 8); shorter ones are not used")
    p.add_argument("--decontaminate_action", choices=["drop", "cut"], default="drop",
                   help="drop a matching training document, or cut the lines (sentences, paragraphs) that match")
    p.add_argument("--languages", nargs="+", default=None, metavar="CODE",
                   help="keep only documents in these languages (ISO 639-1, as py3langid names them: en de ...)")
    p.add_argument("--quality_filter", action="store_true",
                   help="drop documents failing Gopher's quality and repetition rules and C4's page rules "
                        "(tools/prep/quality.py lists them, with the published thresholds)")
    p.add_argument("--quality_threshold", nargs="+", default=None, metavar="NAME=VALUE",
                   help="--quality_filter: another threshold for a rule (e.g. min_words=20)")
    p.add_argument("--keep_filtered", default=None, metavar="DIR",
                   help="write the documents the stages above removed here, one STAGE.jsonl a stage")
    p.add_argument("--num_parts", type=int, default=1, help="split the work over N machines (see --part)")
    p.add_argument("--part", type=int, default=0,
                   help="0-based: this machine's share of --num_parts, shards named by part in the same folders")
    p.add_argument("--output_dir", required=True,
                   help="writes train/, validation/, the tokenizer's files, stats.json and the split's record here")
    p.add_argument("--format", choices=["nvidia", "bing"], default="nvidia",
                   help="nvidia: hdf5 shards with static masking; bing: numpy token-string shards")
    p.add_argument("--bing_layout", choices=["separator", "offsets"], default="separator",
                   help="bing: tokens split by byte 0x1f, or located by token_offsets.npy")
    p.add_argument("--tokenizer", "--vocab_file", dest="vocab_file", default=None,
                   help="the model's tokenizer: a WordPiece vocab.txt, a Hugging Face tokenizer.json, or a model "
                        "folder holding one (--vocab_file: the older name)")
    p.add_argument("--build_vocab", type=int, default=None, metavar="N",
                   help="train a WordPiece vocab of about N entries on the input instead "
                        "(written to OUT/vocab.txt; the same vocab in every run of the same command)")
    p.add_argument("--vocab_sample_mb", type=float, default=100,
                   help="--build_vocab trains on a seeded sample of this much text of a larger or non-text corpus")
    p.add_argument("--do_lower_case", dest="do_lower_case", action="store_true", default=None,
                   help="vocab.txt: lower-case and strip accents (uncased vocab; the default, unless the "
                        "tokenizer_config.json beside it says otherwise)")
    p.add_argument("--no_lower_case", dest="do_lower_case", action="store_false", default=None,
                   help="vocab.txt: keep case and accents (cased vocab)")
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--max_predictions_per_seq", type=int, default=20,
                   help="cap on masked positions per sequence (nvidia)")
    p.add_argument("--masked_lm_prob", type=float, default=0.15,
                   help="share of tokens masked in the training set (nvidia)")
    p.add_argument("--validation_masked_lm_prob", type=float, default=0.15,
                   help="share of tokens masked in the validation set (nvidia); fixed so runs compare")
    p.add_argument("--short_seq_prob", type=float, default=0.1,
                   help="probability of a shorter target length for a document")
    p.add_argument("--dupe_factor", type=int, default=5,
                   help="passes over the documents, each cutting (and masking) them differently")
    p.add_argument("--num_shards", type=int, default=1, help="training shards (validation: one)")
    p.add_argument("--train_batch_size", type=int, default=None, metavar="N",
                   help="the global batch the shards are for (the DeepSpeed config's train_batch_size): training "
                        "shards holding fewer sequences are warned about (the trainer refuses a shard smaller than "
                        "the batch one rank trains a step on: a rank reads a whole NVIDIA shard an epoch); the "
                        "shards are the same with or without it")
    p.add_argument("--validation_fraction", type=float, default=0.0,
                   help="share of documents put in the validation set (0: none)")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes, each a core's work (beside them a reader process reads the input, "
                        "and the main process writes what the workers made)")
    p.add_argument("--stage_workers", type=int, default=None,
                   help="processes beside the reader that run the document stages that read the text "
                        "(--decontaminate, --languages, --quality_filter; default: as many as --workers); 0 runs "
                        "them in the reader process, which then bounds the run at a few MB/s")
    p.add_argument("--chunk_size_mb", type=float, default=0.25,
                   help="text per unit of work; random next sentences come from the same chunk")
    p.add_argument("--prefix", default=None,
                   help="nvidia file name prefix (default: the output folder's name)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace shards already in --output_dir, and an unfinished run's work made with other settings")
    p.add_argument("--debug", action="store_true", help="show tracebacks for input errors")
    return p


def validate_args(args):
    """Check flag values before any work; raises PrepareDataError naming the flag."""
    L, P = args.max_seq_length, args.max_predictions_per_seq
    if L < 5:
        raise PrepareDataError(f"--max_seq_length {L}: must be at least 5 ([CLS] A [SEP] B [SEP])")
    if not 1 <= P <= L - 3:
        raise PrepareDataError(f"--max_predictions_per_seq {P}: must be between 1 and max_seq_length - 3 "
                               f"= {L - 3}, the number of maskable tokens in a sequence of {L}")
    for flag in ("masked_lm_prob", "validation_masked_lm_prob"):
        if not 0 < getattr(args, flag) <= 1:
            raise PrepareDataError(f"--{flag} {getattr(args, flag)}: must be in (0, 1]")
    if not 0 <= args.short_seq_prob <= 1:
        raise PrepareDataError(f"--short_seq_prob {args.short_seq_prob}: must be in [0, 1]")
    if not 0 <= args.validation_fraction < 1:
        raise PrepareDataError(f"--validation_fraction {args.validation_fraction}: must be in [0, 1)")
    for flag in ("dupe_factor", "num_shards", "workers"):
        if getattr(args, flag) < 1:
            raise PrepareDataError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    if args.train_batch_size is not None and args.train_batch_size < 1:
        raise PrepareDataError(f"--train_batch_size {args.train_batch_size}: must be at least 1")
    if args.stage_workers is not None and args.stage_workers < 0:
        raise PrepareDataError(f"--stage_workers {args.stage_workers}: must be at least 0")
    if not 0 < args.chunk_size_mb < math.inf:
        raise PrepareDataError(f"--chunk_size_mb {args.chunk_size_mb}: must be a positive finite number")
    if (args.vocab_file is None) == (args.build_vocab is None):
        raise PrepareDataError("give exactly one of --tokenizer TOKENIZER and --build_vocab N")
    if args.build_vocab is not None and args.build_vocab <= len(SPECIAL_TOKENS):
        raise PrepareDataError(f"--build_vocab {args.build_vocab}: must be larger than {len(SPECIAL_TOKENS)}")
    if args.num_parts < 1 or not 0 <= args.part < args.num_parts:
        raise PrepareDataError(f"--num_parts {args.num_parts} --part {args.part}: need N >= 1 and 0 <= K < N")
    if args.num_parts > 1 and args.build_vocab is not None:
        raise PrepareDataError("--build_vocab with --num_parts: every part needs the same vocab; build it once "
                               "(a run with --build_vocab, or tools.prepare_data on a sample) and give --tokenizer")
    if args.min_document_words < 0:
        raise PrepareDataError(f"--min_document_words {args.min_document_words}: must be at least 0")
    if not 0 < args.vocab_sample_mb < math.inf:
        raise PrepareDataError(f"--vocab_sample_mb {args.vocab_sample_mb}: must be a positive finite number")
    changed = [f"--{flag} {getattr(args, flag)}"
               for flag, default in (("near_dedup_bands", BANDS), ("near_dedup_rows", ROWS)) if getattr(args, flag) != default]
    if changed and not args.near_dedup:
        raise PrepareDataError(f"{' and '.join(changed)} with --no_near_dedup: near duplicates are kept, so "
                               "there is nothing to set; drop one or the other")
    for flag in ("near_dedup_bands", "near_dedup_rows"):
        if getattr(args, flag) < 1:
            raise PrepareDataError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    if args.near_dedup_bands * args.near_dedup_rows > MAX_MINHASH_VALUES:
        raise PrepareDataError(f"--near_dedup_bands {args.near_dedup_bands} x --near_dedup_rows {args.near_dedup_rows}: "
                               f"at most {MAX_MINHASH_VALUES} MinHash values a document (the default {BANDS} x {ROWS} "
                               f"is {BANDS * ROWS}); each costs a hash of every shingle")
    if args.quality_threshold and not args.quality_filter:
        raise PrepareDataError("--quality_threshold without --quality_filter: add --quality_filter to run the rules")
    parse_thresholds(args.quality_threshold)
    if args.keep_filtered is not None and not (args.near_dedup or args.decontaminate or args.languages
                                               or args.quality_filter):
        raise PrepareDataError(f"--keep_filtered {args.keep_filtered} with every document stage off (--no_near_dedup "
                               "and none of --decontaminate, --languages, --quality_filter): nothing would be written")
    if args.keep_filtered is not None and os.path.exists(args.keep_filtered) and not os.path.isdir(args.keep_filtered):
        raise PrepareDataError(f"--keep_filtered {args.keep_filtered}: a file; expected a folder (made if missing)")
    sets = [os.path.abspath(os.path.join(args.output_dir, sub)) for sub in (TRAIN, VALIDATION)]
    if args.keep_filtered is not None and any((os.path.abspath(args.keep_filtered) + os.sep).startswith(s + os.sep)
                                              for s in sets):
        raise PrepareDataError(f"--keep_filtered {args.keep_filtered}: inside --output_dir's train/ or validation/, "
                               "which training reads whole; give another folder")
    if args.prefix is not None and (os.path.basename(args.prefix) != args.prefix or args.prefix in ("", ".", "..")):
        raise PrepareDataError(f"--prefix {args.prefix!r}: a file name prefix, not a path; the shards go in "
                               "--output_dir's train/ and validation/")


def check_output_dir(args, resuming=False, part_tag=None):
    """Refuse to mix with an earlier run's shards unless --overwrite, and refuse anything else
    in train/ and validation/ (training reads those folders whole: a foreign *training* file or
    sub-folder there would be read as a shard); so the sets hold only what this run writes.
    `resuming`: an unfinished run of the same command passed these checks already (shards there
    may be its own, from a stop while installing them). With parts, only this part's shards count."""
    out = args.output_dir
    if os.path.exists(out) and not os.path.isdir(out):
        raise PrepareDataError(f"--output_dir {out}: exists and is not a folder")
    for sub in (TRAIN, VALIDATION):
        folder = os.path.join(out, sub)
        foreign = sorted(set(os.listdir(folder)) - set(existing_shards(folder))) if os.path.isdir(folder) else []
        if foreign:
            raise PrepareDataError(f"--output_dir {out}: {sub}/{foreign[0]} was not written by prepare_data "
                                   f"({len(foreign)} such entr{'y' if len(foreign) == 1 else 'ies'} in {sub}/, "
                                   "which training reads whole); move them away or use another --output_dir")
    if args.overwrite or resuming:
        return
    found = [os.path.join(sub, name) for sub in (TRAIN, VALIDATION)
             for name in existing_shards(os.path.join(out, sub), part_tag)]
    if found:
        raise PrepareDataError(f"--output_dir {out} already holds shards ({found[0]}, ...); "
                               "pass --overwrite to replace them")
    own = TOKENIZER_JSON if args.vocab_file and is_tokenizer_json(args.vocab_file) else VOCAB_TXT
    for name in TOKENIZER_FILES:
        there = os.path.join(out, name)
        if os.path.exists(there) and (name != own or args.build_vocab is not None or not (
                _same_file(args.vocab_file, there) or filecmp.cmp(args.vocab_file, there, shallow=False))):
            raise PrepareDataError(f"--output_dir {out} already holds a different {name}; "
                                   "pass --overwrite to replace it")


def _same_file(a, b):
    return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def prepare(args, signals=None):
    """Run the whole pipeline for parsed `args`; returns a Summary. Raises PrepareDataError, or
    StopRequested once `signals` (a StopSignals, installed by the caller) received one."""
    signals = signals or StopSignals()
    start = time.perf_counter()
    validate_args(args)
    given = args.vocab_file
    args = resolved_tokenizer(args)
    sources = input_sources(args)
    chosen = document_stages(args)   # their evaluation sets read and models loaded: errors before any work
    out = args.output_dir
    parts = args.num_parts > 1
    part_tag = f"part{args.part:03d}_" if parts else ""
    journal = Journal(out, f".part{args.part}of{args.num_parts}" if parts else "")
    fingerprint = run_fingerprint(args, sources, [f for p in args.decontaminate or () for f in evaluation_files(p)])
    check_output_dir(args, resuming=journal.previous() == fingerprint, part_tag=part_tag or None)
    os.makedirs(out, exist_ok=True)
    done = journal.open(fingerprint, args.overwrite)
    if done:
        logger.info("continuing an unfinished run: %d chunks are done (in %s) and are reused", done, journal.folder)
    tmp = journal.tmp
    pool = reader = stages = None
    shard_sets = {}
    finished = stopped = False
    try:
        chunk_bytes = int(args.chunk_size_mb * 2**20)
        options = read_options(args)
        vocab_file = build_vocab(args, sources, options, journal, signals) if args.build_vocab is not None else args.vocab_file
        tokenizer = check_tokenizer(vocab_file, args.format, args.bing_layout, args.do_lower_case)
        # named as --tokenizer names it, or by its copy in OUT, where a trained one stays
        tokenizer.name = given if args.build_vocab is None else os.path.join(out, VOCAB_TXT)
        # Id -> token (a vocab.txt's lines: load_vocab's dict keeps one id per repeated line);
        # random replacement ids span every id, as the model's rows do (vocab_size).
        tokens_by_id = tokenizer.tokens_by_id()
        settings = worker_settings(args, tokenizer)
        tokenizer.encode("")   # its encoder built here, before the workers fork, so they inherit the set-up
        summary = Summary(output_dir=out, fmt=args.format, input_bytes=sum(s.size for s in sources),
                          part=f"{args.part} of {args.num_parts}" if parts else "", tokenizer=tokenizer.record())
        summary.setup_seconds = time.perf_counter() - start
        t0, cpu0 = time.perf_counter(), time.process_time()
        # The workers do all the work (a chunk's arrays, and the hdf5 chunks' deflating); the reader
        # process reads and deals the documents; this process hands out the chunks and writes.
        pool = WorkerPool(args.workers, settings, tokenizer, tokens_by_id, journal.descriptors())
        pool.check_stop = signals.check
        compress = functools.partial(pool.deflate, level=HDF5_GZIP_LEVEL)

        prefix = args.prefix or os.path.basename(os.path.abspath(out))
        sets = [TRAIN] + ([VALIDATION] if args.validation_fraction > 0 else [])
        for name in sets:
            shards = args.num_shards if name == TRAIN else 1
            shard_sets[name] = ShardSet(name, os.path.join(tmp, name), os.path.join(out, name),
                                        shards, settings, prefix, compress, part_tag)
            summary.sets[name] = SetStats()

        if args.near_dedup:   # its signature pass first (journalled), over every part's documents
            bands, rows = args.near_dedup_bands, args.near_dedup_rows
            removed = SignaturePass(journal.near_dedup, args.seed, bands, rows).run(
                CorpusReader(sources, options, max_document_bytes=chunk_bytes), signals.check, pool)
            chosen = [NearDuplicateFilter(removed, bands, rows)] + chosen
        # The stages run in the reader process; this copy only installs what they wrote (--keep_filtered).
        stages = DocumentStages(chosen, args.keep_filtered, args.part if parts else None)
        reader = ChunkReader(functools.partial(read_chunks, args, sources, options, chunk_bytes, tmp, stages),
                             journal.descriptors(), signals.check)
        chunks = ((name, index, docs, len(shard_sets[name].writers), journal.chunk_path(name, index), nbytes)
                  for name, index, docs, nbytes in reader)
        _collect(ordered_results(chunks, pool, args.workers, summary.input_bytes, signals.check),
                 summary, shard_sets)
        summary.read, warnings = reader.outcome

        _finish_sets(summary, shard_sets, args.input, tokens_by_id, tokenizer.do_lower_case, stages)
        warn_small_shards(summary.sets[TRAIN].shard_sizes, args.train_batch_size, args.format)
        pool.close()
        pool = None
        for warning in warnings:
            logger.warning("%s", warning)
        _install(out, tmp, tokenizer, shard_sets, part_tag, args.part if parts else None)
        stages.install()
        summary.seconds = time.perf_counter() - t0
        summary.main_cpu_seconds = time.process_time() - cpu0
        summary.peak_mb = peak_rss_mb(resource.RUSAGE_SELF)
        summary.peak_worker_mb = peak_rss_mb(resource.RUSAGE_CHILDREN)
        write_stats(summary, tmp, out, f"stats.part{args.part:03d}.json" if parts else "stats.json")
        finished = True
        return summary
    except StopRequested:
        stopped = True
        raise
    finally:
        if pool:
            pool.terminate()
        if reader:
            reader.terminate()
        for shard_set in shard_sets.values():
            shard_set.close()
        if stages is not None:
            stages.close()
        kept = journal.close(finished, stopped)
        if kept:
            logger.warning("%s kept in %s: the same command continues from them", ", ".join(kept), journal.folder)


def document_stages(args):
    """The stages --decontaminate, --languages and --quality_filter turn on, in that order (near
    duplicates, first of all, need their signature pass: `prepare` adds them)."""
    stages = []
    if args.decontaminate:
        stages.append(Decontaminator(args.decontaminate, args.decontaminate_ngram, args.decontaminate_min_words,
                                     args.decontaminate_action))
    if args.languages:
        stages.append(LanguageFilter(args.languages))
    if args.quality_filter:
        stages.append(QualityFilter(parse_thresholds(args.quality_threshold)))
    return stages


def input_sources(args):
    """The input sources of `args` (tools/prep/layouts.py), text ones checked for binary data."""
    sources = find_sources(args.input, args.input_format, exclude=args.output_dir, options=read_options(args))
    for source in sources:
        if source.layout in ("text", "text_docs") and not compression(source.path):
            with open(source.path, "rb") as f:
                head = f.read(1 << 16)
            if b"\0" in head:
                raise PrepareDataError(f"{source.path}: binary data (a NUL byte at offset {head.index(0)}), not "
                                       "text; give UTF-8 text files only (or --input_format for another layout)")
    return sources


def read_options(args):
    return ReadOptions(text_field=args.text_field, hf_split=args.hf_split, hf_config=args.hf_config,
                       skip_bad_records=args.skip_bad_records)


def resolved_tokenizer(args):
    """`args` with --tokenizer as its file (a folder's vocab.txt, else its tokenizer.json) and
    --do_lower_case as a vocab.txt's folder says where no flag does (its tokenizer_config.json;
    else on, as for --build_vocab; a tokenizer.json's normalizer needs none)."""
    path, lower = args.vocab_file, args.do_lower_case
    if path is not None:
        try:
            path = tokenizer_file(path)
        except FileNotFoundError as e:
            raise InputNotFoundError(f"--tokenizer {e}") from None
    if lower is None and not (path and is_tokenizer_json(path)):
        lower = folder_lower_case(path) if path else True
    return argparse.Namespace(**{**vars(args), "vocab_file": path, "do_lower_case": lower})


def worker_settings(args, tokenizer):
    """What the workers need of the flags and the tokenizer to make a chunk's arrays."""
    special = tokenizer.special
    return Settings(
        fmt=args.format, bing_layout=args.bing_layout, max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq, masked_lm_prob=args.masked_lm_prob,
        validation_masked_lm_prob=args.validation_masked_lm_prob,
        short_seq_prob=args.short_seq_prob, dupe_factor=args.dupe_factor, seed=args.seed,
        vocab_size=tokenizer.vocab_size, cls_id=special["cls"], sep_id=special["sep"],
        mask_id=special["mask"], unk_id=special["unk"], min_document_words=args.min_document_words)


def _collect(results, summary, shard_sets):
    """Each chunk's counts into the summary and its arrays into its set's shards, in input order."""
    for name, (stats, arrays, group_sizes), nbytes, reused in results:
        total = summary.sets[name]
        for key in SetStats.COUNTS:
            setattr(total, key, getattr(total, key) + getattr(stats, key))
        if arrays is not None:
            shard_sets[name].add(arrays, group_sizes)
        if reused:
            summary.reused_chunks += 1
            summary.reused_bytes += nbytes


def read_chunks(args, sources, options, chunk_bytes, tmp, stages):
    """The reader process's work (tools/prep/reader.py): the documents read, kept (the document
    `stages` too) and dealt into chunks (yields iter_chunks' tuples), the split recorded in `tmp`
    as they are dealt; returns the reading's counts for stats.json and the warnings about the input."""
    processes = args.workers if args.stage_workers is None else args.stage_workers
    # started first: forked before any thread of the reading (a .bz2 dump's decompression)
    stage_workers = StageWorkers(stages, processes) if processes and stages.reads_text() else None
    documents = CorpusReader(sources, options, max_document_bytes=chunk_bytes)
    keep = DocumentFilter(args.num_parts, args.part, dedup=not args.keep_duplicates)
    record = SplitRecord(tmp, args.part if args.num_parts > 1 else None)
    try:
        yield from iter_chunks(documents, chunk_bytes, args.validation_fraction, keep, record,
                               stage_workers or stages or None)
        record.finish(args, keep.read + keep.other_parts)
    finally:
        if stage_workers is not None:
            stage_workers.close()
        record.close()
        stages.close()       # its --keep_filtered files complete, for the main process to install
    counts = read_counts(documents, keep)
    if stages:
        counts["filters"] = stages.counts()
    return counts, documents.warnings()


def read_counts(documents, keep):
    """The reading's counts for stats.json: documents read, left out (and why), layouts."""
    return {"documents_read": keep.read, "duplicates": keep.duplicates,
            "bad_records": documents.counts.bad_records, "redirects": documents.counts.redirects,
            "other_pages": documents.counts.other_pages, "other_parts": keep.other_parts,
            "layouts": documents.counts.layouts}


def _stage_removals(summary, name=None):
    """{stage: {rule: documents}} the document stages removed (or cut), from set `name` only where given."""
    return {stage: counts["removed"] if name is None else counts.get("by_set", {}).get(name, {})
            for stage, counts in summary.read.get("filters", {}).items()}


def _left_out(summary, name=None):
    """What left documents out, in words ("quality 212 (min_words 180, ...), 3 exact duplicates"),
    or "" when nothing did; `name`: what left set `name`'s documents out (the stages and
    --min_document_words: the duplicates and other parts are not counted by set)."""
    read = summary.read
    said = []
    for stage, removed in _stage_removals(summary, name).items():
        if sum(removed.values()):
            rules = ", ".join(f"{rule} {n}" for rule, n in removed.items() if n)
            said.append(f"{stage} {sum(removed.values())}" + (f" ({rules})" if len(removed) > 1 else ""))
    sets = summary.sets.values() if name is None else [summary.sets[name]]
    for count, what in ((0 if name else read.get("duplicates", 0), "exact duplicates"),
                        (0 if name else read.get("other_parts", 0), "of other parts"),
                        (sum(s.too_short for s in sets), "under --min_document_words")):
        if count:
            said.append(f"{count} {what}")
    return ", ".join(said)


def _removed_files(summary, name, stages):
    """Where the documents the stages removed can be read, for the error that nothing is left in set
    `name` (None: in all): --keep_filtered's files, installed now (the run ends here), else the flag."""
    if not stages or not any(sum(rules.values()) for rules in _stage_removals(summary, name).values()):
        return ""
    files = stages.install()
    if not files:
        return "; --keep_filtered DIR writes what the stages removed, for a look"
    return f"; what the stages removed is in {os.path.dirname(files[0])}: {', '.join(map(os.path.basename, files))}"


def _finish_sets(summary, shard_sets, inputs, tokens_by_id=(), do_lower_case=True, stages=None):
    """Check that every set and shard got sequences, then finish the shard files. `stages`: the
    DocumentStages, whose --keep_filtered files an error that they left nothing names."""
    for name, shard_set in shard_sets.items():
        stats = summary.sets[name]
        stats.shard_sizes = shard_set.sizes
        skipped = summary.read.get("bad_records") if name == TRAIN else 0
        if stats.documents == 0 and skipped:
            raise PrepareDataError(f"--input {' '.join(inputs)}: no document with tokens, and {skipped} bad records "
                                   "skipped (--skip_bad_records); without that flag the first is named")
        which = None if name == TRAIN else name
        left_out = _left_out(summary, which)
        if stats.documents == 0 and left_out:
            what, fix = (("every document was", "loosen those settings or add text") if name == TRAIN else
                         ("every held-out document (the validation set) was", "loosen those settings or raise "
                          "--validation_fraction"))
            raise PrepareDataError(f"--input {' '.join(inputs)}: {what} left out ({left_out}); {fix}"
                                   f"{_removed_files(summary, which, stages)}")
        if stats.documents == 0:
            what, hint = ("input", "") if name == TRAIN else ("validation set", "; raise --validation_fraction")
            raise PrepareDataError(f"--input {' '.join(inputs)}: the {what} has no document with tokens "
                                   f"(expected text: for .txt files one sentence per line, blank lines between "
                                   f"documents; --input_format names another layout{hint})")
        if min(stats.shard_sizes) == 0:
            raise PrepareDataError(f"{stats.sequences} {name} sequences cannot fill {len(stats.shard_sizes)} "
                                   "shards; lower --num_shards or add text")
    for shard_set in shard_sets.values():
        shard_set.finish()
    unk = summary.sets[TRAIN].unk_tokens / max(summary.sets[TRAIN].tokens, 1)
    if unk > UNK_WARNING:
        logger.warning("%.1f%% of the tokens are [UNK] (more than %g%%): %s", 100 * unk, 100 * UNK_WARNING,
                       unk_cause(tokens_by_id, do_lower_case))


UNK_WARNING = 0.01


def warn_small_shards(sizes, batch, fmt):
    """--train_batch_size: one warning when training shards hold fewer sequences than the batch, with
    the largest --num_shards the sequences fill with a batch each. The trainer refuses a shard smaller
    than the batch one rank trains a step on: an NVIDIA shard is read whole by one rank an epoch (on
    R ranks it needs the batch / R), the ranks share a Bing shard (an epoch of such shards alone
    trains 0 steps)."""
    small = [size for size in sizes if size < (batch or 0)]
    if not small:
        return
    total = sum(sizes)
    reader = ("a rank reads a whole NVIDIA shard an epoch, and the trainer refuses one smaller than the batch a "
              "rank trains a step on (the batch / R on R ranks)" if fmt == "nvidia" else
              "the ranks share a Bing shard, and an epoch whose shards all hold fewer trains 0 steps")
    fix = (f"make fewer shards: --num_shards {total // batch} or fewer" if total >= batch else
           f"the {total} training sequences are fewer than one batch: add text, or train with a smaller batch")
    logger.warning("%d of %d training shards hold fewer sequences than --train_batch_size %d (the smallest: %d): "
                   "%s; %s", len(small), len(sizes), batch, min(small), reader, fix)


def unk_cause(tokens_by_id, do_lower_case):
    """The likely reason for many [UNK]s, from the vocab's case and the lower-casing flag."""
    if do_lower_case is None:   # a tokenizer.json: its normalizer does what it does
        return "the text is in another language or script than the tokenizer's, or the tokenizer is the wrong one"
    words = [t for t in tokens_by_id if t.isalpha()]
    cased = sum(t != t.lower() for t in words) > 0.05 * max(len(words), 1)
    if not do_lower_case and not cased:
        return "a cased corpus (--no_lower_case) with an uncased vocab: drop --no_lower_case"
    if do_lower_case and cased:
        return "a cased vocab with lower-casing on: add --no_lower_case"
    return ("the text is in another language or script than the vocab's, or the vocab is the wrong one "
            "(--tokenizer; --build_vocab trains one on this corpus)")


def _install(out, tmp, tokenizer, shard_sets, part_tag, part=None):
    """Everything is complete: move the tokenizer's files (a copy that opens to the same tokenizer)
    and its record, the shards and the record of the split from `tmp` into place (with parts, only
    this part's shards are replaced)."""
    files = {**tokenizer.files(), record_name(part): record_text(tokenizer).encode()}
    for name, data in files.items():
        if not _same_file(tokenizer.path, os.path.join(out, name)):
            with open(os.path.join(tmp, name + ".final"), "wb") as f:
                f.write(data)
            os.replace(os.path.join(tmp, name + ".final"), os.path.join(out, name))
    for name in set(TOKENIZER_FILES) - set(files):   # another kind's, replaced (--overwrite: check_output_dir)
        if os.path.isfile(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    listed = {name: shard_set.listing() for name, shard_set in shard_sets.items()}   # the split's record lists them
    for shard_set in shard_sets.values():
        shard_set.install()
    if VALIDATION not in shard_sets:   # this run's older validation shards (only with --overwrite)
        remove_shards(os.path.join(out, VALIDATION), part_tag or None)
    install_split_record(tmp, out, part, listed)


def main(argv=None):
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    signals = StopSignals(action="stopping the workers; finished chunks are kept")
    signals.install()
    try:
        summary = prepare(args, signals)
    except StopRequested as e:
        print(f"error: {e}; nothing was written to {args.output_dir}'s train/ and validation/ (finished chunks "
              "are kept for the same command to continue from)", file=sys.stderr)
        return 128 + e.signum
    except (PrepareDataError, CorpusError, OSError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        signals.uninstall()
    for line in summary.lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
