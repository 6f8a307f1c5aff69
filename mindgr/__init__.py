"""MindGR: a MindSpore-native training suite for large-scale generative recommendation."""
__version__ = "0.1.0"
