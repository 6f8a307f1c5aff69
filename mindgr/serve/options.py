"""How `mindgr serve` serves: one dataclass for every option of the server (HTTP, batcher) and of the
served model, filled by the command line (mindgr.cli) or by a test, read by mindgr.serve.server."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

DEFAULT_MAX_BODY_BYTES = 1 << 20   # 1 MiB: a 4096-item history with timestamps is ~100 KB of JSON


@dataclass
class ServerOptions:
    # HTTP and the batcher
    host: str = "127.0.0.1"
    port: int = 8000
    queue_size: int = 256               # requests waiting beyond this get 503
    max_wait_ms: float = 2.0            # longest wait for a batch to fill
    graceful_timeout: float = 30.0      # seconds to finish in-flight requests at shutdown
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    test_delay_ms: float = 0.0          # extra time per batch: tests of overload and drain only
    # the served model
    checkpoint: str = "best"            # --run: which checkpoint is exported
    shapes: Optional[list] = None       # batch shapes (rows, or users for GR); None: the kind's default
                                        # (--run) or every exported shape (--export)
    index: str = "exact"                # retrieval: exact or faiss-ivf
    nprobe: int = 8                     # retrieval, faiss-ivf: cells searched per query
    max_history: Optional[int] = None   # longest history accepted (None: 4096)
    threads: Optional[int] = None       # MindSpore CPU threads (None: the run's parallel.threads)
    decode: str = "engine"              # GR: engine or naive (random-weight models only)
    beam: Optional[int] = None          # GR: beam width (None: 16 for --run, the export's for --export)
    overlap: bool = False               # GR: two batcher workers, one model thread
