"""`mindgr serve`: load the served model, then run the HTTP app (mindgr.serve.app) until SIGINT/SIGTERM.

The model comes from an export directory (`--export DIR`: only the exported graphs, tables, codes, trie
and manifest are read), from a run (`--run RUN`: exported once into the run's serving cache,
mindgr.serve.cache, then loaded exactly like `--export`), or is a random-weight GR model handed over as a
bundle (`--random-gr`, built by the command line from mindgr.bench.fixtures). Every option is one field
of ServerOptions (mindgr.serve.options).
"""
from __future__ import annotations

from mindgr.serve.options import ServerOptions


def load_model(options: ServerOptions, run_dir=None, export_dir=None, bundle=None):
    """(serving model, info for /health, banner text with {url}) from exactly one of a run, an export
    directory, or a bundle (a random-weight GR model, mindgr.bench.fixtures.random_bundle)."""
    from mindgr.serve.models import build_generative, load_served
    if sum(x is not None for x in (run_dir, export_dir, bundle)) != 1:
        raise ValueError("serve: give exactly one of a run, an export and a random model")
    if bundle is not None:
        return build_generative(bundle, options, beam=options.beam or 16)
    return load_served(options, run_dir=run_dir, export_dir=export_dir)


def serve(options: ServerOptions, run_dir=None, export_dir=None, bundle=None) -> int:
    """Load the model, compile its batch shapes, serve until SIGINT/SIGTERM, drain, return 0."""
    from mindgr.serve.app import run_server
    rec, info, text = load_model(options, run_dir, export_dir, bundle)
    info.update({"queue_size": options.queue_size, "max_wait_ms": options.max_wait_ms,
                 "max_body_bytes": options.max_body_bytes})
    banner = "mindgr serve: " + text.format(url=f"http://{options.host}:{options.port}")
    return run_server(rec, info, banner, options)
