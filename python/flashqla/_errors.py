"""Errors of the compiled ops as the Python exceptions a caller can act on.

The binding (``binding/torch/gdn_ops.cpp``) can only raise ``RuntimeError``; it writes
its messages as ``"flashqla: <category>: <what>"``, the category being the C API's
status. Here the categories a caller can fix become ``ValueError`` (bad arguments,
bad ``cu_seqlens`` contents) or ``NotImplementedError`` (valid but unsupported);
CUDA errors, out-of-memory and internal errors stay ``RuntimeError``.

The Python layer checks every argument before the op runs, so what reaches this is
what only the core can see: the contents of ``cu_seqlens`` (read on the host for CPU
tensors) and limits of the backend that runs the call.
"""

from __future__ import annotations

import re

import torch

_MESSAGE = re.compile(r"flashqla: (invalid argument|not supported|invalid cu_seqlens|workspace too small|"
                      r"CUDA error|out of memory|internal error): ([^\n]*)")
_TYPES = {"invalid argument": ValueError, "invalid cu_seqlens": ValueError, "not supported": NotImplementedError}


def translated(error: RuntimeError) -> Exception:
    """The exception a caller should see for an op's RuntimeError (itself when it is
    not one of flashqla's, or a category that stays a RuntimeError)."""
    match = _MESSAGE.search(str(error))
    if match is None:
        return error
    category, what = match.groups()
    kind = _TYPES.get(category)
    if kind is None:
        return error
    return kind(f"flashqla: {what.strip()}")


def call_op(op, *args):
    """Runs an op, raising its errors as ``translated`` says. Under ``torch.compile``
    the op is called plainly (a traced region keeps no exception handler), so errors
    there stay RuntimeError with the same message."""
    if torch.compiler.is_compiling():
        return op(*args)
    try:
        return op(*args)
    except RuntimeError as e:
        err = translated(e)
        if err is e:
            raise
        raise err from None
