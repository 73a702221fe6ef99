"""Sequence models: recurrent word LMs, BERT and GPT-2 shaped Transformers and the encoder-decoder
Transformer of "Attention is all you need", built from ``torch.nn`` (no downloads, no tokenizers)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from horus_airflow.catalog.datasets import TokenData, TranslationData


class RecurrentLm(nn.Module):
    """Word-level language model in the shape of PyTorch's word_language_model example (its medium
    configuration by default: 650 wide, dropout 0.5)."""

    def __init__(self, data: TokenData, cell: type[nn.RNNBase], dim: int = 650, layers: int = 2, dropout: float = 0.5) -> None:
        super().__init__()
        self.embed = nn.Embedding(data.vocab, dim)
        self.rnn = cell(dim, dim, num_layers=layers, batch_first=True, dropout=dropout)
        self.decoder = nn.Linear(dim, data.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.decoder(hidden)


@dataclass(frozen=True)
class TransformerSize:
    layers: int
    hidden: int
    heads: int
    vocab: int
    max_positions: int


BERT_BASE = TransformerSize(12, 768, 12, 30522, 512)
BERT_LARGE = TransformerSize(24, 1024, 16, 30522, 512)
GPT2_SMALL = TransformerSize(12, 768, 12, 50257, 1024)
GPT2_MEDIUM = TransformerSize(24, 1024, 16, 50257, 1024)


class Bert(nn.Module):
    """BERT encoder (post-norm, GELU) with the head the dataset's task needs: masked-token logits for
    ``lm``, start/end logits over positions for ``span``, a pooled classifier for ``classify``."""

    def __init__(self, data: TokenData, size: TransformerSize) -> None:
        super().__init__()
        self.task = data.task
        self.tokens = nn.Embedding(size.vocab, size.hidden)
        self.positions = nn.Embedding(size.max_positions, size.hidden)
        self.segments = nn.Embedding(2, size.hidden)
        self.norm = nn.LayerNorm(size.hidden)
        layer = nn.TransformerEncoderLayer(size.hidden, size.heads, 4 * size.hidden, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, size.layers, enable_nested_tensor=False)
        outputs = {"lm": size.vocab, "span": 2, "classify": data.classes}[data.task]
        self.head = nn.Linear(size.hidden, outputs)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        hidden = self.tokens(tokens) + self.positions(positions) + self.segments(torch.zeros_like(tokens))
        hidden = self.encoder(self.norm(hidden))
        if self.task == "classify":
            return self.head(hidden[:, 0])
        logits = self.head(hidden)
        return logits.transpose(1, 2) if self.task == "span" else logits


class Gpt2(nn.Module):
    """GPT-2 decoder (pre-norm, GELU, causal self-attention) with an untied LM head."""

    def __init__(self, data: TokenData, size: TransformerSize) -> None:
        super().__init__()
        self.tokens = nn.Embedding(size.vocab, size.hidden)
        self.positions = nn.Embedding(size.max_positions, size.hidden)
        layer = nn.TransformerEncoderLayer(
            size.hidden, size.heads, 4 * size.hidden, activation="gelu", batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerEncoder(layer, size.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(size.hidden)
        self.head = nn.Linear(size.hidden, size.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        hidden = self.tokens(tokens) + self.positions(torch.arange(length, device=tokens.device))
        return self.head(self.norm(self.decoder(hidden, mask=mask, is_causal=True)))


class TranslationTransformer(nn.Module):
    """Transformer-base (Vaswani et al. 2017): 6+6 layers, d_model 512, 8 heads, shared embeddings."""

    def __init__(self, data: TranslationData, hidden: int = 512, heads: int = 8, layers: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(data.vocab, hidden)
        self.positions = nn.Embedding(1024, hidden)
        self.transformer = nn.Transformer(hidden, heads, layers, layers, 4 * hidden, batch_first=True)
        self.generator = nn.Linear(hidden, data.vocab)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(target.shape[1], device=target.device)
        out = self.transformer(self._embed(source), self._embed(target), tgt_mask=mask, tgt_is_causal=True)
        return self.generator(out)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
