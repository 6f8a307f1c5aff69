"""Benchmarks behind `mindgr bench`: they print measured figures; none of them is a test."""
