"""New inputs through a trained model: texts, feature vectors and images → embeddings, as evaluation embeds a
split, optionally cut to a Matryoshka prefix (``raydist.Embedder``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from raydist.checkpoint import ChosenCheckpoint
from raydist.data.image_transforms import decode_image, image_pixels
from raydist.data.standardize import STANDARDIZATION_NAME, standardize_features
from raydist.retrieval.index import unit_rows
from raydist.retrieval.trained import Trained, load_trained


class Embedder:
    """A trained model for new inputs: texts, feature vectors and images → embeddings (float32 numpy rows), computed as
    evaluation embeds a split (:meth:`raydist.tasks.Task.embed_texts` / ``embed_features``). With ``dim`` the
    Matryoshka prefix ``normalize(z[:, :dim])``, re-normalised as retrieval does."""

    def __init__(self, trained: Trained, dim: int | None = None) -> None:
        full = trained.config.model.embed_dim
        if dim is not None and not 1 <= dim <= full:
            raise ValueError(f"dim={dim}: expected 1 <= dim <= {full} (the checkpoint's model.embed_dim)")
        self.trained, self.dim = trained, dim

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        *,
        dim: int | None = None,
        latest: bool = False,
        device: torch.device | str = "cpu",
    ) -> Embedder:
        """Load a checkpoint folder, or a run folder's best checkpoint (its newest with ``latest``), with
        :func:`load_trained`; the dataset it was trained on is not needed."""
        return cls(load_trained(path, device=device, latest=latest, need_data=False), dim)

    @property
    def checkpoint(self) -> ChosenCheckpoint:
        """The checkpoint folder loaded and why it was chosen."""
        return ChosenCheckpoint(self.trained.checkpoint_path, self.trained.chosen)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings [N, dim] of raw texts (captions, tokenised with the checkpoint's vocabulary)."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("embed_texts: expected a list of strings (wrap a single text in a list)")
        if not texts:
            raise ValueError("embed_texts: no texts given")
        try:
            emb = self.trained.task.embed_texts(self.trained.model, list(texts), self.trained.device)
        except NotImplementedError as e:  # a task without a text side: bad input, not a failure
            raise ValueError(str(e)) from e
        return self._cut(emb)

    def embed_features(self, features: np.ndarray) -> np.ndarray:
        """Embeddings [N, dim] of feature vectors [N, feature_dim] (image features for ``pairs``, the samples'
        vectors for ``labels``), given as the source data holds them: when the dataset was converted with
        ``--standardize``, its saved train statistics are applied here, as they were to every split."""
        x = np.asarray(features, dtype=np.float64)  # standardised before float32, as the converter does
        want = self.trained.data_info.feature_dim
        if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] != want:
            raise ValueError(
                f"embed_features: expected an array of shape [N >= 1, {want}] (the checkpoint's "
                f"feature_dim), got {x.shape}"
            )
        stats = self.trained.data_info.files.get(STANDARDIZATION_NAME)
        x = standardize_features(x, stats) if stats is not None else x.astype(np.float32)
        return self._cut(self.trained.task.embed_features(self.trained.model, x, self.trained.device))

    def embed_images(self, images: Sequence[bytes | Image.Image]) -> np.ndarray:
        """Embeddings [N, dim] of images (encoded PNG/JPEG bytes, or Pillow images) for a model trained on
        encoded images: decoded to the dataset's channels and made into the eval view evaluation uses (resize +
        centre crop, normalise; :func:`raydist.tasks.images.pixel_views`). Bytes that do not decode raise a
        ValueError naming the item."""
        if isinstance(images, (bytes, Image.Image)) or not len(images):
            raise ValueError(
                "embed_images: expected a non-empty list of images (wrap a single image in a list)"
            )
        channels = self.trained.data_info.image_channels or 3
        pixels = []
        for i, image in enumerate(images):
            if isinstance(image, Image.Image):
                pixels.append(image_pixels(image, channels))
            elif isinstance(image, (bytes, bytearray, memoryview)):
                try:
                    pixels.append(decode_image(bytes(image), channels))
                except (OSError, ValueError, Image.DecompressionBombError) as e:
                    raise ValueError(f"images[{i}]: not a decodable PNG/JPEG image ({e})") from e
            else:
                raise TypeError(f"images[{i}]: expected bytes or a PIL image, got {type(image).__name__}")
        try:
            emb = self.trained.task.embed_images(self.trained.model, pixels, self.trained.device)
        except NotImplementedError as e:  # a model trained on feature vectors: bad input, not a failure
            raise ValueError(str(e)) from e
        return self._cut(emb)

    def _cut(self, emb: torch.Tensor) -> np.ndarray:
        z = emb.numpy().astype(np.float32, copy=False)
        return z if self.dim is None else unit_rows(z[:, : self.dim])
