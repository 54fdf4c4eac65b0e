"""Where libgaugewatch_hooks.so is: the one place that decides it.

The package carries no native code; the library comes from a gaugewatch build
or install. In order, the first that applies wins:

1. ``$GAUGEWATCH_HOOKS_LIB``: the library file itself (used as given, even
   when it is missing, so that a wrong setting is reported, not bypassed);
2. ``$GAUGEWATCH_BUILD_DIR/lib``: a build tree (``./scripts/build.sh``);
3. ``<repo>/build/lib`` when this package is imported from a source checkout
   (``hooks/python`` on ``sys.path``);
4. an installed prefix (``cmake --install build --prefix PREFIX``):
   ``PREFIX/lib`` for the ``gaugewatch`` found on ``PATH``, then
   ``sys.prefix`` and ``/usr/local``.

The hooks library needs ``libgaugewatch_ops.so`` beside it (RPATH ``$ORIGIN``),
which both a build tree and an install provide.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import sys

LIBRARY_NAME = "libgaugewatch_hooks.so"
OPS_LIBRARY_NAME = "libgaugewatch_ops.so"

HOW_TO_FIX = (
    "set GAUGEWATCH_HOOKS_LIB=/path/to/libgaugewatch_hooks.so, or "
    "GAUGEWATCH_BUILD_DIR=/path/to/gaugewatch/build (a tree built with ./scripts/build.sh), "
    "or install gaugewatch (cmake --install build --prefix PREFIX) and put PREFIX/bin on PATH"
)


class LibraryNotFound(FileNotFoundError):
    """No libgaugewatch_hooks.so where the search looked; the message says
    where it looked and what to set."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    path: pathlib.Path
    source: str  # how this place was chosen, e.g. "GAUGEWATCH_BUILD_DIR"


def candidates() -> list[Candidate]:
    """Every place the search looks, in order (module docstring)."""
    env_lib = os.environ.get("GAUGEWATCH_HOOKS_LIB")
    if env_lib:
        return [Candidate(pathlib.Path(env_lib), "GAUGEWATCH_HOOKS_LIB")]
    found: list[Candidate] = []
    build_dir = os.environ.get("GAUGEWATCH_BUILD_DIR")
    if build_dir:
        found.append(Candidate(pathlib.Path(build_dir) / "lib" / LIBRARY_NAME, "GAUGEWATCH_BUILD_DIR"))
    checkout = _source_checkout()
    if checkout is not None:
        found.append(Candidate(checkout / "build" / "lib" / LIBRARY_NAME, "source checkout"))
    cli = shutil.which("gaugewatch")
    if cli:
        prefix = pathlib.Path(cli).resolve().parent.parent
        found.append(Candidate(prefix / "lib" / LIBRARY_NAME, f"prefix of {cli}"))
    for prefix, source in ((pathlib.Path(sys.prefix), "sys.prefix"), (pathlib.Path("/usr/local"), "/usr/local")):
        found.append(Candidate(prefix / "lib" / LIBRARY_NAME, source))
    return found


def find() -> Candidate:
    """The library to load, or LibraryNotFound saying where the search looked."""
    looked = candidates()
    if looked[0].source == "GAUGEWATCH_HOOKS_LIB":
        if not looked[0].path.is_file():
            raise LibraryNotFound(
                f"GAUGEWATCH_HOOKS_LIB={looked[0].path} is not a file; point it at a built "
                f"{LIBRARY_NAME}, or unset it to search GAUGEWATCH_BUILD_DIR and the install prefix")
        return looked[0]
    for candidate in looked:
        if candidate.path.is_file():
            return candidate
    places = "; ".join(f"{c.path} ({c.source})" for c in looked)
    raise LibraryNotFound(f"{LIBRARY_NAME} not found (looked in: {places}); {HOW_TO_FIX}")


def _source_checkout() -> pathlib.Path | None:
    """The repository root when this file is <repo>/hooks/python/gaugewatch_hooks/_library.py."""
    parents = pathlib.Path(__file__).resolve().parents
    if len(parents) < 4 or parents[1].name != "python" or parents[2].name != "hooks":
        return None
    root = parents[3]
    return root if (root / "CMakeLists.txt").is_file() else None
