"""Caption tokenizers behind one interface: the word :class:`~raydist.data.vocab.Vocab` or a subword
``tokenizers`` tokenizer (WordPiece/BPE trained on the train split, or any ``tokenizer.json``) saved in the dataset.

Both give ``encode_batch(captions, max_len) -> (tokens [B, L] int64 right-padded with ``pad_id``, lengths [B])``;
the attention mask is ``arange(L) < lengths`` (:func:`attention_mask`). A caption longer than ``max_len`` is cut
to exactly ``max_len`` ids, its closing special token kept; :func:`count_truncated` counts such captions."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from raydist.data.manifest import Manifest, load_manifest, manifest_or_load, write_manifest
from raydist.data.schema import CAPTION, CAPTIONS, RaydistDataError
from raydist.data.vocab import PAD_ID, Vocab
from raydist.data.webdataset import read_shard, shard_columns

TOKENIZER_NAME = "tokenizer.json"
SUBWORD_SPECIALS = (
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
)  # ids 0-3 of the tokenizers :func:`train_tokenizer` makes

UNLIMITED = 1 << 30  # a max_len that truncates nothing


class CaptionTokenizer(Protocol):
    """What the data path and the models need of a tokenizer."""

    pad_id: int

    def __len__(self) -> int: ...

    def encode_batch(
        self, captions: Sequence[str] | pa.Array | np.ndarray, max_len: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Token ids [B, L] (L ≤ ``max_len``, the longest in the batch) right-padded with ``pad_id``, lengths [B]."""
        ...


class SubwordTokenizer:
    """A ``tokenizers.Tokenizer`` (its normaliser, pre-tokeniser, model and post-processor as saved) with
    truncation to ``max_len`` done by the library (special tokens of the post-processor kept) and padding here."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self._truncating: dict[int, Tokenizer] = {}  # max_len → a copy that truncates there
        pad = next((t for t in ("[PAD]", "<pad>") if tokenizer.token_to_id(t) is not None), None)
        self.pad_id = tokenizer.token_to_id(pad) if pad else PAD_ID

    @classmethod
    def load(cls, path: str | Path) -> SubwordTokenizer:
        """Read a ``tokenizer.json``; a missing or unreadable file raises RaydistDataError."""
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as err:  # tokenizers raises plain Exception for a bad file
            raise RaydistDataError(f"{path}: not a readable tokenizer.json ({err})") from err

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def __getstate__(self) -> dict[str, str]:  # pickled into Ray Data workers as its JSON
        return {"json": self.tokenizer.to_str()}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.__init__(Tokenizer.from_str(state["json"]))

    def encode_batch(
        self, captions: Sequence[str] | pa.Array | np.ndarray, max_len: int
    ) -> tuple[np.ndarray, np.ndarray]:
        if max_len < 2:
            raise ValueError(f"max_len must be >= 2 (room for the special tokens), got {max_len}")
        texts = (
            captions.to_pylist()
            if isinstance(captions, (pa.Array, pa.ChunkedArray))
            else [str(c) for c in captions]
        )
        encoded = self._truncating_at(max_len).encode_batch(texts)
        lengths = np.array([len(e.ids) for e in encoded], dtype=np.int64)
        tokens = np.full((len(encoded), int(lengths.max(initial=0))), self.pad_id, dtype=np.int64)
        for row, e in enumerate(encoded):
            tokens[row, : len(e.ids)] = e.ids
        return tokens, lengths

    def _truncating_at(self, max_len: int) -> Tokenizer:
        """The tokenizer with the library's truncation at ``max_len`` (none at :data:`UNLIMITED`)."""
        if max_len >= UNLIMITED:
            return self.tokenizer
        if max_len not in self._truncating:
            tok = Tokenizer.from_str(self.tokenizer.to_str())
            tok.enable_truncation(max_len)
            self._truncating[max_len] = tok
        return self._truncating[max_len]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (special tokens skipped)."""
        return self.tokenizer.decode([int(i) for i in ids])

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as ``tokenizer.json``."""
        self.tokenizer.save(str(path))


