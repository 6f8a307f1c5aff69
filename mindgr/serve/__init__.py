"""Serving a trained run: export (MindIR), recommend (command line), an HTTP server with a dynamic batcher.

Layers, lowest first: loading (a run's config, data and weights) < recommend (validate a request,
encode histories at fixed batch shapes, top-k over the item table) < batcher (concurrent requests ->
few fixed shapes) < server (HTTP) ; export writes the same encoder as MindIR files.
"""
