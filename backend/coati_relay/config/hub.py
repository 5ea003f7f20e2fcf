"""Models named by Hugging Face Hub ID (``Qwen/Qwen2.5-7B``): resolved once, in the driver, to a local directory.

A model path that is not a local directory but reads as a Hub ID is looked up in the Hugging Face cache
(``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``: the layout ``models--ORG--NAME/
snapshots/<commit>/`` with ``refs/main`` naming the commit). Found there, its snapshot directory is what every actor
receives, so no actor ever asks the Hub for anything (they run with ``HF_HUB_OFFLINE=1``). Absent from the cache, it
is downloaded into the cache when the Hub may be reached, and refused with the command that fetches it when
``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set. A cached snapshot is used as it is, without asking the Hub
whether ``main`` has moved: ``hf download ID`` refreshes it.

The environment is read at each call (huggingface_hub reads it once, when it is first imported).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

_TRUE = ("1", "ON", "YES", "TRUE")


class HubModelError(ValueError):
    """A Hub ID that cannot be turned into a local directory; the message names the ID and the fix."""


def hub_offline() -> bool:
    """Whether the Hub may not be reached: ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set to 1/on/yes/true."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in _TRUE


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache as huggingface_hub computes it, from the environment as it is now."""
    if os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.path.expandvars(os.environ.get("HF_HUB_CACHE") or os.environ["HUGGINGFACE_HUB_CACHE"])
                    ).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def is_hub_id(value: str) -> bool:
    """Whether ``value`` has the form of a Hub repository ID (``NAME`` or ``ORG/NAME``) rather than a path."""
    text = str(value)
    if not text or text.startswith((".", "/", "~")) or "\\" in text or text.count("/") > 1:
        return False
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def _fetch_hint(repo_id: str) -> str:
    return (f"fetch it first with `hf download {repo_id}` (older huggingface_hub: `huggingface-cli download "
            f"{repo_id}`), or let the run download it by setting HF_HUB_OFFLINE=0")


def resolve_hub_model(repo_id: str, what: str) -> str:
    """The local snapshot directory of Hub model ``repo_id`` (``what``: the parameter that named it, for errors).

    Looks in the cache first; downloads into it only when the Hub may be reached. Raises `HubModelError`."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        return snapshot_download(repo_id, cache_dir=str(cache), local_files_only=True)
    except LocalEntryNotFoundError:
        pass
    if hub_offline():
        raise HubModelError(f"{what} = {repo_id!r} is not a local model directory, and as a Hugging Face Hub ID it "
                            f"is not in the Hugging Face cache ({cache}); HF_HUB_OFFLINE is set, so it is not "
                            f"downloaded: {_fetch_hint(repo_id)}") from None
    log.warning("%s: downloading %s from the Hugging Face Hub into %s", what, repo_id, cache)
    try:
        return snapshot_download(repo_id, cache_dir=str(cache), endpoint=os.environ.get("HF_ENDPOINT") or None)
    except Exception as exc:  # huggingface_hub raises connection, auth, not-found and offline errors here
        raise HubModelError(f"{what} = {repo_id!r} is not a local model directory, and downloading it from the "
                            f"Hugging Face Hub into {cache} failed ({type(exc).__name__}: {_first_line(exc)}); "
                            f"check the ID and your access to it, or fetch it with `hf download {repo_id}`") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


def local_model_dir(value: str, what: str) -> Optional[str]:
    """``value`` itself when it is a local directory, the cached (or downloaded) snapshot when it is a Hub ID,
    None when it is neither (a missing local path: the caller says so). Raises `HubModelError`."""
    if Path(value).expanduser().is_dir():
        return str(value)
    if not is_hub_id(value):
        return None
    return resolve_hub_model(str(value), what)
