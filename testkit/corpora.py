"""The same documents written in every input layout tools/prepare_data.py reads (tests and
bench/bench_prepare.py): a MediaWiki export (markup, a redirect, a talk page), WikiExtractor
output, JSON lines, parquet, a `datasets` save_to_disk folder, plain text.

A document is (title, paragraphs); the layouts hold its text exactly (the MediaWiki one with
markup that reduces to it), so every reader must give the same documents back. Writers take
any iterable of documents and stream it (a bench corpus of hundreds of MB is never held).
"""
import bz2
import functools
import gzip
import json
import os
import random
from xml.sax.saxutils import escape

WORDS = ("the river town bridge castle people north south old new king war year church school city village "
         "road market station island lake forest mountain valley house family book song team game music film "
         "first second great small large long short early late many few built opened closed named moved "
         "grew lived worked studied wrote played won lost found known called became made took gave").split()
EXPORT_NS = "http://www.mediawiki.org/xml/export-0.11/"


def synthetic_documents(count, seed=0, paragraphs=(2, 5), sentences=(2, 6), words=(6, 22)):
    """`count` documents of random English-like sentences (seeded), generated one at a time."""
    rng = random.Random(seed)
    for d in range(count):
        doc = []
        for _ in range(rng.randint(*paragraphs)):
            sents = []
            for _ in range(rng.randint(*sentences)):
                ws = [rng.choice(WORDS) for _ in range(rng.randint(*words))]
                sents.append(" ".join(ws).capitalize() + rng.choice(".....?!"))
            doc.append(" ".join(sents))
        yield f"Article {seed}-{d}", doc


def wikitext(index, paragraphs):
    """Wikitext whose plain text is `paragraphs`: an infobox, bold, links, references, a table, a
    heading, a file, categories and an interlanguage link around them."""
    out = ["{{Infobox place\n| name = Place %d\n| area = {{convert|%d|km2}}\n| image = Map.png\n}}" % (index, index)]
    for p, text in enumerate(paragraphs):
        words = text.split(" ")
        if len(words) > 5:
            words[0] = f"'''{words[0]}'''"
            words[2] = f"[[{words[2]}]]"
            words[4] = f"[[Some page {index}|{words[4]}]]"
        text = " ".join(words)
        cut = text.find(". ")
        if cut > 0:                    # a reference after the first sentence
            text = text[:cut + 1] + '<ref name="r%d">{{cite book |title=Book %d |page=%d}}</ref>' % (p, index, p) \
                + text[cut + 1:]
        out.append(text + "{{citation needed|date=May 2020}}<ref name=\"r0\" />")
        if p == 0:
            out.append('{| class="wikitable"\n! Year !! Count\n|-\n| 1900 || 12\n|-\n| {{n/a}} || 13\n|}')
            out.append("== History ==")
        if p == 1:
            out.append("[[File:Picture %d.jpg|thumb|left|A caption of the picture]]" % index)
    out.append("<!-- a comment -->\n[[Category:Places]]\n[[Category:Test pages|Sort key]]\n[[de:Ort %d]]" % index)
    return "\n\n".join(out)


def _page(title, ns, text, page_id, redirect=None):
    redirect = f'    <redirect title="{escape(redirect)}" />\n' if redirect else ""
    return (f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n{redirect}"
            f"    <revision>\n      <id>{page_id + 1000}</id>\n      <model>wikitext</model>\n"
            f'      <text bytes="{len(text)}" xml:space="preserve">{escape(text)}</text>\n    </revision>\n  </page>\n')


def mediawiki_parts(documents, extra_pages=True):
    """The parts of an export: header, then pages (one string each), then the footer. With
    `extra_pages` a talk page and a redirect come after the first article."""
    yield (f'<mediawiki xmlns="{EXPORT_NS}" version="0.11" xml:lang="en">\n  <siteinfo>\n'
           "    <sitename>Testpedia</sitename>\n    <namespaces>\n"
           '      <namespace key="0" case="first-letter" />\n      <namespace key="1" case="first-letter">Talk</namespace>\n'
           "    </namespaces>\n  </siteinfo>\n")
    for i, (title, paragraphs) in enumerate(documents):
        yield _page(title, 0, wikitext(i, paragraphs), 10 * i + 1)
        if i == 0 and extra_pages:
            yield _page(f"Talk:{title}", 1, "This talk page text must not be read. ~~~~", 2)
            yield _page(f"Other name of {title}", 0, f"#REDIRECT [[{title}]] {{{{R from move}}}}", 3,
                        redirect=title)
    yield "</mediawiki>\n"


def write_mediawiki(path, documents, multistream=False, pages_per_stream=100):
    """A MediaWiki export: .xml, .xml.bz2 (one stream) or, `multistream`, bz2 streams of pages as
    Wikipedia's pages-articles-multistream dumps (header, groups of pages, footer)."""
    parts = mediawiki_parts(documents)
    if path.endswith(".bz2"):
        with open(path, "wb") as f:
            if not multistream:
                comp = bz2.BZ2Compressor()
                for part in parts:
                    f.write(comp.compress(part.encode()))
                f.write(comp.flush())
                return path
            group = []
            for part in parts:
                group.append(part)
                if part.startswith("<mediawiki") or len(group) >= pages_per_stream or part.startswith("</mediawiki"):
                    f.write(bz2.compress("".join(group).encode()))
                    group = []
            if group:
                f.write(bz2.compress("".join(group).encode()))
        return path
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(parts)
    return path


