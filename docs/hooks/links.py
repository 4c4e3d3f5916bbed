"""MkDocs hook: a link to ``../bench/RESULTS.md`` (the append-only history, outside ``docs/``) is right on GitHub,
where the pages are read as files; in the site it points at ``history.md``, the page that includes that file."""

import posixpath
import re

_RESULTS = re.compile(r"\]\((?:\.\./)+bench/RESULTS\.md(#[^)\s]*)?\)")


def on_page_markdown(markdown, page, config, files):
    here = posixpath.dirname(page.file.src_uri)
    target = posixpath.relpath("history.md", here or ".")
    return _RESULTS.sub(lambda m: f"]({target}{m.group(1) or ''})", markdown)