def attention_mask(lengths: np.ndarray, width: int) -> np.ndarray:
    """``mask[b, t] = t < lengths[b]`` (bool [B, width]): True on real tokens, False on padding."""
    return np.arange(width)[None, :] < np.asarray(lengths)[:, None]


def count_truncated(tokenizer: CaptionTokenizer, captions: Sequence[str] | pa.Array, max_len: int) -> int:
    """How many ``captions`` encode to more than ``max_len`` ids (and are cut by ``encode_batch``)."""
    _, lengths = tokenizer.encode_batch(captions, UNLIMITED)
    return int((lengths > max_len).sum())


def train_tokenizer(
    captions: Iterable[str], vocab_size: int, kind: Literal["wordpiece", "bpe"] = "wordpiece"
) -> SubwordTokenizer:
    """A lower-casing WordPiece or BPE ``tokenizers`` tokenizer of at most ``vocab_size`` tokens learnt from
    ``captions`` (an iterator; nothing is written): BERT's normaliser and pre-tokeniser, specials ``[PAD]``=0
    ``[UNK]``=1 ``[CLS]``=2 ``[SEP]``=3, encodings ``[CLS] … [SEP]``, characters never seen in training → ``[UNK]``.
    The merges are learnt by :func:`learn_merges`, not the library's trainers: those break ties between equally
    frequent pairs in hash-map order, so the same captions could give different tokenizers."""
    if kind not in ("wordpiece", "bpe"):
        raise ValueError(f"tokenizer kind {kind!r}: expected wordpiece or bpe")
    if vocab_size <= len(SUBWORD_SPECIALS):
        raise ValueError(f"vocab_size must be > {len(SUBWORD_SPECIALS)}, got {vocab_size}")
    unk, cls, sep = SUBWORD_SPECIALS[1:]
    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    words = Counter(
        word
        for caption in captions
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(caption))
    )
    prefix, suffix = ("##", "") if kind == "wordpiece" else ("", "</w>")
    tokens, merges = learn_merges(words, vocab_size - len(SUBWORD_SPECIALS), prefix=prefix, suffix=suffix)
    vocab = {t: i for i, t in enumerate([*SUBWORD_SPECIALS, *tokens])}
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(vocab, unk_token=unk))
        tok.decoder = decoders.WordPiece()
    else:
        tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, end_of_word_suffix=suffix))
        tok.decoder = decoders.BPEDecoder(suffix=suffix)
    tok.add_special_tokens(list(SUBWORD_SPECIALS))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])]
    )
    return SubwordTokenizer(tok)


def learn_merges(
    word_counts: Mapping[str, int], size: int, *, prefix: str = "", suffix: str = ""
) -> tuple[list[str], list[tuple[str, str]]]:
    """BPE (Sennrich et al. 2016, Algorithm 1) over counted words: each word starts as its characters, every
    character after the first marked with ``prefix`` (WordPiece's ``##``) and the last with ``suffix`` (``</w>``);
    the most frequent adjacent pair is merged until the alphabet plus the merged tokens number ``size`` or no pair
    is left. Ties go to the smallest pair of strings. Returns the tokens (alphabet sorted, then merged tokens in
    merge order) and the merges."""
    words: list[list[str]] = []
    counts: list[int] = []
    for word, count in sorted(word_counts.items()):
        symbols = [word[0], *(prefix + c for c in word[1:])]
        symbols[-1] += suffix
        words.append(symbols)
        counts.append(count)
    tokens = sorted({s for symbols in words for s in symbols})
    pair_counts: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, symbols in enumerate(words):
        for pair in pairwise(symbols):
            pair_counts[pair] += counts[i]
            where.setdefault(pair, set()).add(i)
    heap = [(-n, pair) for pair, n in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while len(tokens) < size and heap:
        negative, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative or -negative <= 0:
            continue  # a stale entry: the pair's count changed since it was pushed
        left, right = pair
        merged = left + (right[len(prefix) :] if prefix and right.startswith(prefix) else right)
        merges.append(pair)
        tokens.append(merged)
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop(pair, ())):
            old = words[i]
            for p in pairwise(old):
                pair_counts[p] -= counts[i]
                changed.add(p)
            new, j = [], 0
            while j < len(old):
                if j + 1 < len(old) and (old[j], old[j + 1]) == pair:
                    new.append(merged)
                    j += 2
                else:
                    new.append(old[j])
                    j += 1
            words[i] = new
            for p in pairwise(new):
                pair_counts[p] += counts[i]
                where.setdefault(p, set()).add(i)
                changed.add(p)
        pair_counts.pop(pair, None)
        for p in sorted(changed - {pair}):
            if pair_counts[p] > 0:
                heapq.heappush(heap, (-pair_counts[p], p))
    return tokens, merges


