"""Caption tokenizers (raydist/data/tokenizer.py): the subword tokenizer round-trips, trains deterministically,
maps unseen characters to [UNK], truncates and pads as the word vocab does, counts truncated captions; the
`raydist tokenizer` command saves it in the dataset, and it travels into checkpoints."""

from __future__ import annotations

import json
import pickle
import shutil
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest
from tokenizers import Tokenizer

from raydist.cli import main
from raydist.data import Vocab, tokenize, validate_dataset
from raydist.data.tokenizer import (
    SUBWORD_SPECIALS,
    SubwordTokenizer,
    attention_mask,
    count_truncated,
    learn_merges,
    train_captions,
    train_tokenizer,
)
from raydist.data.transforms import CaptionTransform
from raydist.tasks import DataInfo

CAPTIONS = [
    "A dog runs on the beach",
    "two dogs play with a red ball",
    "a man rides a bike down the street",
    "children playing in the park near a fountain",
    "a cat sleeps on the warm windowsill",
    "an old man reads a newspaper on a bench",
    "a red bus drives past tall buildings",
] * 3


@pytest.fixture(scope="module")
def wordpiece() -> SubwordTokenizer:
    return train_tokenizer(iter(CAPTIONS), 120, "wordpiece")


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_round_trip_through_the_file_and_pickle(kind, tmp_path):
    tok = train_tokenizer(iter(CAPTIONS), 120, kind)
    tok.save(tmp_path / "tokenizer.json")
    loaded = SubwordTokenizer.load(tmp_path / "tokenizer.json")
    unpickled = pickle.loads(pickle.dumps(tok))
    tokens, lengths = tok.encode_batch(CAPTIONS, 64)
    for other in (loaded, unpickled):
        other_tokens, other_lengths = other.encode_batch(CAPTIONS, 64)
        np.testing.assert_array_equal(other_tokens, tokens)
        np.testing.assert_array_equal(other_lengths, lengths)
    for caption, row, n in zip(CAPTIONS, tokens, lengths, strict=False):
        assert row[0] == SUBWORD_SPECIALS.index("[CLS]") and row[n - 1] == SUBWORD_SPECIALS.index("[SEP]")
        assert tok.decode(row[:n]).split() == caption.lower().split()  # every word seen in training


