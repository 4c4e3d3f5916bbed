"""Text encoders (raydist/models/text_encoders.py): the registry, masked pooling checked caption by caption
against the unpadded caption, a pretrained HuggingFace model loaded from a local folder, training in-process with
the transformer and a subword tokenizer, and the checkpoint's tokenizer checked at eval."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel

from raydist.cli import main
from raydist.config import ConfigError, load_config, validate
from raydist.data.tokenizer import TOKENIZER_NAME, train_dataset_tokenizer, train_tokenizer
from raydist.models import TextEncoder, build_text_encoder, text_encoder_names
from raydist.models.text_encoders import PretrainedTextEncoder, TransformerTextEncoder, pool_tokens
from raydist.tasks import DataInfo, build_task
from raydist.train.plan import plan_for
from raydist.train.trainer import train_in_process

VOCAB, MAX_LEN, PAD = 40, 12, 0


def _captions(n: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [n, MAX_LEN] of lengths 2..MAX_LEN whose padding holds random non-pad ids (a model
    that looked at padding would see them), and the lengths."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([2, MAX_LEN, 5, 7, 3, 9][:n])
    tokens = torch.randint(1, VOCAB, (n, MAX_LEN), generator=g)
    return tokens, lengths


def _each_alone(encoder: torch.nn.Module, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The brute-force reference: every caption encoded on its own, without any padding."""
    return torch.cat(
        [encoder(tokens[i : i + 1, :n], lengths[i : i + 1]) for i, n in enumerate(lengths.tolist())]
    )


def test_registry_names_and_errors():
    assert text_encoder_names() == ["gru", "hf:", "transformer"]
    gru = build_text_encoder("gru", vocab_size=VOCAB, embed_dim=8, max_len=MAX_LEN, word_dim=4)
    assert isinstance(gru, TextEncoder) and gru.rnn.hidden_size == 8
    with pytest.raises(ValueError, match="unknown text encoder 'lstm'; known: gru, hf:<model>, transformer"):
        build_text_encoder("lstm", vocab_size=VOCAB, embed_dim=8, max_len=MAX_LEN)


def test_pool_tokens_is_the_mean_of_the_real_tokens():
    hidden = torch.randn(4, 6, 3, dtype=torch.float64)
    lengths = torch.tensor([1, 6, 3, 4])
    want = torch.stack([hidden[i, :n].mean(0) for i, n in enumerate(lengths.tolist())])
    torch.testing.assert_close(pool_tokens(hidden, lengths, "mean"), want, rtol=0, atol=1e-15)
    torch.testing.assert_close(pool_tokens(hidden, lengths, "cls"), hidden[:, 0])


@pytest.mark.parametrize("pooling", ["mean", "cls"])
@pytest.mark.parametrize("train", [False, True])
def test_transformer_never_sees_padding(pooling, train):
    torch.manual_seed(0)
    encoder = (
        TransformerTextEncoder(
            VOCAB, 8, max_len=MAX_LEN, pad_id=PAD, layers=2, heads=2, width=16, dropout=0.0, pooling=pooling
        )
        .double()
        .train(train)
    )
    tokens, lengths = _captions()
    out = encoder(tokens, lengths)
    torch.testing.assert_close(out, _each_alone(encoder, tokens, lengths), rtol=1e-10, atol=1e-12)
    assert torch.allclose(out.norm(dim=1), torch.ones(len(out), dtype=torch.float64))
    changed = tokens.clone()
    changed[0, 1] = (changed[0, 1] % (VOCAB - 1)) + 1  # a real token of caption 0 changes its embedding
    assert not torch.allclose(encoder(changed, lengths)[0], out[0])


def test_transformer_size_keys_and_gc_refusal_of_hf():
    cfg = load_config(
        "tiny",
        overrides={
            "model.text_encoder": "transformer",
            "model.text_layers": 3,
            "model.text_heads": 2,
            "model.text_width": 24,
        },
    )
    task_cfg = cfg.model
    assert (task_cfg.text_layers, task_cfg.text_heads, task_cfg.text_width) == (3, 2, 24)
    with pytest.raises(ConfigError, match="must divide by model.text_heads"):
        validate(load_config("tiny", overrides={"model.text_encoder": "transformer", "model.text_heads": 5}))
    validate(load_config("tiny", overrides={"model.text_encoder": "transformer", "gc.measure": True}))
    with pytest.raises(
        ConfigError, match="gradient clustering supports the gru and transformer text encoders"
    ):
        validate(load_config("tiny", overrides={"model.text_encoder": "hf:bert", "gc.sample": True}))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> tuple:
    """A tiny BERT with random weights saved by ``save_pretrained``, its tokenizer.json beside it."""
    folder = tmp_path_factory.mktemp("bert")
    tokenizer = train_tokenizer(["a dog runs on the beach", "two cats sleep on a red bench"] * 2, 40)
    torch.manual_seed(0)
    model = BertModel(
        BertConfig(
            vocab_size=len(tokenizer) + 3,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
        )
    )
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save(folder / TOKENIZER_NAME)
    return folder, model, tokenizer


