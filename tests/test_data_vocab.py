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


TRICKY_CAPTIONS = [
    "A Dog's  bike_2, naïve!",  # punctuation, underscore, a non-ASCII letter
    "",  # empty
    "   ",  # separators only
    "__init__ snake_case CamelCase",  # underscores separate
    "one\ttwo\nthree\x00four\x7ffive",  # control characters
    "İstanbul ΟΔΟΣ Straße ǅemal",  # Python's full lower-casing: İ → i + U+0307, final sigma, titlecase ǅ
    "cafe\u0301 e\u0301te\u0301",  # combining accents (not letters: they separate)
    "日本語の テスト 한국어 עברית العربية",  # other scripts
    "٣٤ ²³ ① Ⅻ １２３ 12ab 0x1F",  # digits and numbers of other scripts, full-width digits
    "emoji 😀🐶 dog🐶cat 👍🏽 ok",  # emoji (symbols: separators)
    "one " * 80,  # longer than any max_len
    "ONE Two tHrEe zebra",  # upper case and an unknown word
]


def reference_batch(vocab, captions, max_len):
    """encode_batch's contract written with the single-caption reference :meth:`Vocab.encode`."""
    encoded = [vocab.encode(c, max_len) for c in captions]
    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    tokens = np.zeros((len(encoded), int(lengths.max(initial=0))), dtype=np.int64)
    for row, ids in enumerate(encoded):
        tokens[row, : len(ids)] = ids
    return tokens, lengths


def assert_same_batch(got, want):
    assert got[0].dtype == np.int64 and got[1].dtype == np.int64
    assert got[0].shape == want[0].shape
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("max_len", [2, 3, 5, 12, 48])
def test_encode_batch_equals_encode_on_tricky_captions(max_len):
    import pyarrow as pa

    extra = "i stanbul οδος οδοσ straße ǆemal 日本語の ٣٤ ²³ １２３ dog cat one two"
    vocab = Vocab.build([*TRICKY_CAPTIONS, extra])
    want = reference_batch(vocab, TRICKY_CAPTIONS, max_len)
    assert_same_batch(vocab.encode_batch(TRICKY_CAPTIONS, max_len), want)
    assert_same_batch(vocab.encode_batch(np.array(TRICKY_CAPTIONS, dtype=object), max_len), want)
    assert_same_batch(vocab.encode_batch(pa.array(TRICKY_CAPTIONS), max_len), want)
    chunked = pa.chunked_array([TRICKY_CAPTIONS[:5], TRICKY_CAPTIONS[5:]])
    assert_same_batch(vocab.encode_batch(chunked, max_len), want)
    assert_same_batch(
        vocab.encode_batch(pa.array(TRICKY_CAPTIONS)[3:], max_len),
        reference_batch(vocab, TRICKY_CAPTIONS[3:], max_len),
    )
    for caption in TRICKY_CAPTIONS:  # one caption at a time: the batch's width is its own
        assert_same_batch(vocab.encode_batch([caption], max_len), reference_batch(vocab, [caption], max_len))


def test_encode_batch_equals_encode_on_random_strings():
    rng = np.random.default_rng(0)
    alphabet = list("abzAZ0189 _-'.,!\t\n") + ["é", "İ", "Σ", "ß", "😀", "٣", "\u0301", "日", "ǅ", "²"]
    vocab = Vocab.build(["a b z ab ba 0 1 89 a0 é ß σ ς 日 ٣ ǆ"])
    for _ in range(200):
        captions = ["".join(rng.choice(alphabet, rng.integers(0, 25))) for _ in range(rng.integers(1, 12))]
        max_len = int(rng.integers(2, 9))
        assert_same_batch(vocab.encode_batch(captions, max_len), reference_batch(vocab, captions, max_len))


def test_encode_batch_edge_cases():
    vocab = Vocab.build(["one two"])
    tokens, lengths = vocab.encode_batch([], 5)
    assert tokens.shape == (0, 0) and lengths.shape == (0,)
    with pytest.raises(ValueError):
        vocab.encode_batch(["one"], 1)
    with pytest.raises(TypeError):
        vocab.encode_batch(["one", None], 5)
