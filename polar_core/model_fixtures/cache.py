"""Writing the tiny tokenizer and model to a directory that vLLM, Triton and ``from_pretrained`` can load.

A build is described by a key: a hash of everything that determines its files (the fixture version, the
training corpus, the chat template, the model configuration, the seed, and the transformers and torch
versions that serialize it). The directory's marker file records that key and a SHA-256 of every file,
and is written last, so a directory with a valid marker is complete and current.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import transformers

from polar_core.model_fixtures.tiny_model import build_tiny_model, tiny_model_config
from polar_core.model_fixtures.tokenizer import build_tiny_tokenizer

# Bump when the layout or content of a build changes in a way the key would not notice.
FIXTURE_VERSION = 1
MARKER_FILE = "polar_fixture.json"
_FIXTURE_NAME = "polar-tiny-qwen2"


def tiny_model_build_key(*, seed: int = 0, tie_word_embeddings: bool = True) -> str:
    """Return the hex SHA-256 that identifies the tiny model build for ``seed``.

    Args:
        seed: The weight seed, as for :func:`~polar_core.model_fixtures.tiny_model.build_tiny_model`.
        tie_word_embeddings: Whether the output layer shares the input embedding.

    Returns:
        A 64-character hex digest; equal digests mean byte-identical builds.
    """
    tokenizer = build_tiny_tokenizer()
    description = {
        "fixture": _FIXTURE_NAME,
        "version": FIXTURE_VERSION,
        "tokenizer": tokenizer.backend_tokenizer.to_str(),
        "chat_template": tokenizer.chat_template,
        "config": tiny_model_config(tokenizer, tie_word_embeddings=tie_word_embeddings).to_json_string(use_diff=False),
        "seed": seed,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_marker(directory: Path) -> dict[str, object] | None:
    try:
        marker = json.loads((directory / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _is_complete(directory: Path, key: str) -> bool:
    marker = _read_marker(directory)
    if marker is None or marker.get("key") != key:
        return False
    files = marker.get("files")
    if not isinstance(files, dict) or not files:
        return False
    return all((directory / name).is_file() and _sha256(directory / name) == digest for name, digest in files.items())


def save_tiny_model(directory: Path, *, seed: int = 0, tie_word_embeddings: bool = True) -> Path:
    """Write the tiny tokenizer, model (safetensors) and config to ``directory``, unless already there.

    Idempotent and safe to run concurrently: files are written to a temporary sibling directory, moved in
    with atomic renames, and the marker file goes last. Builds are deterministic, so racing writers move
    identical files. Files of an older build that the new one does not have are removed.

    Args:
        directory: Where to write; created if missing. It should be used for nothing else.
        seed: The weight seed.
        tie_word_embeddings: Whether the output layer shares the input embedding (untied models are what
            vLLM's CPU build can reload in place).

    Returns:
        ``directory``, loadable with ``AutoTokenizer.from_pretrained`` and
        ``AutoModelForCausalLM.from_pretrained``.
    """
    key = tiny_model_build_key(seed=seed, tie_word_embeddings=tie_word_embeddings)
    if _is_complete(directory, key):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    old_marker = _read_marker(directory)
    (directory / MARKER_FILE).unlink(missing_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        tokenizer = build_tiny_tokenizer()
        tokenizer.save_pretrained(staging)
        build_tiny_model(tokenizer, seed=seed, tie_word_embeddings=tie_word_embeddings).save_pretrained(staging)
        files = {path.name: _sha256(path) for path in sorted(staging.iterdir()) if path.is_file()}
        for name in files:
            os.replace(staging / name, directory / name)
        old_files = old_marker.get("files") if old_marker is not None else None
        if isinstance(old_files, dict):
            for name in old_files:
                if name not in files and name != MARKER_FILE and "/" not in name:
                    (directory / name).unlink(missing_ok=True)
        marker = {"fixture": _FIXTURE_NAME, "key": key, "seed": seed, "files": files}
        marker_tmp = staging / MARKER_FILE
        marker_tmp.write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(marker_tmp, directory / MARKER_FILE)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def ensure_tiny_model_dir(cache_dir: Path, *, seed: int = 0) -> Path:
    """Return a complete tiny model directory under ``cache_dir``, building it on first use.

    The subdirectory's name contains the build key, so different versions never overwrite each other.

    Args:
        cache_dir: A cache directory (for example pytest's ``tmp_path_factory`` base or a CI cache).
        seed: The weight seed.

    Returns:
        The model directory, as returned by :func:`save_tiny_model`.
    """
    key = tiny_model_build_key(seed=seed)
    return save_tiny_model(cache_dir / f"tiny-qwen2-seed{seed}-{key[:16]}", seed=seed)
