"""PyInstaller entry point of the window (``quant-studio``); see packaging/pyinstaller/quant-studio.spec."""

import multiprocessing
import sys

if __name__ == "__main__":
    # A frozen app spawns its worker children (pickle loader, llama.cpp) by re-running this executable;
    # freeze_support() turns such a run into the child instead of a second window.
    multiprocessing.freeze_support()
    from studio.app import main

    sys.exit(main())
