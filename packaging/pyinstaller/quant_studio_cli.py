"""PyInstaller entry point of the command line (``quant-studio-cli``); see packaging/pyinstaller/quant-studio.spec."""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()  # see quant_studio_gui.py
    from studio.cli import main

    sys.exit(main())
