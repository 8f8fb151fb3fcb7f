"""``python -m kiln_runtimes``: run the worker process."""

from __future__ import annotations

from kiln_runtimes.worker import main

if __name__ == "__main__":
    main()
