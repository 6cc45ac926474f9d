"""Plans: what each tensor of a model becomes, and what that costs.

``plan`` (the Plan, its recipe and verbs), ``presets`` (llama.cpp's named mixtures), ``allocate`` (a
plan that meets a size, bits-per-weight or memory budget from a sensitivity scan) and ``estimate``
(file size and memory use). Import the submodules; the package itself imports nothing.
"""
