"""Vocab: tokenizer, train-only construction, special ids, encoding and persistence."""

from __future__ import annotations

import numpy as np
import pytest

from raydist.data import RaydistDataError, Vocab, make_synthetic, split_arrays, tokenize


def test_tokenize_lowercases_and_splits_on_non_word_characters():
    assert tokenize("A Dog's  bike_2, naïve!") == ["a", "dog", "s", "bike", "2", "naïve"]


def test_build_specials_min_count_and_order():
    vocab = Vocab.build(["b a a", "c b a", "d"], min_count=2)
    assert vocab.words == ["<pad>", "<start>", "<end>", "<unk>", "a", "b"]  # a:3, b:2; c, d dropped
    assert len(vocab) == 6


def test_encode_truncates_keeping_end_and_maps_unknown():
    vocab = Vocab.build(["one two three four"])
    one, two, three = (vocab.index[w] for w in ("one", "two", "three"))
    assert vocab.encode("One two ZEBRA", 10) == [1, one, two, 3, 2]
    assert vocab.encode("one two three four", 4) == [1, one, two, 2]
    assert vocab.encode("", 5) == [1, 2]
    with pytest.raises(ValueError):
        vocab.encode("one", 1)
    assert vocab.decode(vocab.encode("one Three", 8)) == "one three"
    tokens, lengths = vocab.encode_batch(["one", "three two one four", "two two"], 5)
    np.testing.assert_array_equal(lengths, [3, 5, 4])
    np.testing.assert_array_equal(tokens, [[1, one, 2, 0, 0], [1, three, two, one, 2], [1, two, two, 2, 0]])
    assert tokens.dtype == np.int64 and lengths.dtype == np.int64


def test_save_load_round_trip_and_errors(tmp_path):
    vocab = Vocab.build(["x y", "y"], min_count=1)
    vocab.save(tmp_path / "v.json")
    loaded = Vocab.load(tmp_path / "v.json")
    assert loaded.words == vocab.words and loaded.min_count == 1
    (tmp_path / "bad.json").write_text('{"words": ["a", "b"]}')
    with pytest.raises(RaydistDataError, match="bad.json.*must start with"):
        Vocab.load(tmp_path / "bad.json")
    with pytest.raises(RaydistDataError, match="missing"):
        Vocab.load(tmp_path / "none.json")


def test_dataset_vocab_comes_from_train_only(tmp_path):
    out = make_synthetic(tmp_path / "ds", images=16, val_images=8, test_images=8, dim=4)
    vocab = Vocab.load(out / "vocab.json")
    train_words = {t for c in split_arrays(out, "train")[3] for t in tokenize(c)}
    test_words = {t for c in split_arrays(out, "test")[3] for t in tokenize(c)}
    only_test = sorted(test_words - train_words)
    assert only_test, "tiny split sizes should leave some test-only words"
    assert set(vocab.words[4:]) == train_words
    assert all(vocab.encode(w, 3)[1] == 3 for w in only_test)  # <unk>
