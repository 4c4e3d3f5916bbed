"""Paths that may be URIs: ``s3://bucket/prefix``, ``gs://bucket/prefix`` or a local folder, read and written
through pyarrow's filesystems (the ones Ray Data and Ray Train use). Credentials, region and endpoint come
from the standard cloud environment only (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, the
AWS config files; ``GOOGLE_APPLICATION_CREDENTIALS`` …). Every failure is a :class:`StorageError`
whose one line names the URI; remote folders are copied into a local cache (:func:`cache_path`) by
:func:`download`."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class StorageError(ValueError):
    """A location that is missing, unreachable or refused (bad input: the CLI exits 2 on it)."""


# where remote folders are copied (default: $XDG_CACHE_HOME/raydist, else ~/.cache/raydist)
CACHE_ENV = "RAYDIST_CACHE"
# the standard variables that say where object storage is and who reads it (passed on to Ray Train's workers)
STORAGE_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
    CACHE_ENV,
)


def is_uri(path: str | Path) -> bool:
    """``s3://``, ``gs://`` … rather than a local path."""
    return "://" in str(path)


def storage_env() -> dict[str, str]:
    """The :data:`STORAGE_ENV` variables set in this process: what a worker on another node needs to read and
    write the same locations (a local Ray's workers inherit them anyway)."""
    return {name: os.environ[name] for name in STORAGE_ENV if os.environ.get(name)}


