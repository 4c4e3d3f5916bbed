"""Caption vocabulary: tokenizer, word ↔ id table built from the train split, and caption encoding.

Ids: ``<pad>``=0 ``<start>``=1 ``<end>``=2 ``<unk>``=3, then words by decreasing count (ties by word).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from raydist.data.schema import RaydistDataError

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)
PAD_ID, START_ID, END_ID, UNK_ID = range(4)
_TOKEN = re.compile(r"[^\W_]+")


def tokenize(text: str) -> list[str]:
    """Lower-case the text and keep maximal runs of letters/digits (any script): ``"A dog's bike!"``
    → ``["a", "dog", "s", "bike"]``. Punctuation, underscores and whitespace separate tokens."""
    return _TOKEN.findall(text.lower())


class Vocab:
    """Word ↔ id table; ``words[i]`` is the word with id ``i`` and the first four are the specials."""

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
        kept = sorted((w for w, n in counts.items() if n >= min_count and w not in SPECIALS),
                      key=lambda w: (-counts[w], w))
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

    def encode_batch(self, captions: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Encoded captions as int64 ``[B, L]`` right-padded with ``<pad>``=0, L = the longest encoded
        caption in the batch (≤ ``max_len``), and their int64 lengths ``[B]``."""
        encoded = [self.encode(c, max_len) for c in captions]
        lengths = np.array([len(e) for e in encoded], dtype=np.int64)
        tokens = np.full((len(encoded), int(lengths.max(initial=0))), PAD_ID, dtype=np.int64)
        for row, ids in enumerate(encoded):
            tokens[row, : len(ids)] = ids
        return tokens, lengths

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
        doc = {"min_count": self.min_count, "tokenizer": _TOKEN.pattern + " on lower-cased text",
               "words": self.words}
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