def load_caption_tokenizer(files: dict[str, Path], kind: Literal["vocab", "subword"]) -> CaptionTokenizer:
    """The tokenizer among a dataset's or checkpoint's extra ``files``: ``vocab.json`` or ``tokenizer.json``."""
    if kind == "vocab":
        return Vocab.load(files["vocab.json"])
    if TOKENIZER_NAME not in files:
        raise RaydistDataError(
            f"no {TOKENIZER_NAME} in the dataset: make one with `raydist tokenizer train --data DIR "
            "--vocab-size N` or `raydist tokenizer set --data DIR --tokenizer FILE`"
        )
    return SubwordTokenizer.load(files[TOKENIZER_NAME])


def train_captions(data_dir: str | Path, *, manifest: Manifest | None = None) -> Iterator[str]:
    """The train split's captions, shard by shard (a ``caption`` column, or every caption of a ``captions`` list);
    ``manifest``: the folder's, when read already."""
    for shard in manifest_or_load(data_dir, manifest).splits["train"].shards:
        file = Path(data_dir) / shard.file
        table = read_shard(file, [c for c in (CAPTION, CAPTIONS) if c in shard_columns(file)])
        for name in table.column_names:
            column = table.column(name)
            yield from (column.combine_chunks().flatten() if name == CAPTIONS else column).to_pylist()


def save_dataset_tokenizer(data_dir: str | Path, tokenizer: SubwordTokenizer) -> Path:
    """Write ``tokenizer`` as the dataset's ``tokenizer.json`` and name it in the manifest (a pairs dataset)."""
    data_dir = Path(data_dir)
    manifest = load_manifest(data_dir)
    if manifest.task != "pairs":
        raise RaydistDataError(
            f"{data_dir}: a tokenizer is for caption datasets (task 'pairs'), not {manifest.task!r}"
        )
    path = data_dir / TOKENIZER_NAME
    tokenizer.save(path)
    write_manifest(data_dir, replace(manifest, tokenizer=TOKENIZER_NAME))
    return path


def train_dataset_tokenizer(
    data_dir: str | Path, vocab_size: int, kind: Literal["wordpiece", "bpe"] = "wordpiece"
) -> SubwordTokenizer:
    """:func:`train_tokenizer` on the dataset's train captions, saved as its ``tokenizer.json``."""
    tokenizer = train_tokenizer(train_captions(data_dir), vocab_size, kind)
    save_dataset_tokenizer(data_dir, tokenizer)
    return tokenizer


def set_dataset_tokenizer(data_dir: str | Path, file: str | Path) -> SubwordTokenizer:
    """A given ``tokenizer.json`` (e.g. a pretrained model's) copied into the dataset as its tokenizer."""
    tokenizer = SubwordTokenizer.load(file)
    save_dataset_tokenizer(data_dir, tokenizer)
    return tokenizer
