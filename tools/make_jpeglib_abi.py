"""Write shardfmt/ops/_jpeglib_abi.py: libjpeg's declarations of `shardfmt.ops._jpegcrop._CDEF`,
compiled by cffi into its out-of-line ABI form.

cffi's in-line ABI mode parses C declarations with pycparser when a process first uses them:
about 60 ms in every loader worker. The out-of-line form is the same declarations already
parsed, as a small Python module that loads in about 3 ms; no compiler is involved, and the
library is still found and opened at run time (`jpegcrop._library_path`).

    python tools/make_jpeglib_abi.py           # write the module
    python tools/make_jpeglib_abi.py --check   # exit 1 if it differs from what is written
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import cffi

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardfmt.ops._jpegcrop import _CDEF  # noqa: E402

TARGET = ROOT / "shardfmt" / "ops" / "_jpeglib_abi.py"
HEADER = "# Written by tools/make_jpeglib_abi.py from shardfmt.ops._jpegcrop._CDEF; do not edit.\n"


def generate() -> str:
    builder = cffi.FFI()
    builder.cdef(_CDEF)
    builder.set_source("shardfmt.ops._jpeglib_abi", None)
    with tempfile.TemporaryDirectory() as temp:
        path = Path(temp) / "_jpeglib_abi.py"
        builder.emit_python_code(str(path))
        return HEADER + path.read_text()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    text = generate()
    if args.check:
        if TARGET.read_text() != text:
            print(f"{TARGET.relative_to(ROOT)} differs from _CDEF: run python tools/make_jpeglib_abi.py")
            return 1
        print(f"{TARGET.relative_to(ROOT)} matches _CDEF")
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
