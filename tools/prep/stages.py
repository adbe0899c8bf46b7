"""The document stages a run turns on (near duplicates, decontamination, language, quality), run on
each document the exact-duplicate filter kept, in input order: what each removed and why
(stats.json's `filters`), and with --keep_filtered DIR the removed documents themselves, one jsonl
file a stage (and a part, with --num_parts), for a person to read.

A stage is a callable `stage(set name, document number, document, text) -> (document, removal)`,
`text` the document as the workers will read it (document_text: a MediaWiki page without its
markup, reduced here once for all the stages that look at text, `needs_text`): the document kept
as it was, or cut (a shorter document), or None when dropped; `removal` is None for a document
left whole, else Removal(rule, text removed). A stage decides and changes nothing; each has a
`name`, and `counts` (rule -> documents dropped, or cut) that DocumentStages keeps. No stage sees
another part's documents (--num_parts) or an exact duplicate the exact filter left out, so with
every stage off the pipeline is the one without them. Near duplicates come first (their pass saw
every document): a group whose first document a later stage drops loses the others too, as they
would mostly fail it as well.

Where they run: in the reader process (tools/prep/reader.py), which deals the documents into
chunks in input order; the decisions of the stages that read the text (decontamination, language,
quality: a few MB/s of text a core) are made by --stage_workers processes beside it, a few
batches ahead, and taken back in input order, so that the reader does not bound a run on many
cores. Who decides changes nothing: the counts, the files and the documents kept are the same.
"""
import json
import os
from typing import NamedTuple

from tools.prep.documents import Wikitext
from tools.prep.sentences import wikitext_to_text


class Removal(NamedTuple):
    rule: str        # which rule removed it: a quality rule's name, "ngram_13", "language", ...
    text: str        # what was removed: the whole document, or the lines cut


def document_text(document):
    """A document as one string, as the workers will read it: a list of sentences one a line, a
    MediaWiki page's wikitext without its markup (templates, tables, references: what the shards
    never hold; the C4 rule against "{" would drop every page that has a template)."""
    if isinstance(document, list):
        return "\n".join(document)
    return wikitext_to_text(document) if isinstance(document, Wikitext) else str(document)


class DocumentStages:
    """The stages in order; a document one of them drops goes no further. `keep_filtered`: a folder
    for the removed documents (written as .tmp files there, renamed into place by `install`, so a
    run that stops leaves the files of the last run that finished)."""

    def __init__(self, stages, keep_filtered=None, part=None):
        self.stages = list(stages)
        self.keep_filtered = keep_filtered
        self.suffix = f".part{part:03d}.jsonl" if part is not None else ".jsonl"   # parts share DIR
        self._files = {}
        self._by_name = {stage.name: stage for stage in self.stages}
        self._by_set = {stage.name: {} for stage in self.stages}   # stage -> set name -> rule -> documents
        if keep_filtered is not None:
            os.makedirs(keep_filtered, exist_ok=True)

    def __bool__(self):
        return bool(self.stages)

    def __call__(self, set_name, number, document):
        """The document as the stages leave it (None: dropped), counted and written."""
        return self.apply(set_name, number, self.decide(set_name, number, document))

    def staged(self, items):
        """`items`: (set name, document number, key, document or None, input bytes) in input order;
        yields them with each document as the stages leave it (None: dropped), decided here
        (reader.StageWorkers.staged decides in processes of its own)."""
        for name, number, key, document, nbytes in items:
            yield name, number, key, None if document is None else self(name, number, document), nbytes

    def decide(self, set_name, number, document):
        """(the document as the stages leave it or None, [(stage name, Removal, cut)]): what the
        stages do to it, changing nothing (a stage worker's part)."""
        text, removals = None, []
        for stage in self.stages:
            if text is None and stage.needs_text:
                text = document_text(document)
            kept, removal = stage(set_name, number, document, text)
            if removal is not None:
                removals.append((stage.name, removal, kept is not None))
            if kept is None:
                return None, removals
            if kept is not document:      # cut: the later stages look at what is left
                document, text = kept, None
        return document, removals

    def apply(self, set_name, number, decided):
        """Count and write (--keep_filtered) what `decide` found; returns the document kept."""
        document, removals = decided
        for stage_name, removal, cut in removals:
            for counts in (self._by_name[stage_name].counts, self._by_set[stage_name].setdefault(set_name, {})):
                counts[removal.rule] = counts.get(removal.rule, 0) + 1
            self._write(stage_name, set_name, number, removal, cut)
        return document

    def reads_text(self):
        """Whether a stage reads the documents' text (the ones worth stage workers)."""
        return any(stage.needs_text for stage in self.stages)

    def counts(self):
        """stats.json's `filters`: per stage, the documents each rule removed (or cut), in all and
        from each set that lost any (`by_set`), and the stage's settings (`info`)."""
        return {stage.name: {"removed": dict(sorted(stage.counts.items())),
                             "by_set": {name: dict(sorted(rules.items()))
                                        for name, rules in sorted(self._by_set[stage.name].items())},
                             **getattr(stage, "info", {})}
                for stage in self.stages}

    def _write(self, stage_name, set_name, number, removal, cut):
        if self.keep_filtered is None:
            return
        f = self._files.get(stage_name)
        if f is None:
            f = self._files[stage_name] = open(self._tmp(stage_name), "w", encoding="utf-8")
        f.write(json.dumps({"document": number, "set": set_name, "rule": removal.rule, "cut": cut,
                            "text": removal.text}, ensure_ascii=False) + "\n")

    def install(self):
        """Move the removed documents' files into --keep_filtered (a stage that removed nothing: an
        empty file, so the folder always says which stages ran); returns their paths ([] without
        --keep_filtered)."""
        if self.keep_filtered is None:
            return []
        self.close()
        installed = []
        for stage in self.stages:
            path = self._tmp(stage.name)
            if not os.path.exists(path):
                open(path, "w").close()
            installed.append(os.path.join(self.keep_filtered, stage.name + self.suffix))
            os.replace(path, installed[-1])
        return installed

    def _tmp(self, stage_name):
        return os.path.join(self.keep_filtered, f".{stage_name}{self.suffix}.tmp")

    def close(self):
        for f in self._files.values():
            f.close()
        self._files = {}