def naive_bpe(word_counts: dict[str, int], size: int, prefix: str, suffix: str) -> tuple[list[str], list]:
    """BPE as written in the paper: recount every pair after each merge, take the most frequent (ties: the
    smallest pair), merge it left to right in every word."""
    words = {w: [w[0], *(prefix + c for c in w[1:])] for w in word_counts}
    for symbols in words.values():
        symbols[-1] += suffix
    tokens, merges = sorted({t for symbols in words.values() for t in symbols}), []
    while len(tokens) < size:
        counts = Counter()
        for w, symbols in words.items():
            for pair in pairwise(symbols):
                counts[pair] += word_counts[w]
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merged = best[0] + best[1].removeprefix(prefix)
        for w, symbols in words.items():
            out, i = [], 0
            while i < len(symbols):
                if tuple(symbols[i : i + 2]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            words[w] = out
        tokens.append(merged)
        merges.append(best)
    return tokens, merges


@pytest.mark.parametrize(("prefix", "suffix"), [("##", ""), ("", "</w>")])
def test_learnt_merges_match_the_naive_algorithm(prefix, suffix):
    words = Counter(w for c in CAPTIONS for w in c.lower().split())
    words.update({"aaaa": 3, "abab": 2})  # repeated pairs inside one word
    for size in (30, 60, 200):
        assert learn_merges(words, size, prefix=prefix, suffix=suffix) == naive_bpe(
            words, size, prefix, suffix
        )


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_training_is_deterministic(kind):
    first = train_tokenizer(iter(CAPTIONS), 90, kind).tokenizer.to_str()
    for _ in range(3):
        assert train_tokenizer(iter(CAPTIONS), 90, kind).tokenizer.to_str() == first
    assert (
        train_tokenizer(iter(CAPTIONS), 100, kind).tokenizer.to_str() != first
    )  # the file reflects its input


def test_unknown_characters_are_unk(wordpiece):
    unk = SUBWORD_SPECIALS.index("[UNK]")
    tokens, lengths = wordpiece.encode_batch(["a dog ωψ runs", "中文", "a dog", "runs"], 32)
    ids = [row[:n].tolist() for row, n in zip(tokens, lengths, strict=False)]
    assert ids[0] == [*ids[2][:-1], unk, *ids[3][1:]]  # the unseen word alone becomes one [UNK]
    assert tokens[1, : lengths[1]].tolist().count(unk) == lengths[1] - 2  # both CJK characters unknown
    assert unk not in wordpiece.encode_batch(CAPTIONS, 64)[0]


def test_truncation_padding_and_counts_match_a_per_caption_reference(wordpiece):
    raw = Tokenizer.from_str(wordpiece.tokenizer.to_str())
    captions = [*CAPTIONS[:7], "dog " * 30, ""]
    full = [raw.encode(c).ids for c in captions]
    for max_len in (4, 7, 12):
        tokens, lengths = wordpiece.encode_batch(captions, max_len)
        for row, ids in enumerate(full):
            want = ids if len(ids) <= max_len else [*ids[: max_len - 1], ids[-1]]  # [SEP] kept
            assert tokens[row, : lengths[row]].tolist() == want
            assert (tokens[row, lengths[row] :] == wordpiece.pad_id).all()
        assert count_truncated(wordpiece, captions, max_len) == sum(len(ids) > max_len for ids in full)
        np.testing.assert_array_equal(attention_mask(lengths, tokens.shape[1]), tokens != wordpiece.pad_id)
    padded = CaptionTransform(wordpiece, 12).tokens(np.array(captions, dtype=object))
    assert padded["tokens"].shape == (len(captions), 12)


def test_vocab_counts_truncation_as_it_cuts():
    vocab = Vocab.build(CAPTIONS)
    for max_len in (3, 6, 9):
        want = sum(len(tokenize(c)) + 2 > max_len for c in CAPTIONS)
        assert count_truncated(vocab, CAPTIONS, max_len) == want
        assert (vocab.encode_batch(CAPTIONS, max_len)[1] <= max_len).all()


def test_cli_trains_a_tokenizer_to_a_file_and_sets_it_on_the_dataset(tiny_dataset, tmp_path, capsys):
    data = shutil.copytree(tiny_dataset, tmp_path / "data")
    assert "tokenizer.json" not in DataInfo.from_dataset(data).files  # an old dataset stays valid
    out = tmp_path / "bpe.json"
    argv = [
        "tokenizer",
        "train",
        "--data",
        str(data),
        "--vocab-size",
        "150",
        "--kind",
        "bpe",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert "tokenizer" not in json.loads((data / "manifest.json").read_text())  # train writes --out only
    assert f"raydist tokenizer set --data {data} --tokenizer {out}" in capsys.readouterr().out
    assert main(argv) == 2 and "exists" in capsys.readouterr().err  # no silent overwrite
    assert main(["tokenizer", "set", "--data", str(data), "--tokenizer", str(out)]) == 0
    assert json.loads((data / "manifest.json").read_text())["tokenizer"] == "tokenizer.json"
    assert DataInfo.from_dataset(data).files["tokenizer.json"] == data / "tokenizer.json"
    assert validate_dataset(data).problems == []
    want = train_tokenizer(train_captions(tiny_dataset), 150, "bpe").tokenizer.to_str()
    assert SubwordTokenizer.load(data / "tokenizer.json").tokenizer.to_str() == want
    assert main(["tokenizer", "set", "--data", str(data), "--tokenizer", str(tmp_path / "missing.json")]) == 2
    assert "not a readable tokenizer.json" in capsys.readouterr().err
