"""Serving a trained run: export (MindIR), recommend (command line), an HTTP server with a dynamic batcher.

A run is loaded by mindgr.train.trainer.load_run (the same loading as `mindgr eval`).
Layers, lowest first: recommend (validate a request,
encode histories at fixed batch shapes, top-k over the item table) < batcher (concurrent requests ->
few fixed shapes) < server (HTTP) ; export writes the same encoder as MindIR files.
"""