def join(location: str | Path, *parts: str) -> str:
    """``location/part/…`` for a URI or a local path."""
    if is_uri(location):
        return "/".join([str(location).rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(location, *parts))


def _endpoint() -> str:
    """Where S3 requests go, for error lines: ``AWS_ENDPOINT_URL`` (or its S3-only form) or AWS itself."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return f"endpoint {endpoint}" if endpoint else "AWS's endpoint for the bucket's region"


def _reason(error: BaseException) -> str:
    """The first line of a filesystem error, without pyarrow's boilerplate."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def filesystem(location: str | Path) -> tuple[Any, str]:
    """``(pyarrow filesystem, path inside it)`` of a URI or a local path (made absolute)."""
    import pyarrow
    import pyarrow.fs

    if not is_uri(location):
        return pyarrow.fs.LocalFileSystem(), str(Path(location).expanduser().resolve())
    try:
        return pyarrow.fs.FileSystem.from_uri(str(location))
    except (pyarrow.ArrowException, OSError, ValueError) as e:
        raise StorageError(f"{location}: not a storage URI raydist can open ({_reason(e)})") from e


def _unreachable(location: str | Path, error: BaseException) -> StorageError:
    scheme = urlsplit(str(location)).scheme
    via = f" ({_endpoint()}; credentials from the AWS environment)" if scheme == "s3" else ""
    return StorageError(f"{location}: cannot read it{via}: {_reason(error)}")


def file_type(location: str | Path, *, named: str | Path | None = None) -> str:
    """``"file"``, ``"folder"`` or ``"missing"``; an unreachable store or refused credentials raise, naming
    ``named`` (default: ``location``)."""
    import pyarrow.fs

    fs, path = filesystem(location)
    try:
        kind = fs.get_file_info(path).type
    except OSError as e:
        raise _unreachable(named or location, e) from e
    if kind == pyarrow.fs.FileType.File:
        return "file"
    return "folder" if kind == pyarrow.fs.FileType.Directory else "missing"


def _no_bucket(location: str | Path, bucket: str) -> StorageError:
    return StorageError(f"{location}: bucket {bucket!r} does not exist (or these credentials cannot see it)")


def missing_location(location: str | Path, expected: str) -> StorageError:
    """The refusal of a ``location`` that is not there; for a URI whose bucket is missing, says that."""
    if is_uri(location):
        parts = urlsplit(str(location))
        if file_type(f"{parts.scheme}://{parts.netloc}", named=location) == "missing":
            return _no_bucket(location, parts.netloc)
    return StorageError(f"{location}: not found; expected {expected}")


def check_bucket(location: str) -> None:
    """Refuse a URI whose bucket does not exist or cannot be reached (a run folder's storage: the folder itself
    is created by the first write)."""
    parts = urlsplit(location)
    if file_type(f"{parts.scheme}://{parts.netloc}", named=location) == "missing":
        raise _no_bucket(location, parts.netloc)


def read_bytes(location: str | Path) -> bytes:
    """A file's bytes."""
    fs, path = filesystem(location)
    try:
        with fs.open_input_stream(path) as f:
            return f.read()
    except FileNotFoundError as e:
        raise missing_location(location, "a file") from e
    except OSError as e:
        raise _unreachable(location, e) from e


def write_bytes(location: str | Path, data: bytes) -> None:
    """Write a file (its folder is created when missing)."""
    fs, path = filesystem(location)
    try:
        if not is_uri(location):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        with fs.open_output_stream(path) as f:
            f.write(data)
    except OSError as e:
        raise StorageError(f"{location}: cannot write it: {_reason(e)}") from e


def delete(location: str | Path) -> None:
    """Remove a file or a folder with everything in it; nothing when it is missing."""
    fs, path = filesystem(location)
    kind = file_type(location)
    try:
        if kind == "folder":
            fs.delete_dir(path)
        elif kind == "file":
            fs.delete_file(path)
    except OSError as e:
        raise StorageError(f"{location}: cannot remove it: {_reason(e)}") from e


def list_folder(location: str | Path) -> dict[str, str]:
    """``{name: "file" | "folder"}`` of a folder's direct entries ({} when it is missing)."""
    import pyarrow.fs

    fs, path = filesystem(location)
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    except OSError as e:
        raise _unreachable(location, e) from e
    return {
        info.base_name: "folder" if info.type == pyarrow.fs.FileType.Directory else "file"
        for info in infos
        if info.type in (pyarrow.fs.FileType.Directory, pyarrow.fs.FileType.File)
    }


def file_sizes(location: str | Path) -> dict[str, int]:
    """``{relative path: size}`` of every file under a folder, recursively ({} when it is missing)."""
    import pyarrow.fs

    fs, path = filesystem(location)
    try:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError as e:
        raise _unreachable(location, e) from e
    root = path.rstrip("/") + "/"
    return {i.path[len(root) :]: i.size for i in infos if i.type == pyarrow.fs.FileType.File}


def cache_root() -> Path:
    """The local folder remote files are copied into: ``$RAYDIST_CACHE``, else ``$XDG_CACHE_HOME/raydist``, else
    ``~/.cache/raydist``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "raydist"


def cache_path(uri: str) -> Path:
    """The local copy's place of a URI: ``<cache>/remote/<scheme>/<bucket>/<key>``."""
    parts = urlsplit(uri)
    key = [p for p in parts.path.split("/") if p not in ("", ".", "..")]
    return cache_root().joinpath("remote", parts.scheme, parts.netloc, *key)


def download(location: str, dest: Path, names: list[str] | None = None) -> None:
    """Copy ``names`` (relative paths; default every file under the folder ``location``) into ``dest``, each file
    through a temporary name and a rename, so a reader never sees a half-copied file. Files already in
    ``dest`` with the remote size are kept."""
    fs, root = filesystem(location)
    sizes = file_sizes(location)
    for name in sizes if names is None else names:
        target = dest / name
        if name in sizes and target.is_file() and target.stat().st_size == sizes[name]:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}.part")
        source = f"{root.rstrip('/')}/{name}"
        try:
            with fs.open_input_stream(source) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 22)
        except FileNotFoundError as e:
            tmp.unlink(missing_ok=True)
            raise missing_location(join(location, name), "a file") from e
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise _unreachable(join(location, name), e) from e
        os.replace(tmp, target)


def location_of(fs: Any, path: str) -> str:
    """A pyarrow ``(filesystem, path)`` pair as one location: the path itself when local, else its URI (Ray
    Train's results and checkpoints carry their path without the scheme)."""
    kind = getattr(fs, "type_name", "local")
    if kind == "local":
        return path
    return f"{'gs' if kind == 'gcs' else kind}://{path.lstrip('/')}"
