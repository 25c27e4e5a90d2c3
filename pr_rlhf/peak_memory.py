"""Peak resident memory of this process and all its descendants (Ray's raylet and workers included), sampled by a
background thread: what a laptop must hold while a job runs."""
from __future__ import annotations

import threading


class PeakRSS:
    """``with PeakRSS() as m: ...`` then ``m.peak_gb``: the largest sum of RSS over the process tree seen."""

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / 2**30

    def sample(self) -> int:
        import psutil

        root = psutil.Process()
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.peak_bytes = max(self.peak_bytes, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakRSS:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()
