"""`mindgr bench negatives`: negative strategies side by side on one config (see bench_variants).

The first variant is the published baseline; the others show how many more negatives per position a
shared pool affords at equal or lower memory and step time.
"""
NEGATIVE_VARIANTS = {
    "per_token R=128": ["loss.negatives=per_token", "loss.num_negatives=128"],
    "shared_pool K=4096": ["loss.negatives=shared_pool", "loss.pool_size=4096"],
    "shared_pool K=4096 fp16": ["loss.negatives=shared_pool", "loss.pool_size=4096", "loss.fp16_negatives=true"],
    "mixed K=4096 + in-batch 1024": ["loss.negatives=mixed", "loss.pool_size=4096", "loss.in_batch_size=1024"],
}
