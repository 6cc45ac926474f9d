"""Running the studio's units of work on a Ray cluster (the optional extra ``quant-studio[cluster]``)."""
