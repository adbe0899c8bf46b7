"""The stages of tools/prepare_data.py, one module each, in the order data flows through them:

    layouts     the input files and their layout; a file's bytes as a stream (decompressed)
    documents   one streamed reader per layout: documents, input bytes consumed, what else was met
    filters     which documents a run keeps (exact duplicates once, this part's) and which set each
                goes to (the split), in chunks; the record of the split beside the shards
    stages      the document stages a run turns on, in order, what each removed, --keep_filtered:
      neardup     near duplicates (on by default): MinHash LSH, a signature pass, then the removal
      decontam    --decontaminate: training documents sharing 13-word sequences with evaluation sets
      language    --languages: language ID (py3langid)
      quality     --quality_filter: Gopher's quality and repetition rules, C4's page rules
      ngrams      the words and word n-gram hashes they compare
    sentences   a document to its sentences: wikitext to text, the sentence splitter
    vocab       --build_vocab's WordPiece training (on a bounded sample), the vocab's checks
    tokens      sentences to token ids, each distinct word tokenized once
    instances   BERT's sequence pairs cut from a chunk's tokens, as NVIDIA or Bing arrays
    shards      the shard files: hdf5 and .npy writers, a set's sequences dealt over its shards
    reader      the process that reads and deals the documents (layouts, documents, filters)
    workers     a chunk's work (ChunkProcessor) and the deflating of hdf5 chunks, the processes that
                do it, results in chunk order
    journal     the finished chunks a stopped run leaves for the same command to continue from
    summary     what a run counted: per set and in all, stats.json

The reader process reads, keeps and deals the documents into chunks (layouts, documents, filters,
stages; near duplicates after a signature pass over the whole input, read in the main process and
signed in the workers); a worker turns a chunk into arrays (sentences, tokens, instances), records
it (journal) and deflates the hdf5 chunks; the main process only coordinates: it hands out the
chunks and writes the arrays in chunk order (shards). The command line, tools/prepare_data.py,
runs them (`prepare`); nothing here imports it, and turing/ imports nothing here (the split's
record is turing/heldout.py's format, which the trainer reads).
"""

from turing.errors import InputValueError

TRAIN, VALIDATION = "train", "validation"     # the two sets, each a folder of OUT


class CorpusError(InputValueError):
    """Input that cannot be read as its layout; the message names the file (and record or byte)."""


class PrepareDataError(InputValueError):
    """Bad input or settings; the message names the file or flag and what was expected."""


class InputNotFoundError(PrepareDataError, FileNotFoundError):
    """An input path, or the vocab file, does not exist."""
