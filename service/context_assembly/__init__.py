"""Context-assembly service: which source data enters each model call, under a token budget."""

__version__ = "0.1.0"
