"""Text encoders chosen by name: ``gru`` (VSE++), ``transformer`` (torch's ``TransformerEncoder``) and
``hf:<folder or hub name>`` (a pretrained HuggingFace ``AutoModel``); each maps token ids [B, L] and lengths [B]
(right padding) to unit-norm caption embeddings [B, embed_dim]. Padding never reaches the output: packed sequences
(GRU), ``src_key_padding_mask`` / ``attention_mask`` and masked pooling (transformers). transformers is optional:
imported only when an ``hf:`` encoder is built."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from raydist.config import ModelSection
from raydist.losses.similarity import l2_normalize
from raydist.registry import Registry

Pooling = Literal["mean", "cls"]


def padding_mask(lengths: Tensor, width: int) -> Tensor:
    """``mask[b, t] = t >= lengths[b]``: True on padding (``src_key_padding_mask``'s convention), bool [B, width]."""
    return torch.arange(width, device=lengths.device)[None, :] >= lengths[:, None]


def pool_tokens(hidden: Tensor, lengths: Tensor, pooling: Pooling) -> Tensor:
    """[B, L, H] token states → [B, H]: ``mean`` = ``Σ_{t<len_b} h_bt / len_b`` (padding excluded), ``cls`` =
    the first token's state (the ``[CLS]``/``<start>`` token every tokenizer here puts first)."""
    if pooling == "cls":
        return hidden[:, 0]
    keep = (~padding_mask(lengths.to(hidden.device), hidden.shape[1])).to(hidden.dtype)
    return (hidden * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp_min(1)


class TextEncoder(nn.Module):
    """``g(C) = normalize(GRU(embed(words))[last valid step])`` over packed sequences."""

    def __init__(self, vocab_size: int, word_dim: int, embed_dim: int, num_layers: int = 1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, word_dim)
        self.rnn = nn.GRU(word_dim, embed_dim, num_layers, batch_first=True)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        packed = pack_padded_sequence(
            self.embed(tokens), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        _, hidden = self.rnn(packed)  # [num_layers, B, H], already at each sequence's last step
        return l2_normalize(hidden[-1])


class TransformerTextEncoder(nn.Module):
    """``normalize(W · pool(TransformerEncoder(embed(t) + pos)) + b)``: pre-LayerNorm encoder layers (GELU,
    feed-forward 4 × width), learned positions up to ``max_len``, a final LayerNorm, masked mean or first-token
    pooling, and a Linear to ``embed_dim``. Padded positions are masked as attention keys and left out of the pool.
    The position table is an Embedding called on position ids [B, L], so each example's share of its gradient is
    a module output gradient (what gradient clustering records), as for the token embedding.

    torch's own ``nn.TransformerEncoder`` rather than HF ``BertModel``: it needs no extra dependency in the core
    install, its layers are plain modules (DDP, AMP and ``state_dict`` behave as for the GRU), and the
    pretrained route (``hf:``) covers BERT-family weights when they are wanted."""

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        *,
        max_len: int,
        pad_id: int = 0,
        layers: int = 2,
        heads: int = 4,
        width: int = 256,
        dropout: float = 0.1,
        pooling: Pooling = "mean",
    ) -> None:
        super().__init__()
        self.pooling = pooling
        self.embed = nn.Embedding(vocab_size, width, padding_idx=pad_id)
        self.positions = nn.Embedding(max_len, width)
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(
            layer, layers, norm=nn.LayerNorm(width), enable_nested_tensor=False
        )
        self.proj = nn.Linear(width, embed_dim)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)
        with torch.no_grad():
            self.embed.weight[pad_id].zero_()

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        width = tokens.shape[1]
        if width > self.positions.num_embeddings:
            raise ValueError(
                f"captions of {width} tokens: the encoder has positions for {self.positions.num_embeddings}"
            )
        lengths = lengths.to(tokens.device)
        position_ids = torch.arange(width, device=tokens.device).expand(tokens.shape[0], width)
        x = self.embed(tokens) + self.positions(position_ids)
        hidden = self.encoder(x, src_key_padding_mask=padding_mask(lengths, width))
        return l2_normalize(self.proj(pool_tokens(hidden, lengths, self.pooling)))


class PretrainedTextEncoder(nn.Module):
    """``normalize(W · pool(backbone(ids, attention_mask).last_hidden_state) + b)`` over a HuggingFace model."""

    def __init__(self, backbone: nn.Module, dim: int, embed_dim: int, pooling: Pooling = "mean") -> None:
        super().__init__()
        self.backbone, self.pooling = backbone, pooling
        self.proj = nn.Linear(dim, embed_dim)

    def token_states(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """The backbone's last hidden states [B, L, dim], padding masked out of attention."""
        keep = ~padding_mask(lengths.to(tokens.device), tokens.shape[1])
        return self.backbone(input_ids=tokens, attention_mask=keep.long()).last_hidden_state

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        hidden = self.token_states(tokens, lengths)
        return l2_normalize(self.proj(pool_tokens(hidden, lengths.to(hidden.device), self.pooling)))


Builder = Callable[..., nn.Module]
_REGISTRY: Registry[Builder] = Registry("text encoder", families=True)


def register_text_encoder(name: str) -> Callable[[Builder], Builder]:
    """Register ``builder(*, vocab_size, embed_dim, max_len, pad_id, **options) -> nn.Module`` under ``name`` (a
    decorator); the module maps (tokens [B, L], lengths [B]) to unit-norm [B, embed_dim]. A name ending in ``:``
    is a family whose builder takes the text after it as its first argument. A name registered twice is an error."""
    return _REGISTRY.register(name)


def text_encoder_names() -> list[str]:
    """The registered names, sorted; a name ending in ``:`` takes a model after it."""
    return _REGISTRY.names()


def build_text_encoder(
    name: str, *, vocab_size: int, embed_dim: int, max_len: int, pad_id: int = 0, **options: Any
) -> nn.Module:
    """The text encoder ``name`` for a tokenizer of ``vocab_size`` ids (padding ``pad_id``) and captions of at
    most ``max_len`` tokens; ``options``: the builder's own (gru: word_dim, num_layers; transformer: layers,
    heads, width, dropout, pooling; hf: pooling)."""
    builder, args = _REGISTRY.resolve(name)
    return builder(
        *args, vocab_size=vocab_size, embed_dim=embed_dim, max_len=max_len, pad_id=pad_id, **options
    )


def text_encoder_from_config(
    model: ModelSection, *, vocab_size: int, max_len: int, pad_id: int = 0
) -> nn.Module:
    """``model.text_encoder`` with its size keys from the config."""
    name = model.text_encoder
    if name == "gru":
        options = {"word_dim": model.word_dim, "num_layers": model.num_layers}
    elif name == "transformer":
        options = {
            "layers": model.text_layers,
            "heads": model.text_heads,
            "width": model.text_width,
            "dropout": model.text_dropout,
            "pooling": model.text_pooling,
        }
    else:
        options = {"pooling": model.text_pooling}
    return build_text_encoder(
        name, vocab_size=vocab_size, embed_dim=model.embed_dim, max_len=max_len, pad_id=pad_id, **options
    )


@register_text_encoder("gru")
def _gru(
    *, vocab_size: int, embed_dim: int, max_len: int, pad_id: int, word_dim: int = 300, num_layers: int = 1
) -> nn.Module:
    """VSE++'s caption encoder: its GRU's hidden size is ``embed_dim``."""
    return TextEncoder(vocab_size, word_dim, embed_dim, num_layers)


@register_text_encoder("transformer")
def _transformer(*, vocab_size: int, embed_dim: int, max_len: int, pad_id: int, **options: Any) -> nn.Module:
    """:class:`TransformerTextEncoder` with positions for ``max_len`` tokens."""
    return TransformerTextEncoder(vocab_size, embed_dim, max_len=max_len, pad_id=pad_id, **options)


@register_text_encoder("hf:")
def _huggingface(
    path: str, *, vocab_size: int, embed_dim: int, max_len: int, pad_id: int, pooling: Pooling = "mean"
) -> nn.Module:
    """``transformers.AutoModel.from_pretrained(path)`` (a local folder written by ``save_pretrained``; a hub
    name downloads it on a machine with internet) under a new Linear to ``embed_dim``. The tokenizer must fit the
    model: at most its vocab size, captions no longer than its position table."""
    try:
        transformers = importlib.import_module("transformers")
    except Exception as err:
        raise ImportError(
            f"text encoder 'hf:{path}' needs transformers, which cannot be imported here "
            f"({type(err).__name__}: {err}): pip install 'raydist[text]'"
        ) from err
    backbone = transformers.AutoModel.from_pretrained(path)
    config = backbone.config
    if vocab_size > config.vocab_size:
        raise ValueError(
            f"hf:{path} has {config.vocab_size} token ids but the tokenizer has {vocab_size}: use the "
            f"model's own tokenizer (raydist tokenizer set --data DIR --tokenizer {path}/tokenizer.json)"
        )
    positions = getattr(config, "max_position_embeddings", None)
    if positions is not None and max_len > positions:
        raise ValueError(
            f"hf:{path} takes at most {positions} tokens: set data.max_caption_len <= {positions}"
        )
    return PretrainedTextEncoder(backbone, config.hidden_size, embed_dim, pooling)
