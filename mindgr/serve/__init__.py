"""Serving a trained run: export (MindIR), recommend (command line), an HTTP server with a dynamic batcher.

HSTU-family runs are loaded by mindgr.train.trainer.load_run (the same loading as `mindgr eval`);
generative runs by mindgr.train.generative.load_generative_run (or a random-weight bundle).
Layers, lowest first: recommend (validate a request, encode histories at fixed batch shapes, top-k over
the item table) and generative (the same interface: beam search with mindgr.generate.engine.DecodingEngine)
< batcher (concurrent requests -> few fixed shapes) < server (HTTP); export writes the same graphs as
MindIR files.
"""
