"""The presets shipped as YAML files in this folder, and the rule that picks one from a dataset's shape when a
run names none (:func:`preset_for_data`)."""

from __future__ import annotations

from dataclasses import dataclass

SMALL_MAX_IMAGES = 20_000  # fewer train images than this: a small set (README "Which preset to start from")
SHARED_CAPTION_SHARE = 0.05  # this share of train images sharing a caption: too many false negatives for MH


@dataclass(frozen=True)
class DataShape:
    """What the preset rule reads from a dataset: its task and, of the train split, the rows, distinct images,
    captions (0 without captions) and images with a caption (lower-cased word tokens) that another image has
    (None: not counted)."""

    task: str
    train_rows: int
    train_images: int
    train_captions: int = 0
    shared_caption_images: int | None = 0

    @property
    def captions_per_image(self) -> float:
        """Mean captions per train image."""
        return self.train_captions / max(self.train_images, 1)

    @property
    def shared_caption_share(self) -> float:
        """Share of train images with a caption that another train image has too (0 when not counted)."""
        return (self.shared_caption_images or 0) / max(self.train_images, 1)


@dataclass(frozen=True)
class PresetChoice:
    """A shipped preset picked from the data, and why."""

    name: str
    reason: str

    def line(self) -> str:
        """The one console line a run prints about the choice."""
        return f"[raydist] preset {self.name}: {self.reason} -- --preset to choose"


def preset_for_data(shape: DataShape) -> PresetChoice:
    """The shipped preset for a dataset when the run names none:

    - not image–caption (``task != "pairs"``: class labels) → ``default`` (``small`` and the ``vsepp-*`` presets are
      schedules for image–caption ranking);
    - ``train_images >= SMALL_MAX_IMAGES`` → ``default`` (MH after an SH warm-up, the VSE++ recipe at scale);
    - a small set with at least 2 captions per image and fewer than ``SHARED_CAPTION_SHARE`` of its images
      sharing a caption → ``default`` (the embedded set's shape: 3,000 images × 5 captions, none shared,
      where ``default`` is the measured recipe);
    - any other small set → ``small`` (SH throughout, no LR decay): with one caption per image or shared
      captions, MH's hardest negative is often a false one (the digit halves: 1,100 images, 1 caption each,
      29 % shared; test rsum ``small`` 153.7–166.0, ``default`` 122.9–124.4, a 16-component CCA 110.8).
    """
    n, per_image, shared = shape.train_images, shape.captions_per_image, shape.shared_caption_share
    if shape.task != "pairs":
        return PresetChoice(
            "default",
            f"{shape.train_rows:,} class-labelled train rows (task {shape.task}); small and the vsepp presets "
            "are schedules for image-caption ranking, which labels do not use",
        )
    if n >= SMALL_MAX_IMAGES:
        return PresetChoice("default", f"{n:,} train images (>= {SMALL_MAX_IMAGES:,})")
    facts = (
        f"{n:,} train images (< {SMALL_MAX_IMAGES:,}), {per_image:.1f} captions per image, "
        f"{shared:.0%} of images share a caption with another"
    )
    if per_image >= 2 and shared < SHARED_CAPTION_SHARE:
        return PresetChoice("default", f"{facts} (< {SHARED_CAPTION_SHARE:.0%}): few false negatives for MH")
    return PresetChoice("small", f"{facts}: MH's hardest negative would often be a false one")


SMALL_CNN_MAX_SIDE = 64  # images up to this shorter side train with small-cnn at their own size
CNN_FALLBACK_SIDE = 64  # larger images without torchvision: small-cnn on crops of this side
RESNET_MAX_SIDE = 224  # the crop side a torchvision ResNet trains at, at most
# an encoder trained from scratch gets at least this many steps (the default run's 585); without it a small labelled
# set (1,259 scikit-learn digits: 45 steps) ends far below raw-pixel 1-NN (bench/RESULTS.md, "small CNN default")
FROM_SCRATCH_MIN_STEPS = 585
# an encoder trained from scratch on a small set stops after this many optimizer steps without a better val metric
# (in epochs, rounded up; at least 3): the digit halves' val rsum peaked at epoch 17 of 125 and fell while the
# train loss kept dropping (the encoders memorised 1,100 pairs); the best checkpoint is kept either way
FROM_SCRATCH_PATIENCE_STEPS = 200


@dataclass(frozen=True)
class ImageChoice:
    """The keys a run on encoded images gets from the images (the encoder when its config names none; the rules
    of training from scratch), and why."""

    overrides: dict[str, object]
    reason: str

    def line(self) -> str:
        """The one console line a run prints about the choice: every key it set."""
        picked = " ".join(f"{k}={v}" for k, v in self.overrides.items())
        return f"[raydist] images: {self.reason} → {picked} -- set a key to choose"


def image_encoder_for_data(
    image_size: list[int],
    channels: int,
    *,
    torchvision: bool,
    named: str | None = None,
    pretrained: bool = False,
    train_images: int | None = None,
    steps_per_epoch: int = 1,
) -> ImageChoice:
    """The keys for encoded images of median size ``image_size`` ([height, width]) and ``channels``. With no
    encoder ``named``:

    - shorter side ≤ ``SMALL_CNN_MAX_SIDE`` → ``small-cnn`` at the images' own size (crop = shorter side);
    - larger, where torchvision imports → ``torchvision:resnet18`` on crops of min(shorter side, 224);
    - larger, where it does not → ``small-cnn`` on crops of ``CNN_FALLBACK_SIDE`` (the ``vision`` extra brings
      torchvision).

    An encoder trained from scratch -- each of those, or a ``named`` one without ``pretrained`` backbone weights
    -- also gets ``train.min_steps`` ≥ :data:`FROM_SCRATCH_MIN_STEPS`, whether it was picked or named, and on a
    small set (``train_images`` < :data:`SMALL_MAX_IMAGES`) early stopping after
    :data:`FROM_SCRATCH_PATIENCE_STEPS` steps (``steps_per_epoch`` converts them to epochs) without a better val
    metric.
    """
    side = min(image_size)
    facts = f"median {image_size[0]}×{image_size[1]} {'greyscale' if channels == 1 else 'colour'}"
    steps: dict[str, object] = {} if pretrained else {"train.min_steps": FROM_SCRATCH_MIN_STEPS}
    if not pretrained and train_images is not None and train_images < SMALL_MAX_IMAGES:
        patience = max(3, -(-FROM_SCRATCH_PATIENCE_STEPS // max(steps_per_epoch, 1)))
        steps["train.early_stop_patience"] = patience
    if named is not None:
        what = "pretrained backbone weights" if pretrained else "trains from scratch"
        return ImageChoice(steps, f"{facts}, model.image_encoder={named} {what}")
    if side <= SMALL_CNN_MAX_SIDE:
        return ImageChoice(
            {"model.image_encoder": "small-cnn", **steps},
            f"{facts} (shorter side ≤ {SMALL_CNN_MAX_SIDE}): a small GroupNorm CNN at their size",
        )
    if torchvision:
        crop = min(side, RESNET_MAX_SIDE)
        return ImageChoice(
            {"model.image_encoder": "torchvision:resnet18", "data.image_size": crop, **steps},
            f"{facts}: a ResNet-18 (no pretrained weights unless model.image_weights=) on {crop} px crops",
        )
    return ImageChoice(
        {"model.image_encoder": "small-cnn", "data.image_size": CNN_FALLBACK_SIDE, **steps},
        f'{facts}, torchvision cannot be imported (pip install -e ".[vision]" for ResNets): a small CNN '
        f"on {CNN_FALLBACK_SIDE} px crops",
    )
