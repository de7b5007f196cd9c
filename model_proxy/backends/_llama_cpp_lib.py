"""llama.cpp's C API from ``llama-cpp-cffi``'s CPU extension module, without its package's Python API.

PyPI carries llama.cpp built for this only in ``llama-cpp-cffi`` (``llama-cpp-python`` is a source package that
compiles llama.cpp for minutes); its wheel is 320 MB because it also holds CUDA and Vulkan builds, so it is an
optional install: ``.venv/bin/pip install --no-deps llama-cpp-cffi==0.4.18`` (``--no-deps``: it pins an older
``huggingface-hub``). Only the CPU module ``llama/_llama_cpp_cpu.*.so`` is loaded, by path, so importing it
neither runs the package's ``__init__`` nor touches a GPU. Shared by the ``llama_cpp`` backend and the bench.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path
from typing import Any

__all__ = ["INSTALL_HINT", "llama_cpp_missing", "load_llama_cpp"]

INSTALL_HINT = "install it with: .venv/bin/pip install --no-deps llama-cpp-cffi==0.4.18"
_LOG_WARN = 3  # ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT
_logger = logging.getLogger("model_proxy.backends.llama_cpp")


def load_llama_cpp() -> tuple[Any, Any]:
    """llama.cpp's C API as cffi's ``(lib, ffi)``, loaded once per process.

    llama.cpp's own log (a few hundred lines per model load on stderr) goes to the ``model_proxy.backends.llama_cpp``
    logger instead, warnings and errors only.

    Raises:
        ModuleNotFoundError: ``llama-cpp-cffi`` or its CPU module is not installed (the message says how).
    """
    lib, ffi, _ = _loaded()
    return lib, ffi


@functools.cache
def _loaded() -> tuple[Any, Any, Any]:
    spec = importlib.util.find_spec("llama")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"llama-cpp-cffi is not installed; {INSTALL_HINT}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("_llama_cpp_cpu.*.so"))
    if not found:
        raise ModuleNotFoundError(f"no CPU module in {folder}; {INSTALL_HINT}")
    module_spec = importlib.util.spec_from_file_location("llama._llama_cpp_cpu", found[0])
    if module_spec is None or module_spec.loader is None:
        raise ModuleNotFoundError(f"cannot load {found[0]}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    lib, ffi = module.lib, module.ffi

    def log(level: int, text: Any, _data: Any) -> None:
        if level >= _LOG_WARN and text != ffi.NULL:
            _logger.log(
                logging.ERROR if level == _LOG_WARN + 1 else logging.WARNING,
                "%s",
                ffi.string(text).decode(errors="replace").rstrip(),
            )

    # Kept alive with the module (returned and cached): llama.cpp calls it from any thread until exit.
    callback = ffi.callback("void(enum ggml_log_level, char *, void *)", log)
    lib.llama_log_set(callback, ffi.NULL)
    lib.llama_backend_init()  # once per process: ggml's tables
    return lib, ffi, callback


def llama_cpp_missing() -> str | None:
    """Why llama.cpp cannot be loaded here, or None when it can."""
    try:
        load_llama_cpp()
    except (ImportError, OSError) as exc:
        return str(exc)
    return None
