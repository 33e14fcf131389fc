"""Near-duplicate removal: MinHash-LSH (:mod:`.minhash`) and its map/reduce scale-out (:mod:`.scale`)."""
