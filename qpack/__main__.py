"""python -m qpack: the qpack command line (qpack/cli.py)."""
from qpack.cli import main

if __name__ == "__main__":
    main(prog_name="qpack")
