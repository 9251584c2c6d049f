"""The pure assembly core: validation, budget, selection, layout, hashes, usage normalisation.

Nothing here performs I/O, reads a clock or the environment: ``now``, the token counter and the
limits come in as arguments. ``tests/core/test_purity.py`` enforces it by parsing the imports.
"""
