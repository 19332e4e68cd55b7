"""Loading torch in the background while a collector starts.

torch takes seconds to import, longer than everything else a collector does before its first
chunk, and nothing needs it before the real policy acts (`collector/acting.py`). So it loads
on a thread of its own, nicer than the process, begun once the first chunk is in (an import
holds the GIL, and a nicer thread holding it would keep the registration and the first chunk
waiting) or as soon as the loop needs it.
"""

from __future__ import annotations

import contextlib
import os
import threading

from rlfleet.shared.infra.priority import IMPORT_NICE, nicer


def _load_torch_library() -> None:
    """Map torch's main shared library before `import torch` does. An import holds the GIL
    throughout, and the dynamic loader's work on libtorch_cpu (a large library) would hold up
    every other thread of the collector: on a nicer thread, its registration and first chunk
    would wait behind a thread the scheduler keeps waiting (a priority inversion). ctypes
    releases the GIL while it loads; the import then finds the library loaded. Nothing changes
    where it cannot be found."""
    import ctypes
    from importlib.util import find_spec

    spec = find_spec("torch")
    if spec is None or spec.origin is None:
        return
    path = os.path.join(os.path.dirname(spec.origin), "lib", "libtorch_cpu.so")
    if os.path.exists(path):
        with contextlib.suppress(OSError):  # the import will say what is wrong
            ctypes.CDLL(path)


class TorchLoader:
    """Imports torch (and what needs it) in a background thread, begun by `start` or `wait`,
    with one intra-op thread (shared with env stepping on a small machine, more threads only
    contend). `ready` is set when done; an import error is kept and raised by `wait`.

    The thread runs `IMPORT_NICE` steps nicer than the process (Linux sets niceness per
    thread): while the whole cluster starts on a small machine, the coordinator's start, this
    collector's registration and its first chunks should get the cores before the CPU seconds
    of importing torch that nothing needs yet."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._load, name="torch-import", daemon=True)
        self._started = threading.Lock()

    def start(self) -> None:
        """Begin loading (once; `wait` begins it too)."""
        with self._started:
            if self._thread.ident is None:
                self._thread.start()

    def _load(self) -> None:
        try:
            nicer(IMPORT_NICE)
            _load_torch_library()
            import torch

            import rlfleet.collector.weights  # noqa: F401 - its import needs torch

            torch.set_num_threads(1)
        except BaseException as err:  # raised again on the loop's thread by wait()
            self.error = err
        finally:
            self.ready.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether torch is loaded, waiting up to `timeout` for it (beginning the load if need
        be); an import that failed raises here, on the caller's thread."""
        self.start()
        if not self.ready.wait(timeout):
            return False
        if self.error is not None:
            raise RuntimeError(f"importing torch failed: {self.error}") from self.error
        return True
