"""Moved to `console.queue.worker` (the engine's package); this name stays for code written before.

`import console.worker` gives that very module (not a copy), so its names, its state and a test's
monkeypatch are the same under both names.
"""

import sys

from console.queue import worker

sys.modules[__name__] = worker
