"""Language identification (--languages CODE...): a document is kept when py3langid names one of
the codes as its language, else dropped (counted by the language it was taken for).

py3langid (a maintained fork of langid.py, Lui and Baldwin 2012: a naive Bayes model over byte
n-grams of 97 languages' text, more in later releases) ships its model inside the package, so nothing
is downloaded at run time. Chosen by measurement (bench/README.md): on 3,200 held-out sentences of
16 languages it was nearly as accurate as lingua (0.968 against 0.973) at ten times lingua's speed, in a
1 MB wheel against lingua's 96 MB. The first LANGUAGE_CHARS characters of a document decide (the
model's cost is linear in the text; a page rarely changes language after that)."""
import functools
import importlib

from tools.prep import PrepareDataError
from tools.prep.stages import Removal

LANGUAGE_CHARS = 2_000


@functools.lru_cache(maxsize=1)
def load_identifier():
    """py3langid's identifier over every language of its model (limiting it to --languages would
    give every other language's text one of those); loaded once a process (1.7 s: the model is
    xz-compressed), never changed after."""
    try:
        langid = importlib.import_module("py3langid.langid")
    except ImportError:
        raise PrepareDataError("--languages needs py3langid: pip install 'py3langid>=0.4'") from None
    return langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE)


class LanguageFilter:
    """The stage: keep the documents of --languages."""

    name = "language"
    needs_text = True

    def __init__(self, languages, identifier=None):
        self.identifier = identifier or load_identifier()
        known = set(self.identifier.nb_classes)
        unknown = [code for code in languages if code not in known]
        if unknown:
            raise PrepareDataError(f"--languages {' '.join(unknown)}: not a language the model knows; use ISO "
                                   f"639-1 codes among {', '.join(sorted(known))}")
        self.languages = frozenset(languages)
        self.counts = {}

    def __call__(self, set_name, number, document, text):
        language = self.identifier.classify(text[:LANGUAGE_CHARS])[0]
        if language in self.languages:
            return document, None
        return None, Removal(f"language_{language}", text)
