"""Distributed training (msrun, collectives, load balancing, sparse sharding).

Empty in this version: single-process training only. Multi-process support is tracked as its own work item.
"""
