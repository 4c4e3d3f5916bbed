"""Caption vocabulary: tokenizer, word ↔ id table built from the train split, and caption encoding.

Ids: ``<pad>``=0 ``<start>``=1 ``<end>``=2 ``<unk>``=3, then words by decreasing count (ties by word).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raydist.data.schema import RaydistDataError

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = range(4)
_TOKEN = re.compile(r"[^\W_]+")


def tokenize(text: str) -> list[str]:
    """Lower-case the text and keep maximal runs of letters/digits (any script): ``"A dog's bike!"``
    → ``["a", "dog", "s", "bike"]``. Punctuation, underscores and whitespace separate tokens."""
    return _TOKEN.findall(text.lower())


def _ascii_byte_map() -> np.ndarray:
    """Byte → byte from :func:`tokenize`'s own rule: an ASCII character that is a token when lower-cased
    maps to its lower case (``A-Z`` → ``a-z``, ``a-z``/``0-9`` kept), every other byte to a space."""
    table = np.full(256, ord(" "), dtype=np.uint8)
    for byte in range(128):
        if tokenize(chr(byte)):
            table[byte] = ord(chr(byte).lower())
    return table


_ASCII_BYTE_MAP = _ascii_byte_map()


def _ascii_words_spaced(texts: pa.Array) -> pa.Array:
    """``texts`` (string, no nulls) with each byte mapped by :data:`_ASCII_BYTE_MAP`: on an ASCII caption,
    the lower-cased text with every separator of ``[^\\W_]+`` replaced by a space (same offsets)."""
    _, offsets, data = texts.buffers()
    if data is None:  # no characters at all
        return texts
    spaced = pa.py_buffer(_ASCII_BYTE_MAP[np.frombuffer(data, dtype=np.uint8)])
    return pa.Array.from_buffers(pa.string(), len(texts), [None, offsets, spaced], offset=texts.offset)


def _string_array(captions: Sequence[str] | pa.Array | pa.ChunkedArray) -> pa.Array:
    """Captions as one pyarrow string array; a missing caption (None/null) raises TypeError."""
    if isinstance(captions, pa.ChunkedArray):
        captions = captions.combine_chunks()
    texts = captions if isinstance(captions, pa.Array) else pa.array(captions, pa.string())
    if texts.type != pa.string():
        texts = texts.cast(pa.string())
    if texts.null_count:
        raise TypeError("captions must be strings, got a missing value")
    return texts


class Vocab:
    """Word ↔ id table; ``words[i]`` is the word with id ``i`` and the first four are the specials."""

    pad_id = PAD_ID

    def __init__(self, words: Sequence[str], min_count: int = 1) -> None:
        if tuple(words[:4]) != SPECIALS:
            raise RaydistDataError(f"vocab must start with {SPECIALS}, got {tuple(words[:4])}")
        self.words = list(words)
        self.min_count = min_count
        self.index = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            dupes = sorted(w for w, n in Counter(self.words).items() if n > 1)
            raise RaydistDataError(f"vocab has duplicate words: {dupes[:10]}")

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 1) -> Vocab:
        """Vocab of every token occurring at least ``min_count`` times in ``captions`` (train only)."""
        if min_count < 1:
            raise RaydistDataError(f"min_count must be >= 1, got {min_count}")
        counts = Counter(tok for caption in captions for tok in tokenize(caption))
        kept = sorted(
            (w for w, n in counts.items() if n >= min_count and w not in SPECIALS),
            key=lambda w: (-counts[w], w),
        )
        return cls([*SPECIALS, *kept], min_count)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, caption: str, max_len: int) -> list[int]:
        """``[<start>, w1 … wn, <end>]`` with unknown words as ``<unk>``; when longer than ``max_len``
        the words are cut so that the result has exactly ``max_len`` ids and still ends with ``<end>``."""
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2 (room for <start> and <end>), got {max_len}")
        ids = [self.index.get(tok, UNK_ID) for tok in tokenize(caption)][: max_len - 2]
        return [START_ID, *ids, END_ID]

    def encode_batch(
        self, captions: Sequence[str] | pa.Array | pa.ChunkedArray, max_len: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encoded captions as int64 ``[B, L]`` right-padded with ``<pad>``=0, L = the longest encoded
        caption in the batch (≤ ``max_len``), and their int64 lengths ``[B]``.

        Row by row the ids of :meth:`encode` (the reference): ASCII captions are tokenised, looked up and
        padded in one vectorised pass (pyarrow compute + numpy); any other caption goes through
        :meth:`encode`, so Unicode lower-casing and letter/digit classes stay Python's."""
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2 (room for <start> and <end>), got {max_len}")
        texts = _string_array(captions)
        n = len(texts)
        is_ascii = pc.string_is_ascii(texts).to_numpy(zero_copy_only=False)
        rows, ids = self._ascii_word_ids(texts)
        keep = is_ascii[rows]
        rows, ids = rows[keep], ids[keep]
        counts = np.bincount(rows, minlength=n)
        position = np.arange(len(rows)) - (np.cumsum(counts) - counts)[rows]  # word index within its caption
        keep = position < max_len - 2
        rows, ids, position = rows[keep], ids[keep], position[keep]
        lengths = np.minimum(counts, max_len - 2).astype(np.int64) + 2
        others = {int(i): self.encode(texts[int(i)].as_py(), max_len) for i in np.flatnonzero(~is_ascii)}
        for i, encoded in others.items():
            lengths[i] = len(encoded)
        tokens = np.full((n, int(lengths.max(initial=0))), PAD_ID, dtype=np.int64)
        tokens[:, :1] = START_ID
        tokens[rows, position + 1] = ids
        tokens[np.arange(n), lengths - 1] = END_ID
        for i, encoded in others.items():
            tokens[i] = PAD_ID
            tokens[i, : len(encoded)] = encoded
        return tokens, lengths

    def _ascii_word_ids(self, texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Every word of every caption under the ASCII rule (lower-case, maximal ``[a-z0-9]`` runs) as
        (row, vocab id) int64 arrays in caption order; unknown words are ``<unk>``. Non-ASCII captions
        get meaningless words here (their bytes ≥ 128 are separators); the caller replaces them."""
        words = pc.ascii_split_whitespace(_ascii_words_spaced(texts))
        flat = words.flatten()
        nonempty = pc.not_equal(pc.binary_length(flat), 0)  # around leading/trailing separators
        rows = pc.filter(pc.list_parent_indices(words), nonempty).to_numpy().astype(np.int64)
        ids = pc.index_in(pc.filter(flat, nonempty), value_set=self._word_array)
        return rows, pc.fill_null(ids, UNK_ID).to_numpy().astype(np.int64)

    @cached_property
    def _word_array(self) -> pa.Array:
        return pa.array(self.words, pa.string())

    def decode(self, ids: Iterable[int]) -> str:
        """Words for ``ids`` joined by spaces, stopping at ``<end>``, skipping ``<start>``/``<pad>``."""
        out = []
        for i in ids:
            if i == END_ID:
                break
            if i not in (START_ID, PAD_ID):
                out.append(self.words[i])
        return " ".join(out)

    def save(self, path: str | Path) -> None:
        """Write ``{"min_count", "tokenizer", "words"}`` as JSON."""
        doc = {
            "min_count": self.min_count,
            "tokenizer": _TOKEN.pattern + " on lower-cased text",
            "words": self.words,
        }
        Path(path).write_text(json.dumps(doc, indent=0, ensure_ascii=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Vocab:
        """Read a vocab written by :meth:`save`; a missing or malformed file raises RaydistDataError."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError as e:
            raise RaydistDataError(f"{path}: vocab file missing") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RaydistDataError(f"{path}: not valid JSON: {e}") from e
        words = doc.get("words") if isinstance(doc, dict) else None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise RaydistDataError(f"{path}: field 'words': expected a list of strings")
        try:
            return cls(words, int(doc.get("min_count", 1)))
        except RaydistDataError as e:
            raise RaydistDataError(f"{path}: field 'words': {e}") from e
