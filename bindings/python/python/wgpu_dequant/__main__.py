"""The ``wgpu-dequant`` command that ``pip install`` puts on PATH, and
``python -m wgpu_dequant``: the Rust command line itself, run inside the
extension module, with the same options, output and exit statuses."""

import sys

from . import _native


def main():
    """Runs the command line on ``sys.argv`` and exits with its status."""
    # The program's name as the binary's help and errors give it.
    sys.exit(_native.cli_main(["wgpu-dequant", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
