"""How the command line fails: one line on stderr and a nonzero exit status, never a traceback.

Exit status 2 is a problem with what the user asked for or with the machine (a bad option,
path or model, no GPU for ``--engine cuda``, no compiler for the emulator, a Transformers
release syncfree does not support): the message says what to change. Exit status 1 is
syncfree's own failure: the message says so and how to see the traceback (``--debug`` or
``SYNCFREE_DEBUG=1``, which re-raise instead, with the compiler's command and output when
building the emulator's shim failed).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, Iterable

__all__ = ["run_command", "one_line", "is_user_error", "debug_from_env", "USER_EXIT", "INTERNAL_EXIT"]

USER_EXIT, INTERNAL_EXIT, INTERRUPTED_EXIT = 2, 1, 130


def debug_from_env() -> bool:
    return os.environ.get("SYNCFREE_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def one_line(err: BaseException) -> str:
    """The exception's message with its lines joined (compiler and Transformers messages span several)."""
    text = " ".join(part.strip() for part in str(err).splitlines() if part.strip())
    return text or type(err).__name__


def _user_error_types() -> tuple[type, ...]:
    from ..audit import CudaUnavailable, EmulationUnavailable
    from ..patching import UnsupportedTransformers

    return (ValueError, CudaUnavailable, EmulationUnavailable, UnsupportedTransformers)


def _mentions(err: OSError, paths: Iterable[str]) -> bool:
    """Whether an OS error is about one of the user's paths (or a file inside one)."""
    named = [str(n) for n in (err.filename, err.filename2) if n]
    text = str(err)
    for path in paths:
        full = os.path.abspath(path)
        if any(os.path.abspath(n) == full or os.path.abspath(n).startswith(full + os.sep) for n in named):
            return True
        if path in text or full in text:  # Transformers' "<folder> does not appear to have a file named ..."
            return True
    return False


def is_user_error(err: BaseException, user_paths: Iterable[str] = ()) -> bool:
    if isinstance(err, _user_error_types()):
        return True
    return isinstance(err, OSError) and _mentions(err, [p for p in user_paths if p])


def _print_debug_details(err: BaseException) -> None:
    command = getattr(err, "command", None)
    output = getattr(err, "output", "")
    if command:
        print("the failing command: " + " ".join(str(c) for c in command), file=sys.stderr)
    if output:
        print("its output:\n" + output.rstrip(), file=sys.stderr)


def run_command(name: str, fn: Callable[[], int], *, debug: bool, user_paths: Iterable[str] = ()) -> int:
    """Run one subcommand; turn whatever it raises into ``syncfree <name>: error: ...`` and an exit status."""
    prefix = f"syncfree {name}: error:"
    try:
        return fn()
    except KeyboardInterrupt:
        if debug:
            raise
        sys.stdout.flush()
        print(f"syncfree {name}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT
    except Exception as err:
        sys.stdout.flush()  # what was printed before the error comes before it
        user = is_user_error(err, list(user_paths))
        if debug:
            _print_debug_details(err)
            if not user:
                raise  # a bug: Python's own traceback and status (and a post-mortem debugger can attach)
            traceback.print_exc()  # the user's to fix: the traceback, then the same line and status as without
        if user:
            print(f"{prefix} {one_line(err)}", file=sys.stderr)
            return USER_EXIT
        print(f"{prefix} internal error: {type(err).__name__}: {one_line(err)} -- rerun with --debug (or "
              "SYNCFREE_DEBUG=1) for the traceback", file=sys.stderr)
        return INTERNAL_EXIT
