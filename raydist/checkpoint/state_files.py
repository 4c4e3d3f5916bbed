"""A checkpoint's state as data: its tensors in ``state.safetensors``, everything else in ``state.json`` (written
last), so reading a checkpoint never unpickles. An older folder's pickle ``state.pt`` is read as weights only
(``torch.load(weights_only=True)``, NumPy arrays allowed); one that needs anything more is refused in one line
naming the file and the command that converts a file its owner trusts (:func:`convert_checkpoints`).

In ``state.json`` a value that JSON cannot say is an object with one tag key: ``{"$tensor": name}`` (a tensor in
``state.safetensors``, named by its path in the state: ``optimizer/state/0/exp_avg``), ``{"$ndarray": name}``,
``{"$tuple": [...]}``, ``{"$items": [[key, value], ...]}`` (a dict with keys that are not strings: an
optimizer's parameter ids) and ``{"$numpy": [dtype, value]}``; a data key that starts with ``$`` is written
with one more ``$``. :func:`decode_state` gives back exactly what :func:`encode_state` took."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from raydist.checkpoint.names import CHECKPOINT_GLOB, LEGACY_STATE_FILE, STATE_FILE, TENSORS_FILE

TAG = "$"
TENSOR, NDARRAY, TUPLE, ITEMS, NUMPY = "$tensor", "$ndarray", "$tuple", "$items", "$numpy"
CONVERT_COMMAND = "raydist checkpoint convert"


class UntrustedCheckpointError(ValueError):
    """A pickle ``state.pt`` that cannot be read as weights only: loading it could run code, so it is refused."""


def _escape(key: str) -> str:
    return TAG + key if key.startswith(TAG) else key


def _unescape(key: str) -> str:
    return key[1:] if key.startswith(TAG + TAG) else key


def encode_state(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """``(tree, tensors)``: ``state`` as a JSON-able tree whose tensors and arrays are references into ``tensors``
    (CPU, contiguous, no two sharing memory, as safetensors requires). A value that is not data (tensors, arrays,
    numbers, strings, None, lists, tuples, dicts) is a TypeError naming its path."""
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()

    def reference(tensor: torch.Tensor, path: str, tag: str) -> dict[str, str]:
        name = path or "."
        while name in tensors:
            name += "'"
        tensor = tensor.detach().cpu().contiguous()
        if tensor.numel() and tensor.untyped_storage().data_ptr() in storages:
            tensor = tensor.clone()  # tied weights, views of one buffer: safetensors stores each apart
        storages.add(tensor.untyped_storage().data_ptr())
        tensors[name] = tensor
        return {tag: name}

    def encode(value: Any, path: str) -> Any:
        if isinstance(value, np.generic) and not isinstance(
            value, np.object_
        ):  # before float: np.float64 is one
            return {NUMPY: [value.dtype.str, value.item()]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, torch.Tensor):
            return reference(value, path, TENSOR)
        if isinstance(value, np.ndarray) and value.dtype != object:
            return reference(torch.from_numpy(np.ascontiguousarray(value)), path, NDARRAY)
        if isinstance(value, tuple):
            return {TUPLE: [encode(v, f"{path}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [encode(v, f"{path}/{i}") for i, v in enumerate(value)]
        if isinstance(value, dict):
            inner = {k: encode(v, f"{path}/{k}" if path else str(k)) for k, v in value.items()}
            if all(isinstance(k, str) for k in inner):
                return {_escape(k): v for k, v in inner.items()}
            return {ITEMS: [[encode(k, path), v] for k, v in inner.items()]}
        raise TypeError(
            f"checkpoint state {path or '(root)'}: a {type(value).__name__} is not data (tensors, arrays, "
            "numbers, strings, None, lists, tuples, dicts)"
        )

    return encode(state, ""), tensors


def decode_state(tree: Any, tensor: Callable[[str], torch.Tensor]) -> Any:
    """What :func:`encode_state` took, from its tree and ``tensor(name)`` (called only for the tensors the tree
    refers to)."""

    def decode(value: Any) -> Any:
        if isinstance(value, list):
            return [decode(v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, inner),) = value.items()
            if key.startswith(TAG) and not key.startswith(TAG + TAG):
                if key == TENSOR:
                    return tensor(inner)
                if key == NDARRAY:
                    return tensor(inner).numpy()
                if key == TUPLE:
                    return tuple(decode(v) for v in inner)
                if key == ITEMS:
                    return {decode(k): decode(v) for k, v in inner}
                if key == NUMPY:
                    dtype = np.dtype(inner[0])
                    if dtype.hasobject:
                        raise ValueError(f"a NumPy scalar of dtype {dtype} is not data")
                    return dtype.type(inner[1])
                raise ValueError(f"unknown tag {key!r}")
        return {_unescape(k): decode(v) for k, v in value.items()}

    return decode(tree)


def _fsync(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_state(folder: str | Path, state: dict[str, Any]) -> None:
    """``state.safetensors`` then ``state.json`` (the folder's mark of completeness) into ``folder``, each via a
    temporary name."""
    folder = Path(folder)
    tree, tensors = encode_state(state)
    text = json.dumps(tree).encode()
    tmp = folder / (TENSORS_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    _fsync(tmp)
    os.replace(tmp, folder / TENSORS_FILE)
    tmp = folder / (STATE_FILE + ".tmp")
    tmp.write_bytes(text)
    _fsync(tmp)
    os.replace(tmp, folder / STATE_FILE)


def has_state(folder: str | Path) -> bool:
    """Whether ``folder`` is a complete checkpoint: ``state.json`` written, or an older folder's ``state.pt``."""
    return (Path(folder) / STATE_FILE).is_file() or (Path(folder) / LEGACY_STATE_FILE).is_file()


def read_state(folder: str | Path, part: str | None = None) -> Any:
    """The state of a checkpoint folder (or only ``state[part]``, reading no other tensor), without unpickling:
    ``state.json`` and ``state.safetensors``, else an older ``state.pt`` as weights only
    (:func:`read_pickle_state`). An unreadable file is a ValueError naming it."""
    folder = Path(folder)
    path = folder / STATE_FILE
    if not path.is_file():
        if (folder / LEGACY_STATE_FILE).is_file():
            state = read_pickle_state(folder / LEGACY_STATE_FILE, mmap=part is not None)
            return state if part is None else state.get(part)
        raise FileNotFoundError(f"{folder}: no {STATE_FILE}")
    try:
        tree = json.loads(path.read_text())
        if part is not None:
            tree = tree.get(_escape(part)) if isinstance(tree, dict) else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable checkpoint state: {e}") from e
    tensors_path = folder / TENSORS_FILE
    with _Tensors(tensors_path) as tensors:
        try:
            return decode_state(tree, tensors.get)
        except _TensorFileError as e:
            raise ValueError(f"{tensors_path}: unreadable checkpoint tensors: {e.__cause__}") from e
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: unreadable checkpoint state: {e!r}") from e


class _TensorFileError(Exception):
    pass


class _Tensors:
    """``state.safetensors``, opened the first time a tensor is asked for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None
        self._names: set[str] = set()

    def get(self, name: str) -> torch.Tensor:
        try:
            if self._file is None:
                self._file = safe_open(str(self.path), framework="pt", device="cpu").__enter__()
                self._names = set(self._file.keys())
            if name not in self._names:
                raise KeyError(f"no tensor {name!r}")
            return self._file.get_tensor(name)
        except Exception as e:  # safetensors raises its own types for missing or truncated files
            raise _TensorFileError() from e

    def __enter__(self) -> _Tensors:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.__exit__(None, None, None)


def _numpy_globals() -> list[Any]:
    """What a pickle of NumPy arrays and scalars needs (the RNG state of older checkpoints): building an array or
    a scalar of a plain dtype, nothing that runs other code."""
    multiarray = getattr(np, "_core", None) or np.core
    dtypes = [
        type(np.dtype(t)) for t in (np.bool_, np.uint8, np.int32, np.int64, np.uint32, np.float32, np.float64)
    ]
    return [multiarray.multiarray._reconstruct, multiarray.multiarray.scalar, np.ndarray, np.dtype, *dtypes]


def read_pickle_state(path: str | Path, *, mmap: bool = False) -> Any:
    """An older checkpoint's pickle ``state.pt``, read with ``weights_only=True`` (tensors, containers, numbers and
    NumPy arrays: nothing in it can run). A file that needs more is an :class:`UntrustedCheckpointError` naming it
    and the conversion command; a truncated or corrupt one a ValueError."""
    path = Path(path)
    try:
        with torch.serialization.safe_globals(_numpy_globals()), warnings.catch_warnings():
            warnings.simplefilter(
                "ignore", UserWarning
            )  # torch's note on the pickle protocol: ours is the line
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if "weights only load failed" not in str(e).lower():
            raise ValueError(f"{path}: unreadable checkpoint state: {e}") from e
        found = re.search(r"GLOBAL (\S+)", str(e))  # the function or class the pickle would call
        why = f" ({found.group(1)})" if found else ""
        raise UntrustedCheckpointError(
            f"{path}: refused: a pickle checkpoint that asks to run code{why}, and raydist loads checkpoints as "
            f"data only; if you trust this file, convert it: {CONVERT_COMMAND} {path.parent} NEW_FOLDER"
        ) from None
    except Exception as e:  # torch raises several types for truncated/corrupt files
        raise ValueError(f"{path}: unreadable checkpoint state: {e}") from e


def convert_checkpoints(old: str | Path, new: str | Path) -> list[Path]:
    """Copy a checkpoint folder, or a run folder and its checkpoints, from ``old`` to ``new`` (which must not
    exist) with every pickle ``state.pt`` rewritten as ``state.safetensors`` + ``state.json``. The pickles are
    loaded with ``weights_only=False``, which runs any code they hold: only for files the caller trusts.
    Returns the converted checkpoint folders."""
    old, new = Path(old).expanduser().resolve(), Path(new).expanduser().resolve()
    if old.is_file() and old.name == LEGACY_STATE_FILE:
        old = old.parent
    if not old.is_dir():
        raise FileNotFoundError(f"{old}: no such checkpoint or run folder")
    if new.exists():
        raise ValueError(f"{new} exists: give a new folder")
    folders = [old] if (old / LEGACY_STATE_FILE).is_file() else sorted(old.glob(CHECKPOINT_GLOB))
    folders = [f for f in folders if (f / LEGACY_STATE_FILE).is_file()]
    if not folders:
        raise FileNotFoundError(f"{old}: no {LEGACY_STATE_FILE} in it or in its {CHECKPOINT_GLOB} folders")
    shutil.copytree(old, new, ignore=shutil.ignore_patterns(LEGACY_STATE_FILE))
    converted = []
    for folder in folders:
        state = torch.load(folder / LEGACY_STATE_FILE, map_location="cpu", weights_only=False)
        target = new / folder.relative_to(old)
        write_state(target, state)
        converted.append(target)
    return converted