def test_pretrained_folder_loads_the_saved_weights(pretrained):
    folder, saved, tokenizer = pretrained
    encoder = build_text_encoder(
        f"hf:{folder}", vocab_size=len(tokenizer), embed_dim=8, max_len=MAX_LEN, pooling="mean"
    )
    assert isinstance(encoder, PretrainedTextEncoder)
    encoder.eval()
    ids, lengths = tokenizer.encode_batch(["a dog sleeps", "two red cats on the beach", "a"], MAX_LEN)
    tokens, lengths = torch.as_tensor(ids), torch.as_tensor(lengths)
    mask = (torch.arange(tokens.shape[1])[None] < lengths[:, None]).long()
    with torch.no_grad():
        want = saved(input_ids=tokens, attention_mask=mask).last_hidden_state
        got = encoder.token_states(tokens, lengths)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        pooled = torch.stack([want[i, :n].mean(0) for i, n in enumerate(lengths.tolist())])
        embedding = encoder.proj(pooled)
        torch.testing.assert_close(encoder(tokens, lengths), embedding / embedding.norm(dim=1, keepdim=True))
        torch.testing.assert_close(
            encoder(tokens, lengths), _each_alone(encoder, tokens, lengths), atol=1e-6, rtol=1e-5
        )
    with pytest.raises(ValueError, match="token ids but the tokenizer has"):
        build_text_encoder(f"hf:{folder}", vocab_size=1000, embed_dim=8, max_len=MAX_LEN)
    with pytest.raises(ValueError, match="takes at most 32 tokens"):
        build_text_encoder(f"hf:{folder}", vocab_size=len(tokenizer), embed_dim=8, max_len=64)


def test_transformer_trains_in_process_and_eval_checks_the_tokenizer(tiny_dataset, tmp_path, capsys):
    data = shutil.copytree(tiny_dataset, tmp_path / "data")
    train_dataset_tokenizer(data, 120, "wordpiece")
    cfg = load_config(
        "tiny",
        overrides={
            "data.path": str(data),
            "train.num_workers": 0,
            "train.epochs": 1,
            "train.storage_path": str(tmp_path / "runs"),
            "model.text_encoder": "transformer",
            "model.text_layers": 1,
            "model.text_heads": 2,
            "model.text_width": 32,
            "model.nesting": [16, 64],
            "data.max_caption_len": 16,
            "data.train_fraction": 0.5,
        },
    )
    task = build_task(cfg, DataInfo.from_dataset(data))
    assert task.tokenizer_kind == "subword" and len(task.tokenizer) == 120
    [note] = task.data_notes()
    assert note.endswith(
        "of 2000 train captions are longer than data.max_caption_len=16 tokens and are truncated"
    )
    torch.manual_seed(cfg.train.seed)
    untrained = task.evaluate(task.build_model(), "val")
    outcome = train_in_process(plan_for(cfg, DataInfo.from_dataset(data)))
    trained = outcome.history[-1]
    assert trained["val/rsum"] > untrained["rsum"] + 40
    assert trained["val/min_dim_rsum"] > untrained["min_dim_rsum"] + 20  # the Matryoshka prefix learns too
    checkpoint = outcome.latest_checkpoint
    assert (Path(checkpoint) / TOKENIZER_NAME).read_bytes() == (data / TOKENIZER_NAME).read_bytes()
    train_dataset_tokenizer(data, 110, "wordpiece")  # the dataset's tokenizer changes
    assert main(["eval", "--checkpoint", checkpoint, "--data", str(data), "--split", "val"]) == 2
    assert "tokenizer.json: the checkpoint's tokenizer.json differs" in capsys.readouterr().err