def write_wikiextractor(folder, documents, as_json=False, per_file=50):
    """WikiExtractor's output: folder/AA/wiki_00, wiki_01, ... of <doc> blocks (the title as the
    block's first line, a paragraph a line), or with `as_json` its --json lines."""
    os.makedirs(os.path.join(folder, "AA"), exist_ok=True)
    f = None
    for i, (title, paragraphs) in enumerate(documents):
        if i % per_file == 0:
            if f:
                f.close()
            f = open(os.path.join(folder, "AA", f"wiki_{i // per_file:02d}"), "w", encoding="utf-8")
        url = f"https://en.wikipedia.org/wiki?curid={i + 1}"
        if as_json:
            f.write(json.dumps({"id": str(i + 1), "revid": "1", "url": url, "title": title,
                                "text": "\n".join(paragraphs)}) + "\n")
        else:
            f.write(f'<doc id="{i + 1}" url="{url}" title="{escape(title)}">\n{title}\n\n')
            f.write("\n".join(paragraphs) + "\n</doc>\n")
    if f:
        f.close()
    return folder


def _opener(path):
    if path.endswith(".gz"):
        return gzip.open(path, "wt", encoding="utf-8")
    if path.endswith(".zst"):
        import zstandard

        return zstandard.open(path, "wt", encoding="utf-8")
    if path.endswith(".bz2"):
        return bz2.open(path, "wt", encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def write_jsonl(path, documents, field="text"):
    """JSON lines, one document a record ({"id", "title", field}), compressed by the suffix."""
    with _opener(path) as f:
        for i, (title, paragraphs) in enumerate(documents):
            f.write(json.dumps({"id": i, "title": title, field: "\n".join(paragraphs)}) + "\n")
    return path


def write_parquet(path, documents, field="text", rows_per_group=64):
    """A parquet file, `rows_per_group` documents a row group, written group by group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("title", pa.string()), (field, pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        batch = []
        for title, paragraphs in documents:
            batch.append((title, "\n".join(paragraphs)))
            if len(batch) == rows_per_group:
                writer.write_table(pa.table({"title": [b[0] for b in batch], field: [b[1] for b in batch]},
                                            schema=schema), row_group_size=rows_per_group)
                batch = []
        if batch:
            writer.write_table(pa.table({"title": [b[0] for b in batch], field: [b[1] for b in batch]},
                                        schema=schema), row_group_size=rows_per_group)
    return path


def _hf_rows(make, field):
    for title, paragraphs in make():
        yield {"title": title, field: "\n".join(paragraphs)}


def write_hf(folder, documents, field="text", split=None):
    """A `datasets` save_to_disk folder (a DatasetDict with `split` when given). `documents`: a
    list, or a picklable callable that makes them (a generator cannot be pickled by `datasets`)."""
    import datasets

    datasets.disable_progress_bars()
    make = documents if callable(documents) else functools.partial(iter, list(documents))
    ds = datasets.Dataset.from_generator(_hf_rows, gen_kwargs={"make": make, "field": field},
                                         cache_dir=os.path.join(folder + ".cache"))
    if split:
        ds = datasets.DatasetDict({split: ds})
    ds.save_to_disk(folder)
    return folder


def write_text(path, documents, splitter):
    """One sentence per line, a blank line between documents (sentences by `splitter`)."""
    with open(path, "w", encoding="utf-8") as f:
        for _, paragraphs in documents:
            f.write("\n".join(s for p in paragraphs for s in splitter(p)) + "\n\n")
    return path


def write_text_docs(path, documents):
    """One document a line (its paragraphs joined by spaces)."""
    with open(path, "w", encoding="utf-8") as f:
        for _, paragraphs in documents:
            f.write(" ".join(paragraphs) + "\n")
    return path


def write_hf_cache(cache_dir, name, documents, work):
    """A dataset `name` ("owner/name") as `datasets` keeps a downloaded one in its cache
    (cache_dir/owner___name/default/0.0.0/HASH/name-train.arrow + dataset_info.json), made from
    local JSON lines by `datasets`' own json builder: what an offline load finds."""
    import glob
    import shutil

    import datasets

    datasets.disable_progress_bars()
    data = write_jsonl(os.path.join(work, "hf_cache_source.jsonl"), documents)
    datasets.load_dataset("json", data_files=data, split="train", cache_dir=os.path.join(work, "hf_build"))
    built = [d for d in glob.glob(os.path.join(work, "hf_build", "json", "*", "*", "*")) if os.path.isdir(d)][0]
    target = os.path.join(cache_dir, name.replace("/", "___"), "default", "0.0.0", os.path.basename(built))
    shutil.copytree(built, target)
    short = name.split("/")[-1]
    for f in os.listdir(target):
        if f.startswith("json-"):
            os.rename(os.path.join(target, f), os.path.join(target, f"{short}-{f[len('json-'):]}"))
    return target
